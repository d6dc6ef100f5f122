// UcxLink's receive path (ucx_link.h): active messages of a link, in order, into the memory
// the handler chooses; rendezvous payloads fetched straight there.
#include <cstring>

#include "comm/ucx/ucx_context.h"
#include "comm/ucx/ucx_link.h"

namespace byteps {

void UcxLink::Start() {
  UcxContext* ctx = Context();
  if (!ctx) return;
  auto self = shared_from_this();
  ctx->Post([self] {
    self->started_ = true;
    self->DrainHeld();
  });
}

ucs_status_t UcxLink::OnAm(const FrameHeader& h, void* data, size_t len, bool rndv,
                           bool persistent) {
  if (!started_ || rx_busy_ || !held_.empty()) return Hold(h, data, len, rndv, persistent);
  return Process(h, data, len, rndv, /*ucx_owned=*/false, /*in_callback=*/true);
}

ucs_status_t UcxLink::Hold(const FrameHeader& h, void* data, size_t len, bool rndv,
                           bool persistent) {
  const bool keep = rndv || persistent;  // UCX keeps the descriptor for us
  const size_t bytes = rndv ? 0 : len;
  if (held_.size() >= kMaxHeldFrames || bytes > kMaxHeldBytes - held_bytes_) {
    Fail(Status::InvalidArgument("UCX peer " + peer_name_ + " sent more than " +
                                 std::to_string(kMaxHeldFrames) + " frames or " +
                                 std::to_string(kMaxHeldBytes) +
                                 " bytes ahead of what this process has received"),
         /*tell_peer=*/true, /*force=*/false);
    return rndv ? UCS_ERR_CANCELED : UCS_OK;
  }
  held_.emplace_back();
  Held& m = held_.back();
  m.h = h;
  m.len = len;
  m.rndv = rndv;
  m.ucx_owned = keep;
  if (keep) m.data = data;
  else m.copy.assign(static_cast<const char*>(data), len);
  held_bytes_ += bytes;
  if (held_.size() > held_max_.load()) held_max_ = held_.size();
  return keep ? UCS_INPROGRESS : UCS_OK;
}

void UcxLink::Release(void* data, bool ucx_owned) {
  if (ucx_owned && data) ucp_am_data_release(ctx_->worker(), data);
}

ucs_status_t UcxLink::Process(const FrameHeader& h, void* data, size_t len, bool rndv,
                              bool ucx_owned, bool in_callback) {
  // A rendezvous descriptor not fetched: from the callback UCX drops it when told so (the
  // sender's send completes with that status); a held one is given back.
  auto drop = [&](ucs_status_t cb_status) -> ucs_status_t {
    if (!in_callback) Release(data, ucx_owned);
    return rndv ? cb_status : UCS_OK;
  };
  Connection* conn = conn_.load();
  if (!conn || state_.load() != kOpen) return drop(UCS_ERR_CANCELED);  // nobody to deliver to
  Status st = ValidateFrame(h);
  if (st.ok() && h.payload_len != len)
    st = Status::InvalidArgument("a header announcing " + std::to_string(h.payload_len) +
                                 " payload bytes on a message of " + std::to_string(len));
  if (st.ok()) st = handler_->ValidateHeader(h);
  if (st.ok() && h.written) {
    one_way_received_.fetch_add(1);
    ctx_->one_way_received.fetch_add(1);
  }
  void* dest = nullptr;
  sink_ = nullptr;
  if (st.ok()) st = handler_->OnHeader(conn, h, &dest);
  if (st.ok() && len > 0 && !dest && len > kMaxBufferedPayload)
    st = Status::InvalidArgument("a payload of " + std::to_string(len) + " bytes (message type " +
                                 std::to_string(h.type) + ") that nothing expects (at most " +
                                 std::to_string(kMaxBufferedPayload) + " are buffered)");
  if (!st.ok()) {
    ctx_->LogPeerError("from " + peer_name_ + ": " + st.message());
    Fail(st, /*tell_peer=*/true, /*force=*/false);
    return drop(UCS_ERR_CANCELED);
  }
  if (state_.load() != kOpen) return drop(UCS_ERR_CANCELED);  // closed from OnHeader
  frames_received_.fetch_add(1);
  if (len == 0 || dest == Connection::kDiscard) {
    drop(UCS_OK);
    handler_->OnFrame(conn, h, len == 0 ? dest : nullptr);
    return UCS_OK;
  }
  if (!rndv) {
    eager_received_.fetch_add(1);
    if (!dest && !sink_) dest = data;  // the link's own buffer: UCX's, valid until we return
    if (!dest) {
      if (scratch_.size() < len) scratch_.resize(len);
      dest = &scratch_[0];
    }
    Deliver(h, dest, static_cast<char*>(data), len);
    if (!in_callback) Release(data, ucx_owned);
    return UCS_OK;
  }
  if (!dest) {
    if (scratch_.size() < len) scratch_.resize(len);
    dest = &scratch_[0];
  }
  // A streamed payload lands in the bounce buffer, then goes through the sink to `dest`.
  void* target = dest;
  if (sink_) {
    if (bounce_.size() < len) bounce_.resize(len);
    target = &bounce_[0];
  }
  rx_busy_ = true;
  rx_frame_ = h;
  rx_dest_ = dest;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.recv_am = &UcxLink::RecvDoneCb;
  p.user_data = this;
  ctx_->UseRegistration(&p, target, len);
  // From here UCX owns the descriptor, whatever the outcome.
  ucs_status_ptr_t r = ucp_am_recv_data_nbx(ctx_->worker(), data, target, len, &p);
  if (r == nullptr) {
    OnRecvDone(UCS_OK);
  } else if (UCS_PTR_IS_ERR(r)) {
    OnRecvDone(UCS_PTR_STATUS(r));
  } else {
    rx_request_ = r;
    ++pending_ops_;
  }
  return UCS_OK;
}

// The payload is at `src` (UCX's eager buffer, a held copy, or the bounce buffer): copy it to
// `dest` (through the handler's sink in Connection::kBounceBytes chunks, if it asked for one)
// and hand the frame over.
void UcxLink::Deliver(const FrameHeader& h, void* dest, char* src, size_t len) {
  char* d = static_cast<char*>(dest);
  if (sink_) {
    for (size_t off = 0; off < len; off += Connection::kBounceBytes)
      sink_(sink_arg_, d + off, src + off, std::min(Connection::kBounceBytes, len - off));
  } else if (d != src) {
    memcpy(d, src, len);
  }
  sink_ = nullptr;
  Connection* conn = conn_.load();
  if (conn) handler_->OnFrame(conn, h, dest);
}

void UcxLink::RecvDoneCb(void* request, ucs_status_t status, size_t length, void* user_data) {
  auto* link = static_cast<UcxLink*>(user_data);
  --link->pending_ops_;
  link->rx_request_ = nullptr;
  ucp_request_free(request);
  link->OnRecvDone(status);
}

void UcxLink::OnRecvDone(ucs_status_t status) {
  rx_busy_ = false;
  if (status == UCS_OK && state_.load() == kOpen) {
    rndv_received_.fetch_add(1);
    if (sink_) Deliver(rx_frame_, rx_dest_, &bounce_[0], rx_frame_.payload_len);
    else if (Connection* conn = conn_.load()) handler_->OnFrame(conn, rx_frame_, rx_dest_);
  } else if (status != UCS_OK) {
    Fail(Status::PeerLost("UCX receive of " + std::to_string(rx_frame_.payload_len) +
                          " bytes from " + peer_name_ + " failed: " + ucs_status_string(status)),
         /*tell_peer=*/true, /*force=*/false);
  }
  sink_ = nullptr;
  if (notify_pending_) {
    notify_pending_ = false;
    if (Connection* conn = conn_.load()) handler_->OnClosed(conn, notify_status_);
  }
  DrainHeld();
  MaybeRetire();
}

void UcxLink::DrainHeld() {
  while (started_ && !rx_busy_ && !held_.empty() && state_.load() == kOpen) {
    Held m = std::move(held_.front());
    held_.pop_front();
    if (!m.rndv) held_bytes_ -= m.len;
    void* data = m.ucx_owned ? m.data : &m.copy[0];
    Process(m.h, data, m.len, m.rndv, m.ucx_owned, /*in_callback=*/false);
  }
}

void UcxLink::ReleaseHeld() {
  for (auto& m : held_)
    if (m.ucx_owned) ucp_am_data_release(ctx_->worker(), m.data);
  held_.clear();
  held_bytes_ = 0;
}

}  // namespace byteps
