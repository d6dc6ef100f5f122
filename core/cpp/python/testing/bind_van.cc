// byteps._core_testing.van_*: the van seam (comm/van.h) on its own, without the PS protocol: a
// loopback connection over 127.0.0.1 through a van of a given kind (or one van listening and a
// van of another kind connecting); van_stream: many frames from several threads over one such
// connection while the receiver pauses first, so that the sending side backs up (each thread's
// frames must arrive in order, byte-exact, and complete: the UCX van's senders hand frames to
// UCX themselves while its progress thread sleeps, others queue them); and in UCX builds
// UcxVanProbe: a UCX van's listener beside a stranger's UCX context that tries to open
// links to it without the bootstrap.
#include <cstdint>
#include <pybind11/stl.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "testing_bindings.h"
#include "comm/van.h"
#ifdef BYTEPS_WITH_UCX
#include "comm/ucx/ucx_van.h"
#endif

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
  // The connecting side's connection closed (the listener dropped it).
  void SenderClosed(const Status& why) {
    std::lock_guard<std::mutex> lk(mu_);
    sender_closed_ = why.ok() ? Status::PeerLost("connection closed") : why;
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
  Status sender_closed_;
};

// The connecting side ignores what comes back and tells `receiver` (if any) when it closes.
class SilentHandler : public ConnectionHandler {
 public:
  explicit SilentHandler(LoopbackReceiver* receiver = nullptr) : receiver_(receiver) {}
  Status ValidateHeader(const FrameHeader&) override { return Status::OK(); }
  Status OnHeader(Connection*, const FrameHeader&, void**) override { return Status::OK(); }
  void OnFrame(Connection*, const FrameHeader&, void*) override {}
  void OnClosed(Connection*, const Status& why) override {
    if (receiver_) receiver_->SenderClosed(why);
  }

 private:
  LoopbackReceiver* receiver_;
};

struct Received {
  uint16_t type = 0;
  uint64_t aux = 0;
  std::string payload;
  std::string peer;
};

// Van::Listen on 127.0.0.1, any port (*port), every accepted connection to `handler`.
Status ListenOnLoopback(Van* van, ConnectionHandler* handler, const char* owner,
                        const char* peer_name, Van::AcceptFn on_connection, int* port) {
  Van::ListenOptions opts;
  opts.owner = owner;
  opts.handler = handler;
  opts.peer_name = peer_name;
  return van->Listen("127.0.0.1", 0, opts, std::move(on_connection), port);
}

// Listens on 127.0.0.1 (any port) with one van of `kind`, connects with a second van of
// `connect_kind` (as two processes would: a UCX context talks to other contexts), sends one frame
// (header + payload from the caller's memory) and waits until the accepted side has received it
// or dropped it. Between kinds (a job whose nodes select different vans) the listener starts what
// it accepts at once, as a node does, and a connection it drops is the error returned.
Status Loopback(const std::string& kind, const std::string& connect_kind, uint16_t type,
                const std::string& payload, uint64_t aux, int refused_type, double timeout_s,
                Received* out) {
  std::unique_ptr<Van> van, cvan;
  BPS_RETURN_IF_ERROR(Van::Create(kind, &van));
  BPS_RETURN_IF_ERROR(Van::Create(connect_kind, &cvan));
  const bool cross = kind != connect_kind;
  LoopbackReceiver receiver(refused_type);
  receiver.buffer_.resize(payload.size());
  SilentHandler sender_handler(&receiver);
  int port = 0;
  BPS_RETURN_IF_ERROR(ListenOnLoopback(
      van.get(), &receiver, "van loopback", "loopback peer",
      [&receiver, cross](std::unique_ptr<Connection> c) {
        if (cross) c->Start();
        receiver.SetAccepted(std::move(c));
      },
      &port));
  // Registered as a node registers its buffers (empty regions are not registrable).
  if (!payload.empty()) {
    BPS_RETURN_IF_ERROR(van->RegisterMemory(receiver.buffer_.data(), receiver.buffer_.size()));
    BPS_RETURN_IF_ERROR(cvan->RegisterMemory(const_cast<char*>(payload.data()), payload.size()));
  }
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
    if (!receiver.cv_.wait_until(lk, deadline, [&] {
          return receiver.accepted_ != nullptr || !receiver.sender_closed_.ok();
        })) {
      st = Status::Timeout("the loopback connection was not accepted");
    } else if (!receiver.accepted_) {
      st = Status(receiver.sender_closed_.code(),
                  "the listener dropped the connection without handing it out: " +
                      receiver.sender_closed_.message());
    } else {
      Connection* accepted = receiver.accepted_.get();
      lk.unlock();
      if (!cross) accepted->Start();
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
  if (!payload.empty()) {
    cvan->UnregisterMemory(const_cast<char*>(payload.data()));
    van->UnregisterMemory(receiver.buffer_.data());
  }
  van->StopListening();
  return st;
}

// The byte at `i` of frame `index` of sender thread `thread`.
inline char PatternByte(uint32_t thread, uint32_t index, size_t i) {
  return static_cast<char>((thread * 131u + index * 17u + i * 7u) & 0xff);
}

// Receives each frame into a buffer of its own and checks it; the first OnFrame sleeps
// `pause_s` (the sender keeps sending meanwhile).
class StreamReceiver : public ConnectionHandler {
 public:
  explicit StreamReceiver(double pause_s) : pause_s_(pause_s) {}
  Status ValidateHeader(const FrameHeader&) override { return Status::OK(); }
  Status OnHeader(Connection*, const FrameHeader& h, void** dest) override {
    buf_.resize(h.payload_len);
    *dest = buf_.empty() ? nullptr : buf_.data();
    return Status::OK();
  }
  void OnFrame(Connection*, const FrameHeader& h, void*) override {
    if (first_) {
      first_ = false;
      std::this_thread::sleep_for(std::chrono::duration<double>(pause_s_));
    }
    // aux: thread << 32 | index
    const auto thread = static_cast<uint32_t>(h.aux >> 32);
    const auto index = static_cast<uint32_t>(h.aux);
    bool exact = true;
    for (size_t i = 0; i < buf_.size() && exact; ++i)
      exact = buf_[i] == PatternByte(thread, index, i);
    std::lock_guard<std::mutex> lk(mu_);
    if (thread >= next_.size()) next_.resize(thread + 1, 0);
    if (index != next_[thread]) out_of_order_++;
    next_[thread] = index + 1;
    if (!exact) corrupt_++;
    received_++;
    cv_.notify_all();
  }
  void OnClosed(Connection*, const Status&) override {
    std::lock_guard<std::mutex> lk(mu_);
    closed_ = true;
    cv_.notify_all();
  }

  const double pause_s_;
  bool first_ = true;
  std::string buf_;  // receiving thread only
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint32_t> next_;
  size_t received_ = 0, out_of_order_ = 0, corrupt_ = 0;
  bool closed_ = false;
  std::unique_ptr<Connection> accepted_;
};

struct Completions {
  std::mutex mu;
  std::condition_variable cv;
  size_t ok = 0, failed = 0;
  static void Done(void* arg, const Status& st) {
    auto* c = static_cast<Completions*>(arg);
    std::lock_guard<std::mutex> lk(c->mu);
    (st.ok() ? c->ok : c->failed)++;
    c->cv.notify_all();
  }
};

py::dict Stream(const std::string& kind, int threads, int frames, size_t bytes, double pause_s,
                double timeout_s) {
  if (threads < 1 || frames < 1) ThrowInvalidArgument("threads and frames must be positive");
  std::unique_ptr<Van> van, cvan;
  Check(Van::Create(kind, &van));
  Check(Van::Create(kind, &cvan));
  StreamReceiver receiver(pause_s);
  SilentHandler sender_handler;
  int port = 0;
  Check(ListenOnLoopback(
      van.get(), &receiver, "van stream", "stream sender",
      [&receiver](std::unique_ptr<Connection> c) {
        c->Start();
        std::lock_guard<std::mutex> lk(receiver.mu_);
        receiver.accepted_ = std::move(c);
        receiver.cv_.notify_all();
      },
      &port));
  std::unique_ptr<Connection> conn;
  Check(cvan->Connect("127.0.0.1", port, timeout_s, &sender_handler, "stream receiver", &conn));
  conn->Start();
  // Payloads and items live until every frame completed.
  const size_t total = static_cast<size_t>(threads) * static_cast<size_t>(frames);
  std::vector<std::string> payloads(total);
  std::vector<SendItem> items(total);
  Completions done;
  for (int t = 0; t < threads; ++t)
    for (int i = 0; i < frames; ++i) {
      const size_t n = static_cast<size_t>(t) * frames + i;
      payloads[n].resize(bytes);
      for (size_t b = 0; b < bytes; ++b) payloads[n][b] = PatternByte(t, i, b);
      SendItem& item = items[n];
      item.hdr.type = 21;
      item.hdr.aux = (static_cast<uint64_t>(t) << 32) | static_cast<uint32_t>(i);
      item.payload = payloads[n].data();
      item.len = bytes;
      item.done = &Completions::Done;
      item.arg = &done;
    }
  py::dict out;
  {
    py::gil_scoped_release nogil;
    std::vector<std::thread> senders;
    for (int t = 0; t < threads; ++t)
      senders.emplace_back([&, t] {
        for (int i = 0; i < frames; ++i) conn->Send(&items[static_cast<size_t>(t) * frames + i]);
      });
    for (auto& s : senders) s.join();
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    {
      std::unique_lock<std::mutex> lk(done.mu);
      done.cv.wait_until(lk, deadline, [&] { return done.ok + done.failed == total; });
    }
    {
      std::unique_lock<std::mutex> lk(receiver.mu_);
      receiver.cv_.wait_until(lk, deadline,
                              [&] { return receiver.received_ == total || receiver.closed_; });
    }
  }
  {
    std::lock_guard<std::mutex> lk(done.mu);
    out["completed"] = done.ok;
    out["failed"] = done.failed;
  }
  {
    std::lock_guard<std::mutex> lk(receiver.mu_);
    out["received"] = receiver.received_;
    out["out_of_order"] = receiver.out_of_order_;
    out["corrupt"] = receiver.corrupt_;
  }
  {
    py::gil_scoped_release nogil;
    conn->Join();
    std::unique_ptr<Connection> accepted;
    {
      std::lock_guard<std::mutex> lk(receiver.mu_);
      accepted = std::move(receiver.accepted_);
    }
    if (accepted) accepted->Join();
    van->StopListening();
  }
  return out;
}

#ifdef BYTEPS_WITH_UCX
// UcxVanProbe: a UCX van listening on 127.0.0.1, and beside it a stranger's UCX context
// that opens links straight to the listener's worker address with a token of its choosing,
// skipping the bootstrap (comm/ucx/ucx_van.h). The listener hands out (and starts) the
// connections its context accepts; the probe counts them and records how each one closed.
class UcxVanProbe : public ConnectionHandler {
 public:
  UcxVanProbe() {
    std::unique_ptr<Van> van;
    Check(Van::Create("ucx", &van));
    van_.reset(static_cast<UcxVan*>(van.release()));
    Check(ListenOnLoopback(
        van_.get(), this, "ucx van probe", "probe peer",
        [this](std::unique_ptr<Connection> c) {
          c->Start();
          std::lock_guard<std::mutex> lk(mu_);
          accepted_.push_back(std::move(c));
          cv_.notify_all();
        },
        &port_));
    Check(UcxContext::Create("stranger", &stranger_));
  }
  ~UcxVanProbe() override { Close(); }

  Status ValidateHeader(const FrameHeader&) override { return Status::OK(); }
  Status OnHeader(Connection*, const FrameHeader&, void** dest) override {
    *dest = Connection::kDiscard;
    return Status::OK();
  }
  void OnFrame(Connection*, const FrameHeader&, void*) override {}
  void OnClosed(Connection* c, const Status& why) override {
    std::lock_guard<std::mutex> lk(mu_);
    closed_.emplace_back(c, why.ok() ? Status::PeerLost("closed") : why);
    cv_.notify_all();
  }

  int port() const { return port_; }
  py::bytes worker_address() const { return py::bytes(Listener()->context()->address()); }
  size_t accepted() {
    std::lock_guard<std::mutex> lk(mu_);
    return accepted_.size();
  }
  // A link from the stranger's context to `address` whose CONNECT carries `token`; raises the
  // error (PeerLostError when refused). Kept open until close().
  void RawConnect(const std::string& address, uint64_t token, double timeout_s) {
    if (!stranger_) ThrowStatus(Status::Shutdown("this probe is closed"));
    std::unique_ptr<Connection> conn;
    Status st;
    {
      py::gil_scoped_release nogil;
      st = stranger_->Connect(address, "ucx van listener", &silent_, timeout_s, &conn, token);
    }
    Check(st);
    conn->Start();
    links_.push_back(std::move(conn));
  }
  // Waits at most timeout_s for accepted connection `i` to close: (status code name, message),
  // or None if it is still open.
  py::object WaitClosed(size_t i, double timeout_s) {
    Status why;
    {
      py::gil_scoped_release nogil;
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), [&] { return Find(i, &why); });
    }
    if (why.ok()) return py::none();
    return py::make_tuple(StatusCodeName(why.code()), why.message());
  }
  // Closes the stranger's links and the accepted connections, then both contexts. The accepted
  // connections, joined, are destroyed after their van, as comm/van.h allows.
  void Close() {
    py::gil_scoped_release nogil;
    for (auto& c : links_) c->Join();
    links_.clear();
    std::vector<std::unique_ptr<Connection>> accepted;
    {
      std::lock_guard<std::mutex> lk(mu_);
      accepted.swap(accepted_);
    }
    for (auto& c : accepted) c->Join();
    if (stranger_) stranger_->Shutdown();
    stranger_.reset();
    van_.reset();
    accepted.clear();
  }

 private:
  UcxVan* Listener() const {
    if (!van_) ThrowStatus(Status::Shutdown("this probe is closed"));
    return van_.get();
  }
  bool Find(size_t i, Status* why) {  // mu_ held
    if (i >= accepted_.size()) return false;
    for (auto& [c, st] : closed_)
      if (c == accepted_[i].get()) return (*why = st), true;
    return false;
  }

  std::unique_ptr<UcxVan> van_;
  std::unique_ptr<UcxContext> stranger_;
  SilentHandler silent_;
  int port_ = 0;
  std::vector<std::unique_ptr<Connection>> links_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Connection>> accepted_;
  std::vector<std::pair<Connection*, Status>> closed_;
};
#endif  // BYTEPS_WITH_UCX

}  // namespace

void BindVan(py::module_& m) {
  m.def("van_stream", &Stream, py::arg("kind"), py::arg("threads"), py::arg("frames"),
        py::arg("bytes"), py::arg("pause_s") = 0.0, py::arg("timeout_s") = 60.0,
        "`threads` threads each send `frames` frames of `bytes` bytes over one loopback "
        "connection of a van of `kind`; the receiver sleeps pause_s after the first. Returns "
        "{'completed', 'failed', 'received', 'out_of_order', 'corrupt'}.");
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
         int refused_type, double timeout_s, const std::string& connect_kind) {
        std::string data = payload;
        Received got;
        Status st;
        {
          py::gil_scoped_release nogil;
          st = Loopback(kind, connect_kind.empty() ? kind : connect_kind, type, data, aux,
                        refused_type, timeout_s, &got);
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
      py::arg("refused_type") = -1, py::arg("timeout_s") = 10.0, py::arg("connect_kind") = "",
      "Sends one frame over a loopback connection of a van of `kind` and returns what the "
      "receiving side got: {'type', 'aux', 'payload', 'peer'}. A type equal to refused_type is "
      "refused by the receiving handler's ValidateHeader (the error is raised). connect_kind "
      "(default: kind) is the kind of the connecting van: between kinds, the connection the "
      "listener drops, or the connect that fails, raises its error.");
#ifdef BYTEPS_WITH_UCX
  py::class_<UcxVanProbe>(m, "UcxVanProbe",
                          "A UCX van listening on 127.0.0.1 (any port) and a stranger's UCX "
                          "context beside it that opens links to the listener's worker address "
                          "without the van's bootstrap, with a token of its choosing.")
      .def(py::init<>())
      .def_property_readonly("port", &UcxVanProbe::port, "The listener's TCP port (int).")
      .def_property_readonly("worker_address", &UcxVanProbe::worker_address,
                             "The listener's UCX worker address (bytes, opaque).")
      .def_property_readonly("accepted", &UcxVanProbe::accepted,
                             "Connections the listener handed out so far (int).")
      .def("raw_connect", &UcxVanProbe::RawConnect, py::arg("address"), py::arg("token"),
           py::arg("timeout_s") = 5.0,
           "Opens a link from the stranger's context to the UCX worker at `address` (bytes) "
           "whose CONNECT carries `token` (u64); raises PeerLostError when the listener refuses "
           "it (BytePSTimeoutError when nothing answers within timeout_s).")
      .def("wait_closed", &UcxVanProbe::WaitClosed, py::arg("index"), py::arg("timeout_s") = 5.0,
           "(status code name, e.g. PEER_LOST, message) once accepted connection `index` has "
           "closed, or None if it is still open after timeout_s seconds.")
      .def("close", &UcxVanProbe::Close, "Closes every link and both UCX contexts.");
#endif
}

}  // namespace python
}  // namespace byteps
