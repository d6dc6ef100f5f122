// The TCP van's connection (comm/tcp/tcp_van.h makes them): one per peer pair, with a sender thread
// (scatter-gather writes straight from the caller's buffer) and a receiver thread (reads each
// header, asks the handler where the payload goes, and receives it straight there). No
// allocation per message in steady state: data SendItems are owned by the caller and reused;
// the receive scratch buffer only grows.
#pragma once
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "comm/connection.h"

namespace byteps {

class TcpConnection final : public Connection {
 public:
  // Takes ownership of `fd`, a connected (and authenticated) blocking socket.
  TcpConnection(int fd, std::string peer_name, ConnectionHandler* handler);
  ~TcpConnection() override;

  void Start() override;
  void Send(SendItem* item) override;
  bool Flush(double timeout_s) override;
  void Close() override;
  void Join() override;
  bool closed() const override { return closed_.load(); }
  std::string LocalAddress() const override;
  void StreamPayload(PayloadSink sink, void* arg) override {
    sink_ = sink;
    sink_arg_ = arg;
  }

 private:
  void SendLoop();
  void RecvLoop();
  Status ReceiveThroughSink(char* dest, size_t n);
  Status Discard(size_t n);
  void FailQueued(const Status& st);

  int fd_;
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
