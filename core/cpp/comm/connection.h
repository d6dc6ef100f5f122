// A link to one peer as its users see it (docs/architecture.md §6): frames go out from the
// caller's memory and come in straight into memory the receiver picks from each header. A van
// (comm/van.h) makes connections; TcpConnection (comm/tcp/tcp_connection.h) is the one it makes
// today. Errors are Status values: a broken peer is reported (OnClosed, a failed SendItem),
// never an abort. This layer knows nothing of what the frames mean: the message types, flags
// and reply codes are the PS layer's (ps/protocol.h), which checks them in
// ConnectionHandler::ValidateHeader.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "comm/frame.h"

namespace byteps {

class Connection;

// One frame to send. Data items are embedded in long-lived objects and reused; control items
// are heap-allocated by SendControl and deleted after sending.
struct SendItem {
  FrameHeader hdr;
  const void* payload = nullptr;
  size_t len = 0;
  std::string owned;  // payload storage for control messages
  // Called once the frame is fully written (OK) or can never be (error); on the connection's
  // sending thread, or in Send() itself: when the van handed the frame over from the calling
  // thread (the UCX van, comm/ucx/ucx_context.h), or the connection is already closed. A caller
  // must not hold a lock in Send that `done` takes.
  void (*done)(void* arg, const Status& st) = nullptr;
  void* arg = nullptr;
  bool heap = false;
  // A window of the peer (Connection::OpenWindow, not 0): the van writes the payload straight
  // into it (one-way, no rendezvous) and then sends the header alone, with payload_len 0 and
  // `written` = len. 0: the payload travels in the frame.
  uint32_t window = 0;
  // Where in the window the payload goes (bytes from its start; window_offset + len must not
  // pass its end).
  uint64_t window_offset = 0;
  SendItem* next = nullptr;
};

// What a connection calls on its receiving thread, in this order for each frame:
// ValidateHeader, OnHeader, (the payload is received), OnFrame.
class ConnectionHandler {
 public:
  virtual ~ConnectionHandler() = default;
  // A header passed the van's own checks (magic, absolute length bound: ValidateFrame). The
  // protocol checks its fields (type, dtype, length limits per type) before anything else looks
  // at them; a non-OK status drops the connection.
  virtual Status ValidateHeader(const FrameHeader& h) = 0;
  // A valid header arrived. Set *dest to a buffer of at least h.payload_len bytes to receive the
  // payload in place, to Connection::kDiscard to read past it without storing it (bounded
  // chunks, nothing allocated by the peer's length), or leave it null to receive it into the
  // connection's scratch buffer, which holds at most kMaxBufferedPayload bytes (a longer payload
  // then drops the connection).
  // A non-OK status drops the connection (protocol violation by the peer).
  virtual Status OnHeader(Connection* c, const FrameHeader& h, void** dest) = 0;
  // The payload (if any) has been received at `payload` (null for a discarded one).
  virtual void OnFrame(Connection* c, const FrameHeader& h, void* payload) = 0;
  // The connection broke (not called after Close()).
  virtual void OnClosed(Connection* c, const Status& why) = 0;
};

class Connection {
 public:
  explicit Connection(std::string peer_name) : peer_name_(std::move(peer_name)) {}
  virtual ~Connection() = default;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Starts sending and receiving (the handler is called from then on).
  virtual void Start() = 0;
  // Queues a frame; item->done fires when it is written. On a closed connection, fires at once
  // with the error (kPeerLost).
  virtual void Send(SendItem* item) = 0;
  // Sends a small message whose payload is copied: `type` is a protocol's message type enum
  // (ps/protocol.h: MsgType).
  template <typename Type, typename = std::enable_if_t<std::is_enum_v<Type>>>
  void SendControl(Type type, std::string payload, uint64_t key = 0, uint32_t sender = 0,
                   uint64_t aux = 0) {
    SendCopy(static_cast<uint16_t>(type), std::move(payload), key, sender, aux);
  }
  // Waits until every queued frame has been written; false if the connection failed or
  // timeout_s passed first.
  virtual bool Flush(double timeout_s) = 0;
  // Stops sending and receiving (non-blocking; safe from a handler callback). Queued items
  // fail.
  virtual void Close() = 0;
  // Close(), then waits for the connection's threads. Must not be called from them.
  virtual void Join() = 0;
  virtual bool closed() const = 0;
  // This host's address on the route to the peer (what the peer can reach it at).
  virtual std::string LocalAddress() const = 0;

  // One-way writes, for a van with remote memory access (the UCX van over shared memory or
  // RDMA; docs/rdma.md). The receiver exports [addr, addr+len) of memory it registered with the
  // van (Van::RegisterMemory) to the peer of this connection: *blob (a few hundred bytes: the
  // address and the remote key) is what it sends the peer in a message of its own. The peer
  // opens it once (OpenWindow: *id, never 0) and from then on sends frames whose payload the van
  // writes straight into that memory (SendItem::window); each such frame arrives after its
  // bytes are in place, with payload_len 0 and FrameHeader::written = the bytes written. The
  // protocol decides what a window is for and checks `written` (the peer may lie in it, never
  // write outside the window). Errors (kInvalidArgument): a van or a link without one-way writes
  // (the TCP van; a UCX link whose remote memory access would go over TCP, where frames are
  // faster), memory not registered, a malformed blob. Windows live as long as the connection.
  virtual Status ExportWindow(void* addr, size_t len, std::string* blob) {
    (void)addr;
    (void)len;
    (void)blob;
    return Status::InvalidArgument("the connection to " + peer_name_ +
                                   " has no one-way writes");
  }
  virtual Status OpenWindow(const std::string& blob, uint32_t* id) {
    (void)blob;
    (void)id;
    return Status::InvalidArgument("the connection to " + peer_name_ +
                                   " has no one-way writes");
  }

  // Receives a large payload chunk by chunk into a small, cache-resident bounce buffer and
  // hands each chunk (whole elements: every chunk but the last is kBounceBytes) to `sink`,
  // which writes it to its place: dst = the frame's destination + the chunk's offset. The
  // chunk may be modified in place (a worker divides it when averaging).
  using PayloadSink = void (*)(void* arg, char* dst, char* chunk, size_t len);
  // Called by the handler from OnHeader for the current frame: receive its payload through
  // `sink` instead of straight into the destination. Worth it from kStreamMinPayload bytes.
  virtual void StreamPayload(PayloadSink sink, void* arg) = 0;
  static constexpr size_t kBounceBytes = 128 << 10;  // half of a 256 KiB L2
  static constexpr size_t kStreamMinPayload = 256 << 10;
  // OnHeader's *dest for a payload to skip (e.g. a refused push whose sender gets an error).
  static void* const kDiscard;

  const std::string& peer_name() const { return peer_name_; }
  // Renames the peer (once it said who it is); a van whose link names the peer in its own
  // messages renames it there too.
  virtual void set_peer_name(const std::string& n) { peer_name_ = n; }
  int tag = -1;  // owner-defined (peer rank)

 protected:
  // Queues a heap SendItem holding a copy of `payload` (SendControl).
  void SendCopy(uint16_t type, std::string payload, uint64_t key, uint32_t sender, uint64_t aux);

  std::string peer_name_;
};

}  // namespace byteps
