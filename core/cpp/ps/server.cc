#include "server.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "comm/socket_util.h"
#include "common/logging.h"
#include "reduce/sum.h"

namespace byteps {

SummationServer::SummationServer(ServerOptions opts) : opts_(std::move(opts)) {
  workers_.assign(opts_.num_worker, nullptr);
}

SummationServer::~SummationServer() {
  stopping_ = true;
  book_cv_.notify_all();
  if (van_) van_->StopListening();
  for (auto& c : conns_) c->Join();
  for (auto& e : engines_) {
    e->queue.Close();
    if (e->thread.joinable()) e->thread.join();
  }
  if (control_) control_->Close();
  for (auto& [k, ks] : keys_)
    for (char* p : ks->owned) free(p);
}

Status SummationServer::Run() {
  BPS_RETURN_IF_ERROR(Van::Create("tcp", &van_));
  control_ = std::make_unique<ControlClient>(nullptr, nullptr);
  BPS_RETURN_IF_ERROR(
      control_->Connect(van_.get(), opts_.scheduler_host, opts_.scheduler_port, opts_.timeout_s));
  std::string host = opts_.node_host;
  if (host.empty() && !opts_.interface.empty()) {
    host = InterfaceAddress(opts_.interface);
    if (host.empty())
      return Status::Config("DMLC_INTERFACE=" + opts_.interface + " has no IPv4 address");
  }
  if (host.empty()) host = control_->LocalAddress();
  int port = 0;
  Van::ListenOptions listen;
  listen.owner = "server";
  listen.handshake_timeout_s = std::min(opts_.timeout_s, 5.0);
  listen.handler = this;
  listen.peer_name = "unidentified worker";
  BPS_RETURN_IF_ERROR(van_->Listen(
      host, opts_.port, listen,
      [this](std::unique_ptr<Connection> conn) { OnAccepted(std::move(conn)); }, &port));
  for (int i = 0; i < opts_.engine_threads; ++i) {
    engines_.push_back(std::make_unique<Engine>());
    Engine* e = engines_.back().get();
    e->thread = std::thread([this, e] { EngineLoop(e); });
  }
  RegisterMsg reg;
  reg.role = NodeRole::kServer;
  reg.host = host;
  reg.port = static_cast<uint32_t>(port);
  reg.num_worker = opts_.num_worker;
  reg.num_server = opts_.num_server;
  reg.pid = static_cast<uint32_t>(getpid());
  AddressBook book;
  BPS_RETURN_IF_ERROR(control_->Register(reg, opts_.timeout_s, &book));
  rank_ = book.my_rank;
  {
    std::lock_guard<std::mutex> lk(book_mu_);
    partition_bound_ = book.partition_bound;
  }
  book_cv_.notify_all();
  SetLogIdentity("server " + std::to_string(rank_));
  van_->SetListenerOwner("server " + std::to_string(rank_));
  BPS_LOG(INFO) << "serving on " << host << ":" << port << " with " << opts_.engine_threads
                << " engine threads, summation ISA " << reduce::ActiveIsa();
  control_->StartHeartbeats(opts_.heartbeat_interval_s, opts_.heartbeat_timeout_s);
  Status st = control_->WaitForShutdown();
  stopping_ = true;
  if (!st.ok()) {
    // Tell the workers why this server is leaving, so they name the real cause.
    std::lock_guard<std::mutex> lk(conns_mu_);
    for (Connection* c : workers_)
      if (c)
        c->SendControl(MsgType::kDataError, st.message(), 0, static_cast<uint32_t>(rank_),
                       ToAux(DataError::kJobFailed));
    for (Connection* c : workers_)
      if (c) c->Flush(1.0);
  }
  return st;
}

void SummationServer::OnAccepted(std::unique_ptr<Connection> conn) {
  Connection* raw = conn.get();
  std::vector<std::unique_ptr<Connection>> dead;
  {
    std::lock_guard<std::mutex> lk(conns_mu_);
    // Reap connections that were dropped and serve no worker, so a peer that keeps
    // reconnecting (and failing) costs nothing that accumulates.
    for (auto& c : conns_) {
      bool serving = c->tag >= 0 && c->tag < opts_.num_worker && workers_[c->tag] == c.get();
      if (c->closed() && !serving) dead.push_back(std::move(c));
    }
    conns_.erase(std::remove(conns_.begin(), conns_.end(), nullptr), conns_.end());
    conns_.push_back(std::move(conn));
    raw->Start();  // under the lock: a reaper never sees a connection whose threads are half made
  }
  dead.clear();  // joins their finished threads, outside the lock
}

SummationServer::KeyState* SummationServer::FindKey(uint64_t key) {
  std::shared_lock<std::shared_mutex> lk(keys_mu_);
  auto it = keys_.find(key);
  return it == keys_.end() ? nullptr : it->second.get();
}

SummationServer::KeyState* SummationServer::CreateKey(uint64_t key, DType dtype, size_t len) {
  std::unique_lock<std::shared_mutex> lk(keys_mu_);
  auto it = keys_.find(key);
  if (it != keys_.end()) return it->second.get();
  auto ks = std::make_unique<KeyState>();
  ks->key = key;
  ks->dtype = dtype;
  ks->len = len;
  size_t alloc = (std::max<size_t>(len, 1) + 4095) / 4096 * 4096;
  bool failed = false;
  auto buffer = [&]() {
    char* p = static_cast<char*>(aligned_alloc(4096, alloc));
    if (p) ks->owned.push_back(p);
    else failed = true;
    return p;
  };
  ks->sum[0] = buffer();
  ks->sum[1] = buffer();
  ks->staging = std::vector<std::atomic<char*>>(opts_.num_worker);
  for (auto& s : ks->staging) s.store(buffer());
  if (failed) {
    for (char* p : ks->owned) free(p);
    return nullptr;
  }
  for (auto& w : ks->waiting) w.reserve(opts_.num_worker);
  for (auto& p : ks->pushed) p.assign(opts_.num_worker, 0);
  ks->replies.resize(static_cast<size_t>(opts_.num_worker) * 2);
  // Bind the key to the least-loaded engine thread (by bytes), for good.
  size_t best = 0;
  for (size_t i = 1; i < engines_.size(); ++i)
    if (engines_[i]->load_bytes < engines_[best]->load_bytes) best = i;
  engines_[best]->load_bytes += len;
  ks->engine = static_cast<int>(best);
  KeyState* raw = ks.get();
  keys_.emplace(key, std::move(ks));
  return raw;
}

void SummationServer::SendError(Connection* c, const std::string& msg) {
  static LogLimiter limit;
  std::string more;
  if (limit.Allow(&more)) BPS_LOG(WARNING) << msg << more;
  c->SendControl(MsgType::kDataError, msg, 0, 0, ToAux(DataError::kRejected));
}

Status SummationServer::OnHeader(Connection* c, const FrameHeader& h, void** dest) {
  MsgType t = TypeOf(h);
  if (t == MsgType::kHello) {
    // Workers connect once they have the address book; this server gets it at the same time,
    // but its copy may still be on the way.
    std::unique_lock<std::mutex> lk(book_mu_);
    if (!book_cv_.wait_for(lk, std::chrono::duration<double>(opts_.timeout_s),
                           [&] { return partition_bound_.load() != 0 || stopping_.load(); }))
      return Status::Timeout("HELLO before this server had the job's address book");
    return Status::OK();
  }
  if (t == MsgType::kGoodbye) return Status::OK();
  if (c->tag < 0) return Status::InvalidArgument("data before HELLO");
  if (t == MsgType::kPull || t == MsgType::kStallQuery) return Status::OK();
  if (t != MsgType::kPush)
    return Status::InvalidArgument(std::string("unexpected ") + MsgTypeName(t) + " at a server");
  // Every size a peer sends is bounded before anything is allocated for it: a push is one
  // partition, so it is never larger than the job's partition bound.
  const uint64_t bound = partition_bound_.load();
  if (h.payload_len > bound)
    return Status::InvalidArgument("push of key " + std::to_string(h.key) + " with " +
                                   std::to_string(h.payload_len) +
                                   " bytes, larger than the job's partitions (" +
                                   std::to_string(bound) + " bytes)");
  KeyState* ks = FindKey(h.key);
  DType dt = static_cast<DType>(h.dtype);
  if (!ks) {
    if (h.payload_len % DTypeSize(dt) != 0) {
      SendError(c, "push of key " + std::to_string(h.key) + " has " +
                       std::to_string(h.payload_len) + " bytes, not a multiple of " + DTypeName(dt));
      *dest = Connection::kDiscard;
      return Status::OK();
    }
    ks = CreateKey(h.key, dt, h.payload_len);
    if (!ks) {
      SendError(c, "server " + std::to_string(rank_) + ": out of memory for key " +
                       std::to_string(h.key) + " (" + std::to_string(h.payload_len) + " bytes)");
      *dest = Connection::kDiscard;
      return Status::OK();
    }
  }
  if (ks->len != h.payload_len || ks->dtype != dt) {
    SendError(c, "server " + std::to_string(rank_) + ": push of key " + std::to_string(h.key) +
                     " from worker " + std::to_string(c->tag) + " has " +
                     std::to_string(h.payload_len) + " bytes of " + DTypeName(dt) +
                     ", but the key holds " + std::to_string(ks->len) + " bytes of " +
                     DTypeName(ks->dtype));
    *dest = Connection::kDiscard;  // read past; dropped in OnFrame
    return Status::OK();
  }
  *dest = ks->staging[c->tag].load(std::memory_order_acquire);
  return Status::OK();
}

void SummationServer::OnFrame(Connection* c, const FrameHeader& h, void*) {
  MsgType t = TypeOf(h);
  if (t == MsgType::kHello) {
    int w = static_cast<int>(h.sender);
    std::lock_guard<std::mutex> lk(conns_mu_);
    // One connection per worker: a second HELLO for a live worker would steal its answers.
    if (w < 0 || w >= opts_.num_worker || c->tag >= 0 || (workers_[w] && !workers_[w]->closed())) {
      static LogLimiter limit;
      std::string more;
      if (limit.Allow(&more))
        BPS_LOG(WARNING) << "bad or duplicate HELLO from worker " << h.sender
                         << "; dropping the connection" << more;
      c->Close();
      return;
    }
    c->tag = w;
    c->set_peer_name("worker " + std::to_string(w));
    workers_[w] = c;
    return;
  }
  if (t == MsgType::kGoodbye) {
    c->tag = -2;  // closing on purpose
    return;
  }
  KeyState* ks = FindKey(h.key);
  if (!ks) {
    if (t == MsgType::kPull) SendError(c, "pull of unknown key " + std::to_string(h.key));
    if (t == MsgType::kStallQuery) {  // nobody has pushed this key yet
      std::vector<int> all(opts_.num_worker);
      for (int w = 0; w < opts_.num_worker; ++w) all[w] = w;
      SendStallReport(c->tag, h.key, static_cast<uint32_t>(h.aux), all);
    }
    return;
  }
  if (t == MsgType::kPush && (ks->len != h.payload_len || ks->dtype != static_cast<DType>(h.dtype)))
    return;  // rejected in OnHeader
  Event ev{t == MsgType::kPush, t == MsgType::kStallQuery,
           t == MsgType::kPush && (h.flags & kPushFlagPull) != 0, ks, c->tag,
           t == MsgType::kStallQuery ? static_cast<uint32_t>(h.aux) : h.round};
  engines_[ks->engine]->queue.Push(ev);
}

void SummationServer::OnClosed(Connection* c, const Status& why) {
  if (c->tag >= 0 && !stopping_)
    BPS_LOG(WARNING) << "connection to worker " << c->tag << " lost: " << why.message();
}

void SummationServer::EngineLoop(Engine* e) {
  Event ev;
  while (true) {
    if (!e->queue.Pop(&ev, std::chrono::milliseconds(500))) {
      if (e->queue.closed()) return;
      continue;
    }
    if (ev.is_push) HandlePush(ev);
    else if (ev.is_stall_query) HandleStallQuery(ev);
    else HandlePull(ev);
  }
}

void SummationServer::HandlePush(const Event& ev) {
  KeyState* ks = ev.ks;
  int p = ev.round & 1;
  size_t count = ks->len / DTypeSize(ks->dtype);
  if (ks->count[p] == 0) {
    // First push of the round: its staging buffer becomes the sum (no copy).
    char* incoming = ks->staging[ev.worker].load(std::memory_order_acquire);
    ks->staging[ev.worker].store(ks->sum[p], std::memory_order_release);
    ks->sum[p] = incoming;
    ks->round[p] = ev.round;
    ks->complete[p] = false;
    std::fill(ks->pushed[p].begin(), ks->pushed[p].end(), 0);
  } else {
    if (ks->round[p] != ev.round) {
      BPS_LOG(ERROR) << "key " << ks->key << ": push of round " << ev.round << " from worker "
                     << ev.worker << " while round " << ks->round[p] << " is open";
      return;
    }
    reduce::SumInto(ks->sum[p], ks->staging[ev.worker].load(std::memory_order_acquire), count,
                    ks->dtype);
  }
  ks->pushed[p][ev.worker] = 1;
  if (ev.pull_too) ks->waiting[p].push_back(ev.worker);
  if (++ks->count[p] < opts_.num_worker) return;
  ks->count[p] = 0;
  ks->complete[p] = true;
  std::vector<int>& waiting = ks->waiting[p];
  for (int w : waiting) Reply(ks, w, p);
  waiting.clear();
}

void SummationServer::HandlePull(const Event& ev) {
  KeyState* ks = ev.ks;
  int p = ev.round & 1;
  if (ks->complete[p] && ks->round[p] == ev.round) Reply(ks, ev.worker, p);
  else ks->waiting[p].push_back(ev.worker);
}

void SummationServer::HandleStallQuery(const Event& ev) {
  KeyState* ks = ev.ks;
  int p = ev.round & 1;
  std::vector<int> missing;
  bool open = ks->round[p] == ev.round && !ks->complete[p] && ks->count[p] > 0;
  bool done = ks->round[p] == ev.round && ks->complete[p];
  for (int w = 0; w < opts_.num_worker; ++w)
    if (!done && !(open && ks->pushed[p][w])) missing.push_back(w);
  SendStallReport(ev.worker, ks->key, ev.round, missing);
}

void SummationServer::SendStallReport(int worker, uint64_t key, uint32_t round,
                                      const std::vector<int>& missing) {
  Connection* c;
  {
    std::lock_guard<std::mutex> lk(conns_mu_);
    c = worker >= 0 && worker < opts_.num_worker ? workers_[worker] : nullptr;
  }
  if (!c) return;
  c->SendControl(MsgType::kStallReport, EncodeWorkerIds(missing), key,
                 static_cast<uint32_t>(rank_), round);
}

void SummationServer::Reply(KeyState* ks, int worker, int parity) {
  Connection* c;
  {
    std::lock_guard<std::mutex> lk(conns_mu_);
    c = workers_[worker];
  }
  if (!c) return;
  SendItem& item = ks->replies[static_cast<size_t>(worker) * 2 + parity];
  item.hdr = FrameHeader();
  item.hdr.type = static_cast<uint16_t>(MsgType::kPullResponse);
  item.hdr.dtype = static_cast<uint8_t>(ks->dtype);
  item.hdr.key = ks->key;
  item.hdr.round = ks->round[parity];
  item.hdr.sender = static_cast<uint32_t>(rank_);
  item.payload = ks->sum[parity];
  item.len = ks->len;
  c->Send(&item);
}

}  // namespace byteps
