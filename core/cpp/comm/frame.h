// Wire format of the TCP van: every message is one length-prefixed frame,
//   [FrameHeader, 48 bytes][payload, payload_len bytes]
// sent with one scatter-gather write straight from the tensor's buffer and received straight
// into the destination buffer chosen from the header. Control-plane payloads are encoded with
// WireWriter / WireReader, whose reads are bound-checked: nothing from a peer is trusted.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/status.h"

namespace byteps {

constexpr uint32_t kFrameMagic = 0x31535042;  // "BPS1" little-endian
constexpr uint64_t kMaxDataPayload = 1ull << 33;     // 8 GiB: one partition is far smaller
// The largest control payload (a DECLARE holds a name of at most 1 MiB): also the most a
// connection's scratch buffer ever holds, whatever a peer's header says.
constexpr uint64_t kMaxControlPayload = 4ull << 20;  // 4 MiB

enum class MsgType : uint16_t {
  // control plane: node <-> scheduler
  kRegister = 1,
  kAddressBook = 2,
  kDeclare = 3,
  kDeclareReply = 4,
  kHeartbeat = 5,
  kFinalize = 6,
  kFinalizeDone = 7,
  kShutdown = 8,
  kNodeFailed = 9,
  // scheduler -> workers: worker machine `sender` has finalized (called shutdown()) while
  // others go on; what it never submitted can never complete.
  kWorkerLeft = 10,
  // data plane: worker <-> server
  kHello = 20,
  kPush = 21,
  kPull = 22,
  kPullResponse = 23,
  kDataError = 24,
  kGoodbye = 25,
  // stall inspector: which workers have not pushed (key, round) yet
  kStallQuery = 26,   // worker -> server: aux = round, no payload
  kStallReport = 27,  // server -> worker: aux = round, payload = uint32 worker ids missing
};

// FrameHeader::flags of a PUSH: the sender also wants the round's sum (a PULL folded into the
// push, so no separate pull request queues behind later pushes on the same connection).
constexpr uint8_t kPushFlagPull = 1;

bool IsControlType(MsgType t);
const char* MsgTypeName(MsgType t);

#pragma pack(push, 1)
struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint16_t type = 0;
  uint8_t dtype = 0;
  uint8_t flags = 0;
  uint32_t sender = 0;  // worker id / node id of the sender
  uint32_t round = 0;   // version of the key (sync round)
  uint64_t key = 0;
  uint64_t payload_len = 0;
  uint64_t aux = 0;     // message-specific (e.g. total tensor bytes)
  uint64_t reserved = 0;
};
#pragma pack(pop)
static_assert(sizeof(FrameHeader) == 48, "FrameHeader must be 48 bytes");

inline MsgType TypeOf(const FrameHeader& h) { return static_cast<MsgType>(h.type); }

// Checks magic, type, dtype and length bounds of a header received from a peer.
Status ValidateHeader(const FrameHeader& h);

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
