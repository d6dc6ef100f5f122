// The worker-to-worker channel (docs/architecture.md §6, "Point-to-point channel"): tagged,
// asynchronous send and receive of byte buffers between the worker processes of a job, over the
// job's van (comm/van.h: TCP, or UCX when the job selects it), every link authenticated with the
// job secret (comm/auth.h) before anything from the peer is read. byteps.torch.pipeline sends
// activations forward and gradients backward through it.
//
// Links. Each process listens once; for every peer it connects one *outbound* link (frames this
// process sends to it) and accepts the peer's outbound link as its *inbound* link from it
// (frames it receives from it). An outbound link starts with HELLO (magic, sender rank, job
// size): an inbound link is bound to a rank only by a valid HELLO, before which nothing else is
// accepted; a second link claiming a rank already bound is dropped.
//
// Matching. A DATA frame carries (sender, tag); it completes the oldest receive posted for that
// (sender, tag), straight into the receive's buffer (zero copy), or, when none is posted yet,
// is kept in a buffer of its own until one is (bounded: max_message_bytes per message,
// max_buffered_bytes in all). Frames of one sender arrive in order, so messages of one
// (sender, tag) are received in the order they were sent.
//
// Failure. The inbound link of a rank is its lifeline: its end without a GOODBYE before it (the
// process died, the host went away, it sent a frame that fails the checks) makes the channel
// *failed*: every pending and later operation fails with kPeerLost naming the rank and why, the
// outbound links send FAILED (the reason) and close, so every other process of the job fails
// within a round trip, and none waits forever. A receive into the caller's memory that is
// being received when this happens completes (or fails) with its frame first, so no late write
// reaches memory the caller may free; a send completes only once its frame left (or can never
// leave) the caller's memory. A rank that closed its channel cleanly (GOODBYE) only fails the
// receives that wait for it.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "comm/connection.h"
#include "comm/van.h"
#include "common/status.h"

namespace byteps {

class Knobs;

// Message types of the channel's frames (FrameHeader.type), apart from the PS protocol's
// (ps/protocol.h: 1..40).
enum class P2pMsg : uint16_t { kHello = 60, kData = 61, kGoodbye = 62, kFailed = 63 };
constexpr uint32_t kP2pHelloMagic = 0x50325042;  // "BP2P" little-endian
constexpr uint64_t kP2pHelloBytes = 12;          // magic, rank, size (u32 each)
constexpr uint64_t kP2pMaxReasonBytes = 4096;    // FAILED's payload

// A received message the channel allocated (a receive posted without a buffer).
struct P2pBuffer {
  std::unique_ptr<char[]> data;
  size_t size = 0;
};

class P2pChannel final : public ConnectionHandler {
 public:
  struct Options {
    int rank = 0;
    int size = 1;
    std::string host = "127.0.0.1";  // binds here and peers reach it here
    int port = 0;                    // 0: any free port
    VanSpec van;
    uint64_t max_message_bytes = 1ull << 30;  // largest DATA payload accepted
    uint64_t max_buffered_bytes = 4ull << 30;  // unreceived messages held, all senders
    double handshake_timeout_s = 5;
  };
  using OpId = uint64_t;

  // Makes the van and listens. Errors: the van's (kConfig / kInvalidArgument), a bad option
  // (kInvalidArgument), the socket's (kInternal / kConfig).
  static Status Create(const Options& opts, std::unique_ptr<P2pChannel>* out);
  // The address a worker advertises: DMLC_NODE_HOST, else DMLC_INTERFACE's address, else the
  // local address of the route to the scheduler (DMLC_PS_ROOT_URI), else 127.0.0.1.
  static Status DefaultHost(const Knobs& k, std::string* host);
  ~P2pChannel() override;

  int rank() const { return opts_.rank; }
  int size() const { return opts_.size; }
  int port() const { return port_; }
  const std::string& host() const { return opts_.host; }
  const char* van_kind() const { return van_->kind(); }

  // Opens the outbound link to `peer` listening at host:port and says HELLO. Errors as
  // Van::Connect (kTimeout, kConfig for a peer that refuses this job's secret, kPeerLost).
  Status Connect(int peer, const std::string& host, int port, double timeout_s);
  // Waits until every rank of `peers` has an inbound link bound (its HELLO arrived);
  // kTimeout names the ranks still missing.
  Status WaitInbound(const std::vector<int>& peers, double timeout_s);

  // Queues `n` bytes at `data` (the caller's memory, untouched until the op completes) for
  // `peer` under `tag`. Errors at once: kInvalidArgument (no such peer, no outbound link),
  // the failed channel's kPeerLost, kShutdown after Close.
  Status Isend(int peer, uint64_t tag, const void* data, size_t n, OpId* id);
  // Posts a receive of the next message of `peer` under `tag` into `dest` (at most `capacity`
  // bytes; a longer message fails the receive with kInvalidArgument and is discarded), or, with
  // dest == nullptr, into a buffer the channel allocates (Wait hands it out).
  Status Irecv(int peer, uint64_t tag, void* dest, size_t capacity, OpId* id);
  // Waits at most timeout_s for the op. kTimeout leaves it pending (wait again); any other
  // result retires it: OK with *nbytes (received or sent) and, for a receive without a buffer,
  // *owned; the op's error otherwise.
  Status Wait(OpId id, double timeout_s, size_t* nbytes, P2pBuffer* owned);
  // True when Wait would return at once (done or failed); an unknown id is done.
  bool Test(OpId id);
  // The failure of the channel (OK while none).
  Status failure();
  // Says GOODBYE on every outbound link (each flushed within flush_timeout_s), closes every
  // link and the listener and fails what is still pending with kShutdown. Idempotent.
  void Close(double flush_timeout_s);

  // ConnectionHandler of the inbound links.
  Status ValidateHeader(const FrameHeader& h) override;
  Status OnHeader(Connection* c, const FrameHeader& h, void** dest) override;
  void OnFrame(Connection* c, const FrameHeader& h, void* payload) override;
  void OnClosed(Connection* c, const Status& why) override;

 private:
  struct Op {
    OpId id = 0;
    bool send = false;
    int peer = -1;
    uint64_t tag = 0;
    SendItem item;          // a send's frame
    void* dest = nullptr;   // a receive's buffer (nullptr: allocate)
    size_t capacity = 0;
    P2pBuffer owned;
    size_t nbytes = 0;
    bool receiving = false;  // its frame is being received into dest
    bool done = false;
    Status st;
    P2pChannel* channel = nullptr;
  };
  // A message that arrived before its receive was posted.
  struct Early {
    P2pBuffer buf;
    bool arrived = false;
    Op* waiter = nullptr;  // a receive posted while the payload was still arriving
  };
  // An inbound link's state: the rank it is bound to and the frame being received.
  struct Inbound {
    Connection* conn = nullptr;
    bool goodbye = false;
    Op* cur_op = nullptr;
    std::shared_ptr<Early> cur_early;
  };
  // The outbound links' handler: a peer never sends on them; their end only stops sends.
  class OutboundHandler final : public ConnectionHandler {
   public:
    explicit OutboundHandler(P2pChannel* ch) : ch_(ch) {}
    Status ValidateHeader(const FrameHeader& h) override;
    Status OnHeader(Connection*, const FrameHeader&, void**) override { return Status::OK(); }
    void OnFrame(Connection*, const FrameHeader&, void*) override {}
    void OnClosed(Connection* c, const Status& why) override;

   private:
    P2pChannel* ch_;
  };

  explicit P2pChannel(Options opts);
  static void SendDone(void* arg, const Status& st);
  void Complete(Op* op, const Status& st);          // mu_ held
  void Fail(const Status& why, int culprit);         // mu_ not held
  void FailPendingLocked(const Status& why);         // mu_ held
  void FailWaitersOf(int peer, const Status& why);   // mu_ held
  void AcceptInbound(std::unique_ptr<Connection> c);
  Status BindHello(Connection* c, const FrameHeader& h, const char* payload);
  std::string PeerName(int rank) const;

  Options opts_;
  std::unique_ptr<Van> van_;
  int port_ = 0;
  OutboundHandler out_handler_{this};

  std::mutex mu_;
  std::condition_variable cv_;
  bool closing_ = false;
  Status failure_;
  OpId next_id_ = 1;
  std::unordered_map<OpId, std::unique_ptr<Op>> ops_;
  std::vector<std::unique_ptr<Connection>> outbound_;  // by rank (null: none)
  std::vector<std::unique_ptr<Connection>> accepted_;  // every accepted link
  std::vector<Inbound> inbound_;                       // by rank
  std::map<std::pair<int, uint64_t>, std::deque<Op*>> posted_;
  std::map<std::pair<int, uint64_t>, std::deque<std::shared_ptr<Early>>> early_;
  uint64_t buffered_bytes_ = 0;
};

}  // namespace byteps
