#include "scheduler.h"

#include <cstdint>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <set>

#include "common/logging.h"

namespace byteps {

std::string Scheduler::Node::Describe() const {
  std::string s = NodeRoleName(reg.role);
  s += " " + std::to_string(rank) + " (host " + reg.host;
  if (reg.role == NodeRole::kServer) s += ":" + std::to_string(reg.port);
  return s + ", pid " + std::to_string(reg.pid) + ")";
}

Scheduler::Scheduler(SchedulerOptions opts) : opts_(std::move(opts)) {}

Scheduler::~Scheduler() {
  if (van_) van_->StopListening();
  for (auto& c : conns_) c->Join();
}

Status Scheduler::Run() {
  int port = 0;
  BPS_RETURN_IF_ERROR(Van::Create(opts_.van, &van_));
  Van::ListenOptions listen;
  listen.owner = "scheduler";
  listen.handshake_timeout_s = std::min(opts_.timeout_s, 5.0);
  listen.handler = this;
  listen.peer_name = "unregistered peer";
  start_ = Clock::now();
  BPS_RETURN_IF_ERROR(van_->Listen(
      opts_.host, opts_.port, listen,
      [this](std::unique_ptr<Connection> conn) { OnAccepted(std::move(conn)); }, &port));
  BPS_LOG(INFO) << "scheduler listening on " << opts_.host << ":" << port << ", expecting "
                << opts_.num_worker << " workers and " << opts_.num_server << " servers";
  std::unique_lock<std::mutex> lk(mu_);
  while (!done_) {
    cv_.wait_for(lk, std::chrono::milliseconds(200));
    CheckTimersLocked();
  }
  bool ok = failure_.empty();
  std::vector<Connection*> conns;
  for (auto& c : conns_) conns.push_back(c.get());
  lk.unlock();
  for (auto* c : conns) c->Flush(2.0);
  van_->StopListening();
  if (!ok) return Status::PeerLost(failure_);
  BPS_LOG(INFO) << "scheduler: all workers finished";
  return Status::OK();
}

void Scheduler::OnAccepted(std::unique_ptr<Connection> conn) {
  Connection* raw = conn.get();
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (done_) return;  // conn (and with it its socket) goes away here
    conns_.push_back(std::move(conn));
  }
  raw->Start();
}

Scheduler::Node* Scheduler::NodeOf(Connection* c) {
  return (c->tag >= 0 && c->tag < static_cast<int>(nodes_.size())) ? nodes_[c->tag].get() : nullptr;
}

Status Scheduler::OnHeader(Connection*, const FrameHeader& h, void**) {
  if (!IsControlType(TypeOf(h)))
    return Status::InvalidArgument(std::string("unexpected ") + MsgTypeName(TypeOf(h)) +
                                   " at the scheduler");
  return Status::OK();
}

void Scheduler::OnFrame(Connection* c, const FrameHeader& h, void* payload) {
  const char* p = static_cast<const char*>(payload);
  std::lock_guard<std::mutex> lk(mu_);
  if (done_) return;
  if (TypeOf(h) == MsgType::kRegister) return HandleRegister(c, p, h.payload_len);
  Node* node = NodeOf(c);
  if (!node) {
    BPS_LOG(WARNING) << "scheduler: " << MsgTypeName(TypeOf(h)) << " before REGISTER; dropping";
    c->Close();
    return;
  }
  node->last_seen = Clock::now();
  switch (TypeOf(h)) {
    case MsgType::kHeartbeat:  // echoed: a node whose link is cut notices the silence
      if (node->conn) node->conn->SendControl(MsgType::kHeartbeat, "");
      return;
    case MsgType::kNodeFailed:  // a node saw the first failure (e.g. a local process died)
      return FailLocked(DecodeText(p, h.payload_len));
    case MsgType::kDeclare: return HandleDeclare(node, p, h.payload_len);
    case MsgType::kJoin:
      if (node->reg.role == NodeRole::kWorker) return HandleJoinLocked(node, h, p, h.payload_len);
      return HandleJoinAckLocked(node);
    case MsgType::kFinalize:
      if (node->reg.role == NodeRole::kWorker && !node->finalized) WorkerDoneLocked(node);
      return;
    default:
      BPS_LOG(WARNING) << "scheduler: unexpected " << MsgTypeName(TypeOf(h)) << " from "
                       << node->Describe();
  }
}

void Scheduler::WorkerDoneLocked(Node* node) {
  node->finalized = true;
  if (finalized_workers_ + 1 < opts_.num_worker) {
    // The others go on: what this worker never submitted can never complete, and they should
    // say so now rather than after BYTEPS_TIMEOUT. In asynchronous mode the servers stop
    // waiting for it (staleness bound, initial values).
    for (auto& n : nodes_)
      if (n->conn && !n->finalized && (n->reg.role == NodeRole::kWorker || opts_.async_mode))
        n->conn->SendControl(MsgType::kWorkerLeft, "", 0, static_cast<uint32_t>(node->rank));
    FailDeclaresOfLeftWorkersLocked();
  }
  if (++finalized_workers_ == opts_.num_worker) {
    for (auto& n : nodes_) {
      if (!n->conn) continue;
      n->conn->SendControl(n->reg.role == NodeRole::kWorker ? MsgType::kFinalizeDone
                                                            : MsgType::kShutdown,
                           "");
      if (n->reg.role == NodeRole::kServer) n->finalized = true;
    }
    done_ = true;
    cv_.notify_all();
  }
}

std::string Scheduler::AsyncMismatchLocked() const {
  std::string bad;
  for (auto& n : nodes_) {
    if (n->reg.async_mode == opts_.async_mode &&
        (!opts_.async_mode || n->reg.max_staleness == opts_.max_staleness))
      continue;
    bad += (bad.empty() ? "" : ", ") + std::string(NodeRoleName(n->reg.role)) +
           (n->reg.role == NodeRole::kWorker ? " " + std::to_string(n->reg.worker_id) : "") +
           " (host " + n->reg.host + ", pid " + std::to_string(n->reg.pid) +
           ") has BYTEPS_ENABLE_ASYNC=" + (n->reg.async_mode ? "1" : "0") +
           (n->reg.async_mode ? ", BYTEPS_ASYNC_MAX_STALENESS=" +
                                    std::to_string(n->reg.max_staleness)
                              : "");
  }
  if (bad.empty()) return bad;
  return bad + "; the scheduler has BYTEPS_ENABLE_ASYNC=" + (opts_.async_mode ? "1" : "0") +
         (opts_.async_mode ? ", BYTEPS_ASYNC_MAX_STALENESS=" + std::to_string(opts_.max_staleness)
                           : "") +
         " (asynchronous training must be the same on every worker, server and the scheduler)";
}

void Scheduler::HandleRegister(Connection* c, const char* p, size_t n) {
  RegisterMsg reg;
  Status st = Decode(p, n, &reg);
  if (!st.ok() || c->tag >= 0) {
    BPS_LOG(WARNING) << "scheduler: bad REGISTER: " << st.message();
    c->Close();
    return;
  }
  std::string who = std::string(NodeRoleName(reg.role)) +
                    (reg.role == NodeRole::kWorker ? " " + std::to_string(reg.worker_id) : "") +
                    " (host " + reg.host + ", pid " + std::to_string(reg.pid) + ")";
  auto reject = [&](const std::string& why) {
    FailLocked("configuration mismatch: " + who + ": " + why);
    c->SendControl(MsgType::kNodeFailed, EncodeText(failure_));
  };
  if (book_sent_) return reject("registered after the job had started");
  if (reg.num_worker != static_cast<uint32_t>(opts_.num_worker) ||
      reg.num_server != static_cast<uint32_t>(opts_.num_server))
    return reject("it has DMLC_NUM_WORKER=" + std::to_string(reg.num_worker) +
                  ", DMLC_NUM_SERVER=" + std::to_string(reg.num_server) +
                  " but the scheduler has " + std::to_string(opts_.num_worker) + " and " +
                  std::to_string(opts_.num_server));
  int rank = -1;
  if (reg.role == NodeRole::kWorker) {
    if (reg.worker_id < 0 || reg.worker_id >= opts_.num_worker)
      return reject("DMLC_WORKER_ID=" + std::to_string(reg.worker_id) + " is outside [0, " +
                    std::to_string(opts_.num_worker) + ")");
    for (auto& nd : nodes_)
      if (nd->reg.role == NodeRole::kWorker && nd->reg.worker_id == reg.worker_id)
        return reject("DMLC_WORKER_ID=" + std::to_string(reg.worker_id) + " is used twice");
    if (first_local_size_ == 0) first_local_size_ = reg.local_size, first_bound_ = reg.partition_bound;
    if (reg.local_size != first_local_size_)
      return reject("BYTEPS_LOCAL_SIZE=" + std::to_string(reg.local_size) + " differs from " +
                    std::to_string(first_local_size_) + " on another worker");
    if (reg.partition_bound != first_bound_)
      return reject("BYTEPS_PARTITION_BYTES gives partitions of " +
                    std::to_string(reg.partition_bound) + " bytes, another worker uses " +
                    std::to_string(first_bound_));
    rank = reg.worker_id;
  } else {
    int servers = 0;
    for (auto& nd : nodes_) servers += nd->reg.role == NodeRole::kServer;
    if (servers >= opts_.num_server) return reject("more servers than DMLC_NUM_SERVER");
  }
  auto node = std::make_unique<Node>();
  node->reg = reg;
  node->conn = c;
  node->rank = rank;
  node->last_seen = Clock::now();
  c->tag = static_cast<int>(nodes_.size());
  c->set_peer_name(who);
  nodes_.push_back(std::move(node));
  BPS_LOG(INFO) << "scheduler: registered " << who;
  if (static_cast<int>(nodes_.size()) == opts_.num_worker + opts_.num_server) {
    // Checked once everyone has registered, so every node hears it (ConfigError everywhere).
    std::string bad = AsyncMismatchLocked();
    if (!bad.empty()) return FailLocked("configuration mismatch: " + bad);
    SendAddressBooksLocked();
  }
}

void Scheduler::SendAddressBooksLocked() {
  std::vector<Node*> servers;
  std::set<std::string> worker_hosts;
  for (auto& n : nodes_) {
    if (n->reg.role == NodeRole::kServer) servers.push_back(n.get());
    else worker_hosts.insert(n->reg.host);
  }
  std::sort(servers.begin(), servers.end(), [](Node* a, Node* b) {
    return std::make_pair(a->reg.host, a->reg.port) < std::make_pair(b->reg.host, b->reg.port);
  });
  std::vector<bool> colocated;
  for (size_t i = 0; i < servers.size(); ++i) {
    servers[i]->rank = static_cast<int>(i);
    colocated.push_back(worker_hosts.count(servers[i]->reg.host) > 0);
  }
  std::vector<double> shares = ServerShares(opts_.num_worker, colocated);
  planner_ = std::make_unique<KeyPlanner>(shares);
  AddressBook book;
  book.partition_bound = first_bound_;
  // The worker mesh (ps/peer_mesh.h): every local root's address, by worker id.
  book.workers.resize(static_cast<size_t>(opts_.num_worker));
  for (auto& n : nodes_)
    if (n->reg.role == NodeRole::kWorker)
      book.workers[static_cast<size_t>(n->rank)] =
          WorkerEntry{static_cast<uint32_t>(n->rank), n->reg.host, n->reg.port};
  for (size_t i = 0; i < servers.size(); ++i) {
    book.servers.push_back(ServerEntry{static_cast<uint32_t>(i), servers[i]->reg.host,
                                       servers[i]->reg.port, static_cast<bool>(colocated[i]),
                                       shares[i]});
    BPS_LOG(INFO) << "scheduler: server " << i << " at " << servers[i]->reg.host << ":"
                  << servers[i]->reg.port << (colocated[i] ? " (colocated)" : " (CPU-only)")
                  << " gets share " << shares[i] << " of the bytes";
  }
  // Nodes start heartbeating when they get the book: the clock starts now, not at their
  // registration (a node may have waited long for slow peers to register).
  auto now = Clock::now();
  for (auto& n : nodes_) {
    book.my_rank = n->rank;
    n->last_seen = now;
    n->conn->SendControl(MsgType::kAddressBook, Encode(book));
  }
  book_sent_ = true;
}

void Scheduler::CheckTimersLocked() {
  if (done_) return;
  auto now = Clock::now();
  auto secs = [&](Clock::time_point t) { return std::chrono::duration<double>(now - t).count(); };
  if (!book_sent_ && secs(start_) > opts_.timeout_s) {
    std::vector<bool> seen(opts_.num_worker, false);
    int servers = 0;
    for (auto& n : nodes_) {
      if (n->reg.role == NodeRole::kWorker) seen[n->reg.worker_id] = true;
      else servers++;
    }
    // Name only who is missing: "workers [1]", "1 of 2 servers", or both.
    std::string missing;
    if (std::find(seen.begin(), seen.end(), false) != seen.end()) {
      Pending registered;  // "declared" = registered, by every worker machine
      registered.seen = seen;
      registered.member.assign(seen.size(), true);
      missing = "workers " + MissingWorkersLocked(registered);
    }
    if (servers < opts_.num_server)
      missing += (missing.empty() ? "" : " and ") + std::to_string(opts_.num_server - servers) +
                 " of " + std::to_string(opts_.num_server) + " servers";
    return FailLocked("rendezvous timed out after " + std::to_string(int(opts_.timeout_s)) +
                      " s: " + missing + " never registered");
  }
  for (auto& n : nodes_) {
    if (n->finalized || !book_sent_) continue;
    if (secs(n->last_seen) > opts_.heartbeat_timeout_s) {
      const std::string why = n->Describe() + " sent no heartbeat for " +
                              std::to_string(int(opts_.heartbeat_timeout_s)) + " s";
      if (opts_.async_mode && n->reg.role == NodeRole::kWorker) {
        WorkerDiedLocked(n.get(), why);
        if (done_) return;
        continue;
      }
      return FailLocked(why);
    }
  }
  for (auto& [key, pd] : pending_) {
    if (!pd.answered && !pd.warned && opts_.stall_warning_s > 0 &&
        secs(pd.started) > opts_.stall_warning_s) {
      // Stall inspector: tell the workers that wait which workers have not declared the tensor
      // (DECLARE_REPLY aux 3: a warning, the operation goes on; payload: uint32 worker ids).
      pd.warned = true;
      std::vector<int> ids;
      for (int w = 0; w < opts_.num_worker; ++w)
        if (pd.member[w] && !pd.seen[w]) ids.push_back(w);
      std::string missing = EncodeWorkerIds(ids);
      BPS_LOG(WARNING) << "scheduler: tensor '" << pd.first.name << "' (key " << key
                       << ") has waited " << static_cast<int>(opts_.stall_warning_s)
                       << " s for workers " << MissingWorkersLocked(pd) << " to submit it";
      for (auto& n : nodes_)
        if (n->conn && n->reg.role == NodeRole::kWorker && n->reg.worker_id >= 0 &&
            static_cast<size_t>(n->reg.worker_id) < pd.seen.size() && pd.seen[n->reg.worker_id])
          n->conn->SendControl(MsgType::kDeclareReply, missing, key, 0,
                               ToAux(DeclareReply::kStallWarning));
    }
    if (pd.answered || secs(pd.started) <= opts_.timeout_s) continue;
    pd.timed_out = true;
    pd.error = "timed out after " + std::to_string(int(opts_.timeout_s)) + " s waiting for workers " +
               MissingWorkersLocked(pd) + " to submit tensor '" + pd.first.name + "' (key " +
               std::to_string(key) + ")";
    AnswerDeclare(key, &pd);
  }
}

void Scheduler::FailLocked(const std::string& why) {
  if (done_) return;
  failure_ = why;
  BPS_LOG(ERROR) << "scheduler: job failed: " << why;
  for (auto& n : nodes_)
    if (n->conn) n->conn->SendControl(MsgType::kNodeFailed, EncodeText(why));
  done_ = true;
  cv_.notify_all();
}

void Scheduler::WorkerDiedLocked(Node* node, const std::string& why) {
  BPS_LOG(WARNING) << "scheduler: " << why << "; asynchronous training: the other workers go on "
                   << "without worker " << node->rank;
  WorkerDoneLocked(node);
}

void Scheduler::OnClosed(Connection* c, const Status& why) {
  std::lock_guard<std::mutex> lk(mu_);
  Node* node = NodeOf(c);
  if (!node) return;
  node->conn = nullptr;
  if (node->finalized || done_) return;
  const std::string text = node->Describe() + " disconnected (" + why.message() + ")";
  // Asynchronous mode (docs/async.md): a worker that dies leaves the job; the others train on.
  if (opts_.async_mode && book_sent_ && node->reg.role == NodeRole::kWorker)
    return WorkerDiedLocked(node, text);
  FailLocked(text);
}

}  // namespace byteps
