// Pieces of the byteps._core Python module; each Bind* lives in its own file. The helpers
// (bindings.cc) are shared with the test hooks' module (python/testing/testing_bindings.h).
#pragma once
#include <pybind11/pybind11.h>

#include <string>

#include "common/status.h"
#include "device/device.h"

namespace byteps {
namespace python {

// Raises the byteps.errors exception matching status.code() (never returns normally).
[[noreturn]] void ThrowStatus(const Status& status);
inline void Check(const Status& s) {
  if (!s.ok()) ThrowStatus(s);
}
// A bad argument from Python: byteps.errors.InvalidArgumentError (a ValueError) for a bad
// value, byteps.errors.InvalidTypeError (a TypeError) for a bad type or dtype. Every error the
// module raises is a byteps.errors.BytePSError (never a bare py::value_error / type_error).
[[noreturn]] inline void ThrowInvalidArgument(const std::string& message) {
  ThrowStatus(Status::InvalidArgument(message));
}
[[noreturn]] void ThrowInvalidType(const std::string& message);
// The device backend `kind` ("cuda" or "fake"); InvalidArgumentError for another kind or for
// "cuda" while CUDA is off.
device::Device* DeviceBackend(const std::string& kind);

void BindConfig(pybind11::module_& m);    // knobs, logging
void BindReduce(pybind11::module_& m);    // summation kernels (reduce/)
void BindCore(pybind11::module_& m);      // init, push_pull, handles
void BindServer(pybind11::module_& m);    // server / scheduler entry points
void BindTelemetry(pybind11::module_& m);  // get_pushpull_speed, per-tensor counters, trace
void BindDoctor(pybind11::module_& m);    // build and host facts for byteps.doctor
void BindDevice(pybind11::module_& m);  // device (CUDA loader, counters)
void BindP2p(pybind11::module_& m);     // P2pChannel: worker-to-worker channel (bind_p2p.cc)
void BindPartition(pybind11::module_& m);  // the partition rule (scheduling/partitioner.h)
void BindSchemes(pybind11::module_& m);    // the schemes' shapes (ps/sync_scheme.h)

}  // namespace python
}  // namespace byteps
