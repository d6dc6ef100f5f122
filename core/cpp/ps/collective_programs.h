// The collectives beside all-reduce (docs/collectives.md): allgather, broadcast,
// reducescatter and alltoall, written as programs (CollProgram, ps/sync_scheme.h) over the worker mesh
// (ps/peer_mesh.h) that the worker core walks as it walks the ring and tree all-reduces
// (pipeline/worker_collective.cc), partition by partition, under the same priority queue and
// scheduling credit (REDUCE_SCATTER starts a partition's walk).
//
// A collective works on one buffer of the tensor's bytes, the same size on every worker
// machine; its *layout* says whose bytes are where:
//
// * allgather: machine m's rows are block m = [blocks[m], blocks[m + 1]); a machine's input
//   holds its own block (the rest is not read), its output every block. A ring: at step k each
//   machine sends the block it got at step k - 1 (its own at step 0) to its successor and
//   receives the next one from its predecessor: (n - 1)/n of the bytes cross each link once.
// * broadcast: the root machine's buffer goes to all. A chain along the ring from the root,
//   pipelined by the partitions: each link carries the tensor once; the last machine sends the
//   root an empty acknowledgement, so the root (which receives nothing else) never starts a
//   round before the previous one reached every machine.
// * reducescatter: machine m needs block m combined (reduce::ReduceOp) over every machine. A
//   ring reduce-scatter: at step k each machine sends its partial sum of block me - k - 1 and
//   combines block me - k - 2 from its predecessor into its own; after n - 1 steps block me is
//   complete here (the other blocks of the output hold partial sums). (n - 1)/n of the bytes
//   cross each link.
// * alltoall: the buffer holds every machine's data, destination-major: block i = d * n + s =
//   [blocks[i], blocks[i + 1]) is what s sends d, so what d receives is one run of the buffer
//   (in source order). The partitions are queued phase by phase (the worker core's
//   coll_position), block (d, s) in phase (d - s) mod n, so while a phase's partitions are in
//   flight every machine sends to a different one and receives from a different one: no link
//   idles and none takes two senders (destination-major queueing made every sender wait on one
//   receiver's link at a time). Direct: each machine sends its block to each destination over
//   their own connection (the mesh is complete) and acknowledges each block it receives with
//   an empty message, so a sender never starts a round before its destinations reached the
//   previous one. (n - 1)/n of a machine's bytes leave over its link, as much arrives.
//
// In the rings every step exchanges a message, also where a block is empty in a partition (a
// message of 0 bytes): a machine then finishes a round only after every other machine started it, so no
// peer is ever more than one round ahead (the receives keep two rounds apart by parity).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ps/sync_scheme.h"

namespace byteps {

enum class Collective : uint8_t {
  kAllreduce = 0,
  kAllgather = 1,
  kBroadcast = 2,
  kReducescatter = 3,
  kAlltoall = 4
};
constexpr int kCollectiveCount = 5;

const char* CollectiveName(Collective c);
// "allreduce" | "allgather" | "broadcast" | "reducescatter" | "alltoall"; false otherwise.
bool ParseCollective(const std::string& text, Collective* out);

// Where a collective's bytes are, the same on every worker machine. blocks (allgather,
// reducescatter): n + 1 byte offsets, 0 = blocks[0] <= ... <= blocks[n] = the tensor's bytes,
// each a multiple of the element size (alltoall: n * n + 1 of them, in phase order); root (broadcast): the worker machine, 0 <= root < n,
// and root_rank the rank on it whose buffer is sent (compared across ranks; the machine's
// processes sum their buffers, every one but the root's zeros).
struct CollLayout {
  Collective kind = Collective::kAllreduce;
  std::vector<uint64_t> blocks;
  int root = -1;
  int root_rank = -1;
};

// kInvalidArgument naming what is wrong with `layout` for n machines, a tensor of `nbytes`
// bytes of `elem_size`-byte elements.
Status ValidateLayout(const CollLayout& layout, int n, size_t nbytes, size_t elem_size,
                      const std::string& name);

// The program of worker machine `me` of `n` for the partition [offset, offset + length) of a
// tensor under `layout` (not kAllreduce: BuildCollProgram).
CollProgram BuildLayoutProgram(const CollLayout& layout, int n, int me, size_t offset,
                               size_t length);

}  // namespace byteps
