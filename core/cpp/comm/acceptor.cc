#include "acceptor.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/auth.h"
#include "comm/socket_util.h"
#include "common/logging.h"

namespace byteps {

Acceptor::Acceptor(int listen_fd, std::string owner, std::function<void(int fd)> on_accepted,
                   double handshake_timeout_s)
    : listen_fd_(listen_fd), owner_(std::move(owner)), on_accepted_(std::move(on_accepted)),
      timeout_s_(handshake_timeout_s) {}

Acceptor::~Acceptor() { Stop(); }

void Acceptor::Start() { thread_ = std::thread([this] { Loop(); }); }

void Acceptor::set_owner(std::string owner) {
  std::lock_guard<std::mutex> lk(mu_);
  owner_ = std::move(owner);
}

void Acceptor::Stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
    for (int fd : pending_) shutdown(fd, SHUT_RDWR);  // their reads fail at once
  }
  if (thread_.joinable()) thread_.join();
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return active_ == 0; });
}

void Acceptor::Loop() {
  while (true) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stopping_) return;
    }
    pollfd pfd{listen_fd_, POLLIN, 0};
    if (poll(&pfd, 1, 200) <= 0) continue;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    bool full;
    {
      std::lock_guard<std::mutex> lk(mu_);
      full = stopping_ || active_ >= kMaxPending;
      if (!full) {
        pending_.insert(fd);
        active_++;
      }
    }
    if (full) {
      Reject(PeerAddress(fd), "too many connections waiting for authentication");
      close(fd);
      continue;
    }
    TuneDataSocket(fd);
    std::thread([this, fd] { Handshake(fd); }).detach();
  }
}

void Acceptor::Handshake(int fd) {
  Status st = AuthenticatePeer(fd, timeout_s_);
  if (!st.ok()) Reject(PeerAddress(fd), st.message());
  bool hand_over;
  {
    std::lock_guard<std::mutex> lk(mu_);
    pending_.erase(fd);  // before the fd can be closed and its number reused
    hand_over = st.ok() && !stopping_;
  }
  if (hand_over) on_accepted_(fd);  // the callback owns fd from here
  else close(fd);
  std::lock_guard<std::mutex> lk(mu_);
  active_--;
  cv_.notify_all();  // nothing of `this` is touched after the lock is released
}

void Acceptor::Reject(const std::string& peer, const std::string& why) {
  rejected_++;
  std::string more;
  if (!log_limit_.Allow(&more)) return;
  std::string owner;
  {
    std::lock_guard<std::mutex> lk(mu_);
    owner = owner_;
  }
  BPS_LOG(WARNING) << owner << ": dropped the connection from " << peer << ": " << why << more;
}

}  // namespace byteps
