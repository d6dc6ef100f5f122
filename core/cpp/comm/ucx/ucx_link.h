// A link to one peer over a UCX endpoint: the state UCX's callbacks refer to, owned by the
// context (shared) until its endpoint is closed; users see it through a UcxConnection
// (ucx_connection.h), the Connection (comm/connection.h) of the UCX transport, with the same
// SendItem, handler contract and FrameHeader as TCP (docs/architecture.md §6).
//
// Wire. Every message is one UCP active message (id kUcxAmId) whose header is a UcxAmHeader:
// a 24-byte prefix (magic "BPSU", kind, version, the receiver's and the sender's link ids) and
// the 48-byte FrameHeader; the frame's payload is the active message's data, sent straight from
// the SendItem's memory. UCX chooses the protocol by size: eager data arrives with the header
// and is copied into the destination the handler chose; rendezvous data (UCP_AM_RECV_ATTR_FLAG_
// RNDV) is fetched by ucp_am_recv_data_nbx straight into that destination (zero copy). Over
// TCP, which has no zero-copy rendezvous, frames up to kTcpEagerMax are sent eager, over shared
// memory frames up to kShmEagerMax (eager_max).
//
// Order. Frames of a link reach the handler in the order they were sent, one at a time, as on
// TCP: ValidateHeader(1), OnHeader(1), payload 1, OnFrame(1), ValidateHeader(2)... While a
// rendezvous receive is in progress, or before Start(), later messages of the link are held
// (UCX's descriptors where UCX lets them persist, else a copy), at most kMaxHeldFrames /
// kMaxHeldBytes, beyond which the peer is cut off.
//
// One-way writes (Connection::ExportWindow / OpenWindow). A receiver packs the remote key of a
// registered region into a window blob ("BPSW" | address u64 | length u64 | key, a Str), which
// its protocol sends the peer; the peer's link unpacks the key once on its endpoint (OpenWindow;
// at most kMaxWindows per link; windows with the same key share its unpacking, which over
// shared memory maps the peer's slab) and keeps it until the endpoint closes. A frame sent through a
// window of at least one_way_min() bytes has its payload written by ucp_put_nbx into the
// window, then the worker is fenced (ucp_worker_fence: what was issued before completes before
// what is issued after), then its header goes as an active message without payload and with
// `written` set: no rendezvous per frame, and the link's order holds. Smaller frames
// and frames without a window travel as above. A link whose active messages go over TCP offers
// no one-way writes (a put there costs more than an eager frame's copy: docs/performance-notes.md,
// the one-way write measurements).
//
// Bounds. Every size from a peer is checked before use: ValidateFrame and the handler's
// ValidateHeader, the active message's length must equal the header's payload_len, a null
// destination receives at most kMaxBufferedPayload bytes (a longer payload drops the link),
// Connection::kDiscard drops the payload (eager: ignored; rendezvous: never fetched).
#pragma once
#include <cstdint>
#include <ucp/api/ucp.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/connection.h"
#include "comm/frame.h"
#include "common/status.h"

namespace byteps {

class UcxContext;
class UcxLink;

constexpr unsigned kUcxAmId = 23;
constexpr uint32_t kUcxMagic = 0x55535042;  // "BPSU" little-endian
constexpr uint16_t kUcxVersion = 1;
constexpr size_t kMaxHeldFrames = 4096;
constexpr size_t kMaxHeldBytes = 64ull << 20;
// Frames up to this size go eager where the link's active messages travel over TCP
// (UcxLink::eager_max).
constexpr size_t kTcpEagerMax = 4 << 20;
// ... and up to this size over UCX's shared-memory transports (UcxLink::eager_max).
constexpr size_t kShmEagerMax = 128 << 10;

constexpr uint32_t kUcxWindowMagic = 0x57535042;  // "BPSW" little-endian
constexpr size_t kMaxWindows = 1 << 16;           // windows a link opens
constexpr size_t kMaxRemoteKeyBytes = 16 << 10;   // a packed remote key from a peer

enum class UcxKind : uint16_t { kConnect = 1, kAccept = 2, kFrame = 3, kClose = 4 };

#pragma pack(push, 1)
struct UcxAmHeader {
  uint32_t magic = kUcxMagic;
  uint16_t kind = 0;
  uint16_t version = kUcxVersion;
  uint64_t dst_link = 0;  // the receiver's id of the link (0 in CONNECT)
  uint64_t src_link = 0;  // the sender's id of the link
  FrameHeader frame;      // kFrame; unused otherwise
};
#pragma pack(pop)
static_assert(sizeof(UcxAmHeader) == 72, "UcxAmHeader must be 72 bytes");

class UcxLink : public std::enable_shared_from_this<UcxLink> {
 public:
  ~UcxLink();
  UcxLink(const UcxLink&) = delete;
  UcxLink& operator=(const UcxLink&) = delete;

  // Connection's operations (UcxConnection forwards them; comm/connection.h says what they do).
  // Frames that arrive before Start() wait for it.
  void Start();
  // item->done fires once UCX has sent the frame (the payload may be reused): on the progress
  // thread, or in Send itself when Send handed the frame to UCX (UcxContext::SubmitDirect) or
  // the link is closed (PeerLost).
  void Send(SendItem* item);
  bool Flush(double timeout_s);
  // Queued frames fail, the peer is told (CLOSE), the endpoint is closed; OnClosed is not
  // called afterwards. Non-blocking, safe from a handler callback.
  void Close();
  // Close() and wait (at most timeout_s) until the endpoint is closed and no receive into a
  // handler's buffer is in progress. From the progress thread it only closes (false).
  bool Join(double timeout_s);
  bool closed() const { return state_.load() == kClosed; }
  // From OnHeader, for the current frame (progress thread).
  void StreamPayload(Connection::PayloadSink sink, void* arg) {
    sink_ = sink;
    sink_arg_ = arg;
  }

  const std::string& peer_name() const { return peer_name_; }
  // The name the link's messages give the peer (read on the progress thread, so set there).
  void SetPeerName(const std::string& name);
  uint64_t id() const { return id_; }
  // The context, read under the link's mutex; null once the link is detached from it.
  UcxContext* Context() {
    std::lock_guard<std::mutex> lk(mu_);
    return ctx_;
  }
  // False when the endpoint runs in error mode NONE (no transport to the peer can report a
  // failed peer): a dead peer is then seen by its CLOSE message, an operation to it that fails,
  // or the job's heartbeats, but not while the link is idle.
  bool peer_failure_detection() const { return peer_mode_; }
  // Frames up to this many bytes are sent eager (UCP_AM_SEND_FLAG_EAGER) rather than as UCX's
  // rendezvous threshold says (UcxEagerMax, ucx_util.h; 0: UCX chooses). Over TCP up to
  // kTcpEagerMax: UCX's TCP transport has no zero-copy rendezvous (its fragments are copied
  // either way), so a rendezvous there only adds a round trip whose reply waits behind the
  // bulk data queued in the other direction; eager matches the TCP van. Over shared memory up
  // to kShmEagerMax: UCX's threshold there (auto) put the small partitions of small tensors on
  // rendezvous, a round trip more per partition; eager copies them through the shared segment
  // instead (both measured in docs/performance-notes.md, "rendezvous -> eager"). Set once the
  // endpoint exists (progress thread).
  size_t eager_max() const { return eager_max_; }
  // The lifeline socket this link owns (-1: none; UcxContext::Connect says what it does).
  int lifeline_fd() const { return lifeline_fd_; }
  // The endpoint's transports and lanes as UCX prints them (ucp_ep_print_info).
  std::string Describe();

  // One-way writes ("One-way writes" above). one_way(): this link offers them (the context
  // allows them and the link's active messages do not go over TCP), else one_way_why() says
  // why not; set with the endpoint (progress thread). OpenWindow unpacks a peer's window blob
  // on the endpoint (from any thread; runs on the progress thread): *id, from 1. Errors:
  // kInvalidArgument (no one-way writes, a malformed blob, too many windows), kPeerLost.
  bool one_way() const { return one_way_; }
  const std::string& one_way_why() const { return one_way_why_; }
  size_t one_way_min() const { return one_way_min_; }
  Status OpenWindow(const std::string& blob, uint32_t* id);

  // A frame UCX completed during SubmitDirect: its `done` runs once the worker is let go of.
  struct SentFrame {
    void (*done)(void*, const Status&) = nullptr;
    void* arg = nullptr;
    Status status;
    SendItem* heap_item = nullptr;
    void Finish();
  };
  // While one exists on a thread, CompleteSend there collects into `out` instead of calling.
  class DeferDone {
   public:
    explicit DeferDone(std::vector<SentFrame>* out);
    ~DeferDone();
    DeferDone(const DeferDone&) = delete;
    DeferDone& operator=(const DeferDone&) = delete;

   private:
    std::vector<SentFrame>* prev_;
  };

  struct Stats {
    uint64_t frames_sent = 0, frames_received = 0, eager_received = 0, rndv_received = 0;
    uint64_t direct_sent = 0;  // frames the sending thread handed to UCX (SubmitDirect)
    uint64_t one_way_sent = 0;      // frames whose payload went one-way into a window
    uint64_t one_way_received = 0;  // frames that announced such a write
    uint64_t held_max = 0;  // most frames held at once (behind a rendezvous receive, or Start)
  };
  Stats stats() const;

 private:
  friend class UcxContext;
  enum State : int { kConnecting = 0, kOpen = 1, kClosed = 2 };
  struct SendCtx;
  struct Held {
    FrameHeader h;
    void* data = nullptr;  // UCX's descriptor (rendezvous, or eager data UCX lets persist)
    size_t len = 0;
    bool rndv = false;
    bool ucx_owned = false;  // released with ucp_am_data_release; else `copy` holds the bytes
    std::string copy;
  };

  UcxLink(UcxContext* ctx, uint64_t id, std::string peer_name, ConnectionHandler* handler);
  friend class UcxConnection;
  // The handle handlers are called with; null once it is gone (no handler call after that).
  void SetConnection(Connection* conn) { conn_.store(conn); }
  void ForgetConnection();
  // Progress thread.
  Status CreateEndpoint(const std::string& peer_address);
  void SubmitQueued();
  // `written`: the item's payload is already in the peer's window; send its header alone.
  void SubmitOne(UcxKind kind, SendItem* item, bool written = false);
  SendCtx* NewCtx(UcxKind kind, SendItem* item);
  // A frame that can never be sent fails with `why` (its `done`, deferred as CompleteSend's).
  void FailFrame(SendItem* item, const Status& why);
  // ucx_link_window.cc: whether the item goes through a window; its write, fence and header.
  bool WritesOneWay(const SendItem* item) const;
  void SendWritten(SendItem* item);
  void DestroyWindows();
  // Sets one_way_, one_way_why_, one_way_min_ from the endpoint's description.
  void ChooseOneWay(const std::string& ep_info);
  // `why` (optional) names the cause of a failed send instead of UCX's status; the frame fails
  // with PeerLost, or with why's code where `keep_code`.
  void CompleteSend(SendCtx* c, ucs_status_t status, const Status* why = nullptr,
                    bool keep_code = false);
  ucs_status_t OnAm(const FrameHeader& h, void* data, size_t len, bool rndv, bool persistent);
  ucs_status_t Hold(const FrameHeader& h, void* data, size_t len, bool rndv, bool persistent);
  ucs_status_t Process(const FrameHeader& h, void* data, size_t len, bool rndv, bool ucx_owned,
                       bool in_callback);
  void Deliver(const FrameHeader& h, void* dest, char* src, size_t len);
  void Release(void* data, bool ucx_owned);
  void DrainHeld();
  void OnRecvDone(ucs_status_t status);
  void OnAccepted(uint64_t remote_id);
  // The link failed (peer error, protocol violation, peer's CLOSE): fail queued frames, tell the
  // handler (or a waiting Connect), close the endpoint (telling the peer if `tell_peer`).
  void Fail(const Status& why, bool tell_peer, bool force);
  void CloseEndpoint(bool tell_peer, bool force);
  void MaybeRetire();
  void ReleaseHeld();  // gives held descriptors back to UCX
  void Unlink(SendCtx* c);
  // Before the worker is destroyed (Shutdown): releases every UCX request still in progress
  // (their frames fail with PeerLost) and every held descriptor.
  void Abandon();
  // The sends in flight (failed naming `why`, else UCX's status) and the endpoint's close,
  // only: for a peer gone that UCX cannot report.
  void AbandonSends(const Status* why);
  void Detach();       // the context is gone (after Shutdown) or done with it (retired)
  bool WaitOpen(double timeout_s, Status* why);
  static void SendDoneCb(void* request, ucs_status_t status, void* user_data);
  static void RecvDoneCb(void* request, ucs_status_t status, size_t length, void* user_data);
  static void EpClosedCb(void* request, ucs_status_t status, void* user_data);
  static void EpErrorCb(void* arg, ucp_ep_h ep, ucs_status_t status);

  UcxContext* ctx_;
  const uint64_t id_;
  uint64_t remote_id_ = 0;
  std::string peer_name_;
  ConnectionHandler* handler_;
  std::atomic<Connection*> conn_{nullptr};
  std::atomic<int> state_{kConnecting};

  std::mutex mu_;  // the send list, in_flight_, local_close_, close_status_, retired_
  std::condition_variable cv_;
  SendItem* head_ = nullptr;
  SendItem* tail_ = nullptr;
  bool queued_ = false;    // on the context's ready list
  size_t in_flight_ = 0;   // caller frames queued or submitted and not completed
  bool local_close_ = false;
  bool retired_ = false;
  Status close_status_;

  int lifeline_fd_ = -1;  // set before the link is shared; closed by the destructor
  // Progress thread only.
  bool lifeline_watched_ = false;
  ucp_ep_h ep_ = nullptr;
  bool peer_mode_ = true;
  size_t eager_max_ = 0;
  bool one_way_ = false;
  std::string one_way_why_ = "no endpoint yet";
  size_t one_way_min_ = 0;
  struct Window {
    uint64_t addr = 0, len = 0;
    ucp_rkey_h rkey = nullptr;
  };
  std::vector<Window> windows_;  // id - 1
  // The remote keys unpacked, by their packed bytes: windows into one slab of the peer
  // (UcxContext::AllocateShared) share one, so its memory is mapped here once.
  std::map<std::string, ucp_rkey_h> rkeys_;
  bool ep_closing_ = false;
  size_t pending_ops_ = 0;  // UCX requests that reference this link
  std::vector<SendCtx*> free_ctx_;
  std::vector<std::unique_ptr<SendCtx>> all_ctx_;
  SendCtx* sending_ = nullptr;  // sends UCX has not completed
  void* rx_request_ = nullptr;
  void* close_request_ = nullptr;
  bool rx_busy_ = false;
  FrameHeader rx_frame_;
  void* rx_dest_ = nullptr;
  std::deque<Held> held_;
  size_t held_bytes_ = 0;
  std::string scratch_;
  bool started_ = false;
  Connection::PayloadSink sink_ = nullptr;  // set by OnHeader for the current frame
  void* sink_arg_ = nullptr;
  std::string bounce_;  // a streamed rendezvous payload lands here, then goes through sink_
  bool notify_pending_ = false;  // OnClosed waits for the rendezvous receive in progress
  Status notify_status_;

  std::atomic<uint64_t> frames_sent_{0}, frames_received_{0}, eager_received_{0},
      rndv_received_{0}, held_max_{0}, direct_sent_{0}, one_way_sent_{0}, one_way_received_{0};
};

}  // namespace byteps
