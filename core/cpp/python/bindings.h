// Pieces of the byteps._core Python module; each Bind* lives in its own file.
#pragma once
#include <pybind11/pybind11.h>

#include <string>

#include "common/status.h"

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

void BindConfig(pybind11::module_& m);    // knobs, logging
void BindReduce(pybind11::module_& m);    // summation kernels (reduce/)
void BindCore(pybind11::module_& m);      // init, push_pull, handles
void BindServer(pybind11::module_& m);    // server / scheduler entry points
void BindTesting(pybind11::module_& m);   // unit-test hooks: partitioner, queues, key plan, codec
void BindVanTesting(pybind11::module_& testing);  // the van seam on its own (bind_van.cc)
void BindTestingRounds(pybind11::module_& testing);  // testing.SummationRounds (round logic)
void BindCompressTesting(pybind11::module_& testing);  // testing.Compressor (compress/)
void BindTelemetry(pybind11::module_& m);  // get_pushpull_speed, per-tensor counters, trace
void BindDoctor(pybind11::module_& m);    // build and host facts for byteps.doctor
void BindUcxTesting(pybind11::module_& m);  // testing.UcxTestPeer (UCX builds), ucx_available
void BindDevice(pybind11::module_& m);  // device (CUDA loader, counters), testing.fake_device
void BindP2p(pybind11::module_& m);     // P2pChannel: worker-to-worker channel (bind_p2p.cc)
void BindPartition(pybind11::module_& m);  // the partition rule (scheduling/partitioner.h)

}  // namespace python
}  // namespace byteps
