// BYTEPS_AUTOTUNE (docs/autotune.md): the worker core's state for tuning the partition size and
// the credit during the first iterations. The search itself is scheduling/autotune_search.h;
// the steps (WorkerCore::AutotuneOnEnqueue, Repartition) are in worker_autotune.cc.
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
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "scheduling/autotune_search.h"

namespace byteps {

struct TensorContext;
struct WorkerConfig;
class Knobs;

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

struct AutotuneState {
  enum class Phase { kWarmup, kMeasure, kGap, kSettle, kDone };
  AutotuneState(const AutotuneConfig& c, std::vector<int64_t> partitions,
                std::vector<int64_t> credits)
      : cfg(c), search(c.start, std::move(partitions), std::move(credits), c.max_trials) {}

  AutotuneConfig cfg;
  AutotuneSearch search;
  std::mutex mu;  // the steps (pilot's push_pull calls) and the report
  std::atomic<TensorContext*> pilot{nullptr};
  std::atomic<bool> done{false};
  Phase phase = Phase::kWarmup;
  int warm = 0;
  std::chrono::steady_clock::time_point last;
  std::vector<double> samples;  // this trial's iteration times here, seconds
  TunePoint current;            // the point in use
  double local_s = 0;           // this worker's median of the trial being averaged
  // The averaging push_pull: {seconds, 1} in, the sum over the workers out.
  double send[2] = {0, 0}, recv[2] = {0, 0};
  std::mutex reduce_mu;
  std::condition_variable reduce_cv;
  bool reduced = false;
  Status reduce_status;
  // What Repartition cuts with: the job-level bound of the point in use, and its epoch (each
  // point's switch; a tensor cut in an older epoch is cut anew at its next push_pull).
  std::atomic<size_t> bound{0};
  std::atomic<uint32_t> epoch{0};
  std::ofstream log;
  std::string error;
  TuneTrial choice;
};

}  // namespace byteps
