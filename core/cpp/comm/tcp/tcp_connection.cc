#include "comm/tcp/tcp_connection.h"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "comm/socket_util.h"
#include "common/logging.h"

namespace byteps {
namespace {
LogLimiter g_drop_log;  // "dropping connection" lines of every connection of this process

void LogDrop(const std::string& peer, const std::string& why) {
  std::string more;
  if (g_drop_log.Allow(&more))
    BPS_LOG(WARNING) << "dropping connection from " << peer << ": " << why << more;
}
}  // namespace

TcpConnection::TcpConnection(int fd, std::string peer_name, ConnectionHandler* handler)
    : Connection(std::move(peer_name)), fd_(fd), handler_(handler) {}

TcpConnection::~TcpConnection() {
  Join();
  if (fd_ >= 0) close(fd_);
}

std::string TcpConnection::LocalAddress() const { return LocalAddressOf(fd_); }

void TcpConnection::Start() {
  send_thread_ = std::thread([this] { SendLoop(); });
  recv_thread_ = std::thread([this] { RecvLoop(); });
}

void TcpConnection::Send(SendItem* item) {
  item->next = nullptr;
  if (item->window != 0) {  // no windows here (Connection::OpenWindow)
    if (item->done)
      item->done(item->arg, Status::InvalidArgument("a one-way write on the TCP connection to " +
                                                    peer_name_));
    if (item->heap) delete item;
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!closed_) {
      if (tail_) tail_->next = item; else head_ = item;
      tail_ = item;
      cv_.notify_one();
      return;
    }
  }
  Status st = Status::PeerLost("connection to " + peer_name_ + " is closed");
  if (item->done) item->done(item->arg, st);
  if (item->heap) delete item;
}

bool TcpConnection::Flush(double timeout_s) {
  std::unique_lock<std::mutex> lk(mu_);
  return drained_cv_.wait_for(lk, std::chrono::duration<double>(timeout_s),
                              [&] { return closed_ || (!head_ && !sending_); }) &&
         !closed_;
}

void TcpConnection::Close() {
  closing_ = true;
  {
    std::lock_guard<std::mutex> lk(mu_);
    closed_ = true;
  }
  if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);
  cv_.notify_all();
  drained_cv_.notify_all();
}

void TcpConnection::Join() {
  Close();
  if (send_thread_.joinable()) send_thread_.join();
  if (recv_thread_.joinable()) recv_thread_.join();
}

void TcpConnection::FailQueued(const Status& st) {
  SendItem* list;
  {
    std::lock_guard<std::mutex> lk(mu_);
    list = head_;
    head_ = tail_ = nullptr;
  }
  while (list) {
    SendItem* next = list->next;
    if (list->done) list->done(list->arg, st);
    if (list->heap) delete list;
    list = next;
  }
  drained_cv_.notify_all();
}

void TcpConnection::SendLoop() {
  while (true) {
    SendItem* item;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return closed_ || head_ != nullptr; });
      if (closed_) break;
      item = head_;
      head_ = item->next;
      if (!head_) tail_ = nullptr;
      sending_ = true;
    }
    // Once its bytes are written, a reused item may already be queued again by its owner (the
    // answer can arrive before this thread runs on): read what is needed afterwards now.
    void (*done)(void*, const Status&) = item->done;
    void* done_arg = item->arg;
    bool heap = item->heap;
    item->hdr.magic = kFrameMagic;
    item->hdr.payload_len = item->len;
    iovec iov[2];
    iov[0] = {&item->hdr, sizeof(FrameHeader)};
    iov[1] = {const_cast<void*>(item->payload), item->len};
    int iovcnt = item->len ? 2 : 1;
    Status st;
    size_t total = sizeof(FrameHeader) + item->len, sent = 0;
    while (sent < total) {
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = iovcnt;
      ssize_t r = sendmsg(fd_, &msg, MSG_NOSIGNAL);
      if (r < 0) {
        if (errno == EINTR) continue;
        st = Status::PeerLost("send to " + peer_name_ + " failed: " + strerror(errno));
        break;
      }
      sent += static_cast<size_t>(r);
      // Advance the iovec past what was written.
      size_t adv = static_cast<size_t>(r);
      while (adv > 0 && iovcnt > 0) {
        if (adv >= iov[0].iov_len) {
          adv -= iov[0].iov_len;
          iov[0] = iov[1];
          --iovcnt;
        } else {
          iov[0].iov_base = static_cast<char*>(iov[0].iov_base) + adv;
          iov[0].iov_len -= adv;
          adv = 0;
        }
      }
    }
    if (done) done(done_arg, st);
    if (heap) delete item;
    {
      std::lock_guard<std::mutex> lk(mu_);
      sending_ = false;
    }
    drained_cv_.notify_all();
    if (!st.ok()) {
      {
        std::lock_guard<std::mutex> lk(mu_);
        closed_ = true;
      }
      shutdown(fd_, SHUT_RDWR);
      break;
    }
  }
  FailQueued(Status::PeerLost("connection to " + peer_name_ + " closed"));
}

Status TcpConnection::Discard(size_t n) {
  if (bounce_.size() < kBounceBytes) bounce_.resize(kBounceBytes);
  for (size_t done = 0; done < n;) {
    const size_t len = std::min(kBounceBytes, n - done);
    BPS_RETURN_IF_ERROR(ReadFull(fd_, bounce_.data(), len));
    done += len;
  }
  return Status::OK();
}

Status TcpConnection::ReceiveThroughSink(char* dest, size_t n) {
  if (bounce_.size() < kBounceBytes) bounce_.resize(kBounceBytes);
  for (size_t done = 0; done < n;) {
    const size_t len = std::min(kBounceBytes, n - done);
    Status st = ReadFull(fd_, bounce_.data(), len);
    if (!st.ok()) return st;
    sink_(sink_arg_, dest + done, bounce_.data(), len);
    done += len;
  }
  return Status::OK();
}

void TcpConnection::RecvLoop() {
  Status st;
  while (true) {
    FrameHeader h;
    st = ReadFull(fd_, &h, sizeof(h));
    if (!st.ok()) break;
    st = ValidateFrame(h);
    if (st.ok()) st = handler_->ValidateHeader(h);
    if (!st.ok()) {
      LogDrop(peer_name_, st.message());
      break;
    }
    void* dest = nullptr;
    sink_ = nullptr;
    st = handler_->OnHeader(this, h, &dest);
    if (!st.ok()) {
      LogDrop(peer_name_, st.message());
      break;
    }
    if (h.payload_len > 0) {
      if (dest == kDiscard) {
        st = Discard(h.payload_len);
        if (!st.ok()) break;
        handler_->OnFrame(this, h, nullptr);
        continue;
      }
      if (!dest) {
        if (h.payload_len > kMaxBufferedPayload) {
          st = Status::InvalidArgument("a payload of " + std::to_string(h.payload_len) +
                                       " bytes (message type " + std::to_string(h.type) +
                                       ") that nothing expects (at most " +
                                       std::to_string(kMaxBufferedPayload) + " are buffered)");
          LogDrop(peer_name_, st.message());
          break;
        }
        if (scratch_.size() < h.payload_len) scratch_.resize(h.payload_len);
        dest = scratch_.data();
      }
      if (sink_) {
        st = ReceiveThroughSink(static_cast<char*>(dest), h.payload_len);
      } else {
        st = ReadFull(fd_, dest, h.payload_len);
      }
      if (!st.ok()) break;
    }
    handler_->OnFrame(this, h, dest);
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    closed_ = true;
  }
  shutdown(fd_, SHUT_RDWR);  // the peer sees the end now, not when this object is destroyed
  cv_.notify_all();
  drained_cv_.notify_all();
  if (!closing_) handler_->OnClosed(this, st);
}

}  // namespace byteps
