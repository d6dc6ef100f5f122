// Thin POSIX socket helpers for the TCP van and the control plane (IPv4).
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace byteps {

// Connects to host:port, retrying refused connections until `timeout_s` passes.
Status ConnectWithRetry(const std::string& host, int port, double timeout_s, int* fd_out);
// Binds and listens on host:port (port 0 = any free port); returns the bound port.
Status Listen(const std::string& host, int port, int* fd_out, int* port_out);
// Local IPv4 address of a connected socket (the interface that routes to the peer).
std::string LocalAddressOf(int fd);
// IPv4 address of a network interface, or "" if it has none.
std::string InterfaceAddress(const std::string& ifname);
// Every (interface, IPv4 address) of this host, in the kernel's order.
std::vector<std::pair<std::string, std::string>> InterfaceAddresses();
// The local IPv4 address the kernel's routing picks for reaching host:port (a connected UDP
// socket: nothing is sent), or "" with *why set when host is not an IPv4 address or has no
// route. The same choice a node makes when it advertises the address on its route to the
// scheduler.
std::string RouteAddressTo(const std::string& host, int port, std::string* why);
// TCP_NODELAY, large buffers, keepalive.
void TuneDataSocket(int fd);
// TCP_NOTSENT_LOWAT of sockets tuned from now on (BYTEPS_TCP_NOTSENT_LOWAT); 0 = kernel default.
void SetTcpNotSentLowat(int64_t bytes);
// Reads/writes exactly n bytes (restarting on EINTR). Status kPeerLost on EOF/reset.
Status ReadFull(int fd, void* buf, size_t n);
Status WriteFull(int fd, const void* buf, size_t n);
// Reads exactly n bytes from a blocking socket before `deadline` (poll bounds each wait).
// kTimeout when the deadline passes, kPeerLost on EOF or a socket error; `what` names the
// exchange in the messages ("authentication handshake").
Status ReadFullBefore(int fd, void* buf, size_t n, std::chrono::steady_clock::time_point deadline,
                      const char* what);

}  // namespace byteps
