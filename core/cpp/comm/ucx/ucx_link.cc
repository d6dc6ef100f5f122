#include "comm/ucx/ucx_link.h"

#include <cstdint>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <mutex>
#if __has_include(<ucs/debug/log_def.h>)
#include <ucs/debug/log_def.h>
#endif

#include "comm/ucx/ucx_context.h"
#include "comm/ucx/ucx_util.h"
#include "common/logging.h"

namespace byteps {
namespace {
// UCX prints an ERROR ("no active messages transport ... no peer failure handler") when an
// endpoint in error mode PEER finds only shared memory; CreateEndpoint then falls back to mode
// NONE and says so itself. This handler (UCX >= 1.13's signature) mutes UCX's endpoint
// selection messages on this thread during that first attempt only.
thread_local bool g_quiet_select = false;
#if UCP_API_MAJOR == 1 && UCP_API_MINOR >= 13 && __has_include(<ucs/debug/log_def.h>)
ucs_log_func_rc_t QuietSelect(const char* file, unsigned line, const char* function,
                              ucs_log_level_t level, const ucs_log_component_config_t* comp,
                              const char* format, va_list ap) {
  return g_quiet_select && file && strstr(file, "select.c") ? UCS_LOG_FUNC_RC_STOP
                                                            : UCS_LOG_FUNC_RC_CONTINUE;
}
void InstallQuietSelect() {
  static std::once_flag once;
  std::call_once(once, [] { ucs_log_push_handler(&QuietSelect); });
}
#else
void InstallQuietSelect() {}
#endif
}  // namespace

// UcxLink::DeferDone's list on this thread (null: none).
thread_local std::vector<UcxLink::SentFrame>* g_deferred_done = nullptr;

UcxLink::DeferDone::DeferDone(std::vector<SentFrame>* out) : prev_(g_deferred_done) {
  g_deferred_done = out;
}

UcxLink::DeferDone::~DeferDone() { g_deferred_done = prev_; }

void UcxLink::SentFrame::Finish() {
  if (done) done(arg, status);
  delete heap_item;
}

// One frame handed to UCX: the active message header must stay valid until the send completes.
struct UcxLink::SendCtx {
  UcxAmHeader hdr;
  UcxLink* link = nullptr;
  SendItem* item = nullptr;
  void (*done)(void*, const Status&) = nullptr;
  void* arg = nullptr;
  bool heap = false;
  bool counted = false;  // a caller's frame (in_flight_)
  void* request = nullptr;  // UCX's, while the send is in progress
  SendCtx* prev = nullptr;  // the link's list of sends in progress (Abandon)
  SendCtx* next = nullptr;
};

UcxLink::UcxLink(UcxContext* ctx, uint64_t id, std::string peer_name,
                 ConnectionHandler* handler)
    : ctx_(ctx), id_(id), peer_name_(std::move(peer_name)), handler_(handler) {}

UcxLink::~UcxLink() {
  if (lifeline_fd_ >= 0) close(lifeline_fd_);
  // Frames queued on a link nobody closed (its context shut down first) fail now.
  SendItem* list = head_;
  head_ = tail_ = nullptr;
  while (list) {
    SendItem* next = list->next;
    if (list->done) list->done(list->arg, Status::PeerLost("UCX link to " + peer_name_ + " is gone"));
    if (list->heap) delete list;
    list = next;
  }
}

Status UcxLink::CreateEndpoint(const std::string& peer_address) {
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                 UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.address = reinterpret_cast<const ucp_address_t*>(peer_address.data());
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler.cb = &UcxLink::EpErrorCb;
  p.err_handler.arg = this;
  InstallQuietSelect();
  g_quiet_select = true;
  ucs_status_t s = ucp_ep_create(ctx_->worker(), &p, &ep_);
  g_quiet_select = false;
  if (s == UCS_ERR_UNREACHABLE) {
    // No transport reaching the peer reports peer failures (UCX 1.13's shared memory alone).
    p.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    s = ucp_ep_create(ctx_->worker(), &p, &ep_);
    if (s == UCS_OK) {
      peer_mode_ = false;
      BPS_LOG(INFO) << "UCX link to " << peer_name_ << ": no transport in "
                    << ctx_->config_summary()
                    << " watches the peer for failure; a dead peer is noticed by its CLOSE "
                       "message, a failed operation, or the job's heartbeats";
    }
  }
  if (s != UCS_OK) {
    ep_ = nullptr;
    return Status::PeerLost("UCX cannot reach " + peer_name_ + " with " +
                            ctx_->config_summary() + ": " + ucs_status_string(s) +
                            " (the peer is gone, or no transport in UCX_TLS reaches it)");
  }
  const std::string info = CaptureUcxOutput([&](FILE* f) { ucp_ep_print_info(ep_, f); });
  eager_max_ = UcxEagerMax(ParseUcxAmTransport(info), ctx_->user_rndv_thresh());
  ChooseOneWay(info);
  return Status::OK();
}

void UcxLink::Send(SendItem* item) {
  item->next = nullptr;
  bool enqueue = false;
  UcxContext* ctx;
  {
    std::lock_guard<std::mutex> lk(mu_);
    ctx = ctx_;
    if (state_.load() != kClosed && ctx_) {
      if (tail_) tail_->next = item; else head_ = item;
      tail_ = item;
      ++in_flight_;
      enqueue = !queued_;
      queued_ = true;
      item = nullptr;
    }
  }
  if (enqueue) {
    if (!ctx->OnProgressThread() && ctx->SubmitDirect(this)) return;
    ctx->EnqueueSends(shared_from_this());
    return;
  }
  if (!item) return;
  if (item->done)
    item->done(item->arg, Status::PeerLost("UCX link to " + peer_name_ + " is closed"));
  if (item->heap) delete item;
}

void UcxLink::SubmitQueued() {
  SendItem* list;
  {
    std::lock_guard<std::mutex> lk(mu_);
    list = head_;
    head_ = tail_ = nullptr;
    queued_ = false;
  }
  while (list) {
    SendItem* next = list->next;
    if (WritesOneWay(list)) SendWritten(list);
    else SubmitOne(UcxKind::kFrame, list);
    list = next;
  }
}

UcxLink::SendCtx* UcxLink::NewCtx(UcxKind kind, SendItem* item) {
  SendCtx* c;
  if (free_ctx_.empty()) {
    all_ctx_.emplace_back(new SendCtx);
    c = all_ctx_.back().get();
  } else {
    c = free_ctx_.back();
    free_ctx_.pop_back();
  }
  c->hdr = UcxAmHeader();
  c->hdr.kind = static_cast<uint16_t>(kind);
  c->hdr.dst_link = remote_id_;
  c->hdr.src_link = id_;
  c->link = this;
  c->item = item;
  c->counted = kind == UcxKind::kFrame;
  c->done = item ? item->done : nullptr;
  c->arg = item ? item->arg : nullptr;
  c->heap = item ? item->heap : false;
  return c;
}

void UcxLink::FailFrame(SendItem* item, const Status& why) {
  SendCtx* c = NewCtx(UcxKind::kFrame, item);
  ++pending_ops_;
  CompleteSend(c, UCS_ERR_CANCELED, &why, /*keep_code=*/true);
}

void UcxLink::SubmitOne(UcxKind kind, SendItem* item, bool written) {
  SendCtx* c = NewCtx(kind, item);
  const void* payload = item && !written ? item->payload : nullptr;
  const size_t len = item && !written ? item->len : 0;
  if (kind == UcxKind::kFrame) {
    c->hdr.frame = item->hdr;
    c->hdr.frame.magic = kFrameMagic;
    c->hdr.frame.payload_len = len;
    c->hdr.frame.written = written ? item->len : 0;
  }
  ++pending_ops_;
  if (g_deferred_done && kind == UcxKind::kFrame) direct_sent_.fetch_add(1);
  const bool usable = ep_ && !ep_closing_ && (kind != UcxKind::kFrame || state_.load() == kOpen);
  if (!usable) {
    CompleteSend(c, UCS_ERR_CANCELED);
    return;
  }
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &UcxLink::SendDoneCb;
  p.user_data = c;
  if (eager_max_ > 0 && len <= eager_max_) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_EAGER;
  }
  ctx_->UseRegistration(&p, payload, len);
  ucs_status_ptr_t r = ucp_am_send_nbx(ep_, kUcxAmId, &c->hdr, sizeof(c->hdr), payload, len, &p);
  if (r == nullptr) {
    CompleteSend(c, UCS_OK);
  } else if (UCS_PTR_IS_ERR(r)) {
    CompleteSend(c, UCS_PTR_STATUS(r));
  } else {
    c->request = r;
    c->prev = nullptr;
    c->next = sending_;
    if (sending_) sending_->prev = c;
    sending_ = c;
  }
}

void UcxLink::SendDoneCb(void* request, ucs_status_t status, void* user_data) {
  auto* c = static_cast<SendCtx*>(user_data);
  c->link->Unlink(c);
  c->link->CompleteSend(c, status);
  ucp_request_free(request);
}

void UcxLink::Unlink(SendCtx* c) {
  if (c->prev) c->prev->next = c->next; else sending_ = c->next;
  if (c->next) c->next->prev = c->prev;
  c->prev = c->next = nullptr;
  c->request = nullptr;
}

void UcxLink::CompleteSend(SendCtx* c, ucs_status_t status, const Status* why,
                           bool keep_code) {
  Status st;
  if (status != UCS_OK)  // PeerLost, or `why`'s own code (FailFrame: a frame never sent)
    st = Status(keep_code && why && !why->ok() ? why->code() : StatusCode::kPeerLost,
                "UCX send to " + peer_name_ + " failed: " +
                    (why ? why->message() : std::string(ucs_status_string(status))));
  else if (c->counted)
    frames_sent_.fetch_add(1);
  // Read before `done`: the owner may reuse the item at once.
  auto done = c->done;
  void* arg = c->arg;
  SendItem* heap_item = c->heap ? c->item : nullptr;
  const bool counted = c->counted;
  const bool connect = c->hdr.kind == static_cast<uint16_t>(UcxKind::kConnect);
  c->item = nullptr;
  free_ctx_.push_back(c);
  if (g_deferred_done) {  // SubmitDirect: after the worker is let go of
    g_deferred_done->push_back(SentFrame{done, arg, st, heap_item});
  } else {
    if (done) done(arg, st);
    delete heap_item;
  }
  if (connect && status != UCS_OK)  // the waiting Connect fails now, not at its timeout
    Fail(Status::PeerLost("UCX could not send CONNECT to " + peer_name_ + ": " +
                          ucs_status_string(status)),
         /*tell_peer=*/false, /*force=*/true);
  if (counted) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      --in_flight_;
    }
    cv_.notify_all();
  }
  --pending_ops_;
  MaybeRetire();
}

bool UcxLink::Flush(double timeout_s) {
  std::unique_lock<std::mutex> lk(mu_);
  return cv_.wait_for(lk, std::chrono::duration<double>(timeout_s),
                      [&] { return state_.load() == kClosed || in_flight_ == 0; }) &&
         state_.load() != kClosed;
}

void UcxLink::Abandon() {
  AbandonSends(nullptr);
  DestroyWindows();
  if (rx_request_) {
    ucp_request_free(rx_request_);
    rx_request_ = nullptr;
    --pending_ops_;
    rx_busy_ = false;
  }
  ReleaseHeld();
}

void UcxLink::AbandonSends(const Status* why) {
  // ucp_request_free: UCX finishes (or drops) the operation without calling back.
  while (sending_) {
    SendCtx* c = sending_;
    void* r = c->request;
    Unlink(c);
    ucp_request_free(r);
    CompleteSend(c, UCS_ERR_CANCELED, why);
  }
  if (close_request_) {
    ucp_request_free(close_request_);
    close_request_ = nullptr;
    ep_ = nullptr;  // closing; UCX releases it with the worker at the latest
    --pending_ops_;
  }
}

void UcxLink::OnAccepted(uint64_t remote_id) {
  remote_id_ = remote_id;
  {
    std::lock_guard<std::mutex> lk(mu_);
    state_ = kOpen;
  }
  cv_.notify_all();
}

bool UcxLink::WaitOpen(double timeout_s, Status* why) {
  std::unique_lock<std::mutex> lk(mu_);
  bool decided = cv_.wait_for(lk, std::chrono::duration<double>(timeout_s),
                              [&] { return state_.load() != kConnecting; });
  if (decided && state_.load() == kOpen) return true;
  *why = decided ? close_status_
                 : Status::Timeout("UCX link to " + peer_name_ + ": no ACCEPT within " +
                                   std::to_string(timeout_s) + " s (" + ctx_->config_summary() +
                                   ")");
  return false;
}

void UcxLink::Fail(const Status& why, bool tell_peer, bool force) {
  SendItem* list;
  bool notify;
  UcxContext* ctx;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (state_.load() == kClosed) return;
    ctx = ctx_;
    notify = state_.load() == kOpen && !local_close_;
    state_ = kClosed;
    close_status_ = why;
    list = head_;
    head_ = tail_ = nullptr;
  }
  cv_.notify_all();
  Status st = Status::PeerLost("UCX link to " + peer_name_ + " closed: " + why.message());
  size_t failed = 0;
  while (list) {
    SendItem* next = list->next;
    if (list->done) list->done(list->arg, st);
    if (list->heap) delete list;
    list = next;
    ++failed;
  }
  if (failed) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      in_flight_ -= failed;
    }
    cv_.notify_all();
  }
  // Deferred also on the progress thread: this may run inside a UCX callback.
  if (ctx) {
    auto self = shared_from_this();
    ctx->Post([self, tell_peer, force] { self->CloseEndpoint(tell_peer, force); });
  }
  if (!notify || !handler_) return;
  if (rx_busy_) {  // progress thread: OnClosed once the receive into the handler's buffer ends
    notify_pending_ = true;
    notify_status_ = why;
  } else if (Connection* conn = conn_.load()) {
    handler_->OnClosed(conn, why);
  }
}

void UcxLink::Close() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (state_.load() == kClosed) return;
    local_close_ = true;
  }
  Fail(Status::PeerLost("closed by this process"), /*tell_peer=*/true, /*force=*/false);
}

bool UcxLink::Join(double timeout_s) {
  Close();
  UcxContext* ctx = Context();
  if (ctx && ctx->OnProgressThread()) return false;
  std::unique_lock<std::mutex> lk(mu_);
  return cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), [&] { return retired_; });
}

void UcxLink::CloseEndpoint(bool tell_peer, bool force) {
  ReleaseHeld();
  DestroyWindows();  // remote keys go before their endpoint
  if (ep_ && !ep_closing_) {
    if (tell_peer && remote_id_ != 0) SubmitOne(UcxKind::kClose, nullptr);
    ep_closing_ = true;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = force && peer_mode_ ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    p.cb.send = &UcxLink::EpClosedCb;
    p.user_data = this;
    ucp_ep_h ep = ep_;
    ++pending_ops_;
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
    if (r == nullptr || UCS_PTR_IS_ERR(r)) {
      --pending_ops_;
      ep_ = nullptr;
    } else {
      close_request_ = r;
    }
    // A peer known to be gone (force) where UCX cannot report its failure (error mode none:
    // shared memory) never completes the sends in flight to it, nor then the close's flush: let
    // go of them now (their frames fail with PeerLost) rather than hold the connection's Join
    // until its timeout. Receives from it fail by themselves (a fetch from a dead process).
    if (force && !peer_mode_) {
      Status why;
      {
        std::lock_guard<std::mutex> lk(mu_);
        why = close_status_;
      }
      AbandonSends(&why);
    }
  }
  MaybeRetire();
}

void UcxLink::EpClosedCb(void* request, ucs_status_t status, void* user_data) {
  auto* link = static_cast<UcxLink*>(user_data);
  ucp_request_free(request);
  link->close_request_ = nullptr;
  link->ep_ = nullptr;
  --link->pending_ops_;
  link->MaybeRetire();
}

void UcxLink::EpErrorCb(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* link = static_cast<UcxLink*>(arg);
  link->Fail(Status::PeerLost("UCX endpoint to " + link->peer_name_ + " failed: " +
                              ucs_status_string(status)),
             /*tell_peer=*/false, /*force=*/true);
}

void UcxLink::MaybeRetire() {
  if (state_.load() != kClosed || ep_ || pending_ops_ || rx_busy_ || !ctx_) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (retired_) return;
    retired_ = true;
  }
  cv_.notify_all();
  ctx_->Retire(id_);
}

void UcxLink::SetPeerName(const std::string& name) {
  UcxContext* ctx = Context();
  if (!ctx || ctx->OnProgressThread()) {
    peer_name_ = name;
    return;
  }
  auto self = shared_from_this();
  ctx->Post([self, name] { self->peer_name_ = name; });
}

void UcxLink::ForgetConnection() {
  UcxContext* ctx = Context();
  // On the progress thread no handler call of this link is in progress beyond the caller's;
  // elsewhere, a task run there is a barrier after which none starts.
  if (ctx && !ctx->OnProgressThread()) {
    auto self = shared_from_this();
    ctx->RunSync([self]() -> Status {
      self->conn_.store(nullptr);
      return Status::OK();
    });
  }
  conn_.store(nullptr);
}

void UcxLink::Detach() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    state_ = kClosed;
    retired_ = true;
    ctx_ = nullptr;
  }
  ep_ = nullptr;
  cv_.notify_all();
}

std::string UcxLink::Describe() {
  if (!ctx_) return "closed";
  auto out = std::make_shared<std::string>("closed");
  auto self = shared_from_this();
  Status st = ctx_->RunSync([self, out]() -> Status {
    if (self->ep_) *out = CaptureUcxOutput([&](FILE* f) { ucp_ep_print_info(self->ep_, f); });
    return Status::OK();
  });
  return st.ok() ? *out : st.message();
}

UcxLink::Stats UcxLink::stats() const {
  Stats s;
  s.frames_sent = frames_sent_.load();
  s.direct_sent = direct_sent_.load();
  s.frames_received = frames_received_.load();
  s.eager_received = eager_received_.load();
  s.rndv_received = rndv_received_.load();
  s.held_max = held_max_.load();
  s.one_way_sent = one_way_sent_.load();
  s.one_way_received = one_way_received_.load();
  return s;
}

}  // namespace byteps
