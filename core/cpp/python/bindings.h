// Pieces of the byteps._core Python module; each Bind* lives in its own file.
#pragma once
#include <pybind11/pybind11.h>

#include "common/status.h"

namespace byteps {
namespace python {

// Raises the byteps.errors exception matching status.code() (never returns normally).
[[noreturn]] void ThrowStatus(const Status& status);
inline void Check(const Status& s) {
  if (!s.ok()) ThrowStatus(s);
}

void BindConfig(pybind11::module_& m);    // knobs, logging
void BindReduce(pybind11::module_& m);    // summation kernels (reduce/)
void BindCore(pybind11::module_& m);      // init, push_pull, handles
void BindServer(pybind11::module_& m);    // server / scheduler entry points
void BindTesting(pybind11::module_& m);   // unit-test hooks: partitioner, queues, key plan, codec

}  // namespace python
}  // namespace byteps
