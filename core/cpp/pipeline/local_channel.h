// Signalling among the worker processes of one machine, the worker pipeline's own (not a van;
// docs/architecture.md §1, §3): Unix datagram sockets in the Linux abstract namespace (no files
// to clean up), one per process, named byteps_<job>_<worker id>_<local rank>. Plus POSIX
// shared-memory segments for the local reduce buffers, named /byteps_<job>_<worker id>_<key>.
#pragma once
#include <cstdint>
#include <string>

#include "common/status.h"

namespace byteps {

enum class LocalSignalType : uint8_t {
  kHello = 1,       // non-root -> root at init
  kReady = 2,       // root -> non-root: init done
  kInitFailed = 3,  // root -> non-root: init failed (text)
  kWritten = 4,     // my slot of partition `key` holds this round's input
  kReduced = 5,     // my shard of partition `key` is summed into the aggregate buffer
  kPulled = 6,      // root: the aggregate of partition `key` holds the global sum
  kOpError = 7,     // the operation on declared key `key` failed (text)
  kFatal = 8,       // the job failed (text)
  kPing = 9,        // liveness probe
  kBye = 10,        // this process is shutting down
  // NCCL stages (docs/gpu.md): root -> others: the communicator's id (text, `key` bytes; code:
  // a StatusCode, non-zero when the root could not make one: the text says why).
  kCollInit = 11,
  kCollReady = 12,  // -> root: my partition `key` is at the collective stage `code` (a Stage)
  kCollGo = 13,     // root -> others: make stage `code`'s call for partition `key` now
};

struct LocalSignal {
  uint8_t type = 0;
  uint8_t code = 0;  // StatusCode for errors
  uint16_t from = 0;  // local rank of the sender
  uint32_t round = 0;
  uint64_t key = 0;
  uint64_t sig = 0;  // tensor signature (name, dtype, shape) for consistency checks
  char text[448] = {0};
};

class LocalChannel {
 public:
  ~LocalChannel();
  Status Open(const std::string& job, int worker_id, int local_rank);
  // Sends to one local rank. Returns PeerLost if that process has no open channel (it died
  // or shut down).
  Status Send(int local_rank, const LocalSignal& sig);
  // Receives one signal; false on timeout.
  bool Recv(LocalSignal* out, int timeout_ms);
  void Close();

 private:
  std::string Address(int local_rank) const;
  int fd_ = -1;
  std::string job_;
  int worker_id_ = 0;
};

// A shared-memory segment mapped into this process.
class ShmSegment {
 public:
  ~ShmSegment();
  // Creates or opens the segment (never shrinks an existing one) and maps `bytes`.
  Status Open(const std::string& name, size_t bytes);
  void Unlink();
  void Close();
  char* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  char* data_ = nullptr;
  size_t size_ = 0;
  bool unlinked_ = false;
};

// Segment name for a key of a job's worker machine ("/byteps_<job>_<wid>_<key>").
std::string ShmName(const std::string& job, int worker_id, uint32_t declared_key);

}  // namespace byteps
