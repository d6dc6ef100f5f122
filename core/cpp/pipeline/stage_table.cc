// The stage table (stage_table.h; docs/architecture.md §3, §11). tests/test_repo_docs.py reads
// the rows below: keep one row per stage in the form {Stage::kId, "NAME", ... {slots}}.
#include "pipeline/stage_table.h"

#include "pipeline/worker.h"

namespace byteps {
namespace {

constexpr StageSlot kNo{};                        // not part of this layout's plan
constexpr StageSlot kQueue{Entry::kQueued};       // queued for the stage's thread
constexpr StageSlot kInline{Entry::kInline};      // run by the thread that finished the last one
constexpr StageSlot kAwait{Entry::kAwaited};      // completed by the previous stage's work
constexpr StageSlot kSeq{Entry::kSequenced};      // ordered among the local processes by the root
constexpr StageSlot After(GateKind g) { return {Entry::kQueued, g}; }  // queued behind a gate
constexpr GateKind kWritten = GateKind::kWritten;
constexpr GateKind kReduced = GateKind::kReduced;
constexpr GateKind kPulled = GateKind::kPulled;
constexpr PlanKind kAny = PlanKind::kAny;
constexpr PlanKind kPsOnly = PlanKind::kPs;
constexpr PlanKind kAllReduceOnly = PlanKind::kAllReduce;

}  // namespace

// Columns of `where` and `nccl`, in Layout order: one process | one process per machine,
// distributed | L processes, one machine | L per machine, distributed, local root | the other
// local ranks.
constexpr StageRow StageTable::rows[kStageCount] = {
    // NCCL (docs/gpu.md): the machine's GPUs reduce-scatter the partition, each keeping its
    // shard of the sum in the device output (nccl_sequencer.cc); on one machine an all-reduce
    // (averaged by NCCL) is the whole plan.
    {Stage::kReduce, "REDUCE", &WorkerCore::RunReduce, /*credit=*/false, Waits::kWork,
     /*compressed_only=*/false, /*device_only=*/true, /*schemes=*/kAny,
     {kNo, kNo, kNo, kNo, kNo}, {kNo, kNo, kSeq, kSeq, kSeq}},
    // A device tensor: the partition from device memory into the tensor's pinned host buffer,
    // after the producer's event (worker_device.cc); every later stage works in that buffer.
    // Not in a one-process job, whose COPY_OUT copies within the device.
    {Stage::kCopyD2H, "COPY_D2H", &WorkerCore::RunCopyD2H, /*credit=*/false, Waits::kWork,
     /*compressed_only=*/false, /*device_only=*/true, /*schemes=*/kAny,
     {kNo, kQueue, kQueue, kQueue, kQueue}, {kNo, kNo, kNo, kQueue, kQueue}},
    {Stage::kCopyIn, "COPY_IN", &WorkerCore::RunCopyIn, /*credit=*/false, Waits::kWork,
     /*compressed_only=*/false, /*device_only=*/false, /*schemes=*/kAny,
     {kNo, kNo, kQueue, kQueue, kQueue}, {kNo, kNo, kNo, kNo, kNo}},
    {Stage::kLocalReduce, "LOCAL_REDUCE", &WorkerCore::RunLocalReduce, /*credit=*/false,
     Waits::kWork, /*compressed_only=*/false, /*device_only=*/false, /*schemes=*/kAny,
     {kNo, kNo, After(kWritten), After(kWritten), After(kWritten)}, {kNo, kNo, kNo, kNo, kNo}},
    // Encodes from the input or the aggregate into the task's own buffer (worker_compress.cc).
    {Stage::kCompress, "COMPRESS", &WorkerCore::RunCompress, /*credit=*/false, Waits::kWork,
     /*compressed_only=*/true, /*device_only=*/false, /*schemes=*/kPsOnly,
     {kNo, kQueue, kNo, After(kReduced), kNo}, {kNo, kNo, kNo, After(kReduced), kNo}},
    {Stage::kPush, "PUSH", &WorkerCore::RunPush, /*credit=*/true, Waits::kWork,
     /*compressed_only=*/false, /*device_only=*/false, /*schemes=*/kPsOnly,
     {kNo, kQueue, kNo, After(kReduced), kNo}, {kNo, kNo, kNo, After(kReduced), kNo}},
    // Started by PUSH (its frame asks for the sum); OnFrame proceeds when the sum is in place.
    {Stage::kPull, "PULL", nullptr, /*credit=*/false, Waits::kServer, /*compressed_only=*/false,
     /*device_only=*/false, /*schemes=*/kPsOnly, {kNo, kAwait, kNo, kAwait, kNo},
     {kNo, kNo, kNo, kAwait, kNo}},
    // An all-reduce tensor (ring, tree; docs/schemes.md): walks the summing half of the
    // partition's program (worker_collective.cc), holding credit until its first sends are
    // written; the program's messages move it on to ALL_GATHER, which ends when its last
    // message is in and its sends are written.
    {Stage::kReduceScatter, "REDUCE_SCATTER", &WorkerCore::RunReduceScatter, /*credit=*/true,
     Waits::kPeer, /*compressed_only=*/false, /*device_only=*/false, /*schemes=*/kAllReduceOnly,
     {kNo, kQueue, kNo, After(kReduced), kNo}, {kNo, kNo, kNo, After(kReduced), kNo}},
    {Stage::kAllGather, "ALL_GATHER", nullptr, /*credit=*/false, Waits::kPeer,
     /*compressed_only=*/false, /*device_only=*/false, /*schemes=*/kAllReduceOnly,
     {kNo, kAwait, kNo, kAwait, kNo}, {kNo, kNo, kNo, kAwait, kNo}},
    // Decodes the pulled encoding into the output or the aggregate (worker_compress.cc): off
    // the receiving thread, which goes on receiving other partitions.
    {Stage::kDecompress, "DECOMPRESS", &WorkerCore::RunDecompress, /*credit=*/false,
     Waits::kWork, /*compressed_only=*/true, /*device_only=*/false, /*schemes=*/kPsOnly,
     {kNo, kQueue, kNo, kQueue, kNo}, {kNo, kNo, kNo, kQueue, kNo}},
    // NCCL plan: each process divides its shard of the machine's sum in place, when averaging.
    // One process per distributed machine: COPY_OUT at most divides the pulled partition in
    // place, so the receive thread (or DECOMPRESS's) does that instead of handing it on. One
    // process on one machine: a device tensor's COPY_OUT is a copy within the device, done when
    // the device has made it (worker_device.cc), and the tensor's whole plan.
    {Stage::kCopyOut, "COPY_OUT", &WorkerCore::RunCopyOut, /*credit=*/false, Waits::kWork,
     /*compressed_only=*/false, /*device_only=*/false, /*schemes=*/kAny,
     {kQueue, kInline, After(kReduced), kQueue, After(kPulled)},
     {kNo, kNo, kNo, kQueue, After(kPulled)}},
    // A device tensor: the result from the pinned host buffer to the device output; the
    // partition is done when the copy is (worker_device.cc).
    {Stage::kCopyH2D, "COPY_H2D", &WorkerCore::RunCopyH2D, /*credit=*/false, Waits::kWork,
     /*compressed_only=*/false, /*device_only=*/true, /*schemes=*/kAny,
     {kNo, kQueue, kQueue, kQueue, kQueue}, {kNo, kNo, kNo, kQueue, kQueue}},
    // NCCL: the machine's GPUs all-gather their shards of the result (nccl_sequencer.cc).
    {Stage::kBroadcast, "BROADCAST", &WorkerCore::RunBroadcast, /*credit=*/false, Waits::kWork,
     /*compressed_only=*/false, /*device_only=*/true, /*schemes=*/kAny,
     {kNo, kNo, kNo, kNo, kNo}, {kNo, kNo, kNo, kSeq, kSeq}},
};

namespace {

constexpr bool SingleProcess(int layout) {
  return layout == static_cast<int>(Layout::kOneProcess) ||
         layout == static_cast<int>(Layout::kOneProcessDistributed);
}

// Rows in id order; a stage that is run (queued, inline or sequenced) has a run function; only
// a queued stage has a gate, and only on a multi-process machine (the gates exist there); an
// awaited stage follows another one; a sequenced one is on a multi-process machine; every
// layout's host plan has a stage, and so does every multi-process layout's NCCL plan, whose
// single-process columns are empty; a stage in both plans of a layout is entered the same way
// in both (WorkerCore keeps one entry per stage).
constexpr bool ColumnIsValid(int layout, bool nccl) {
  bool any = false;
  for (int s = 0; s < kStageCount; ++s) {
    const StageRow& row = StageTable::rows[s];
    const StageSlot& slot = nccl ? row.nccl[layout] : row.where[layout];
    if (static_cast<int>(row.id) != s) return false;
    if (slot.entry != Entry::kAbsent && slot.entry != Entry::kAwaited && !row.run) return false;
    if (slot.gate != GateKind::kNone && (slot.entry != Entry::kQueued || SingleProcess(layout)))
      return false;
    if (slot.entry == Entry::kAwaited && !any) return false;
    if (slot.entry == Entry::kSequenced && SingleProcess(layout)) return false;
    if (nccl && slot.entry != Entry::kAbsent && row.where[layout].entry != Entry::kAbsent &&
        row.where[layout].entry != slot.entry)
      return false;
    any = any || slot.entry != Entry::kAbsent;
  }
  return any == (!nccl || !SingleProcess(layout));
}

constexpr bool TableIsValid() {
  for (int layout = 0; layout < kLayoutCount; ++layout)
    if (!ColumnIsValid(layout, false) || !ColumnIsValid(layout, true)) return false;
  return true;
}
static_assert(TableIsValid(), "the stage table is inconsistent (see TableIsValid)");

}  // namespace

Layout LayoutOf(int local_size, bool distributed, bool is_root) {
  if (local_size == 1) return distributed ? Layout::kOneProcessDistributed : Layout::kOneProcess;
  if (!distributed) return Layout::kLocalGroup;
  return is_root ? Layout::kLocalRoot : Layout::kLocalOther;
}

}  // namespace byteps
