// BYTEPS_AUTOTUNE (docs/autotune.md): the autotuner, which tunes the partition size and the
// credit during the first iterations: trials of (partition bytes, credit) timed by the pilot
// tensor's push_pull calls, averaged over the workers by a small push_pull, searched by
// AutotuneSearch (scheduling/autotune_search.h, the same on every worker), and the switch from
// one point to the next.
//
// An *iteration* is the interval between two consecutive push_pull calls of the pilot tensor:
// the first tensor that is push_pulled a second time (a tensor push_pulled once, such as a
// broadcast of the initial parameters, never becomes the pilot). Everything the tuner does
// runs on the thread that calls push_pull for the pilot, never on a pipeline thread.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "scheduling/autotune_search.h"

namespace byteps {

class Knobs;
struct PushPullArgs;
struct TensorContext;
struct WorkerConfig;

// Reads BYTEPS_AUTOTUNE* into cfg->autotune (LoadWorkerConfig, after the partition and credit
// knobs): ConfigError for a layout it cannot tune; the registered bound becomes the largest
// partition size the search may try.
Status LoadAutotuneConfig(const Knobs& k, WorkerConfig* cfg);

// The name of the small push_pull that averages each trial's measurement over the workers.
constexpr const char* kAutotuneTensor = "__byteps_autotune__";

struct AutotuneConfig {
  bool enabled = false;
  std::string log_path;  // BYTEPS_AUTOTUNE_LOG; "{rank}" in it: one file per rank
  int warmup = 3;        // BYTEPS_AUTOTUNE_WARMUP_SAMPLES
  int steps = 5;         // BYTEPS_AUTOTUNE_STEPS_PER_SAMPLE
  int max_trials = 16;   // BYTEPS_AUTOTUNE_MAX_SAMPLES
  TunePoint start;       // the knobs' values (defaults or set)
  bool fix_partition = false, fix_credit = false;  // set by the user: held fixed
  std::string disabled_why;  // enabled by the variable but off here (logged at start)
};

// What Python sees (byteps._core.autotune_status).
struct AutotuneReport {
  bool enabled = false, done = false;
  std::string error;
  std::vector<TuneTrial> trials;
  TuneTrial choice;
  TunePoint current;
};

// Owned by WorkerCore when BYTEPS_AUTOTUNE=1 (null otherwise).
class Autotuner {
 public:
  // What the tuner needs from the worker core.
  struct Hooks {
    // Starts a push_pull (WorkerCore::Enqueue): the measurement's, whose outcome comes to its
    // args' on_done.
    std::function<Status(const PushPullArgs&)> push_pull;
    // The credit, in bytes, of every stage queue that holds one (StageRow::credit).
    std::function<void(size_t)> set_credit;
  };
  // Null unless cfg.autotune.enabled; logs why BYTEPS_AUTOTUNE=1 is ignored where it is, and
  // the search it starts. `cfg` outlives the tuner.
  static std::unique_ptr<Autotuner> Start(const WorkerConfig& cfg, Hooks hooks);
  Autotuner(const WorkerConfig& cfg, Hooks hooks);

  // What WorkerCore cuts a tensor with: the job-level bound of the point in use, and its epoch
  // (each point's switch; a tensor cut in an older epoch is cut anew at its next push_pull,
  // WorkerCore::Repartition).
  size_t bound() const { return bound_.load(); }
  uint32_t epoch() const { return epoch_.load(); }
  // The choice is made (or the search stopped on an error): OnEnqueue has nothing left to do.
  bool done() const { return done_.load(); }
  // The calling thread of a push_pull of `ctx` (round: its push_pulls so far), before the
  // operation is set up: pilot iterations, trials, the switch to the next point. May wait for
  // the trial's measurement (at most BYTEPS_TIMEOUT + 10 s).
  void OnEnqueue(const TensorContext* ctx, uint32_t round);
  AutotuneReport Report();

 private:
  enum class Phase { kWarmup, kMeasure, kGap, kSettle, kDone };
  // Switches to point p: the queues' credit at once, each tensor's cut at its next push_pull.
  void Apply(const TunePoint& p);
  // Starts the averaging push_pull of this worker's median of the trial.
  void Submit();
  void WriteLog(const std::string& line);

  const WorkerConfig& cfg_;
  Hooks hooks_;
  AutotuneSearch search_;
  std::mutex mu_;  // the steps (pilot's push_pull calls) and the report
  std::atomic<const TensorContext*> pilot_{nullptr};
  std::atomic<bool> done_{false};
  Phase phase_ = Phase::kWarmup;
  int warm_ = 0;
  std::chrono::steady_clock::time_point last_;
  std::vector<double> samples_;  // this trial's iteration times here, seconds
  TunePoint current_;            // the point in use
  double local_s_ = 0;           // this worker's median of the trial being averaged
  // The averaging push_pull: {seconds, 1} in, the sum over the workers out.
  double send_[2] = {0, 0}, recv_[2] = {0, 0};
  std::mutex reduce_mu_;
  std::condition_variable reduce_cv_;
  bool reduced_ = false;
  Status reduce_status_;
  std::atomic<size_t> bound_{0};
  std::atomic<uint32_t> epoch_{0};
  std::ofstream log_;
  std::string error_;
  TuneTrial choice_;
};

}  // namespace byteps
