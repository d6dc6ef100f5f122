// Tensor partitioning (ByteScheduler, SOSP'19 §4; upstream operations.cc PartitionTensor).
// A tensor of n bytes is cut into partitions of at most `bound` bytes, each an independent
// task with its own key (declared_key << 16 | partition index).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"

namespace byteps {

struct Partition {
  uint32_t index;
  size_t offset;  // bytes from the start of the tensor
  size_t length;  // bytes
};

constexpr size_t kPageBytes = 4096;
constexpr uint32_t kMaxPartitions = 1u << 16;

// BYTEPS_PARTITION_BYTES rounded up to a multiple of local_size pages (upstream rule, so the
// local reduce shards stay page-aligned).
size_t PartitionBound(int64_t partition_bytes, int local_size);

// The partition bound of one tensor of a distributed job: the job's bound, or less for a tensor
// too small to fill the pipeline with it. The last partition a server sums goes back to all
// num_worker machines after everything else, and the first comes back only once all of them
// sent theirs, so push_pull of n bytes takes about t_opt * (1 + num_worker * bound / n). A
// tensor with want = n / (kPipelineDepth * num_worker) below the job's bound is cut at want
// rounded down to a multiple of kSmallPartitionBytes (at least one; then down to whole
// local_size pages; never above the job's bound). Why a depth of 32 and a multiple of 60 KiB
// (a TCP sender's GSO packets of 45 x 1448 bytes): docs/architecture.md §4, measured in
// docs/performance-notes.md. A compressed tensor (`compressed`) is cut at the job's bound only,
// as upstream compresses each BYTEPS_PARTITION_BYTES partition: a compressor acts on the
// partitions the user asked for, and a bound as large as the tensor compresses it whole
// (docs/compression.md). Every worker and the scheduler compute the same bound from the same
// arguments.
constexpr size_t kPipelineDepth = 32;
constexpr size_t kSmallPartitionBytes = 60 << 10;
size_t TensorPartitionBound(size_t nbytes, size_t job_bound, int num_worker, int local_size,
                            bool compressed = false);


// Splits nbytes into ceil(nbytes / bound) partitions (none for nbytes == 0). Fails if the
// tensor needs more than 2^16 partitions or bound is not a multiple of elem_size.
Status PartitionTensor(size_t nbytes, size_t bound, size_t elem_size, std::vector<Partition>* out);

// A partition's server key: its index in bits 0-15, its tensor's declared key in bits 16-31
// (the tensor's number within its process set) and 48-63 (the process set, 0 for the job's
// global set: docs/collectives.md, "Process sets"), and the tensor's key generation in bits
// 32-47 (BYTEPS_AUTOTUNE cuts a tensor anew under new keys, docs/autotune.md). A declared key
// is `process set << 16 | number`.
inline uint64_t PartitionKey(uint32_t declared_key, uint32_t index, uint32_t generation = 0) {
  return (static_cast<uint64_t>(declared_key >> 16) << 48) |
         (static_cast<uint64_t>(generation & 0xffff) << 32) |
         (static_cast<uint64_t>(declared_key & 0xffff) << 16) | (index & 0xffff);
}
// The declared key (process set and number) and the generation of a partition's key.
constexpr uint32_t KeyTensor(uint64_t key) {
  return static_cast<uint32_t>((key >> 48) << 16 | (key >> 16 & 0xffff));
}
constexpr uint32_t KeyGeneration(uint64_t key) {
  return static_cast<uint32_t>(key >> 32 & 0xffff);
}
// The process set of a declared key.
constexpr uint32_t DeclaredKeySet(uint32_t declared_key) { return declared_key >> 16; }
// The order in which worker machine `worker` pushes the P partitions of one tensor: the
// partition sequence rotated to start at partition `worker` mod P (the result is the position
// of partition `index`). The plan interleaves the servers in proportion to their shares (round-robin for
// equal ones), so each worker starting one partition further sends to another server at every
// step, instead of all workers sending their first partitions to the same server at once
// (incast: that server's link is the bottleneck while the others idle, and the sums flow back
// late), and the proportions stay those of the plan at every point of the sequence.
inline uint32_t StaggeredPushPosition(uint32_t index, size_t partitions, int worker) {
  const size_t first = static_cast<size_t>(worker < 0 ? 0 : worker) % partitions;
  return static_cast<uint32_t>((index + partitions - first) % partitions);
}

inline uint32_t PartitionIndexOf(uint64_t key) { return static_cast<uint32_t>(key & 0xFFFF); }

// Splits `count` elements among `parts` workers for the local reduce: shard i is
// [begin, end) in elements, boundaries multiples of 16 elements (64-byte aligned for float32).
void ShardRange(size_t count, int parts, int i, size_t* begin, size_t* end);

}  // namespace byteps
