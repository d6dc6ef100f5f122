// Wire format of the vans (comm/van.h): every message is one length-prefixed frame,
//   [FrameHeader, 48 bytes][payload, payload_len bytes]
// sent with one scatter-gather write straight from the tensor's buffer and received straight
// into the destination buffer chosen from the header. Payloads of control messages are encoded
// with WireWriter / WireReader, whose reads are bound-checked: nothing from a peer is trusted.
// This header is generic: what the type, flags and aux fields mean is the protocol of the PS
// layer (ps/protocol.h).
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/status.h"

namespace byteps {

constexpr uint32_t kFrameMagic = 0x31535042;  // "BPS1" little-endian
// The largest payload any frame may announce (8 GiB: far more than one partition); the protocol
// above sets tighter limits per message type (ps/protocol.h).
constexpr uint64_t kMaxFramePayload = 1ull << 33;
// The most a connection buffers on its own for a frame whose handler names no destination
// (ConnectionHandler::OnHeader), whatever a peer's header says.
constexpr uint64_t kMaxBufferedPayload = 4ull << 20;  // 4 MiB

#pragma pack(push, 1)
struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint16_t type = 0;    // message type of the protocol above (ps/protocol.h: MsgType)
  uint8_t dtype = 0;
  uint8_t flags = 0;
  uint32_t sender = 0;  // worker id / node id of the sender
  uint32_t round = 0;   // version of the key (sync round)
  uint64_t key = 0;
  uint64_t payload_len = 0;
  uint64_t aux = 0;     // message-specific (e.g. a reply code)
  // Bytes the sender wrote into the receiver's memory (a window the receiver exported on this
  // connection: Connection::ExportWindow) before sending this frame, which then carries no
  // payload; 0 for every other frame. Set by the van, checked by the protocol.
  uint64_t written = 0;
};
#pragma pack(pop)
static_assert(sizeof(FrameHeader) == 48, "FrameHeader must be 48 bytes");

// What the van checks of every header received from a peer before anything else: the magic and
// the absolute bound on the payload length. The fields that carry meaning (type, dtype, the
// limits per type) are the protocol's to check (ConnectionHandler::ValidateHeader).
Status ValidateFrame(const FrameHeader& h);

// Append-only encoder for control payloads (little-endian, length-prefixed strings).
class WireWriter {
 public:
  WireWriter& U8(uint8_t v) { return Raw(&v, 1); }
  WireWriter& U32(uint32_t v) { return Raw(&v, 4); }
  WireWriter& I32(int32_t v) { return Raw(&v, 4); }
  WireWriter& U64(uint64_t v) { return Raw(&v, 8); }
  WireWriter& I64(int64_t v) { return Raw(&v, 8); }
  WireWriter& F64(double v) { return Raw(&v, 8); }
  WireWriter& Str(const std::string& s) {
    U32(static_cast<uint32_t>(s.size()));
    return Raw(s.data(), s.size());
  }
  WireWriter& I64s(const std::vector<int64_t>& v) {
    U32(static_cast<uint32_t>(v.size()));
    for (auto x : v) I64(x);
    return *this;
  }
  const std::string& data() const { return buf_; }
  std::string Take() { return std::move(buf_); }

 private:
  WireWriter& Raw(const void* p, size_t n) {
    buf_.append(static_cast<const char*>(p), n);
    return *this;
  }
  std::string buf_;
};

// Bound-checked decoder: any read past the end (or a count larger than `max_count`) sets the
// failed flag and returns zeros; check ok() once at the end.
class WireReader {
 public:
  WireReader(const void* data, size_t len) : p_(static_cast<const char*>(data)), n_(len) {}
  uint8_t U8() { return Get<uint8_t>(); }
  uint32_t U32() { return Get<uint32_t>(); }
  int32_t I32() { return Get<int32_t>(); }
  uint64_t U64() { return Get<uint64_t>(); }
  int64_t I64() { return Get<int64_t>(); }
  double F64() { return Get<double>(); }
  std::string Str(size_t max_len = 1 << 20);
  std::vector<int64_t> I64s(size_t max_count = 64);
  bool ok() const { return ok_; }
  bool done() const { return ok_ && off_ == n_; }

 private:
  template <typename T>
  T Get() {
    T v{};
    if (!ok_ || n_ - off_ < sizeof(T)) {
      ok_ = false;
      return v;
    }
    memcpy(&v, p_ + off_, sizeof(T));
    off_ += sizeof(T);
    return v;
  }
  const char* p_;
  size_t n_;
  size_t off_ = 0;
  bool ok_ = true;
};

}  // namespace byteps
