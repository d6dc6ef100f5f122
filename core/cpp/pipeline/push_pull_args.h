// One push_pull as the worker core takes it (WorkerCore::Enqueue): from the Python bindings,
// the engine bridge, and the autotuner's measurement.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "device/device.h"
#include "pipeline/handles.h"
#include "ps/collective_programs.h"
#include "reduce/sum.h"

namespace byteps {

struct PushPullArgs {
  std::string name;
  char* input = nullptr;
  char* output = nullptr;
  size_t nbytes = 0;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  bool average = true;
  // How the ranks' values combine (docs/collectives.md): kSum (average divides it by the
  // ranks), kMin, kMax or kProduct (average must be false). Fixed by the name's first use.
  reduce::ReduceOp op = reduce::ReduceOp::kSum;
  // allreduce (the default), or allgather, broadcast, reducescatter with their layout
  // (ps/collective_programs.h; docs/collectives.md). Fixed by the name's first use.
  CollLayout layout;
  // The process set (docs/collectives.md, "Process sets"): its id (0: every rank of the job),
  // the worker machines its ranks are on (ascending, each with all its processes; empty: every
  // machine) and its number of ranks (an average's divisor; 0: the job's size). A set's layout
  // (above) numbers its machines 0 .. set_machines.size() - 1. Fixed by the name's first use.
  uint32_t process_set = 0;
  std::vector<int> set_machines;
  int set_size = 0;
  bool has_priority = false;
  int64_t priority = 0;
  // A device tensor (docs/gpu.md): input and output are device memory of `device_kind`
  // (kCuda, or the tests' kFake) on device `device_id`; `ready_event`, if not null, is an event
  // the producer recorded on its stream after writing the input (COPY_D2H waits for it).
  device::Kind device_kind = device::Kind::kHost;
  int device_id = 0;
  device::Event ready_event = nullptr;
  // Optional: called with the outcome instead of keeping the handle for a wait (engine_bridge).
  DoneCallback on_done;
};

}  // namespace byteps
