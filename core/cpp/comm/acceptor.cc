#include "acceptor.h"

#include <cstdint>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "comm/socket_util.h"

namespace byteps {
namespace {

void SetBlocking(int fd, bool blocking) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0) return;
  fcntl(fd, F_SETFL, blocking ? (flags & ~O_NONBLOCK) : (flags | O_NONBLOCK));
}

constexpr int kAcceptBurst = 64;  // connections taken from the backlog per loop turn

}  // namespace

Acceptor::Acceptor(int listen_fd, std::string owner, std::function<void(int fd)> on_accepted,
                   double handshake_timeout_s)
    : listen_fd_(listen_fd), owner_(std::move(owner)), on_accepted_(std::move(on_accepted)),
      timeout_(std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(handshake_timeout_s))) {}

Acceptor::~Acceptor() { Stop(); }

void Acceptor::Start() {
  SetBlocking(listen_fd_, false);  // AcceptBurst takes what the backlog holds, then returns
  thread_ = std::thread([this] { Loop(); });
}

void Acceptor::set_owner(std::string owner) {
  std::lock_guard<std::mutex> lk(mu_);
  owner_ = std::move(owner);
}

void Acceptor::Stop() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
}

void Acceptor::Loop() {
  std::vector<pollfd> fds;
  while (!stopping_) {
    // Deadlines first. Every deadline is accept time + the same timeout and pending_ is in
    // accept order, so the expired handshakes are at the front and the front's deadline is
    // the next one.
    auto now = Clock::now();
    while (!pending_.empty() && now >= pending_.front()->deadline) {
      Drop(std::move(pending_.front()), "authentication handshake timed out");
      pending_.pop_front();
    }
    int wait_ms = 200;
    if (!pending_.empty()) {
      auto next = pending_.front()->deadline;
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count() + 1;
      wait_ms = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wait_ms, ms)));
    }
    fds.clear();
    fds.push_back(pollfd{listen_fd_, POLLIN, 0});
    for (auto& p : pending_) fds.push_back(pollfd{p->fd, p->handshake.events(), 0});
    int r = poll(fds.data(), fds.size(), wait_ms);
    if (r < 0 && errno != EINTR) {
      BPS_LOG(ERROR) << "acceptor: poll failed: " << strerror(errno);
      usleep(100000);
      continue;
    }
    if (r <= 0) continue;
    // Advance the handshakes whose sockets are ready (fds[i + 1] belongs to pending_[i]).
    size_t n = pending_.size();
    for (size_t i = 0; i < n; ++i) {
      if (fds[i + 1].revents == 0) continue;
      std::string why;
      auto step = pending_[i]->handshake.Advance(pending_[i]->fd, &why);
      if (step == AcceptingHandshake::Step::kContinue) continue;
      std::unique_ptr<Pending> p = std::move(pending_[i]);
      if (step == AcceptingHandshake::Step::kFailed) {
        Drop(std::move(p), why);
        continue;
      }
      SetBlocking(p->fd, true);
      accepted_++;
      on_accepted_(p->fd);  // the callback owns the socket from here
    }
    pending_.erase(std::remove(pending_.begin(), pending_.end(), nullptr), pending_.end());
    if ((fds[0].revents & POLLIN) && !AcceptBurst()) usleep(50000);  // out of descriptors
  }
  for (auto& p : pending_) close(p->fd);
  pending_.clear();
}

bool Acceptor::AcceptBurst() {
  for (int i = 0; i < kAcceptBurst && !stopping_; ++i) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if ((errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) &&
          !pending_.empty()) {
        // Out of descriptors or memory: the oldest pending handshake makes room.
        Drop(std::move(pending_.front()), "too many connections waiting for authentication");
        pending_.pop_front();
        continue;
      }
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;  // the backlog is empty
      // Out of descriptors with nothing to free (the job's own connections hold them): the
      // connection waits in the backlog; say so, and let the caller back off.
      Reject("a connection in the listen backlog", std::string("cannot accept: ") + strerror(errno));
      return false;
    }
    if (pending_.size() >= kMaxPending) {
      Drop(std::move(pending_.front()),
           "evicted: too many connections waiting for authentication");
      pending_.pop_front();
    }
    TuneDataSocket(fd);
    auto p = std::make_unique<Pending>();
    p->fd = fd;
    p->peer = PeerAddress(fd);
    p->deadline = Clock::now() + timeout_;
    // The peer speaks first; a hello that is already here is read at once.
    std::string why;
    auto step = p->handshake.Advance(fd, &why);
    if (step == AcceptingHandshake::Step::kFailed) {
      Drop(std::move(p), why);
    } else if (step == AcceptingHandshake::Step::kDone) {
      SetBlocking(fd, true);
      accepted_++;
      on_accepted_(fd);
    } else {
      pending_.push_back(std::move(p));
    }
  }
  return true;
}

void Acceptor::Drop(std::unique_ptr<Pending> p, const std::string& why) {
  if (!p) return;
  close(p->fd);
  Reject(p->peer, why);
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
