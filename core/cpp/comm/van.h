// The van (docs/architecture.md §6): what carries frames between the processes of a job. It
// listens for and makes connections, each authenticated with the job secret (comm/auth.h)
// before anything from the peer reaches a handler, and hands them out as `Connection`s
// (comm/connection.h): send a message (header + payload from the caller's memory), receive
// into memory the receiver chooses, close. Errors are Status values; a broken peer is
// reported, never an abort. Two kinds: "tcp" (comm/tcp/tcp_van.h) and, in a build with UCX, "ucx"
// (comm/ucx/ucx_van.h: RDMA, shared memory or TCP as UCX chooses), whose transports send from
// and receive into memory registered once, hence the optional RegisterMemory /
// UnregisterMemory hooks (a no-op for TCP).
//
// A van outlives the connections it made: destroy (or Join) them first.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/connection.h"

namespace byteps {

class Knobs;

// Which van a job's processes use, as every process of the job derives it from the same
// variables (VanSpec::FromKnobs, upstream's switches): DMLC_ENABLE_RDMA=ucx or
// DMLC_ENABLE_UCX=1 select the UCX van for every connection; DMLC_ENABLE_RDMA=1 / ibverbs
// select it and require an RDMA transport; BYTEPS_ENABLE_IPC=1 with the TCP van reaches peers
// on the same host over UCX's shared memory (the others over TCP).
struct VanSpec {
  std::string kind = "tcp";   // "tcp" | "ucx"
  bool require_rdma = false;  // ucx: fail at start without an RDMA transport
  bool ipc = false;           // tcp: colocated peers over UCX shared memory
  double ucx_spin_s = 0;      // ucx (and ipc): BYTEPS_UCX_SPIN_US, in seconds
  std::string ucx_one_way = "auto";  // ucx (and ipc): BYTEPS_UCX_ONE_WAY (auto, 1, 0)
  // kInvalidArgument for a value no van answers to (e.g. DMLC_ENABLE_RDMA=fabric).
  static Status FromKnobs(const Knobs& k, VanSpec* out);
  // "tcp", "tcp + ipc", "ucx", "ucx (rdma required)": for log lines.
  std::string Describe() const;
};

class Van {
 public:
  // Makes a van of the given kind ("tcp", "ucx"); an unknown kind, or "ucx" in a build without
  // UCX, is kInvalidArgument / kConfig naming the kinds this build has (and what to install).
  static Status Create(const std::string& kind, std::unique_ptr<Van>* out);
  // The van a VanSpec asks for (errors as above, and the UCX van's own: UcxVan::Create).
  static Status Create(const VanSpec& spec, std::unique_ptr<Van>* out);
  // The kinds this build has, by the name Create takes ({"tcp"} or {"tcp", "ucx"}).
  static std::vector<std::string> Kinds();

  virtual ~Van() = default;
  Van(const Van&) = delete;
  Van& operator=(const Van&) = delete;

  virtual const char* kind() const = 0;

  // Listening side (scheduler, servers): every connection that passes the handshake goes to
  // `on_connection`, on the van's accepting thread, not yet started.
  struct ListenOptions {
    std::string owner = "node";         // names this process in log lines about rejected peers
    double handshake_timeout_s = 5;     // a peer that has not authenticated by then is dropped
    ConnectionHandler* handler = nullptr;  // of every accepted connection
    std::string peer_name = "peer";     // an accepted connection's name until its owner renames it
  };
  using AcceptFn = std::function<void(std::unique_ptr<Connection> conn)>;
  // Binds host:port (port 0: any free port), sets *bound_port and starts accepting. One
  // listener per van.
  virtual Status Listen(const std::string& host, int port, const ListenOptions& opts,
                        AcceptFn on_connection, int* bound_port) = 0;
  // Renames this process in the listener's log lines (a server learns its rank late).
  virtual void SetListenerOwner(const std::string& owner) = 0;
  // Stops accepting and closes the listening socket; connections already handed out are
  // untouched. Idempotent; called by the destructor too.
  virtual void StopListening() = 0;

  // Connecting side: reaches host:port within timeout_s (a refused connection is retried: the
  // peer may not listen yet), authenticates, and sets *out to a connection not yet started.
  // Errors: kTimeout (never reached), kConfig (unresolvable host, or the peer refuses this
  // job's secret), kPeerLost (the peer broke off the handshake).
  virtual Status Connect(const std::string& host, int port, double timeout_s,
                         ConnectionHandler* handler, const std::string& peer_name,
                         std::unique_ptr<Connection>* out) = 0;

  // Memory that frames will be sent from or received into, for a van that must register it
  // with its device before use (pinned, with remote keys). Registering is optional: a van that
  // needs nothing (TCP) returns OK and sends from and receives into any memory.
  virtual Status RegisterMemory(void* addr, size_t len) {
    (void)addr;
    (void)len;
    return Status::OK();
  }
  virtual void UnregisterMemory(void* addr) { (void)addr; }
  // Whether connections of this van may offer one-way writes (Connection::ExportWindow): a
  // receiver that exports windows keeps the memory behind them at fixed addresses.
  virtual bool one_way_writes() const { return false; }
  // Memory for windows: `len` bytes, page-aligned, registered, and where the van can, shared
  // with the processes of this host, whose one-way writes are then plain copies into it (the
  // UCX van: UcxContext::AllocateShared). Freed with FreeMemory before the van goes. A van
  // without it (TCP) says kInvalidArgument: the caller allocates (and registers) memory itself.
  virtual Status AllocateMemory(size_t len, void** addr) {
    (void)len;
    (void)addr;
    return Status::InvalidArgument(std::string("the ") + kind() + " van allocates no memory");
  }
  virtual void FreeMemory(void* addr) { (void)addr; }

 protected:
  Van() = default;
};

}  // namespace byteps
