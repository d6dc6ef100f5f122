// The UCX transport's process side: one UCP context and one worker, owned by one progress thread
// (docs/architecture.md §6 describes the frames it carries).
//
// Threading. The worker is created in UCS_THREAD_MODE_SERIALIZED: one thread at a time calls
// into it, and that is whoever holds round_mu_. The progress thread holds it for every round of
// work (tasks, ucp_worker_progress and the callbacks it runs, arming) and lets go of it only
// while it sleeps. Other threads hand work over through two queues: a link with frames to send
// is put on a ready list (the frames themselves stay in the link's intrusive SendItem list:
// nothing is allocated per frame), anything else is a task (std::function). One shortcut: a
// thread that sends a frame while the progress thread sleeps takes round_mu_ (try_lock, never
// waiting) and hands the link's frames to UCX itself (SubmitDirect), which saves waking the
// progress thread for every frame; the frame's `done` then runs in Send, after round_mu_ is
// released (comm/connection.h allows it). Every other UCX callback (active message arrived,
// a send completed later, receive completed, endpoint failed) runs on the progress thread, and
// so do the handlers' OnHeader / OnFrame / OnClosed. UCX's own locks are never taken.
//
// Sleeping. When a round of ucp_worker_progress has found nothing (and has found nothing for
// spin_s, BYTEPS_UCX_SPIN_US, default 0) the thread arms the worker (ucp_worker_arm) and sleeps
// in epoll on the worker's event fd and an eventfd of its own, which a thread that queues work
// writes only when the progress thread sleeps (a Dekker pair of sequentially consistent atomics
// decides). An idle process burns no CPU; with links open the thread still wakes once a second
// so UCX's keepalive runs. Polling by default took the CPU of the processes sharing the cores
// (and over UCX's TCP transport every poll is an epoll_wait system call): 256 empty rounds
// before sleeping made 4 KiB push_pull 2x slower over UCX's TCP than sleeping at once.
//
// Connecting. A peer is reached by its worker address (address(), an opaque blob of a few
// hundred bytes that the caller carries to the peer, e.g. in the address book). Connect creates
// an endpoint to it, sends CONNECT carrying this worker's address, and waits for ACCEPT; the
// peer's context creates an endpoint back and hands the new connection to its accept function.
// Each side names a link by a random 64-bit id; every message carries both ids, and a message
// whose ids do not name an open link is dropped. Nothing here authenticates a peer: whoever
// knows the worker address can open a link (a van must run the job-secret handshake over it
// before handing it out).
//
// UCX configures itself from the UCX_* environment (UCX_TLS, UCX_NET_DEVICES, ...): nothing
// here overrides it. Endpoints use UCP_ERR_HANDLING_MODE_PEER, so a failed peer is reported
// through the error callback and never aborts the process; where no transport reaching the peer
// can report failures (UCX 1.13's shared-memory transports alone), the endpoint falls back to
// mode NONE and the link says so (UcxLink::peer_failure_detection): a dead peer is then noticed
// by its CLOSE message, by an operation to it that fails (a rendezvous fetch from a killed
// process: PeerLost, tested), or by the job's heartbeats; an idle link to it stays open.
#pragma once
#include <cstdint>
#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "comm/connection.h"
#include "common/logging.h"
#include "common/status.h"

namespace byteps {

class UcxLink;

// Which links offer one-way writes (ucx_link.h, "One-way writes"): kAuto, those whose active
// messages go over RDMA; kOn, over shared memory too; kOff, none. Never over TCP.
enum class UcxOneWay { kAuto, kOn, kOff };

// A registered memory region (RegisterMemory): sends from and rendezvous receives into any part
// of it pass its handle to UCX, which then skips its own registration cache.
struct UcxRegion {
  void* addr = nullptr;
  size_t len = 0;
  ucp_mem_h memh = nullptr;
  // A slab of AllocateShared: UCX allocated it; `used` bytes are carved, `live` slots in use.
  bool slab = false;
  size_t used = 0, live = 0;
};

// What UCX reports about itself and this host, for the doctor.
struct UcxInfo {
  std::string version;      // ucp_get_version_string()
  std::string tls;          // the UCX_TLS value UCX uses ("all" by default)
  std::string net_devices;  // the UCX_NET_DEVICES value UCX uses
  // Transport/device pairs a context would use after those filters ("tcp/eth0",
  // "posix/memory"...), from ucp_context_print_info.
  std::vector<std::string> resources;
  std::string error;  // why a context could not be created; empty when it could
};
UcxInfo QueryUcxInfo();
// Whether a UCX resource ("rc_mlx5/mlx5_0:1", "tcp/eth0", ...) is an RDMA transport: verbs'
// reliable, dynamically connected or unreliable datagram transports, or InfiniBand's own.
bool IsRdmaTransport(const std::string& resource);

class UcxContext {
 public:
  // Creates the UCP context, its worker and the progress thread. `name` appears in UCX's logs
  // and in error messages. A UCX that cannot start (e.g. UCX_TLS names no available transport)
  // is a Status::Config naming UCX and the UCX_TLS / UCX_NET_DEVICES values in force.
  // `default_tls`, when not empty, is the transport list used where UCX's own configuration
  // leaves UCX_TLS at its default "all" (the van's shared-memory-only context for colocated
  // peers: "sm,self"); an explicit UCX_TLS=all counts as the default.
  // `spin_s`: seconds the progress thread keeps polling after it last found work before it
  // sleeps (BYTEPS_UCX_SPIN_US; "Sleeping" above).
  // `one_way`: which links offer one-way writes (PackRemoteKey, UcxLink::OpenWindow;
  // BYTEPS_UCX_ONE_WAY): UcxOneWay.
  static Status Create(const std::string& name, std::unique_ptr<UcxContext>* out,
                       const std::string& default_tls = "", double spin_s = 0,
                       UcxOneWay one_way = UcxOneWay::kAuto);
  ~UcxContext();  // Shutdown()
  UcxContext(const UcxContext&) = delete;
  UcxContext& operator=(const UcxContext&) = delete;

  // This worker's address: what a peer passes to Connect.
  const std::string& address() const { return address_; }
  const std::string& name() const { return name_; }
  // Transport/device pairs this context uses ("tcp/eth0", "posix/memory", "rc_mlx5/mlx5_0:1"),
  // from ucp_context_print_info.
  std::vector<std::string> Resources() const;
  // "UCX_TLS=..., UCX_NET_DEVICES=..." as UCX read them: for error messages.
  const std::string& config_summary() const { return config_summary_; }
  // Whether the user chose UCX's rendezvous threshold (UCX_RNDV_THRESH, in the environment or
  // a UCX configuration file, not at its default "auto"): links then force nothing eager
  // (UcxEagerMax, ucx_util.h).
  bool user_rndv_thresh() const { return user_rndv_thresh_; }

  // Each link a peer opens becomes a connection (UcxConnection, not yet started: its frames
  // wait for Start()) with `handler`, handed to `on_connection` on the progress thread. Without
  // them (the default) links are refused and the peer's Connect fails.
  using AcceptFn = std::function<void(std::unique_ptr<Connection> conn)>;
  void SetAcceptHandler(ConnectionHandler* handler, AcceptFn on_connection);
  // Where an accepted link goes: its handler, who receives the connection, its name, and the
  // lifeline socket it owns from then on (-1: none).
  struct AcceptRoute {
    ConnectionHandler* handler = nullptr;
    AcceptFn on_connection;
    std::string peer_name;
    int lifeline_fd = -1;
  };
  // With a router (a van's bootstrap), a CONNECT is accepted only when router(token, name,
  // &route) returns true for the token the peer's Connect carried: links nobody bootstrapped
  // are refused. Runs on the progress thread. Takes precedence over SetAcceptHandler.
  using AcceptRouter =
      std::function<bool(uint64_t token, const std::string& peer_name, AcceptRoute* route)>;
  void SetAcceptRouter(AcceptRouter router);

  // Opens a link to the worker at `peer_address` (its address()) and waits at most timeout_s for
  // the peer's ACCEPT; *out is a UcxConnection, not yet started. Errors: Timeout, PeerLost (the
  // peer refused, is gone, or no transport in UCX_TLS reaches it). Not from the progress thread.
  // `token` travels in the CONNECT for the peer's AcceptRouter. `lifeline_fd` (optional) is a
  // connected socket to the peer's process that the link owns from this call on (closed with
  // it, or at once when Connect fails): when it reports end of file or an error, the peer is
  // gone and the link fails with PeerLost (after kLifelineGraceS, so that a CLOSE already on its
  // way arrives first). It detects a killed peer where UCX's transports cannot (shared memory).
  Status Connect(const std::string& peer_address, const std::string& peer_name,
                 ConnectionHandler* handler, double timeout_s, std::unique_ptr<Connection>* out,
                 uint64_t token = 0, int lifeline_fd = -1);
  static constexpr double kLifelineGraceS = 0.5;

  // ucp_mem_map of [addr, addr+len) and its undoing, by the start address (the Van's
  // RegisterMemory / UnregisterMemory hooks). Two regions must not start at the same address
  // (InvalidArgument); a region must stay registered while frames use it.
  Status RegisterMemory(void* addr, size_t len);
  Status UnregisterMemory(void* addr);
  // Memory for peers to write into one-way (Van::AllocateMemory): `len` bytes, page-aligned,
  // carved from slabs of at least kSlabBytes that UCX allocates and registers itself
  // (ucp_mem_map with UCP_MEM_MAP_ALLOCATE: System V or POSIX shared memory where UCX has it,
  // so that a colocated peer's write is a copy through its own mapping of the slab, with
  // nothing for this process to do; registered with the RDMA devices too). A slab is a
  // registered region (sends from it and receives into it use its registration); it is
  // unmapped once its last slot is freed (and at Shutdown). Errors: kInternal from UCX.
  Status AllocateShared(size_t len, void** addr);
  void FreeShared(void* addr);
  static constexpr size_t kSlabBytes = 64ull << 20;
  // A window on [addr, addr+len), which must lie in one registered region, for `link`'s peer
  // (Connection::ExportWindow): *blob = "BPSW", the address, the length and the region's
  // packed remote key. kInvalidArgument where the context or the link has no one-way writes
  // or the memory is not registered.
  Status PackRemoteKey(UcxLink* link, void* addr, size_t len, std::string* blob);
  UcxOneWay one_way() const { return one_way_; }

  // Closes every link and stops the thread; then no call reaches UCX. Links are closed with a
  // CLOSE message to their peer (OnClosed with PeerLost there), or, `abrupt` (tests: a crash),
  // with the endpoints force-closed and nothing said. Not from the progress thread. Idempotent.
  void Shutdown(bool abrupt = false);

  // --- for UcxLink (progress-thread plumbing) ---
  ucp_worker_h worker() const { return worker_; }
  bool OnProgressThread() const { return std::this_thread::get_id() == thread_id_.load(); }
  // Runs fn on the progress thread (false: the context has stopped; fn was not queued).
  bool Post(std::function<void()> fn);
  // Runs fn on the progress thread and waits for its status (at once on that thread).
  Status RunSync(const std::function<Status()>& fn, double timeout_s = 30);
  // The link has frames in its send list.
  void EnqueueSends(std::shared_ptr<UcxLink> link);
  // From a thread other than the progress thread: hands the link's queued frames to UCX on this
  // thread if the progress thread is asleep (round_mu_ free), running the completed frames'
  // `done` after letting go of it; false (nothing done) when the progress thread is busy or the
  // context is stopping: queue them (EnqueueSends).
  bool SubmitDirect(UcxLink* link);
  // The registered region containing [p, p+len), or null (progress thread).
  ucp_mem_h FindMemh(const void* p, size_t len) const;
  // The registered region (or slab) containing [p, p+len), or null (progress thread).
  const UcxRegion* RegionContaining(const void* p, size_t len) const;
  // Gives a send or receive of [p, p+len) the registration that contains it, if any
  // (progress thread).
  void UseRegistration(ucp_request_param_t* param, const void* p, size_t len) const;
  // The link's endpoint is closed and nothing is pending: forget it (progress thread).
  void Retire(uint64_t link_id);
  uint64_t NewLinkId();
  // Bounded log of what peers send wrong.
  void LogPeerError(const std::string& what);
  // Watches the link's lifeline socket (progress thread; ucx_lifeline.cc).
  void WatchLifeline(UcxLink* link);
  // Payloads written one-way into a peer's window, and frames that announced such a write to
  // this process: the links count them, Shutdown's INFO line reports them.
  std::atomic<uint64_t> one_way_sent{0}, one_way_received{0};

 private:
  UcxContext(std::string name, double spin_s, UcxOneWay one_way)
      : name_(std::move(name)), spin_s_(spin_s), one_way_(one_way) {}
  Status Init(const std::string& default_tls);
  void Loop();
  // Reads what the watched lifelines report (`poll`: one epoll_wait on their set, without
  // blocking) and fails the links whose peer is gone, once their grace has passed (progress
  // thread). Returns the milliseconds until the next grace ends (-1: none pending), for the
  // sleep's timeout.
  int CheckLifelines(bool poll);
  size_t DrainTasks(bool always = false);
  void Wake();
  void Cleanup();  // after the thread stopped
  static ucs_status_t AmRecv(void* arg, const void* header, size_t header_length, void* data,
                             size_t length, const ucp_am_recv_param_t* param);
  ucs_status_t OnAm(const void* header, size_t header_length, void* data, size_t length,
                    bool rndv, bool persistent);
  void OnConnectRequest(std::string peer_address, uint64_t peer_link, std::string peer_name,
                        uint64_t token);

  std::string name_;
  const double spin_s_;
  const UcxOneWay one_way_;
  std::string address_;
  std::string config_summary_;
  bool user_rndv_thresh_ = false;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int worker_fd_ = -1, event_fd_ = -1, epoll_fd_ = -1;
  std::thread thread_;
  std::atomic<std::thread::id> thread_id_{};

  std::mutex mu_;  // tasks_, ready_, stopped_, accept_handler_, accept_fn_
  std::deque<std::function<void()>> tasks_;
  std::vector<std::shared_ptr<UcxLink>> ready_;
  bool stopped_ = false;  // no more tasks accepted
  ConnectionHandler* accept_handler_ = nullptr;
  AcceptFn accept_fn_;
  AcceptRouter accept_router_;
  std::atomic<size_t> pending_{0};  // tasks + ready links queued
  std::atomic<bool> sleeping_{false};
  std::atomic<bool> stop_{false};
  // Whoever calls into the UCX worker holds it ("Threading" above).
  std::mutex round_mu_;
  bool direct_sends_ = true;  // under round_mu_: off once Shutdown has stopped the thread

  // Progress thread only.
  std::deque<std::function<void()>> drain_tasks_;  // DrainTasks' batch (storage reused)
  std::vector<std::shared_ptr<UcxLink>> drain_ready_;
  std::unordered_map<uint64_t, std::shared_ptr<UcxLink>> links_;
  std::map<uintptr_t, UcxRegion> regions_;
  uintptr_t open_slab_ = 0;  // the slab AllocateShared carves from (0: none)
  int lifeline_epoll_ = -1;  // the watched lifelines, by link id; itself in epoll_fd_
  size_t lifelines_ = 0;     // watched now
  std::vector<std::pair<uint64_t, std::chrono::steady_clock::time_point>> lost_;  // fail then
  std::atomic<size_t> live_links_{0};  // links_.size(), read by Shutdown
  std::mutex retire_mu_;
  std::condition_variable retire_cv_;
  LogLimiter peer_log_;
  bool shut_down_ = false;
  mutable uint64_t data_ops_ = 0, registered_ops_ = 0;  // UseRegistration (progress thread)
};

}  // namespace byteps
