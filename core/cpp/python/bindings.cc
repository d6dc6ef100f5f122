// The helpers bindings.h declares, compiled into both extension modules (byteps._core and the
// test hooks' byteps._core_testing, python/testing/): every error either module raises is a
// byteps.errors class.
#include "bindings.h"

#include <pybind11/pybind11.h>

namespace py = pybind11;

namespace byteps {
namespace python {

void ThrowStatus(const Status& status) {
  py::gil_scoped_acquire gil;
  py::object errors = py::module_::import("byteps.errors");
  py::dict classes = errors.attr("STATUS_CLASSES");
  py::str code(StatusCodeName(status.code()));
  py::object cls = classes.contains(code) ? py::object(classes[code])
                                          : py::object(errors.attr("BytePSError"));
  PyErr_SetString(cls.ptr(), status.message().c_str());
  throw py::error_already_set();
}

void ThrowInvalidType(const std::string& message) {
  py::gil_scoped_acquire gil;
  py::object cls = py::module_::import("byteps.errors").attr("InvalidTypeError");
  PyErr_SetString(cls.ptr(), message.c_str());
  throw py::error_already_set();
}

device::Device* DeviceBackend(const std::string& kind) {
  device::Kind k;
  if (!device::ParseKind(kind, &k) || k == device::Kind::kHost)
    ThrowInvalidArgument("unknown device kind '" + kind + "' (cuda or fake)");
  device::Device* d = nullptr;
  Check(device::GetDevice(k, &d));
  return d;
}

}  // namespace python
}  // namespace byteps
