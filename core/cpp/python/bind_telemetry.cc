// byteps._core: push_pull telemetry and the timeline's file (docs/timeline.md).
#include <cstdint>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "pipeline/api.h"

namespace py = pybind11;

namespace byteps {
namespace python {

void BindTelemetry(py::module_& m) {
  m.def(
      "get_pushpull_speed",
      []() {
        auto core = CoreInstance();
        if (!core) return std::pair<uint64_t, double>(0, -5.0);
        return core->telemetry().PopSpeed();
      },
      "(ms since the epoch, MB/s): the oldest unread throughput sample (consumed), or "
      "(0, -5.0) when there is none or byteps is not initialised.");
  m.def(
      "tensor_telemetry",
      []() {
        auto core = CoreInstance();
        if (!core) ThrowStatus(Status::Shutdown("byteps is not initialised: call init() first"));
        py::dict out;
        for (auto& t : core->TensorTelemetries())
          out[py::str(t.name)] = py::make_tuple(t.bytes, t.count, t.ns);
        return out;
      },
      "name -> (bytes completed, push_pulls completed, their summed duration in ns).");
  m.def(
      "trace_path",
      []() {
        auto core = CoreInstance();
        if (!core) ThrowStatus(Status::Shutdown("byteps is not initialised: call init() first"));
        return core->TracePath();
      },
      "Where this process's timeline is written (<BYTEPS_TRACE_DIR>/<local_rank>/comm.json).");
  m.def(
      "trace_written",
      []() {
        auto core = CoreInstance();
        return core && core->TraceWritten();
      },
      "True once this process's timeline window closed and its file is being written.");
  m.def(
      "start_timeline",
      [](const std::string& file) {
        auto core = CoreInstance();
        if (!core) ThrowStatus(Status::Shutdown("byteps is not initialised: call init() first"));
        Check(core->StartTimeline(file));
      },
      py::arg("file"),
      "Record every operation started from now on into `file` (written by stop_timeline).");
  m.def(
      "stop_timeline",
      []() {
        auto core = CoreInstance();
        if (!core) ThrowStatus(Status::Shutdown("byteps is not initialised: call init() first"));
        py::gil_scoped_release release;
        Check(core->StopTimeline());
      },
      "Stop recording and write the file start_timeline named; returns once it is written.");
}

}  // namespace python
}  // namespace byteps
