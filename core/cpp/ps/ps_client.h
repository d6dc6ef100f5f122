// The worker's side of the PS protocol (docs/architecture.md §6), in the spirit of ps-lite's
// KVWorker: one per worker machine (its local root). Owns the control client (scheduler) and
// the connections to the servers, and is their PsConnectionHandler: registration and HELLO,
// declarations, pushes (each may ask for the round's sum), the pulls in flight and where their
// responses go, stall queries and their reports, WORKER_LEFT, DATA_ERROR, finalize. The worker
// pipeline (pipeline/) talks to the job only through this class; it knows no message type.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "comm/van.h"
#include "common/dtype.h"
#include "ps/control_client.h"
#include "ps/control_msgs.h"
#include "ps/peer_mesh.h"
#include "ps/protocol.h"

namespace byteps {

// A pull the client may wait for: one per partition, owned by the worker (inside its partition
// task) and reused every round, so pushing and pulling allocate nothing. The worker sets `key`
// and `arg` once; Push sets the rest. Fields below `server` are the client's, read and written
// under its pull lock.
struct PendingPull {
  uint64_t key = 0;
  void* arg = nullptr;  // the worker's (its partition task)
  uint32_t round = 0;   // the round whose sum is expected
  size_t length = 0;    // its byte count (up_to: at most)
  bool up_to = false;   // a compressed key's encoded sum: any length up to `length`
  size_t received = 0;  // the byte count of the response being received
  int server = -1;
  // The response's aux: a traced server's wait and summation times (pipeline/timeline.h).
  uint64_t reply_aux = 0;
  bool receiving = false;  // a response is being received into the worker's buffer
  bool awaiting_ack = false;  // the push of this round has not been acknowledged (PUSH_ACK)
  // Streaming receive (PullDest::stream): divide each chunk by `divide_by` (0: no division).
  int divide_by = 0;
  DType dtype = DType::kFloat32;
  // Stall inspector: the server's answer to a STALL_QUERY for this round (the worker machines
  // whose push has not arrived).
  bool stall_reported = false;
  std::vector<int> stall_missing;
};

// Where the response of a pull goes, as the worker says (PullSink::PullDestination).
struct PullDest {
  char* data = nullptr;  // at least the pull's length bytes
  // Receive through a cache-resident bounce buffer with non-temporal stores
  // (Connection::StreamPayload), dividing by divide_by (0: none) on the way in.
  bool stream = false;
  int divide_by = 0;
  DType dtype = DType::kFloat32;
};

// Implemented by the worker: the destination of each pull response and its completion.
class PullSink {
 public:
  virtual ~PullSink() = default;
  // A response of `p`'s round and length arrived (`payload_len` bytes); the receiving thread,
  // with the client's pull lock held: say where it goes. `written`: the server wrote it
  // one-way into the window the worker offered (PsClient::OfferPullWindow), so it is already
  // there (the answer must be that place, and nothing can be done on the way in).
  virtual PullDest PullDestination(PendingPull* p, uint64_t payload_len, bool written) = 0;
  // The response is in place (receiving thread, no lock held).
  virtual void OnPulled(PendingPull* p) = 0;
  // The server acknowledged the push of p's round (receiving thread, no lock held); called
  // once per push, unless PsClient::ClaimPushAck or CancelPulls took it first.
  virtual void OnPushAcked(PendingPull* p) = 0;
};

// What the scheduler answered to a DECLARE.
struct DeclareAnswer {
  DeclareReply reply = DeclareReply::kOk;
  std::vector<int> not_declared;  // kStallWarning: worker machines that have not declared it
  std::string text;               // kMismatch, kTimeout: the scheduler's message
  Status decoded;                 // kOk: whether the plan decoded
  std::vector<int64_t> servers;   // kOk: the server of every partition
};

struct PsClientConfig {
  int worker_id = 0, num_worker = 1;
  std::string root_uri;  // the scheduler
  int root_port = 0;
  double heartbeat_interval_s = 1, heartbeat_timeout_s = 15;
  VanSpec van;  // of every connection (the job's: VanSpec::FromKnobs)
  // The worker mesh (ps/peer_mesh.h), for the all-reduce schemes: null for none. Connect
  // listens before registering and connects to `mesh_peers` once the address book is in.
  CollectiveSink* collective = nullptr;
  std::vector<int> mesh_peers;
};

class PsClient : public PsConnectionHandler {
 public:
  // `fatal(st, report)`: the job failed for this worker; report: tell the scheduler (false when
  // the news came from there). `failed()`, `stopping()`: the worker's state (a closed server
  // connection is blamed only when neither holds, after a short wait for news of a failure).
  using FatalFn = std::function<void(const Status& st, bool report)>;
  using StateFn = std::function<bool()>;
  using DeclareReplyFn = std::function<void(const DeclareAnswer& a)>;
  using SentFn = void (*)(void* arg, const Status& st);

  PsClient(PsClientConfig cfg, PullSink* sink, FatalFn fatal, StateFn failed, StateFn stopping);
  ~PsClient() override;

  // Connects to the scheduler, registers (`reg.host` empty: this host's address on the route
  // to the scheduler), connects to every server of the address book and says HELLO, then
  // starts the heartbeats. Each step is bounded by timeout_s.
  Status Connect(RegisterMsg reg, double timeout_s);
  int num_servers() const { return static_cast<int>(servers_.size()); }
  // The servers of the address book that run on no worker machine's host (CPU-only; the
  // scheduler's colocated flags, the same in every worker's book): the k of the cost model.
  int cpu_only_servers() const { return cpu_only_servers_; }
  // Whether server `s` advertised this worker's own address (its pushes never cross the NIC).
  bool server_on_this_host(int s) const {
    return s >= 0 && s < static_cast<int>(on_this_host_.size()) && on_this_host_[s];
  }
  // The worker mesh (null when PsClientConfig::collective is).
  PeerMesh* mesh() const { return mesh_.get(); }

  // Sends DECLARE; on_reply gets every answer for the key (stall warnings, then the final one),
  // on the control connection's receiving thread.
  void Declare(uint32_t key, const DeclareMsg& msg, DeclareReplyFn on_reply);

  // Makes map entries for these pulls' keys now, so that no push rehashes the table later.
  void ReservePulls(const std::vector<uint64_t>& keys);
  // Sends PUSH of (key, round) from `buf` (len bytes, caller's memory, unchanged until sent)
  // through `item`, which the caller owns and reuses (nothing is allocated). `pull` non-null:
  // the push also asks for the round's sum, which goes where the sink says; the pull is pending
  // before the bytes leave. on_sent(arg, status) once written (the sending thread).
  // A compressed key's push (docs/compression.md) sets `aux` (the bits of the worker's learning
  // rate) and `pull_up_to`: its sum comes back as an encoding of at most that many bytes
  // (PendingPull::received says how many); 0 = exactly `len`. `flags`: more push flags
  // (kPushFlagHips: a HiPS push, aux = the top-level server). A plain push that pulls goes
  // one-way into the server's slot once the server gave a window for the key (the van decides
  // by size: comm/connection.h, SendItem::window).
  void Push(int server, uint64_t key, uint32_t round, DType dtype, const void* buf, size_t len,
            PendingPull* pull, SendItem* item, SentFn on_sent, void* arg, uint64_t aux = 0,
            size_t pull_up_to = 0, uint8_t flags = 0);  // flags: more push flags (kPushFlagAsync, kPushFlagHips)
  // Whether this job's van may write one-way (Van::one_way_writes): windows are worth offering.
  bool one_way_writes() const { return van_->one_way_writes(); }
  // One-way pull responses (docs/rdma.md): before the first push of a plain key that pulls,
  // offers its server a window on where the key's sums go, memory registered with RegisterMemory
  // that holds the sum of an even round at `at`, of an odd round at at + stride (`len` bytes
  // each). The server writes them there one-way instead of sending them as frames (PULL_WINDOW).
  // Once per key and server; nothing is sent where the link has no one-way writes.
  void OfferPullWindow(int server, uint64_t key, char* at, size_t len, size_t stride);
  // KEY_CONFIG of a compressed key to its server: before the key's first push, on the same
  // connection (so it arrives first).
  void ConfigureKey(int server, uint64_t key, const KeyConfigMsg& m);
  // Memory pushes are sent from and pulls received into for the whole job (the local root's
  // aggregate buffers), registered once with the van (Van::RegisterMemory; a no-op for TCP).
  Status RegisterMemory(void* addr, size_t len) { return van_->RegisterMemory(addr, len); }
  void UnregisterMemory(void* addr) { van_->UnregisterMemory(addr); }
  // Takes p's outstanding push acknowledgement (true), so that it is never reported: for a push
  // that failed. False when it was acknowledged, claimed or cancelled already.
  bool ClaimPushAck(PendingPull* p);
  // The worker gave up on these pulls: their responses are read past from now on. Returns once
  // none is still being received into the worker's memory (or after timeout_s). Also returns (in *unacked) those whose push acknowledgement was still outstanding: it will
  // not be reported, and their credit is the caller's to give back.
  void CancelPulls(const std::vector<PendingPull*>& pulls, double timeout_s,
                   std::vector<PendingPull*>* unacked);

  // Asks `server` which worker machines have not pushed (key, round); the answer lands in the
  // pending pull (StallReport).
  void StallQuery(int server, uint64_t key, uint32_t round);
  // The report for p's current round, if one came: the worker machines missing.
  bool StallReport(const PendingPull* p, std::vector<int>* missing);
  void ClearStallReport(PendingPull* p);
  // Worker machines that have finalized while this one goes on (WORKER_LEFT), and when the last
  // one did; false when none has.
  bool LeftWorkers(std::set<int>* machines, std::chrono::steady_clock::time_point* last) const;

  // Horovod's join (docs/collectives.md, "Join"): JOIN to the scheduler with this machine's
  // rank and the round of each of its tensors ((declared key, round) pairs). `on_note(key,
  // name)` for each tensor the others declare meanwhile (JOINED_NOTE), then `on_done(last rank,
  // the highest round of every tensor)` once every machine has joined (JOIN_DONE); both on the
  // control connection's receiving thread.
  using JoinNoteFn = std::function<void(uint32_t key, const std::string& name)>;
  using JoinDoneFn =
      std::function<void(int last, const std::vector<std::pair<uint32_t, uint32_t>>& rounds)>;
  void Join(int rank, const std::vector<std::pair<uint32_t, uint32_t>>& rounds,
            JoinNoteFn on_note, JoinDoneFn on_done);

  // Tells the scheduler (and so every node) that this worker failed.
  void ReportFailure(const std::string& text);
  // GOODBYE to every server and PEER_GOODBYE to every mesh peer, each flushed (at most 2 s).
  void Goodbye();
  // FINALIZE to the scheduler and the wait for FINALIZE_DONE (timeout_s).
  Status Finalize(double timeout_s);
  // Joins the server connections and closes the control connection.
  void Close();

  // The server connections (receiving threads).
  Status OnHeader(Connection* c, const FrameHeader& h, void** dest) override;
  void OnFrame(Connection* c, const FrameHeader& h, void* payload) override;
  void OnClosed(Connection* c, const Status& why) override;

 private:
  void OnControlMessage(const FrameHeader& h, const char* payload, size_t len);
  // A PUSH_ACK's window: the key's later pushes to that server go one-way (receiving thread).
  void OpenWindow(Connection* c, const FrameHeader& h, const void* blob);
  // The pull pending for `key` (null: none, or given up), with pull_mu_ held.
  PendingPull* PendingLocked(uint64_t key) const;
  // Connection::PayloadSink of streamed pull responses: divide, then non-temporal copy.
  static void StreamSink(void* arg, char* dst, char* chunk, size_t len);

  PsClientConfig cfg_;
  PullSink* sink_;
  FatalFn fatal_;
  StateFn failed_, stopping_;
  std::unique_ptr<Van> van_;  // outlives control_ and servers_
  std::unique_ptr<ControlClient> control_;
  std::vector<std::unique_ptr<Connection>> servers_;
  int cpu_only_servers_ = 0;
  std::vector<bool> on_this_host_;  // by server index
  std::unique_ptr<PeerMesh> mesh_;  // before van_ goes
  std::mutex declare_mu_;
  std::mutex join_mu_;
  JoinNoteFn join_note_;
  JoinDoneFn join_done_;
  std::unordered_map<uint32_t, DeclareReplyFn> declares_;  // by declared key
  std::mutex pull_mu_;
  std::condition_variable pull_cv_;
  std::unordered_map<uint64_t, PendingPull*> pending_pulls_;
  // One-way pushes (docs/rdma.md): the window a server gave for a key, {server, window id of
  // its connection}; under pull_mu_.
  std::unordered_map<uint64_t, std::pair<int, uint32_t>> windows_;
  std::atomic<uint64_t> window_errors_{0};
  // One-way pull responses: where a server may write a key's sums (OfferPullWindow), by key;
  // `offered` false: the link could not export it (tried once). Under pull_mu_.
  struct PullWindow {
    int server = -1;
    char* at = nullptr;
    size_t len = 0, stride = 0;
    bool offered = false;
  };
  std::unordered_map<uint64_t, PullWindow> pull_windows_;
  // Checks a one-way pull response (FrameHeader::written) against the key's window and the
  // pending pull, with pull_mu_ held; OK: *at is where its bytes are.
  Status CheckWrittenLocked(Connection* c, const FrameHeader& h, const PendingPull* p,
                            char** at) const;
  mutable std::mutex left_mu_;
  std::set<int> left_machines_;
  std::chrono::steady_clock::time_point left_at_{};
  // Waits briefly for news of a failure elsewhere before blaming a lost server (OnClosed): on a
  // thread of its own, since the news may arrive through the same van thread (UCX). One at a
  // time; joined by Close().
  std::mutex blame_mu_;
  std::thread blame_;
  bool blaming_ = false;
};

}  // namespace byteps
