// byteps._core: the compiled core of the package. Framework-free: tensors arrive as raw
// pointers. The test hooks are another module, byteps._core_testing (python/testing/), built
// only with -DBYTEPS_BUILD_TESTING=ON.
#include <pybind11/pybind11.h>

#include "bindings.h"

PYBIND11_MODULE(_core, m) {
  m.doc() = "byteps core: scheduler, summation service, TCP van, pipeline (C++17).";
  byteps::python::BindConfig(m);
  byteps::python::BindReduce(m);
  byteps::python::BindCore(m);
  byteps::python::BindServer(m);
  byteps::python::BindDoctor(m);
  byteps::python::BindTelemetry(m);
  byteps::python::BindDevice(m);
  byteps::python::BindP2p(m);
  byteps::python::BindPartition(m);
  byteps::python::BindSchemes(m);
}
