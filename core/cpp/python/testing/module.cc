// byteps._core_testing: the C++ core's test hooks (the tests, the benchmark lab), built only
// with -DBYTEPS_BUILD_TESTING=ON. It is linked against byteps._core (CMakeLists.txt), so a hook
// and the core share one copy of the core's state: the job secret set_job_secret installs is
// the one _core's P2pChannel checks, the fake device's delays are the ones _core's copy stages
// wait. Not a public API.
#include <pybind11/pybind11.h>

#include "testing_bindings.h"

PYBIND11_MODULE(_core_testing, m) {
  m.doc() = "Test hooks into byteps' C++ core (not a public API; -DBYTEPS_BUILD_TESTING=ON).";
  byteps::python::BindUnits(m);
  byteps::python::BindVan(m);
  byteps::python::BindRounds(m);
  byteps::python::BindCompress(m);
  byteps::python::BindUcx(m);
  byteps::python::BindDevice(m);
}
