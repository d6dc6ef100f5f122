#include "comm/ucx/ucx_van.h"

#include <cstdint>
#include <unistd.h>

#include <cstring>

#include "comm/socket_util.h"
#include "comm/tcp/tcp_connection.h"
#include "comm/ucx/ucx_link.h"

namespace byteps {
namespace {

constexpr char kMagic[4] = {'B', 'P', 'S', 'V'};
constexpr uint16_t kVersion = 1;
constexpr uint16_t kFlagUcx = 1;
constexpr uint32_t kMaxAddress = 32 << 10;  // a worker address from a peer
constexpr size_t kMaxPending = 256;          // tokens handed out and not yet redeemed

const char* kSameVan =
    "every node of a job must select the same van (DMLC_ENABLE_RDMA, DMLC_ENABLE_UCX, "
    "BYTEPS_ENABLE_IPC)";

#pragma pack(push, 1)
struct Hello {
  char magic[4];
  uint16_t version;
  uint16_t flags;
  uint32_t length;
};
struct Reply {
  char magic[4];
  uint16_t version;
  uint16_t flags;
  uint64_t token;
  uint32_t length;
};
#pragma pack(pop)

double SecondsLeft(std::chrono::steady_clock::time_point deadline) {
  return std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
}

}  // namespace

Status UcxVan::Create(const Options& opts, std::unique_ptr<Van>* out) {
  std::unique_ptr<UcxVan> van(new UcxVan(opts));
  const std::string tls = opts.reach == Reach::kColocated ? "sm,self" : "";
  BPS_RETURN_IF_ERROR(UcxContext::Create(opts.name, &van->ctx_, tls, opts.spin_s, opts.one_way));
  std::string found;
  bool rdma = false;
  for (const std::string& r : van->ctx_->Resources()) {
    found += (found.empty() ? "" : ", ") + r;
    rdma = rdma || IsRdmaTransport(r);
  }
  // auto: windows (and the fixed slots behind them) only where a link may be RDMA.
  van->one_way_ = opts.one_way == UcxOneWay::kOn || (opts.one_way == UcxOneWay::kAuto && rdma);
  if (opts.require_rdma) {
    if (!rdma)
      return Status::Config(
          "DMLC_ENABLE_RDMA asks for RDMA, but UCX " + std::string(ucp_get_version_string()) +
          " finds no RDMA " +
          "transport on this host with " + van->ctx_->config_summary() + " (it has: " +
          (found.empty() ? "nothing" : found) + "). Check the device (ibv_devices; rdma-core "
          "and a UCX built with verbs: ucx_info -d), or set DMLC_ENABLE_RDMA=ucx to run UCX "
          "over the transports this host has");
  }
  van->ctx_->SetAcceptRouter(
      [v = van.get()](uint64_t token, const std::string& name, UcxContext::AcceptRoute* route) {
        return v->Route(token, name, route);
      });
  *out = std::move(van);
  return Status::OK();
}

UcxVan::~UcxVan() {
  StopListening();
  if (!ctx_) return;  // Create failed before the context existed
  ctx_->SetAcceptRouter(nullptr);
  ctx_->Shutdown();
}

Status UcxVan::Listen(const std::string& host, int port, const ListenOptions& opts,
                      AcceptFn on_connection, int* bound_port) {
  std::lock_guard<std::mutex> lk(mu_);
  if (listen_fd_ >= 0) return Status::Internal("this van already listens");
  BPS_RETURN_IF_ERROR(byteps::Listen(host, port, &listen_fd_, bound_port));
  listen_ = opts;
  on_connection_ = std::move(on_connection);
  acceptor_ = std::make_unique<Acceptor>(
      listen_fd_, opts.owner, [this](int fd) { OnAuthenticated(fd); }, opts.handshake_timeout_s);
  acceptor_->Start();
  return Status::OK();
}

void UcxVan::SetListenerOwner(const std::string& owner) {
  std::lock_guard<std::mutex> lk(mu_);
  if (acceptor_) acceptor_->set_owner(owner);
  listen_.owner = owner;
}

void UcxVan::StopListening() {
  std::unique_ptr<Acceptor> acceptor;
  {
    std::lock_guard<std::mutex> lk(mu_);
    acceptor = std::move(acceptor_);
  }
  if (acceptor) acceptor->Stop();  // outside mu_: its thread may be in OnAuthenticated
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (listen_fd_ >= 0) close(listen_fd_);
    listen_fd_ = -1;
    on_connection_ = nullptr;
  }
  std::lock_guard<std::mutex> lk(pending_mu_);
  for (auto& kv : pending_) close(kv.second.fd);
  pending_.clear();
}

void UcxVan::OnAuthenticated(int fd) {
  ListenOptions opts;
  AcceptFn accept;
  {
    std::lock_guard<std::mutex> lk(mu_);
    opts = listen_;
    accept = on_connection_;
  }
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(opts.handshake_timeout_s));
  const std::string peer = PeerAddress(fd);
  auto drop = [&](const std::string& why) {
    BPS_LOG(WARNING) << opts.owner << ": dropping the connection from " << peer << ": " << why;
    close(fd);
  };
  Hello hello;
  Status st = ReadFullBefore(fd, &hello, sizeof(hello), deadline, "UCX van bootstrap");
  if (!st.ok()) return drop(st.message());
  if (memcmp(hello.magic, kMagic, 4) != 0 || hello.version != kVersion)
    return drop(std::string("it does not speak the UCX van's bootstrap; ") + kSameVan);
  if (hello.length > kMaxAddress)
    return drop("a worker address of " + std::to_string(hello.length) + " bytes");
  std::string peer_address(hello.length, '\0');
  st = ReadFullBefore(fd, peer_address.data(), peer_address.size(), deadline,
                      "UCX van bootstrap");
  if (!st.ok()) return drop(st.message());
  const bool ucx = hello.flags & kFlagUcx;
  Reply reply;
  memcpy(reply.magic, kMagic, 4);
  reply.version = kVersion;
  reply.flags = ucx ? kFlagUcx : 0;
  reply.token = 0;
  reply.length = ucx ? static_cast<uint32_t>(ctx_->address().size()) : 0;
  if (ucx) {
    std::lock_guard<std::mutex> lk(pending_mu_);
    DropExpired();
    if (pending_.size() >= kMaxPending) return drop("too many UCX links being set up");
    do reply.token = ctx_->NewLinkId();
    while (pending_.count(reply.token));
    pending_[reply.token] = Pending{fd, deadline};
  }
  std::string out(reinterpret_cast<const char*>(&reply), sizeof(reply));
  if (ucx) out += ctx_->address();
  st = WriteFull(fd, out.data(), out.size());
  if (!st.ok()) {
    if (ucx) {
      std::lock_guard<std::mutex> lk(pending_mu_);
      if (!pending_.erase(reply.token)) return;  // redeemed meanwhile: the link owns fd
    }
    return drop(st.message());
  }
  if (!ucx && accept) accept(std::make_unique<TcpConnection>(fd, opts.peer_name, opts.handler));
  if (!ucx && !accept) close(fd);
}

void UcxVan::DropExpired() {
  const auto now = Clock::now();
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second.deadline > now) {
      ++it;
      continue;
    }
    close(it->second.fd);
    it = pending_.erase(it);
  }
}

bool UcxVan::Route(uint64_t token, const std::string& peer_name,
                   UcxContext::AcceptRoute* route) {
  int fd;
  {
    std::lock_guard<std::mutex> lk(pending_mu_);
    DropExpired();
    auto it = pending_.find(token);
    if (it == pending_.end()) {
      ctx_->LogPeerError("CONNECT from " + peer_name + " with a token this van never handed "
                         "out (not bootstrapped over an authenticated socket)");
      return false;
    }
    fd = it->second.fd;
    pending_.erase(it);
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (!on_connection_) {
    close(fd);
    return false;
  }
  route->handler = listen_.handler;
  route->peer_name = listen_.peer_name;
  route->on_connection = on_connection_;
  route->lifeline_fd = fd;
  return true;
}

bool UcxVan::WantsUcx(const std::string& host) const {
  if (opts_.reach == Reach::kAll) return true;
  if (host == "localhost" || host.rfind("127.", 0) == 0) return true;
  for (const auto& [ifname, addr] : InterfaceAddresses())
    if (addr == host) return true;
  return false;
}

Status UcxVan::Connect(const std::string& host, int port, double timeout_s,
                       ConnectionHandler* handler, const std::string& peer_name,
                       std::unique_ptr<Connection>* out) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s));
  int fd = -1;
  BPS_RETURN_IF_ERROR(ConnectWithRetry(host, port, timeout_s, &fd));
  const std::string where = host + ":" + std::to_string(port);
  const bool ucx = WantsUcx(host);
  Hello hello;
  memcpy(hello.magic, kMagic, 4);
  hello.version = kVersion;
  hello.flags = ucx ? kFlagUcx : 0;
  hello.length = ucx ? static_cast<uint32_t>(ctx_->address().size()) : 0;
  std::string msg(reinterpret_cast<const char*>(&hello), sizeof(hello));
  if (ucx) msg += ctx_->address();
  Status st = WriteFull(fd, msg.data(), msg.size());
  // The bootstrap gets at least a few seconds, as the authentication does.
  const auto boot_deadline = std::max(deadline, Clock::now() + std::chrono::seconds(5));
  Reply reply;
  if (st.ok())
    st = ReadFullBefore(fd, &reply, sizeof(reply), boot_deadline, "UCX van bootstrap");
  if (!st.ok()) {
    close(fd);
    return Status(st.code(), where + " broke off the UCX van's bootstrap (" + st.message() +
                                 "); " + kSameVan);
  }
  if (memcmp(reply.magic, kMagic, 4) != 0 || reply.version != kVersion ||
      reply.length > kMaxAddress || (ucx && !(reply.flags & kFlagUcx))) {
    close(fd);
    return Status::Config(where + " answered the UCX van's bootstrap with something else; " +
                          kSameVan);
  }
  std::string address(reply.length, '\0');
  st = ReadFullBefore(fd, address.data(), address.size(), boot_deadline, "UCX van bootstrap");
  if (!st.ok()) {
    close(fd);
    return Status(st.code(), where + " broke off the UCX van's bootstrap: " + st.message());
  }
  if (!ucx) {
    BPS_LOG(INFO) << "UCX van: connected to " << peer_name << " over TCP (" << host
                  << " is not an address of this host)";
    *out = std::make_unique<TcpConnection>(fd, peer_name, handler);
    return Status::OK();
  }
  st = ctx_->Connect(address, peer_name, handler, std::max(SecondsLeft(boot_deadline), 1.0), out,
                     reply.token, fd);
  if (!st.ok())
    return Status(st.code(), "UCX could not open a link to " + peer_name + " at " + where +
                                 " with " + ctx_->config_summary() + ": " + st.message());
  BPS_LOG(INFO) << "UCX van: connected to " << peer_name << " over UCX ("
                << ctx_->config_summary() << ")";
  return Status::OK();
}

Status UcxVan::RegisterMemory(void* addr, size_t len) { return ctx_->RegisterMemory(addr, len); }

void UcxVan::UnregisterMemory(void* addr) {
  Status st = ctx_->UnregisterMemory(addr);
  if (!st.ok()) BPS_LOG(WARNING) << "UCX van: " << st.message();
}

}  // namespace byteps
