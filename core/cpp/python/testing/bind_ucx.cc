// byteps._core_testing.UcxTestPeer: one UCX context with a recording link handler, for the UCX
// transport's tests (tests/test_ucx_transport.py). Two peers in one process connect by
// exchanging worker addresses; nothing of ours opens a socket. Not a public API.
// ucx_available says whether this build has the UCX transport.
#include <cstdint>
#include <pybind11/stl.h>

#include "testing_bindings.h"

#ifdef BYTEPS_WITH_UCX
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "comm/ucx/ucx_connection.h"
#include "comm/ucx/ucx_context.h"
#include "ps/protocol.h"
#endif

namespace py = pybind11;

namespace byteps {
namespace python {

#ifdef BYTEPS_WITH_UCX
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Receive policies by frame key (the receiver chooses each payload's destination). kSink: into
// the prepared buffer through Connection::StreamPayload with a sink that adds 1 to every byte.
enum class Policy { kOwn, kBuffer, kScratch, kDiscard, kReject, kSink };
constexpr size_t kMaxOwnBytes = 256ull << 20;

// The PS layer's header checks (ValidatePsHeader), as every real handler has them.
class UcxTestPeer : public PsConnectionHandler {
 public:
  explicit UcxTestPeer(const std::string& name, const std::string& default_tls = "",
                       double spin_s = 0, const std::string& one_way = "auto") {
    const UcxOneWay mode = one_way == "1" ? UcxOneWay::kOn
                           : one_way == "0" ? UcxOneWay::kOff
                                            : UcxOneWay::kAuto;
    Check(UcxContext::Create(name, &ctx_, default_tls, spin_s, mode));
    SetRefuse(false);
  }
  ~UcxTestPeer() override { Shutdown(false); }

  py::bytes address() const { return py::bytes(ctx_ ? ctx_->address() : std::string()); }
  std::string config_summary() const { return ctx_ ? ctx_->config_summary() : ""; }

  int Connect(const std::string& addr, double timeout_s, const std::string& name) {
    std::unique_ptr<Connection> conn;
    Status st;
    {
      py::gil_scoped_release nogil;
      st = Ctx()->Connect(addr, name, this, timeout_s, &conn);
    }
    Check(st);
    std::lock_guard<std::mutex> lk(mu_);
    conn->tag = static_cast<int>(conns_.size());
    conn->Start();
    conns_.push_back(std::move(conn));
    return conns_.back()->tag;
  }

  int Accept(double timeout_s) {
    int id = -1;
    {
      py::gil_scoped_release nogil;
      std::unique_lock<std::mutex> lk(mu_);
      if (cv_.wait_for(lk, std::chrono::duration<double>(timeout_s),
                       [&] { return !accepted_.empty(); })) {
        id = accepted_.front();
        accepted_.pop_front();
      }
    }
    if (id < 0) ThrowStatus(Status::Timeout("no UCX link accepted within the timeout"));
    return id;
  }

  void SetRefuse(bool refuse) {
    if (refuse) {
      Ctx()->SetAcceptHandler(nullptr, nullptr);
      return;
    }
    Ctx()->SetAcceptHandler(this, [this](std::unique_ptr<Connection> c) {
      std::lock_guard<std::mutex> lk(mu_);
      c->tag = static_cast<int>(conns_.size());
      if (autostart_) c->Start();
      accepted_.push_back(c->tag);
      conns_.push_back(std::move(c));
      cv_.notify_all();
    });
  }
  // Accepted connections are started at once (default) or by Start(link).
  void SetAutostart(bool on) {
    std::lock_guard<std::mutex> lk(mu_);
    autostart_ = on;
  }
  void Start(int link) { Conn(link)->Start(); }

  void SetPolicy(uint64_t key, const std::string& mode) {
    static const std::map<std::string, Policy> names = {
        {"own", Policy::kOwn}, {"buffer", Policy::kBuffer}, {"scratch", Policy::kScratch},
        {"discard", Policy::kDiscard}, {"reject", Policy::kReject}, {"sink", Policy::kSink}};
    auto it = names.find(mode);
    if (it == names.end()) ThrowInvalidArgument("unknown receive policy " + mode);
    std::lock_guard<std::mutex> lk(mu_);
    policy_[key] = it->second;
  }

  // A receiver-chosen buffer for `key` (optionally registered with UCX): policy "buffer".
  void Prepare(uint64_t key, size_t size, bool reg) {
    auto buf = std::make_shared<Buffer>();
    buf->data.assign(size, '\xee');
    buf->ptr = &buf->data[0];
    buf->size = size;
    if (reg) Check(Ctx()->RegisterMemory(buf->ptr, size));
    std::lock_guard<std::mutex> lk(mu_);
    buffers_[key] = buf;
    policy_[key] = Policy::kBuffer;
  }
  // The same from UcxContext::AllocateShared (a slab's slot; unmapped at shutdown).
  py::int_ PrepareShared(uint64_t key, size_t size) {
    auto buf = std::make_shared<Buffer>();
    void* p = nullptr;
    Check(Ctx()->AllocateShared(size, &p));
    buf->ptr = static_cast<char*>(p);
    buf->size = size;
    buf->shared = true;
    memset(buf->ptr, 0xee, size);
    std::lock_guard<std::mutex> lk(mu_);
    buffers_[key] = buf;
    policy_[key] = Policy::kBuffer;
    return py::int_(reinterpret_cast<uintptr_t>(p));
  }
  // A window on the buffer prepared for `key` (its first `size` bytes; 0: all), for the peer of
  // `link`: the blob to hand to the peer's open_window.
  py::bytes ExportWindow(int link, uint64_t key, size_t size) {
    Connection* c = Conn(link);
    char* ptr;
    size_t len;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = buffers_.find(key);
      if (it == buffers_.end()) ThrowInvalidArgument("no buffer prepared for this key");
      ptr = it->second->ptr;
      len = size ? size : it->second->size;
    }
    std::string blob;
    Status st;
    {
      py::gil_scoped_release nogil;
      st = c->ExportWindow(ptr, len, &blob);
    }
    Check(st);
    return py::bytes(blob);
  }
  uint32_t OpenWindow(int link, const std::string& blob) {
    Connection* c = Conn(link);
    uint32_t id = 0;
    Status st;
    {
      py::gil_scoped_release nogil;
      st = c->OpenWindow(blob, &id);
    }
    Check(st);
    return id;
  }

  // RegisterMemory / UnregisterMemory of the buffer prepared for `key` (errors raise).
  void RegisterBuffer(uint64_t key, bool reg) {
    void* addr;
    size_t size;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = buffers_.find(key);
      if (it == buffers_.end()) ThrowInvalidArgument("no buffer prepared for this key");
      addr = it->second->ptr;
      size = it->second->size;
    }
    Check(reg ? Ctx()->RegisterMemory(addr, size) : Ctx()->UnregisterMemory(addr));
  }

  py::bytes BufferBytes(uint64_t key) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = buffers_.find(key);
    if (it == buffers_.end()) ThrowInvalidArgument("no buffer prepared for this key");
    if (it->second->shared && !ctx_) ThrowInvalidArgument("shared memory gone with the context");
    return py::bytes(it->second->ptr, it->second->size);
  }

  int Stage(const std::string& data, bool reg) {
    auto buf = std::make_shared<Buffer>();
    buf->data = data;
    if (reg && !data.empty()) Check(Ctx()->RegisterMemory(&buf->data[0], data.size()));
    std::lock_guard<std::mutex> lk(mu_);
    staged_.push_back(buf);
    return static_cast<int>(staged_.size()) - 1;
  }

  // Sends a frame: the staged buffer `staged` (no copy) or a copy of `payload`; through the
  // peer's window `window` (open_window) when not 0, `offset` bytes into it.
  void Send(int link, uint64_t key, uint16_t type, int staged, const std::string& payload,
            uint32_t window, uint64_t offset) {
    Connection* l = Conn(link);
    std::unique_ptr<SendItem> owner(new SendItem);
    SendItem* item = owner.get();
    item->heap = true;
    item->window = window;
    item->window_offset = offset;
    item->hdr.type = type;
    item->hdr.key = key;
    if (staged >= 0) {
      std::lock_guard<std::mutex> lk(mu_);
      if (staged >= static_cast<int>(staged_.size())) ThrowInvalidArgument("no such staged buffer");
      item->payload = staged_[staged]->data.data();
      item->len = staged_[staged]->data.size();
    } else {
      item->owned = payload;
      item->payload = item->owned.data();
      item->len = item->owned.size();
    }
    item->done = &UcxTestPeer::SendDone;
    item->arg = new SendRec{this, key, Now()};
    l->Send(owner.release());
  }

  py::list WaitSent(size_t count, double timeout_s) {
    std::vector<std::tuple<uint64_t, std::string, std::string, double, double>> out;
    {
      py::gil_scoped_release nogil;
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait_for(lk, std::chrono::duration<double>(timeout_s),
                   [&] { return sent_.size() >= count; });
      while (!sent_.empty() && out.size() < count) {
        out.push_back(sent_.front());
        sent_.pop_front();
      }
    }
    py::list l;
    for (auto& t : out) l.append(py::make_tuple(std::get<0>(t), std::get<1>(t), std::get<2>(t),
                                                std::get<3>(t), std::get<4>(t)));
    return l;
  }

  py::object Recv(double timeout_s) {
    Rx rx;
    bool got = false;
    {
      py::gil_scoped_release nogil;
      std::unique_lock<std::mutex> lk(mu_);
      if (cv_.wait_for(lk, std::chrono::duration<double>(timeout_s),
                       [&] { return !received_.empty(); })) {
        rx = std::move(received_.front());
        received_.pop_front();
        got = true;
      }
    }
    if (!got) return py::none();
    py::dict d;
    d["link"] = rx.link;
    d["key"] = rx.h.key;
    d["type"] = rx.h.type;
    d["payload_len"] = rx.h.payload_len;
    d["written"] = rx.h.written;
    d["mode"] = rx.mode;
    d["payload"] = rx.has_copy ? py::object(py::bytes(rx.copy)) : py::object(py::none());
    d["payload_is_null"] = rx.null_payload;
    d["in_prepared_buffer"] = rx.in_buffer;
    d["sink_chunks"] = rx.chunks;
    d["t"] = rx.t;
    return d;
  }

  py::object WaitClosed(int link, double timeout_s) {
    Status st;
    bool got = false;
    {
      py::gil_scoped_release nogil;
      std::unique_lock<std::mutex> lk(mu_);
      got = cv_.wait_for(lk, std::chrono::duration<double>(timeout_s),
                         [&] { return closed_.count(link) > 0; });
      if (got) st = closed_[link];
    }
    if (!got) return py::none();
    return py::make_tuple(StatusCodeName(st.code()), st.message());
  }

  void Close(int link) { Conn(link)->Close(); }
  bool Join(int link, double timeout_s) {
    UcxLink* l = Link(link);
    py::gil_scoped_release nogil;
    return l->Join(timeout_s);
  }
  bool Flush(int link, double timeout_s) {
    Connection* c = Conn(link);
    py::gil_scoped_release nogil;
    return c->Flush(timeout_s);
  }
  std::string Describe(int link) {
    UcxLink* l = Link(link);
    py::gil_scoped_release nogil;
    return l->Describe();
  }
  bool PeerFailureDetection(int link) { return Link(link)->peer_failure_detection(); }
  py::dict Stats(int link) {
    UcxLink::Stats s = Link(link)->stats();
    py::dict d;
    d["frames_sent"] = s.frames_sent;
    d["frames_received"] = s.frames_received;
    d["eager_received"] = s.eager_received;
    d["rndv_received"] = s.rndv_received;
    d["held_max"] = s.held_max;
    d["direct_sent"] = s.direct_sent;
    d["one_way_sent"] = s.one_way_sent;
    d["one_way_received"] = s.one_way_received;
    d["one_way"] = Link(link)->one_way_why().empty();
    d["one_way_why"] = Link(link)->one_way_why();
    d["one_way_min"] = Link(link)->one_way_min();
    return d;
  }

  // The context first (abrupt: nothing said to the peers), then the connections' handles.
  void Shutdown(bool abrupt) {
    if (!ctx_) return;
    std::vector<std::unique_ptr<Connection>> conns;
    {
      py::gil_scoped_release nogil;
      ctx_->Shutdown(abrupt);
      std::lock_guard<std::mutex> lk(mu_);
      conns.swap(conns_);
    }
    conns.clear();
    ctx_.reset();
  }

  // UcxLinkHandler (progress thread).
  Status OnHeader(Connection* l, const FrameHeader& h, void** dest) override {
    std::lock_guard<std::mutex> lk(mu_);
    Policy p = policy_.count(h.key) ? policy_[h.key] : Policy::kOwn;
    Rx& rx = current_[l->tag];
    rx = Rx();
    rx.link = l->tag;
    rx.h = h;
    switch (p) {
      case Policy::kOwn:
        if (h.payload_len > kMaxOwnBytes) return Status::InvalidArgument("test: too large");
        rx.mode = "own";
        rx.copy.resize(h.payload_len);
        *dest = h.payload_len ? &rx.copy[0] : nullptr;
        rx.has_copy = true;
        break;
      case Policy::kBuffer:
      case Policy::kSink: {
        auto& buf = buffers_[h.key];
        if (!buf || buf->size < h.payload_len)
          return Status::InvalidArgument("test: prepared buffer too small");
        rx.mode = p == Policy::kSink ? "sink" : "buffer";
        *dest = buf->ptr;
        if (p == Policy::kSink) l->StreamPayload(&UcxTestPeer::AddOneSink, this);
        break;
      }
      case Policy::kScratch:
        rx.mode = "scratch";
        break;
      case Policy::kDiscard:
        rx.mode = "discard";
        *dest = Connection::kDiscard;
        break;
      case Policy::kReject:
        return Status::InvalidArgument("test: the receiver rejects key " + std::to_string(h.key));
    }
    rx.dest = *dest;
    return Status::OK();
  }

  void OnFrame(Connection* l, const FrameHeader& h, void* payload) override {
    std::lock_guard<std::mutex> lk(mu_);
    Rx rx = std::move(current_[l->tag]);
    current_.erase(l->tag);
    rx.t = Now();
    rx.null_payload = payload == nullptr;
    if (rx.mode == "scratch" && payload) {
      rx.copy.assign(static_cast<const char*>(payload), h.payload_len);
      rx.has_copy = true;
    }
    if (rx.mode == "buffer" || rx.mode == "sink") rx.in_buffer = payload == rx.dest;
    if (rx.mode == "sink") rx.chunks.swap(sink_chunks_);
    if (rx.mode == "own") rx.in_buffer = payload == rx.dest || h.payload_len == 0;
    received_.push_back(std::move(rx));
    cv_.notify_all();
  }

  void OnClosed(Connection* l, const Status& why) override {
    std::lock_guard<std::mutex> lk(mu_);
    closed_[l->tag] = why;
    cv_.notify_all();
  }

 private:
  struct Buffer {
    std::string data;     // prepare(): the storage
    char* ptr = nullptr;  // the buffer (into data, or a slab's slot)
    size_t size = 0;
    bool shared = false;  // prepare_shared()
  };
  struct Rx {
    int link = -1;
    FrameHeader h;
    std::string mode;
    std::string copy;
    bool has_copy = false;
    bool null_payload = false;
    bool in_buffer = false;
    std::vector<size_t> chunks;  // sizes the sink saw
    void* dest = nullptr;
    double t = 0;
  };
  struct SendRec {
    UcxTestPeer* peer;
    uint64_t key;
    double t0;
  };

  // Writes chunk + 1 (every byte) to dst; the progress thread, between OnHeader and OnFrame.
  static void AddOneSink(void* arg, char* dst, char* chunk, size_t len) {
    auto* self = static_cast<UcxTestPeer*>(arg);
    for (size_t i = 0; i < len; ++i) chunk[i] = static_cast<char>(chunk[i] + 1);
    memcpy(dst, chunk, len);
    std::lock_guard<std::mutex> lk(self->mu_);
    self->sink_chunks_.push_back(len);
  }

  static void SendDone(void* arg, const Status& st) {
    auto* rec = static_cast<SendRec*>(arg);
    UcxTestPeer* self = rec->peer;
    {
      std::lock_guard<std::mutex> lk(self->mu_);
      self->sent_.emplace_back(rec->key, StatusCodeName(st.code()), st.message(), rec->t0, Now());
    }
    self->cv_.notify_all();
    delete rec;
  }

  UcxContext* Ctx() {
    if (!ctx_) ThrowStatus(Status::Shutdown("this UCX test peer has shut down"));
    return ctx_.get();
  }
  Connection* Conn(int id) {
    std::lock_guard<std::mutex> lk(mu_);
    if (id < 0 || id >= static_cast<int>(conns_.size()) || !conns_[id])
      ThrowInvalidArgument("no such link");
    return conns_[id].get();
  }
  UcxLink* Link(int id) { return static_cast<UcxConnection*>(Conn(id))->link(); }

  std::unique_ptr<UcxContext> ctx_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool autostart_ = true;
  std::vector<std::unique_ptr<Connection>> conns_;
  std::vector<size_t> sink_chunks_;
  std::deque<int> accepted_;
  std::map<uint64_t, Policy> policy_;
  std::map<uint64_t, std::shared_ptr<Buffer>> buffers_;
  std::vector<std::shared_ptr<Buffer>> staged_;
  std::map<int, Rx> current_;
  std::deque<Rx> received_;
  std::deque<std::tuple<uint64_t, std::string, std::string, double, double>> sent_;
  std::map<int, Status> closed_;
};

}  // namespace
#endif  // BYTEPS_WITH_UCX

void BindUcx(py::module_& m) {
#ifdef BYTEPS_WITH_UCX
  m.attr("ucx_available") = true;
  py::class_<UcxTestPeer>(m, "UcxTestPeer")
      .def(py::init<const std::string&, const std::string&, double, const std::string&>(),
           py::arg("name"), py::arg("default_tls") = std::string(), py::arg("spin_s") = 0.0,
           py::arg("one_way") = "auto")
      .def_property_readonly("address", &UcxTestPeer::address)
      .def_property_readonly("config_summary", &UcxTestPeer::config_summary)
      .def("connect", &UcxTestPeer::Connect, py::arg("address"), py::arg("timeout") = 10.0,
           py::arg("name") = "peer")
      .def("accept", &UcxTestPeer::Accept, py::arg("timeout") = 10.0)
      .def("set_refuse", &UcxTestPeer::SetRefuse)
      .def("set_autostart", &UcxTestPeer::SetAutostart)
      .def("start", &UcxTestPeer::Start)
      .def("set_policy", &UcxTestPeer::SetPolicy, py::arg("key"), py::arg("mode"))
      .def("prepare", &UcxTestPeer::Prepare, py::arg("key"), py::arg("size"),
           py::arg("register") = false)
      .def("buffer", &UcxTestPeer::BufferBytes, py::arg("key"))
      .def("prepare_shared", &UcxTestPeer::PrepareShared, py::arg("key"), py::arg("size"))
      .def("export_window", &UcxTestPeer::ExportWindow, py::arg("link"), py::arg("key"),
           py::arg("size") = 0)
      .def("open_window", &UcxTestPeer::OpenWindow, py::arg("link"), py::arg("blob"))
      .def("register_buffer", &UcxTestPeer::RegisterBuffer, py::arg("key"),
           py::arg("register") = true)
      .def("stage", &UcxTestPeer::Stage, py::arg("data"), py::arg("register") = false)
      .def("send", &UcxTestPeer::Send, py::arg("link"), py::arg("key"), py::arg("type") = 21,
           py::arg("staged") = -1, py::arg("payload") = std::string(), py::arg("window") = 0,
           py::arg("offset") = 0)
      .def("wait_sent", &UcxTestPeer::WaitSent, py::arg("count") = 1, py::arg("timeout") = 10.0)
      .def("recv", &UcxTestPeer::Recv, py::arg("timeout") = 10.0)
      .def("wait_closed", &UcxTestPeer::WaitClosed, py::arg("link"), py::arg("timeout") = 10.0)
      .def("close", &UcxTestPeer::Close)
      .def("join", &UcxTestPeer::Join, py::arg("link"), py::arg("timeout") = 5.0)
      .def("flush", &UcxTestPeer::Flush, py::arg("link"), py::arg("timeout") = 10.0)
      .def("describe", &UcxTestPeer::Describe)
      .def("peer_failure_detection", &UcxTestPeer::PeerFailureDetection)
      .def("stats", &UcxTestPeer::Stats)
      .def("shutdown", &UcxTestPeer::Shutdown, py::arg("abrupt") = false);
#else
  m.attr("ucx_available") = false;
#endif
}

}  // namespace python
}  // namespace byteps
