// The TCP van (comm/van.h): IPv4 stream sockets. Accepted connections are authenticated by one
// Acceptor thread (comm/acceptor.h) that drives every pending handshake; outgoing ones connect
// with retry and authenticate on the caller's thread. Each connection is a TcpConnection
// (comm/tcp/tcp_connection.h). Memory registration is a no-op: TCP sends from and receives into
// any memory.
#pragma once
#include <memory>
#include <mutex>
#include <string>

#include "comm/acceptor.h"
#include "comm/van.h"

namespace byteps {

class TcpVan final : public Van {
 public:
  TcpVan() = default;
  ~TcpVan() override;

  const char* kind() const override { return "tcp"; }
  Status Listen(const std::string& host, int port, const ListenOptions& opts,
                AcceptFn on_connection, int* bound_port) override;
  void SetListenerOwner(const std::string& owner) override;
  void StopListening() override;
  Status Connect(const std::string& host, int port, double timeout_s,
                 ConnectionHandler* handler, const std::string& peer_name,
                 std::unique_ptr<Connection>* out) override;

 private:
  std::mutex mu_;  // listen_fd_, acceptor_
  int listen_fd_ = -1;
  std::unique_ptr<Acceptor> acceptor_;
};

}  // namespace byteps
