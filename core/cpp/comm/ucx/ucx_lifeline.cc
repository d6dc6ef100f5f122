// Lifelines (ucx_context.h, Connect): a connected TCP socket to the peer's process that each
// link of the UCX van keeps for its whole life. Nothing is ever sent on it; its end of file (or
// reset) is the kernel saying the peer's process is gone, which UCX's shared-memory transports
// cannot report. The sockets are watched by an epoll set of their own, itself in the progress
// thread's sleeping set (which wakes the thread when a lifeline reports), and polled (without
// blocking) every 64 progress rounds while busy; not before each sleep: that epoll_wait was a
// quarter of a busy progress thread's system calls.
#include <cstdint>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "comm/ucx/ucx_context.h"
#include "comm/ucx/ucx_link.h"

namespace byteps {

void UcxContext::WatchLifeline(UcxLink* link) {
  if (link->lifeline_fd_ < 0 || link->lifeline_watched_) return;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.u64 = link->id_;
  if (epoll_ctl(lifeline_epoll_, EPOLL_CTL_ADD, link->lifeline_fd_, &ev) != 0) {
    BPS_LOG(WARNING) << "UCX " << name_ << ": cannot watch the lifeline of the link to "
                     << link->peer_name_ << " (" << strerror(errno)
                     << "): a killed peer is then noticed by the job's heartbeats only";
    return;
  }
  link->lifeline_watched_ = true;
  ++lifelines_;
}

int UcxContext::CheckLifelines(bool poll) {
  using Clock = std::chrono::steady_clock;
  if (poll && lifelines_ > 0) {
    epoll_event evs[16];
    const int n = epoll_wait(lifeline_epoll_, evs, 16, 0);
    for (int i = 0; i < n; ++i) {
      auto it = links_.find(evs[i].data.u64);
      if (it == links_.end()) continue;
      UcxLink* link = it->second.get();
      char byte;
      const ssize_t got = recv(link->lifeline_fd_, &byte, 1, MSG_DONTWAIT);
      if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
      // End of file, an error, or bytes nobody may send: the peer is gone (or misbehaves).
      epoll_ctl(lifeline_epoll_, EPOLL_CTL_DEL, link->lifeline_fd_, nullptr);
      link->lifeline_watched_ = false;
      --lifelines_;
      if (got > 0) {
        link->Fail(Status::PeerLost("UCX peer " + link->peer_name_ +
                                    " wrote on its lifeline socket (not a byteps peer)"),
                   /*tell_peer=*/true, /*force=*/true);
        continue;
      }
      const auto due = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(kLifelineGraceS));
      lost_.emplace_back(link->id_, due);
    }
  }
  if (lost_.empty()) return -1;
  const auto now = Clock::now();
  int next_ms = -1;
  std::vector<std::pair<uint64_t, Clock::time_point>> later;
  for (const auto& [id, due] : lost_) {
    if (due > now) {
      later.emplace_back(id, due);
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(due - now).count();
      next_ms = std::max<int>(1, next_ms < 0 ? static_cast<int>(ms)
                                             : std::min<int>(next_ms, static_cast<int>(ms)));
      continue;
    }
    auto it = links_.find(id);
    if (it == links_.end()) continue;  // closed meanwhile (the peer's CLOSE arrived first)
    it->second->Fail(Status::PeerLost("UCX peer " + it->second->peer_name_ +
                                      " is gone: its process closed the link's lifeline socket "
                                      "(it exited or was killed)"),
                     /*tell_peer=*/false, /*force=*/true);
  }
  lost_.swap(later);
  return next_ms;
}

}  // namespace byteps
