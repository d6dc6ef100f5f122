// What every base compressor shares (internal.h): the scale applied before encoding, the
// default error-feedback residual (decode, then subtract), the check of CompressArgs and the
// seeding of the random streams.
#include <cmath>
#include <cstdint>
#include <random>

#include "internal.h"

namespace byteps {
namespace compress {
namespace detail {

namespace {

template <typename E>
void ScaleTyped(const void* src, double scale, size_t count, void* dst) {
  using C = typename E::Compute;
  const auto* s = static_cast<const typename E::Storage*>(src);
  auto* d = static_cast<typename E::Storage*>(dst);
  const C f = static_cast<C>(scale);
  for (size_t i = 0; i < count; ++i) d[i] = E::Store(E::Load(s[i]) * f);
}

template <typename E>
void SubtractFrom(const void* corrected, size_t count, void* error) {
  const auto* c = static_cast<const typename E::Storage*>(corrected);
  auto* e = static_cast<typename E::Storage*>(error);
  for (size_t i = 0; i < count; ++i) e[i] = E::Store(E::Load(c[i]) - E::Load(e[i]));
}

template <typename E>
void CorrectTyped(const void* in, double scale, double factor, const void* error, void* out,
                  size_t n) {
  using C = typename E::Compute;
  using S = typename E::Storage;
  const S* __restrict x = static_cast<const S*>(in);
  S* __restrict c = static_cast<S*>(out);
  const C s = static_cast<C>(scale), f = static_cast<C>(factor);
  constexpr size_t kLine = 64 / sizeof(S);
  if (out == error) {  // in place: one stream read and written
    for (size_t b = 0; b < n; b += kLine) {  // a line of each stream per block, prefetched
      PrefetchRead(x, b);
      PrefetchWrite(c, b);
      const size_t end = n - b < kLine ? n : b + kLine;
      for (size_t i = b; i < end; ++i) c[i] = E::Store(E::Load(x[i]) * s + f * E::Load(c[i]));
    }
    return;
  }
  const S* __restrict err = static_cast<const S*>(error);
  for (size_t b = 0; b < n; b += kLine) {
    PrefetchRead(x, b);
    PrefetchRead(err, b);
    PrefetchWrite(c, b);
    const size_t end = n - b < kLine ? n : b + kLine;
    for (size_t i = b; i < end; ++i) c[i] = E::Store(E::Load(x[i]) * s + f * E::Load(err[i]));
  }
}

}  // namespace

void Correct(DType dtype, const void* x, double scale, double factor, const void* error,
             void* out, size_t count) {
  DispatchFloat(dtype,
                [&](auto e) { CorrectTyped<decltype(e)>(x, scale, factor, error, out, count); });
}

void ScaleInto(DType dtype, const void* src, double scale, size_t count, void* dst) {
  DispatchFloat(dtype, [&](auto e) { ScaleTyped<decltype(e)>(src, scale, count, dst); });
}

Status CheckArgs(const CompressArgs& args) {
  if (!std::isfinite(args.scale)) {
    return Status::InvalidArgument("compress: scale " + std::to_string(args.scale) +
                                   " is not finite");
  }
  return Status::OK();
}

Status Codec::Compress(const void* in, const CompressArgs& args, void* out, size_t* out_len) {
  BPS_RETURN_IF_ERROR(CheckArgs(args));
  if (args.scale == 1.0) return Encode(in, out, out_len);
  scaled_.resize(raw_bytes());
  ScaleInto(dtype(), in, args.scale, count(), scaled_.data());
  return Encode(scaled_.data(), out, out_len);
}

void Codec::Residual(const void* corrected, const void* enc, size_t len, void* error) {
  // The encoding is this instance's own: decoding cannot fail.
  (void)Decompress(enc, len, error);
  DispatchFloat(dtype(), [&](auto e) { SubtractFrom<decltype(e)>(corrected, count(), error); });
}

void SeedRng(XorShift128Plus* rng, bool seeded, uint64_t seed) {
  if (seeded) {
    rng->Seed(seed);
    return;
  }
  std::random_device rd;
  uint64_t a = rd(), b = rd();
  if (a == 0 && b == 0) a = 1;  // an all-zero state would only ever draw zeros
  rng->SetState(a, b);
}

}  // namespace detail
}  // namespace compress
}  // namespace byteps
