// The scheduler's declarations (docs/architecture.md §3, step 1): a tensor's DECLARE from
// every worker machine of its set (or a joined or departed one's place), the comparison of
// what they declared (one error on every rank when they differ), and the plan of its
// partitions' servers. Part of Scheduler (ps/scheduler.h); every function runs under its lock.
#include <algorithm>
#include <cstdint>

#include "common/dtype.h"
#include "common/logging.h"
#include "ps/collective_programs.h"
#include "ps/scheduler.h"
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

bool Scheduler::DeclaredByLiveWorkersLocked(const Pending& pd) const {
  int covered = pd.count;
  for (auto& n : nodes_)
    if (n->reg.role == NodeRole::kWorker && n->finalized && pd.member[n->rank] &&
        !pd.seen[n->rank])
      covered++;
  return covered == pd.expected;
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

}  // namespace byteps
