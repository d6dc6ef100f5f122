// byteps._core.P2pChannel: the worker-to-worker channel (p2p/channel.h) for Python, wrapped by
// byteps.p2p (buffers and tensors, the job's address exchange). Operations take the caller's
// memory as (address, bytes) or as a buffer object; the Python wrapper keeps that memory alive
// until the operation is waited for. Every blocking call releases the GIL.
#include <cstdint>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "bindings.h"
#include "comm/auth.h"
#include "common/knobs.h"
#include "p2p/channel.h"

namespace py = pybind11;

namespace byteps {
namespace python {
namespace {

// A message the channel allocated: a read-only 1-D uint8 buffer (bytes(m), memoryview(m),
// numpy.frombuffer(m), torch.frombuffer(m)).
struct P2pMessage {
  P2pBuffer buf;
};

class PyChannel {
 public:
  PyChannel(int rank, int size, std::string host, int port, uint64_t max_message_bytes,
            uint64_t max_buffered_bytes, const std::string& van) {
    Knobs k;
    Check(Knobs::FromEnvironment(&k));
    P2pChannel::Options o;
    o.rank = rank;
    o.size = size;
    if (host.empty()) Check(P2pChannel::DefaultHost(k, &host));
    o.host = host;
    o.port = port;
    o.max_message_bytes = max_message_bytes;
    o.max_buffered_bytes = max_buffered_bytes;
    if (van.empty()) {
      Check(VanSpec::FromKnobs(k, &o.van));
    } else if (van == "tcp" || van == "ucx") {
      o.van.kind = van;
    } else {
      ThrowInvalidArgument("unknown van '" + van + "' (tcp, ucx, or '' for the job's)");
    }
    // The job secret of the environment (the one init() installed, or, before init(), the
    // one it would install); without one, the secret already installed, else none only with
    // BYTEPS_ALLOW_UNAUTHENTICATED=1.
    Check(ApplyJobSecretForChannel(k));
    Status st;
    {
      py::gil_scoped_release nogil;
      st = P2pChannel::Create(o, &ch_);
    }
    Check(st);
  }

  static Status ApplyJobSecretForChannel(const Knobs& k) {
    const std::string secret = k.Str("BYTEPS_SECRET");
    if (!secret.empty()) {
      SetJobSecret(secret);
      return Status::OK();
    }
    if (AuthenticationEnabled() || k.Bool("BYTEPS_ALLOW_UNAUTHENTICATED")) return Status::OK();
    return Status::Config(
        "BYTEPS_SECRET is not set: every p2p link proves knowledge of the job secret (bpslaunch "
        "generates one), or set BYTEPS_ALLOW_UNAUTHENTICATED=1 to run without authentication");
  }

  P2pChannel* ch() {
    if (!ch_) ThrowStatus(Status::Shutdown("p2p channel is closed"));
    return ch_.get();
  }

  void Connect(int peer, const std::string& host, int port, double timeout_s) {
    P2pChannel* c = ch();
    Status st;
    {
      py::gil_scoped_release nogil;
      st = c->Connect(peer, host, port, timeout_s);
    }
    Check(st);
  }
  void WaitInbound(const std::vector<int>& peers, double timeout_s) {
    P2pChannel* c = ch();
    Status st;
    {
      py::gil_scoped_release nogil;
      st = c->WaitInbound(peers, timeout_s);
    }
    Check(st);
  }
  uint64_t IsendPtr(int peer, uint64_t tag, uintptr_t ptr, size_t nbytes) {
    if (!ptr && nbytes) ThrowInvalidArgument("p2p send: a null address for " +
                                             std::to_string(nbytes) + " bytes");
    P2pChannel::OpId id = 0;
    Check(ch()->Isend(peer, tag, reinterpret_cast<const void*>(ptr), nbytes, &id));
    return id;
  }
  uint64_t IrecvPtr(int peer, uint64_t tag, uintptr_t ptr, size_t capacity) {
    if (!ptr) ThrowInvalidArgument("p2p receive: a null address (use irecv() to allocate)");
    P2pChannel::OpId id = 0;
    Check(ch()->Irecv(peer, tag, reinterpret_cast<void*>(ptr), capacity, &id));
    return id;
  }
  uint64_t Irecv(int peer, uint64_t tag) {
    P2pChannel::OpId id = 0;
    Check(ch()->Irecv(peer, tag, nullptr, 0, &id));
    return id;
  }
  py::object Wait(uint64_t id, double timeout_s) {
    P2pChannel* c = ch();
    size_t nbytes = 0;
    auto msg = std::make_unique<P2pMessage>();
    Status st;
    {
      py::gil_scoped_release nogil;
      st = c->Wait(id, timeout_s, &nbytes, &msg->buf);
    }
    Check(st);
    if (!msg->buf.data) return py::make_tuple(nbytes, py::none());
    return py::make_tuple(nbytes, py::cast(std::move(msg)));
  }
  bool Test(uint64_t id) { return ch()->Test(id); }
  void CheckFailure() { Check(ch()->failure()); }
  void Close(double flush_timeout_s) {
    std::unique_ptr<P2pChannel> c = std::move(ch_);
    if (!c) return;
    py::gil_scoped_release nogil;
    c->Close(flush_timeout_s);
    c.reset();
  }

 private:
  std::unique_ptr<P2pChannel> ch_;
};

}  // namespace

void BindP2p(py::module_& m) {
  py::class_<P2pMessage>(m, "P2pMessage", py::buffer_protocol(),
                         "A received message the channel allocated: a read-only 1-D uint8 "
                         "buffer (bytes(m), memoryview(m), torch.frombuffer(m)).")
      .def_buffer([](P2pMessage& msg) {
        return py::buffer_info(msg.buf.data.get(), 1, py::format_descriptor<uint8_t>::format(),
                               1, {static_cast<py::ssize_t>(msg.buf.size)}, {1}, true);
      })
      .def("__len__", [](const P2pMessage& msg) { return msg.buf.size; });
  py::class_<PyChannel>(m, "P2pChannel",
                        "The worker-to-worker channel (core/cpp/p2p/channel.h): listens at "
                        "once; byteps.p2p wraps it.")
      .def(py::init<int, int, std::string, int, uint64_t, uint64_t, const std::string&>(),
           py::arg("rank"), py::arg("size"), py::arg("host") = "", py::arg("port") = 0,
           py::arg("max_message_bytes") = uint64_t{1} << 30,
           py::arg("max_buffered_bytes") = uint64_t{4} << 30, py::arg("van") = "",
           "Listens at host:port (host '': DMLC_NODE_HOST, DMLC_INTERFACE, the route to the "
           "scheduler, else 127.0.0.1; van '': the job's, from DMLC_ENABLE_RDMA / "
           "DMLC_ENABLE_UCX / BYTEPS_ENABLE_IPC). ConfigError without a job secret.")
      .def_property_readonly("rank", [](PyChannel& c) { return c.ch()->rank(); })
      .def_property_readonly("size", [](PyChannel& c) { return c.ch()->size(); })
      .def_property_readonly("host", [](PyChannel& c) { return c.ch()->host(); })
      .def_property_readonly("port", [](PyChannel& c) { return c.ch()->port(); })
      .def_property_readonly("van_kind", [](PyChannel& c) { return std::string(c.ch()->van_kind()); })
      .def("connect", &PyChannel::Connect, py::arg("peer"), py::arg("host"), py::arg("port"),
           py::arg("timeout_s") = 30.0, "Opens the outbound link to `peer` and says HELLO.")
      .def("wait_inbound", &PyChannel::WaitInbound, py::arg("peers"), py::arg("timeout_s") = 30.0,
           "Waits until every rank in `peers` has linked to this one (BytePSTimeoutError).")
      .def("isend_ptr", &PyChannel::IsendPtr, py::arg("peer"), py::arg("tag"), py::arg("ptr"),
           py::arg("nbytes"), "Queues nbytes at address ptr for `peer` under `tag`; an op id.")
      .def("irecv_ptr", &PyChannel::IrecvPtr, py::arg("peer"), py::arg("tag"), py::arg("ptr"),
           py::arg("capacity"),
           "Posts a receive of `peer`'s next `tag` message into ptr (at most capacity bytes).")
      .def("irecv", &PyChannel::Irecv, py::arg("peer"), py::arg("tag"),
           "Posts a receive into a buffer the channel allocates (wait() returns it).")
      .def("wait", &PyChannel::Wait, py::arg("op"), py::arg("timeout_s"),
           "(nbytes, P2pMessage or None). BytePSTimeoutError leaves the op pending; "
           "PeerLostError, InvalidArgumentError, NotInitializedError (closed) retire it.")
      .def("test", &PyChannel::Test, py::arg("op"), "True when wait() would return at once.")
      .def("check", &PyChannel::CheckFailure, "Raises the channel's failure (PeerLostError).")
      .def("close", &PyChannel::Close, py::arg("flush_timeout_s") = 5.0,
           "GOODBYE to every peer, then closes every link. Idempotent.");
}

}  // namespace python
}  // namespace byteps
