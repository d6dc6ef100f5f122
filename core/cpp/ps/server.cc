#include "server.h"

#include <cstdint>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>

#include "comm/socket_util.h"
#include "common/logging.h"
#include "reduce/sum.h"
#include "scheduling/partitioner.h"

namespace byteps {

SummationServer::SummationServer(ServerOptions opts)
    : opts_(std::move(opts)), rounds_(opts_.num_worker, opts_.engine_threads, true, this) {
  workers_.assign(opts_.num_worker, nullptr);
  windows_.resize(opts_.num_worker);
  pull_windows_.resize(opts_.num_worker);
  rounds_.set_timing(opts_.trace);
  rounds_.SetAsync(opts_.async_mode, opts_.max_staleness);
}

SummationServer::~SummationServer() {
  stopping_ = true;
  if (van_) van_->StopListening();
  for (auto& c : conns_) c->Join();
  for (auto& c : uplinks_) c->Join();
  rounds_.Stop();
  if (control_) control_->Close();
}

Status SummationServer::Run() {
  BPS_RETURN_IF_ERROR(Van::Create(opts_.van, &van_));
  // Workers may write their pushes into fixed slots (windows) over this van's links.
  rounds_.set_fixed_staging(van_->one_way_writes());
  // Asynchronous mode: the scheduler says which worker machines left (died or shut down), so
  // no asynchronous key waits for them (also learnt here when a worker's connection closes).
  control_ = std::make_unique<ControlClient>(
      [this](const FrameHeader& h, const char* p, size_t len) {
        if (TypeOf(h) == MsgType::kWorkerLeft && rounds_.async_mode() &&
            h.sender < static_cast<uint32_t>(opts_.num_worker))
          rounds_.WorkerLeft(static_cast<int>(h.sender));
        if (TypeOf(h) == MsgType::kRetireKeys) RetireKeys(h.key, h.aux);
        if (TypeOf(h) == MsgType::kJoin) {  // Horovod's join: who pushes no more for now
          std::vector<int> joined;
          if (DecodeWorkerIds(p, len, opts_.num_worker, &joined).ok()) rounds_.SetJoined(joined);
          control_->Send(MsgType::kJoin, std::string());  // applied (queued before any push)
        }
      },
      nullptr);
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
  rounds_.Start();
  RegisterMsg reg;
  reg.role = NodeRole::kServer;
  reg.host = host;
  reg.port = static_cast<uint32_t>(port);
  reg.num_worker = opts_.num_worker;
  reg.num_server = opts_.num_server;
  reg.pid = static_cast<uint32_t>(getpid());
  reg.async_mode = opts_.async_mode;
  reg.max_staleness = opts_.max_staleness;
  AddressBook book;
  BPS_RETURN_IF_ERROR(control_->Register(reg, opts_.timeout_s, &book));
  rank_ = book.my_rank;
  {
    std::lock_guard<std::mutex> lk(book_mu_);
    rounds_.Configure(rank_, book.partition_bound);
  }
  BPS_RETURN_IF_ERROR(ConnectUplinks(book));
  {
    std::lock_guard<std::mutex> lk(conns_mu_);
    have_book_ = true;
    for (Connection* c : unstarted_) c->Start();
    unstarted_.clear();
  }
  SetLogIdentity("server " + std::to_string(rank_));
  van_->SetListenerOwner("server " + std::to_string(rank_));
  BPS_LOG(INFO) << "serving on " << host << ":" << port << " with " << opts_.engine_threads
                << " engine threads, summation ISA " << reduce::ActiveIsa();
  control_->StartHeartbeats(opts_.heartbeat_interval_s, opts_.heartbeat_timeout_s);
  Status st = control_->WaitForShutdown();
  stopping_ = true;
  const auto census = rounds_.KeyCensus();
  BPS_LOG(INFO) << census.first << " keys held at shutdown, " << census.second
                << " of them of a tensor's older cut";
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
      if (c->closed() && !serving) {
        unstarted_.erase(std::remove(unstarted_.begin(), unstarted_.end(), c.get()),
                         unstarted_.end());
        dead.push_back(std::move(c));
      }
    }
    conns_.erase(std::remove(conns_.begin(), conns_.end(), nullptr), conns_.end());
    conns_.push_back(std::move(conn));
    // Under the lock: a reaper never sees a connection whose threads are half made.
    if (have_book_)
      raw->Start();
    else
      unstarted_.push_back(raw);
  }
  dead.clear();  // joins their finished threads, outside the lock
}

Connection* SummationServer::Worker(int worker) {
  std::lock_guard<std::mutex> lk(conns_mu_);
  return worker >= 0 && worker < opts_.num_worker ? workers_[worker] : nullptr;
}

Connection* SummationServer::Worker(int worker, uint64_t key, PullWindow* w) {
  std::lock_guard<std::mutex> lk(conns_mu_);
  *w = PullWindow();
  if (worker < 0 || worker >= opts_.num_worker) return nullptr;
  const auto& windows = pull_windows_[worker];
  if (!windows.empty()) {
    auto it = windows.find(key);
    if (it != windows.end()) *w = it->second;
  }
  return workers_[worker];
}

Status SummationServer::OnHeader(Connection* c, const FrameHeader& h, void** dest) {
  MsgType t = TypeOf(h);
  if (t == MsgType::kHello) return Status::OK();  // started after the book (OnAccepted)
  if (t == MsgType::kGoodbye) return Status::OK();
  if (c->tag < 0) return Status::InvalidArgument("data before HELLO");
  const bool from_server = c->tag >= kServerTag;
  if (!from_server &&
      (t == MsgType::kPull || t == MsgType::kStallQuery || t == MsgType::kKeyConfig ||
       t == MsgType::kPullWindow))
    return Status::OK();  // no payload, or a small one into the connection's buffer
  if (t != MsgType::kPush)
    return Status::InvalidArgument(std::string("unexpected ") + MsgTypeName(t) + " at a server");
  // HiPS (docs/schemes.md): a worker's push to its group's first-level server, or a
  // first-level server's group sum to this top-level one; the role makes the key.
  const KeyRole* role = nullptr;
  if (from_server) {
    if (!(h.flags & kPushFlagHipsUp))
      return Status::InvalidArgument("a first-level server's push without the HiPS flag");
    role = &top_role_;
  } else if (h.flags & kPushFlagHips) {
    const int first = HipsGroups();
    const int64_t top = static_cast<int64_t>(h.aux) - first;
    if (first == 0 || rank_ >= first || c->tag / opts_.hips_group != rank_ || top < 0 ||
        top >= static_cast<int64_t>(first_roles_.size())) {
      SendError(c->tag, "server " + std::to_string(rank_) + " is not the first-level HiPS "
                        "server of worker " + std::to_string(c->tag) + " for top-level server " +
                        std::to_string(h.aux) + " (every process must run with the same "
                        "BYTEPS_SYNC and BYTEPS_HIPS_GROUP)");
      *dest = Connection::kDiscard;
      return Status::OK();
    }
    role = &first_roles_[static_cast<size_t>(top)];
  }
  const int sender = from_server ? c->tag - kServerTag : c->tag;
  if (h.written) BPS_RETURN_IF_ERROR(CheckWritten(c, h));
  // Bounded by the partition bound before anything is allocated; a refused push is read past.
  char* buf = nullptr;
  BPS_RETURN_IF_ERROR(rounds_.PushBuffer(h.key, static_cast<DType>(h.dtype), DataBytes(h),
                                         sender, &buf, role, (h.flags & kPushFlagAsync) != 0,
                                         PushOpOf(h.flags)));
  *dest = buf && !h.written ? static_cast<void*>(buf) : Connection::kDiscard;
  return Status::OK();
}

Status SummationServer::CheckWritten(Connection* c, const FrameHeader& h) {
  // Only a worker the window went to writes into it; the van checked the write stayed in it.
  const bool worker = c->tag >= 0 && c->tag < opts_.num_worker;
  auto it = worker ? windows_[c->tag].find(h.key) : windows_[0].end();
  if (!worker || it == windows_[c->tag].end() || !it->second ||
      (h.flags & ~kPushOpMask) != kPushFlagPull)
    return Status::InvalidArgument("a one-way push of key " + std::to_string(h.key) + " from " +
                                   c->peer_name() + ", which has no window for it");
  return Status::OK();
}

std::string SummationServer::WindowFor(Connection* c, const FrameHeader& h, void* slot) {
  // A plain synchronous push that also pulls (the worker's next push of the key then waits for
  // this round's sum, which frees the slot), received into its fixed slot, once per key.
  if (h.written || (h.flags & ~kPushOpMask) != kPushFlagPull || !slot ||
      slot == Connection::kDiscard ||
      c->tag < 0 || c->tag >= opts_.num_worker || !van_->one_way_writes())
    return std::string();
  auto& sent = windows_[c->tag];
  if (sent.count(h.key)) return std::string();
  std::string blob;
  bool ok = rounds_.WindowSlot(h.key, c->tag, h.payload_len) == slot &&
            c->ExportWindow(slot, h.payload_len, &blob).ok();
  sent.emplace(h.key, ok);
  return ok ? blob : std::string();
}

namespace {

// A compressed key's PUSH carries the worker's learning rate in aux (the bits of a double):
// what the server's error feedback corrects with. Anything but a positive finite number is
// "unknown" (no correction).
double LearningRateOf(const FrameHeader& h) {
  double lr = 0;
  static_assert(sizeof(lr) == sizeof(h.aux), "aux holds a double");
  memcpy(&lr, &h.aux, sizeof(lr));
  return std::isfinite(lr) && lr > 0 ? lr : 0;
}

}  // namespace

void SummationServer::OnFrame(Connection* c, const FrameHeader& h, void* payload) {
  MsgType t = TypeOf(h);
  if (t == MsgType::kHello && h.aux == kHelloFromServer) {  // HiPS: a first-level server
    const int g = static_cast<int>(h.sender);
    std::lock_guard<std::mutex> lk(conns_mu_);
    if (c->tag >= 0 || g < 0 || g >= static_cast<int>(lowers_.size()) || lowers_[g]) {
      BPS_LOG(WARNING) << "bad HELLO from first-level server " << h.sender
                       << "; dropping the connection";
      c->Close();
      return;
    }
    c->tag = kServerTag + g;
    c->set_peer_name("first-level server " + std::to_string(g));
    lowers_[g] = c;
    return;
  }
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
    windows_[w].clear();  // windows are the connection's: a new one has none
    pull_windows_[w].clear();
    return;
  }
  if (t == MsgType::kGoodbye) {
    if (rounds_.async_mode() && c->tag >= 0) rounds_.WorkerLeft(c->tag);
    c->tag = -2;  // closing on purpose
    return;
  }
  if (t == MsgType::kPush) {
    // Acknowledged on receipt (the worker's credit), before the round may complete: the sum
    // then follows the acknowledgement on this connection.
    // The first one of a key may carry a window on the worker's slot (one-way pushes).
    c->SendControl(MsgType::kPushAck, WindowFor(c, h, payload), h.key,
                   static_cast<uint32_t>(rank_), h.round);
    const int sender = c->tag >= kServerTag ? c->tag - kServerTag : c->tag;
    rounds_.Push(h.key, static_cast<DType>(h.dtype), DataBytes(h), sender, h.round,
                 (h.flags & kPushFlagPull) != 0,
                 h.flags & (kPushFlagHips | kPushFlagHipsUp) ? 0 : LearningRateOf(h),
                 (h.flags & kPushFlagAsync) != 0);
  } else if (t == MsgType::kKeyConfig) {
    KeyConfigMsg m;
    Status st = Decode(payload, h.payload_len, &m);
    if (!st.ok()) return SendError(c->tag, st.message() + " from worker " + std::to_string(c->tag));
    rounds_.ConfigureKey(h.key, m, c->tag);
  }
  else if (t == MsgType::kPullWindow) OpenPullWindow(c, h, payload);
  else if (t == MsgType::kPull) rounds_.Pull(h.key, c->tag, h.round);
  else if (t == MsgType::kStallQuery)
    rounds_.StallQuery(h.key, c->tag, static_cast<uint32_t>(h.aux));
}

void SummationServer::RetireKeys(uint64_t declared_key, uint64_t generation) {
  if (declared_key > 0xffff || generation > 0xffff) {
    BPS_LOG(WARNING) << "RETIRE_KEYS of tensor " << declared_key << " generation " << generation
                     << " names no key; ignored";
    return;
  }
  const size_t n = rounds_.Retire(static_cast<uint32_t>(declared_key),
                                  static_cast<uint32_t>(generation));
  {
    std::lock_guard<std::mutex> lk(conns_mu_);
    for (auto& windows : pull_windows_)
      for (auto it = windows.begin(); it != windows.end();)
        it = KeyTensor(it->first) == declared_key && KeyGeneration(it->first) < generation
                 ? windows.erase(it)
                 : std::next(it);
  }
  if (n)
    BPS_LOG(INFO) << "retiring " << n << " keys of tensor " << declared_key
                  << " (generations below " << generation << ", cut anew)";
}

void SummationServer::OpenPullWindow(Connection* c, const FrameHeader& h, const void* blob) {
  uint32_t id = 0;
  Status st = c->OpenWindow(std::string(static_cast<const char*>(blob), h.payload_len), &id);
  if (!st.ok()) {  // the key's sums stay frames
    static LogLimiter limit;
    std::string more;
    if (limit.Allow(&more))
      BPS_LOG(WARNING) << "sums to " << c->peer_name() << " stay frames: " << st.message()
                       << more;
    return;
  }
  std::lock_guard<std::mutex> lk(conns_mu_);
  if (c->tag >= 0 && c->tag < opts_.num_worker && workers_[c->tag] == c)
    pull_windows_[c->tag][h.key] = PullWindow{id, h.aux};
}

void SummationServer::OnClosed(Connection* c, const Status& why) {
  if (c->tag >= 0 && !stopping_) {
    BPS_LOG(WARNING) << "connection to worker " << c->tag << " lost: " << why.message();
    // Asynchronous mode: the others go on without it (docs/async.md).
    if (rounds_.async_mode() && c->tag < opts_.num_worker) rounds_.WorkerLeft(c->tag);
  }
}

std::unique_ptr<KeyAttachment> SummationServer::Attach(const RoundKey& k) {
  auto r = std::make_unique<Replies>();
  r->items.resize(static_cast<size_t>(opts_.num_worker) * 2);
  r->van = van_.get();
  for (size_t i = 0; i < k.owned.size(); ++i) {
    char* p = k.owned[i];
    Status st = van_->RegisterMemory(p, k.owned_len[i]);
    if (st.ok())
      r->registered.push_back(p);
    else  // the van then registers per message, as for any memory
      BPS_LOG(WARNING) << "cannot register the buffers of key " << k.key << ": " << st.message();
  }
  return r;
}

char* SummationServer::AllocateSlot(size_t len) {
  void* p = nullptr;
  Status st = van_->AllocateMemory(len, &p);
  if (!st.ok()) {
    static LogLimiter limit;
    std::string more;
    if (limit.Allow(&more))
      BPS_LOG(WARNING) << "push slots from the heap (" << st.message() << ")" << more;
    return nullptr;
  }
  return static_cast<char*>(p);
}

void SummationServer::FreeSlot(char* p) { van_->FreeMemory(p); }

void SummationServer::SendError(int worker, const std::string& msg) {
  static LogLimiter limit;
  std::string more;
  if (limit.Allow(&more)) BPS_LOG(WARNING) << msg << more;
  if (Connection* c = Worker(worker))
    c->SendControl(MsgType::kDataError, msg, 0, 0, ToAux(DataError::kRejected));
}

void SummationServer::SendStallReport(int worker, uint64_t key, uint32_t round,
                                      const std::vector<int>& missing) {
  Connection* c = Worker(worker);
  if (!c) return;
  c->SendControl(MsgType::kStallReport, EncodeWorkerIds(missing), key,
                 static_cast<uint32_t>(rank_), round);
}

FrameHeader SummationServer::KeyFrame(MsgType type, const RoundKey& k, uint32_t round) const {
  FrameHeader h;
  h.type = static_cast<uint16_t>(type);
  h.dtype = static_cast<uint8_t>(k.dtype);
  h.key = k.key;
  h.round = round;
  h.sender = static_cast<uint32_t>(rank_);
  return h;
}

void SummationServer::SendValue(int worker, RoundKey& k) {
  Connection* c = Worker(worker);
  if (!c) return;
  // One reply per worker in flight (it pushes again only after receiving it): slot parity 0.
  SendItem& item = static_cast<Replies*>(k.attachment.get())->items[static_cast<size_t>(worker) * 2];
  item.hdr = KeyFrame(MsgType::kPullResponse, k, k.reply_round[worker]);
  item.payload = k.snapshot[worker];
  item.len = k.len;
  item.window = 0;
  c->Send(&item);
}

void SummationServer::SendSum(int worker, RoundKey& k, int parity) {
  PullWindow w;
  Connection* c = k.level == KeyLevel::kHipsTop ? Lower(worker) : Worker(worker, k.key, &w);
  if (!c) return;
  SendItem& item =
      static_cast<Replies*>(k.attachment.get())->items[static_cast<size_t>(worker) * 2 + parity];
  item.hdr = KeyFrame(MsgType::kPullResponse, k, k.round[parity]);
  item.hdr.aux = k.reply_aux[parity];  // 0 unless timed (BYTEPS_TRACE_ON, docs/timeline.md)
  item.payload = k.reply(parity);
  item.len = k.reply_len(parity);
  // Into the worker's window where it offered one (the van decides by size, as for pushes).
  item.window = w.id;
  item.window_offset = k.round[parity] & 1 ? w.stride : 0;
  c->Send(&item);
}

}  // namespace byteps
