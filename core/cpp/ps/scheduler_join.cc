// The scheduler's half of Horovod's join (docs/collectives.md, "Join"). Part of Scheduler
// (ps/scheduler.h); every function runs under the scheduler's lock.
//
// A worker machine that ran out of data sends JOIN (its rank; the round of each of its tensors)
// and waits. The scheduler tells every server which machines have joined (the servers complete
// rounds without them) and lets declarations go ahead without them; a joined machine hears the
// name of every tensor declared meanwhile (JOINED_NOTE), so that its keys keep agreeing, and
// its own later declaration of it is answered here with the same plan. When the last machine
// joins, the servers are told that no machine is joined any more, and once every server has
// acknowledged that (before any machine can push again), every worker hears JOIN_DONE: the rank
// that joined last and, per tensor, the highest round reported, which each takes as its own
// (the rounds a joined machine missed are skipped by it).
#include <algorithm>

#include "common/logging.h"
#include "ps/scheduler.h"

namespace byteps {

void Scheduler::HandleJoinLocked(Node* node, const FrameHeader& h, const char* p, size_t n) {
  std::vector<std::pair<uint32_t, uint32_t>> rounds;
  if (!DecodeRounds(p, n, &rounds).ok()) {
    BPS_LOG(WARNING) << "scheduler: bad JOIN from " << node->Describe();
    return;
  }
  if (joined_.empty()) joined_.assign(opts_.num_worker, false);
  if (joined_[node->rank] || lifting_join_) return;
  for (auto& [key, round] : rounds) {
    uint32_t& r = join_rounds_[key];
    r = std::max(r, round);
  }
  joined_[node->rank] = true;
  last_joined_rank_ = static_cast<int>(h.key);
  int live = 0, joined = 0;
  for (auto& w : nodes_)
    if (w->reg.role == NodeRole::kWorker && !w->finalized) {
      live++;
      joined += joined_[w->rank] ? 1 : 0;
    }
  BPS_LOG(DEBUG) << "scheduler: worker " << node->rank << " (rank " << h.key << ") joined, "
                 << joined << " of " << live;
  if (joined == live) {
    lifting_join_ = true;
    joined_.assign(opts_.num_worker, false);
  }
  SendJoinToServersLocked();
  if (lifting_join_) {
    HandleJoinAckLocked(nullptr);  // a job without servers has nothing to wait for
    return;
  }
  std::vector<uint32_t> ready;  // AnswerDeclare erases what it answers well: keys first
  for (auto& [key, pd] : pending_)
    if (!pd.answered && pd.error.empty() && CoveredLocked(pd) == pd.expected)
      ready.push_back(key);
  for (uint32_t key : ready) AnswerDeclare(key, &pending_.at(key));
}

void Scheduler::SendJoinToServersLocked() {
  std::vector<int> ids;
  for (int w = 0; w < static_cast<int>(joined_.size()); ++w)
    if (joined_[w]) ids.push_back(w);
  const std::string payload = EncodeWorkerIds(ids);
  for (auto& s : nodes_)
    if (s->reg.role == NodeRole::kServer && s->conn) {
      s->conn->SendControl(MsgType::kJoin, payload);
      join_acks_[s->rank]++;
    }
}

void Scheduler::HandleJoinAckLocked(Node* node) {
  if (node) {
    auto it = join_acks_.find(node->rank);
    if (it != join_acks_.end() && it->second > 0) it->second--;
  }
  if (!lifting_join_) return;
  for (auto& [server, waiting] : join_acks_)
    if (waiting > 0) return;
  std::vector<std::pair<uint32_t, uint32_t>> rounds(join_rounds_.begin(), join_rounds_.end());
  const std::string payload = EncodeRounds(rounds);
  for (auto& w : nodes_)
    if (w->reg.role == NodeRole::kWorker && w->conn && !w->finalized)
      w->conn->SendControl(MsgType::kJoinDone, payload, 0, 0,
                           static_cast<uint64_t>(std::max(last_joined_rank_, 0)));
  BPS_LOG(DEBUG) << "scheduler: every worker joined; rank " << last_joined_rank_ << " last";
  lifting_join_ = false;
  join_rounds_.clear();
  last_joined_rank_ = -1;
}

int Scheduler::CoveredLocked(const Pending& pd) const {
  int covered = pd.count;
  for (int w = 0; w < static_cast<int>(joined_.size()); ++w)
    if (joined_[w] && pd.member[w] && !pd.seen[w]) covered++;
  return covered;
}

void Scheduler::NoteJoinedLocked(uint32_t key, const Pending& pd, const std::string& payload) {
  Owed owed{pd.first, payload, std::vector<bool>(opts_.num_worker, false)};
  bool any = false;
  for (auto& w : nodes_) {
    if (w->reg.role != NodeRole::kWorker || w->rank >= static_cast<int>(joined_.size()) ||
        !joined_[w->rank] || !pd.member[w->rank] || pd.seen[w->rank] || !w->conn)
      continue;
    w->conn->SendControl(MsgType::kDeclareReply, EncodeText(pd.first.name), key, 0,
                         static_cast<uint64_t>(DeclareReply::kJoinedNote));
    owed.owed[w->rank] = true;
    any = true;
  }
  if (any) owed_[key] = std::move(owed);
}

bool Scheduler::AnswerOwedLocked(Node* node, const DeclareMsg& m) {
  auto it = owed_.find(m.declared_key);
  if (it == owed_.end() || !it->second.owed[node->rank]) return false;
  const DeclareMsg& f = it->second.first;
  const bool same = m.name == f.name && m.dtype == f.dtype && m.shape == f.shape &&
                    m.nbytes == f.nbytes && m.compression == f.compression && m.op == f.op &&
                    m.sync == f.sync && m.sync_param == f.sync_param &&
                    m.collective == f.collective && m.root == f.root &&
                    m.root_rank == f.root_rank && m.blocks == f.blocks &&
                    m.members == f.members && m.partition_bound == f.partition_bound &&
                    m.generation == f.generation;
  if (same) {
    node->conn->SendControl(MsgType::kDeclareReply, it->second.payload, m.declared_key, 0,
                            static_cast<uint64_t>(DeclareReply::kOk));
  } else {
    const std::string text = "tensor '" + m.name + "' (key " + std::to_string(m.declared_key) +
                             ") declared by worker " + std::to_string(node->rank) +
                             " after a join differs from what the others declared while it "
                             "was joined ('" + f.name + "', the same dtype, shape, op, "
                             "collective and compression needed)";
    BPS_LOG(WARNING) << "scheduler: " << text;
    node->conn->SendControl(MsgType::kDeclareReply, EncodeText(text), m.declared_key, 0,
                            static_cast<uint64_t>(DeclareReply::kMismatch));
  }
  it->second.owed[node->rank] = false;
  if (std::none_of(it->second.owed.begin(), it->second.owed.end(), [](bool b) { return b; }))
    owed_.erase(it);
  return true;
}

}  // namespace byteps
