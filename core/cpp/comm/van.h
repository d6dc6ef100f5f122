// The van (docs/architecture.md §6): what carries frames between the processes of a job. It
// listens for and makes connections, each authenticated with the job secret (comm/auth.h)
// before anything from the peer reaches a handler, and hands them out as `Connection`s
// (comm/connection.h): send a message (header + payload from the caller's memory), receive
// into memory the receiver chooses, close. Errors are Status values; a broken peer is
// reported, never an abort. "tcp" (comm/tcp_van.h) is the only kind this build has; a kind with
// remote memory access would need its buffers registered first, hence the optional
// RegisterMemory / UnregisterMemory hooks (a no-op for TCP).
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

class Van {
 public:
  // Makes a van of the given kind ("tcp"); an unknown kind is kInvalidArgument naming the kinds
  // this build has.
  static Status Create(const std::string& kind, std::unique_ptr<Van>* out);
  // The kinds this build has, by the name Create takes ({"tcp"}).
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

 protected:
  Van() = default;
};

}  // namespace byteps
