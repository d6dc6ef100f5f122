// Vanilla error feedback (upstream's VanillaErrorFeedbackCompressor), around a base compressor:
//
//   corrected = scale * x + f * error     f = prev_lr / lr when both are > 0, else 1
//   encoding  = C(corrected)
//   error     = corrected - decode(encoding)
//   prev_lr   = lr
//
// element-wise in the tensor's type (float16: computed in float32, each stored tensor rounded
// to float16; f and the scale as float32 for float16/float32 tensors, float64 for float64).
// The error starts at 0 and prev_lr at 0 (unknown). Upstream read the learning rate from a
// file each step; here it comes with each call (CompressArgs::lr, compress/learning_rate.cc).
// Decoding is the base compressor's. Where the base compressor has a fused form of the step
// (Codec::EncodeWithFeedback) it runs that, with the same results in fewer passes over
// memory: onebit corrects, packs and takes the residual in one or two passes; topk, randomk
// and dithering correct in place in the error buffer and encode from there (dithering
// writing each residual as it quantizes, the sparse ones zeroing the sent elements).
#include <cstdint>
#include <vector>

#include "internal.h"

namespace byteps {
namespace compress {
namespace detail {
namespace {

class ErrorFeedback final : public Compressor {
 public:
  explicit ErrorFeedback(std::unique_ptr<Codec> inner)
      : Compressor(inner->dtype(), inner->count()),
        inner_(std::move(inner)),
        error_(raw_bytes(), 0) {}

  size_t MaxEncodedBytes() const override { return inner_->MaxEncodedBytes(); }

  Status Compress(const void* in, const CompressArgs& args, void* out, size_t* out_len) override {
    BPS_RETURN_IF_ERROR(CheckArgs(args));
    const double factor = (args.lr > 0 && prev_lr_ > 0) ? prev_lr_ / args.lr : 1.0;
    if (!inner_->EncodeWithFeedback(in, args.scale, factor, error_.data(), out, out_len)) {
      corrected_.resize(raw_bytes());
      Correct(dtype(), in, args.scale, factor, error_.data(), corrected_.data(), count());
      BPS_RETURN_IF_ERROR(inner_->Encode(corrected_.data(), out, out_len));
      inner_->Residual(corrected_.data(), out, *out_len, error_.data());
    }
    prev_lr_ = args.lr;
    return Status::OK();
  }

  Status Decompress(const void* in, size_t len, void* dst) override {
    return inner_->Decompress(in, len, dst);
  }
  Status DecompressAdd(const void* in, size_t len, void* dst) override {
    return inner_->DecompressAdd(in, len, dst);
  }

 private:
  std::unique_ptr<Codec> inner_;
  std::vector<uint8_t> error_;
  std::vector<uint8_t> corrected_;  // for codecs without a fused step, sized on first use
  double prev_lr_ = 0;
};

}  // namespace

std::unique_ptr<Compressor> MakeErrorFeedback(std::unique_ptr<Codec> inner) {
  return std::make_unique<ErrorFeedback>(std::move(inner));
}

}  // namespace detail
}  // namespace compress
}  // namespace byteps
