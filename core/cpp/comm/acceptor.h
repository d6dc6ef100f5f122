// Accepts the connections of a listening socket (scheduler, server) and authenticates each one
// (comm/auth.h) on its own short-lived thread, so a silent or hostile peer never delays the next
// one; every authenticated socket goes to `on_accepted`. At most kMaxPending handshakes run at
// once (further connections are closed at once); rejected peers are logged, at most one line per
// second plus the count of the others, so a flood cannot flood the log.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "common/logging.h"

namespace byteps {

class Acceptor {
 public:
  static constexpr int kMaxPending = 256;

  // `owner` names the process in log lines ("scheduler", "server 0").
  Acceptor(int listen_fd, std::string owner, std::function<void(int fd)> on_accepted,
           double handshake_timeout_s);
  ~Acceptor();
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  void Start();
  // Stops accepting, aborts the handshakes in progress and waits for their threads. Idempotent.
  void Stop();
  void set_owner(std::string owner);
  // Connections dropped so far (failed handshake or too many pending).
  uint64_t rejected() const { return rejected_.load(); }

 private:
  void Loop();
  void Handshake(int fd);
  void Reject(const std::string& peer, const std::string& why);

  int listen_fd_;
  std::string owner_;
  std::function<void(int)> on_accepted_;
  double timeout_s_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::set<int> pending_;  // sockets whose handshake runs now
  int active_ = 0;         // handshake threads not yet finished
  bool stopping_ = false;
  std::atomic<uint64_t> rejected_{0};
  LogLimiter log_limit_;
};

}  // namespace byteps
