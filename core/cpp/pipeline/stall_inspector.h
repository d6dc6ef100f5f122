// The stall inspector (Horovod's stall check, for a parameter server; docs/architecture.md §8):
// a push_pull still in flight after BYTEPS_STALL_WARNING_SECONDS is logged as a warning naming
// the tensor, where it waits and the ranks that have not submitted it; after BYTEPS_TIMEOUT it
// fails with the same text. Who is missing comes from the gates (local ranks that have not
// signalled) and, for partitions waiting for their sum, from the servers: a STALL_QUERY for
// (key, round), answered by a STALL_REPORT listing the worker machines whose push has not
// arrived. Operations that wait for a worker machine that has finalized can never complete: the
// inspector asks the servers who is missing and fails those operations at once, naming it.
//
// WorkerCore owns one and runs Check from its watchdog thread, once a second. Each operation's
// state (stall_queried, stall_warned, left_queried_at) is in its TensorContext.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "pipeline/stage_table.h"

namespace byteps {

class Gate;
class PsClient;
struct TensorContext;
struct WorkerConfig;

// The gate in front of a stage of a tensor's plan, as the inspector names who is missing there.
struct StallGate {
  enum Kind : uint8_t {
    kNone,        // no gate: the stage's own work, its server or its all-reduce peer
    kLocalRanks,  // the other local processes' signals (Gate::Signalled says whose are in)
    kRootPulls,   // the local root's PULLED: the root waits for the servers
    kRootOrders,  // the local root's GO of a sequenced stage (BYTEPS_NCCL): the root orders it
  };
  Kind kind = kNone;
  Gate* gate = nullptr;
};

class StallInspector {
 public:
  // What the inspector needs from the worker core.
  struct Hooks {
    // Calls `f` with every tensor context, under the worker's table lock (f locks ctx->mu).
    std::function<void(const std::function<void(TensorContext*)>& f)> for_each_tensor;
    // The gate in front of stage s in ctx's plan.
    std::function<StallGate(const TensorContext* ctx, Stage s)> gate_at;
    // Fails ctx's operation for good: on this process (a timeout; WorkerCore::FinishOp,
    // sticky), or on every process of the machine (a left worker; WorkerCore::FailOpOnMachine).
    std::function<void(TensorContext* ctx, const Status&)> fail_op, fail_op_on_machine;
  };
  // `ps`: the PS client of the local root of a distributed job (null on every other process).
  // `cfg` and `ps` outlive the inspector.
  StallInspector(const WorkerConfig& cfg, PsClient* ps, Hooks hooks);

  // One round of the watchdog: the servers asked a second before a warning (or the timeout) is
  // due, left workers' victims failed, warnings logged, operations past BYTEPS_TIMEOUT failed.
  void Check(std::chrono::steady_clock::time_point now);

 private:
  void SendStallQueries(TensorContext* c);
  // "3 of 4 partitions unfinished, at PULL (waiting for server 1)".
  std::string StallWhere(TensorContext* c);
  // "not yet submitted by rank 1; ..." ("" when nobody is known to be missing).
  std::string StallCulprits(TensorContext* c);
  void CheckLeftWorkers(std::chrono::steady_clock::time_point now);
  // The ranks of left machines that the servers report missing for `c` (none, or no report
  // yet: empty).
  std::set<int> LeftWorkersMissing(TensorContext* c);

  const WorkerConfig& cfg_;
  PsClient* ps_;
  Hooks hooks_;
};

// How the stall inspector, the declaration's stall warning and the all-reduces' errors name
// ranks (rank = machine * local_size + local_rank).
// Every rank of the given worker machines.
void AddMachineRanks(const std::vector<int>& machines, int local_size, std::set<int>* ranks);
// "rank 1" / "ranks 1, 3"; "" for no ranks.
std::string RankList(const std::set<int>& ranks);
// "not yet submitted by rank 1" / "... by ranks 1, 3"; "" for no ranks.
std::string NotSubmittedBy(const std::set<int>& ranks);
// "worker machine 2 (ranks 4-5)".
std::string MachineText(int machine, int local_size);

}  // namespace byteps
