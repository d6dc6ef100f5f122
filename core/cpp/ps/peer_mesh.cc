// The worker mesh: listening, connecting, PEER_HELLO / PEER_GOODBYE, and handing COLLECTIVE
// frames to the worker core (peer_mesh.h).
#include "ps/peer_mesh.h"

#include <cstdint>
#include <unistd.h>

#include <chrono>

#include "common/logging.h"

namespace byteps {

PeerMesh::PeerMesh(int me, int num_worker, std::vector<int> peers, CollectiveSink* sink,
                   StateFn failed, StateFn stopping)
    : me_(me),
      num_worker_(num_worker),
      peers_(std::move(peers)),
      sink_(sink),
      failed_(std::move(failed)),
      stopping_(std::move(stopping)),
      by_peer_(static_cast<size_t>(num_worker), nullptr),
      expected_(static_cast<size_t>(num_worker), false),
      left_(new std::atomic<bool>[static_cast<size_t>(num_worker)]) {
  for (int i = 0; i < num_worker; ++i) left_[i] = false;
  for (int p : peers_) expected_[static_cast<size_t>(p)] = true;
}

PeerMesh::~PeerMesh() { Close(); }

Status PeerMesh::Listen(Van* van, const std::string& host, int* port) {
  van_ = van;
  Van::ListenOptions opts;
  opts.owner = "worker " + std::to_string(me_);
  opts.handshake_timeout_s = 5;
  opts.handler = this;
  opts.peer_name = "unidentified worker";
  return van->Listen(
      host, 0, opts, [this](std::unique_ptr<Connection> c) { OnAccepted(std::move(c)); }, port);
}

void PeerMesh::OnAccepted(std::unique_ptr<Connection> conn) {
  Connection* raw = conn.get();
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (closing_) return;
    conns_.push_back(std::move(conn));
  }
  raw->Start();
}

Status PeerMesh::Connect(const std::vector<WorkerEntry>& book, double timeout_s) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  const std::vector<int>& peers = peers_;
  for (int p : peers)  // a peer without the mesh would never connect or be reached
    if (static_cast<size_t>(p) >= book.size() || book[p].port == 0)
      return Status::Config("worker machine " + std::to_string(p) +
                            " has no worker-mesh port in the address book: every worker must "
                            "run with the same BYTEPS_ENABLE_ASYNC (asynchronous training sets "
                            "up no mesh)");
  for (int p : peers) {
    if (p >= me_) continue;
    const std::string name = "worker machine " + std::to_string(p) + " at " + book[p].host +
                             ":" + std::to_string(book[p].port);
    std::unique_ptr<Connection> conn;
    Status st = van_->Connect(book[p].host, static_cast<int>(book[p].port), timeout_s, this,
                              name, &conn);
    if (!st.ok()) return Status(st.code(), "cannot reach " + name + ": " + st.message());
    conn->tag = p;
    Connection* raw = conn.get();
    {
      std::lock_guard<std::mutex> lk(mu_);
      conns_.push_back(std::move(conn));
      by_peer_[static_cast<size_t>(p)] = raw;
    }
    raw->Start();
    raw->SendControl(MsgType::kPeerHello, "", 0, static_cast<uint32_t>(me_));
  }
  std::unique_lock<std::mutex> lk(mu_);
  auto missing = [&] {
    std::string m;
    for (int p : peers)
      if (!by_peer_[static_cast<size_t>(p)]) m += (m.empty() ? "" : ", ") + std::to_string(p);
    return m;
  };
  if (!cv_.wait_until(lk, deadline, [&] { return missing().empty() || closing_; }))
    return Status::Timeout("worker machines [" + missing() + "] did not connect to worker " +
                           std::to_string(me_) + "'s mesh within " +
                           std::to_string(static_cast<int>(timeout_s)) + " s");
  return Status::OK();
}

bool PeerMesh::Connected(int peer) const {
  std::lock_guard<std::mutex> lk(mu_);
  return peer >= 0 && peer < num_worker_ && by_peer_[static_cast<size_t>(peer)] != nullptr;
}

void PeerMesh::Send(int peer, SendItem* item) {
  Connection* c = nullptr;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (peer >= 0 && peer < num_worker_) c = by_peer_[static_cast<size_t>(peer)];
  }
  if (c) return c->Send(item);
  if (item->done)
    item->done(item->arg, Status::PeerLost("no connection to worker machine " +
                                           std::to_string(peer)));
}

void PeerMesh::Goodbye() {
  std::vector<Connection*> peers;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (Connection* c : by_peer_)
      if (c) peers.push_back(c);
  }
  for (Connection* c : peers)
    c->SendControl(MsgType::kPeerGoodbye, "", 0, static_cast<uint32_t>(me_));
  for (Connection* c : peers) c->Flush(2.0);
}

void PeerMesh::Abort(uint32_t key, uint32_t round, const std::string& text) {
  std::vector<Connection*> peers;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (size_t p = 0; p < by_peer_.size(); ++p)
      if (by_peer_[p] && !left_[p]) peers.push_back(by_peer_[p]);
  }
  for (Connection* c : peers)
    c->SendControl(MsgType::kPeerAbort, text.substr(0, 4096), key, static_cast<uint32_t>(me_),
                   round);
}

void PeerMesh::Close() {
  std::vector<Connection*> all;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (closing_ && conns_.empty()) return;
    closing_ = true;
    for (auto& c : conns_) all.push_back(c.get());
  }
  cv_.notify_all();
  if (van_) van_->StopListening();
  for (Connection* c : all) c->Join();
  std::vector<std::thread> blame;
  {
    std::lock_guard<std::mutex> lk(blame_mu_);
    blame.swap(blame_);
  }
  for (auto& t : blame) t.join();
  std::lock_guard<std::mutex> lk(mu_);
  std::fill(by_peer_.begin(), by_peer_.end(), nullptr);
  conns_.clear();
}

Status PeerMesh::OnHeader(Connection* c, const FrameHeader& h, void** dest) {
  switch (TypeOf(h)) {
    case MsgType::kPeerHello:
      if (c->tag >= 0) return Status::InvalidArgument("second PEER_HELLO from " + c->peer_name());
      return Status::OK();
    case MsgType::kPeerGoodbye: return Status::OK();
    case MsgType::kPeerAbort:  // a text, into the connection's buffer
      return c->tag < 0 ? Status::InvalidArgument("PEER_ABORT before PEER_HELLO") : Status::OK();
    case MsgType::kCollective:
      if (c->tag < 0)
        return Status::InvalidArgument("COLLECTIVE before PEER_HELLO from " + c->peer_name());
      if (h.sender != static_cast<uint32_t>(c->tag))
        return Status::InvalidArgument("COLLECTIVE from " + c->peer_name() + " names worker " +
                                       std::to_string(h.sender));
      return sink_->CollectiveDestination(c->tag, h, dest);
    default:
      return Status::InvalidArgument(std::string("unexpected ") + MsgTypeName(TypeOf(h)) +
                                     " from " + c->peer_name());
  }
}

void PeerMesh::OnFrame(Connection* c, const FrameHeader& h, void* payload) {
  if (TypeOf(h) == MsgType::kPeerHello) {
    const int p = static_cast<int>(h.sender);
    std::lock_guard<std::mutex> lk(mu_);
    if (p < 0 || p >= num_worker_ || p <= me_ || !expected_[static_cast<size_t>(p)] ||
        by_peer_[static_cast<size_t>(p)]) {
      BPS_LOG(WARNING) << "worker mesh: unexpected PEER_HELLO from worker " << h.sender
                       << "; dropping the connection";
      c->Close();
      return;
    }
    c->tag = p;
    c->set_peer_name("worker machine " + std::to_string(p));
    by_peer_[static_cast<size_t>(p)] = c;
    cv_.notify_all();
    return;
  }
  if (c->tag < 0) return;
  if (TypeOf(h) == MsgType::kPeerGoodbye) {
    left_[c->tag] = true;
    sink_->OnPeerLeft(c->tag);
    return;
  }
  if (TypeOf(h) == MsgType::kPeerAbort) {
    if (h.key > UINT32_MAX || h.aux > UINT32_MAX) return;
    return sink_->OnPeerAbort(c->tag, static_cast<uint32_t>(h.key), static_cast<uint32_t>(h.aux),
                              std::string(static_cast<const char*>(payload), h.payload_len));
  }
  sink_->OnCollective(c->tag, h);
}

void PeerMesh::OnClosed(Connection* c, const Status& why) {
  const int p = c->tag;
  if (p < 0 || left_[p] || stopping_()) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (closing_) return;
  }
  Status blame = Status::PeerLost("lost the connection to " + c->peer_name() + " (" +
                                  why.message() + ")");
  std::lock_guard<std::mutex> lk(blame_mu_);
  // The peer may have closed because the job failed elsewhere: wait briefly for that news
  // before blaming it (on a thread of its own: the news may come through this van thread).
  blame_.emplace_back([this, p, blame] {
    for (int i = 0; i < 100 && !failed_() && !stopping_() && !left_[p]; ++i) usleep(10000);
    if (!stopping_() && !left_[p]) sink_->OnPeerLost(p, blame);
  });
}

}  // namespace byteps
