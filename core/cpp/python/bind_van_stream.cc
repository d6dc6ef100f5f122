// byteps._core.testing.van_stream: many frames from several threads over one loopback connection
// of a van (comm/van.h), the receiver pausing first so that the sending side backs up: every
// frame must reach the receiver in its thread's order, byte-exact, and complete (the UCX van's
// senders hand frames to UCX themselves while its progress thread sleeps, others queue them).
#include <pybind11/stl.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bindings.h"
#include "comm/van.h"

namespace py = pybind11;

namespace byteps {
namespace python {
namespace {

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

class SilentSender : public ConnectionHandler {
 public:
  Status ValidateHeader(const FrameHeader&) override { return Status::OK(); }
  Status OnHeader(Connection*, const FrameHeader&, void**) override { return Status::OK(); }
  void OnFrame(Connection*, const FrameHeader&, void*) override {}
  void OnClosed(Connection*, const Status&) override {}
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
  SilentSender sender_handler;
  Van::ListenOptions opts;
  opts.owner = "van stream";
  opts.handler = &receiver;
  opts.peer_name = "stream sender";
  int port = 0;
  Check(van->Listen(
      "127.0.0.1", 0, opts,
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

}  // namespace

void BindVanStreamTesting(py::module_& m) {
  m.def("van_stream", &Stream, py::arg("kind"), py::arg("threads"), py::arg("frames"),
        py::arg("bytes"), py::arg("pause_s") = 0.0, py::arg("timeout_s") = 60.0,
        "`threads` threads each send `frames` frames of `bytes` bytes over one loopback "
        "connection of a van of `kind`; the receiver sleeps pause_s after the first. Returns "
        "{'completed', 'failed', 'received', 'out_of_order', 'corrupt'}.");
}

}  // namespace python
}  // namespace byteps
