// The stage loops of the worker pipeline and the local signalling between the worker processes
// of one machine (COPY_IN -> LOCAL_REDUCE -> [PUSH -> PULL] -> COPY_OUT), and the watchdog
// thread: the stall inspector's check (stall_inspector.h) and the other local processes'
// liveness.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>

#include "common/logging.h"
#include "pipeline/worker.h"
#include "reduce/copy.h"
#include "reduce/sum.h"

namespace byteps {

void WorkerCore::StageLoop(Stage s) {
  ScheduledQueue* q = queues_[static_cast<int>(s)].get();
  QueueItem item;
  while (!threads_stop_) {
    if (q->Pop(&item, std::chrono::milliseconds(200))) RunStageItem(s, item);
  }
}

void WorkerCore::RunStageItem(Stage s, const QueueItem& item) {
  const StageRow& row = StageTable::Row(s);
  ScheduledQueue* q = queues_[static_cast<int>(s)].get();
  auto* t = static_cast<PartTask*>(item.ptr);
  bool live = t->ctx->in_flight;
  // A credit stage (PUSH) returns its credit when the push is written (OnPushSent); the other
  // stages hold none.
  if (!row.credit || !live) q->ReturnCredit(item.bytes);
  if (!live) return;  // the operation already failed: drop the partition
  if (t->ctx->traced) t->trace.start[static_cast<int>(s)] = TraceNowNs();
  (this->*row.run)(t);
}

void WorkerCore::RunCopyIn(PartTask* t) {
  // Only the other processes read my slot, and only outside my own shard (which I reduce
  // straight from my input), so that shard is not copied.
  TensorContext* ctx = t->ctx;
  size_t es = DTypeSize(ctx->dtype);
  size_t begin, end;
  ShardRange(t->part.length / es, cfg_.local_size, cfg_.local_rank, &begin, &end);
  char* slot = ctx->slot(cfg_.local_rank) + t->part.offset;
  const char* in = ctx->input + t->part.offset;
  memcpy(slot, in, begin * es);
  memcpy(slot + end * es, in + end * es, t->part.length - end * es);
  SendSignal(LocalSignalType::kWritten, t, -1);
  Proceed(t);
}

void WorkerCore::RunLocalReduce(PartTask* t) {
  TensorContext* ctx = t->ctx;
  int L = cfg_.local_size;
  size_t es = DTypeSize(ctx->dtype);
  size_t begin, end;
  ShardRange(t->part.length / es, L, cfg_.local_rank, &begin, &end);
  if (end > begin) {
    size_t off = t->part.offset + begin * es, n = end - begin;
    char* dst = ctx->aggregate(L) + off;
    // Reduce (ctx->op) in local-rank order (the same order for every shard); my own part comes straight
    // from my input.
    auto src = [&](int j) -> const char* {
      return (j == cfg_.local_rank ? ctx->input : ctx->slot(j)) + off;
    };
    reduce::Reduce3(dst, src(0), src(1), n, ctx->dtype, ctx->op);
    for (int j = 2; j < L; ++j) reduce::ReduceInto(dst, src(j), n, ctx->dtype, ctx->op);
    // Single machine: the aggregate is final, so average it here, shard by shard in parallel,
    // instead of every process dividing the whole tensor after copying it out.
    if (!cfg_.distributed && ctx->average)
      reduce::DivideInPlace(dst, n, ctx->dtype, AverageDivisor(ctx));
  }
  // Every local process has written (and so mapped) the segment: its name can go now, so
  // nothing is left in /dev/shm even if the job is killed later.
  if (cfg_.is_root() && ctx->round == 1 && t->part.index == 0) ctx->shm->Unlink();
  if (!cfg_.distributed) SendSignal(LocalSignalType::kReduced, t, -1);
  else if (!cfg_.is_root()) SendSignal(LocalSignalType::kReduced, t, 0);
  Proceed(t);
}

void WorkerCore::RunCopyOut(PartTask* t) {
  TensorContext* ctx = t->ctx;
  // One process on one machine: the sum is the input, so a device tensor's result is copied
  // within the device, never through host memory (worker_device.cc).
  if (ctx->device && OneProcessJob()) return RunCopyWithinDevice(t);
  if (ctx->nccl) return RunCopyOutShard(t);
  size_t off = t->part.offset, len = t->part.length;
  char* out = ctx->output + off;
  size_t es = DTypeSize(ctx->dtype);
  // A compressed tensor was divided before it was encoded (worker_compress.cc).
  const int divisor = AverageDivisor(ctx);
  bool divide = ctx->average && divisor > 1 && !ctx->compressed;
  if (cfg_.local_size > 1) {
    const char* agg = ctx->aggregate(cfg_.local_size) + off;
    if (!cfg_.distributed || !divide) {
      // Single machine (already averaged in LOCAL_REDUCE) or a plain sum. The output is not
      // read again soon (the framework gets it after the whole tensor), so a large one
      // bypasses the cache.
      if (reduce::ShouldStream(ctx->nbytes)) {
        reduce::CopyStreaming(out, agg, len);
      } else {
        memcpy(out, agg, len);
      }
    } else {
      // Copy and divide in cache-sized blocks: one pass over memory instead of two.
      constexpr size_t kBlock = 256 << 10;
      for (size_t b = 0; b < len; b += kBlock) {
        size_t n = std::min(kBlock, len - b);
        memcpy(out + b, agg + b, n);
        reduce::DivideInPlace(out + b, n / es, ctx->dtype, divisor);
      }
    }
  } else {
    if (!cfg_.distributed && ctx->input != ctx->output) memcpy(out, ctx->input + off, len);
    if (divide && !t->pulled_final) reduce::DivideInPlace(out, len / es, ctx->dtype, divisor);
  }
  Proceed(t);
}

// An NCCL tensor (nccl_sequencer.h): this process's shard of the machine's sum, divided in place
// in the aggregate when averaging, before COPY_H2D takes it back to the device.
void WorkerCore::RunCopyOutShard(PartTask* t) {
  TensorContext* ctx = t->ctx;
  const size_t es = DTypeSize(ctx->dtype);
  size_t begin, end;
  nccl_.Shard(t, &begin, &end);
  if (ctx->average && AverageDivisor(ctx) > 1 && !ctx->compressed && end > begin)
    reduce::DivideInPlace(ctx->aggregate(cfg_.local_size) + t->part.offset + begin,
                          (end - begin) / es, ctx->dtype, AverageDivisor(ctx));
  // Every local process has signalled its shard (so mapped the segment): its name can go.
  if (cfg_.is_root() && ctx->round == 1 && t->part.index == 0) ctx->shm->Unlink();
  Proceed(t);
}

void WorkerCore::SendSignal(LocalSignalType type, PartTask* t, int to, uint8_t code) {
  LocalSignal s;
  s.type = static_cast<uint8_t>(type);
  s.code = code;
  s.from = static_cast<uint16_t>(cfg_.local_rank);
  s.round = t->ctx->round;
  s.key = t->key;
  s.sig = type == LocalSignalType::kWritten || type == LocalSignalType::kCollReady ? t->ctx->sig
                                                                                   : 0;
  for (int r = 0; r < cfg_.local_size; ++r) {
    if (r == cfg_.local_rank || (to >= 0 && r != to)) continue;
    Status st = channel_.Send(r, s);
    if (!st.ok() && !stopping_)
      Fatal(Status::PeerLost("worker process with local rank " + std::to_string(r) + " (rank " +
                             std::to_string(cfg_.worker_id * cfg_.local_size + r) +
                             ") on this machine is gone"));
  }
}

void WorkerCore::ListenLoop() {
  LocalSignal s;
  while (!threads_stop_) {
    if (channel_.Recv(&s, 200)) OnLocalSignal(s);
  }
}

void WorkerCore::WatchdogLoop() {
  int tick = 0;
  while (!threads_stop_) {
    usleep(200000);
    if (++tick % 5 != 0 || failed_) continue;
    stall_->Check(std::chrono::steady_clock::now());
    // Liveness of the other local processes.
    if (cfg_.local_size > 1) {
      LocalSignal ping;
      ping.type = static_cast<uint8_t>(LocalSignalType::kPing);
      ping.from = static_cast<uint16_t>(cfg_.local_rank);
      for (int r = 0; r < cfg_.local_size; ++r) {
        if (r == cfg_.local_rank || local_bye_[r]) continue;
        if (!channel_.Send(r, ping).ok() && !local_bye_[r] && !stopping_)
          Fatal(Status::PeerLost("worker process with local rank " + std::to_string(r) +
                                 " (rank " + std::to_string(cfg_.worker_id * cfg_.local_size + r) +
                                 ") on this machine died"));
      }
    }
  }
}

void WorkerCore::OnLocalSignal(const LocalSignal& s) {
  switch (static_cast<LocalSignalType>(s.type)) {
    case LocalSignalType::kWritten: written_gate_->Signal(s.key, s.sig, s.from); break;
    case LocalSignalType::kReduced: reduced_gate_->Signal(s.key, 0, s.from); break;
    case LocalSignalType::kPulled: pulled_gate_->Signal(s.key, 0, s.from); break;
    case LocalSignalType::kCollReady:  // the root: another process is at a sequenced stage
    case LocalSignalType::kCollGo:     // the others: the root says make the call now
      if (s.code < kStageCount && seq_gate_[s.code])
        seq_gate_[s.code]->Signal(s.key, s.sig, s.from);
      break;
    case LocalSignalType::kCollInit: nccl_.OnCollInit(s); break;
    case LocalSignalType::kOpError: {
      Status st(static_cast<StatusCode>(s.code), s.text);
      TensorContext* ctx = nullptr;
      {
        std::lock_guard<std::mutex> lk(ctx_mu_);
        auto it = by_key_.find(static_cast<uint32_t>(s.key));
        if (it != by_key_.end()) ctx = it->second;
        else early_errors_[static_cast<uint32_t>(s.key)] = st;
      }
      if (ctx) FinishOp(ctx, st, true);
      break;
    }
    case LocalSignalType::kFatal: Fatal(Status(static_cast<StatusCode>(s.code), s.text)); break;
    case LocalSignalType::kBye:
      if (s.from < cfg_.local_size) local_bye_[s.from] = true;
      break;
    default: break;
  }
}

}  // namespace byteps
