// Accepts the connections of a listening socket (scheduler, server) and authenticates each one
// (comm/auth.h) before handing it to `on_accepted`. One thread drives every handshake in flight
// as a state machine over a non-blocking socket, so strangers cost the process no threads: a
// silent or trickling peer holds its socket and ~200 bytes until its deadline, never a slot a
// job member needs.
//
// Bounds: at most kMaxPending handshakes are in flight. A new connection beyond that evicts the
// oldest pending one instead of being refused: a job member's handshake completes within a
// round trip, so the connections that stay pending long enough to be evicted are the ones that
// stall, and a flood cannot lock a worker out of the accept path. When the process runs out of
// descriptors, the oldest pending handshake is evicted for the connection waiting in the listen
// backlog. Rejected peers are logged at most once per second plus the count of the others.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/auth.h"
#include "common/logging.h"

namespace byteps {

class Acceptor {
 public:
  static constexpr size_t kMaxPending = 256;

  // `owner` names the process in log lines ("scheduler", "server 0"). `on_accepted` runs on the
  // acceptor's thread with a blocking, authenticated socket that it owns from then on.
  Acceptor(int listen_fd, std::string owner, std::function<void(int fd)> on_accepted,
           double handshake_timeout_s);
  ~Acceptor();
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  void Start();
  // Stops accepting, drops the handshakes in progress and joins the thread. Idempotent.
  void Stop();
  void set_owner(std::string owner);
  // Connections dropped so far (failed or timed-out handshake, or evicted).
  uint64_t rejected() const { return rejected_.load(); }
  // Connections handed to `on_accepted` so far.
  uint64_t accepted() const { return accepted_.load(); }

 private:
  using Clock = std::chrono::steady_clock;
  struct Pending {
    int fd;
    std::string peer;
    Clock::time_point deadline;
    AcceptingHandshake handshake;
  };
  void Loop();
  // Accepts what the listen backlog holds (bounded per call). False: out of descriptors.
  bool AcceptBurst();
  void Drop(std::unique_ptr<Pending> p, const std::string& why);
  void Reject(const std::string& peer, const std::string& why);

  int listen_fd_;
  std::string owner_;
  std::function<void(int)> on_accepted_;
  Clock::duration timeout_;
  std::thread thread_;
  std::mutex mu_;  // owner_
  std::atomic<bool> stopping_{false};
  std::deque<std::unique_ptr<Pending>> pending_;  // oldest first (acceptor thread only)
  std::atomic<uint64_t> rejected_{0}, accepted_{0};
  LogLimiter log_limit_;
};

}  // namespace byteps
