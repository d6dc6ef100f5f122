// Per-tensor state of the worker pipeline: the tensor context (one per declared name) and its
// partition tasks, which are allocated once and reused every round (no allocation per operation
// in steady state).
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/connection.h"
#include "common/dtype.h"
#include "compress/compressor.h"
#include "device/device.h"
#include "pipeline/local_channel.h"
#include "pipeline/stage_table.h"
#include "pipeline/timeline.h"
#include "ps/collective_programs.h"
#include "ps/ps_client.h"
#include "ps/sync_scheme.h"
#include "reduce/sum.h"
#include "scheduling/partitioner.h"

namespace byteps {

// The stages a task walks, in order: the worker's stage plan (WorkerCore::BuildStagePlan, from
// the stage table) copied into each task every round.
struct StageList {
  Stage stages[kStageCount];
  uint8_t size = 0;
  uint8_t pos = 0;
  Stage current() const { return stages[pos]; }
};

struct TensorContext;
class WorkerCore;
struct PartTask;

// One send of an all-reduce program: its reused frame and whose it is.
struct CollSend {
  SendItem item;
  PartTask* task = nullptr;
  size_t index = 0;  // the op's index in the program
};

// A partition of an all-reduce tensor (ring, tree) on the local root (docs/schemes.md): its
// program (ps/sync_scheme.h) and where the walk through it stands. Made once, reused every
// round; fields below `mu` are read and written under it.
struct CollTask {
  CollProgram prog;
  std::vector<CollSend> sends;  // by op index (the kSend ones)
  std::vector<char> scratch;    // 2 x prog.scratch_bytes: where summed receives land, by parity
  std::mutex mu;
  std::condition_variable cv;  // `receiving` fell to 0
  // The round whose message has arrived, per receive op and round parity ([parity][op]): a
  // peer may send the next round's first steps before this machine finished the current one.
  std::vector<uint32_t> arrived;
  // [parity][op]: a kRecvPlace message of that round landed in scratch (it came early).
  std::vector<uint8_t> staged;
  uint32_t round = 0;   // the round being walked
  size_t pc = 0;        // the next op
  bool active = false;  // walking (false once finished or given up)
  bool in_gather = false;      // moved on to ALL_GATHER
  bool walked = false;         // the last op is done (its `outstanding` share given back)
  bool credit_held = false;    // REDUCE_SCATTER's credit not yet returned
  int receiving = 0;           // receives into the worker's buffer under way
  std::vector<uint8_t> counted;  // [op]: its message is one of them (between header and frame)
  // The program's sends not yet written plus one while the program has ops left: the partition
  // is done when it reaches 0. The initial sends not yet written: the credit comes back at 0.
  std::atomic<int> outstanding{0};
  std::atomic<int> credit_sends{0};
  char* scratch_of(uint32_t r) { return scratch.data() + (r & 1) * prog.scratch_bytes; }
};

struct PartTask {
  WorkerCore* owner = nullptr;
  TensorContext* ctx = nullptr;
  Partition part;
  uint64_t key = 0;   // declared_key << 16 | index
  int server = -1;    // index of the server that sums this partition (HiPS: its group's)
  // Where the partition queues among the tensor's at REDUCE_SCATTER (its index unless an
  // allgather or reducescatter interleaves the machines' blocks: SetUpCollective).
  uint32_t coll_position = 0;
  int upper = -1;     // HiPS: the top-level server the group's sum goes to
  int pull_window_server = -1;  // the server offered a window on this partition's sums
  StageList stages;
  // Reused frames: the push (payload straight from the buffer) and the pull request.
  SendItem push_item;
  SendItem pull_item;
  // The adaptive push window's sample of this round's push: when it was handed to the PS
  // client (steady clock, ns).
  int64_t push_sent_ns = 0;
  // The pull of this partition's sum, as the PS client tracks it (reused every round): whether
  // a response is being received into this task's buffer, the servers' stall reports.
  PendingPull pull;
  // This round's pull response went straight to the output, averaged on the way in
  // (WorkerCore::PullDestination): COPY_OUT has nothing left to do.
  bool pulled_final = false;
  // A compressed tensor, on the local root (docs/compression.md): the partition's compressor
  // (its error-feedback, momentum and random state carry across rounds), the encoding COMPRESS
  // writes and PUSH sends, and the buffer the encoded sum is pulled into (both of the
  // compressor's MaxEncodedBytes).
  std::unique_ptr<compress::Compressor> codec;
  std::vector<char> encoded;
  size_t encoded_len = 0;
  uint64_t push_aux = 0;  // the push's aux: the bits of the learning rate it was encoded with
  std::vector<char> received;
  // The stage times of the operation being traced (TensorContext::traced; docs/timeline.md).
  TaskTrace trace;
  // A device tensor: the event recorded after this partition's copy (COPY_D2H, then COPY_H2D),
  // made at the first copy and reused (docs/gpu.md).
  device::Event copied = nullptr;
  device::Event copy_start = nullptr;  // copy timing (Device::set_copy_timing): before the copy
  // An all-reduce tensor on the local root of a distributed job (null otherwise).
  std::unique_ptr<CollTask> coll;
};

struct TensorContext {
  std::string name;
  uint32_t declared_key = 0;
  bool initialized = false;  // dtype/shape fixed by the first use
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  size_t nbytes = 0;
  uint64_t sig = 0;  // hash of (name, dtype, shape, compression)
  // The compressor the name was declared with (canonical kwargs; "" = none), and whether this
  // tensor is compressed: set at the first push_pull (WorkerCore::DecideCompression).
  std::string compression;
  bool compressed = false;
  // The synchronization scheme (docs/schemes.md): declared for this name (sync_declared), or
  // the job's BYTEPS_SYNC, fixed at the first push_pull; all_reduce: ring or tree in a
  // distributed job (the plan with REDUCE_SCATTER and ALL_GATHER).
  SyncScheme sync = SyncScheme::kPs;
  bool sync_declared = false;
  bool all_reduce = false;
  // An asynchronous parameter (BYTEPS_ENABLE_ASYNC and a name starting with kAsyncParamPrefix,
  // docs/async.md): pushed with kPushFlagAsync, summed (never averaged), never compressed.
  bool async_param = false;
  // How the ranks' values combine (reduce::ReduceOp; docs/collectives.md), fixed by the first
  // push_pull: sum (average divides it), min, max or product.
  reduce::ReduceOp op = reduce::ReduceOp::kSum;
  // The collective (ps/collective_programs.h; docs/collectives.md) and its layout, fixed by the
  // first use: allreduce (push_pull), or allgather, broadcast, reducescatter over the mesh.
  CollLayout layout;
  // The process set (PushPullArgs; docs/collectives.md, "Process sets"), fixed by the first
  // use: its id (bits 16-31 of declared_key), its worker machines (empty: every one) and its
  // ranks (0: the job's size).
  uint32_t process_set = 0;
  std::vector<int> set_machines;
  int set_size = 0;
  std::vector<std::unique_ptr<PartTask>> parts;
  // BYTEPS_AUTOTUNE (docs/autotune.md): the job-level bound the tensor is cut with, the
  // generation of its keys (bits 32-47), the tuner's epoch it was cut in, and the tasks of
  // earlier cuts (kept: the PS client may still name them).
  size_t job_bound = 0;
  uint32_t key_gen = 0;
  uint32_t tune_epoch = 0;
  std::vector<std::unique_ptr<PartTask>> retired;

  // Distributed: placement from the scheduler's plan.
  bool declared = false;
  bool declare_sent = false;
  bool waiting_for_declare = false;

  // A device tensor (docs/gpu.md; null `device`: host memory): the backend and device of its
  // memory, fixed by the first use; the pinned host buffer every stage between COPY_D2H and
  // COPY_H2D works in (allocated once, reused every round: input and output point into it); the
  // device buffers of the operation in flight and the event its producer recorded, which
  // COPY_D2H waits for (null: none).
  device::Kind device_kind = device::Kind::kHost;
  int device_id = 0;
  device::Device* device = nullptr;
  device::PinnedBuffer staging;
  // The staging buffer is registered with the van (a lone process of a distributed job: the
  // pushes leave from it and the sums land in it every round).
  bool staging_registered = false;
  char* device_input = nullptr;
  char* device_output = nullptr;
  device::Event ready_event = nullptr;
  // A device tensor summed among the machine's GPUs by NCCL (BYTEPS_NCCL=1, several local
  // processes; docs/gpu.md): no pinned buffer; each process copies its shard of the machine's
  // sum into the shared aggregate (page-locked in place: host_registered) and back.
  bool nccl = false;
  bool host_registered = false;
  // Which of the worker's stage plans the tensor walks: +1 compressed, +2 on a device, +4 an
  // all-reduce, +8 summed by NCCL among the machine's GPUs.
  int plan() const {
    return (compressed ? 1 : 0) + (device ? 2 : 0) + (all_reduce ? 4 : 0) + (nccl ? 8 : 0);
  }

  // Local reduce (BYTEPS_LOCAL_SIZE > 1): slots [0, L) then aggregates [L, L+2) of `region`.
  std::unique_ptr<ShmSegment> shm;
  size_t region = 0;
  bool registered = false;  // the aggregates, with the van (local root of a distributed job)

  // The operation in flight (at most one per name).
  std::mutex mu;
  std::atomic<bool> in_flight{false};
  int64_t handle = 0;
  uint32_t round = 0;
  char* input = nullptr;
  char* output = nullptr;
  bool average = false;
  int64_t priority = 0;
  std::atomic<int> remaining{0};
  std::chrono::steady_clock::time_point started;
  // This operation is in the timeline's window (set at enqueue; docs/timeline.md): the
  // pipeline stamps its partitions' stage times. Telemetry of completed operations (atomics:
  // read by byteps.basics.get_telemetry while the pipeline writes them).
  bool traced = false;
  std::atomic<uint64_t> done_count{0}, done_bytes{0}, done_ns{0};
  bool stall_queried = false;  // stall inspector state of the current operation (under mu)
  bool stall_warned = false;
  // When the stall queries asked after a worker left were sent (steady clock; 0 = not yet).
  std::chrono::steady_clock::time_point left_queried_at{};
  Status sticky;  // once an operation on this tensor failed for good, later ones fail too
  bool aborting = false;  // an all-reduce operation is being given up (AbortCollective)

  char* slot(int i) const { return shm->data() + static_cast<size_t>(i) * region; }
  char* aggregate(int local_size) const {
    return shm->data() + static_cast<size_t>(local_size + (round & 1)) * region;
  }
};

}  // namespace byteps
