#include "comm/ucx/ucx_context.h"

#include <cstdint>
#include <openssl/rand.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>
#include <random>

#include "comm/ucx/ucx_connection.h"
#include "comm/ucx/ucx_link.h"
#include "comm/ucx/ucx_util.h"

namespace byteps {
namespace {
constexpr int kLinkedWakeupMs = 1000;    // with links open: UCX's keepalive runs in progress
constexpr size_t kMaxAddress = 32 << 10;  // a worker address from a peer
constexpr size_t kMaxLinks = 4096;        // links a context accepts
constexpr double kShutdownWaitS = 2.0;    // for endpoints to close at Shutdown
}  // namespace

Status UcxContext::Create(const std::string& name, std::unique_ptr<UcxContext>* out,
                          const std::string& default_tls, double spin_s, UcxOneWay one_way) {
  std::unique_ptr<UcxContext> c(new UcxContext(name, spin_s, one_way));
  Status st = c->Init(default_tls);
  if (!st.ok()) return st;
  *out = std::move(c);
  return Status::OK();
}

Status UcxContext::Init(const std::string& default_tls) {
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK)
    return Status::Config(std::string("UCX could not read its UCX_* configuration: ") +
                          ucs_status_string(s));
  std::string tls, devices;
  ReadUcxConfig(config, &tls, &devices);
  // UCX read its own UCX_* variables above; a TLS still at UCX's default ("all") is one the
  // user did not choose, so the caller's default applies.
  if (!default_tls.empty() && tls == "all") {
    s = ucp_config_modify(config, "TLS", default_tls.c_str());
    if (s != UCS_OK) {
      ucp_config_release(config);
      return Status::Config("UCX refused UCX_TLS=" + default_tls + ": " + ucs_status_string(s));
    }
  }
  std::string rndv_thresh;
  ReadUcxConfig(config, &tls, &devices, &rndv_thresh);
  user_rndv_thresh_ = rndv_thresh != "auto";
  config_summary_ = "UCX_TLS=" + tls + ", UCX_NET_DEVICES=" + devices;
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  // RMA: the one-way writes into a peer's window (UcxLink::OpenWindow).
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP | UCP_FEATURE_RMA;
  params.name = name_.c_str();
  s = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (s != UCS_OK) {
    context_ = nullptr;
    return Status::Config("UCX " + std::string(ucp_get_version_string()) +
                          " could not start with " + config_summary_ + ": " +
                          ucs_status_string(s) +
                          " (UCX's own message above names the transport or device it lacks)");
  }
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_NAME;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // round_mu_ serialises the callers
  wp.name = name_.c_str();
  s = ucp_worker_create(context_, &wp, &worker_);
  if (s != UCS_OK) {
    worker_ = nullptr;
    return Status::Config("UCX could not create a worker with " + config_summary_ + ": " +
                          ucs_status_string(s));
  }
  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS | UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
  s = ucp_worker_query(worker_, &attr);
  if (s != UCS_OK)
    return Status::Internal(std::string("UCX worker query failed: ") + ucs_status_string(s));
  address_.assign(reinterpret_cast<const char*>(attr.address), attr.address_length);
  ucp_worker_release_address(worker_, attr.address);
  if (attr.max_am_header < sizeof(UcxAmHeader))
    return Status::Config("UCX active messages carry at most " +
                          std::to_string(attr.max_am_header) + " header bytes with " +
                          config_summary_ + "; byteps needs " +
                          std::to_string(sizeof(UcxAmHeader)));
  ucp_am_handler_param_t hp{};
  hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                  UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  hp.id = kUcxAmId;
  hp.cb = &UcxContext::AmRecv;
  hp.arg = this;
  hp.flags = UCP_AM_FLAG_WHOLE_MSG;
  s = ucp_worker_set_am_recv_handler(worker_, &hp);
  if (s != UCS_OK)
    return Status::Internal(std::string("UCX active message handler: ") + ucs_status_string(s));
  s = ucp_worker_get_efd(worker_, &worker_fd_);
  if (s != UCS_OK)
    return Status::Config("UCX offers no event file descriptor with " + config_summary_ + ": " +
                          ucs_status_string(s));
  event_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  lifeline_epoll_ = epoll_create1(EPOLL_CLOEXEC);
  if (event_fd_ < 0 || epoll_fd_ < 0 || lifeline_epoll_ < 0)
    return Status::Internal(std::string("eventfd/epoll: ") + strerror(errno));
  for (int fd : {worker_fd_, event_fd_, lifeline_epoll_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0)
      return Status::Internal(std::string("epoll_ctl: ") + strerror(errno));
  }
  thread_ = std::thread([this] { Loop(); });
  return Status::OK();
}

UcxContext::~UcxContext() { Shutdown(); }

std::vector<std::string> UcxContext::Resources() const {
  return ParseUcxResources(
      CaptureUcxOutput([this](FILE* f) { ucp_context_print_info(context_, f); }));
}

void UcxContext::Wake() {
  if (!sleeping_.load() || event_fd_ < 0) return;
  uint64_t one = 1;
  ssize_t r = write(event_fd_, &one, sizeof(one));
  (void)r;  // EAGAIN: the counter is already non-zero, the thread wakes anyway
}

// Post and EnqueueSends wake the thread under mu_: Shutdown sets stopped_ under it before the
// thread stops, and Cleanup closes the eventfd under it, so no wake-up writes to a closed (or
// reused) descriptor.
bool UcxContext::Post(std::function<void()> fn) {
  std::lock_guard<std::mutex> lk(mu_);
  if (stopped_) return false;
  tasks_.push_back(std::move(fn));
  pending_.fetch_add(1);
  Wake();
  return true;
}

void UcxContext::EnqueueSends(std::shared_ptr<UcxLink> link) {
  std::lock_guard<std::mutex> lk(mu_);
  ready_.push_back(std::move(link));  // after stopped_: DrainTasks(always) or nobody takes it
  pending_.fetch_add(1);
  if (!stopped_) Wake();
}

bool UcxContext::SubmitDirect(UcxLink* link) {
  std::vector<UcxLink::SentFrame> sent;
  {
    std::unique_lock<std::mutex> round(round_mu_, std::try_to_lock);
    if (!round.owns_lock() || !direct_sends_) return false;
    UcxLink::DeferDone defer(&sent);
    link->SubmitQueued();
    // A send UCX took but has not completed (its resources were busy, or a rendezvous) is
    // completed by progress: the sleeping thread must look. Woken under round_mu_: Shutdown
    // closes the eventfd only after taking it.
    if (link->sending_ != nullptr) Wake();
  }
  for (auto& f : sent) f.Finish();
  return true;
}

Status UcxContext::RunSync(const std::function<Status()>& fn, double timeout_s) {
  if (OnProgressThread()) return fn();
  auto done = std::make_shared<std::promise<Status>>();
  std::future<Status> result = done->get_future();
  if (!Post([done, fn] { done->set_value(fn()); }))
    return Status::Shutdown("the UCX context " + name_ + " has shut down");
  if (result.wait_for(std::chrono::duration<double>(timeout_s)) != std::future_status::ready)
    return Status::Timeout("the UCX progress thread of " + name_ + " did not answer in " +
                           std::to_string(timeout_s) + " s");
  return result.get();
}

size_t UcxContext::DrainTasks(bool always) {
  // Nothing queued (most spin rounds): no lock, no allocation. Work queued meanwhile is seen
  // next round, or wakes the thread before it sleeps (pending_ is re-read after sleeping_).
  // `always`: after the thread stopped, take what is in the queues even where its poster has
  // not counted it yet.
  if (!always && pending_.load() == 0) return 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    drain_tasks_.swap(tasks_);
    drain_ready_.swap(ready_);
  }
  const size_t n = drain_tasks_.size() + drain_ready_.size();
  for (auto& link : drain_ready_) link->SubmitQueued();
  for (auto& task : drain_tasks_) task();
  drain_ready_.clear();  // the containers keep their storage for the next round
  drain_tasks_.clear();
  pending_.fetch_sub(n);
  return n;
}

void UcxContext::Loop() {
  thread_id_.store(std::this_thread::get_id());
  const auto spin = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(spin_s_));
  std::chrono::steady_clock::time_point idle_since;
  bool found_work = false;  // since the last polling ran out: poll before sleeping again
  bool polling = false;     // idle since idle_since
  uint32_t rounds = 0;
  bool arm_failed_logged = false;
  std::unique_lock<std::mutex> round(round_mu_);
  while (true) {
    size_t work = DrainTasks();
    work += ucp_worker_progress(worker_);
    if (stop_.load()) break;
    if ((++rounds & 63) == 0) CheckLifelines(/*poll=*/true);
    if (work) {
      found_work = true;
      polling = false;
      continue;
    }
    if (found_work && spin.count() > 0) {  // poll on until `spin` has passed without work
      const auto now = std::chrono::steady_clock::now();
      if (!polling) idle_since = now;
      polling = true;
      if (now - idle_since < spin) continue;
    }
    found_work = polling = false;
    // The lifelines' set is in the sleeping set: a lifeline that reports wakes the thread at
    // once, so only the graces already running need looking at here (no system call).
    const int grace_ms = CheckLifelines(/*poll=*/false);
    ucs_status_t s = ucp_worker_arm(worker_);
    if (s == UCS_ERR_BUSY) continue;  // events arrived meanwhile: progress them
    int timeout_ms = links_.empty() ? -1 : kLinkedWakeupMs;
    if (grace_ms >= 0) timeout_ms = timeout_ms < 0 ? grace_ms : std::min(timeout_ms, grace_ms);
    if (s != UCS_OK) {
      if (!arm_failed_logged)
        BPS_LOG(WARNING) << "UCX worker " << name_ << " cannot sleep on its event fd ("
                         << ucs_status_string(s) << "): polling every millisecond";
      arm_failed_logged = true;
      timeout_ms = 1;
    }
    sleeping_.store(true);
    if (pending_.load() == 0 && !stop_.load()) {
      epoll_event evs[3];
      round.unlock();  // senders may use the worker meanwhile (SubmitDirect)
      int n = epoll_wait(epoll_fd_, evs, 3, timeout_ms);
      round.lock();
      for (int i = 0; i < n; ++i) {
        if (evs[i].data.fd == event_fd_) {
          uint64_t v;
          ssize_t r = read(event_fd_, &v, sizeof(v));
          (void)r;
        } else if (evs[i].data.fd == lifeline_epoll_) {
          CheckLifelines(/*poll=*/true);
        }
      }
    }
    sleeping_.store(false);
  }
}

void UcxContext::SetAcceptHandler(ConnectionHandler* handler, AcceptFn on_connection) {
  std::lock_guard<std::mutex> lk(mu_);
  accept_handler_ = handler;
  accept_fn_ = std::move(on_connection);
}

void UcxContext::SetAcceptRouter(AcceptRouter router) {
  std::lock_guard<std::mutex> lk(mu_);
  accept_router_ = std::move(router);
}

uint64_t UcxContext::NewLinkId() {
  uint64_t id = 0;
  while (id == 0) {
    if (RAND_bytes(reinterpret_cast<unsigned char*>(&id), sizeof(id)) != 1) {
      static thread_local std::mt19937_64 gen(std::random_device{}());
      id = gen();
    }
  }
  return id;
}

void UcxContext::LogPeerError(const std::string& what) {
  std::string more;
  if (peer_log_.Allow(&more))
    BPS_LOG(WARNING) << "UCX " << name_ << ": dropping a message: " << what << more;
}

Status UcxContext::Connect(const std::string& peer_address, const std::string& peer_name,
                           ConnectionHandler* handler, double timeout_s,
                           std::unique_ptr<Connection>* out, uint64_t token, int lifeline_fd) {
  auto fail = [lifeline_fd](Status st) {
    if (lifeline_fd >= 0) close(lifeline_fd);
    return st;
  };
  if (peer_address.empty() || peer_address.size() > kMaxAddress)
    return fail(Status::InvalidArgument("a UCX worker address of " +
                                        std::to_string(peer_address.size()) + " bytes (1 to " +
                                        std::to_string(kMaxAddress) + " expected)"));
  if (!handler) return fail(Status::InvalidArgument("UCX Connect needs a handler"));
  if (OnProgressThread())
    return fail(
        Status::InvalidArgument("UCX Connect from the progress thread would deadlock"));
  std::shared_ptr<UcxLink> link(new UcxLink(this, NewLinkId(), peer_name, handler));
  link->lifeline_fd_ = lifeline_fd;  // the link owns it from here on
  // By value: after a RunSync timeout the task may still run.
  Status st = RunSync([this, link, peer_address, token]() -> Status {
    if (links_.size() >= kMaxLinks)
      return Status::Internal("UCX context " + name_ + " has " + std::to_string(kMaxLinks) +
                              " links open already");
    BPS_RETURN_IF_ERROR(link->CreateEndpoint(peer_address));
    links_[link->id_] = link;
    live_links_ = links_.size();
    WatchLifeline(link.get());
    WireWriter w;
    w.Str(address_).Str(name_).U64(token);
    auto* item = new SendItem;
    item->heap = true;
    item->owned = w.Take();
    item->payload = item->owned.data();
    item->len = item->owned.size();
    link->SubmitOne(UcxKind::kConnect, item);
    return Status::OK();
  });
  if (!st.ok()) return st;
  Status why;
  if (!link->WaitOpen(timeout_s, &why)) {
    link->Close();
    return why;
  }
  *out = std::make_unique<UcxConnection>(std::move(link));
  return Status::OK();
}

void UcxContext::OnConnectRequest(std::string peer_address, uint64_t peer_link,
                                  std::string peer_name, uint64_t token) {
  if (links_.size() >= kMaxLinks) {
    LogPeerError("CONNECT from " + peer_name + " beyond " + std::to_string(kMaxLinks) +
                 " links");
    return;
  }
  AcceptRoute route;
  AcceptRouter router;
  {
    std::lock_guard<std::mutex> lk(mu_);
    route.handler = accept_handler_;
    route.on_connection = accept_fn_;
    router = accept_router_;
  }
  route.peer_name = peer_name;
  if (router && !router(token, peer_name, &route)) route = AcceptRoute{};
  std::shared_ptr<UcxLink> link(new UcxLink(this, NewLinkId(), route.peer_name, nullptr));
  link->remote_id_ = peer_link;
  link->lifeline_fd_ = route.lifeline_fd;
  Status st = link->CreateEndpoint(peer_address);
  if (!st.ok()) {
    LogPeerError("CONNECT from " + peer_name + ": " + st.message());
    return;
  }
  links_[link->id_] = link;
  live_links_ = links_.size();
  ConnectionHandler* handler = route.handler;
  AcceptFn accept = std::move(route.on_connection);
  link->state_ = UcxLink::kOpen;
  WatchLifeline(link.get());
  if (!handler || !accept) {
    {
      std::lock_guard<std::mutex> lk(link->mu_);
      link->local_close_ = true;  // refused: nobody to notify here; the peer's Connect fails
    }
    link->Fail(Status::PeerLost("refused"), /*tell_peer=*/true, /*force=*/false);
    return;
  }
  link->handler_ = handler;
  link->SubmitOne(UcxKind::kAccept, nullptr);
  // Frames the owner sends before this returns leave after the ACCEPT; frames from the peer
  // wait for Start().
  accept(std::make_unique<UcxConnection>(link));
}

ucs_status_t UcxContext::AmRecv(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param) {
  const bool rndv = param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;
  const bool persistent = param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA;
  return static_cast<UcxContext*>(arg)->OnAm(header, header_length, data, length, rndv,
                                             persistent);
}

ucs_status_t UcxContext::OnAm(const void* header, size_t header_length, void* data,
                              size_t length, bool rndv, bool persistent) {
  // A rendezvous message that is refused completes the sender's send with this status.
  const ucs_status_t refuse = rndv ? UCS_ERR_CANCELED : UCS_OK;
  if (header_length != sizeof(UcxAmHeader)) {
    LogPeerError("active message header of " + std::to_string(header_length) + " bytes");
    return refuse;
  }
  UcxAmHeader h;
  memcpy(&h, header, sizeof(h));
  if (h.magic != kUcxMagic || h.version != kUcxVersion) {
    LogPeerError("bad magic or version " + std::to_string(h.version));
    return refuse;
  }
  const auto kind = static_cast<UcxKind>(h.kind);
  if (kind == UcxKind::kConnect) {
    if (rndv || length > kMaxAddress + 1024 || h.src_link == 0) {
      LogPeerError("CONNECT of " + std::to_string(length) + " bytes");
      return refuse;
    }
    WireReader r(data, length);
    std::string addr = r.Str(kMaxAddress);
    std::string name = r.Str(256);
    const uint64_t token = r.U64();
    if (!r.done() || addr.empty()) {
      LogPeerError("malformed CONNECT");
      return UCS_OK;
    }
    // Endpoint creation waits until this callback has returned.
    Post([this, addr = std::move(addr), id = h.src_link, name = std::move(name),
          token]() mutable { OnConnectRequest(std::move(addr), id, std::move(name), token); });
    return UCS_OK;
  }
  auto it = links_.find(h.dst_link);
  if (it == links_.end()) {
    // A CLOSE crossing ours is normal: the link is already gone here.
    if (kind != UcxKind::kClose) LogPeerError("message for an unknown link");
    return refuse;
  }
  UcxLink* link = it->second.get();
  const int state = link->state_.load();
  if (kind == UcxKind::kAccept) {
    if (state == UcxLink::kConnecting && h.src_link != 0) link->OnAccepted(h.src_link);
    return UCS_OK;
  }
  if (state == UcxLink::kClosed) return refuse;  // frames still in flight when it closed
  if (state != UcxLink::kConnecting && link->remote_id_ != h.src_link) {
    LogPeerError("message for link " + link->peer_name_ + " from another sender");
    return refuse;
  }
  if (kind == UcxKind::kClose) {
    link->Fail(Status::PeerLost(state == UcxLink::kConnecting
                                    ? "UCX peer " + link->peer_name_ + " refused the link"
                                    : "UCX peer " + link->peer_name_ + " closed the link"),
               /*tell_peer=*/false, /*force=*/false);
    return UCS_OK;
  }
  if (kind != UcxKind::kFrame || state != UcxLink::kOpen) {
    LogPeerError("message kind " + std::to_string(h.kind) + " on link " + link->peer_name_);
    return refuse;
  }
  return link->OnAm(h.frame, data, length, rndv, persistent);
}

void UcxContext::Retire(uint64_t link_id) {
  // Deferred: the link may be running the member function that found it finished.
  Post([this, link_id] {
    auto it = links_.find(link_id);
    if (it != links_.end() && it->second->lifeline_watched_) {
      epoll_ctl(lifeline_epoll_, EPOLL_CTL_DEL, it->second->lifeline_fd_, nullptr);
      it->second->lifeline_watched_ = false;
      --lifelines_;
    }
    if (it != links_.end()) {
      // A retired link needs its context no more: its connection, joined, may outlive it
      // (comm/van.h), and must not reach it from its destructor.
      it->second->Detach();
      links_.erase(it);
    }
    live_links_ = links_.size();
    std::lock_guard<std::mutex> lk(retire_mu_);
    retire_cv_.notify_all();
  });
}

void UcxContext::Shutdown(bool abrupt) {
  if (shut_down_) return;
  if (thread_.joinable() && OnProgressThread()) {
    BPS_LOG(ERROR) << "UCX context " << name_ << " cannot be shut down from its own thread";
    return;
  }
  shut_down_ = true;
  if (data_ops_)
    BPS_LOG(INFO) << "UCX " << name_ << ": " << registered_ops_ << " of " << data_ops_
                  << " payload sends and rendezvous receives used a region registered once; "
                  << one_way_sent.load() << " payloads written one-way into a peer's window, "
                  << one_way_received.load() << " received so";
  if (thread_.joinable()) {
    RunSync([this, abrupt]() -> Status {
      std::vector<std::shared_ptr<UcxLink>> links;
      for (auto& kv : links_) links.push_back(kv.second);
      for (auto& l : links) {
        {
          std::lock_guard<std::mutex> lk(l->mu_);
          l->local_close_ = true;
        }
        l->Fail(Status::Shutdown("the UCX context " + name_ + " shut down"), !abrupt, abrupt);
      }
      return Status::OK();
    });
    {
      std::unique_lock<std::mutex> lk(retire_mu_);
      retire_cv_.wait_for(lk, std::chrono::duration<double>(kShutdownWaitS),
                          [&] { return live_links_.load() == 0; });
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      stopped_ = true;
    }
    stop_ = true;
    sleeping_ = true;
    Wake();
    thread_.join();
    {  // after a sender that holds it: none uses the worker from here on
      std::lock_guard<std::mutex> round(round_mu_);
      direct_sends_ = false;
    }
    // Queued before stopped_: run them here (no thread is left to race).
    DrainTasks(/*always=*/true);
  }
  Cleanup();
}

void UcxContext::Cleanup() {
  // Requests and held descriptors go back before the worker (UCX insists), the worker before
  // the links.
  for (auto& kv : links_) kv.second->Abandon();
  if (worker_) ucp_worker_destroy(worker_);
  worker_ = nullptr;
  for (auto& kv : links_) kv.second->Detach();
  links_.clear();
  live_links_ = 0;
  for (auto& kv : regions_) ucp_mem_unmap(context_, kv.second.memh);
  regions_.clear();
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (lifeline_epoll_ >= 0) close(lifeline_epoll_);
  {
    std::lock_guard<std::mutex> lk(mu_);  // Post / EnqueueSends wake under it
    if (event_fd_ >= 0) close(event_fd_);
    event_fd_ = -1;
  }
  epoll_fd_ = lifeline_epoll_ = -1;
  if (context_) ucp_cleanup(context_);
  context_ = nullptr;
}

}  // namespace byteps
