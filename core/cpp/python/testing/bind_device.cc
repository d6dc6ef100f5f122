// byteps._core_testing: the device seam's hooks. one_rank_collective drives the collective seam
// of the NCCL stages (device/collective.h) on one rank; fake_device reaches the fake device
// (device/device.h) that the core selects for the device-path tests: its delays, its stall, and
// streams, events and writes of a producer. The fake device itself is the core's.
#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "device/collective.h"
#include "device/device.h"
#include "testing_bindings.h"

namespace py = pybind11;

namespace byteps {
namespace python {
namespace {

device::Device* Fake() { return DeviceBackend("fake"); }

// one_rank_collective: a communicator of one rank per (backend, device), its stream and
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
  m.def(
      "one_rank_collective",
      [](const std::string& kind, int device_id, const std::string& call, uintptr_t send,
         uintptr_t recv, size_t count, const std::string& dtype, bool average) {
        device::Device* dev = DeviceBackend(kind);
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
  py::module_ f = m.def_submodule(
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
