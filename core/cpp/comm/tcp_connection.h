// The TCP van: one Connection per peer pair, with a sender thread (scatter-gather writes
// straight from the caller's buffer) and a receiver thread (reads each header, asks the handler
// where the payload goes, and receives it straight there). No allocation per message in steady
// state: data SendItems are owned by the caller and reused; the receive scratch buffer only grows.
#pragma once
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

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
  // Called from the sender thread once the frame is fully written (OK) or can never be (error).
  void (*done)(void* arg, const Status& st) = nullptr;
  void* arg = nullptr;
  bool heap = false;
  SendItem* next = nullptr;
};

class ConnectionHandler {
 public:
  virtual ~ConnectionHandler() = default;
  // A valid header arrived. Set *dest to a buffer of at least h.payload_len bytes to receive the
  // payload in place, to Connection::kDiscard to read past it without storing it (bounded
  // chunks, nothing allocated by the peer's length), or leave it null to receive it into the
  // connection's scratch buffer, which holds at most kMaxControlPayload bytes (a longer payload
  // then drops the connection).
  // A non-OK status drops the connection (protocol violation by the peer).
  virtual Status OnHeader(Connection* c, const FrameHeader& h, void** dest) = 0;
  // The payload (if any) has been received at `payload`.
  virtual void OnFrame(Connection* c, const FrameHeader& h, void* payload) = 0;
  // The connection broke (not called after Close()).
  virtual void OnClosed(Connection* c, const Status& why) = 0;
};

class Connection {
 public:
  Connection(int fd, std::string peer_name, ConnectionHandler* handler);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  void Start();
  // Queues a frame; item->done fires when it is written. On a closed connection, fires at once
  // with the error.
  void Send(SendItem* item);
  // Sends a control message (payload copied).
  void SendControl(MsgType type, std::string payload, uint64_t key = 0, uint32_t sender = 0,
                   uint64_t aux = 0);
  // Waits until every queued frame has been written (or the connection failed/timeout).
  bool Flush(double timeout_s);
  // Stops both threads (non-blocking; safe from a handler callback). Queued items fail.
  void Close();
  // Close() then join the threads. Must not be called from this connection's own threads.
  void Join();

  // Receives a large payload chunk by chunk into a small, cache-resident bounce buffer and
  // hands each chunk (whole elements: every chunk but the last is kBounceBytes) to `sink`,
  // which writes it to its place: dst = the frame's destination + the chunk's offset. The
  // chunk may be modified in place (a worker divides it when averaging).
  using PayloadSink = void (*)(void* arg, char* dst, char* chunk, size_t len);
  // Called by the handler from OnHeader for the current frame: receive its payload through
  // `sink` instead of straight into the destination. Worth it from kStreamMinPayload bytes.
  void StreamPayload(PayloadSink sink, void* arg) {
    sink_ = sink;
    sink_arg_ = arg;
  }
  static constexpr size_t kBounceBytes = 128 << 10;  // half of a 256 KiB L2
  // OnHeader's *dest for a payload to skip (e.g. a refused push whose sender gets an error).
  static void* const kDiscard;
  static constexpr size_t kStreamMinPayload = 256 << 10;

  bool closed() const { return closed_.load(); }
  const std::string& peer_name() const { return peer_name_; }
  void set_peer_name(const std::string& n) { peer_name_ = n; }
  int tag = -1;  // owner-defined (peer rank)
  int fd() const { return fd_; }

 private:
  void SendLoop();
  void RecvLoop();
  Status ReceiveThroughSink(char* dest, size_t n);
  Status Discard(size_t n);
  void FailQueued(const Status& st);

  int fd_;
  std::string peer_name_;
  ConnectionHandler* handler_;
  std::thread send_thread_, recv_thread_;
  std::mutex mu_;
  std::condition_variable cv_, drained_cv_;
  SendItem* head_ = nullptr;
  SendItem* tail_ = nullptr;
  bool sending_ = false;
  std::atomic<bool> closed_{false};
  std::atomic<bool> closing_{false};
  std::string scratch_;
  std::string bounce_;  // StreamPayload's buffer (receive thread only)
  PayloadSink sink_ = nullptr;  // set by OnHeader for the current frame (receive thread)
  void* sink_arg_ = nullptr;
  Status send_error_;
};

}  // namespace byteps
