// The fake device's collective (collective.h): the backend of the NCCL-stage tests on hosts
// without GPUs. The local processes map one shared-memory segment (its name is the id the root
// makes): a header with each rank's call counter and the call it made, then a slot of
// kSlotBytes per rank. Each call is queued on the caller's fake stream, so it runs when that
// stream gets there, as an NCCL kernel would: the rank copies its input into its slot, says it
// arrived, waits for every rank, checks that they all made the same call (kind, count, dtype,
// root: a call made out of order on one rank is an error here, where NCCL would hang or mix
// data), computes its output from the slots in rank order, and waits for every rank to be done
// with the slots before the next call. A rank that does not come within the timeout, or an
// Abort anywhere, fails the call on every rank.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "device/collective.h"
#include "reduce/sum.h"

namespace byteps {
namespace device {

Status FakeEnqueue(Stream s, std::function<void()> op);  // fake_device.cc

namespace {

constexpr int kMaxRanks = 64;
std::atomic<uint64_t> g_stall_after{0};  // SetFakeCollectiveStall
constexpr size_t kSlotBytes = size_t{64} << 20;  // the largest call's input per rank

enum class Call : uint32_t { kReduceScatter = 1, kAllReduce, kAllGather, kBroadcast };
const char* CallName(uint32_t c) {
  switch (static_cast<Call>(c)) {
    case Call::kReduceScatter: return "reduce_scatter";
    case Call::kAllReduce: return "all_reduce";
    case Call::kAllGather: return "all_gather";
    case Call::kBroadcast: return "broadcast";
  }
  return "?";
}

struct RankState {
  std::atomic<uint64_t> arrived;  // calls whose input is in the slot
  std::atomic<uint64_t> left;     // calls done with every slot
  uint32_t call, dtype, op;
  int32_t root;
  uint64_t count;
};

struct Header {
  std::atomic<uint32_t> joined;
  std::atomic<uint32_t> aborted;  // 1: some rank gave up; every wait ends
  char why[448];                  // the first rank's reason
  RankState ranks[kMaxRanks];
};

size_t SegmentBytes(int size) {
  return (sizeof(Header) + 4095) / 4096 * 4096 + static_cast<size_t>(size) * kSlotBytes;
}

Status MapSegment(const std::string& name, bool create, int size, char** out) {
  int fd = shm_open(name.c_str(), (create ? O_CREAT | O_EXCL : 0) | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return Status::Internal("shm_open(" + name + "): " + strerror(errno));
  const size_t bytes = SegmentBytes(size);
  if (create && ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    Status st = Status::Internal("ftruncate(" + name + "): " + strerror(errno));
    close(fd);
    return st;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return Status::Internal("mmap(" + name + "): " + strerror(errno));
  *out = static_cast<char*>(p);
  return Status::OK();
}

// What a communicator's calls share with the stream threads that run them (held by both, so a
// call still queued when the communicator goes finds it).
class Comm {
 public:
  Comm(char* base, int rank, int size, double timeout_s)
      : base_(base), hdr_(reinterpret_cast<Header*>(base)), rank_(rank), size_(size),
        timeout_s_(timeout_s) {}

  Status Join(const std::function<bool()>& give_up) {
    hdr_->joined.fetch_add(1);
    Status st = WaitAll("join", [this](int) { return hdr_->joined.load() >= size_; }, give_up,
                        /*call=*/false);
    if (st.code() == StatusCode::kTimeout)
      st = Status::Timeout("fake collective: " + std::to_string(hdr_->joined.load()) + " of " +
                           std::to_string(size_) + " local ranks joined the communicator within " +
                           Seconds(timeout_s_) + " (local rank " + std::to_string(rank_) +
                           " waited)");
    return st;
  }
  Status error() {
    std::lock_guard<std::mutex> lk(mu_);
    return error_;
  }
  void Fail(const Status& st) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (error_.ok()) error_ = st;
    }
    uint32_t expected = 0;
    if (hdr_->aborted.compare_exchange_strong(expected, 1))
      strncpy(hdr_->why, st.message().c_str(), sizeof(hdr_->why) - 1);
  }
  void Run(Call call, const void* send, size_t send_count, void* recv, size_t count, DType dtype,
           uint32_t op, int root, uint64_t seq);

 private:
  char* slot(int r) const {
    return base_ + (sizeof(Header) + 4095) / 4096 * 4096 + static_cast<size_t>(r) * kSlotBytes;
  }
  static std::string Seconds(double s) {
    char b[32];
    snprintf(b, sizeof(b), "%g s", s);
    return b;
  }
  // Joining waits at most timeout_s; a call, like an NCCL kernel, until every rank came or the
  // communicator was aborted (with a safety net of 10 x timeout_s, at least 60 s, for tests).
  template <typename Ready>
  Status WaitAll(const char* what, Ready ready, const std::function<bool()>& give_up,
                 bool call = true) {
    const double limit = call ? std::max(60.0, 10 * timeout_s_) : timeout_s_;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(limit);
    for (int r = 0; r < size_; ++r) {
      while (!ready(r)) {
        if (hdr_->aborted.load())
          return Status::Internal(std::string("fake collective: ") + what + " given up: " +
                                  hdr_->why);
        if ((give_up && give_up()) || std::chrono::steady_clock::now() > deadline)
          return Status::Timeout(std::string("fake collective: local rank ") +
                                 std::to_string(r) + " did not come to the " + what +
                                 " within " + Seconds(limit));
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
    return Status::OK();
  }

  char* base_;
  Header* hdr_;
  int rank_, size_;
  double timeout_s_;
  std::mutex mu_;
  Status error_;
};

void Comm::Run(Call call, const void* send, size_t send_count, void* recv, size_t count,
               DType dtype, uint32_t op, int root, uint64_t seq) {
  if (!error().ok()) return;  // the communicator failed: no call touches memory
  const uint64_t stall = g_stall_after.load();
  while (stall && seq > stall && error().ok() && !hdr_->aborted.load())  // a GPU stuck
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (!error().ok()) return;
  const size_t es = DTypeSize(dtype);
  RankState& me = hdr_->ranks[rank_];
  memcpy(slot(rank_), send, send_count * es);
  me.call = static_cast<uint32_t>(call);
  me.dtype = static_cast<uint32_t>(dtype);
  me.op = op;
  me.root = root;
  me.count = count;
  me.arrived.store(seq, std::memory_order_release);
  Status st = WaitAll(CallName(me.call), [&](int r) {
    return hdr_->ranks[r].arrived.load(std::memory_order_acquire) >= seq;
  }, nullptr);
  for (int r = 0; st.ok() && r < size_; ++r) {
    const RankState& o = hdr_->ranks[r];
    if (o.call != me.call || o.count != me.count || o.dtype != me.dtype || o.op != me.op ||
        o.root != me.root)
      st = Status::Internal("fake collective: call " + std::to_string(seq) + " differs: local "
                            "rank " + std::to_string(rank_) + " made " + CallName(me.call) +
                            "(" + std::to_string(me.count) + " x " +
                            DTypeName(static_cast<DType>(me.dtype)) + "), local rank " +
                            std::to_string(r) + " " + CallName(o.call) + "(" +
                            std::to_string(o.count) + " x " +
                            DTypeName(static_cast<DType>(o.dtype)) + ")");
  }
  if (!st.ok()) return Fail(st);
  char* out = static_cast<char*>(recv);
  const size_t bytes = count * es;
  switch (call) {
    case Call::kReduceScatter:
    case Call::kAllReduce: {
      const size_t from = call == Call::kReduceScatter ? rank_ * bytes : 0;
      memcpy(out, slot(0) + from, bytes);  // in rank order, the same on every rank
      for (int r = 1; r < size_; ++r) reduce::SumInto(out, slot(r) + from, count, dtype);
      if (static_cast<ReduceOp>(op) == ReduceOp::kAvg)
        reduce::DivideInPlace(out, count, dtype, size_);
      break;
    }
    case Call::kAllGather:
      for (int r = 0; r < size_; ++r) memcpy(out + r * bytes, slot(r), bytes);
      break;
    case Call::kBroadcast:
      memcpy(out, slot(root), bytes);
      break;
  }
  me.left.store(seq, std::memory_order_release);
  st = WaitAll(CallName(me.call), [&](int r) {
    return hdr_->ranks[r].left.load(std::memory_order_acquire) >= seq;
  }, nullptr);
  if (!st.ok()) Fail(st);
}

class FakeCollective : public Collective {
 public:
  FakeCollective(std::shared_ptr<Comm> comm, int rank, int size) : comm_(std::move(comm)) {
    rank_ = rank;
    size_ = size;
  }
  Status GroupStart() override { return Status::OK(); }
  Status GroupEnd() override { return Status::OK(); }
  Status ReduceScatter(const void* send, void* recv, size_t count, DType dtype,
                       Stream s) override {
    return Queue(Call::kReduceScatter, send, count * size_, recv, count, dtype, 0, 0, s);
  }
  Status AllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                   Stream s) override {
    return Queue(Call::kAllReduce, send, count, recv, count, dtype, static_cast<uint32_t>(op), 0,
                 s);
  }
  Status AllGather(const void* send, void* recv, size_t count, DType dtype, Stream s) override {
    return Queue(Call::kAllGather, send, count, recv, count, dtype, 0, 0, s);
  }
  Status Broadcast(const void* send, void* recv, size_t count, DType dtype, int root,
                   Stream s) override {
    return Queue(Call::kBroadcast, send, rank_ == root ? count : 0, recv, count, dtype, 0, root,
                 s);
  }
  Status AsyncError() override { return comm_->error(); }
  void Abort(const std::string& why) override {
    comm_->Fail(Status::Internal("the communicator was aborted on local rank " +
                                 std::to_string(rank_) + ": " + why));
  }

 private:
  Status Queue(Call call, const void* send, size_t send_count, void* recv, size_t count,
               DType dtype, uint32_t op, int root, Stream s) {
    if (send_count * DTypeSize(dtype) > kSlotBytes)
      return Status::InvalidArgument("fake collective: a call carries at most " +
                                     std::to_string(kSlotBytes) + " bytes per rank, not " +
                                     std::to_string(send_count * DTypeSize(dtype)));
    const uint64_t seq = ++queued_;
    std::shared_ptr<Comm> comm = comm_;
    return FakeEnqueue(s, [=] {
      comm->Run(call, send, send_count, recv, count, dtype, op, root, seq);
    });
  }

  std::shared_ptr<Comm> comm_;
  std::atomic<uint64_t> queued_{0};  // calls are made under the worker's ordering mutex
};

}  // namespace

void SetFakeCollectiveStall(uint64_t calls) { g_stall_after = calls; }

Status NewFakeCollectiveId(const std::string& job, int size, std::string* id) {
  if (size > kMaxRanks)
    return Status::InvalidArgument("the fake collective has at most " +
                                   std::to_string(kMaxRanks) + " ranks");
  static std::atomic<int> made{0};
  *id = "/byteps_coll_" + job + "_" + std::to_string(getpid()) + "_" +
        std::to_string(made.fetch_add(1));
  char* base = nullptr;
  BPS_RETURN_IF_ERROR(MapSegment(*id, /*create=*/true, size, &base));
  munmap(base, SegmentBytes(size));  // the segment stays for the ranks to open
  return Status::OK();
}

Status CreateFakeCollective(const std::string& id, int rank, int size, double timeout_s,
                            const std::function<bool()>& give_up,
                            std::unique_ptr<Collective>* out) {
  char* base = nullptr;
  BPS_RETURN_IF_ERROR(MapSegment(id, /*create=*/false, size, &base));
  // The mapping stays for the process: a stream thread may still run a call of it.
  auto comm = std::make_shared<Comm>(base, rank, size, timeout_s);
  Status st = comm->Join(give_up);
  if (rank == 0) shm_unlink(id.c_str());  // every rank has it mapped (or the job failed)
  if (!st.ok()) {
    comm->Fail(st);
    return st;
  }
  *out = std::make_unique<FakeCollective>(std::move(comm), rank, size);
  return Status::OK();
}

}  // namespace device
}  // namespace byteps
