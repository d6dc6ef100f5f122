// byteps._core.testing.van_*: the van seam (comm/van.h) on its own, without the PS protocol: a
// loopback connection over 127.0.0.1 through a van of a given kind.
#include <pybind11/stl.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "bindings.h"
#include "comm/van.h"

namespace py = pybind11;

namespace byteps {
namespace python {
namespace {

// Receives frames into memory it picks itself (a buffer registered with the van) and refuses,
// in ValidateHeader, the one message type it was told to.
class LoopbackReceiver : public ConnectionHandler {
 public:
  explicit LoopbackReceiver(int refused_type) : refused_type_(refused_type) {}

  Status ValidateHeader(const FrameHeader& h) override {
    if (static_cast<int>(h.type) == refused_type_)
      return Status::InvalidArgument("message type " + std::to_string(h.type) +
                                     " refused by the handler");
    return Status::OK();
  }
  Status OnHeader(Connection*, const FrameHeader& h, void** dest) override {
    std::lock_guard<std::mutex> lk(mu_);
    headers_++;
    if (h.payload_len > buffer_.size())
      return Status::InvalidArgument("a payload larger than the receiver's buffer");
    *dest = buffer_.data();
    return Status::OK();
  }
  void OnFrame(Connection*, const FrameHeader& h, void*) override {
    std::lock_guard<std::mutex> lk(mu_);
    got_ = h;
    have_ = true;
    cv_.notify_all();
  }
  void OnClosed(Connection*, const Status& why) override {
    std::lock_guard<std::mutex> lk(mu_);
    closed_ = why.ok() ? Status::PeerLost("connection closed") : why;
    cv_.notify_all();
  }
  void SetAccepted(std::unique_ptr<Connection> c) {
    std::lock_guard<std::mutex> lk(mu_);
    accepted_ = std::move(c);
    cv_.notify_all();
  }

  const int refused_type_;
  std::string buffer_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::unique_ptr<Connection> accepted_;
  int headers_ = 0;
  bool have_ = false;
  FrameHeader got_;
  Status closed_;
};

// The connecting side ignores what comes back.
class SilentHandler : public ConnectionHandler {
 public:
  Status ValidateHeader(const FrameHeader&) override { return Status::OK(); }
  Status OnHeader(Connection*, const FrameHeader&, void**) override { return Status::OK(); }
  void OnFrame(Connection*, const FrameHeader&, void*) override {}
  void OnClosed(Connection*, const Status&) override {}
};

struct Received {
  uint16_t type = 0;
  uint64_t aux = 0;
  std::string payload;
  std::string peer;
};

// Listens on 127.0.0.1 (any port) with one van, connects with a second of the same kind (as two
// processes would: a UCX context talks to other contexts), sends one frame (header + payload
// from the caller's memory) and waits until the accepted side has received it or dropped it.
Status Loopback(const std::string& kind, uint16_t type, const std::string& payload,
                uint64_t aux, int refused_type, double timeout_s, Received* out) {
  std::unique_ptr<Van> van, cvan;
  BPS_RETURN_IF_ERROR(Van::Create(kind, &van));
  BPS_RETURN_IF_ERROR(Van::Create(kind, &cvan));
  LoopbackReceiver receiver(refused_type);
  receiver.buffer_.resize(payload.size());
  SilentHandler sender_handler;
  Van::ListenOptions opts;
  opts.owner = "van loopback";
  opts.handler = &receiver;
  opts.peer_name = "loopback peer";
  int port = 0;
  BPS_RETURN_IF_ERROR(van->Listen(
      "127.0.0.1", 0, opts,
      [&receiver](std::unique_ptr<Connection> c) { receiver.SetAccepted(std::move(c)); }, &port));
  BPS_RETURN_IF_ERROR(van->RegisterMemory(receiver.buffer_.data(), receiver.buffer_.size()));
  BPS_RETURN_IF_ERROR(cvan->RegisterMemory(const_cast<char*>(payload.data()), payload.size()));
  std::unique_ptr<Connection> conn;
  Status st = cvan->Connect("127.0.0.1", port, timeout_s, &sender_handler, "loopback listener",
                           &conn);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  if (st.ok()) {
    conn->Start();
    SendItem item;  // from the caller's memory, no copy
    item.hdr.type = type;
    item.hdr.aux = aux;
    item.payload = payload.data();
    item.len = payload.size();
    conn->Send(&item);
    std::unique_lock<std::mutex> lk(receiver.mu_);
    if (!receiver.cv_.wait_until(lk, deadline, [&] { return receiver.accepted_ != nullptr; })) {
      st = Status::Timeout("the loopback connection was not accepted");
    } else {
      Connection* accepted = receiver.accepted_.get();
      lk.unlock();
      accepted->Start();
      lk.lock();
      if (!receiver.cv_.wait_until(lk, deadline,
                                   [&] { return receiver.have_ || !receiver.closed_.ok(); }))
        st = Status::Timeout("the loopback frame did not arrive");
      else if (receiver.headers_ != (receiver.have_ ? 1 : 0))
        st = Status::Internal("OnHeader saw " + std::to_string(receiver.headers_) +
                              " headers (a refused one must not reach it)");
      else if (!receiver.have_)
        st = receiver.closed_;
      if (st.ok()) {
        out->type = receiver.got_.type;
        out->aux = receiver.got_.aux;
        out->payload.assign(receiver.buffer_.data(), receiver.got_.payload_len);
        out->peer = accepted->peer_name();
      }
    }
    lk.unlock();  // the receiving side's OnClosed takes it
    conn->Join();  // the connections go before the van that made them
  }
  std::unique_ptr<Connection> accepted;
  {
    std::lock_guard<std::mutex> lk(receiver.mu_);
    accepted = std::move(receiver.accepted_);
  }
  if (accepted) accepted->Join();
  cvan->UnregisterMemory(const_cast<char*>(payload.data()));
  van->UnregisterMemory(receiver.buffer_.data());
  van->StopListening();
  return st;
}

}  // namespace

void BindVanTesting(py::module_& m) {
  m.def(
      "van_kind",
      [](const std::string& kind) {
        std::unique_ptr<Van> van;
        Check(Van::Create(kind, &van));
        return std::string(van->kind());
      },
      py::arg("kind"), "The kind of a van made by Van::Create(kind) (errors as Create's).");
  m.def(
      "van_loopback",
      [](const std::string& kind, uint16_t type, py::bytes payload, uint64_t aux,
         int refused_type, double timeout_s) {
        std::string data = payload;
        Received got;
        Status st;
        {
          py::gil_scoped_release nogil;
          st = Loopback(kind, type, data, aux, refused_type, timeout_s, &got);
        }
        Check(st);
        py::dict out;
        out["type"] = got.type;
        out["aux"] = got.aux;
        out["payload"] = py::bytes(got.payload);
        out["peer"] = got.peer;
        return out;
      },
      py::arg("kind"), py::arg("type"), py::arg("payload"), py::arg("aux") = 0,
      py::arg("refused_type") = -1, py::arg("timeout_s") = 10.0,
      "Sends one frame over a loopback connection of a van of `kind` and returns what the "
      "receiving side got: {'type', 'aux', 'payload', 'peer'}. A type equal to refused_type is "
      "refused by the receiving handler's ValidateHeader (the error is raised).");
}

}  // namespace python
}  // namespace byteps
