// The stages of the worker pipeline as data (docs/architecture.md §3; adding a stage: §11).
//
// One row per stage, in pipeline order (StageTable::rows, stage_table.cc): its name, the
// WorkerCore member that runs a partition through it, whether its queue holds scheduling
// credit, what a partition waiting there waits for (the watchdog's words), and, for each
// machine layout, whether the stage is part of that layout's plan and how a partition enters
// it: queued for the stage's thread (behind a gate, on a multi-process machine), run at once by
// the thread that finished the previous stage, awaited, or sequenced by the local root. A
// second set of columns (`nccl`) is the plan of a device tensor whose machine sums it among its
// GPUs with NCCL (BYTEPS_NCCL=1, docs/gpu.md) instead of in host memory. Stages marked
// compressed_only are left out of the plan of a tensor that is not compressed, those marked
// device_only out of the plan of a tensor in host memory, and each row says which schemes'
// plans have it. WorkerCore::BuildStagePlan turns the columns of its layout into a plan per
// kind of tensor (TensorContext::plan(): compressed or not, device or host, all-reduce or the
// summation service, NCCL or not; a gate already passed earlier in a plan is not waited for
// again); Dispatch, the stage loops and the watchdog read the rows and know no stage by name.
#pragma once
#include <cstdint>

namespace byteps {

class WorkerCore;
struct PartTask;

// Row ids, in pipeline order: StageTable::rows[i].id == i. A task's plan (StageList) is a list
// of these.
enum class Stage : uint8_t {
  kReduce,       // NCCL: reduce-scatter (all-reduce on one machine) among the machine's GPUs
  kCopyD2H,      // a device tensor: copy the partition into the tensor's pinned host buffer
  kCopyIn,       // copy my input into my slot of the shared-memory buffer
  kLocalReduce,  // sum my shard of every local slot into the aggregate buffer
  kCompress,     // a compressed tensor: encode the partition (docs/compression.md)
  kPush,         // send the partition (or its encoding) to its server
  kPull,         // wait for the server's sum, received straight into place
  kReduceScatter,  // an all-reduce tensor (ring, tree): the summing half of its program
  kAllGather,      // ... and the half that spreads the sums (docs/schemes.md)
  kDecompress,   // a compressed tensor: decode the pulled sum into place
  kCopyOut,      // copy to the output, divide when averaging, finish
  kCopyH2D,      // a device tensor: copy the result from the pinned host buffer to the device
  kBroadcast,    // NCCL: all-gather of the machine's GPUs' shards of the result
  kCount,
};
constexpr int kStageCount = static_cast<int>(Stage::kCount);

// Machine layouts: the rows of the layout table of docs/architecture.md §3, in its order.
enum class Layout : uint8_t {
  kOneProcess,             // one process, one machine
  kOneProcessDistributed,  // one process per machine, distributed
  kLocalGroup,             // L > 1 processes, one machine
  kLocalRoot,              // L > 1 processes per machine, distributed: local rank 0
  kLocalOther,             // L > 1 processes per machine, distributed: the other local ranks
  kCount,
};
constexpr int kLayoutCount = static_cast<int>(Layout::kCount);
Layout LayoutOf(int local_size, bool distributed, bool is_root);

// How a partition enters a stage of the plan.
enum class Entry : uint8_t {
  kAbsent,   // the stage is not part of this layout's plan
  kQueued,   // onto the stage's ScheduledQueue (after its gate, if any); the stage's thread runs it
  kInline,   // run at once by the thread that finished the previous stage
  kAwaited,  // nothing starts it: the previous stage's work completes it (PULL: the push carried
             // the pull request, and the connection's receive thread moves the partition on)
  kSequenced,  // a collective call every local process makes in the same order: the local root
               // queues it once every other local process is there (their READY), and each
               // other one runs it when the root's GO for it comes (nccl_sequencer.cc)
};

// What a partition waits for before a queued stage on a multi-process machine: the signal of
// the other local processes (LocalSignalType of the same name).
enum class GateKind : uint8_t { kNone, kWritten, kReduced, kPulled, kCount };
constexpr int kGateCount = static_cast<int>(GateKind::kCount);

// What a partition waiting at the stage (not at its gate) waits for, as the stall warning and
// the timeout say it.
enum class Waits : uint8_t {
  kWork,    // the stage's own work: named by the stage alone
  kServer,  // its server's sum: "PULL (waiting for server N)"; the watchdog asks that server
            // which worker machines have not pushed (STALL_QUERY)
  kPeer,    // a message of its all-reduce program: "ALL_GATHER (waiting for worker machine N)"
};

// Which tensors' plans have the row, by synchronization scheme (docs/schemes.md): the
// summation service's (ps, hips: PUSH, PULL and the compression stages), the all-reduces'
// (ring, tree: REDUCE_SCATTER, ALL_GATHER), or both.
enum class PlanKind : uint8_t { kPs = 1, kAllReduce = 2, kAny = 3 };
constexpr bool InPlan(PlanKind row, bool all_reduce) {
  return (static_cast<uint8_t>(row) & (all_reduce ? 2 : 1)) != 0;
}

struct StageSlot {
  Entry entry = Entry::kAbsent;
  GateKind gate = GateKind::kNone;
};

// Runs one partition through the stage. It ends with Proceed(t) (the next stage, or the
// partition is done) or hands t to something that calls Proceed later, as PUSH does.
using StageRun = void (WorkerCore::*)(PartTask*);

struct StageRow {
  Stage id;
  const char* name;  // the INFO log of the plan, queue names, stall and timeout messages
  StageRun run;      // null only for a stage that is awaited in every layout
  // The queue lets at most BYTEPS_SCHEDULING_CREDIT x partition bound bytes out at a time
  // (docs/architecture.md §5), and the stage returns the credit itself; other stages' queues
  // return it as soon as an item is popped.
  bool credit;
  Waits waits;
  // Only in the plan of a compressed tensor (WorkerCore builds a plan with and one without).
  bool compressed_only;
  // Only in the plan of a device tensor (docs/gpu.md).
  bool device_only;
  // The schemes whose plans have it.
  PlanKind schemes;
  StageSlot where[kLayoutCount];  // indexed by Layout
  // The plan of a device tensor summed among the machine's GPUs by NCCL (multi-process
  // layouts only); where a stage is in both plans, it is entered the same way.
  StageSlot nccl[kLayoutCount];
};

struct StageTable {
  static const StageRow rows[kStageCount];
  static const StageRow& Row(Stage s) { return rows[static_cast<int>(s)]; }
};

inline const char* StageName(Stage s) { return StageTable::Row(s).name; }

}  // namespace byteps
