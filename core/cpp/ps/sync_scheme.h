// The synchronization schemes (docs/schemes.md): how the worker machines of a job sum a
// tensor's partitions. `ps` is the summation service (servers sum what every worker pushes,
// §7); `ring` and `tree` are all-reduces among the worker machines' local roots over the
// worker mesh (ps/peer_mesh.h), with no server; `hips` is the summation service with servers in
// two levels. A tensor's scheme is part of its declaration (DeclareMsg::sync), the same on
// every worker.
//
// The all-reduces are written once, as a *program* per partition and worker machine: a list of
// sends and receives (CollOp) that the worker core walks (pipeline/worker_collective.cc). The
// tree (FlexTree-style, width w) is: a ring reduce-scatter inside each group of w consecutive
// worker machines, a binary tree across the n / w groups on the shard each member then owns
// (sum up to group 0, result back down), and a ring all-gather inside the group. w = n is the
// ring (one group, no tree); w = 1 a plain binary tree over the machines.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace byteps {

enum class SyncScheme : uint8_t { kPs = 0, kRing = 1, kTree = 2, kHips = 3 };
constexpr int kSyncSchemeCount = 4;

const char* SyncSchemeName(SyncScheme s);
// "ps" | "ring" | "tree" | "hips"; false for anything else.
bool ParseSyncScheme(const std::string& text, SyncScheme* out);
// An all-reduce among the workers (ring, tree): no server, the worker mesh.
inline bool IsCollective(SyncScheme s) { return s == SyncScheme::kRing || s == SyncScheme::kTree; }

// BYTEPS_TREE_WIDTH for n worker machines: `requested` (0 = the default: the largest divisor
// of n not above ceil(sqrt(n))) must divide n. kConfig naming the divisors otherwise.
Status ResolveTreeWidth(int n, int requested, int* width);

// HiPS (docs/schemes.md): worker machine w belongs to group w / g of g machines; the job's
// first ceil(n / g) servers (by rank) are the first level, server i summing group i; the others
// are the top level, among which the partitions are spread. `requested` 0: g = ceil(sqrt(n)).
int HipsGroupSize(int n, int requested);
inline int HipsGroups(int n, int g) { return (n + g - 1) / g; }
// The servers a HiPS job needs: one per group and at least one at the top.
inline int HipsServersNeeded(int n, int g) { return HipsGroups(n, g) + 1; }

// One step of a partition's program at one worker machine.
struct CollOp {
  enum Kind : uint8_t {
    kSend,     // send bytes [offset, offset + length) of the partition to `peer`
    kRecvSum,  // receive them from `peer` (into scratch at `scratch`), add into the partition
    kRecvCopy,  // receive them from `peer` straight into the partition (a final result)
    // The collectives' (ps/collective_programs.h) receive of a final result that may arrive
    // before this machine's round begins (nothing this machine sent is in it): straight into
    // the partition when the round is under way here, else into scratch at `scratch`, copied
    // into place when the walk reaches it.
    kRecvPlace,
    kCopyInput  // copy bytes [offset, offset + length) of the input into the partition (no peer)
  };
  Kind kind = kSend;
  // The range is read from the worker's input (not yet written to the output by an earlier
  // step of the program): a send from the input, or a sum input + received -> output.
  bool from_input = false;
  uint16_t peer = 0;    // worker machine (DMLC_WORKER_ID)
  uint32_t tag = 0;     // matches a send with the peer's receive: phase << 16 | step
  size_t offset = 0;    // bytes, within the partition
  size_t length = 0;    // bytes
  size_t scratch = 0;   // kRecvSum: where in the partition's scratch the bytes land
};

struct CollProgram {
  std::vector<CollOp> ops;
  size_t scratch_bytes = 0;  // of one round (a task keeps two: rounds alternate)
  // The first op of the gather half (REDUCE_SCATTER -> ALL_GATHER in the stage plan): every
  // op before it sums, every op from it on distributes the final result.
  size_t gather_begin = 0;
  // The sends before the first receive: the partition's scheduling credit is held until they
  // are written (docs/architecture.md §5).
  size_t initial_sends = 0;
};

// Tag phases (CollOp::tag >> 16).
enum CollPhase : uint32_t { kPhaseScatter = 0, kPhaseUp = 1, kPhaseDown = 2, kPhaseGather = 3 };

// The program of worker machine `me` of `n` for a partition of `bytes` bytes of elements of
// `elem_size` bytes, under `scheme` (kRing, or kTree of width `width`, which divides n; the
// ring is the tree of width n).
CollProgram BuildCollProgram(SyncScheme scheme, int n, int width, int me, size_t bytes,
                             size_t elem_size);
// The worker machines `me` exchanges messages with (symmetric: j is in peers(i) iff i is in
// peers(j)), ascending: every other one (alltoall's direct sends; the ring's and the tree of
// `width`'s neighbours among them).
std::vector<int> CollectivePeers(int n, int width, int me);

}  // namespace byteps
