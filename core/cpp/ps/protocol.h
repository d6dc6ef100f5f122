// The protocol of the PS layer (docs/architecture.md §6): every message type, flag and reply
// code, and the checks of a received header that go with them. The van (comm/) carries frames
// and knows none of this; a connection asks its handler to check each header
// (ConnectionHandler::ValidateHeader), and every handler of this layer derives from
// PsConnectionHandler, which does it with ValidatePsHeader.
#pragma once
#include <cstdint>

#include "comm/connection.h"
#include "comm/frame.h"
#include "reduce/sum.h"

namespace byteps {

enum class MsgType : uint16_t {
  // control plane: node <-> scheduler
  kRegister = 1,
  kAddressBook = 2,
  kDeclare = 3,
  kDeclareReply = 4,  // aux: DeclareReply
  kHeartbeat = 5,
  kFinalize = 6,
  kFinalizeDone = 7,
  kShutdown = 8,
  kNodeFailed = 9,
  // scheduler -> workers: worker machine `sender` has finalized (called shutdown()) while
  // others go on; what it never submitted can never complete. In asynchronous mode
  // (BYTEPS_ENABLE_ASYNC) also when it died, and to the servers too (they stop waiting for it).
  kWorkerLeft = 10,
  // scheduler -> servers: every worker machine declared tensor `key` (its declared key) cut anew
  // with key generation aux (BYTEPS_AUTOTUNE, docs/autotune.md); the tensor's keys of older
  // generations are done with, and the servers free them. No payload.
  kRetireKeys = 11,
  // data plane: worker <-> server
  kHello = 20,
  kPush = 21,  // flags: kPushFlagPull, kPushFlagHips, kPushFlagHipsUp, kPushFlagAsync
  kPull = 22,
  kPullResponse = 23,
  kDataError = 24,  // aux: DataError
  kGoodbye = 25,
  // stall inspector: which workers have not pushed (key, round) yet
  kStallQuery = 26,   // worker -> server: aux = round, no payload
  kStallReport = 27,  // server -> worker: aux = round, payload = uint32 worker ids missing
  // server -> worker: the push of (key, aux = round) has been received. The worker's
  // scheduling credit is held until then (upstream's ps-lite push callback), so the bytes a
  // worker has in flight are bounded on the wire, not only in its own queues. The first
  // acknowledgement of a plain key on a connection with one-way writes (comm/connection.h:
  // ExportWindow; the UCX van over shared memory or RDMA) carries a window on the worker's
  // fixed slot for the key at the server (at most kMaxWindowBlob bytes; no payload otherwise):
  // the worker's later pushes of the key are written into it one-way, each a PUSH without
  // payload whose FrameHeader::written is the key's length (docs/rdma.md).
  kPushAck = 28,
  // worker -> server, before the first push of a compressed key on this connection: the key's
  // compressor (payload: EncodeKeyConfig; the uncompressed element count and the compressor's
  // canonical kwargs). A compressed key's PUSH carries the worker's learning rate in aux (the
  // bits of a double, for the server's error feedback) and an encoded payload of at most the
  // compressor's MaxEncodedBytes; so does its PULL_RESPONSE (no aux).
  kKeyConfig = 29,
  // worker <-> worker, the all-reduce schemes (ring, tree; docs/schemes.md) over the worker
  // mesh (ps/peer_mesh.h). PEER_HELLO: the connecting local root says its worker id (sender),
  // no payload. COLLECTIVE: one step of a partition's program (ps/sync_scheme.h): key, round,
  // aux = the step's tag, payload = the bytes. PEER_GOODBYE: the sender has shut down; what it
  // has not sent by now it never will.
  kPeerHello = 30,
  kCollective = 31,
  kPeerGoodbye = 32,
  // worker <-> worker: the sender gave up on an all-reduce operation because a machine shut
  // down before it could complete (key: the tensor's declared key; aux: its round; payload:
  // the text). The receiver fails that operation too and passes it on, so machines that
  // exchange no message with the departed one do not wait for BYTEPS_TIMEOUT.
  kPeerAbort = 33,
  // worker -> server, before the first push of a plain key that pulls, on a connection with
  // one-way writes, where the worker's local root receives the key's sum into memory of its own
  // (docs/rdma.md): a window on where the sums go (payload: at most kMaxWindowBlob bytes), the
  // sum of an even round at its start and of an odd round aux bytes further. The server then
  // writes the key's sums for this worker into it one-way, each a PULL_RESPONSE without payload
  // whose FrameHeader::written is the key's length.
  kPullWindow = 34,
  // Horovod's join (docs/collectives.md, "Join"). worker -> scheduler: this machine has joined
  // (key: its rank; payload: EncodeRounds, the round of each of its tensors). scheduler ->
  // servers: the machines that have joined now (payload: EncodeWorkerIds; none: every machine
  // is back), which each server acknowledges with an empty JOIN once applied.
  kJoin = 35,
  // scheduler -> workers: every machine has joined (aux: the rank that joined last; payload:
  // EncodeRounds, the highest round of each tensor over the machines, which every worker
  // takes as its own). Sent once the servers acknowledged that no machine is joined any more.
  kJoinDone = 36,
};

// FrameHeader::flags of a PUSH: the sender also wants the round's sum (a PULL folded into the
// push, so no separate pull request queues behind later pushes on the same connection).
constexpr uint8_t kPushFlagPull = 1;
// HiPS (docs/schemes.md): a worker's push to its group's first-level server, whose aux names the
// top-level server of the partition; and a first-level server's push of its group's sum to
// that top-level server (sender: the group).
constexpr uint8_t kPushFlagHips = 2;
constexpr uint8_t kPushFlagHipsUp = 4;
// HELLO's aux from a first-level HiPS server (sender: its group) to a top-level one.
constexpr uint64_t kHelloFromServer = 1;
// FrameHeader::flags of a PUSH: the key is an asynchronous parameter (BYTEPS_ENABLE_ASYNC,
// docs/async.md): the server keeps its value, the push of round 1 is the worker's initial value
// (rank 0's becomes the key's), every later one a delta added to it, and the reply is the
// value, whatever the other workers do.
constexpr uint8_t kPushFlagAsync = 8;
// FrameHeader::flags of a PUSH, bits 4-5: how the key's pushes are combined (reduce::ReduceOp:
// sum, min, max, product; docs/collectives.md). Fixed by the push that makes the key; a push
// with another op is an error to its worker.
constexpr int kPushOpShift = 4;
constexpr uint8_t kPushOpMask = 0x30;
inline uint8_t PushOpFlags(reduce::ReduceOp op) {
  return static_cast<uint8_t>(static_cast<uint8_t>(op) << kPushOpShift);
}
inline reduce::ReduceOp PushOpOf(uint8_t flags) {
  return static_cast<reduce::ReduceOp>((flags & kPushOpMask) >> kPushOpShift);
}

// FrameHeader::aux of a DECLARE_REPLY.
enum class DeclareReply : uint64_t {
  kOk = 0,            // payload: the server of every partition (EncodeDeclareOk)
  kMismatch = 1,      // payload: text; the workers declared the tensor differently
  kTimeout = 2,       // payload: text; not every worker declared it within BYTEPS_TIMEOUT
  kStallWarning = 3,  // payload: the worker machines that have not declared it yet (no answer)
  // to a worker machine that has joined (docs/collectives.md, "Join"): the others declared the
  // tensor of this key meanwhile (payload: text, its name); the worker takes the key for that
  // name, so its keys keep agreeing with theirs. No answer to a declaration of its own.
  kJoinedNote = 4,
};

// FrameHeader::aux of a DATA_ERROR (payload: text).
enum class DataError : uint64_t {
  kRejected = 0,   // the server refused this worker's data
  kJobFailed = 1,  // the job failed elsewhere; the server is leaving
};

// FrameHeader::aux of a PULL_RESPONSE from a server with BYTEPS_TRACE_ON (0 otherwise): bit 63
// set (times present: a round can take 0 us of both), the microseconds from the round's first
// push to its last (bits 32-62) and those the server spent summing the round (low 32 bits), for
// the workers' timelines (docs/timeline.md).
constexpr uint64_t kServerTimesPresent = 1ull << 63;
constexpr uint64_t PackServerTimes(uint64_t wait_us, uint64_t sum_us) {
  return kServerTimesPresent | (wait_us > 0x7fffffffull ? 0x7fffffffull : wait_us) << 32 |
         (sum_us > 0xffffffffull ? 0xffffffffull : sum_us);
}
constexpr uint32_t ServerWaitUs(uint64_t aux) {
  return static_cast<uint32_t>(aux >> 32 & 0x7fffffffull);
}
constexpr uint32_t ServerSumUs(uint64_t aux) { return static_cast<uint32_t>(aux); }

constexpr uint64_t ToAux(DeclareReply r) { return static_cast<uint64_t>(r); }
constexpr uint64_t ToAux(DataError e) { return static_cast<uint64_t>(e); }

// The largest control payload (a DECLARE holds a name of at most 1 MiB). Control payloads are
// received into the connection's own buffer, which holds kMaxBufferedPayload bytes.
constexpr uint64_t kMaxControlPayload = 4ull << 20;  // 4 MiB
static_assert(kMaxControlPayload <= kMaxBufferedPayload, "a control payload must fit the buffer");
// The largest window a PUSH_ACK or PULL_WINDOW carries (an address, a length and UCX's packed remote key).
constexpr uint64_t kMaxWindowBlob = 64ull << 10;
// The largest data payload (a PUSH or PULL_RESPONSE: one partition, far smaller). A server
// bounds pushes further by the job's partition bound.
constexpr uint64_t kMaxDataPayload = 1ull << 33;  // 8 GiB
static_assert(kMaxDataPayload <= kMaxFramePayload, "a data payload must fit a frame");

inline MsgType TypeOf(const FrameHeader& h) { return static_cast<MsgType>(h.type); }
// The bytes a PUSH or PULL_RESPONSE brings: written one-way before it (FrameHeader::written),
// or its payload.
inline uint64_t DataBytes(const FrameHeader& h) { return h.written ? h.written : h.payload_len; }
bool IsControlType(MsgType t);
const char* MsgTypeName(MsgType t);

// Checks type, dtype and the length limits of its type of a header received from a peer (the
// van has checked magic and the absolute length bound: ValidateFrame).
Status ValidatePsHeader(const FrameHeader& h);

// Base of every connection handler of the PS layer: no header reaches OnHeader unchecked.
class PsConnectionHandler : public ConnectionHandler {
 public:
  Status ValidateHeader(const FrameHeader& h) final { return ValidatePsHeader(h); }
};

}  // namespace byteps
