// The worker's side of the PS protocol: scheduler and server connections, declarations, push
// and pull (push straight from the worker's buffer, pull straight into place), stall queries.
#include "ps/ps_client.h"

#include <cstdint>
#include <unistd.h>

#include "common/logging.h"
#include "reduce/copy.h"
#include "reduce/sum.h"

namespace byteps {

PsClient::PsClient(PsClientConfig cfg, PullSink* sink, FatalFn fatal, StateFn failed,
                   StateFn stopping)
    : cfg_(std::move(cfg)),
      sink_(sink),
      fatal_(std::move(fatal)),
      failed_(std::move(failed)),
      stopping_(std::move(stopping)) {}

PsClient::~PsClient() { Close(); }

Status PsClient::Connect(RegisterMsg reg, double timeout_s) {
  BPS_RETURN_IF_ERROR(Van::Create(cfg_.van, &van_));
  control_ = std::make_unique<ControlClient>(
      [this](const FrameHeader& h, const char* p, size_t n) { OnControlMessage(h, p, n); },
      [this](const Status& st) { fatal_(st, false); });
  BPS_RETURN_IF_ERROR(control_->Connect(van_.get(), cfg_.root_uri, cfg_.root_port, timeout_s));
  if (reg.host.empty()) reg.host = control_->LocalAddress();
  if (cfg_.collective) {
    mesh_ = std::make_unique<PeerMesh>(cfg_.worker_id, cfg_.num_worker, cfg_.mesh_peers,
                                       cfg_.collective, failed_, stopping_);
    int port = 0;
    BPS_RETURN_IF_ERROR(mesh_->Listen(van_.get(), reg.host, &port));
    reg.port = static_cast<uint32_t>(port);
  }
  AddressBook book;
  BPS_RETURN_IF_ERROR(control_->Register(reg, timeout_s, &book));
  for (auto& s : book.servers) {
    if (!s.colocated) cpu_only_servers_++;
    on_this_host_.push_back(s.host == reg.host);
    std::string name = "server " + std::to_string(s.rank) + " at " + s.host + ":" + std::to_string(s.port);
    std::unique_ptr<Connection> conn;
    Status st = van_->Connect(s.host, static_cast<int>(s.port), timeout_s, this, name, &conn);
    if (!st.ok()) return Status(st.code(), "cannot reach " + name + ": " + st.message());
    conn->tag = static_cast<int>(s.rank);
    conn->Start();
    conn->SendControl(MsgType::kHello, "", 0, static_cast<uint32_t>(cfg_.worker_id));
    servers_.push_back(std::move(conn));
  }
  if (mesh_) BPS_RETURN_IF_ERROR(mesh_->Connect(book.workers, timeout_s));
  control_->StartHeartbeats(cfg_.heartbeat_interval_s, cfg_.heartbeat_timeout_s);
  return Status::OK();
}

void PsClient::Declare(uint32_t key, const DeclareMsg& msg, DeclareReplyFn on_reply) {
  {
    std::lock_guard<std::mutex> lk(declare_mu_);
    declares_[key] = std::move(on_reply);
  }
  control_->Send(MsgType::kDeclare, Encode(msg), key);
}

void PsClient::OnControlMessage(const FrameHeader& h, const char* p, size_t len) {
  if (TypeOf(h) == MsgType::kWorkerLeft) {
    if (h.sender >= static_cast<uint32_t>(cfg_.num_worker)) return;
    std::lock_guard<std::mutex> lk(left_mu_);
    left_machines_.insert(static_cast<int>(h.sender));
    left_at_ = std::chrono::steady_clock::now();
    return;
  }
  if (TypeOf(h) == MsgType::kJoinDone) {
    std::vector<std::pair<uint32_t, uint32_t>> rounds;
    JoinDoneFn done;
    {
      std::lock_guard<std::mutex> lk(join_mu_);
      done = std::move(join_done_);
      join_done_ = nullptr;
      join_note_ = nullptr;
    }
    if (done && DecodeRounds(p, len, &rounds).ok()) done(static_cast<int>(h.aux), rounds);
    return;
  }
  if (TypeOf(h) != MsgType::kDeclareReply) return;
  if (static_cast<DeclareReply>(h.aux) == DeclareReply::kJoinedNote) {
    JoinNoteFn note;
    {
      std::lock_guard<std::mutex> lk(join_mu_);
      note = join_note_;
    }
    if (note && h.key <= UINT32_MAX) note(static_cast<uint32_t>(h.key), DecodeText(p, len));
    return;
  }
  DeclareAnswer a;
  a.reply = static_cast<DeclareReply>(h.aux);
  DeclareReplyFn on_reply;
  {
    std::lock_guard<std::mutex> lk(declare_mu_);
    auto it = h.key <= UINT32_MAX ? declares_.find(static_cast<uint32_t>(h.key)) : declares_.end();
    if (it != declares_.end()) on_reply = it->second;
  }
  if (!on_reply) {
    BPS_LOG(WARNING) << "DECLARE_REPLY for unknown key " << h.key;
    return;
  }
  if (a.reply == DeclareReply::kStallWarning) {
    if (!DecodeWorkerIds(p, len, cfg_.num_worker, &a.not_declared).ok()) a.not_declared.clear();
  } else if (a.reply != DeclareReply::kOk) {
    a.text = DecodeText(p, len);
  } else {
    a.decoded = DecodeDeclareOk(p, len, &a.servers);
  }
  on_reply(a);
}

void PsClient::Join(int rank, const std::vector<std::pair<uint32_t, uint32_t>>& rounds,
                    JoinNoteFn on_note, JoinDoneFn on_done) {
  {
    std::lock_guard<std::mutex> lk(join_mu_);
    join_note_ = std::move(on_note);
    join_done_ = std::move(on_done);
  }
  control_->Send(MsgType::kJoin, EncodeRounds(rounds), static_cast<uint64_t>(rank));
}

void PsClient::ReservePulls(const std::vector<uint64_t>& keys) {
  std::lock_guard<std::mutex> lk(pull_mu_);
  for (uint64_t k : keys) pending_pulls_[k] = nullptr;
}

void PsClient::Push(int server, uint64_t key, uint32_t round, DType dtype, const void* buf,
                    size_t len, PendingPull* pull, SendItem* item, SentFn on_sent, void* arg,
                    uint64_t aux, size_t pull_up_to, uint8_t flags) {
  uint32_t window = 0;
  if (pull) {
    std::lock_guard<std::mutex> lk(pull_mu_);
    if (!windows_.empty() && aux == 0 && pull_up_to == 0 && (flags & ~kPushOpMask) == 0) {
      auto it = windows_.find(key);
      if (it != windows_.end() && it->second.first == server) window = it->second.second;
    }
    pull->key = key;
    pull->round = round;
    pull->length = pull_up_to ? pull_up_to : len;
    pull->up_to = pull_up_to != 0;
    pull->server = server;
    pending_pulls_[key] = pull;
    pull->awaiting_ack = true;
    pull->stall_reported = false;
    pull->stall_missing.clear();
  }
  item->hdr = FrameHeader();
  item->hdr.type = static_cast<uint16_t>(MsgType::kPush);
  item->hdr.flags = static_cast<uint8_t>((pull ? kPushFlagPull : 0) | flags);
  item->hdr.dtype = static_cast<uint8_t>(dtype);
  item->hdr.key = key;
  item->hdr.round = round;
  item->hdr.sender = static_cast<uint32_t>(cfg_.worker_id);
  item->hdr.aux = aux;
  item->payload = buf;
  item->len = len;
  item->done = on_sent;
  item->arg = arg;
  item->heap = false;
  item->window = window;
  servers_[server]->Send(item);
}

void PsClient::OfferPullWindow(int server, uint64_t key, char* at, size_t len, size_t stride) {
  {
    std::lock_guard<std::mutex> lk(pull_mu_);
    auto it = pull_windows_.find(key);
    if (it != pull_windows_.end() && it->second.server == server) return;
  }
  PullWindow w;
  w.server = server;
  w.at = at;
  w.len = len;
  w.stride = stride;
  // One window over both rounds' places: they lie `stride` bytes apart in the same region.
  std::string blob;
  Status st = servers_[server]->ExportWindow(at, stride + len, &blob);
  w.offered = st.ok();
  if (!st.ok() && window_errors_.fetch_add(1) == 0)
    BPS_LOG(INFO) << "pull responses from " << servers_[server]->peer_name()
                  << " stay frames: " << st.message();
  {
    // Recorded before the window leaves: the first one-way response may beat this call's end.
    std::lock_guard<std::mutex> lk(pull_mu_);
    pull_windows_[key] = w;
  }
  if (w.offered)
    servers_[server]->SendControl(MsgType::kPullWindow, std::move(blob), key,
                                  static_cast<uint32_t>(cfg_.worker_id), stride);
}

void PsClient::ConfigureKey(int server, uint64_t key, const KeyConfigMsg& m) {
  servers_[server]->SendControl(MsgType::kKeyConfig, Encode(m), key,
                                static_cast<uint32_t>(cfg_.worker_id), 0);
}

bool PsClient::ClaimPushAck(PendingPull* p) {
  std::lock_guard<std::mutex> lk(pull_mu_);
  const bool was = p->awaiting_ack;
  p->awaiting_ack = false;
  return was;
}

void PsClient::CancelPulls(const std::vector<PendingPull*>& pulls, double timeout_s,
                           std::vector<PendingPull*>* unacked) {
  std::unique_lock<std::mutex> lk(pull_mu_);
  for (PendingPull* p : pulls) {
    auto it = pending_pulls_.find(p->key);
    if (it != pending_pulls_.end()) it->second = nullptr;
    if (p->awaiting_ack) unacked->push_back(p);
    p->awaiting_ack = false;
  }
  pull_cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), [&] {
    for (PendingPull* p : pulls)
      if (p->receiving) return false;
    return true;
  });
}

void PsClient::StallQuery(int server, uint64_t key, uint32_t round) {
  if (server < 0 || server >= static_cast<int>(servers_.size())) return;
  servers_[server]->SendControl(MsgType::kStallQuery, std::string(), key,
                                static_cast<uint32_t>(cfg_.worker_id), round);
}

bool PsClient::StallReport(const PendingPull* p, std::vector<int>* missing) {
  std::lock_guard<std::mutex> lk(pull_mu_);
  if (!p->stall_reported) return false;
  *missing = p->stall_missing;
  return true;
}

void PsClient::ClearStallReport(PendingPull* p) {
  std::lock_guard<std::mutex> lk(pull_mu_);
  p->stall_reported = false;
}

bool PsClient::LeftWorkers(std::set<int>* machines,
                           std::chrono::steady_clock::time_point* last) const {
  std::lock_guard<std::mutex> lk(left_mu_);
  if (left_machines_.empty()) return false;
  if (machines) *machines = left_machines_;
  if (last) *last = left_at_;
  return true;
}

void PsClient::ReportFailure(const std::string& text) {
  if (control_) control_->Send(MsgType::kNodeFailed, EncodeText(text));
}

void PsClient::Goodbye() {
  // A failed worker's peers learn why from the scheduler; a goodbye would say "shut down".
  if (mesh_ && !failed_()) mesh_->Goodbye();
  for (auto& c : servers_) {
    c->SendControl(MsgType::kGoodbye, "");
    c->Flush(2.0);
  }
}

Status PsClient::Finalize(double timeout_s) {
  return control_ ? control_->Finalize(timeout_s) : Status::OK();
}

void PsClient::Close() {
  if (mesh_) mesh_->Close();
  for (auto& c : servers_) c->Join();
  if (control_) control_->Close();
  std::thread blame;
  {
    std::lock_guard<std::mutex> lk(blame_mu_);
    blame = std::move(blame_);
  }
  if (blame.joinable()) blame.join();
}

Status PsClient::OnHeader(Connection* c, const FrameHeader& h, void** dest) {
  MsgType type = TypeOf(h);
  if (type == MsgType::kDataError || type == MsgType::kPushAck) return Status::OK();
  if (type == MsgType::kStallReport) {
    if (h.payload_len % sizeof(uint32_t) != 0 ||
        h.payload_len > sizeof(uint32_t) * static_cast<uint64_t>(cfg_.num_worker))
      return Status::InvalidArgument("malformed STALL_REPORT from " + c->peer_name());
    return Status::OK();  // into the scratch buffer
  }
  if (type != MsgType::kPullResponse)
    return Status::InvalidArgument(std::string("unexpected ") + MsgTypeName(type) + " from " +
                                   c->peer_name());
  std::lock_guard<std::mutex> lk(pull_mu_);
  PendingPull* p = PendingLocked(h.key);
  if (!p) {  // the operation failed meanwhile: read past the payload
    *dest = Connection::kDiscard;
    return Status::OK();
  }
  const uint64_t bytes = DataBytes(h);
  if (h.round != p->round || (p->up_to ? bytes > p->length : bytes != p->length))
    return Status::InvalidArgument("pull response for key " + std::to_string(h.key) + " round " +
                                   std::to_string(h.round) + " with " + std::to_string(bytes) +
                                   " bytes; expected round " + std::to_string(p->round) +
                                   " with " + std::to_string(p->length));
  char* written_at = nullptr;
  if (h.written) BPS_RETURN_IF_ERROR(CheckWrittenLocked(c, h, p, &written_at));
  p->receiving = true;
  p->received = bytes;
  p->reply_aux = h.aux;
  PullDest d = sink_->PullDestination(p, bytes, h.written != 0);
  if (h.written) {  // already in place: where the worker would have received it
    if (d.data != written_at || d.stream)
      return Status::Internal("a one-way pull response of key " + std::to_string(h.key) +
                              " landed where the worker does not take its sum");
    return Status::OK();
  }
  *dest = d.data;
  if (d.stream) {
    p->divide_by = d.divide_by;
    p->dtype = d.dtype;
    c->StreamPayload(&PsClient::StreamSink, p);
  }
  return Status::OK();
}

void PsClient::StreamSink(void* arg, char* dst, char* chunk, size_t len) {
  auto* p = static_cast<PendingPull*>(arg);
  if (p->divide_by > 0)
    reduce::DivideInPlace(chunk, len / DTypeSize(p->dtype), p->dtype, p->divide_by);
  reduce::CopyStreaming(dst, chunk, len);
}

void PsClient::OnFrame(Connection* c, const FrameHeader& h, void* payload) {
  if (TypeOf(h) == MsgType::kDataError) {
    std::string text(static_cast<const char*>(payload), h.payload_len);
    if (static_cast<DataError>(h.aux) == DataError::kJobFailed)
      fatal_(Status::PeerLost(text), false);  // the server left: the job failed elsewhere
    else fatal_(Status::Internal(c->peer_name() + " rejected data: " + text), true);
    return;
  }
  if (TypeOf(h) == MsgType::kPushAck) {
    if (h.payload_len > 0) OpenWindow(c, h, payload);
    PendingPull* p = nullptr;
    {
      std::lock_guard<std::mutex> lk(pull_mu_);
      p = PendingLocked(h.key);
      if (p && p->round == h.aux && p->server == c->tag && p->awaiting_ack)
        p->awaiting_ack = false;
      else
        p = nullptr;
    }
    if (p) sink_->OnPushAcked(p);
    return;
  }
  if (TypeOf(h) == MsgType::kStallReport) {
    std::vector<int> missing;
    if (!DecodeWorkerIds(payload, h.payload_len, cfg_.num_worker, &missing).ok()) return;
    std::lock_guard<std::mutex> lk(pull_mu_);
    PendingPull* p = PendingLocked(h.key);
    if (p && p->round == h.aux) {
      p->stall_missing = std::move(missing);
      p->stall_reported = true;
    }
    return;
  }
  PendingPull* p;
  {
    std::lock_guard<std::mutex> lk(pull_mu_);
    p = PendingLocked(h.key);
    if (!p || !p->receiving) return;
    p->receiving = false;
    pending_pulls_[h.key] = nullptr;
  }
  pull_cv_.notify_all();
  sink_->OnPulled(p);
}

void PsClient::OpenWindow(Connection* c, const FrameHeader& h, const void* blob) {
  uint32_t id = 0;
  Status st = c->OpenWindow(std::string(static_cast<const char*>(blob), h.payload_len), &id);
  if (!st.ok()) {  // the key's pushes stay frames
    if (window_errors_.fetch_add(1) == 0)
      BPS_LOG(INFO) << "pushes to " << c->peer_name() << " stay frames: " << st.message();
    return;
  }
  std::lock_guard<std::mutex> lk(pull_mu_);
  windows_[h.key] = {c->tag, id};
}

Status PsClient::CheckWrittenLocked(Connection* c, const FrameHeader& h, const PendingPull* p,
                                    char** at) const {
  // Only the server the window went to writes into it (the van checked the write stayed in it);
  // plain sums only, of the length the window was offered for.
  auto it = pull_windows_.find(h.key);
  if (it == pull_windows_.end() || !it->second.offered || it->second.server != c->tag ||
      p->up_to || h.written != it->second.len)
    return Status::InvalidArgument("a one-way pull response of key " + std::to_string(h.key) +
                                   " (" + std::to_string(h.written) + " bytes) from " +
                                   c->peer_name() + ", which has no window for it");
  *at = it->second.at + (h.round & 1 ? it->second.stride : 0);
  return Status::OK();
}

PendingPull* PsClient::PendingLocked(uint64_t key) const {
  auto it = pending_pulls_.find(key);
  return it == pending_pulls_.end() ? nullptr : it->second;
}

void PsClient::OnClosed(Connection* c, const Status& why) {
  {
    // A response cut off mid-payload will never complete: nothing writes into it any more.
    std::lock_guard<std::mutex> lk(pull_mu_);
    for (auto& [key, p] : pending_pulls_)
      if (p && p->server == c->tag) p->receiving = false;
  }
  pull_cv_.notify_all();
  if (stopping_()) return;
  // A server also closes its connections when the job failed elsewhere (the scheduler told it
  // so); wait briefly for that news before blaming the server.
  Status blame =
      Status::PeerLost("lost the connection to " + c->peer_name() + " (" + why.message() + ")");
  std::lock_guard<std::mutex> lk(blame_mu_);
  if (blaming_) return;  // the first lost server is the one named
  blaming_ = true;
  blame_ = std::thread([this, blame] {
    for (int i = 0; i < 100 && !failed_() && !stopping_(); ++i) usleep(10000);
    if (!stopping_()) fatal_(blame, true);
  });
}

}  // namespace byteps
