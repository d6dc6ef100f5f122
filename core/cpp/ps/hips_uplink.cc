// HiPS on the summation servers (docs/schemes.md): a first-level server sums its group's pushes
// (the round logic's first-level keys), forwards each round's group sum to the partition's
// top-level server over an uplink, and answers its group's pulls with the total that comes
// back; a top-level server sums the first-level servers' pushes as it sums workers'.
#include <cstdint>
#include <string>

#include "common/logging.h"
#include "ps/server.h"
#include "ps/sync_scheme.h"

namespace byteps {

int SummationServer::HipsGroups() const {
  return opts_.hips_group > 0 ? byteps::HipsGroups(opts_.num_worker, opts_.hips_group) : 0;
}

Connection* SummationServer::Lower(int group) {
  std::lock_guard<std::mutex> lk(conns_mu_);
  return group >= 0 && group < static_cast<int>(lowers_.size()) ? lowers_[group] : nullptr;
}

Status SummationServer::ConnectUplinks(const AddressBook& book) {
  const int first = HipsGroups();
  if (first == 0) return Status::OK();
  const int servers = static_cast<int>(book.servers.size());
  if (servers < first + 1) {
    BPS_LOG(DEBUG) << "HiPS needs " << first + 1 << " servers for " << opts_.num_worker
                   << " worker machines in groups of " << opts_.hips_group << ", the job has "
                   << servers << ": HiPS tensors will be refused";
    return Status::OK();
  }
  if (rank_ >= first) {  // the top level: first-level servers connect here, one per group
    std::lock_guard<std::mutex> lk(conns_mu_);
    lowers_.assign(static_cast<size_t>(first), nullptr);
    for (int g = 0; g < first; ++g) top_role_.senders.push_back(g);
    top_role_.level = KeyLevel::kHipsTop;
    BPS_LOG(INFO) << "HiPS: top-level server of " << first << " groups";
    return Status::OK();
  }
  KeyRole role;
  role.level = KeyLevel::kHipsFirst;
  for (int w = rank_ * opts_.hips_group;
       w < std::min((rank_ + 1) * opts_.hips_group, opts_.num_worker); ++w)
    role.senders.push_back(w);
  for (int t = first; t < servers; ++t) {
    const ServerEntry& e = book.servers[static_cast<size_t>(t)];
    const std::string name = "top-level server " + std::to_string(t) + " at " + e.host + ":" +
                             std::to_string(e.port);
    std::unique_ptr<Connection> conn;
    Status st = van_->Connect(e.host, static_cast<int>(e.port), opts_.timeout_s,
                              &uplink_handler_, name, &conn);
    if (!st.ok()) return Status(st.code(), "HiPS: cannot reach " + name + ": " + st.message());
    conn->tag = t;
    conn->Start();
    conn->SendControl(MsgType::kHello, "", 0, static_cast<uint32_t>(rank_), kHelloFromServer);
    uplinks_.push_back(std::move(conn));
    role.upper = t;
    first_roles_.push_back(role);
  }
  BPS_LOG(INFO) << "HiPS: first-level server of group " << rank_ << " (worker machines "
                << role.senders.front() << "-" << role.senders.back() << "), "
                << uplinks_.size() << " top-level servers";
  return Status::OK();
}

void SummationServer::Forward(RoundKey& k, int parity) {
  const int first = HipsGroups();
  const size_t up = static_cast<size_t>(k.upper - first);
  if (k.upper < first || up >= uplinks_.size()) return;
  SendItem& item = static_cast<Replies*>(k.attachment.get())->forward[parity];
  item.hdr = KeyFrame(MsgType::kPush, k, k.round[parity]);
  item.hdr.flags = kPushFlagPull | kPushFlagHipsUp | PushOpFlags(k.op);
  item.payload = k.sum[parity];
  item.len = k.len;
  uplinks_[up]->Send(&item);
}

Status SummationServer::Uplink::OnHeader(Connection* c, const FrameHeader& h, void** dest) {
  switch (TypeOf(h)) {
    case MsgType::kPushAck:
    case MsgType::kDataError: return Status::OK();
    case MsgType::kPullResponse: {
      char* d = s_->rounds_.ForwardBuffer(h.key, h.round, h.payload_len);
      if (!d)
        return Status::InvalidArgument("unexpected PULL_RESPONSE for key " +
                                       std::to_string(h.key) + " round " +
                                       std::to_string(h.round) + " from " + c->peer_name());
      *dest = d;
      return Status::OK();
    }
    default:
      return Status::InvalidArgument(std::string("unexpected ") + MsgTypeName(TypeOf(h)) +
                                     " from " + c->peer_name());
  }
}

void SummationServer::Uplink::OnFrame(Connection* c, const FrameHeader& h, void* payload) {
  if (TypeOf(h) == MsgType::kPullResponse) return s_->rounds_.Forwarded(h.key, h.round);
  if (TypeOf(h) == MsgType::kDataError)
    BPS_LOG(ERROR) << c->peer_name() << " refused this group's sum: "
                   << std::string(static_cast<const char*>(payload), h.payload_len);
}

void SummationServer::Uplink::OnClosed(Connection* c, const Status& why) {
  if (!s_->stopping_)
    BPS_LOG(ERROR) << "HiPS: lost " << c->peer_name() << ": " << why.message();
}

}  // namespace byteps
