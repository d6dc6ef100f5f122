#include "scheduler.h"

#include <cstdint>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <set>

#include "common/dtype.h"
#include "common/logging.h"
#include "ps/collective_programs.h"
#include "ps/sync_scheme.h"
#include "reduce/sum.h"
#include "scheduling/partitioner.h"

namespace byteps {
namespace {

// A declaration's compressor as the mismatch error says it.
std::string CompressionText(const std::string& spec) {
  return spec.empty() ? "uncompressed" : "'" + spec + "'";
}

}  // namespace

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

bool Scheduler::DeclaredByLiveWorkersLocked(const Pending& pd) const {
  int covered = pd.count;
  for (auto& n : nodes_)
    if (n->reg.role == NodeRole::kWorker && n->finalized && pd.member[n->rank] &&
        !pd.seen[n->rank])
      covered++;
  return covered == pd.expected;
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

std::string Scheduler::MissingWorkersLocked(const Pending& pd) const {
  std::string s;
  for (int w = 0; w < opts_.num_worker; ++w)
    if (pd.member[w] && !pd.seen[w]) s += (s.empty() ? "" : ", ") + std::to_string(w);
  return "[" + s + "]";
}

void Scheduler::HandleDeclare(Node* node, const char* p, size_t n) {
  DeclareMsg m;
  Status st = Decode(p, n, &m);
  if (!st.ok() || node->reg.role != NodeRole::kWorker) {
    BPS_LOG(WARNING) << "scheduler: bad DECLARE from " << node->Describe();
    return;
  }
  if (AnswerOwedLocked(node, m)) return;
  auto it = pending_.find(m.declared_key);
  if (it == pending_.end()) {
    Pending pd;
    pd.first = m;
    pd.first_worker = node->rank;
    pd.seen.assign(opts_.num_worker, false);
    pd.member.assign(opts_.num_worker, m.members.empty());
    for (int64_t w : m.members)
      if (w >= 0 && w < opts_.num_worker) pd.member[w] = true;
    pd.expected = static_cast<int>(std::count(pd.member.begin(), pd.member.end(), true));
    pd.started = Clock::now();
    it = pending_.emplace(m.declared_key, std::move(pd)).first;
  }
  Pending& pd = it->second;
  if (pd.seen[node->rank]) return;
  pd.seen[node->rank] = true;
  pd.count++;
  const DeclareMsg& f = pd.first;
  if (pd.error.empty() && (m.members != f.members || !pd.member[node->rank])) {
    auto machines = [](const DeclareMsg& d) {
      if (d.members.empty()) return std::string("every worker machine");
      std::string s;
      for (int64_t w : d.members) s += (s.empty() ? "" : ", ") + std::to_string(w);
      return "worker machines [" + s + "]";
    };
    pd.error = "tensor '" + m.name + "' (key " + std::to_string(m.declared_key) +
               ") belongs to different process sets across workers: worker " +
               std::to_string(pd.first_worker) + " declares it for " + machines(f) +
               ", worker " + std::to_string(node->rank) + " for " + machines(m) +
               " (every rank adds the same process sets in the same order, and only a set's "
               "ranks call its operations)";
  }
  if (pd.error.empty() && m.partition_bound > first_bound_)
    pd.error = "tensor '" + m.name + "' declared by worker " + std::to_string(node->rank) +
               " with partitions of " + std::to_string(m.partition_bound) +
               " bytes, more than the job's bound of " + std::to_string(first_bound_) +
               " bytes agreed at registration";
  if (pd.error.empty() &&
      (m.partition_bound != f.partition_bound || m.generation != f.generation))
    pd.error = "tensor '" + m.name + "' (key " + std::to_string(m.declared_key) +
               ") is cut differently across workers: worker " +
               std::to_string(pd.first_worker) + " uses partitions of " +
               std::to_string(f.partition_bound) + " bytes (generation " +
               std::to_string(f.generation) + "), worker " + std::to_string(node->rank) + " " +
               std::to_string(m.partition_bound) + " bytes (generation " +
               std::to_string(m.generation) +
               ") (BYTEPS_AUTOTUNE switches every worker at the same round only when all of "
               "them make the same push_pull calls in the same order)";
  if (pd.error.empty() && (m.sync != f.sync || m.sync_param != f.sync_param)) {
    auto scheme = [](const DeclareMsg& d) {
      std::string s = SyncSchemeName(static_cast<SyncScheme>(d.sync));
      if (static_cast<SyncScheme>(d.sync) == SyncScheme::kTree)
        s += " of width " + std::to_string(d.sync_param);
      if (static_cast<SyncScheme>(d.sync) == SyncScheme::kHips)
        s += " in groups of " + std::to_string(d.sync_param);
      return s;
    };
    pd.error = "tensor '" + m.name + "' (key " + std::to_string(m.declared_key) +
               ") is synchronized differently across workers: worker " +
               std::to_string(pd.first_worker) + " uses " + scheme(f) + ", worker " +
               std::to_string(node->rank) + " " + scheme(m) +
               " (BYTEPS_SYNC, BYTEPS_TREE_WIDTH, BYTEPS_HIPS_GROUP and a declaration's sync must "
               "agree on every worker)";
  }
  if (pd.error.empty() && (m.collective != f.collective || m.root != f.root || m.root_rank != f.root_rank ||
                           m.blocks != f.blocks)) {
    auto layout = [](const DeclareMsg& d) {
      std::string s = CollectiveName(static_cast<Collective>(d.collective));
      if (d.root >= 0)
        s += " from rank " + std::to_string(d.root_rank) + " (worker machine " +
             std::to_string(d.root) + ")";
      if (!d.blocks.empty()) {
        s += " with blocks at bytes";
        for (uint64_t b : d.blocks) s += " " + std::to_string(b);
      }
      return s;
    };
    pd.error = "tensor '" + m.name + "' (key " + std::to_string(m.declared_key) +
               ") is a different collective across workers: worker " +
               std::to_string(pd.first_worker) + " calls " + layout(f) + ", worker " +
               std::to_string(node->rank) + " " + layout(m) +
               " (every rank calls the same collective, with the same root, in the same order)";
  }
  if (pd.error.empty() && m.op != f.op)
    pd.error = "tensor '" + m.name + "' (key " + std::to_string(m.declared_key) +
               ") is reduced differently across workers: worker " +
               std::to_string(pd.first_worker) + " uses op " +
               reduce::ReduceOpName(static_cast<reduce::ReduceOp>(f.op)) + ", worker " +
               std::to_string(node->rank) + " op " +
               reduce::ReduceOpName(static_cast<reduce::ReduceOp>(m.op)) +
               " (a tensor name is reduced with one op on every worker)";
  if (pd.error.empty() && (m.name != f.name || m.dtype != f.dtype || m.shape != f.shape ||
                           m.nbytes != f.nbytes || m.compression != f.compression)) {
    pd.error = "tensor mismatch across workers for key " + std::to_string(m.declared_key) +
               ": worker " + std::to_string(pd.first_worker) + " has '" + f.name + "' " +
               DTypeName(static_cast<DType>(f.dtype)) + ShapeString(f.shape) + ", worker " +
               std::to_string(node->rank) + " has '" + m.name + "' " +
               DTypeName(static_cast<DType>(m.dtype)) + ShapeString(m.shape) +
               (m.compression == f.compression
                    ? std::string()
                    : " (compression: worker " + std::to_string(pd.first_worker) + " " +
                          CompressionText(f.compression) + ", worker " +
                          std::to_string(node->rank) + " " + CompressionText(m.compression) +
                          ")") +
               " (tensors must be declared in the same order with the same dtype, shape and "
               "compression on every worker)";
  }
  if (pd.answered) {
    // Late arrival after a timeout: it gets the same error.
    node->conn->SendControl(MsgType::kDeclareReply, EncodeText(pd.error), m.declared_key, 0,
                            ToAux(pd.timed_out ? DeclareReply::kTimeout : DeclareReply::kMismatch));
    return;
  }
  if (CoveredLocked(pd) == pd.expected) AnswerDeclare(m.declared_key, &pd);
  else if (finalized_workers_ > 0) FailDeclaresOfLeftWorkersLocked();
}

void Scheduler::FailDeclaresOfLeftWorkersLocked() {
  for (auto& [key, pd] : pending_) {
    if (pd.answered) continue;
    // Asynchronous mode: the workers that are left go on without those that left.
    if (opts_.async_mode) {
      if (DeclaredByLiveWorkersLocked(pd)) AnswerDeclare(key, &pd);
      continue;
    }
    std::string left;
    for (auto& n : nodes_)
      if (n->reg.role == NodeRole::kWorker && n->finalized && pd.member[n->rank] &&
          !pd.seen[n->rank]) {
        const int L = static_cast<int>(std::max<uint32_t>(first_local_size_, 1));
        left += (left.empty() ? "" : ", ") + std::to_string(n->rank) +
                (L == 1 ? " (rank " + std::to_string(n->rank) + ")"
                        : " (ranks " + std::to_string(n->rank * L) + "-" +
                              std::to_string(n->rank * L + L - 1) + ")");
      }
    if (left.empty()) continue;
    if (pd.error.empty())
      pd.error = "'" + pd.first.name + "' can never be declared by every worker: worker " +
                 left + " has shut down (called shutdown() or exited) without declaring it; "
                 "every rank must make the same push_pull calls";
    AnswerDeclare(key, &pd);
  }
}

void Scheduler::AnswerDeclare(uint32_t key, Pending* pd) {
  pd->answered = true;
  std::string payload;
  bool error = !pd->error.empty();
  if (error) {
    payload = EncodeText(pd->error);
    BPS_LOG(WARNING) << "scheduler: " << pd->error;
  } else {
    std::vector<Partition> parts;
    // The workers' partitioning of the tensor (scheduling/partitioner.h), for its plan.
    const int local_size = static_cast<int>(std::max<uint32_t>(first_local_size_, 1));
    // The bound the workers cut it with (BYTEPS_AUTOTUNE: the trial's, at most the job's); a
    // compressed tensor (its declaration names the compressor) at the job's bound only.
    const size_t job_bound = pd->first.partition_bound ? pd->first.partition_bound : first_bound_;
    const size_t bound = TensorPartitionBound(pd->first.nbytes, job_bound, opts_.num_worker,
                                              local_size, !pd->first.compression.empty());
    Status st = PartitionTensor(pd->first.nbytes, bound,
                                DTypeSize(static_cast<DType>(pd->first.dtype)), &parts);
    if (!st.ok()) {
      error = true;
      payload = EncodeText(st.message());
    } else if (IsCollective(static_cast<SyncScheme>(pd->first.sync))) {
      // An all-reduce among the workers: no server (docs/schemes.md).
      payload = EncodeDeclareOk(std::vector<int64_t>(parts.size(), -1));
    } else if (static_cast<SyncScheme>(pd->first.sync) == SyncScheme::kHips) {
      // HiPS: the partitions go to the top-level servers (ranks from the first level's count
      // on), evenly; a worker pushes to its group's first-level server, which forwards.
      const int g = static_cast<int>(std::max<uint32_t>(pd->first.sync_param, 1));
      const int first = HipsGroups(opts_.num_worker, g);
      if (opts_.num_server < first + 1) {
        error = true;
        payload = EncodeText("tensor '" + pd->first.name + "' is declared with sync=hips: " +
                             std::to_string(opts_.num_worker) + " worker machines in groups of " +
                             std::to_string(g) + " need " + std::to_string(first + 1) +
                             " servers (one per group and one on top), the job has " +
                             std::to_string(opts_.num_server) + " (DMLC_NUM_SERVER)");
      } else {
        auto& top = hips_planners_[g];
        if (!top) top = std::make_unique<KeyPlanner>(
            std::vector<double>(opts_.num_server - first, 1.0 / (opts_.num_server - first)));
        std::vector<size_t> sizes;
        for (auto& pt : parts) sizes.push_back(pt.length);
        std::vector<int64_t> where;
        for (int s : top->Assign(sizes)) where.push_back(s + first);
        payload = EncodeDeclareOk(where);
      }
    } else if (opts_.num_server < 1) {
      error = true;
      payload = EncodeText("tensor '" + pd->first.name + "' is declared with sync=" +
                           SyncSchemeName(static_cast<SyncScheme>(pd->first.sync)) +
                           " but the job has no server (DMLC_NUM_SERVER=0): use ring or tree");
    } else {
      std::vector<size_t> sizes;
      for (auto& pt : parts) sizes.push_back(pt.length);
      std::vector<int> where = planner_->Assign(sizes);
      payload = EncodeDeclareOk(std::vector<int64_t>(where.begin(), where.end()));
      BPS_LOG(DEBUG) << "scheduler: tensor '" << pd->first.name << "' key " << key << ": "
                     << parts.size() << " partitions; " << planner_->Describe();
    }
  }
  for (auto& n : nodes_) {
    if (n->reg.role != NodeRole::kWorker || !pd->seen[n->rank] || !n->conn) continue;
    n->conn->SendControl(MsgType::kDeclareReply, payload, key, 0,
                         ToAux(!error           ? DeclareReply::kOk
                               : pd->timed_out ? DeclareReply::kTimeout
                                               : DeclareReply::kMismatch));
  }
  if (!error) NoteJoinedLocked(key, *pd, payload);
  if (!error && pd->first.generation > 0) {
    // BYTEPS_AUTOTUNE cut the tensor anew and every live worker machine declared the new cut,
    // each only once its operations of the old one completed: the servers free the old keys.
    for (auto& n : nodes_)
      if (n->reg.role == NodeRole::kServer && n->conn)
        n->conn->SendControl(MsgType::kRetireKeys, std::string(), key, 0,
                             pd->first.generation);
  }
  if (!error) pending_.erase(key);
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
