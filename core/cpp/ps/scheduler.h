// The scheduler (docs/architecture.md §1): rendezvous (registration, ranks, address book), the
// key->server plan (§4), cross-worker consistency of every declared tensor, heartbeats, and
// spreading the first failure to every node. One per job; started as `DMLC_ROLE=scheduler python -m
// byteps.server`.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/van.h"
#include "ps/control_msgs.h"
#include "ps/key_plan.h"
#include "ps/protocol.h"

namespace byteps {

struct SchedulerOptions {
  std::string host;
  int port = 0;
  int num_worker = 1;
  int num_server = 1;
  double timeout_s = 120;
  double heartbeat_timeout_s = 15;
  double stall_warning_s = 60;  // a declaration waiting this long is reported (0: never)
  VanSpec van;  // of every connection (the job's: VanSpec::FromKnobs)
  // BYTEPS_ENABLE_ASYNC, BYTEPS_ASYNC_MAX_STALENESS: every node must have the same; in
  // asynchronous mode a worker that dies leaves the job instead of failing it (docs/async.md).
  bool async_mode = false;
  int max_staleness = -1;
};

class Scheduler : public PsConnectionHandler {
 public:
  explicit Scheduler(SchedulerOptions opts);
  ~Scheduler() override;
  // Runs the job's control plane; returns OK when every worker finalized, or the failure.
  Status Run();

  Status OnHeader(Connection* c, const FrameHeader& h, void** dest) override;
  void OnFrame(Connection* c, const FrameHeader& h, void* payload) override;
  void OnClosed(Connection* c, const Status& why) override;

 private:
  using Clock = std::chrono::steady_clock;
  struct Node {
    RegisterMsg reg;
    Connection* conn = nullptr;
    int rank = -1;
    Clock::time_point last_seen;
    bool finalized = false;  // FINALIZE, or (asynchronous mode) died: no longer in the job
    std::string Describe() const;
  };
  struct Pending {
    DeclareMsg first;
    int first_worker = -1;
    std::vector<bool> seen;
    // The worker machines that declare it: a process set's (DeclareMsg::members), or all.
    std::vector<bool> member;
    int expected = 0;
    int count = 0;
    std::string error;
    Clock::time_point started;
    bool answered = false;
    bool timed_out = false;
    bool warned = false;  // stall warning sent
  };

  void OnAccepted(std::unique_ptr<Connection> conn);
  void HandleRegister(Connection* c, const char* p, size_t n);
  void HandleDeclare(Node* node, const char* p, size_t n);
  void AnswerDeclare(uint32_t key, Pending* pd);
  // Declarations still waiting for a worker that has finalized can never complete: answered
  // with an error naming it.
  void FailDeclaresOfLeftWorkersLocked();
  // A worker machine is done (FINALIZE, or died in asynchronous mode): the others hear
  // WORKER_LEFT (servers too in asynchronous mode); the job ends when every one is.
  void WorkerDoneLocked(Node* node);
  void WorkerDiedLocked(Node* node, const std::string& why);
  // Asynchronous mode: every worker that has not left has declared it.
  bool DeclaredByLiveWorkersLocked(const Pending& pd) const;
  // The nodes whose BYTEPS_ENABLE_ASYNC / BYTEPS_ASYNC_MAX_STALENESS differ from the
  // scheduler's ("" when none).
  std::string AsyncMismatchLocked() const;
  void SendAddressBooksLocked();
  void FailLocked(const std::string& why);
  void CheckTimersLocked();
  Node* NodeOf(Connection* c);
  std::string MissingWorkersLocked(const Pending& pd) const;
  // Horovod's join (scheduler_join.cc; docs/collectives.md, "Join").
  // A worker machine's JOIN: the servers stop waiting for it, the declarations it has not made
  // go ahead without it; the last one lifts the join (servers first, then JOIN_DONE).
  void HandleJoinLocked(Node* node, const FrameHeader& h, const char* p, size_t n);
  // A server applied a JOIN; once it has applied the one that lifts the join: JOIN_DONE.
  void HandleJoinAckLocked(Node* node);
  // The declarations made plus the members' that need not be made (joined machines).
  int CoveredLocked(const Pending& pd) const;
  // After an answer (payload) to `key`: a joined member that did not declare it hears its
  // name (JOINED_NOTE) and owes the declaration, answered from here when it comes.
  void NoteJoinedLocked(uint32_t key, const Pending& pd, const std::string& payload);
  // A declaration owed by `node` (true: answered here).
  bool AnswerOwedLocked(Node* node, const DeclareMsg& m);
  void SendJoinToServersLocked();

  SchedulerOptions opts_;
  std::unique_ptr<Van> van_;  // outlives conns_
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Connection>> conns_;
  std::vector<std::unique_ptr<Node>> nodes_;
  bool book_sent_ = false;
  bool done_ = false;
  std::string failure_;
  Clock::time_point start_;
  std::unique_ptr<KeyPlanner> planner_;
  // HiPS: the top-level servers' planner, by group size (docs/schemes.md).
  std::map<int, std::unique_ptr<KeyPlanner>> hips_planners_;
  std::map<uint32_t, Pending> pending_;
  uint32_t first_local_size_ = 0;
  uint64_t first_bound_ = 0;
  int finalized_workers_ = 0;
  // Join: the joined worker machines, the rank that joined last, the highest round of each
  // declared key they reported, the JOINs each server has yet to acknowledge, whether the last
  // JOIN sent lifted the join, and the declarations answered while machines were joined.
  std::vector<bool> joined_;
  int last_joined_rank_ = -1;
  std::map<uint32_t, uint32_t> join_rounds_;
  std::map<int, int> join_acks_;
  bool lifting_join_ = false;
  struct Owed {
    DeclareMsg first;
    std::string payload;
    std::vector<bool> owed;  // [worker machine]
  };
  std::map<uint32_t, Owed> owed_;
};

}  // namespace byteps
