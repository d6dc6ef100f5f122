#include "partitioner.h"

#include <algorithm>
#include <cstdint>
#include <string>

namespace byteps {

size_t PartitionBound(int64_t partition_bytes, int local_size) {
  size_t unit = kPageBytes * static_cast<size_t>(std::max(local_size, 1));
  size_t b = static_cast<size_t>(std::max<int64_t>(partition_bytes, 1));
  return (b + unit - 1) / unit * unit;
}

Status PartitionTensor(size_t nbytes, size_t bound, size_t elem_size, std::vector<Partition>* out) {
  out->clear();
  if (bound == 0 || elem_size == 0 || bound % elem_size != 0)
    return Status::InvalidArgument("partition bound " + std::to_string(bound) +
                                   " is not a positive multiple of the element size " +
                                   std::to_string(elem_size));
  size_t n = (nbytes + bound - 1) / bound;
  if (n > kMaxPartitions)
    return Status::InvalidArgument("tensor of " + std::to_string(nbytes) + " bytes needs " +
                                   std::to_string(n) + " partitions; at most " +
                                   std::to_string(kMaxPartitions) +
                                   " are allowed (raise BYTEPS_PARTITION_BYTES)");
  out->reserve(n);
  for (size_t i = 0; i < n; ++i) {
    size_t off = i * bound;
    out->push_back(Partition{static_cast<uint32_t>(i), off, std::min(bound, nbytes - off)});
  }
  return Status::OK();
}

size_t TensorPartitionBound(size_t nbytes, size_t job_bound, int num_worker, int local_size,
                            bool compressed) {
  if (compressed) return job_bound;
  const size_t want = nbytes / (kPipelineDepth * static_cast<size_t>(std::max(num_worker, 1)));
  if (want >= job_bound) return job_bound;
  const size_t unit = kPageBytes * static_cast<size_t>(std::max(local_size, 1));
  const size_t steps = std::max<size_t>(want / kSmallPartitionBytes, 1);
  const size_t bound = std::max(unit, steps * kSmallPartitionBytes / unit * unit);
  return std::min(bound, job_bound);
}

void ShardRange(size_t count, int parts, int i, size_t* begin, size_t* end) {
  constexpr size_t kAlign = 16;
  size_t per = (count + parts - 1) / std::max(parts, 1);
  per = (per + kAlign - 1) / kAlign * kAlign;
  *begin = std::min(count, per * static_cast<size_t>(i));
  *end = std::min(count, *begin + per);
}

}  // namespace byteps
