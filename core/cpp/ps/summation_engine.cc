#include "summation_engine.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common/logging.h"
#include "ps/protocol.h"
#include "reduce/sum.h"
#include "scheduling/partitioner.h"

namespace byteps {

namespace {
int64_t SteadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

SummationEngine::SummationEngine(int num_worker, int engines, bool threaded, ReplySink* sink)
    : num_worker_(std::max(num_worker, 1)), threaded_(threaded), sink_(sink) {
  left_.reset(new std::atomic<bool>[num_worker_]);
  for (int w = 0; w < num_worker_; ++w) left_[w] = false;
  joined_.reset(new std::atomic<bool>[num_worker_]);
  for (int w = 0; w < num_worker_; ++w) joined_[w] = false;
  for (int i = 0; i < std::max(engines, 1); ++i) engines_.push_back(std::make_unique<Engine>());
}

SummationEngine::~SummationEngine() {
  Stop();
  for (auto& [k, ks] : keys_) FreeBuffers(ks.get());
}

void SummationEngine::FreeBuffers(RoundKey* ks) {
  ks->attachment.reset();  // it may refer to the buffers (the server's registrations)
  for (char* p : ks->owned) free(p);
  for (char* p : ks->sink_slots) sink_->FreeSlot(p);
  ks->owned.clear();
  ks->sink_slots.clear();
}

size_t SummationEngine::Retire(uint32_t declared_key, uint32_t generation) {
  // Read under the lock: an earlier RETIRE may be freeing some of them meanwhile.
  std::vector<std::pair<Event, int>> old;  // the event, the key's engine
  {
    std::shared_lock<std::shared_mutex> lk(keys_mu_);
    for (auto& [key, ks] : keys_) {
      if (KeyTensor(key) != declared_key || KeyGeneration(key) >= generation) continue;
      Event ev;
      ev.type = EventType::kRetire;
      ev.ks = ks.get();
      ev.len = key;
      old.emplace_back(ev, ks->engine);
    }
  }
  for (auto& [ev, engine] : old) DispatchTo(engine, ev);
  return old.size();
}

void SummationEngine::RetireKey(uint64_t key, RoundKey* ks) {
  std::unique_ptr<RoundKey> gone;
  {
    std::unique_lock<std::shared_mutex> lk(keys_mu_);
    auto it = keys_.find(key);
    if (it == keys_.end() || it->second.get() != ks) return;
    gone = std::move(it->second);
    keys_.erase(it);
    engines_[gone->engine]->load_bytes -= std::max(gone->len, gone->raw_len);
  }
  FreeBuffers(gone.get());
}

std::pair<size_t, size_t> SummationEngine::KeyCensus() {
  std::shared_lock<std::shared_mutex> lk(keys_mu_);
  std::unordered_map<uint32_t, uint32_t> newest;  // declared key -> its newest generation held
  for (auto& kv : keys_) {
    uint32_t& g = newest[KeyTensor(kv.first)];
    g = std::max(g, KeyGeneration(kv.first));
  }
  size_t stale = 0;
  for (auto& kv : keys_) stale += KeyGeneration(kv.first) < newest[KeyTensor(kv.first)];
  return {keys_.size(), stale};
}

void SummationEngine::Start() {
  if (!threaded_ || started_) return;
  started_ = true;
  for (auto& e : engines_) {
    Engine* raw = e.get();
    e->thread = std::thread([this, raw] { EngineLoop(raw); });
  }
}

void SummationEngine::Stop() {
  for (auto& e : engines_) {
    e->queue.Close();
    if (e->thread.joinable()) e->thread.join();
  }
}

void SummationEngine::Configure(int rank, uint64_t partition_bound) {
  rank_ = rank;
  partition_bound_ = partition_bound;
}

std::string SummationEngine::Name() const { return "server " + std::to_string(rank_.load()); }

RoundKey* SummationEngine::FindKey(uint64_t key) {
  std::shared_lock<std::shared_mutex> lk(keys_mu_);
  auto it = keys_.find(key);
  return it == keys_.end() ? nullptr : it->second.get();
}

const RoundKey* SummationEngine::Find(uint64_t key) { return FindKey(key); }

size_t SummationEngine::num_keys() {
  std::shared_lock<std::shared_mutex> lk(keys_mu_);
  return keys_.size();
}

Status SummationEngine::CreateKey(uint64_t key, DType dtype, size_t len, RoundKey** out,
                                  std::unique_ptr<compress::Compressor> codec,
                                  const std::string& compression, const KeyRole* role,
                                  bool async_key, reduce::ReduceOp op) {
  // Built outside the key table's lock: the sink's Attach may wait for a van's thread (memory
  // registration), which may itself be waiting for the lock in another receiver's PushBuffer.
  auto ks = std::make_unique<RoundKey>();
  ks->key = key;
  ks->dtype = dtype;
  ks->len = len;
  ks->op = op;
  if (role) {
    ks->level = role->level;
    ks->senders = role->senders;
    ks->upper = role->upper;
  }
  if (ks->senders.empty())
    for (int w = 0; w < num_worker_; ++w) ks->senders.push_back(w);
  ks->expected = static_cast<int>(ks->senders.size());
  // A compressed key's sums hold the decoded values; its staging and encoded buffers hold
  // encodings of at most `len` bytes.
  const size_t sum_len = codec ? codec->raw_bytes() : len;
  bool failed = false;
  auto buffer = [&](size_t bytes) {
    size_t alloc = (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096;
    char* p = static_cast<char*>(aligned_alloc(4096, alloc));
    if (p) {
      ks->owned.push_back(p);
      ks->owned_len.push_back(std::max<size_t>(bytes, 1));
    } else {
      failed = true;
    }
    return p;
  };
  ks->sum[0] = buffer(sum_len);
  if (!async_key) ks->sum[1] = buffer(sum_len);  // an asynchronous key has one store, sum[0]
  ks->fixed_staging = fixed_staging_ && !async_key && !codec;
  ks->staging = std::vector<std::atomic<char*>>(num_worker_);
  for (auto& s : ks->staging) {
    char* slot = ks->fixed_staging && sink_ ? sink_->AllocateSlot(std::max<size_t>(len, 1))
                                            : nullptr;
    if (slot) ks->sink_slots.push_back(slot);
    s.store(slot ? slot : buffer(len));
  }
  if (async_key) {
    ks->async = true;
    ks->worker_round.assign(num_worker_, 0);
    ks->init_ready.assign(num_worker_, 0);
    ks->held.assign(num_worker_, 0);
    ks->reply_round.assign(num_worker_, 0);
    for (int w = 0; w < num_worker_; ++w) ks->snapshot.push_back(buffer(len));
  }
  if (codec) {
    ks->encoded[0] = buffer(len);
    ks->encoded[1] = buffer(len);
    ks->raw_len = sum_len;
    ks->compression = compression;
    ks->codec = std::move(codec);
    ks->configured.assign(num_worker_, 0);
  }
  if (failed) {
    FreeBuffers(ks.get());
    return Status::Internal(Name() + ": out of memory for key " + std::to_string(key) + " (" +
                            std::to_string(len) + " bytes)");
  }
  for (auto& w : ks->waiting) w.reserve(num_worker_);
  for (auto& p : ks->pushed) p.assign(num_worker_, 0);
  if (sink_) ks->attachment = sink_->Attach(*ks);
  std::unique_lock<std::shared_mutex> lk(keys_mu_);
  auto it = keys_.find(key);
  if (it != keys_.end()) {  // another receiver made it meanwhile: keep theirs
    lk.unlock();
    FreeBuffers(ks.get());
    *out = it->second.get();
    return Status::OK();
  }
  // Bind the key to the least-loaded engine (by bytes), for good.
  size_t best = 0;
  for (size_t i = 1; i < engines_.size(); ++i)
    if (engines_[i]->load_bytes < engines_[best]->load_bytes) best = i;
  engines_[best]->load_bytes += std::max(len, ks->raw_len);
  ks->engine = static_cast<int>(best);
  *out = ks.get();
  keys_.emplace(key, std::move(ks));
  return Status::OK();
}

Status SummationEngine::PushBuffer(uint64_t key, DType dtype, uint64_t len, int worker,
                                   char** dest, const KeyRole* role, bool async_key,
                                   reduce::ReduceOp op) {
  *dest = nullptr;
  RoundKey* ks = FindKey(key);
  if (op != reduce::ReduceOp::kSum && (async_key || (ks && ks->compressed()))) {
    if (worker >= 0 && worker < num_worker_)
      sink_->SendError(worker, Name() + ": push of key " + std::to_string(key) + " from worker " +
                                   std::to_string(worker) + " with op " + reduce::ReduceOpName(op) +
                                   " to a " + (async_key ? "asynchronous" : "compressed") +
                                   " key, which only sums");
    return Status::OK();
  }
  if (async_key && (!async_ || (ks && !ks->async))) {
    if (worker >= 0 && worker < num_worker_)
      sink_->SendError(worker, Name() + ": asynchronous push of key " + std::to_string(key) +
                                   " from worker " + std::to_string(worker) +
                                   (async_ ? ", a key other workers push synchronously"
                                           : ", but this server runs with BYTEPS_ENABLE_ASYNC=0"));
    return Status::OK();
  }
  if (ks && ks->compressed()) {  // made by KEY_CONFIG: bounded by its largest encoding
    if (worker < 0 || worker >= num_worker_)
      return Status::InvalidArgument("push of key " + std::to_string(key) + " from worker " +
                                     std::to_string(worker) + " of " +
                                     std::to_string(num_worker_));
    if (len > ks->len)
      return Status::InvalidArgument("push of compressed key " + std::to_string(key) + " with " +
                                     std::to_string(len) + " bytes, larger than its largest "
                                     "encoding (" + std::to_string(ks->len) + " bytes)");
    if (dtype != ks->dtype || !ks->configured[worker]) {
      sink_->SendError(worker, Name() + ": push of compressed key " + std::to_string(key) +
                                   " from worker " + std::to_string(worker) +
                                   (dtype != ks->dtype ? std::string(" has dtype ") +
                                                             DTypeName(dtype) + ", the key " +
                                                             DTypeName(ks->dtype)
                                                       : " before its KEY_CONFIG"));
      return Status::OK();
    }
    *dest = ks->staging[worker].load(std::memory_order_acquire);
    return Status::OK();
  }
  // Every size a peer sends is bounded before anything is allocated for it: a push is one
  // partition, so it is never larger than the job's partition bound.
  const uint64_t bound = partition_bound_.load();
  if (len > bound)
    return Status::InvalidArgument("push of key " + std::to_string(key) + " with " +
                                   std::to_string(len) +
                                   " bytes, larger than the job's partitions (" +
                                   std::to_string(bound) + " bytes)");
  if (worker < 0 || worker >= num_worker_ || DTypeSize(dtype) == 0)
    return Status::InvalidArgument("push of key " + std::to_string(key) + " from worker " +
                                   std::to_string(worker) + " of " + std::to_string(num_worker_) +
                                   " with dtype " + std::to_string(static_cast<int>(dtype)));
  if (!ks) {
    if (len % DTypeSize(dtype) != 0) {
      sink_->SendError(worker, "push of key " + std::to_string(key) + " has " +
                                   std::to_string(len) + " bytes, not a multiple of " +
                                   DTypeName(dtype));
      return Status::OK();
    }
    Status st = CreateKey(key, dtype, len, &ks, nullptr, std::string(), role, async_key, op);
    if (!st.ok()) {
      sink_->SendError(worker, st.message());
      return Status::OK();
    }
  }
  if (ks->op != op) {
    sink_->SendError(worker, Name() + ": push of key " + std::to_string(key) + " from worker " +
                                 std::to_string(worker) + " with op " + reduce::ReduceOpName(op) +
                                 ", but the key combines with op " + reduce::ReduceOpName(ks->op) +
                                 " (every worker must use the same op for a tensor)");
    return Status::OK();
  }
  const KeyLevel level = role ? role->level : KeyLevel::kPlain;
  if (ks->level != level ||
      std::find(ks->senders.begin(), ks->senders.end(), worker) == ks->senders.end()) {
    sink_->SendError(worker, Name() + ": push of key " + std::to_string(key) + " from worker " +
                                 std::to_string(worker) + " does not fit the key's scheme (a "
                                 "HiPS key takes its group's pushes; every worker must use the "
                                 "same scheme)");
    return Status::OK();
  }
  if (ks->async != async_key) {
    sink_->SendError(worker, Name() + ": synchronous push of key " + std::to_string(key) +
                                 " from worker " + std::to_string(worker) +
                                 ", an asynchronous parameter of the other workers");
    return Status::OK();
  }
  if (ks->len != len || ks->dtype != dtype) {
    sink_->SendError(worker, Name() + ": push of key " + std::to_string(key) + " from worker " +
                                 std::to_string(worker) + " has " + std::to_string(len) +
                                 " bytes of " + DTypeName(dtype) + ", but the key holds " +
                                 std::to_string(ks->len) + " bytes of " + DTypeName(ks->dtype));
    return Status::OK();
  }
  *dest = ks->staging[worker].load(std::memory_order_acquire);
  return Status::OK();
}

void SummationEngine::Push(uint64_t key, DType dtype, uint64_t len, int worker, uint32_t round,
                           bool pull_too, double lr, bool async_key) {
  RoundKey* ks = FindKey(key);
  if (!ks || ks->dtype != dtype || worker < 0 || worker >= num_worker_) return;
  if (ks->async != async_key) return;  // refused in PushBuffer
  if (ks->compressed() ? (len > ks->len || !ks->configured[worker]) : ks->len != len)
    return;  // refused in PushBuffer
  Dispatch(Event{EventType::kPush, pull_too, ks, worker, round, len, lr});
}

char* SummationEngine::WindowSlot(uint64_t key, int worker, uint64_t len) {
  RoundKey* ks = FindKey(key);
  if (!ks || !ks->fixed_staging || ks->level != KeyLevel::kPlain || ks->len != len ||
      worker < 0 || worker >= num_worker_)
    return nullptr;
  return ks->staging[worker].load(std::memory_order_acquire);
}

void SummationEngine::Pull(uint64_t key, int worker, uint32_t round) {
  if (worker < 0 || worker >= num_worker_) return;
  RoundKey* ks = FindKey(key);
  if (!ks) {
    sink_->SendError(worker, "pull of unknown key " + std::to_string(key));
    return;
  }
  Dispatch(Event{EventType::kPull, false, ks, worker, round});
}

void SummationEngine::StallQuery(uint64_t key, int worker, uint32_t round) {
  if (worker < 0 || worker >= num_worker_) return;
  RoundKey* ks = FindKey(key);
  if (!ks) {  // nobody has pushed this key yet
    std::vector<int> all(num_worker_);
    for (int w = 0; w < num_worker_; ++w) all[w] = w;
    sink_->SendStallReport(worker, key, round, all);
    return;
  }
  Dispatch(Event{EventType::kStallQuery, false, ks, worker, round});
}

void SummationEngine::Dispatch(const Event& ev) { DispatchTo(ev.ks->engine, ev); }

void SummationEngine::DispatchTo(int engine, const Event& ev) {
  if (threaded_) engines_[engine]->queue.Push(ev);
  else Handle(ev);
}

void SummationEngine::Handle(const Event& ev) {
  if (ev.type == EventType::kRetire) return RetireKey(ev.len, ev.ks);
  if (ev.ks->async) {
    switch (ev.type) {
      case EventType::kPush: HandleAsyncPush(ev); break;
      case EventType::kPull: HandleAsyncPull(ev); break;
      case EventType::kStallQuery: HandleAsyncStallQuery(ev); break;
      case EventType::kWorkerLeft:
        TryInitialize(ev.ks);
        ReleaseHeld(ev.ks);
        break;
      case EventType::kForwarded: break;    // HiPS keys are never asynchronous
      case EventType::kRetire: break;       // above
      case EventType::kJoinChanged: break;  // join is synchronous training's
    }
    return;
  }
  switch (ev.type) {
    case EventType::kWorkerLeft: break;
    case EventType::kJoinChanged: HandleJoinChanged(ev); break;
    case EventType::kPush: HandlePush(ev); break;
    case EventType::kPull: HandlePull(ev); break;
    case EventType::kStallQuery: HandleStallQuery(ev); break;
    case EventType::kForwarded: HandleForwarded(ev); break;
    case EventType::kRetire: break;  // above
  }
}

void SummationEngine::EngineLoop(Engine* e) {
  Event ev;
  while (true) {
    if (!e->queue.Pop(&ev, std::chrono::milliseconds(500))) {
      if (e->queue.closed()) return;
      continue;
    }
    Handle(ev);
  }
}

void SummationEngine::HandlePush(const Event& ev) {
  RoundKey* ks = ev.ks;
  int p = ev.round & 1;
  size_t count = ks->len / DTypeSize(ks->dtype);
  const int64_t t0 = timing_ ? SteadyNs() : 0;
  if (ks->count[p] == 0) {
    // No round of this parity is open: this push opens round ev.round, unless that round or a
    // later one has already completed (a duplicate or a late push, which would reopen a round
    // whose sum slow workers may still be pulling).
    if (ks->opened[p] && static_cast<int32_t>(ev.round - ks->round[p]) <= 0) {
      BPS_LOG(ERROR) << "key " << ks->key << ": push of round " << ev.round << " from worker "
                     << ev.worker << " after round " << ks->round[p] << " completed; ignored";
      return;
    }
    if (ks->compressed()) {
      if (!DecodePush(ks, ev, p, /*first=*/true)) return;
    } else if (ks->fixed_staging) {
      ks->first[p] = ev.worker;  // summed with the second push (or copied: a lone pusher)
    } else {
      // First push of the round: its staging buffer becomes the sum (no copy).
      char* incoming = ks->staging[ev.worker].load(std::memory_order_acquire);
      ks->staging[ev.worker].store(ks->sum[p], std::memory_order_release);
      ks->sum[p] = incoming;
    }
    ks->round[p] = ev.round;
    ks->first_push_ns[p] = t0;
    ks->sum_ns[p] = 0;
    ks->opened[p] = true;
    ks->complete[p] = false;
    std::fill(ks->pushed[p].begin(), ks->pushed[p].end(), 0);
  } else {
    if (ks->round[p] != ev.round) {
      BPS_LOG(ERROR) << "key " << ks->key << ": push of round " << ev.round << " from worker "
                     << ev.worker << " while round " << ks->round[p] << " is open";
      return;
    }
    if (ks->pushed[p][ev.worker]) {  // would count one worker twice and complete the round early
      BPS_LOG(ERROR) << "key " << ks->key << ": second push of round " << ev.round
                     << " from worker " << ev.worker << "; ignored";
      return;
    }
    if (ks->compressed()) {
      if (!DecodePush(ks, ev, p, /*first=*/false)) return;
    } else if (ks->fixed_staging && ks->count[p] == 1) {
      reduce::Reduce3(ks->sum[p], ks->staging[ks->first[p]].load(std::memory_order_acquire),
                      ks->staging[ev.worker].load(std::memory_order_acquire), count, ks->dtype,
                      ks->op);
    } else {
      reduce::ReduceInto(ks->sum[p], ks->staging[ev.worker].load(std::memory_order_acquire),
                         count, ks->dtype, ks->op);
    }
  }
  ks->pushed[p][ev.worker] = 1;
  if (ev.pull_too) ks->waiting[p].push_back(ev.worker);
  if (++ks->count[p] < ExpectedNow(ks)) {
    if (timing_) ks->sum_ns[p] += SteadyNs() - t0;
    return;
  }
  SumComplete(ks, p, ks->count[p], t0);
}

void SummationEngine::SumComplete(RoundKey* ks, int p, int pushes, int64_t t0) {
  ks->count[p] = 0;
  if (ks->fixed_staging && pushes == 1)  // the lone push is the sum
    memcpy(ks->sum[p], ks->staging[ks->first[p]].load(std::memory_order_acquire), ks->len);
  if (ks->level == KeyLevel::kHipsFirst) {
    // The group's sum goes up; the round completes when the total is back (Forwarded).
    ks->forwarded[p] = true;
    if (timing_) ks->sum_ns[p] += SteadyNs() - t0;
    sink_->Forward(*ks, p);
    return;
  }
  if (ks->compressed()) EncodeSum(ks, p);
  if (timing_) {
    const int64_t now = SteadyNs();
    ks->sum_ns[p] += now - t0;
    ks->reply_aux[p] = PackServerTimes(static_cast<uint64_t>(t0 - ks->first_push_ns[p]) / 1000,
                                       static_cast<uint64_t>(ks->sum_ns[p]) / 1000);
  }
  Complete(ks, p);
}

void SummationEngine::Complete(RoundKey* ks, int p) {
  ks->complete[p] = true;
  std::vector<int>& waiting = ks->waiting[p];
  for (int w : waiting) sink_->SendSum(w, *ks, p);
  waiting.clear();
}

char* SummationEngine::ForwardBuffer(uint64_t key, uint32_t round, uint64_t len) {
  RoundKey* ks = FindKey(key);
  const int p = round & 1;
  if (!ks || ks->level != KeyLevel::kHipsFirst || len != ks->len || !ks->forwarded[p] ||
      ks->round[p] != round)
    return nullptr;
  return ks->sum[p];
}

void SummationEngine::Forwarded(uint64_t key, uint32_t round) {
  RoundKey* ks = FindKey(key);
  if (!ks || ks->level != KeyLevel::kHipsFirst) return;
  Dispatch(Event{EventType::kForwarded, false, ks, 0, round});
}

void SummationEngine::HandleForwarded(const Event& ev) {
  RoundKey* ks = ev.ks;
  const int p = ev.round & 1;
  if (!ks->forwarded[p] || ks->round[p] != ev.round) return;
  ks->forwarded[p] = false;
  Complete(ks, p);
}

void SummationEngine::HandlePull(const Event& ev) {
  RoundKey* ks = ev.ks;
  int p = ev.round & 1;
  if (ks->complete[p] && ks->round[p] == ev.round) sink_->SendSum(ev.worker, *ks, p);
  else ks->waiting[p].push_back(ev.worker);
}

void SummationEngine::HandleStallQuery(const Event& ev) {
  RoundKey* ks = ev.ks;
  int p = ev.round & 1;
  std::vector<int> missing;
  bool open = ks->round[p] == ev.round && !ks->complete[p] && ks->count[p] > 0;
  // A first-level HiPS round whose group sum is up at the top level misses no one here.
  bool done = ks->round[p] == ev.round && (ks->complete[p] || ks->forwarded[p]);
  for (int w : ks->senders)  // a joined machine (joined_rounds.cc) is awaited by no round
    if (!done && !(open && ks->pushed[p][w]) && !joined_[w].load()) missing.push_back(w);
  sink_->SendStallReport(ev.worker, ks->key, ev.round, missing);
}

}  // namespace byteps
