// byteps._core: the only compiled module. Framework-free: tensors arrive as raw pointers.
#include <pybind11/pybind11.h>

#include "bindings.h"

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

}  // namespace python
}  // namespace byteps

PYBIND11_MODULE(_core, m) {
  m.doc() = "byteps core: scheduler, summation service, TCP van, pipeline (C++17).";
  byteps::python::BindConfig(m);
  byteps::python::BindReduce(m);
  byteps::python::BindCore(m);
  byteps::python::BindServer(m);
  byteps::python::BindTesting(m);
  byteps::python::BindUcxTesting(m);
  byteps::python::BindDoctor(m);
  byteps::python::BindTelemetry(m);
  byteps::python::BindDevice(m);  // after BindTesting: adds testing.fake_device
  byteps::python::BindP2p(m);
  byteps::python::BindPartition(m);
}
