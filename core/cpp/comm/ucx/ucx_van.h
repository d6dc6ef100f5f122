// The UCX van (comm/van.h, docs/architecture.md §6): frames travel over UCP active messages
// (ucx_link.h), so UCX picks RDMA, shared memory or TCP per peer from UCX_TLS /
// UCX_NET_DEVICES; connections are made and authenticated over TCP first.
//
// Bootstrap. Listen binds a TCP socket on host:port like the TCP van, and every connection runs
// the job-secret handshake (comm/auth.h) in the same Acceptor, so strangers get no further than
// they do with TCP. On the authenticated socket the two sides then exchange UCX worker addresses:
//
//   connecting side -> listener: "BPSV" | version u16 | flags u16 | length u32 | worker address
//   listener -> connecting side: "BPSV" | version u16 | flags u16 | token u64 | length u32 |
//                                worker address
//
// flags bit 0: the connecting side wants a UCX link (hello) / the listener offers one (reply).
// The token is 64 random bits the listener remembers for the handshake timeout; the connecting
// side's UCX CONNECT carries it, and the listener's context accepts only CONNECTs with a token
// it handed out (UcxContext::SetAcceptRouter): a UCX link exists only behind an authenticated
// socket. That socket then stays open as the link's lifeline (UcxContext::Connect): its end of
// file tells a process that its peer died, which UCX's shared-memory transports cannot.
//
// Reach. kAll (DMLC_ENABLE_RDMA=ucx, DMLC_ENABLE_UCX=1): every connection is a UCX link.
// kColocated (BYTEPS_ENABLE_IPC=1 with the TCP van): a peer on this host (its address is one of
// this host's or a loopback one) is reached over UCX, whose context then defaults to the
// shared-memory transports ("sm,self" where UCX_TLS is unset); any other peer keeps the
// authenticated socket as a TCP connection (comm/tcp/tcp_connection.h) after a hello without the
// UCX flag.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "comm/acceptor.h"
#include "comm/ucx/ucx_context.h"
#include "comm/van.h"

namespace byteps {

class UcxVan final : public Van {
 public:
  enum class Reach { kAll, kColocated };
  struct Options {
    Reach reach = Reach::kAll;
    // DMLC_ENABLE_RDMA=1 / ibverbs: refuse to start without an RDMA transport in UCX.
    bool require_rdma = false;
    std::string name = "byteps";  // the UCX context's name (UCX logs, error messages)
    double spin_s = 0;  // the progress thread's polling before it sleeps (UcxContext::Create)
    // BYTEPS_UCX_ONE_WAY: which links write pushes one-way into a server's window
    // (UcxContext::Create).
    UcxOneWay one_way = UcxOneWay::kAuto;
  };
  // Creates the UCX context and its progress thread. Errors: kConfig naming UCX and UCX_TLS /
  // UCX_NET_DEVICES when UCX cannot start with them, or (require_rdma) naming the transports
  // UCX found when none is RDMA.
  static Status Create(const Options& opts, std::unique_ptr<Van>* out);
  ~UcxVan() override;  // StopListening(), then the context shuts down

  const char* kind() const override { return "ucx"; }
  Status Listen(const std::string& host, int port, const ListenOptions& opts,
                AcceptFn on_connection, int* bound_port) override;
  void SetListenerOwner(const std::string& owner) override;
  void StopListening() override;
  // As the TCP van's, then the bootstrap above; a peer that is not a UCX van, or that UCX cannot
  // reach with this process's transports, is kConfig / kPeerLost naming UCX and UCX_TLS.
  Status Connect(const std::string& host, int port, double timeout_s, ConnectionHandler* handler,
                 const std::string& peer_name, std::unique_ptr<Connection>* out) override;
  // ucp_mem_map once: frames sent from or received into the region use its registration.
  Status RegisterMemory(void* addr, size_t len) override;
  void UnregisterMemory(void* addr) override;
  // BYTEPS_UCX_ONE_WAY=1, or auto on a host where UCX has an RDMA transport.
  bool one_way_writes() const override { return one_way_; }
  Status AllocateMemory(size_t len, void** addr) override {
    return ctx_->AllocateShared(len, addr);
  }
  void FreeMemory(void* addr) override { ctx_->FreeShared(addr); }

  UcxContext* context() const { return ctx_.get(); }

 private:
  using Clock = std::chrono::steady_clock;
  struct Pending {
    int fd;
    Clock::time_point deadline;
  };
  explicit UcxVan(Options opts) : opts_(std::move(opts)) {}
  // Acceptor thread: the bootstrap of an authenticated socket.
  void OnAuthenticated(int fd);
  // Progress thread: the CONNECT carrying `token` becomes a connection.
  bool Route(uint64_t token, const std::string& peer_name, UcxContext::AcceptRoute* route);
  void DropExpired();  // closes the sockets of tokens never redeemed (pending_mu_ held)
  bool WantsUcx(const std::string& host) const;

  Options opts_;
  bool one_way_ = false;
  std::unique_ptr<UcxContext> ctx_;
  std::mutex mu_;  // listen_fd_, acceptor_, listen_, on_connection_
  int listen_fd_ = -1;
  std::unique_ptr<Acceptor> acceptor_;
  ListenOptions listen_;
  AcceptFn on_connection_;
  std::mutex pending_mu_;
  std::unordered_map<uint64_t, Pending> pending_;
};

}  // namespace byteps
