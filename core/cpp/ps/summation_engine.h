// The summation service's round logic (BytePS, OSDI'20 §3.2; docs/architecture.md §7), free of
// any transport: per key, the sums of the pushes of every worker machine, round by round, and
// who gets which sum when. SummationServer (ps/server.h) feeds it the frames of its connections
// and sends what it asks for; tests drive it in process (byteps._core_testing.SummationRounds).
//
// Rounds are versioned: key state is double-buffered by round parity, so a fast worker's push of
// round r+1 never touches the sum of round r that a slow worker has not pulled. A worker can only
// push round r+2 after every worker has received round r (it needs the r+1 sum, which needs
// everyone's r+1 push, which each sends only after receiving r), which is why two buffers
// suffice. The first push of a round costs no copy: its staging buffer becomes the round's sum
// buffer and the old sum buffer becomes that worker's staging buffer (pointer rotation). A key
// with fixed slots (set_fixed_staging: a server whose workers write their pushes one-way into
// the slot, docs/rdma.md) keeps each worker's staging buffer where it is instead: the round's
// second push sums the first two slots into the sum buffer (one pass, as the rotation's first
// addition), a lone pusher's slot is copied. A worker's slot is free again once it has the
// round's sum, which is before it pushes the key again. Nothing is allocated per push: buffers
// are made once per key, events travel through ring queues.
//
// An asynchronous key (BYTEPS_ENABLE_ASYNC, docs/async.md; ps/async_rounds.cc) has no rounds
// across workers: it holds the parameters, each worker's push is added to them at once and
// answered with their value, bounded only by BYTEPS_ASYNC_MAX_STALENESS.
//
// Each key is bound, when it is made, to the least-loaded engine (by bytes) for good, so its
// rounds are serialised without locks. Engines either run their own threads or, for tests, handle
// every event on the calling thread at once (deterministic; the caller serialises its calls).
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "compress/compressor.h"
#include "ps/control_msgs.h"
#include "common/ring_queue.h"
#include "common/status.h"
#include "reduce/sum.h"

namespace byteps {

// What a sink keeps per key (e.g. the server's reusable reply frames); made with the key.
class KeyAttachment {
 public:
  virtual ~KeyAttachment() = default;
};

// A key's place in the summation (docs/schemes.md): the plain service (every worker machine
// pushes), or HiPS, where a first-level server sums its group's pushes and forwards the sum to
// the key's top-level server (`upper`), whose pushers are the first-level servers (by group).
enum class KeyLevel : uint8_t { kPlain = 0, kHipsFirst = 1, kHipsTop = 2 };
struct KeyRole {
  KeyLevel level = KeyLevel::kPlain;
  std::vector<int> senders;  // who pushes every round (empty: every worker machine)
  int upper = -1;            // kHipsFirst: the top-level server the sum goes to
};

// One key's rounds. Written only by the engine bound to it (and the staging pointers by the
// receiver that fills them, see SummationEngine::PushBuffer); a sink reads it while answering.
struct RoundKey {
  uint64_t key = 0;
  DType dtype = DType::kFloat32;
  size_t len = 0;  // bytes of one push and of the sum
  // How the pushes combine (kPushOpMask of the push that made the key): sum, min, max, product.
  reduce::ReduceOp op = reduce::ReduceOp::kSum;
  int engine = 0;
  char* sum[2] = {nullptr, nullptr};        // [parity]
  std::vector<std::atomic<char*>> staging;  // [worker]: where its next push is received
  bool fixed_staging = false;  // staging never rotates (SummationEngine::set_fixed_staging)
  int first[2] = {-1, -1};     // fixed_staging: [parity] the open round's first pusher
  uint32_t round[2] = {0, 0};               // [parity]: the round that buffer holds
  bool opened[2] = {false, false};          // [parity]: a round of that parity has begun
  int count[2] = {0, 0};                    // pushes so far in the open round
  bool complete[2] = {false, false};
  std::vector<int> waiting[2];     // workers whose pull arrived before the round completed
  std::vector<uint8_t> pushed[2];  // [worker]: pushed in the open round (duplicates, stalls)
  std::vector<char*> owned;
  std::vector<size_t> owned_len;  // [i]: the bytes owned[i] holds (a compressed key's differ)
  std::vector<char*> sink_slots;  // staging slots from ReplySink::AllocateSlot (not in owned)
  std::unique_ptr<KeyAttachment> attachment;  // the sink's, from ReplySink::Attach
  // Its level and pushers (KeyRole; `expected` = the pushers' count), and for a first-level
  // HiPS key whether round [parity]'s sum is up at the top level (ReplySink::Forward), the
  // total coming back into sum[parity] (SummationEngine::Forwarded).
  KeyLevel level = KeyLevel::kPlain;
  std::vector<int> senders;
  int expected = 0;
  int upper = -1;
  bool forwarded[2] = {false, false};

  // A compressed key (KEY_CONFIG; docs/compression.md): every push is an encoding of at most
  // `len` bytes (the compressor's MaxEncodedBytes), decoded into the round's sum of `raw_len`
  // bytes; the complete sum is encoded once into encoded[parity], which is what pulls get.
  std::string compression;                       // canonical kwargs; empty: a plain key
  std::unique_ptr<compress::Compressor> codec;   // the server's side of the two levels
  size_t raw_len = 0;
  std::vector<uint8_t> configured;               // [worker]: its KEY_CONFIG arrived
  char* encoded[2] = {nullptr, nullptr};         // [parity]
  size_t encoded_len[2] = {0, 0};
  double lr = 0;  // the learning rate of the round's pushes (the server's error feedback)
  // An asynchronous key (kPushFlagAsync; async_rounds.cc): sum[0] holds the parameters (the
  // store), made from the initialiser's push of round 1 (the lowest live worker: rank 0's
  // machine unless it left before); every later push (round >= 2) is a delta added to it. A
  // worker's round is its own count of push_pulls of the key; its reply (a copy of the store
  // into snapshot[worker], so later deltas never tear a reply on the wire) waits while its round
  // is more than max_staleness ahead of the slowest live worker's.
  bool async = false;
  bool initialized = false;
  uint64_t version = 0;                 // deltas added since the initial value
  std::vector<uint32_t> worker_round;   // [worker]: its latest push (0: none yet)
  std::vector<uint8_t> init_ready;      // [worker]: its round-1 push waits for the initial value
  std::vector<uint32_t> held;           // [worker]: the round whose reply waits (0: none)
  std::vector<uint32_t> reply_round;    // [worker]: the round of its reply in snapshot[worker]
  std::vector<char*> snapshot;          // [worker]
  // Round timing, only with SummationEngine::set_timing (BYTEPS_TRACE_ON; docs/timeline.md):
  // steady-clock ns of the round's first push, ns spent summing (decoding, encoding) it, and
  // what its pull responses carry in aux (PackServerTimes: first to last push, summing).
  int64_t first_push_ns[2] = {0, 0};
  int64_t sum_ns[2] = {0, 0};
  uint64_t reply_aux[2] = {0, 0};
  bool compressed() const { return codec != nullptr; }
  // What a pull of the round in buffer `parity` gets.
  const char* reply(int parity) const { return codec ? encoded[parity] : sum[parity]; }
  size_t reply_len(int parity) const { return codec ? encoded_len[parity] : len; }
};

// Where the engine's answers go. Called on engine threads (SendSum, SendStallReport of a known
// key) or on the caller's thread (the rest, and everything in inline mode).
class ReplySink {
 public:
  virtual ~ReplySink() = default;
  // Per-key state for the sink, made once with the key (under the key table's lock).
  virtual std::unique_ptr<KeyAttachment> Attach(const RoundKey&) { return nullptr; }
  // The fixed staging slots (SummationEngine::set_fixed_staging) of `len` bytes, page-aligned:
  // the server's van allocates them where it can (memory colocated workers write into
  // one-way); null: the engine allocates them itself. Freed with FreeSlot.
  virtual char* AllocateSlot(size_t len) {
    (void)len;
    return nullptr;
  }
  virtual void FreeSlot(char* p) { (void)p; }
  // An asynchronous key's value for worker `worker`: k.snapshot[worker], k.len bytes of k.dtype,
  // as the answer to its round k.reply_round[worker]. The buffer is left untouched until the
  // worker's next push of the key (which it sends only after receiving this).
  virtual void SendValue(int worker, RoundKey& k) = 0;
  // Send worker `worker` the sum of round k.round[parity]: k.reply(parity), k.reply_len(parity)
  // bytes (the sum itself, k.len bytes of k.dtype; for a compressed key its encoding). The buffer is left untouched until every worker has received that round.
  virtual void SendSum(int worker, RoundKey& k, int parity) = 0;
  // The workers whose push of (key, round) has not arrived, for worker `worker`.
  virtual void SendStallReport(int worker, uint64_t key, uint32_t round,
                               const std::vector<int>& missing) = 0;
  // A refused request of worker `worker` (the worker turns it into an error).
  virtual void SendError(int worker, const std::string& message) = 0;
  // HiPS, a first-level key: round k.round[parity] of the group is summed in k.sum[parity];
  // send it to top-level server k.upper, whose total is received back into k.sum[parity]
  // (SummationEngine::ForwardBuffer, then Forwarded).
  virtual void Forward(RoundKey& k, int parity) {
    (void)k;
    (void)parity;
  }
};

class SummationEngine {
 public:
  // num_worker: worker machines that push every round (>= 1). engines: key-serialising engines
  // (>= 1). threaded: each engine runs a thread (Start/Stop); otherwise every event is handled
  // at once on the calling thread. The sink must outlive the engine.
  SummationEngine(int num_worker, int engines, bool threaded, ReplySink* sink);
  ~SummationEngine();  // stops the threads and frees every key's buffers
  void Start();
  void Stop();  // closes the queues and joins the threads (idempotent)

  // Asynchronous mode (BYTEPS_ENABLE_ASYNC): pushes flagged kPushFlagAsync make asynchronous
  // keys; max_staleness < 0: unbounded. Set before the first push.
  void SetAsync(bool on, int64_t max_staleness);
  bool async_mode() const { return async_; }
  // Worker machine `worker` left the job (died, or shut down) in asynchronous mode: no
  // asynchronous key waits for it any more (staleness, the initial value). Idempotent.
  void WorkerLeft(int worker);
  bool worker_left(int worker) const { return left_[worker].load(); }
  // The job's partition bound (from the address book) and this server's rank (for messages);
  // set once before the first push. partition_bound() is 0 until then.
  void Configure(int rank, uint64_t partition_bound);
  uint64_t partition_bound() const { return partition_bound_.load(); }

  // Where worker `worker`'s push of `len` bytes of `dtype` for `key` is to be received, making
  // the key (its buffers and its engine) at its first push. An error status for a push larger
  // than the partition bound (checked before anything is allocated): the caller drops the
  // sender. OK with *dest = nullptr when the push is refused (length not a multiple of the
  // element size, no memory for the key, a size or dtype other than the key's): the worker got
  // an error through the sink and the payload must be read past. Never aborts.
  // `role`: the key's level and pushers, used when the push makes the key (null: plain); a
  // key made with another level refuses the push. async_key: the push carries kPushFlagAsync
  // (refused unless SetAsync(true), and on a key made otherwise). op: how the key's pushes
  // combine, fixed by the push that makes the key (another op is refused; a compressed or
  // asynchronous key sums).
  Status PushBuffer(uint64_t key, DType dtype, uint64_t len, int worker, char** dest,
                    const KeyRole* role = nullptr, bool async_key = false,
                    reduce::ReduceOp op = reduce::ReduceOp::kSum);
  // The push whose payload has been received at PushBuffer's destination; pull_too also asks
  // for the round's sum; lr: the pushing worker's learning rate (compressed keys). Ignored when
  // PushBuffer refused it (unknown key, other size or dtype).
  void Push(uint64_t key, DType dtype, uint64_t len, int worker, uint32_t round, bool pull_too,
            double lr = 0, bool async_key = false);
  // Worker `worker`'s KEY_CONFIG: `key` is compressed with m.compression, m.count elements of
  // m.dtype (compressed_rounds.cc). The first config makes the key (before any push of it);
  // every other worker's must be the same. A refused config (bad kwargs, a size above the
  // partition bound, a mismatch, a key already pushed uncompressed) is an error to the worker.
  void ConfigureKey(uint64_t key, const KeyConfigMsg& m, int worker);
  // Worker `worker` wants the sum of `round`: answered now if that round is complete, else when
  // it completes. A pull of an unknown key is an error to the worker.
  void Pull(uint64_t key, int worker, uint32_t round);
  // HiPS, a first-level key: where the top level's total of `round` is received (its sum
  // buffer; null if the key is not waiting for that round's total or len is not its size),
  // and the total arrived: the round is complete and its pulls are answered.
  char* ForwardBuffer(uint64_t key, uint32_t round, uint64_t len);
  void Forwarded(uint64_t key, uint32_t round);
  // Worker `worker` asks who has not pushed `round` of `key`: answered with a stall report
  // (everyone for a key nobody pushed yet; no one for a complete round).
  void StallQuery(uint64_t key, int worker, uint32_t round);

  int num_worker() const { return num_worker_; }
  // Time every round (RoundKey::reply_aux) for traced workers; set before the first push.
  void set_timing(bool on) { timing_ = on; }
  // Plain synchronous keys made from now on keep every worker's staging buffer at a fixed
  // address (no rotation; see above): what a server exporting windows needs. Set before the
  // first push.
  void set_fixed_staging(bool on) { fixed_staging_ = on; }
  // Worker `worker`'s fixed slot of a plain synchronous key of `len` bytes: where its pushes are
  // received, at the same address every round (a window's memory); null for a key without
  // fixed slots, another size, or no such key. Any thread.
  char* WindowSlot(uint64_t key, int worker, uint64_t len);
  // Frees the keys of tensor `declared_key` (key bits 16-31) of every generation (bits 32-47)
  // below `generation`: BYTEPS_AUTOTUNE cut the tensor anew and every worker machine declared
  // the new cut, which each does only once its operations of the old cut completed, so nothing
  // of the old keys is in flight (docs/autotune.md). Each key is freed on its engine thread,
  // after the events queued for it. Returns how many keys are being retired.
  size_t Retire(uint32_t declared_key, uint32_t generation);
  // Horovod's join (docs/collectives.md, "Join"): the worker machines that have joined (none:
  // empty). A synchronous key's round completes without a joined machine's push (it contributes
  // nothing, as Horovod's zeros to a sum); open rounds that now have every other push complete
  // on their engine threads, after the events queued for them (joined_rounds.cc). Any thread.
  void SetJoined(const std::vector<int>& workers);
  // The keys held, and how many of them belong to a generation below the newest held of their
  // tensor (what Retire frees; tests and the server's shutdown line).
  std::pair<size_t, size_t> KeyCensus();
  int num_engines() const { return static_cast<int>(engines_.size()); }
  uint64_t engine_load(int engine) const { return engines_[engine]->load_bytes; }
  // The key's state, or nullptr before its first push. Only for a quiescent engine (tests).
  const RoundKey* Find(uint64_t key);
  size_t num_keys();

 private:
  enum class EventType : uint8_t {
    kPush, kPull, kStallQuery, kForwarded, kWorkerLeft, kRetire, kJoinChanged
  };
  struct Event {
    EventType type = EventType::kPush;
    bool pull_too = false;  // a push that is also a pull (kPushFlagPull)
    RoundKey* ks = nullptr;
    int worker = 0;
    uint32_t round = 0;
    uint64_t len = 0;  // a compressed push: its encoding's bytes; kRetire: the key
    double lr = 0;     // a compressed push: the worker's learning rate
  };
  struct Engine {
    RingQueue<Event> queue;
    std::thread thread;
    uint64_t load_bytes = 0;
  };

  RoundKey* FindKey(uint64_t key);
  void FreeBuffers(RoundKey* ks);  // the attachment (it may refer to them), owned, sink_slots
  // Out of the table, then freed (its engine's thread), if `ks` is still the table's `key`
  // (a second RETIRE may have queued it again: `ks` is compared, not read, until found).
  void RetireKey(uint64_t key, RoundKey* ks);
  // Makes a key: plain (config null; `len` bytes per push) or compressed (the codec made from
  // config, `len` its largest encoding). *out = the existing key when another thread made it.
  Status CreateKey(uint64_t key, DType dtype, size_t len, RoundKey** out,
                   std::unique_ptr<compress::Compressor> codec = nullptr,
                   const std::string& compression = std::string(),
                   const KeyRole* role = nullptr, bool async_key = false,
                   reduce::ReduceOp op = reduce::ReduceOp::kSum);
  // Compressed keys (compressed_rounds.cc): decode worker ev.worker's push into the round's
  // sum (overwrite when `first`, else add); false (and an error to the worker) on a malformed
  // encoding. EncodeSum: the complete sum's encoding for the pulls.
  bool DecodePush(RoundKey* ks, const Event& ev, int parity, bool first);
  void EncodeSum(RoundKey* ks, int parity);
  void Dispatch(const Event& ev);                // to the engine of ev.ks
  void DispatchTo(int engine, const Event& ev);  // to that engine's thread (inline: handled now)
  void Handle(const Event& ev);
  void EngineLoop(Engine* e);
  void HandlePush(const Event& ev);
  void HandlePull(const Event& ev);
  void HandleStallQuery(const Event& ev);
  void HandleForwarded(const Event& ev);
  // The round in buffer p has all its pushes (`pushes` of them, the first at t0): the sum is
  // final (HiPS: goes up; compressed: encoded) and the round completes.
  void SumComplete(RoundKey* ks, int p, int pushes, int64_t t0);
  // The round in buffer p is complete: its pulls are answered.
  void Complete(RoundKey* ks, int p);
  // Join (joined_rounds.cc): the pushes a round of `ks` needs now (its pushers that have not
  // joined), and an open round completed once SetJoined dropped the pushes it waited for.
  int ExpectedNow(const RoundKey* ks) const;
  void HandleJoinChanged(const Event& ev);
  // Asynchronous keys (async_rounds.cc), on the key's engine thread.
  void HandleAsyncPush(const Event& ev);
  void HandleAsyncPull(const Event& ev);
  void HandleAsyncStallQuery(const Event& ev);
  void TryInitialize(RoundKey* ks);  // from the initialiser's round-1 push, once it is there
  void ReplyValue(RoundKey* ks, int worker, uint32_t round);  // now, or held for staleness
  void ReleaseHeld(RoundKey* ks);   // replies the slowest worker's progress now allows
  uint32_t SlowestLiveRound(const RoundKey* ks) const;  // UINT32_MAX when no worker is live
  bool Stale(const RoundKey* ks, uint32_t round) const;
  int Initializer() const;  // the lowest live worker, -1 when none
  std::string Name() const;

  const int num_worker_;
  const bool threaded_;
  bool async_ = false;
  int64_t max_staleness_ = -1;
  std::unique_ptr<std::atomic<bool>[]> left_;  // [worker]: left the job (asynchronous mode)
  std::unique_ptr<std::atomic<bool>[]> joined_;  // [worker]: has joined (SetJoined)
  std::atomic<bool> any_joined_{false};
  bool timing_ = false;
  bool fixed_staging_ = false;
  ReplySink* const sink_;
  std::atomic<int> rank_{-1};
  std::atomic<uint64_t> partition_bound_{0};
  bool started_ = false;
  std::shared_mutex keys_mu_;
  std::unordered_map<uint64_t, std::unique_ptr<RoundKey>> keys_;
  std::vector<std::unique_ptr<Engine>> engines_;
};

}  // namespace byteps
