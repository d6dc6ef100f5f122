// byteps._core.device: the CUDA runtime and NCCL loaded at run time, the device backends'
// counters (docs/gpu.md). The fake device's test hooks are in python/testing/bind_device.cc.
#include <cstdint>
#include <pybind11/stl.h>

#include "bindings.h"
#include "device/cuda_api.h"
#include "device/device.h"

namespace py = pybind11;

namespace byteps {
namespace python {

void BindDevice(py::module_& m) {
  py::module_ d = m.def_submodule("device", "CUDA and NCCL loaded at run time; device counters.");
  d.def(
      "cuda_status",
      [](const std::vector<std::string>& candidates, bool system) {
        std::string why;
        const device::CudaApi* api;
        {
          py::gil_scoped_release nogil;
          api = device::LoadCuda(candidates, &why, system);
        }
        py::dict out;
        out["available"] = api != nullptr;
        out["reason"] = api ? py::object(py::none()) : py::object(py::str(why));
        out["library"] = api ? py::object(py::str(api->library)) : py::object(py::none());
        out["runtime_version"] = api ? api->runtime_version : 0;
        out["driver_version"] = api ? api->driver_version : 0;
        out["device_count"] = api ? api->device_count : 0;
        return out;
      },
      py::arg("candidates"), py::arg("system") = true,
      "Loads the CUDA runtime (once per process: the first success is kept; cuda_api.h): one "
      "already loaded, then the `candidates` (full paths), then the system library path "
      "(system=False: only the candidates). "
      "Returns {available: bool, reason: why not (str) or None, library, runtime_version, "
      "driver_version (CUDA's int encoding, e.g. 12040), device_count}.");
  d.def(
      "nccl_status",
      [](const std::vector<std::string>& candidates, bool system) {
        std::string why;
        const device::NcclApi* api;
        {
          py::gil_scoped_release nogil;
          api = device::LoadNccl(candidates, &why, system);
        }
        py::dict out;
        out["available"] = api != nullptr;
        out["reason"] = api ? py::object(py::none()) : py::object(py::str(why));
        out["library"] = api ? py::object(py::str(api->library)) : py::object(py::none());
        out["version"] = api ? api->version : 0;
        out["min_version"] = device::kNcclMinVersion;
        out["stages_supported"] = api != nullptr && api->version >= device::kNcclMinVersion;
        return out;
      },
      py::arg("candidates"), py::arg("system") = true,
      "Loads NCCL as cuda_status loads the runtime: {available, reason, library, version, "
      "min_version (what the NCCL stages need, NCCL's integer), stages_supported: bool}.");
  d.def(
      "stats",
      [](const std::string& kind) {
        const device::Stats& s = DeviceBackend(kind)->stats();
        py::dict out;
        out["host_allocs"] = s.host_allocs.load();
        out["host_frees"] = s.host_frees.load();
        out["host_bytes"] = s.host_bytes.load();
        out["streams"] = s.streams.load();
        out["events"] = s.events.load();
        out["copies"] = s.copies.load();
        out["copy_bytes"] = s.copy_bytes.load();
        out["stream_waits"] = s.stream_waits.load();
        out["host_registers"] = s.host_registers.load();
        out["collectives"] = s.collectives.load();
        const char* dirs[] = {"d2h", "h2d", "d2d"};  // CopyDir order
        for (int d = 0; d < 3; ++d) {
          const std::string p = dirs[d];
          out[(p + "_timed").c_str()] = s.timed[d].copies.load();
          out[(p + "_timed_bytes").c_str()] = s.timed[d].bytes.load();
          out[(p + "_busy_ns").c_str()] = s.timed[d].busy_ns.load();
        }
        return out;
      },
      py::arg("kind"),
      "Counters of the backend `kind` ('cuda' or 'fake') since the process started: "
      "{host_allocs, host_frees, host_bytes (pinned bytes held now), streams, events, copies, "
      "copy_bytes, stream_waits, host_registers (host memory page-locked in place: an NCCL "
      "tensor's aggregates), collectives (NCCL calls queued, BYTEPS_NCCL=1)}, and with copy "
      "timing on (set_copy_timing) per direction "
      "(d2h_, h2d_, and d2d_: a one-process job's copies within the device) the copies timed, "
      "their bytes and the device nanoseconds they took "
      "(*_timed, *_timed_bytes, *_busy_ns). Raises InvalidArgumentError for 'cuda' while CUDA "
      "is off.");
  d.def(
      "set_copy_timing",
      [](const std::string& kind, bool on) { DeviceBackend(kind)->set_copy_timing(on); },
      py::arg("kind"), py::arg("on"),
      "Times the copy stages' copies of backend `kind` on the device (default off): from a "
      "partition's next copy on, a timing event before and after each copy, whose device time "
      "stats() adds up per direction; the copy stages' bandwidth is *_timed_bytes / *_busy_ns. "
      "Costs an event record per copy. Raises InvalidArgumentError for 'cuda' while CUDA is "
      "off.");
  d.def(
      "copy_stream",
      [](const std::string& kind, int device_id) {
        device::Device* dev = DeviceBackend(kind);
        device::Stream s = nullptr;
        Check(dev->CopyStream(device_id, device::CopyDir::kDeviceToHost, &s));
        return reinterpret_cast<uintptr_t>(s);
      },
      py::arg("kind"), py::arg("device_id"),
      "The stream (address of the cudaStream_t) COPY_D2H copies device `device_id`'s tensors "
      "on: what a DLPack producer is asked to order its work before (__dlpack__(stream=...)).");
}

}  // namespace python
}  // namespace byteps
