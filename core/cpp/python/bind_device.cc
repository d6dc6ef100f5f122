// byteps._core.device: the CUDA runtime and NCCL loaded at run time, the device backends'
// counters (docs/gpu.md); byteps._core.testing.fake_device: the fake device's hooks for tests.
#include <cstdint>
#include <map>
#include <mutex>
#include <pybind11/stl.h>

#include "bindings.h"
#include "device/collective.h"
#include "device/cuda_api.h"
#include "device/device.h"

namespace py = pybind11;

namespace byteps {
namespace python {
namespace {

device::Device* Backend(const std::string& kind) {
  device::Kind k;
  if (!device::ParseKind(kind, &k) || k == device::Kind::kHost)
    ThrowInvalidArgument("unknown device kind '" + kind + "' (cuda or fake)");
  device::Device* d = nullptr;
  Check(device::GetDevice(k, &d));
  return d;
}

device::Device* Fake() { return Backend("fake"); }

// testing.one_rank_collective: a communicator of one rank per (backend, device), its stream and
// an event, made at the first call and kept for the process.
struct OneRank {
  std::unique_ptr<device::Collective> comm;
  device::Stream stream = nullptr;
  device::Event done = nullptr;
};

Status RunOneRank(device::Device* dev, device::Kind kind, int device_id, const std::string& call,
                  const void* send, void* recv, size_t count, DType dtype, bool avg) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, OneRank> made;
  std::lock_guard<std::mutex> lk(mu);
  OneRank& one = made[{static_cast<int>(kind), device_id}];
  if (!one.comm) {
    std::string id;
    BPS_RETURN_IF_ERROR(device::NewCollectiveId(kind, "selftest", 1, &id));
    BPS_RETURN_IF_ERROR(device::CreateCollective(kind, id, 0, 1, device_id, 60, nullptr,
                                                 &one.comm));
    BPS_RETURN_IF_ERROR(dev->CreateStream(device_id, &one.stream));
    BPS_RETURN_IF_ERROR(dev->CreateEvent(&one.done));
  }
  device::Collective* c = one.comm.get();
  BPS_RETURN_IF_ERROR(c->GroupStart());
  Status st;
  if (call == "reduce_scatter") {
    st = c->ReduceScatter(send, recv, count, dtype, one.stream);
  } else if (call == "all_reduce") {
    st = c->AllReduce(send, recv, count, dtype,
                      avg ? device::ReduceOp::kAvg : device::ReduceOp::kSum, one.stream);
  } else if (call == "all_gather") {
    st = c->AllGather(send, recv, count, dtype, one.stream);
  } else if (call == "broadcast") {
    st = c->Broadcast(send, recv, count, dtype, 0, one.stream);
  } else {
    st = Status::InvalidArgument("unknown collective call '" + call + "'");
  }
  Status end = c->GroupEnd();
  BPS_RETURN_IF_ERROR(st);
  BPS_RETURN_IF_ERROR(end);
  BPS_RETURN_IF_ERROR(dev->Record(one.done, one.stream));
  BPS_RETURN_IF_ERROR(dev->Synchronize(one.done));
  return c->AsyncError();
}

}  // namespace

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
        const device::Stats& s = Backend(kind)->stats();
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
      [](const std::string& kind, bool on) { Backend(kind)->set_copy_timing(on); },
      py::arg("kind"), py::arg("on"),
      "Times the copy stages' copies of backend `kind` on the device (default off): from a "
      "partition's next copy on, a timing event before and after each copy, whose device time "
      "stats() adds up per direction; the copy stages' bandwidth is *_timed_bytes / *_busy_ns. "
      "Costs an event record per copy. Raises InvalidArgumentError for 'cuda' while CUDA is "
      "off.");
  d.def(
      "copy_stream",
      [](const std::string& kind, int device_id) {
        device::Device* dev = Backend(kind);
        device::Stream s = nullptr;
        Check(dev->CopyStream(device_id, device::CopyDir::kDeviceToHost, &s));
        return reinterpret_cast<uintptr_t>(s);
      },
      py::arg("kind"), py::arg("device_id"),
      "The stream (address of the cudaStream_t) COPY_D2H copies device `device_id`'s tensors "
      "on: what a DLPack producer is asked to order its work before (__dlpack__(stream=...)).");

  py::module_ testing = m.attr("testing");
  testing.def(
      "one_rank_collective",
      [](const std::string& kind, int device_id, const std::string& call, uintptr_t send,
         uintptr_t recv, size_t count, const std::string& dtype, bool average) {
        device::Device* dev = Backend(kind);
        device::Kind k;
        device::ParseKind(kind, &k);
        DType dt;
        if (!ParseDType(dtype, &dt)) ThrowInvalidArgument("unknown dtype '" + dtype + "'");
        Status st;
        {
          py::gil_scoped_release nogil;
          st = RunOneRank(dev, k, device_id, call, reinterpret_cast<const void*>(send),
                          reinterpret_cast<void*>(recv), count, dt, average);
        }
        Check(st);
      },
      py::arg("kind"), py::arg("device_id"), py::arg("call"), py::arg("send"), py::arg("recv"),
      py::arg("count"), py::arg("dtype"), py::arg("average") = false,
      "The collective seam of the NCCL stages (device/collective.h) on a communicator of one "
      "rank of backend `kind` ('cuda': NCCL; 'fake') on `device_id`, made at the first call: "
      "`call` (reduce_scatter, all_reduce, all_gather, broadcast) of `count` elements of "
      "`dtype` from device address `send` to `recv`, waited for. With one rank each call "
      "copies (all_reduce with average divides by 1). Checks the backend's calls on a machine "
      "with one GPU, where NCCL refuses two ranks. Raises InvalidArgumentError when NCCL is off "
      "(the reason), InternalError for an NCCL error.");
  py::module_ f = testing.def_submodule(
      "fake_device", "The fake device of the device-path tests (device/device.h): host memory, "
                     "a thread per stream.");
  f.def("set_copy_delay", &device::SetFakeCopyDelay, py::arg("us"),
        "Delay (microseconds) before each copy the fake device makes; 0 by default.");
  f.def("stall_collective_after", &device::SetFakeCollectiveStall, py::arg("calls"),
        "From its call number `calls` + 1 on, this process's fake collective calls never come "
        "(a GPU stuck in a kernel) until the communicator is aborted; 0 (default): off.");
  f.def("create_stream", []() {
    device::Stream s = nullptr;
    Check(Fake()->CreateStream(0, &s));
    return reinterpret_cast<uintptr_t>(s);
  });
  f.def("create_event", []() {
    device::Event e = nullptr;
    Check(Fake()->CreateEvent(&e));
    return reinterpret_cast<uintptr_t>(e);
  });
  f.def(
      "record",
      [](uintptr_t event, uintptr_t stream) {
        Check(Fake()->Record(reinterpret_cast<device::Event>(event),
                             reinterpret_cast<device::Stream>(stream)));
      },
      py::arg("event"), py::arg("stream"));
  f.def(
      "synchronize",
      [](uintptr_t event) {
        device::Device* dev = Fake();
        Status st;
        {
          py::gil_scoped_release nogil;
          st = dev->Synchronize(reinterpret_cast<device::Event>(event));
        }
        Check(st);
      },
      py::arg("event"));
  f.def(
      "write_async",
      [](uintptr_t stream, uintptr_t dst, py::buffer src, int64_t delay_us) {
        py::buffer_info info = src.request();
        Check(device::FakeWriteAsync(reinterpret_cast<device::Stream>(stream),
                                     reinterpret_cast<void*>(dst), info.ptr,
                                     static_cast<size_t>(info.size * info.itemsize), delay_us));
      },
      py::arg("stream"), py::arg("dst"), py::arg("src"), py::arg("delay_us"),
      "Queues on `stream`: wait `delay_us`, then write the bytes of `src` (copied now) to the "
      "address `dst`: a producer kernel still running when push_pull is called.");
}

}  // namespace python
}  // namespace byteps
