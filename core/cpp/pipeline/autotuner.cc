// BYTEPS_AUTOTUNE (docs/autotune.md): the autotuner (autotuner.h). The switch from one point to
// the next sets the PUSH queue's credit at once; WorkerCore cuts each tensor anew under new keys
// at its next push_pull (Repartition, a re-declaration the scheduler checks across workers).
#include "pipeline/autotuner.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>

#include "common/logging.h"
#include "pipeline/context.h"
#include "pipeline/push_pull_args.h"
#include "pipeline/worker_config.h"
#include "scheduling/partitioner.h"

namespace byteps {

namespace {
std::string PointText(const TunePoint& p) {
  return "partition " + std::to_string(p.partition_bytes) + " B, credit " +
         (p.credit == 0 ? std::string("unlimited") : std::to_string(p.credit));
}
std::string Num(double v) {
  char b[64];
  snprintf(b, sizeof(b), "%.6g", v);
  return b;
}
}  // namespace

Status LoadAutotuneConfig(const Knobs& k, WorkerConfig* cfg) {
  AutotuneConfig& a = cfg->autotune;
  a.enabled = k.Bool("BYTEPS_AUTOTUNE");
  if (!a.enabled) return Status::OK();
  a.log_path = k.Str("BYTEPS_AUTOTUNE_LOG");
  a.warmup = static_cast<int>(k.Int("BYTEPS_AUTOTUNE_WARMUP_SAMPLES"));
  a.steps = static_cast<int>(k.Int("BYTEPS_AUTOTUNE_STEPS_PER_SAMPLE"));
  a.max_trials = static_cast<int>(k.Int("BYTEPS_AUTOTUNE_MAX_SAMPLES"));
  a.start = {k.Int("BYTEPS_PARTITION_BYTES"), k.Int("BYTEPS_SCHEDULING_CREDIT")};
  a.fix_partition = k.IsSet("BYTEPS_PARTITION_BYTES");
  a.fix_credit = k.IsSet("BYTEPS_SCHEDULING_CREDIT");
  if (!cfg->distributed) {
    a.enabled = false;
    a.disabled_why = "a single-machine job has no servers, partitions or credit to tune";
    return Status::OK();
  }
  if (cfg->async_mode)
    return Status::Config(
        "BYTEPS_AUTOTUNE=1 with BYTEPS_ENABLE_ASYNC=1: the tuner averages its measurements over "
        "every worker and re-partitions tensors at the same round on all of them, which "
        "asynchronous workers do not share; set BYTEPS_PARTITION_BYTES and "
        "BYTEPS_SCHEDULING_CREDIT instead");
  if (cfg->local_size > 1)
    return Status::Config(
        "BYTEPS_AUTOTUNE=1 with BYTEPS_LOCAL_SIZE=" + std::to_string(cfg->local_size) +
        ": the tuner re-partitions tensors at run time, which it does only with one worker "
        "process per machine; run without BYTEPS_AUTOTUNE, or set BYTEPS_PARTITION_BYTES and "
        "BYTEPS_SCHEDULING_CREDIT from a run with BYTEPS_LOCAL_SIZE=1");
  if (!a.fix_partition)
    for (int64_t p : DefaultPartitionGrid())
      cfg->register_bound = std::max(cfg->register_bound, PartitionBound(p, cfg->local_size));
  return Status::OK();
}

namespace {
std::vector<int64_t> PartitionGrid(const AutotuneConfig& a) {
  return a.fix_partition ? std::vector<int64_t>{a.start.partition_bytes} : DefaultPartitionGrid();
}
std::vector<int64_t> CreditGrid(const AutotuneConfig& a) {
  return a.fix_credit ? std::vector<int64_t>{a.start.credit} : DefaultCreditGrid();
}
}  // namespace

std::unique_ptr<Autotuner> Autotuner::Start(const WorkerConfig& cfg, Hooks hooks) {
  const AutotuneConfig& a = cfg.autotune;
  if (!a.disabled_why.empty())
    BPS_LOG(WARNING) << "rank " << cfg.rank << ": BYTEPS_AUTOTUNE=1 ignored: " << a.disabled_why;
  if (!a.enabled) return nullptr;
  return std::make_unique<Autotuner>(cfg, std::move(hooks));
}

Autotuner::Autotuner(const WorkerConfig& cfg, Hooks hooks)
    : cfg_(cfg),
      hooks_(std::move(hooks)),
      search_(cfg.autotune.start, PartitionGrid(cfg.autotune), CreditGrid(cfg.autotune),
              cfg.autotune.max_trials) {
  const AutotuneConfig& a = cfg_.autotune;
  TunePoint first;
  search_.Next(&first);  // the start point
  current_ = first;
  bound_ = cfg_.partition_bound;
  std::string path = a.log_path;
  const size_t at = path.find("{rank}");
  if (at != std::string::npos) path.replace(at, 6, std::to_string(cfg_.rank));
  if (!path.empty() && (at != std::string::npos || cfg_.rank == 0)) {
    log_.open(path, std::ios::out | std::ios::trunc);
    if (!log_)
      BPS_LOG(WARNING) << "rank " << cfg_.rank << ": BYTEPS_AUTOTUNE_LOG=" << path
                       << " cannot be written; the trials go to the INFO log only";
  }
  BPS_LOG(INFO) << "rank " << cfg_.rank << ": autotune: from " << PointText(first) << ", "
                << search_.partitions().size() << " partition sizes x "
                << search_.credits().size() << " credits, at most " << a.max_trials
                << " trials of " << a.steps << " iterations after " << a.warmup
                << " warm-up iterations";
}

void Autotuner::WriteLog(const std::string& line) {
  if (!log_.is_open()) return;
  log_ << line << "\n";
  log_.flush();
}

void Autotuner::Apply(const TunePoint& p) {
  const size_t bound = PartitionBound(p.partition_bytes, cfg_.local_size);
  hooks_.set_credit(static_cast<size_t>(p.credit) * bound);
  current_ = p;
  bound_ = bound;
  epoch_++;  // every tensor is cut with `bound` at its next push_pull
}

void Autotuner::Submit() {
  send_[0] = local_s_;
  send_[1] = 1;
  {
    std::lock_guard<std::mutex> lk(reduce_mu_);
    reduced_ = false;
  }
  PushPullArgs a;
  a.name = kAutotuneTensor;
  a.input = reinterpret_cast<char*>(send_);
  a.output = reinterpret_cast<char*>(recv_);
  a.nbytes = sizeof(send_);
  a.dtype = DType::kFloat64;
  a.shape = {2};
  a.average = false;
  a.has_priority = true;
  a.priority = std::numeric_limits<int64_t>::max() / 2;  // ahead of every gradient
  a.on_done = [this](const Status& st) {
    std::lock_guard<std::mutex> lk(reduce_mu_);
    reduced_ = true;
    reduce_status_ = st;
    reduce_cv_.notify_all();
  };
  Status st = hooks_.push_pull(a);
  if (!st.ok()) {
    std::lock_guard<std::mutex> lk(reduce_mu_);
    reduced_ = true;
    reduce_status_ = st;
  }
}

void Autotuner::OnEnqueue(const TensorContext* ctx, uint32_t round) {
  if (ctx->name == kAutotuneTensor) return;
  const TensorContext* pilot = pilot_.load();
  if (!pilot) {
    if (round == 0) return;  // its first push_pull
    const TensorContext* none = nullptr;
    if (!pilot_.compare_exchange_strong(none, ctx) && pilot_.load() != ctx) return;
    BPS_LOG(INFO) << "rank " << cfg_.rank << ": autotune: iterations are timed by '"
                  << ctx->name << "' (the first tensor push_pulled twice)";
  } else if (pilot != ctx) {
    return;
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (done_) return;
  const auto now = std::chrono::steady_clock::now();
  switch (phase_) {
    case Phase::kWarmup:
      if (++warm_ <= cfg_.autotune.warmup) return;
      phase_ = Phase::kSettle;
      [[fallthrough]];
    case Phase::kSettle:  // the first iteration of a point re-declares: not timed
      samples_.clear();
      last_ = now;
      phase_ = Phase::kMeasure;
      return;
    case Phase::kMeasure: {
      samples_.push_back(std::chrono::duration<double>(now - last_).count());
      last_ = now;
      if (static_cast<int>(samples_.size()) < cfg_.autotune.steps) return;
      std::vector<double> v = samples_;
      std::sort(v.begin(), v.end());
      local_s_ = v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
      phase_ = Phase::kGap;
      Submit();  // averaged over the workers during the next iteration
      return;
    }
    case Phase::kGap:
      break;
    case Phase::kDone:
      return;
  }
  // kGap: the trial's average over the workers (every worker gets the same sum), then the
  // search's next point, the same everywhere.
  Status st;
  {
    std::unique_lock<std::mutex> rl(reduce_mu_);
    if (!reduce_cv_.wait_for(rl, std::chrono::duration<double>(cfg_.timeout_s + 10),
                             [&] { return reduced_; }))
      st = Status::Timeout("the measurement's push_pull did not finish");
    else
      st = reduce_status_;
  }
  const int trial = static_cast<int>(search_.trials().size());
  if (!st.ok()) {
    error_ = "trial " + std::to_string(trial) + ": " + st.message();
    BPS_LOG(WARNING) << "rank " << cfg_.rank << ": autotune stopped (" << error_
                     << "); keeping " << PointText(current_);
    choice_ = TuneTrial{current_, 0};
    phase_ = Phase::kDone;
    done_ = true;
    return;
  }
  const double avg = recv_[0] / std::max(1.0, recv_[1]);
  search_.Report(current_, avg);
  BPS_LOG(INFO) << "rank " << cfg_.rank << ": autotune: trial " << trial << ": "
                << PointText(current_) << ": iteration " << Num(avg) << " s (here "
                << Num(local_s_) << " s)";
  WriteLog("{\"event\": \"trial\", \"trial\": " + std::to_string(trial) +
           ", \"partition_bytes\": " + std::to_string(current_.partition_bytes) +
           ", \"credit\": " + std::to_string(current_.credit) + ", \"iteration_s\": " + Num(avg) +
           ", \"local_iteration_s\": " + Num(local_s_) +
           ", \"steps\": " + std::to_string(cfg_.autotune.steps) + ", \"workers\": " +
           Num(recv_[1]) + "}");
  TunePoint next;
  if (search_.Next(&next)) {
    Apply(next);
    phase_ = Phase::kSettle;
    samples_.clear();
    last_ = now;
    phase_ = Phase::kSettle;
    return;
  }
  choice_ = search_.Best();
  if (!(choice_.point == current_)) Apply(choice_.point);
  phase_ = Phase::kDone;
  done_ = true;
  BPS_LOG(INFO) << "rank " << cfg_.rank << ": autotune: chose " << PointText(choice_.point)
                << " (iteration " << Num(choice_.seconds) << " s) after " << trial + 1
                << " trials";
  WriteLog("{\"event\": \"choice\", \"partition_bytes\": " +
           std::to_string(choice_.point.partition_bytes) +
           ", \"credit\": " + std::to_string(choice_.point.credit) +
           ", \"iteration_s\": " + Num(choice_.seconds) +
           ", \"trials\": " + std::to_string(trial + 1) + "}");
}

AutotuneReport Autotuner::Report() {
  AutotuneReport r;
  std::lock_guard<std::mutex> lk(mu_);
  r.enabled = true;
  r.done = done_;
  r.error = error_;
  r.trials = search_.trials();
  r.choice = choice_;
  r.current = current_;
  return r;
}

}  // namespace byteps
