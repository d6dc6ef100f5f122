#include "comm/tcp/tcp_van.h"

#include <unistd.h>

#include "comm/socket_util.h"
#include "comm/tcp/tcp_connection.h"

namespace byteps {

TcpVan::~TcpVan() { StopListening(); }

Status TcpVan::Listen(const std::string& host, int port, const ListenOptions& opts,
                      AcceptFn on_connection, int* bound_port) {
  std::lock_guard<std::mutex> lk(mu_);
  if (listen_fd_ >= 0) return Status::Internal("this van already listens");
  BPS_RETURN_IF_ERROR(byteps::Listen(host, port, &listen_fd_, bound_port));
  ConnectionHandler* handler = opts.handler;
  std::string name = opts.peer_name;
  acceptor_ = std::make_unique<Acceptor>(
      listen_fd_, opts.owner,
      [handler, name, on_connection = std::move(on_connection)](int fd) {
        on_connection(std::make_unique<TcpConnection>(fd, name, handler));
      },
      opts.handshake_timeout_s);
  acceptor_->Start();
  return Status::OK();
}

void TcpVan::SetListenerOwner(const std::string& owner) {
  std::lock_guard<std::mutex> lk(mu_);
  if (acceptor_) acceptor_->set_owner(owner);
}

void TcpVan::StopListening() {
  std::lock_guard<std::mutex> lk(mu_);
  if (acceptor_) acceptor_->Stop();
  if (listen_fd_ >= 0) close(listen_fd_);
  listen_fd_ = -1;
}

Status TcpVan::Connect(const std::string& host, int port, double timeout_s,
                       ConnectionHandler* handler, const std::string& peer_name,
                       std::unique_ptr<Connection>* out) {
  int fd = -1;
  BPS_RETURN_IF_ERROR(ConnectWithRetry(host, port, timeout_s, &fd));
  *out = std::make_unique<TcpConnection>(fd, peer_name, handler);
  return Status::OK();
}

}  // namespace byteps
