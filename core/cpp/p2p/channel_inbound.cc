// P2pChannel: the inbound links (channel.h). Every header is checked before anything in it is
// used (ValidateHeader: type and length bounds), a link is bound to a rank only by a valid
// HELLO, and payloads go straight into the matched receive's memory or into a buffer bounded by
// max_message_bytes and max_buffered_bytes.
#include <cstdint>
#include <cstring>

#include "common/logging.h"
#include "p2p/channel.h"

namespace byteps {
namespace {
LogLimiter g_refused_log;
}  // namespace

Status P2pChannel::ValidateHeader(const FrameHeader& h) {
  switch (static_cast<P2pMsg>(h.type)) {
    case P2pMsg::kHello:
      if (h.payload_len != kP2pHelloBytes)
        return Status::InvalidArgument("p2p HELLO of " + std::to_string(h.payload_len) +
                                       " bytes (expected " + std::to_string(kP2pHelloBytes) + ")");
      return Status::OK();
    case P2pMsg::kData:
      if (h.payload_len > opts_.max_message_bytes)
        return Status::InvalidArgument("p2p message of " + std::to_string(h.payload_len) +
                                       " bytes exceeds the largest accepted (" +
                                       std::to_string(opts_.max_message_bytes) + ")");
      return Status::OK();
    case P2pMsg::kGoodbye:
      if (h.payload_len != 0) return Status::InvalidArgument("p2p GOODBYE with a payload");
      return Status::OK();
    case P2pMsg::kFailed:
      if (h.payload_len > kP2pMaxReasonBytes)
        return Status::InvalidArgument("p2p FAILED reason of " + std::to_string(h.payload_len) +
                                       " bytes");
      return Status::OK();
  }
  return Status::InvalidArgument("p2p: unknown message type " + std::to_string(h.type));
}

Status P2pChannel::OnHeader(Connection* c, const FrameHeader& h, void** dest) {
  const auto type = static_cast<P2pMsg>(h.type);
  const int rank = c->tag;
  if (rank < 0) {
    // Not bound yet: HELLO only (received into the link's own buffer, checked in OnFrame).
    if (type != P2pMsg::kHello)
      return Status::InvalidArgument("p2p: message type " + std::to_string(h.type) +
                                     " before HELLO");
    return Status::OK();
  }
  if (type == P2pMsg::kHello) return Status::InvalidArgument("p2p: a second HELLO");
  if (h.sender != static_cast<uint32_t>(rank))
    return Status::InvalidArgument("p2p: a frame of rank " + std::to_string(rank) +
                                   " names sender " + std::to_string(h.sender));
  if (type != P2pMsg::kData) return Status::OK();  // GOODBYE, FAILED: the link's buffer
  std::lock_guard<std::mutex> lk(mu_);
  Inbound& in = inbound_[rank];
  in.cur_op = nullptr;
  in.cur_early.reset();
  if (closing_ || !failure_.ok()) {
    *dest = Connection::kDiscard;
    return Status::OK();
  }
  const auto key = std::make_pair(rank, h.key);
  auto it = posted_.find(key);
  if (it != posted_.end() && !it->second.empty()) {
    Op* op = it->second.front();
    it->second.pop_front();
    if (it->second.empty()) posted_.erase(it);
    if (op->dest && h.payload_len > op->capacity) {
      Complete(op, Status::InvalidArgument(
                       "p2p receive from rank " + std::to_string(rank) + " (tag " +
                       std::to_string(h.key) + "): a message of " +
                       std::to_string(h.payload_len) + " bytes does not fit the buffer of " +
                       std::to_string(op->capacity)));
      *dest = Connection::kDiscard;
      return Status::OK();
    }
    if (!op->dest) {
      op->owned.data.reset(new char[h.payload_len ? h.payload_len : 1]);
      op->owned.size = h.payload_len;
      *dest = op->owned.data.get();
    } else {
      *dest = op->dest;
    }
    op->receiving = true;
    op->nbytes = h.payload_len;
    in.cur_op = op;
    return Status::OK();
  }
  if (buffered_bytes_ + h.payload_len > opts_.max_buffered_bytes)
    return Status::InvalidArgument(
        "p2p: rank " + std::to_string(rank) + " sent a message of " +
        std::to_string(h.payload_len) + " bytes while " + std::to_string(buffered_bytes_) +
        " bytes wait for their receives (at most " + std::to_string(opts_.max_buffered_bytes) +
        " are held)");
  auto e = std::make_shared<Early>();
  e->buf.data.reset(new char[h.payload_len ? h.payload_len : 1]);
  e->buf.size = h.payload_len;
  buffered_bytes_ += h.payload_len;
  early_[key].push_back(e);
  in.cur_early = e;
  *dest = e->buf.data.get();
  return Status::OK();
}

Status P2pChannel::BindHello(Connection* c, const FrameHeader& h, const char* payload) {
  WireReader r(payload, h.payload_len);
  const uint32_t magic = r.U32(), rank = r.U32(), size = r.U32();
  if (!r.done() || magic != kP2pHelloMagic)
    return Status::InvalidArgument("p2p: a malformed HELLO");
  if (size != static_cast<uint32_t>(opts_.size))
    return Status::InvalidArgument("p2p: HELLO of a job of " + std::to_string(size) +
                                   " ranks (this one has " + std::to_string(opts_.size) + ")");
  if (rank >= size || static_cast<int>(rank) == opts_.rank || h.sender != rank)
    return Status::InvalidArgument("p2p: HELLO from rank " + std::to_string(rank));
  std::lock_guard<std::mutex> lk(mu_);
  Inbound& in = inbound_[rank];
  if (in.conn || in.goodbye)
    return Status::InvalidArgument("p2p: a second link claims rank " + std::to_string(rank));
  in.conn = c;
  c->tag = static_cast<int>(rank);
  c->set_peer_name(PeerName(static_cast<int>(rank)));
  cv_.notify_all();
  return Status::OK();
}

void P2pChannel::OnFrame(Connection* c, const FrameHeader& h, void* payload) {
  const auto type = static_cast<P2pMsg>(h.type);
  if (type == P2pMsg::kHello) {
    Status st = BindHello(c, h, static_cast<const char*>(payload));
    if (!st.ok()) {
      std::string more;
      if (g_refused_log.Allow(&more))
        BPS_LOG(WARNING) << "p2p channel of rank " << opts_.rank << ": refusing a link: "
                         << st.message() << more;
      c->Close();  // not bound: its end is no rank's loss
    }
    return;
  }
  const int rank = c->tag;
  if (type == P2pMsg::kFailed) {
    std::string reason(static_cast<const char*>(payload), h.payload_len);
    Fail(Status::PeerLost("rank " + std::to_string(rank) + " failed: " + reason), rank);
    return;
  }
  std::lock_guard<std::mutex> lk(mu_);
  Inbound& in = inbound_[rank];
  if (type == P2pMsg::kGoodbye) {
    in.goodbye = true;
    FailWaitersOf(rank, Status::PeerLost("p2p receive from rank " + std::to_string(rank) +
                                         ": that rank closed its channel first"));
    return;
  }
  if (in.cur_op) {
    Complete(in.cur_op, Status::OK());
    in.cur_op = nullptr;
  } else if (in.cur_early) {
    std::shared_ptr<Early> e = std::move(in.cur_early);
    e->arrived = true;
    if (Op* op = e->waiter) {
      buffered_bytes_ -= e->buf.size;
      if (op->dest && e->buf.size > op->capacity) {
        Complete(op, Status::InvalidArgument(
                         "p2p receive from rank " + std::to_string(rank) + " (tag " +
                         std::to_string(h.key) + "): a message of " +
                         std::to_string(e->buf.size) + " bytes does not fit the buffer of " +
                         std::to_string(op->capacity)));
      } else {
        op->nbytes = e->buf.size;
        if (op->dest) {
          if (e->buf.size) memcpy(op->dest, e->buf.data.get(), e->buf.size);
        } else {
          op->owned = std::move(e->buf);
        }
        Complete(op, Status::OK());
      }
    }
  }
}

void P2pChannel::OnClosed(Connection* c, const Status& why) {
  const int rank = c->tag;
  if (rank < 0) return;  // never bound (a stranger, a refused HELLO): nobody's loss
  Status lost = Status::PeerLost(
      "lost rank " + std::to_string(rank) + " (its link to rank " + std::to_string(opts_.rank) +
      " ended: " + (why.ok() ? std::string("closed") : why.message()) + ")");
  {
    std::lock_guard<std::mutex> lk(mu_);
    Inbound& in = inbound_[rank];
    // The frame being received will never complete: its receive fails now (nothing writes
    // into its memory any more: the link's receiving thread has ended).
    if (in.cur_op) Complete(in.cur_op, lost);
    if (in.cur_early && in.cur_early->waiter) Complete(in.cur_early->waiter, lost);
    in.cur_op = nullptr;
    in.cur_early.reset();
    if (closing_) return;
    if (in.goodbye) {
      FailWaitersOf(rank, Status::PeerLost("p2p receive from rank " + std::to_string(rank) +
                                           ": that rank closed its channel first"));
      return;
    }
  }
  Fail(lost, rank);
}

}  // namespace byteps
