// UcxLink's one-way writes (ucx_link.h, "One-way writes"): a peer's windows, opened once per
// link, and frames whose payload is written into one (ucp_put_nbx), fenced, then announced by
// their header alone.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <sstream>

#include "comm/ucx/ucx_context.h"
#include "comm/ucx/ucx_link.h"
#include "comm/ucx/ucx_util.h"

namespace byteps {
namespace {

// The largest frame UCX sends eagerly on the endpoint: the number before "<rndv>" on the
// am_send line of ucp_ep_print_info ("am_send: 0..<egr/short>..93..<egr/bcopy>..8256..<rndv>..");
// 0 when there is none.
size_t AmRendezvousThreshold(const std::string& ep_info) {
  std::istringstream lines(ep_info);
  for (std::string line; std::getline(lines, line);) {
    const size_t am = line.find("am_send:");
    const size_t rndv = line.find("..<rndv>");
    if (am == std::string::npos || rndv == std::string::npos || rndv <= am) continue;
    size_t start = rndv;
    while (start > am && isdigit(static_cast<unsigned char>(line[start - 1]))) --start;
    if (start == rndv) return 0;
    return std::stoull(line.substr(start, rndv - start));
  }
  return 0;
}

}  // namespace

void UcxLink::ChooseOneWay(const std::string& ep_info) {
  const std::string am = ParseUcxAmTransport(ep_info);
  const bool shm = IsUcxSharedMemoryTransport(am);
  one_way_ = false;
  if (ctx_->one_way() == UcxOneWay::kOff) {
    one_way_why_ = "BYTEPS_UCX_ONE_WAY=0";
  } else if (am.empty() || am == "tcp" || am == "self") {
    one_way_why_ = "its active messages go over " + (am.empty() ? std::string("?") : am) +
                   ", where frames are faster than remote writes";
  } else if (shm && ctx_->one_way() == UcxOneWay::kAuto) {
    one_way_why_ = "over shared memory (" + am + ") only with BYTEPS_UCX_ONE_WAY=1";
  } else {
    one_way_ = true;
    one_way_why_.clear();
  }
  // Frames UCX would send eagerly (or the link forces eager: eager_max_) stay frames: a write
  // replaces the rendezvous, not a copy through UCX's buffers.
  one_way_min_ = std::max(eager_max_, AmRendezvousThreshold(ep_info)) + 1;
}

Status UcxLink::OpenWindow(const std::string& blob, uint32_t* id) {
  UcxContext* ctx = Context();
  if (!ctx) return Status::PeerLost("UCX link to " + peer_name_ + " is closed");
  auto self = shared_from_this();
  auto out = std::make_shared<uint32_t>(0);
  Status st = ctx->RunSync([self, blob, out]() -> Status {
    UcxLink* l = self.get();
    if (!l->one_way_)
      return Status::InvalidArgument("the UCX link to " + l->peer_name_ +
                                     " has no one-way writes (" + l->one_way_why_ + ")");
    if (!l->ep_ || l->ep_closing_ || l->state_.load() != kOpen)
      return Status::PeerLost("UCX link to " + l->peer_name_ + " is closed");
    if (l->windows_.size() >= kMaxWindows)
      return Status::InvalidArgument("UCX link to " + l->peer_name_ + ": more than " +
                                     std::to_string(kMaxWindows) + " windows");
    WireReader r(blob.data(), blob.size());
    const uint32_t magic = r.U32();
    Window w;
    w.addr = r.U64();
    w.len = r.U64();
    const std::string key = r.Str(kMaxRemoteKeyBytes);
    if (!r.done() || magic != kUcxWindowMagic || w.len == 0 || w.addr + w.len < w.addr)
      return Status::InvalidArgument("a malformed window from " + l->peer_name_);
    auto known = l->rkeys_.find(key);
    if (known != l->rkeys_.end()) {
      w.rkey = known->second;
    } else {
      ucs_status_t s = ucp_ep_rkey_unpack(l->ep_, key.data(), &w.rkey);
      if (s != UCS_OK)
        return Status::InvalidArgument("UCX could not unpack the remote key of a window from " +
                                       l->peer_name_ + ": " + ucs_status_string(s));
      l->rkeys_.emplace(key, w.rkey);
    }
    l->windows_.push_back(w);
    *out = static_cast<uint32_t>(l->windows_.size());
    return Status::OK();
  });
  if (st.ok()) *id = *out;
  return st;
}

void UcxLink::DestroyWindows() {
  windows_.clear();
  for (auto& kv : rkeys_) ucp_rkey_destroy(kv.second);
  rkeys_.clear();
}

bool UcxLink::WritesOneWay(const SendItem* item) const {
  return item->window != 0 && item->len >= one_way_min_;
}

void UcxLink::SendWritten(SendItem* item) {
  Status bad;
  const bool usable = ep_ && !ep_closing_ && state_.load() == kOpen;
  const Window* w = item->window <= windows_.size() ? &windows_[item->window - 1] : nullptr;
  if (!usable)
    bad = Status::PeerLost("UCX link to " + peer_name_ + " is closed");
  else if (!w || item->window_offset > w->len || item->len > w->len - item->window_offset)
    bad = Status::InvalidArgument("a one-way write of " + std::to_string(item->len) +
                                  " bytes at " + std::to_string(item->window_offset) + " to " +
                                  peer_name_ + " through window " +
                                  std::to_string(item->window) + " of " +
                                  std::to_string(windows_.size()) + (w ? " (smaller)" : ""));
  if (bad.ok()) {
    ucp_request_param_t p{};
    ctx_->UseRegistration(&p, item->payload, item->len);
    ucs_status_ptr_t r = ucp_put_nbx(ep_, item->payload, item->len,
                                       w->addr + item->window_offset, w->rkey, &p);
    if (UCS_PTR_IS_ERR(r))
      bad = Status::PeerLost("UCX write to " + peer_name_ + " failed: " +
                             ucs_status_string(UCS_PTR_STATUS(r)));
    else if (r)
      ucp_request_free(r);  // the fence below orders the header after it
  }
  // The fence: every operation issued before it (the write) completes before any issued after
  // it (the header), so the receiver sees the header only once the bytes are in place.
  if (bad.ok()) {
    ucs_status_t s = ucp_worker_fence(ctx_->worker());
    if (s != UCS_OK)
      bad = Status::PeerLost(std::string("UCX fence failed: ") + ucs_status_string(s));
  }
  if (!bad.ok()) return FailFrame(item, bad);
  one_way_sent_.fetch_add(1);
  ctx_->one_way_sent.fetch_add(1);
  SubmitOne(UcxKind::kFrame, item, /*written=*/true);
}

}  // namespace byteps
