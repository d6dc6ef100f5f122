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
constexpr StageSlot After(GateKind g) { return {Entry::kQueued, g}; }  // queued behind a gate
constexpr GateKind kWritten = GateKind::kWritten;
constexpr GateKind kReduced = GateKind::kReduced;
constexpr GateKind kPulled = GateKind::kPulled;
constexpr PlanKind kAny = PlanKind::kAny;
constexpr PlanKind kPsOnly = PlanKind::kPs;
constexpr PlanKind kAllReduceOnly = PlanKind::kAllReduce;

}  // namespace

// Columns of `where`, in Layout order: one process | one process per machine, distributed |
// L processes, one machine | L per machine, distributed, local root | the other local ranks.
constexpr StageRow StageTable::rows[kStageCount] = {
    // A device tensor: the partition from device memory into the tensor's pinned host buffer,
    // after the producer's event (worker_device.cc); every later stage works in that buffer.
    // Not in a one-process job, whose COPY_OUT copies within the device.
    {Stage::kCopyD2H, "COPY_D2H", &WorkerCore::RunCopyD2H, /*credit=*/false, Waits::kWork,
     /*compressed_only=*/false, /*device_only=*/true, /*schemes=*/kAny,
     {kNo, kQueue, kQueue, kQueue, kQueue}},
    {Stage::kCopyIn, "COPY_IN", &WorkerCore::RunCopyIn, /*credit=*/false, Waits::kWork,
     /*compressed_only=*/false, /*device_only=*/false, /*schemes=*/kAny,
     {kNo, kNo, kQueue, kQueue, kQueue}},
    {Stage::kLocalReduce, "LOCAL_REDUCE", &WorkerCore::RunLocalReduce, /*credit=*/false,
     Waits::kWork, /*compressed_only=*/false, /*device_only=*/false, /*schemes=*/kAny,
     {kNo, kNo, After(kWritten), After(kWritten), After(kWritten)}},
    // Encodes from the input or the aggregate into the task's own buffer (worker_compress.cc).
    {Stage::kCompress, "COMPRESS", &WorkerCore::RunCompress, /*credit=*/false, Waits::kWork,
     /*compressed_only=*/true, /*device_only=*/false, /*schemes=*/kPsOnly,
     {kNo, kQueue, kNo, After(kReduced), kNo}},
    {Stage::kPush, "PUSH", &WorkerCore::RunPush, /*credit=*/true, Waits::kWork,
     /*compressed_only=*/false, /*device_only=*/false, /*schemes=*/kPsOnly,
     {kNo, kQueue, kNo, After(kReduced), kNo}},
    // Started by PUSH (its frame asks for the sum); OnFrame proceeds when the sum is in place.
    {Stage::kPull, "PULL", nullptr, /*credit=*/false, Waits::kServer, /*compressed_only=*/false,
     /*device_only=*/false, /*schemes=*/kPsOnly, {kNo, kAwait, kNo, kAwait, kNo}},
    // An all-reduce tensor (ring, tree; docs/schemes.md): walks the summing half of the
    // partition's program (worker_collective.cc), holding credit until its first sends are
    // written; the program's messages move it on to ALL_GATHER, which ends when its last
    // message is in and its sends are written.
    {Stage::kReduceScatter, "REDUCE_SCATTER", &WorkerCore::RunReduceScatter, /*credit=*/true,
     Waits::kPeer, /*compressed_only=*/false, /*device_only=*/false, /*schemes=*/kAllReduceOnly,
     {kNo, kQueue, kNo, After(kReduced), kNo}},
    {Stage::kAllGather, "ALL_GATHER", nullptr, /*credit=*/false, Waits::kPeer,
     /*compressed_only=*/false, /*device_only=*/false, /*schemes=*/kAllReduceOnly,
     {kNo, kAwait, kNo, kAwait, kNo}},
    // Decodes the pulled encoding into the output or the aggregate (worker_compress.cc): off
    // the receiving thread, which goes on receiving other partitions.
    {Stage::kDecompress, "DECOMPRESS", &WorkerCore::RunDecompress, /*credit=*/false,
     Waits::kWork, /*compressed_only=*/true, /*device_only=*/false, /*schemes=*/kPsOnly,
     {kNo, kQueue, kNo, kQueue, kNo}},
    // One process per distributed machine: COPY_OUT at most divides the pulled partition in
    // place, so the receive thread (or DECOMPRESS's) does that instead of handing it on. One
    // process on one machine: a device tensor's COPY_OUT is a copy within the device, done when
    // the device has made it (worker_device.cc), and the tensor's whole plan.
    {Stage::kCopyOut, "COPY_OUT", &WorkerCore::RunCopyOut, /*credit=*/false, Waits::kWork,
     /*compressed_only=*/false, /*device_only=*/false, /*schemes=*/kAny,
     {kQueue, kInline, After(kReduced), kQueue, After(kPulled)}},
    // A device tensor: the result from the pinned host buffer to the device output; the
    // partition is done when the copy is (worker_device.cc).
    {Stage::kCopyH2D, "COPY_H2D", &WorkerCore::RunCopyH2D, /*credit=*/false, Waits::kWork,
     /*compressed_only=*/false, /*device_only=*/true, /*schemes=*/kAny,
     {kNo, kQueue, kQueue, kQueue, kQueue}},
};

namespace {

constexpr bool SingleProcess(int layout) {
  return layout == static_cast<int>(Layout::kOneProcess) ||
         layout == static_cast<int>(Layout::kOneProcessDistributed);
}

// Rows in id order; a stage that is run (queued or inline) has a run function; only a queued
// stage has a gate, and only on a multi-process machine (the gates exist there); an awaited
// stage follows another one; every layout's plan has a stage.
constexpr bool TableIsValid() {
  for (int layout = 0; layout < kLayoutCount; ++layout) {
    bool any = false;
    for (int s = 0; s < kStageCount; ++s) {
      const StageRow& row = StageTable::rows[s];
      const StageSlot& slot = row.where[layout];
      if (static_cast<int>(row.id) != s) return false;
      if ((slot.entry == Entry::kQueued || slot.entry == Entry::kInline) && !row.run) return false;
      if (slot.gate != GateKind::kNone && (slot.entry != Entry::kQueued || SingleProcess(layout)))
        return false;
      if (slot.entry == Entry::kAwaited && !any) return false;
      any = any || slot.entry != Entry::kAbsent;
    }
    if (!any) return false;
  }
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
