// The timeline: recording (the pipeline's threads, one lock per finished partition) and the
// Chrome-trace JSON writer (docs/timeline.md).
#include "pipeline/timeline.h"

#include <cstdint>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>

#include "common/logging.h"
#include "pipeline/context.h"
#include "ps/protocol.h"

namespace byteps {

Timeline::~Timeline() { Finish(); }

void Timeline::Configure(const TimelineConfig& cfg) {
  cfg_ = cfg;
  const int64_t wall = std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  wall_minus_steady_ns_ = wall - TraceNowNs();
  if (cfg_.on) {
    stages_.reserve(1 << 14);
    tensors_.reserve(1 << 10);
  }
}

std::string Timeline::Path() const {
  if (manual_.load(std::memory_order_acquire) != kManualNone) return cfg_.file;
  return cfg_.dir + "/" + std::to_string(cfg_.local_rank) + "/comm.json";
}

bool Timeline::written() {
  std::lock_guard<std::mutex> lk(mu_);
  return written_;
}

void Timeline::RecordPartition(const PartTask& t) {
  const TensorContext& ctx = *t.ctx;
  const uint32_t step = ctx.round - 1;
  StageEvent e;
  e.declared_key = ctx.declared_key;
  e.step = step;
  e.part = static_cast<uint16_t>(t.part.index);
  e.server = static_cast<int16_t>(t.server);
  e.key = t.key;
  e.bytes = t.part.length;
  e.server_aux = t.trace.server_aux;
  std::lock_guard<std::mutex> lk(mu_);
  if (written_) return;
  for (int i = 0; i < t.stages.size; ++i) {
    const int s = static_cast<int>(t.stages.stages[i]);
    e.stage = static_cast<uint8_t>(s);
    e.enter = t.trace.enter[s];
    e.ready = t.trace.ready[s];
    e.start = t.trace.start[s];
    e.end = t.trace.end[s];
    stages_.push_back(e);
  }
}

void Timeline::RecordTensor(const TensorContext& ctx, int64_t start_ns, int64_t end_ns) {
  const uint32_t step = ctx.round - 1;
  std::lock_guard<std::mutex> lk(mu_);
  if (written_) return;
  tensors_.push_back(TensorEvent{ctx.declared_key, step, static_cast<uint32_t>(ctx.parts.size()),
                                 ctx.nbytes, start_ns, end_ns});
  auto it = finished_.find(ctx.declared_key);
  if (it == finished_.end()) {
    names_[ctx.declared_key] = ctx.name;
    it = finished_.emplace(ctx.declared_key, false).first;
  }
  if (manual_.load(std::memory_order_acquire) == kManualNone && step + 1 >= cfg_.end_step &&
      !it->second) {
    it->second = true;
    if (++num_finished_ == finished_.size()) StartWriteLocked();
  }
}

Status Timeline::Start(const std::string& file) {
  if (file.empty()) return Status::InvalidArgument("start_timeline: the file path is empty");
  std::thread previous;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (manual_.load() == kManualRecording)
      return Status::InvalidArgument("start_timeline: a timeline is already being recorded to " +
                                     cfg_.file + " (stop_timeline first)");
    previous = std::move(writer_);
    stages_.clear();
    tensors_.clear();
    names_.clear();
    finished_.clear();
    num_finished_ = 0;
    written_ = false;
    cfg_.file = file;
    manual_.store(kManualRecording, std::memory_order_release);
  }
  if (previous.joinable()) previous.join();
  return Status::OK();
}

Status Timeline::Stop() {
  std::thread writer;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (manual_.load() != kManualRecording)
      return Status::InvalidArgument("stop_timeline: no timeline is being recorded "
                                     "(start_timeline first)");
    manual_.store(kManualStopped, std::memory_order_release);
    StartWriteLocked();
    writer = std::move(writer_);
  }
  writer.join();  // the file is written when stop_timeline returns
  return Status::OK();
}

void Timeline::StartWriteLocked() {
  written_ = true;
  writer_ = std::thread(&Timeline::Write, cfg_, std::move(stages_), std::move(tensors_),
                        std::move(names_), wall_minus_steady_ns_);
}

void Timeline::Finish() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (manual_.load() == kManualRecording && !written_) {
      manual_ = kManualStopped;
      StartWriteLocked();  // started and never stopped: written at shutdown
    } else if (cfg_.on && !written_ && !tensors_.empty()) {
      BPS_LOG(INFO) << "timeline: the window [" << cfg_.start_step << ", " << cfg_.end_step
                    << ") did not close before shutdown; writing what was recorded";
      StartWriteLocked();
    }
  }
  if (writer_.joinable()) writer_.join();
}

namespace {

void AppendEscaped(std::string* out, const std::string& s) {
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(static_cast<char>(c));
    } else if (c < 0x20) {
      char buf[8];
      snprintf(buf, sizeof(buf), "\\u%04x", c);
      out->append(buf);
    } else {
      out->push_back(static_cast<char>(c));
    }
  }
}

// Microseconds with three decimals, exactly from nanoseconds.
void AppendUs(std::string* out, int64_t ns) {
  char buf[40];
  if (ns < 0) ns = 0;
  snprintf(buf, sizeof(buf), "%lld.%03lld", static_cast<long long>(ns / 1000),
           static_cast<long long>(ns % 1000));
  out->append(buf);
}

// Greedy interval packing: the first lane whose last event ended at least kLaneGapNs before
// `start`. The gap keeps slices apart after a reader parses `ts` (wall-clock microseconds,
// ~1.8e15) as a double, whose resolution there is 0.25 us.
constexpr int64_t kLaneGapNs = 1000;
int Lane(std::vector<int64_t>* lanes, int64_t start, int64_t end) {
  for (size_t i = 0; i < lanes->size(); ++i) {
    if ((*lanes)[i] + kLaneGapNs <= start) {
      (*lanes)[i] = end;
      return static_cast<int>(i);
    }
  }
  lanes->push_back(end);
  return static_cast<int>(lanes->size() - 1);
}

constexpr int kTrackStride = 1000;  // tid = (track + 1) * 1000 + lane; track 0 = push_pull

bool MakeDirs(const std::string& path) {
  std::string cur;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    cur = path.substr(0, pos);
    if (cur.empty()) continue;
    if (mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) return false;
  }
  return true;
}

}  // namespace

void Timeline::Write(TimelineConfig cfg, std::vector<StageEvent> stages,
                     std::vector<TensorEvent> tensors,
                     std::unordered_map<uint32_t, std::string> names, int64_t offset) {
  const int pid = cfg.rank;
  std::string out;
  out.reserve(256 * (stages.size() + tensors.size()) + 4096);
  out += "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"byteps\",\"rank\":";
  out += std::to_string(cfg.rank) + ",\"local_rank\":" + std::to_string(cfg.local_rank) +
         ",\"worker_id\":" + std::to_string(cfg.worker_id) +
         ",\"start_step\":" + std::to_string(cfg.start_step) +
         ",\"end_step\":" + std::to_string(cfg.end_step) +
         ",\"clock\":\"wall-clock microseconds (steady clock, offset at start)\"},"
         "\"traceEvents\":[\n";
  char buf[256];
  snprintf(buf, sizeof(buf),
           "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":"
           "\"rank %d (worker machine %d, local rank %d)\"}},\n"
           "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":"
           "{\"sort_index\":%d}}",
           pid, cfg.rank, cfg.worker_id, cfg.local_rank, pid, cfg.rank);
  out += buf;
  std::map<int, std::string> tracks;  // tid -> name

  auto name_of = [&](uint32_t k) -> const std::string& {
    static const std::string kUnknown = "?";
    auto it = names.find(k);
    return it == names.end() ? kUnknown : it->second;
  };

  // Whole push_pulls: track 0.
  std::sort(tensors.begin(), tensors.end(),
            [](const TensorEvent& a, const TensorEvent& b) { return a.start < b.start; });
  std::vector<int64_t> lanes;
  for (const TensorEvent& e : tensors) {
    const int tid = kTrackStride + Lane(&lanes, e.start, e.end);
    tracks[tid] = "push_pull";
    const std::string& name = name_of(e.declared_key);
    out += ",\n{\"name\":\"";
    AppendEscaped(&out, name);
    out += "\",\"cat\":\"push_pull\",\"ph\":\"X\",\"ts\":";
    AppendUs(&out, e.start + offset);
    out += ",\"dur\":";
    AppendUs(&out, std::max<int64_t>(e.end - e.start, 0));
    snprintf(buf, sizeof(buf),
             ",\"pid\":%d,\"tid\":%d,\"args\":{\"key\":%u,\"step\":%u,\"bytes\":%llu,"
             "\"partitions\":%u,\"tensor\":\"",
             pid, tid, e.declared_key, e.step, static_cast<unsigned long long>(e.bytes), e.parts);
    out += buf;
    AppendEscaped(&out, name);
    out += "\"}}";
  }

  // Stages: one track group per stage, lanes where partitions overlap.
  struct Span {
    const StageEvent* e;
    int64_t start, end;
  };
  std::vector<Span> spans[kStageCount];
  for (const StageEvent& e : stages) {
    int64_t start = e.start ? e.start : (e.ready ? e.ready : e.enter);
    int64_t end = e.end;
    if (e.stage == static_cast<uint8_t>(Stage::kPush) && end == 0) end = start;
    if (start == 0 || end == 0) continue;  // not stamped (cannot happen for a finished part)
    spans[e.stage].push_back(Span{&e, start, end});
  }
  for (int s = 0; s < kStageCount; ++s) {
    auto& v = spans[s];
    std::sort(v.begin(), v.end(), [](const Span& a, const Span& b) { return a.start < b.start; });
    lanes.clear();
    const char* stage = StageName(static_cast<Stage>(s));
    for (const Span& sp : v) {
      const StageEvent& e = *sp.e;
      const int lane = Lane(&lanes, sp.start, sp.end);
      const int tid = (s + 2) * kTrackStride + lane;
      tracks[tid] = lane ? std::string(stage) + " (" + std::to_string(lane + 1) + ")" : stage;
      const std::string& name = name_of(e.declared_key);
      out += ",\n{\"name\":\"";
      AppendEscaped(&out, name);
      out += "[" + std::to_string(e.part) + "]\",\"cat\":\"";
      out += stage;
      out += "\",\"ph\":\"X\",\"ts\":";
      AppendUs(&out, sp.start + offset);
      out += ",\"dur\":";
      AppendUs(&out, sp.end - sp.start);
      snprintf(buf, sizeof(buf),
               ",\"pid\":%d,\"tid\":%d,\"args\":{\"stage\":\"%s\",\"key\":%llu,"
               "\"declared_key\":%u,\"partition\":%u,\"bytes\":%llu,\"step\":%u,\"server\":%d",
               pid, tid, stage, static_cast<unsigned long long>(e.key), e.declared_key, e.part,
               static_cast<unsigned long long>(e.bytes), e.step, e.server);
      out += buf;
      if (e.ready) {
        out += ",\"gate_wait_us\":";
        AppendUs(&out, e.ready - e.enter);
      }
      // PULL's wait for the acknowledgement is the PUSH event; an inline stage never waits.
      if (e.start && s != static_cast<int>(Stage::kPull) && e.start != e.enter) {
        out += ",\"queue_wait_us\":";
        AppendUs(&out, e.start - (e.ready ? e.ready : e.enter));
      }
      if (s == static_cast<int>(Stage::kPull) && e.server_aux) {
        snprintf(buf, sizeof(buf), ",\"server_wait_us\":%u,\"server_sum_us\":%u",
                 ServerWaitUs(e.server_aux), ServerSumUs(e.server_aux));
        out += buf;
      }
      out += ",\"tensor\":\"";
      AppendEscaped(&out, name);
      out += "\"}}";
    }
  }
  for (auto& [tid, tname] : tracks) {
    snprintf(buf, sizeof(buf),
             ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":"
             "\"%s\"}},\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
             "\"args\":{\"sort_index\":%d}}",
             pid, tid, tname.c_str(), pid, tid, tid);
    out += buf;
  }
  out += "\n]}\n";

  const std::string dir =
      cfg.file.empty() ? cfg.dir + "/" + std::to_string(cfg.local_rank)
                       : (cfg.file.find('/') == std::string::npos
                              ? std::string(".")
                              : cfg.file.substr(0, cfg.file.rfind('/')));
  const std::string path = cfg.file.empty() ? dir + "/comm.json" : cfg.file;
  const std::string tmp = path + ".tmp" + std::to_string(getpid());
  bool ok = MakeDirs(dir);
  if (ok) {
    FILE* f = fopen(tmp.c_str(), "wb");
    ok = f && fwrite(out.data(), 1, out.size(), f) == out.size();
    if (f) ok = fclose(f) == 0 && ok;
    ok = ok && rename(tmp.c_str(), path.c_str()) == 0;
    if (!ok) unlink(tmp.c_str());
  }
  if (ok) {
    BPS_LOG(INFO) << "timeline: " << tensors.size() << " push_pulls, " << stages.size()
                  << " stage events written to " << path;
  } else {
    BPS_LOG(WARNING) << "timeline: could not write " << path << ": " << strerror(errno);
  }
}

}  // namespace byteps
