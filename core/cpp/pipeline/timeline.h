// The timeline (BYTEPS_TRACE_*; docs/timeline.md): Chrome-trace events of every push_pull in a
// window of steps, one "X" event per tensor and step (the whole push_pull) and one per stage and
// partition (every stage of the plan the partition passes through, its gate and queue wait in
// args), written as JSON to <BYTEPS_TRACE_DIR>/<local_rank>/comm.json when every traced tensor
// has left the window (or at shutdown, if that never happens).
//
// A tensor's step is the number of its push_pulls completed before this one (upstream's
// step_cnt); steps [start, end) are traced. The worker core stamps times into the partition
// task (TaskTrace) only for an operation in the window (TensorContext::traced, decided once per
// operation at enqueue), so with the timeline off each hook is one predictable branch on that
// flag. A finished partition's stamps are copied here under one lock; formatting the JSON
// happens on a writer thread, off the pipeline's threads.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "pipeline/stage_table.h"

namespace byteps {

struct PartTask;
struct TensorContext;

inline int64_t TraceNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// One partition's times of the operation being traced (steady clock, ns; 0 = not stamped).
struct TaskTrace {
  int64_t enter[kStageCount];  // handed to the stage: to its gate, queue, or run at once
  int64_t ready[kStageCount];  // released by the gate in front of it (0: no gate)
  int64_t start[kStageCount];  // the stage's work began (popped from its queue)
  int64_t end[kStageCount];    // the stage finished
  uint64_t server_aux = 0;     // the pull response's aux (ps/protocol.h PackServerTimes; 0: none)
  void Reset() { *this = TaskTrace(); }
  TaskTrace() : enter{}, ready{}, start{}, end{} {}
};

struct TimelineConfig {
  bool on = false;
  uint32_t start_step = 10, end_step = 20;
  std::string dir = "./trace";  // comm.json goes to <dir>/<local_rank>/
  std::string file;              // set by Start (Horovod's start_timeline): the file written
  int rank = 0, local_rank = 0, worker_id = 0, local_size = 1;
};

class Timeline {
 public:
  Timeline() = default;
  ~Timeline();
  void Configure(const TimelineConfig& cfg);
  bool on() const { return cfg_.on; }
  bool InWindow(uint32_t step) const {
    const int manual = manual_.load(std::memory_order_acquire);
    if (manual != kManualNone) return manual == kManualRecording;
    return cfg_.on && step >= cfg_.start_step && step < cfg_.end_step;
  }
  // Horovod's start_timeline / stop_timeline: record every operation started from now on
  // (instead of BYTEPS_TRACE_*'s step window) until Stop, which writes them to `file` and
  // returns once it is written. kInvalidArgument: Start while recording, Stop while not.
  Status Start(const std::string& file);
  Status Stop();
  // <dir>/<local_rank>/comm.json
  std::string Path() const;

  // A partition of a traced operation finished its last stage (the caller's thread; the task's
  // stamps are complete and stay put until the next operation of the tensor).
  void RecordPartition(const PartTask& t);
  // A traced operation completed (ns, steady clock). When every tensor traced so far has
  // completed its last step of the window, the file is written (writer thread).
  void RecordTensor(const TensorContext& ctx, int64_t start_ns, int64_t end_ns);
  // Shutdown: writes what was recorded if the window never closed, and joins the writer.
  void Finish();
  // True once the file has been written (or its writing has started).
  bool written();

  struct StageEvent {
    uint32_t declared_key;
    uint32_t step;
    uint16_t part;
    uint8_t stage;
    int16_t server;
    uint64_t key, bytes;
    int64_t enter, ready, start, end;
    uint64_t server_aux;
  };
  struct TensorEvent {
    uint32_t declared_key;
    uint32_t step;
    uint32_t parts;
    uint64_t bytes;
    int64_t start, end;
  };

 private:
  void StartWriteLocked();
  // Formats and writes (writer thread, or Finish's).
  static void Write(TimelineConfig cfg, std::vector<StageEvent> stages,
                    std::vector<TensorEvent> tensors,
                    std::unordered_map<uint32_t, std::string> names, int64_t wall_minus_steady_ns);

  TimelineConfig cfg_;
  static constexpr int kManualNone = 0, kManualRecording = 1, kManualStopped = 2;
  std::atomic<int> manual_{kManualNone};
  int64_t wall_minus_steady_ns_ = 0;  // event times are written as wall-clock microseconds
  std::mutex mu_;
  bool written_ = false;
  std::vector<StageEvent> stages_;
  std::vector<TensorEvent> tensors_;
  std::unordered_map<uint32_t, std::string> names_;  // declared key -> name, traced tensors
  std::unordered_map<uint32_t, bool> finished_;      // declared key -> past the window
  size_t num_finished_ = 0;
  std::thread writer_;
};

}  // namespace byteps
