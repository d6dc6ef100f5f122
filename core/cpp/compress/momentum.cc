// Nesterov momentum (upstream's NesterovMomentumCompressor), a worker's decorator around the
// rest of the chain (error feedback and/or the base compressor):
//
//   g  = scale * x
//   m  = g + mu * m          (m starts at 0)
//   g' = g + mu * m
//   encoding = inner(g')     (with scale 1 and the call's learning rate)
//
// element-wise in the tensor's type (float16: computed in float32, g, m and g' each rounded to
// float16; mu and the scale as float32 for float16/float32 tensors, as upstream's float mu;
// float64 for float64 tensors). Decoding is the inner chain's.
#include <cstdint>
#include <vector>

#include "internal.h"

namespace byteps {
namespace compress {
namespace detail {
namespace {

class Momentum final : public Compressor {
 public:
  Momentum(std::unique_ptr<Compressor> inner, double mu)
      : Compressor(inner->dtype(), inner->count()),
        inner_(std::move(inner)),
        mu_(mu),
        mom_(raw_bytes(), 0),
        grad_(raw_bytes()) {}

  size_t MaxEncodedBytes() const override { return inner_->MaxEncodedBytes(); }

  Status Compress(const void* in, const CompressArgs& args, void* out, size_t* out_len) override {
    BPS_RETURN_IF_ERROR(CheckArgs(args));
    DispatchFloat(dtype(), [&](auto e) { Update<decltype(e)>(in, args.scale); });
    CompressArgs inner_args;
    inner_args.scale = 1.0;
    inner_args.lr = args.lr;
    return inner_->Compress(grad_.data(), inner_args, out, out_len);
  }

  Status Decompress(const void* in, size_t len, void* dst) override {
    return inner_->Decompress(in, len, dst);
  }
  Status DecompressAdd(const void* in, size_t len, void* dst) override {
    return inner_->DecompressAdd(in, len, dst);
  }

 private:
  template <typename E>
  void Update(const void* in, double scale) {
    using C = typename E::Compute;
    using S = typename E::Storage;
    const S* __restrict x = static_cast<const S*>(in);
    S* __restrict m = reinterpret_cast<S*>(mom_.data());
    S* __restrict out = reinterpret_cast<S*>(grad_.data());
    const C s = static_cast<C>(scale), mu = static_cast<C>(mu_);
    const size_t n = count();  // hoisted: the build allows any store to alias a member
    constexpr size_t kLine = 64 / sizeof(S);
    for (size_t b = 0; b < n; b += kLine) {  // a line of each stream per block, prefetched
      PrefetchRead(x, b);
      PrefetchWrite(m, b);
      PrefetchWrite(out, b);
      const size_t end = n - b < kLine ? n : b + kLine;
      for (size_t i = b; i < end; ++i) {
        const C g = E::Load(E::Store(E::Load(x[i]) * s));
        const S mi = E::Store(g + mu * E::Load(m[i]));
        m[i] = mi;
        out[i] = E::Store(g + mu * E::Load(mi));
      }
    }
  }

  std::unique_ptr<Compressor> inner_;
  double mu_;
  std::vector<uint8_t> mom_;
  std::vector<uint8_t> grad_;
};

}  // namespace

std::unique_ptr<Compressor> MakeMomentum(std::unique_ptr<Compressor> inner, double mu) {
  return std::make_unique<Momentum>(std::move(inner), mu);
}

}  // namespace detail
}  // namespace compress
}  // namespace byteps
