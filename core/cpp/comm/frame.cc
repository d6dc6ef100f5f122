#include "frame.h"
#include <cstdint>

namespace byteps {

Status ValidateFrame(const FrameHeader& h) {
  if (h.magic != kFrameMagic)
    return Status::InvalidArgument("bad frame magic 0x" + std::to_string(h.magic));
  if (h.payload_len > kMaxFramePayload)
    return Status::InvalidArgument("frame payload of " + std::to_string(h.payload_len) +
                                   " bytes exceeds the limit " + std::to_string(kMaxFramePayload));
  return Status::OK();
}

std::string WireReader::Str(size_t max_len) {
  uint32_t n = U32();
  if (!ok_ || n > max_len || n_ - off_ < n) {
    ok_ = false;
    return {};
  }
  std::string s(p_ + off_, n);
  off_ += n;
  return s;
}

std::vector<int64_t> WireReader::I64s(size_t max_count) {
  uint32_t n = U32();
  if (!ok_ || n > max_count || (n_ - off_) / 8 < n) {
    ok_ = false;
    return {};
  }
  std::vector<int64_t> v(n);
  for (auto& x : v) x = I64();
  return v;
}

}  // namespace byteps
