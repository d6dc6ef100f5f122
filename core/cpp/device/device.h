// The device seam (docs/gpu.md): what the worker pipeline needs from an accelerator to move a
// device tensor through the summation service: asynchronous copies device -> host and host ->
// device on a stream, events (recorded on a stream, waited for by another stream or by a host
// thread) and pinned host memory. Two backends: CUDA (cuda_device.cc, through the runtime
// loaded at run time, cuda_api.h) and the fake device (fake_device.cc: "device memory" is host
// memory and every stream is a thread of its own, so copies really are asynchronous and a
// missing wait shows as a wrong sum in tests).
#pragma once
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "common/status.h"

namespace byteps {
namespace device {

// Where a tensor's memory is: host memory, a CUDA device, or the fake device of the tests.
enum class Kind : uint8_t { kHost, kCuda, kFake };
const char* KindName(Kind k);                     // "cpu", "cuda", "fake"
bool ParseKind(const std::string& s, Kind* out);  // the same names

using Stream = void*;  // cudaStream_t, or the fake device's stream
using Event = void*;   // cudaEvent_t, or the fake device's event
// kDeviceToDevice: within one device (a one-process job's device tensor, whose sum is itself).
enum class CopyDir : uint8_t { kDeviceToHost, kHostToDevice, kDeviceToDevice };

// Counters of one backend since the process started (read by tests and benchmarks: no
// allocation per push_pull in steady state).
struct Stats {
  std::atomic<uint64_t> host_allocs{0}, host_frees{0}, host_bytes{0};
  std::atomic<uint64_t> streams{0}, events{0}, copies{0}, copy_bytes{0}, stream_waits{0};
  // Host memory page-locked in place (RegisterHost), and the collective calls queued.
  std::atomic<uint64_t> host_registers{0}, collectives{0};
  // Copy timing (Device::set_copy_timing): the copy stages' copies timed on the device, their
  // bytes and the device time between the events around each (nanoseconds), per direction
  // (indexed by CopyDir).
  struct Timed {
    std::atomic<uint64_t> copies{0}, bytes{0}, busy_ns{0};
  };
  Timed timed[3];
};

class Device {
 public:
  virtual ~Device() = default;
  virtual Kind kind() const = 0;
  // How many devices this backend has.
  virtual int count() const = 0;

  // Makes `device` the calling thread's current device (CUDA: cudaSetDevice).
  virtual Status Use(int device) = 0;
  // The copy stream of `device` for one direction: created at its first use, kept for the
  // process (the D2H, H2D and D2D copies of every tensor run on these three streams).
  Status CopyStream(int device, CopyDir dir, Stream* out);

  // Counted wrappers of the backend's operations (Stats). CreateStream makes a stream of
  // `device` and leaves the calling thread's current device as it was.
  Status CreateStream(int device, Stream* out);
  // `timing`: the event can be an end of ElapsedNs (CUDA creates events without timing
  // otherwise, which waits and records cost less).
  Status CreateEvent(Event* out, bool timing = false);
  void DestroyEvent(Event e) { DoDestroyEvent(e); }
  // Copies n bytes on stream s, after everything queued there before.
  Status CopyAsync(void* dst, const void* src, size_t n, CopyDir dir, Stream s);
  // Marks the point of stream s reached so far.
  Status Record(Event e, Stream s) { return DoRecord(e, s); }
  // Stream s waits for the work recorded in e (at the time of this call) before its next work.
  Status StreamWait(Stream s, Event e);
  // The calling thread waits until the work recorded in e is complete.
  Status Synchronize(Event e) { return DoSynchronize(e); }
  // Copy timing, off by default (benchmarks turn it on before the first device tensor): the
  // copy stages then record a timing event before each copy as well as after it, and count
  // the device time between the two (AddCopyTime), so a copy stage's bandwidth is its bytes
  // over the time the device spent copying them, apart from queueing and the host's waits.
  void set_copy_timing(bool on) { copy_timing_ = on; }
  bool copy_timing() const { return copy_timing_; }
  // Adds one copy of n bytes in direction `dir`, between `start` and `end` (timing events, both
  // complete), to the counters.
  Status AddCopyTime(CopyDir dir, Event start, Event end, size_t n);
  // Pinned (page-locked) host memory the device copies to and from at full speed.
  Status HostAlloc(size_t n, void** out);
  void HostFree(void* p, size_t n);
  // Page-locks n bytes of host memory the process already has (cudaHostRegister: the
  // shared-memory aggregates the NCCL stages copy shards into), until UnregisterHost.
  Status RegisterHost(void* p, size_t n);
  void UnregisterHost(void* p) { DoUnregisterHost(p); }
  // Counts a collective call queued on this backend's streams (Collective's callers).
  void CountCollective() { stats_.collectives++; }
  const Stats& stats() const { return stats_; }

 protected:
  virtual Status DoCreateStream(int device, Stream* out) = 0;
  virtual Status DoCreateEvent(Event* out, bool timing) = 0;
  // The device time from `start` to `end`, both complete (nanoseconds).
  virtual Status DoElapsedNs(Event start, Event end, uint64_t* ns) = 0;
  virtual void DoDestroyEvent(Event e) = 0;
  virtual Status DoCopyAsync(void* dst, const void* src, size_t n, CopyDir dir, Stream s) = 0;
  virtual Status DoRecord(Event e, Stream s) = 0;
  virtual Status DoStreamWait(Stream s, Event e) = 0;
  virtual Status DoSynchronize(Event e) = 0;
  virtual Status DoHostAlloc(size_t n, void** out) = 0;
  virtual void DoHostFree(void* p) = 0;
  virtual Status DoRegisterHost(void* p, size_t n) = 0;
  virtual void DoUnregisterHost(void* p) = 0;

 private:
  Stats stats_;
  std::atomic<bool> copy_timing_{false};
  std::mutex mu_;
  std::map<std::pair<int, int>, Stream> copy_streams_;  // (device, direction)
};

// The process-wide backend of `kind` (kCuda: only after device::LoadCuda succeeded,
// cuda_api.h; else an InvalidArgument error saying so). kHost has none.
Status GetDevice(Kind kind, Device** out);

// Pinned host memory of one tensor, allocated once and reused every round.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { Release(); }
  Status Allocate(Device* d, size_t n);
  void Release();
  char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  Device* device_ = nullptr;
  char* data_ = nullptr;
  size_t size_ = 0;
};

// The fake device's test hooks (fake_device.cc): a delay before each copy it makes
// (microseconds, default 0), and a producer that writes `src` into `dst` on stream s after
// `delay_us` (what a kernel still running at push_pull time looks like).
void SetFakeCopyDelay(int64_t us);
// The fake collective's test hook (fake_collective.cc): from call number `calls` + 1 on, this
// process's calls stall until its communicator is aborted (0: off).
void SetFakeCollectiveStall(uint64_t calls);
Status FakeWriteAsync(Stream s, void* dst, const void* src, size_t n, int64_t delay_us);

}  // namespace device
}  // namespace byteps
