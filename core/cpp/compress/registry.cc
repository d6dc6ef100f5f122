// Create (compressor.h): the chain the kwargs name for one partition, as upstream's registry
// composes it: Momentum(ErrorFeedback(base)) on a worker, ErrorFeedback(base) on a server
// (momentum is the worker's), each decorator only when its type key is present.
//
// topk / randomk k per partition: a fraction f < 1 gives float32(f) * bytes / element size
// in float32 arithmetic, truncated, at least 1 (upstream's formula on the partition's bytes);
// an absolute k larger than the partition's element count gives the whole partition
// (min(k, count)): upstream aborts on k > count / 2, but a small last partition of a large
// tensor is normal here, so it is not an error.
//
// Partitions hold fewer than 2^32 elements (the sparse encodings carry uint32 indices).
#include "internal.h"
#include <cstdint>

namespace byteps {
namespace compress {

namespace {

size_t SparseK(const detail::Params& p, DType dtype, size_t count) {
  uint64_t k;
  if (p.k_is_fraction) {
    const float es = static_cast<float>(DTypeSize(dtype));
    const float bytes = static_cast<float>(count * DTypeSize(dtype));
    const float v = p.k_fraction * bytes / es;
    k = v >= 1.0f ? static_cast<uint64_t>(v) : 0;
    if (k == 0) k = 1;
  } else {
    k = p.k_count;
  }
  return static_cast<size_t>(k < count ? k : count);
}

}  // namespace

Status Create(const Kwargs& kw, Side side, DType dtype, size_t count,
              std::unique_ptr<Compressor>* out) {
  detail::Params p;
  BPS_RETURN_IF_ERROR(detail::ParseParams(kw, dtype, &p));
  if (!p.has_compressor) {
    return Status::InvalidArgument("compressor kwargs name no compressor_type (spec '" +
                                   FormatSpec(kw).substr(0, 200) + "')");
  }
  if (count == 0) return Status::InvalidArgument("compressor for a partition of 0 elements");
  if (count > 0xffffffffull) {
    return Status::InvalidArgument("compressor for a partition of " + std::to_string(count) +
                                   " elements; at most 2^32 - 1");
  }
  std::unique_ptr<detail::Codec> codec;
  switch (p.type) {
    case detail::CodecType::kOnebit:
      codec = detail::MakeOnebit(dtype, count, p.onebit_scaling);
      break;
    case detail::CodecType::kTopk:
      codec = detail::MakeTopk(dtype, count, SparseK(p, dtype, count));
      break;
    case detail::CodecType::kRandomk:
      codec = detail::MakeRandomk(dtype, count, SparseK(p, dtype, count), p.has_seed, p.seed);
      break;
    case detail::CodecType::kDithering:
      codec = detail::MakeDithering(dtype, count, static_cast<uint32_t>(p.k_count),
                                    p.dithering_natural, p.dithering_l2, p.has_seed, p.seed);
      break;
    case detail::CodecType::kFp16:
      codec = detail::MakeFp16(dtype, count);
      break;
  }
  std::unique_ptr<Compressor> chain;
  if (p.error_feedback) {
    chain = detail::MakeErrorFeedback(std::move(codec));
  } else {
    chain = std::move(codec);
  }
  if (p.momentum && side == Side::kWorker) {
    chain = detail::MakeMomentum(std::move(chain), p.momentum_mu);
  }
  *out = std::move(chain);
  return Status::OK();
}

}  // namespace compress
}  // namespace byteps
