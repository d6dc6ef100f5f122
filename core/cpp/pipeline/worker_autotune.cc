// BYTEPS_AUTOTUNE (docs/autotune.md): trials of (partition bytes, credit) during the first
// iterations, timed by the pilot tensor's push_pull calls, averaged over the workers by a small
// push_pull, searched by AutotuneSearch (the same on every worker), and the switch from one
// point to the next: the PUSH queue's credit at once, and each tensor cut anew under new keys at
// its next push_pull (Repartition, a re-declaration the scheduler checks across workers).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <sstream>

#include "common/logging.h"
#include "pipeline/worker.h"

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

void WorkerCore::StartAutotune() {
  const AutotuneConfig& a = cfg_.autotune;
  if (!a.disabled_why.empty())
    BPS_LOG(WARNING) << "rank " << cfg_.rank << ": BYTEPS_AUTOTUNE=1 ignored: " << a.disabled_why;
  if (!a.enabled) return;
  std::vector<int64_t> parts = a.fix_partition ? std::vector<int64_t>{a.start.partition_bytes}
                                               : DefaultPartitionGrid();
  std::vector<int64_t> credits =
      a.fix_credit ? std::vector<int64_t>{a.start.credit} : DefaultCreditGrid();
  tune_ = std::make_unique<AutotuneState>(a, parts, credits);
  TunePoint first;
  tune_->search.Next(&first);  // the start point
  tune_->current = first;
  tune_->bound = cfg_.partition_bound;
  std::string path = a.log_path;
  const size_t at = path.find("{rank}");
  if (at != std::string::npos) path.replace(at, 6, std::to_string(cfg_.rank));
  if (!path.empty() && (at != std::string::npos || cfg_.rank == 0)) {
    tune_->log.open(path, std::ios::out | std::ios::trunc);
    if (!tune_->log)
      BPS_LOG(WARNING) << "rank " << cfg_.rank << ": BYTEPS_AUTOTUNE_LOG=" << path
                       << " cannot be written; the trials go to the INFO log only";
  }
  BPS_LOG(INFO) << "rank " << cfg_.rank << ": autotune: from " << PointText(first) << ", "
                << tune_->search.partitions().size() << " partition sizes x "
                << tune_->search.credits().size() << " credits, at most " << a.max_trials
                << " trials of " << a.steps << " iterations after " << a.warmup
                << " warm-up iterations";
}

void WorkerCore::AutotuneWriteLog(const std::string& line) {
  if (!tune_->log.is_open()) return;
  tune_->log << line << "\n";
  tune_->log.flush();
}

void WorkerCore::AutotuneApply(const TunePoint& p) {
  const size_t bound = PartitionBound(p.partition_bytes, cfg_.local_size);
  const size_t credit = static_cast<size_t>(p.credit) * bound;
  for (const StageRow& row : StageTable::rows)
    if (row.credit && queues_[static_cast<int>(row.id)])
      queues_[static_cast<int>(row.id)]->SetCredit(credit);
  tune_->current = p;
  tune_->bound = bound;
  tune_->epoch++;  // every tensor is cut with `bound` at its next push_pull
}

void WorkerCore::AutotuneSubmit() {
  AutotuneState& s = *tune_;
  s.send[0] = s.local_s;
  s.send[1] = 1;
  {
    std::lock_guard<std::mutex> lk(s.reduce_mu);
    s.reduced = false;
  }
  PushPullArgs a;
  a.name = kAutotuneTensor;
  a.input = reinterpret_cast<char*>(s.send);
  a.output = reinterpret_cast<char*>(s.recv);
  a.nbytes = sizeof(s.send);
  a.dtype = DType::kFloat64;
  a.shape = {2};
  a.average = false;
  a.has_priority = true;
  a.priority = std::numeric_limits<int64_t>::max() / 2;  // ahead of every gradient
  AutotuneState* sp = &s;
  a.on_done = [sp](const Status& st) {
    std::lock_guard<std::mutex> lk(sp->reduce_mu);
    sp->reduced = true;
    sp->reduce_status = st;
    sp->reduce_cv.notify_all();
  };
  int64_t h;
  Status st = Enqueue(a, &h);
  if (!st.ok()) {
    std::lock_guard<std::mutex> lk(s.reduce_mu);
    s.reduced = true;
    s.reduce_status = st;
  }
}

void WorkerCore::AutotuneOnEnqueue(TensorContext* ctx, uint32_t round) {
  AutotuneState& s = *tune_;
  if (ctx->name == kAutotuneTensor) return;
  TensorContext* pilot = s.pilot.load();
  if (!pilot) {
    if (round == 0) return;  // its first push_pull
    TensorContext* none = nullptr;
    if (!s.pilot.compare_exchange_strong(none, ctx) && s.pilot.load() != ctx) return;
    BPS_LOG(INFO) << "rank " << cfg_.rank << ": autotune: iterations are timed by '"
                  << ctx->name << "' (the first tensor push_pulled twice)";
  } else if (pilot != ctx) {
    return;
  }
  std::lock_guard<std::mutex> lk(s.mu);
  if (s.done) return;
  const auto now = std::chrono::steady_clock::now();
  switch (s.phase) {
    case AutotuneState::Phase::kWarmup:
      if (++s.warm <= s.cfg.warmup) return;
      s.phase = AutotuneState::Phase::kSettle;
      [[fallthrough]];
    case AutotuneState::Phase::kSettle:  // the first iteration of a point re-declares: not timed
      s.samples.clear();
      s.last = now;
      s.phase = AutotuneState::Phase::kMeasure;
      return;
    case AutotuneState::Phase::kMeasure: {
      s.samples.push_back(std::chrono::duration<double>(now - s.last).count());
      s.last = now;
      if (static_cast<int>(s.samples.size()) < s.cfg.steps) return;
      std::vector<double> v = s.samples;
      std::sort(v.begin(), v.end());
      s.local_s = v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
      s.phase = AutotuneState::Phase::kGap;
      AutotuneSubmit();  // averaged over the workers during the next iteration
      return;
    }
    case AutotuneState::Phase::kGap:
      break;
    case AutotuneState::Phase::kDone:
      return;
  }
  // kGap: the trial's average over the workers (every worker gets the same sum), then the
  // search's next point, the same everywhere.
  Status st;
  {
    std::unique_lock<std::mutex> rl(s.reduce_mu);
    if (!s.reduce_cv.wait_for(rl, std::chrono::duration<double>(cfg_.timeout_s + 10),
                              [&] { return s.reduced; }))
      st = Status::Timeout("the measurement's push_pull did not finish");
    else
      st = s.reduce_status;
  }
  const int trial = static_cast<int>(s.search.trials().size());
  if (!st.ok()) {
    s.error = "trial " + std::to_string(trial) + ": " + st.message();
    BPS_LOG(WARNING) << "rank " << cfg_.rank << ": autotune stopped (" << s.error
                     << "); keeping " << PointText(s.current);
    s.choice = TuneTrial{s.current, 0};
    s.phase = AutotuneState::Phase::kDone;
    s.done = true;
    return;
  }
  const double avg = s.recv[0] / std::max(1.0, s.recv[1]);
  s.search.Report(s.current, avg);
  BPS_LOG(INFO) << "rank " << cfg_.rank << ": autotune: trial " << trial << ": "
                << PointText(s.current) << ": iteration " << Num(avg) << " s (here "
                << Num(s.local_s) << " s)";
  AutotuneWriteLog("{\"event\": \"trial\", \"trial\": " + std::to_string(trial) +
                   ", \"partition_bytes\": " + std::to_string(s.current.partition_bytes) +
                   ", \"credit\": " + std::to_string(s.current.credit) +
                   ", \"iteration_s\": " + Num(avg) + ", \"local_iteration_s\": " +
                   Num(s.local_s) + ", \"steps\": " + std::to_string(s.cfg.steps) +
                   ", \"workers\": " + Num(s.recv[1]) + "}");
  TunePoint next;
  if (s.search.Next(&next)) {
    AutotuneApply(next);
    s.phase = AutotuneState::Phase::kSettle;
    s.samples.clear();
    s.last = now;
    s.phase = AutotuneState::Phase::kSettle;
    return;
  }
  s.choice = s.search.Best();
  if (!(s.choice.point == s.current)) AutotuneApply(s.choice.point);
  s.phase = AutotuneState::Phase::kDone;
  s.done = true;
  BPS_LOG(INFO) << "rank " << cfg_.rank << ": autotune: chose " << PointText(s.choice.point)
                << " (iteration " << Num(s.choice.seconds) << " s) after " << trial + 1
                << " trials";
  AutotuneWriteLog("{\"event\": \"choice\", \"partition_bytes\": " +
                   std::to_string(s.choice.point.partition_bytes) +
                   ", \"credit\": " + std::to_string(s.choice.point.credit) +
                   ", \"iteration_s\": " + Num(s.choice.seconds) +
                   ", \"trials\": " + std::to_string(trial + 1) + "}");
}

void WorkerCore::MakeTasks(TensorContext* ctx, const std::vector<Partition>& parts) {
  for (auto& p : parts) {
    auto t = std::make_unique<PartTask>();
    t->owner = this;
    t->ctx = ctx;
    t->part = p;
    t->key = PartitionKey(ctx->declared_key, p.index, ctx->key_gen);
    t->pull.key = t->key;
    t->pull.arg = t.get();
    ctx->parts.push_back(std::move(t));
  }
}

Status WorkerCore::Repartition(TensorContext* ctx) {
  ctx->tune_epoch = tune_->epoch.load();
  // A compressed tensor keeps its cut (its partitions' compressors carry state across rounds);
  // the measurement's tensor too.
  if (ctx->compressed || !cfg_.distributed || !cfg_.is_root() || ctx->name == kAutotuneTensor)
    return Status::OK();
  const size_t job_bound = tune_->bound.load();
  std::vector<Partition> parts;
  BPS_RETURN_IF_ERROR(PartitionTensor(
      ctx->nbytes, TensorPartitionBound(ctx->nbytes, job_bound, cfg_.num_worker, cfg_.local_size),
      DTypeSize(ctx->dtype), &parts));
  bool same = parts.size() == ctx->parts.size();
  for (size_t i = 0; same && i < parts.size(); ++i)
    same = parts[i].length == ctx->parts[i]->part.length;
  if (same) return Status::OK();  // the same cut (a small tensor): same keys, no re-declaration
  for (auto& t : ctx->parts) ctx->retired.push_back(std::move(t));
  ctx->parts.clear();
  ctx->key_gen++;
  ctx->job_bound = job_bound;
  MakeTasks(ctx, parts);
  std::vector<uint64_t> keys;
  for (auto& t : ctx->parts) keys.push_back(t->key);
  ps_->ReservePulls(keys);
  ctx->declared = false;  // the next push_pull declares the new cut
  ctx->declare_sent = false;
  return Status::OK();
}

AutotuneReport WorkerCore::AutotuneStatus() {
  AutotuneReport r;
  if (!tune_) return r;
  std::lock_guard<std::mutex> lk(tune_->mu);
  r.enabled = true;
  r.done = tune_->done;
  r.error = tune_->error;
  r.trials = tune_->search.trials();
  r.choice = tune_->choice;
  r.current = tune_->current;
  return r;
}

}  // namespace byteps
