#include "socket_util.h"

#include "comm/auth.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>

namespace byteps {
namespace {
std::string Errno(const char* what) { return std::string(what) + ": " + strerror(errno); }

std::atomic<int> g_notsent_lowat{64 << 10};  // BYTEPS_TCP_NOTSENT_LOWAT's default

bool Resolve(const std::string& host, sockaddr_in* addr) {
  memset(addr, 0, sizeof(*addr));
  addr->sin_family = AF_INET;
  if (host.empty() || host == "0.0.0.0") {
    addr->sin_addr.s_addr = htonl(INADDR_ANY);
    return true;
  }
  if (inet_pton(AF_INET, host.c_str(), &addr->sin_addr) == 1) return true;
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res) return false;
  addr->sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return true;
}
}  // namespace

Status ConnectWithRetry(const std::string& host, int port, double timeout_s, int* fd_out) {
  sockaddr_in addr;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::string last;
  int delay_ms = 10;
  bool resolved = false;
  while (true) {
    // A name that does not resolve yet is retried like a refused connection: a cluster's DNS
    // (a Kubernetes Service, a Slurm node) may publish the peer's name after the peer starts.
    if (!resolved && !(resolved = Resolve(host, &addr))) {
      if (std::chrono::steady_clock::now() >= deadline)
        return Status::Config("cannot resolve host '" + host + "' (retried for " +
                              std::to_string(static_cast<int>(timeout_s)) + " s)");
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      delay_ms = std::min(delay_ms * 2, 200);
      continue;
    }
    addr.sin_port = htons(static_cast<uint16_t>(port));
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Status::Internal(Errno("socket"));
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      TuneDataSocket(fd);
      double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
      Status st = AuthenticateToPeer(fd, host + ":" + std::to_string(port), std::max(left, 5.0));
      if (!st.ok()) {
        close(fd);
        return st;
      }
      *fd_out = fd;
      return Status::OK();
    }
    last = strerror(errno);
    close(fd);
    if (std::chrono::steady_clock::now() >= deadline)
      return Status::Timeout("could not connect to " + host + ":" + std::to_string(port) +
                             " within " + std::to_string(static_cast<int>(timeout_s)) +
                             " s (last error: " + last + ")");
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    delay_ms = std::min(delay_ms * 2, 200);
  }
}

Status Listen(const std::string& host, int port, int* fd_out, int* port_out) {
  sockaddr_in addr;
  if (!Resolve(host, &addr)) return Status::Config("cannot resolve host '" + host + "'");
  addr.sin_port = htons(static_cast<uint16_t>(port));
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Internal(Errno("socket"));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    Status st = Status::Config(Errno(("cannot bind " + host + ":" + std::to_string(port)).c_str()));
    close(fd);
    return st;
  }
  if (listen(fd, 1024) != 0) {
    close(fd);
    return Status::Internal(Errno("listen"));
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  *fd_out = fd;
  *port_out = ntohs(addr.sin_port);
  return Status::OK();
}

std::string LocalAddressOf(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "";
  char buf[INET_ADDRSTRLEN];
  return inet_ntop(AF_INET, &addr.sin_addr, buf, sizeof(buf)) ? buf : "";
}

std::string InterfaceAddress(const std::string& ifname) {
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return "";
  std::string out;
  for (ifaddrs* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || ifname != i->ifa_name) continue;
    char buf[INET_ADDRSTRLEN];
    if (inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf,
                  sizeof(buf)))
      out = buf;
    break;
  }
  freeifaddrs(ifs);
  return out;
}

std::vector<std::pair<std::string, std::string>> InterfaceAddresses() {
  std::vector<std::pair<std::string, std::string>> out;
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return out;
  for (ifaddrs* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    char buf[INET_ADDRSTRLEN];
    if (inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf,
                  sizeof(buf)))
      out.emplace_back(i->ifa_name, buf);
  }
  freeifaddrs(ifs);
  return out;
}

std::string RouteAddressTo(const std::string& host, int port, std::string* why) {
  sockaddr_in peer{};
  peer.sin_family = AF_INET;
  peer.sin_port = htons(static_cast<uint16_t>(port > 0 ? port : 9));
  if (inet_pton(AF_INET, host.c_str(), &peer.sin_addr) != 1) {
    *why = "'" + host + "' is not an IPv4 address";
    return "";
  }
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *why = std::string("socket: ") + strerror(errno);
    return "";
  }
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&peer), sizeof(peer)) != 0)
    *why = "no route to " + host + ": " + strerror(errno);
  else
    out = LocalAddressOf(fd);
  close(fd);
  return out;
}

void TuneDataSocket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  int buf = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
  // Keep at most BYTEPS_TCP_NOTSENT_LOWAT not-yet-sent bytes in the kernel: the rest waits in
  // our own priority-ordered queues, so a high-priority partition is not stuck behind megabytes
  // the kernel already took (the send buffer above only has to cover the bytes in flight).
  int lowat = g_notsent_lowat.load(std::memory_order_relaxed);
  if (lowat > 0) setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &lowat, sizeof(lowat));
}

void SetTcpNotSentLowat(int64_t bytes) {
  g_notsent_lowat.store(static_cast<int>(std::min<int64_t>(bytes, INT32_MAX)),
                        std::memory_order_relaxed);
}

Status ReadFull(int fd, void* buf, size_t n) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    ssize_t r = recv(fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
    } else if (r == 0) {
      return Status::PeerLost("connection closed by peer");
    } else if (errno != EINTR) {
      return Status::PeerLost(Errno("recv"));
    }
  }
  return Status::OK();
}

Status WriteFull(int fd, const void* buf, size_t n) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t r = send(fd, p, n, MSG_NOSIGNAL);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
    } else if (r < 0 && errno != EINTR) {
      return Status::PeerLost(Errno("send"));
    }
  }
  return Status::OK();
}

Status ReadFullBefore(int fd, void* buf, size_t n, std::chrono::steady_clock::time_point deadline,
                      const char* what) {
  using Clock = std::chrono::steady_clock;
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    int left_ms = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    if (left_ms <= 0) return Status::Timeout(std::string(what) + " timed out");
    pollfd pfd{fd, POLLIN, 0};
    int r = poll(&pfd, 1, left_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return Status::Timeout(std::string(what) + " timed out");
    ssize_t got = recv(fd, p, n, MSG_DONTWAIT);
    if (got == 0) return Status::PeerLost(std::string("connection closed during the ") + what);
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return Status::PeerLost(std::string(what) + ": " + strerror(errno));
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
  return Status::OK();
}

}  // namespace byteps
