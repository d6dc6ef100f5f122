#include "pipeline/local_channel.h"

#include <cstdint>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>

namespace byteps {
namespace {
socklen_t FillAddr(const std::string& name, sockaddr_un* addr) {
  memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  size_t n = std::min(name.size(), sizeof(addr->sun_path) - 2);
  addr->sun_path[0] = '\0';  // abstract namespace
  memcpy(addr->sun_path + 1, name.data(), n);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}
}  // namespace

LocalChannel::~LocalChannel() { Close(); }

std::string LocalChannel::Address(int local_rank) const {
  return "byteps_" + job_ + "_" + std::to_string(worker_id_) + "_" + std::to_string(local_rank);
}

Status LocalChannel::Open(const std::string& job, int worker_id, int local_rank) {
  job_ = job;
  worker_id_ = worker_id;
  fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return Status::Internal(std::string("socket(AF_UNIX): ") + strerror(errno));
  sockaddr_un addr;
  socklen_t len = FillAddr(Address(local_rank), &addr);
  if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    Status st = Status::Config("cannot bind the local channel '" + Address(local_rank) +
                               "': " + strerror(errno) +
                               " (is BYTEPS_LOCAL_RANK used twice on this machine?)");
    Close();
    return st;
  }
  int buf = 4 << 20;
  setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
  setsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
  timeval tv{5, 0};  // a full peer buffer must not block a sender forever
  setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  return Status::OK();
}

Status LocalChannel::Send(int local_rank, const LocalSignal& sig) {
  if (fd_ < 0) return Status::Shutdown("local channel closed");
  sockaddr_un addr;
  socklen_t len = FillAddr(Address(local_rank), &addr);
  size_t n = offsetof(LocalSignal, text) + strnlen(sig.text, sizeof(sig.text) - 1) + 1;
  while (true) {
    ssize_t r = sendto(fd_, &sig, n, 0, reinterpret_cast<sockaddr*>(&addr), len);
    if (r >= 0) return Status::OK();
    if (errno == EINTR) continue;
    if (errno == ECONNREFUSED || errno == ENOENT)
      return Status::PeerLost("local worker process with local rank " + std::to_string(local_rank) +
                              " is gone");
    return Status::Internal(std::string("local signal send failed: ") + strerror(errno));
  }
}

bool LocalChannel::Recv(LocalSignal* out, int timeout_ms) {
  if (fd_ < 0) return false;
  pollfd pfd{fd_, POLLIN, 0};
  if (poll(&pfd, 1, timeout_ms) <= 0) return false;
  *out = LocalSignal();
  ssize_t r = recv(fd_, out, sizeof(*out), 0);
  if (r < static_cast<ssize_t>(offsetof(LocalSignal, text))) return false;
  out->text[sizeof(out->text) - 1] = '\0';
  return true;
}

void LocalChannel::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

std::string ShmName(const std::string& job, int worker_id, uint32_t declared_key) {
  return "/byteps_" + job + "_" + std::to_string(worker_id) + "_" + std::to_string(declared_key);
}

ShmSegment::~ShmSegment() { Close(); }

Status ShmSegment::Open(const std::string& name, size_t bytes) {
  name_ = name;
  int fd = shm_open(name.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0)
    return Status::Internal("shm_open(" + name + "): " + strerror(errno) +
                            " (is /dev/shm mounted and large enough?)");
  struct stat stt;
  if (fstat(fd, &stt) == 0 && static_cast<size_t>(stt.st_size) < bytes) {
    if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      Status st = Status::Internal("ftruncate(" + name + ", " + std::to_string(bytes) +
                                   "): " + strerror(errno) + " (/dev/shm too small?)");
      close(fd);
      return st;
    }
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return Status::Internal("mmap(" + name + "): " + strerror(errno));
  data_ = static_cast<char*>(p);
  size_ = bytes;
  return Status::OK();
}

void ShmSegment::Unlink() {
  if (!unlinked_ && !name_.empty()) shm_unlink(name_.c_str());
  unlinked_ = true;
}

void ShmSegment::Close() {
  if (data_) munmap(data_, size_);
  data_ = nullptr;
}

}  // namespace byteps
