#include "auth.h"

#include <arpa/inet.h>
#include <cstdint>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>

#include "comm/socket_util.h"

namespace byteps {
namespace {

constexpr char kMagic[4] = {'B', 'P', 'S', 'A'};
constexpr uint8_t kVersion = 1;
constexpr size_t kNonce = 32, kMac = 32;

std::mutex g_mu;
std::string g_secret;

using Clock = std::chrono::steady_clock;

Status WriteAll(int fd, const void* buf, size_t n) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return Status::PeerLost(std::string("authentication handshake: ") + strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::OK();
}

bool Mac(const std::string& secret, const char* label, const uint8_t* a, const uint8_t* b,
         uint8_t* out) {
  uint8_t msg[32 + 2 * kNonce];
  size_t ll = strlen(label);
  memcpy(msg, label, ll);
  memcpy(msg + ll, a, kNonce);
  memcpy(msg + ll + kNonce, b, kNonce);
  unsigned int len = 0;
  return HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), msg, ll + 2 * kNonce,
              out, &len) != nullptr &&
         len == kMac;
}

std::string Secret() {
  std::lock_guard<std::mutex> lk(g_mu);
  return g_secret;
}

}  // namespace

void SetJobSecret(const std::string& secret) {
  std::lock_guard<std::mutex> lk(g_mu);
  g_secret = secret;
}

bool AuthenticationEnabled() { return !Secret().empty(); }

std::string PeerAddress(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "unknown peer";
  char ip[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &a.sin_addr, ip, sizeof(ip));
  return std::string(ip) + ":" + std::to_string(ntohs(a.sin_port));
}

Status AuthenticateToPeer(int fd, const std::string& peer, double timeout_s) {
  std::string secret = Secret();
  if (secret.empty()) return Status::OK();
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(timeout_s));
  uint8_t hello[5 + kNonce];
  memcpy(hello, kMagic, 4);
  hello[4] = kVersion;
  uint8_t* nonce_c = hello + 5;
  if (RAND_bytes(nonce_c, kNonce) != 1) return Status::Internal("RAND_bytes failed");
  BPS_RETURN_IF_ERROR(WriteAll(fd, hello, sizeof(hello)));
  uint8_t reply[5 + kNonce + kMac];
  Status st = ReadFullBefore(fd, reply, sizeof(reply), deadline, "authentication handshake");
  if (!st.ok())
    return Status(st.code(), peer + " did not complete the authentication handshake (" +
                                 st.message() + "); is it a byteps process of this job?");
  if (memcmp(reply, kMagic, 4) != 0 || reply[4] != kVersion)
    return Status::Config(peer + " answered the handshake with something else than byteps " +
                          "authentication (different byteps version, or not byteps)");
  const uint8_t* nonce_s = reply + 5;
  uint8_t expect[kMac];
  if (!Mac(secret, "byteps-accept", nonce_c, nonce_s, expect))
    return Status::Internal("HMAC-SHA256 failed");
  if (CRYPTO_memcmp(expect, reply + 5 + kNonce, kMac) != 0)
    return Status::Config(peer + " does not know this job's secret (BYTEPS_SECRET differs): "
                                 "not connecting to it");
  uint8_t mine[kMac];
  if (!Mac(secret, "byteps-connect", nonce_s, nonce_c, mine))
    return Status::Internal("HMAC-SHA256 failed");
  BPS_RETURN_IF_ERROR(WriteAll(fd, mine, sizeof(mine)));
  uint8_t verdict = 0;
  st = ReadFullBefore(fd, &verdict, 1, deadline, "authentication handshake");
  if (!st.ok() || verdict != 1)
    return Status::Config(peer + " rejected this process's BYTEPS_SECRET (the job secrets differ)");
  return Status::OK();
}

AcceptingHandshake::AcceptingHandshake() : secret_(Secret()) {
  phase_ = secret_.empty() ? Phase::kAwaitFirstByte : Phase::kReadHello;
}

short AcceptingHandshake::events() const {
  return phase_ == Phase::kWriteReply || phase_ == Phase::kWriteVerdict ? POLLOUT : POLLIN;
}

AcceptingHandshake::Step AcceptingHandshake::Fail(std::string* why, std::string text) {
  *why = std::move(text);
  return Step::kFailed;
}

AcceptingHandshake::Step AcceptingHandshake::Advance(int fd, std::string* why) {
  while (true) {
    if (phase_ == Phase::kAwaitFirstByte) {
      char b;
      ssize_t got = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
      if (got > 0) return Step::kDone;
      if (got == 0) return Fail(why, "connection closed before it sent anything");
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Step::kContinue;
      return Fail(why, std::string("connection failed: ") + strerror(errno));
    }
    if (phase_ == Phase::kReadHello || phase_ == Phase::kReadMac) {
      size_t need = phase_ == Phase::kReadHello ? 5 + kNonce : kMac;
      ssize_t got = recv(fd, in_ + have_, need - have_, MSG_DONTWAIT);
      if (got == 0) return Fail(why, "connection closed during the authentication handshake");
      if (got < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return Step::kContinue;
        return Fail(why, std::string("authentication handshake: ") + strerror(errno));
      }
      have_ += static_cast<size_t>(got);
      // A stranger is told apart by its first bytes: no need to wait for the rest.
      size_t check = std::min<size_t>(have_, 5);
      if (phase_ == Phase::kReadHello &&
          (memcmp(in_, kMagic, std::min<size_t>(check, 4)) != 0 ||
           (check == 5 && in_[4] != kVersion)))
        return Fail(why, "not a byteps authentication handshake");
      if (have_ < need) continue;
      have_ = 0;
      if (phase_ == Phase::kReadHello) {
        memcpy(nonce_c_, in_ + 5, kNonce);
        memcpy(out_, kMagic, 4);
        out_[4] = kVersion;
        if (RAND_bytes(nonce_s_, kNonce) != 1) return Fail(why, "RAND_bytes failed");
        memcpy(out_ + 5, nonce_s_, kNonce);
        if (!Mac(secret_, "byteps-accept", nonce_c_, nonce_s_, out_ + 5 + kNonce))
          return Fail(why, "HMAC-SHA256 failed");
        out_len_ = sizeof(out_);
        phase_ = Phase::kWriteReply;
      } else {
        uint8_t expect[kMac];
        if (!Mac(secret_, "byteps-connect", nonce_s_, nonce_c_, expect))
          return Fail(why, "HMAC-SHA256 failed");
        accepted_ = CRYPTO_memcmp(expect, in_, kMac) == 0;
        out_[0] = accepted_ ? 1 : 0;
        out_len_ = 1;
        phase_ = Phase::kWriteVerdict;
      }
      continue;
    }
    // kWriteReply / kWriteVerdict
    ssize_t w = send(fd, out_ + have_, out_len_ - have_, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Step::kContinue;
      return Fail(why, std::string("authentication handshake: ") + strerror(errno));
    }
    have_ += static_cast<size_t>(w);
    if (have_ < out_len_) continue;
    have_ = 0;
    if (phase_ == Phase::kWriteReply) {
      phase_ = Phase::kReadMac;
      continue;
    }
    return accepted_ ? Step::kDone : Fail(why, "wrong job secret");
  }
}

}  // namespace byteps
