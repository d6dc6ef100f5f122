// P2pChannel: set-up, the caller's operations and failure (channel.h). The inbound links'
// frame handling is in channel_inbound.cc.
#include "p2p/channel.h"

#include <chrono>
#include <cstdint>

#include "comm/socket_util.h"
#include "common/knobs.h"
#include "common/logging.h"

namespace byteps {

P2pChannel::P2pChannel(Options opts) : opts_(std::move(opts)) {
  outbound_.resize(opts_.size);
  inbound_.resize(opts_.size);
}

P2pChannel::~P2pChannel() { Close(1.0); }

Status P2pChannel::Create(const Options& opts, std::unique_ptr<P2pChannel>* out) {
  if (opts.size < 1 || opts.rank < 0 || opts.rank >= opts.size)
    return Status::InvalidArgument("p2p channel: rank " + std::to_string(opts.rank) +
                                   " is not in 0.." + std::to_string(opts.size - 1));
  if (opts.max_message_bytes == 0 || opts.max_message_bytes > kMaxFramePayload)
    return Status::InvalidArgument("p2p channel: max_message_bytes must be in 1.." +
                                   std::to_string(kMaxFramePayload));
  std::unique_ptr<P2pChannel> ch(new P2pChannel(opts));
  BPS_RETURN_IF_ERROR(Van::Create(opts.van, &ch->van_));
  Van::ListenOptions lo;
  lo.owner = "p2p channel of rank " + std::to_string(opts.rank);
  lo.handshake_timeout_s = opts.handshake_timeout_s;
  lo.handler = ch.get();
  lo.peer_name = "unidentified p2p peer";
  P2pChannel* self = ch.get();
  BPS_RETURN_IF_ERROR(ch->van_->Listen(
      opts.host, opts.port, lo,
      [self](std::unique_ptr<Connection> c) { self->AcceptInbound(std::move(c)); }, &ch->port_));
  *out = std::move(ch);
  return Status::OK();
}

Status P2pChannel::DefaultHost(const Knobs& k, std::string* host) {
  *host = k.Str("DMLC_NODE_HOST");
  if (!host->empty()) return Status::OK();
  const std::string& ifname = k.Str("DMLC_INTERFACE");
  if (!ifname.empty()) {
    *host = InterfaceAddress(ifname);
    if (host->empty()) return Status::Config("DMLC_INTERFACE=" + ifname + " has no IPv4 address");
    return Status::OK();
  }
  const std::string& root = k.Str("DMLC_PS_ROOT_URI");
  if (!root.empty() && k.IsSet("DMLC_PS_ROOT_PORT")) {
    std::string why;
    *host = RouteAddressTo(root, static_cast<int>(k.Int("DMLC_PS_ROOT_PORT")), &why);
    if (!host->empty()) return Status::OK();
  }
  *host = "127.0.0.1";
  return Status::OK();
}

std::string P2pChannel::PeerName(int rank) const {
  return "p2p peer rank " + std::to_string(rank);
}

void P2pChannel::AcceptInbound(std::unique_ptr<Connection> c) {
  c->tag = -1;  // bound to a rank by its HELLO
  Connection* raw = c.get();
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (closing_) return;  // destroyed here: never started
    accepted_.push_back(std::move(c));
  }
  raw->Start();
}

Status P2pChannel::Connect(int peer, const std::string& host, int port, double timeout_s) {
  if (peer < 0 || peer >= opts_.size || peer == opts_.rank)
    return Status::InvalidArgument("p2p channel of rank " + std::to_string(opts_.rank) +
                                   ": cannot connect to rank " + std::to_string(peer));
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (closing_) return Status::Shutdown("p2p channel is closed");
    if (outbound_[peer]) return Status::OK();
  }
  std::unique_ptr<Connection> c;
  BPS_RETURN_IF_ERROR(van_->Connect(host, port, timeout_s, &out_handler_, PeerName(peer), &c));
  c->tag = peer;
  c->Start();
  WireWriter w;
  w.U32(kP2pHelloMagic).U32(static_cast<uint32_t>(opts_.rank))
      .U32(static_cast<uint32_t>(opts_.size));
  c->SendControl(P2pMsg::kHello, w.Take(), 0, static_cast<uint32_t>(opts_.rank));
  std::lock_guard<std::mutex> lk(mu_);
  if (closing_) {
    c->Close();
    accepted_.push_back(std::move(c));  // joined by Close()
    return Status::Shutdown("p2p channel is closed");
  }
  outbound_[peer] = std::move(c);
  return Status::OK();
}

Status P2pChannel::WaitInbound(const std::vector<int>& peers, double timeout_s) {
  std::unique_lock<std::mutex> lk(mu_);
  auto missing = [&] {
    std::string m;
    for (int p : peers)
      if (p >= 0 && p < opts_.size && !inbound_[p].conn) m += (m.empty() ? "" : ", ") +
                                                             std::to_string(p);
    return m;
  };
  cv_.wait_for(lk, std::chrono::duration<double>(timeout_s),
               [&] { return !failure_.ok() || closing_ || missing().empty(); });
  if (!failure_.ok()) return failure_;
  if (closing_) return Status::Shutdown("p2p channel is closed");
  std::string m = missing();
  if (!m.empty())
    return Status::Timeout("p2p channel of rank " + std::to_string(opts_.rank) +
                           ": no link from rank(s) " + m + " within " +
                           std::to_string(timeout_s) + " s");
  return Status::OK();
}

Status P2pChannel::Isend(int peer, uint64_t tag, const void* data, size_t n, OpId* id) {
  if (peer < 0 || peer >= opts_.size || peer == opts_.rank)
    return Status::InvalidArgument("p2p send: rank " + std::to_string(peer) +
                                   " is not a peer of rank " + std::to_string(opts_.rank));
  if (n > opts_.max_message_bytes)
    return Status::InvalidArgument("p2p send: " + std::to_string(n) + " bytes exceed the " +
                                   "largest message (" + std::to_string(opts_.max_message_bytes) +
                                   " bytes)");
  Op* op;
  Connection* conn;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (closing_) return Status::Shutdown("p2p channel is closed");
    if (!failure_.ok()) return failure_;
    conn = outbound_[peer].get();
    if (!conn)
      return Status::InvalidArgument("p2p send: no link to rank " + std::to_string(peer) +
                                     " (connect first)");
    auto owned = std::make_unique<Op>();
    op = owned.get();
    op->id = next_id_++;
    op->send = true;
    op->peer = peer;
    op->tag = tag;
    op->nbytes = n;
    op->channel = this;
    op->item.hdr.type = static_cast<uint16_t>(P2pMsg::kData);
    op->item.hdr.sender = static_cast<uint32_t>(opts_.rank);
    op->item.hdr.key = tag;
    op->item.payload = data;
    op->item.len = n;
    op->item.done = &P2pChannel::SendDone;
    op->item.arg = op;
    ops_[op->id] = std::move(owned);
    *id = op->id;
  }
  // Outside mu_: on a closed link Send completes the item at once, in SendDone. The link lives
  // until Close(), which does not run concurrently with the caller's own operations.
  conn->Send(&op->item);
  return Status::OK();
}

void P2pChannel::SendDone(void* arg, const Status& st) {
  Op* op = static_cast<Op*>(arg);
  P2pChannel* ch = op->channel;
  std::lock_guard<std::mutex> lk(ch->mu_);
  Status why = st;
  if (!st.ok()) why = Status::PeerLost("p2p send to rank " + std::to_string(op->peer) +
                                       " (tag " + std::to_string(op->tag) + ") failed: " +
                                       st.message());
  ch->Complete(op, why);
}

Status P2pChannel::Irecv(int peer, uint64_t tag, void* dest, size_t capacity, OpId* id) {
  if (peer < 0 || peer >= opts_.size || peer == opts_.rank)
    return Status::InvalidArgument("p2p receive: rank " + std::to_string(peer) +
                                   " is not a peer of rank " + std::to_string(opts_.rank));
  std::lock_guard<std::mutex> lk(mu_);
  if (closing_) return Status::Shutdown("p2p channel is closed");
  if (!failure_.ok()) return failure_;
  auto owned = std::make_unique<Op>();
  Op* op = owned.get();
  op->id = next_id_++;
  op->peer = peer;
  op->tag = tag;
  op->dest = dest;
  op->capacity = capacity;
  op->channel = this;
  ops_[op->id] = std::move(owned);
  *id = op->id;
  const auto key = std::make_pair(peer, tag);
  auto it = early_.find(key);
  if (it != early_.end() && !it->second.empty()) {
    std::shared_ptr<Early> e = it->second.front();
    it->second.pop_front();
    if (it->second.empty()) early_.erase(it);
    if (!e->arrived) {
      e->waiter = op;  // completed by OnFrame
      op->receiving = true;
      return Status::OK();
    }
    buffered_bytes_ -= e->buf.size;
    if (dest && e->buf.size > capacity) {
      Complete(op, Status::InvalidArgument(
                       "p2p receive from rank " + std::to_string(peer) + " (tag " +
                       std::to_string(tag) + "): a message of " + std::to_string(e->buf.size) +
                       " bytes does not fit the buffer of " + std::to_string(capacity)));
      return Status::OK();
    }
    op->nbytes = e->buf.size;
    if (dest) {
      if (e->buf.size) memcpy(dest, e->buf.data.get(), e->buf.size);
    } else {
      op->owned = std::move(e->buf);
    }
    Complete(op, Status::OK());
    return Status::OK();
  }
  if (inbound_[peer].goodbye) {
    Complete(op, Status::PeerLost("p2p receive from rank " + std::to_string(peer) + " (tag " +
                                  std::to_string(tag) + "): that rank closed its channel"));
    return Status::OK();
  }
  posted_[key].push_back(op);
  return Status::OK();
}

void P2pChannel::Complete(Op* op, const Status& st) {
  if (op->done) return;
  op->done = true;
  op->receiving = false;
  op->st = st;
  cv_.notify_all();
}

Status P2pChannel::Wait(OpId id, double timeout_s, size_t* nbytes, P2pBuffer* owned) {
  std::unique_lock<std::mutex> lk(mu_);
  auto it = ops_.find(id);
  if (it == ops_.end())
    return Status::InvalidArgument("p2p wait: unknown operation " + std::to_string(id));
  Op* op = it->second.get();
  if (!cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), [&] { return op->done; })) {
    return Status::Timeout("p2p " + std::string(op->send ? "send to" : "receive from") +
                           " rank " + std::to_string(op->peer) + " (tag " +
                           std::to_string(op->tag) + ") not done within " +
                           std::to_string(timeout_s) + " s");
  }
  Status st = op->st;
  if (st.ok()) {
    *nbytes = op->nbytes;
    if (owned) *owned = std::move(op->owned);
  }
  ops_.erase(it);
  return st;
}

bool P2pChannel::Test(OpId id) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = ops_.find(id);
  return it == ops_.end() || it->second->done;
}

Status P2pChannel::failure() {
  std::lock_guard<std::mutex> lk(mu_);
  return failure_;
}

void P2pChannel::FailPendingLocked(const Status& why) {
  // Receives whose frame is arriving and sends whose frame is leaving complete with their
  // frame (or their link's end): the caller's memory is in use until then.
  for (auto& [id, op] : ops_)
    if (!op->done && !op->send && !op->receiving) Complete(op.get(), why);
  posted_.clear();
}

void P2pChannel::FailWaitersOf(int peer, const Status& why) {
  for (auto it = posted_.begin(); it != posted_.end();) {
    if (it->first.first != peer) {
      ++it;
      continue;
    }
    for (Op* op : it->second) Complete(op, why);
    it = posted_.erase(it);
  }
}

void P2pChannel::Fail(const Status& why, int culprit) {
  std::vector<Connection*> tell;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (closing_ || !failure_.ok()) return;
    failure_ = why;
    FailPendingLocked(why);
    for (int r = 0; r < opts_.size; ++r)
      if (r != culprit && outbound_[r]) tell.push_back(outbound_[r].get());
  }
  BPS_LOG(WARNING) << "p2p channel of rank " << opts_.rank << " failed: " << why.message();
  std::string reason = why.message().substr(0, kP2pMaxReasonBytes);
  for (Connection* c : tell)
    c->SendControl(P2pMsg::kFailed, reason, 0, static_cast<uint32_t>(opts_.rank));
}

void P2pChannel::Close(double flush_timeout_s) {
  std::vector<Connection*> out;
  bool said_goodbye;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (closing_) return;
    said_goodbye = failure_.ok();
    for (auto& c : outbound_)
      if (c) out.push_back(c.get());
  }
  if (said_goodbye)
    for (Connection* c : out)
      c->SendControl(P2pMsg::kGoodbye, std::string(), 0, static_cast<uint32_t>(opts_.rank));
  for (Connection* c : out) c->Flush(flush_timeout_s);
  std::vector<std::unique_ptr<Connection>> all;
  {
    std::lock_guard<std::mutex> lk(mu_);
    closing_ = true;
    for (auto& c : outbound_)
      if (c) all.push_back(std::move(c));
    for (auto& c : accepted_) all.push_back(std::move(c));
    accepted_.clear();
  }
  if (van_) van_->StopListening();
  for (auto& c : all) c->Join();
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& in : inbound_) in = Inbound();
    for (auto& [id, op] : ops_)
      Complete(op.get(), Status::Shutdown("p2p channel of rank " + std::to_string(opts_.rank) +
                                          " is closed"));
    posted_.clear();
    early_.clear();
    buffered_bytes_ = 0;
  }
  all.clear();  // the links go before the van that made them
}

Status P2pChannel::OutboundHandler::ValidateHeader(const FrameHeader& h) {
  return Status::InvalidArgument("p2p: message type " + std::to_string(h.type) +
                                 " on a send-only link");
}

void P2pChannel::OutboundHandler::OnClosed(Connection* c, const Status& why) {
  // Sends to this rank fail from now on (the link completes them); whether the rank is lost is
  // its inbound link's to say, which ends too when the process is gone.
  BPS_LOG(DEBUG) << "p2p link to rank " << c->tag << " closed: " << why.message();
  (void)ch_;
}

}  // namespace byteps
