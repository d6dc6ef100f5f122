// byteps._core: the knob registry (docs/env.md is rendered from it) and logging.
#include <pybind11/stl.h>

#include "bindings.h"
#include "common/knobs.h"
#include "common/logging.h"

namespace py = pybind11;

namespace byteps {
namespace python {

void BindConfig(py::module_& m) {
  m.def(
      "knobs",
      []() {
        py::list out;
        for (auto& k : AllKnobs()) {
          py::dict d;
          d["name"] = k.name;
          d["type"] = KnobTypeName(k.type);
          d["default"] = k.default_value;
          d["doc"] = k.doc;
          d["used_by"] = k.used_by;
          if (k.min <= k.max) d["range"] = py::make_tuple(k.min, k.max);
          else d["range"] = py::none();
          d["choices"] = k.choices;
          d["aliases"] = k.aliases;
          out.append(d);
        }
        return out;
      },
      "Every BYTEPS_*/DMLC_* variable: list of dicts (name, type, default, doc, used_by, range, "
      "choices, aliases).");
  m.def(
      "upstream_knobs",
      []() {
        py::list out;
        for (auto& v : UpstreamVars()) {
          py::dict d;
          d["name"] = v.name;
          d["status"] = UpstreamStatusName(v.status);
          d["here"] = v.here;
          d["replaced_by"] = v.replaced_by;
          d["same"] = v.same;
          d["same_off"] = v.same_off;
          d["checked"] = v.checked;
          out.append(d);
        }
        return out;
      },
      "Upstream BytePS's variables and what each does here: list of dicts (name, status: "
      "implemented | replaced | ignored | refused, here, replaced_by, same, same_off, checked).");
  m.def(
      "check_environment",
      [](const std::map<std::string, std::string>& env) {
        std::vector<EnvNotice> notices;
        Check(CheckEnvironmentNames(env, &notices));
        py::list out;
        for (auto& n : notices) {
          py::dict d;
          d["name"] = n.name;
          d["warning"] = n.warning;
          d["text"] = n.text;
          out.append(d);
        }
        return out;
      },
      py::arg("env"),
      "Checks the names of `env` (values only of upstream variables): a list of dicts (name, "
      "warning: bool, text), one per unknown BYTEPS_*/DMLC_* name or upstream-only variable. "
      "Raises ConfigError when a refused upstream variable asks for what is not implemented "
      "(none is at present). Logs nothing.");
  m.def(
      "knob_values",
      [](py::object env) {
        Knobs k;
        Status st;
        if (env.is_none()) {
          st = Knobs::FromEnvironment(&k);
        } else {
          st = Knobs::FromMap(env.cast<std::map<std::string, std::string>>(), &k);
        }
        Check(st);
        return k.AsStrings();
      },
      py::arg("env") = py::none(),
      "Validated values of every knob (from os.environ, or from `env`). Raises ConfigError.");
  m.def(
      "set_log_level",
      [](const std::string& level) {
        LogLevel l;
        if (!ParseLogLevel(level, &l)) ThrowInvalidArgument("unknown log level " + level);
        SetLogLevel(l);
      },
      "Sets the core's log level (TRACE, DEBUG, INFO, WARNING, ERROR).");
}

}  // namespace python
}  // namespace byteps
