// Upstream BytePS's environment variables (its byteps, ps-lite, launcher and build), each with
// what it does here, and the check every process runs over the names of its environment
// (knobs.h). docs/env.md renders this table next to the knob registry.
#include <algorithm>
#include <cctype>
#include <mutex>
#include <set>

#include "knobs.h"
#include "logging.h"

namespace byteps {
namespace {

using S = UpstreamStatus;

UpstreamVar Impl(const char* name, const char* note = "", bool checked = true) {
  return UpstreamVar{name, S::kImplemented, note, "", {}, false, checked};
}
UpstreamVar Repl(const char* name, const char* by, const char* here,
                 std::vector<std::string> same = {}, bool same_off = false) {
  return UpstreamVar{name, S::kReplaced, here, by, std::move(same), same_off, true};
}
UpstreamVar Ign(const char* name, const char* here, std::vector<std::string> same = {},
                bool same_off = false) {
  return UpstreamVar{name, S::kIgnored, here, "", std::move(same), same_off, true};
}
[[maybe_unused]] UpstreamVar Refuse(const char* name, const char* why, bool same_off) {
  return UpstreamVar{name, S::kRefused, why, "", {}, same_off, true};
}
// A generic name (not specific to BytePS): documented, not looked for.
UpstreamVar Unchecked(UpstreamVar v) {
  v.checked = false;
  return v;
}

constexpr bool kOff = true;  // every false spelling asks for what happens here
const char* kNoGpu = "The NCCL stages (BYTEPS_NCCL=1) use one communicator and one stream per "
                     "worker process among all the GPUs of its machine (no PCIe-switch groups, "
                     "no rings to choose), one call group per partition.";
const char* kNoUcx = "The UCX van has no such setting: UCX's own UCX_* variables configure it "
                     "(UCX_TLS, UCX_NET_DEVICES, UCX_RNDV_THRESH, ...).";
const char* kNoRdma = "RDMA goes through the UCX van (DMLC_ENABLE_RDMA=1), configured by UCX's "
                      "own UCX_* variables; there is no ibverbs van of its own.";
const char* kNoBind = "bpslaunch binds no process to CPU cores (put numactl or taskset in "
                      "COMMAND to do so).";
const char* kPlan = "the scheduler's key plan";
const char* kPlanText = "Partitions are placed on servers by bytes against the paper's optimal "
                        "shares (largest first), computed once by the scheduler; there is no "
                        "hash to choose.";
const char* kOneCore = "Upstream build switch. Here one framework-independent core is built "
                       "(CMake, through pip); each adapter (byteps.torch, byteps.tensorflow, "
                       "byteps.mxnet) is pure Python and works when its framework imports.";

std::vector<UpstreamVar> BuildUpstream() {
  return {
      // --- cluster and bootstrap (DMLC_*) ---
      Impl("DMLC_ROLE", "A worker is the training script; a server or the scheduler is "
                        "`python -m byteps.server`."),
      Impl("DMLC_NUM_WORKER", "Default 1 (upstream: required)."),
      Impl("DMLC_NUM_SERVER", "Default 0; a distributed job needs at least 1."),
      Impl("DMLC_WORKER_ID", "Required when DMLC_NUM_WORKER > 1."),
      Impl("DMLC_PS_ROOT_URI"),
      Impl("DMLC_PS_ROOT_PORT"),
      Impl("DMLC_INTERFACE"),
      Impl("DMLC_NODE_HOST", "Default: the local address of the route to the scheduler "
                             "(upstream: the first non-loopback interface)."),
      Impl("DMLC_PORT", "Read by servers only: a worker opens no listening port."),
      Ign("DMLC_NUM_PORTS", "Each server listens on one TCP port.", {"1"}),
      Ign("DMLC_LOCAL", "Nodes talk over TCP also on one host; the worker processes of one "
                        "machine share memory among themselves.", {}, kOff),
      Ign("DMLC_USE_KUBERNETES", "The scheduler binds the address DMLC_PS_ROOT_URI names (no "
                                 "switch binds 0.0.0.0 instead): it must be an address of the "
                                 "scheduler's own host.", {}, kOff),
      Ign("DMLC_RANK", "Node ids come from the scheduler; a worker's rank is DMLC_WORKER_ID * "
                       "BYTEPS_LOCAL_SIZE + BYTEPS_LOCAL_RANK (or BYTEPS_GLOBAL_RANK)."),
      Ign("DMLC_GROUP_SIZE", "One node per process (no instance groups).", {"1"}),
      Impl("DMLC_ENABLE_RDMA", "0/zmq/tcp: the TCP van; ucx: the UCX van; 1/ibverbs: the UCX "
                               "van with an RDMA transport required (upstream's ibverbs van is "
                               "not built: UCX drives the RDMA device). fabric is refused."),
      Impl("DMLC_ENABLE_UCX", "1: the UCX van (as DMLC_ENABLE_RDMA=ucx)."),
      Ign("DMLC_NUM_CPU_DEV", kNoUcx),
      Ign("DMLC_NUM_GPU_DEV", kNoUcx),
      Ign("DMLC_LOCKLESS_QUEUE", "The core's queues block on a condition variable; there is no "
                                 "spin-polling queue.", {}, kOff),
      Ign("DMLC_POLLING_IN_NANOSECOND", "No spin-polling queue."),
      // --- worker core ---
      Impl("BYTEPS_LOCAL_RANK"),
      Impl("BYTEPS_LOCAL_SIZE", "Default 1 (upstream: set by its launcher)."),
      Impl("BYTEPS_GLOBAL_RANK"),
      Impl("BYTEPS_FORCE_DISTRIBUTED"),
      Impl("BYTEPS_PARTITION_BYTES", "Default 262144 (upstream: 4096000)."),
      Impl("BYTEPS_MIN_COMPRESS_BYTES", "Part of each tensor's declaration, so workers that "
                                        "disagree get a MismatchError."),
      Ign("BYTEPS_PCIE_SWITCH_SIZE", kNoGpu),
      Ign("BYTEPS_NCCL_GROUP_SIZE", kNoGpu),
      Ign("BYTEPS_NCCL_NUM_RINGS", kNoGpu),
      Ign("BYTEPS_REDUCE_ROOTS", "Each worker process of a machine sums its own shard of every "
                                 "partition in shared memory; there is no reduce root."),
      Impl("BYTEPS_SCHEDULING_CREDIT", "Default 4, and the queues are always priority-ordered "
                                       "(upstream: 0 = scheduling off); 0 here means no credit "
                                       "limit. Unset, the window adapts to the acknowledgement "
                                       "delay from 4; set, it is fixed as upstream's."),
      Ign("BYTEPS_THREADPOOL_SIZE", "COMPRESS and DECOMPRESS are stages with a thread each, "
                                    "like every other stage, so nothing needs a pool (upstream "
                                    "crashed when compression ran without one)."),
      Ign("BYTEPS_OMP_THREAD_PER_GPU", "No OpenMP: a server sums on BYTEPS_SERVER_ENGINE_THREAD "
                                       "engine threads (each key on one of them), and each "
                                       "worker process of a machine sums its own shard."),
      Repl("BYTEPS_KEY_HASH_FN", kPlan, kPlanText),
      Repl("BYTEPS_BUILT_IN_HASH_COEF", kPlan, kPlanText),
      Repl("BYTEPS_ENABLE_MIXED_MODE", kPlan,
           "Mixed placement is always on: the scheduler recognises a server colocated with a "
           "worker by its host address and gives colocated and CPU-only servers the paper's "
           "optimal shares of the bytes.",
           {}, kOff),
      Repl("BYTEPS_MIXED_MODE_BOUND", kPlan, kPlanText),
      Ign("BYTEPS_SOCKET_PATH", "Local signalling uses Unix datagram sockets in the abstract "
                                "namespace: no files, so no directory."),
      Impl("BYTEPS_ENABLE_ASYNC",
           "The servers start from rank 0's parameters (upstream: zeros) and answer every pull "
           "(upstream's server crashed on the first); bounded staleness is "
           "BYTEPS_ASYNC_MAX_STALENESS; a worker that dies leaves the others training "
           "(docs/async.md)."),
      Impl("BYTEPS_TRACE_ON", "The servers also time each round (docs/timeline.md)."),
      Impl("BYTEPS_TRACE_START_STEP", "0 is accepted too (upstream: at least 1)."),
      Impl("BYTEPS_TRACE_END_STEP", "The file is also written at shutdown when the window "
           "never closed."),
      Impl("BYTEPS_TRACE_DIR", "bpslaunch --workers N>1 (N worker machines on one host) gives "
           "each its own <dir>/worker<w>."),
      Ign("BYTEPS_DEBUG_SAMPLE_TENSOR", "No per-stage sampling of tensor values."),
      Impl("BYTEPS_TELEMETRY_ON", "The sample period is BYTEPS_TELEMETRY_INTERVAL (default 10 "
           "s, as upstream); byteps.basics.get_telemetry() adds per-tensor counters."),
      Impl("BYTEPS_LOG_LEVEL", "FATAL means ERROR."),
      Impl("BYTEPS_LOG_HIDE_TIME"),
      // --- server ---
      Impl("BYTEPS_SERVER_ENGINE_THREAD", "Default 2 (upstream: 4)."),
      Ign("BYTEPS_SERVER_ENGINE_BLOCKING", "Summation always runs on the engine threads, never "
                                           "in the receiving thread.", {}, kOff),
      Ign("BYTEPS_SERVER_ENABLE_SCHEDULE", "Each engine thread serves its queue in arrival order; "
                                           "priority is applied by the workers, which send "
                                           "partitions in priority order under the credit.",
          {}, kOff),
      Ign("BYTEPS_SERVER_DEBUG", "No per-key value logging on the server.", {}, kOff),
      Ign("BYTEPS_SERVER_DEBUG_KEY", "No per-key value logging on the server."),
      Ign("PS_KEY_LOG", "No log line per push or pull.", {}, kOff),
      // --- ps-lite ---
      Repl("PS_VERBOSE", "BYTEPS_LOG_LEVEL",
           "BYTEPS_LOG_LEVEL=INFO logs registrations, the address book and each server's share; "
           "there is no log line per message.",
           {"0"}),
      Ign("PS_DROP_MSG", "No message dropping (fault injection) in the core.", {"0"}),
      Ign("PS_RESEND", "No retransmission layer: TCP delivers or the connection breaks, and a "
                       "broken connection fails the job with PeerLostError on every rank.",
          {}, kOff),
      Ign("PS_RESEND_TIMEOUT", "No retransmission layer (see PS_RESEND)."),
      Repl("PS_HEARTBEAT_INTERVAL", "BYTEPS_HEARTBEAT_INTERVAL",
           "Heartbeats are always on, every BYTEPS_HEARTBEAT_INTERVAL seconds."),
      Repl("PS_HEARTBEAT_TIMEOUT", "BYTEPS_HEARTBEAT_TIMEOUT",
           "A node silent for BYTEPS_HEARTBEAT_TIMEOUT seconds fails the job."),
      Unchecked(Ign("ENABLE_PROFILING", "No van-level profiling.")),
      Unchecked(Ign("PROFILE_PATH", "No van-level profiling.")),
      Ign("BYTEPS_ORDERED_HOSTS", "Worker ranks come from DMLC_WORKER_ID; servers are ordered by "
                                  "(host, port)."),
      Ign("BYTEPS_ZMQ_MAX_SOCKET", "No ZeroMQ: the core uses plain TCP sockets."),
      Ign("BYTEPS_ZMQ_NTHREADS", "No ZeroMQ: the core uses plain TCP sockets."),
      Impl("BYTEPS_ENABLE_IPC", "1: a colocated server is reached over UCX shared memory (the "
                                "UCX van's shared-memory transports) instead of loopback TCP."),
      Ign("BYTEPS_IPC_COPY_NUM_THREADS", "UCX's shared-memory transports do the copy; there is "
                                         "no copy thread pool."),
      Ign("BYTEPS_IPC_ENABLE_ASYNC_COPY", "UCX's shared-memory transports do the copy; there is "
                                          "no copy thread pool."),
      Ign("BYTEPS_PRINT_RDMA_LOG", kNoRdma, {}, kOff),
      Ign("BYTEPS_RDMA_START_DEPTH", kNoRdma),
      Ign("BYTEPS_RDMA_RX_DEPTH", kNoRdma),
      Ign("BYTEPS_RDMA_MAX_CONCURR_WR", kNoRdma),
      Ign("BYTEPS_ADDRESS_POOL_SIZE", kNoRdma),
      Ign("BYTEPS_UCX_SHORT_THRESH", kNoUcx),
      Ign("BYTEPS_UCX_FORCE_REQ_ORDER", kNoUcx),
      Ign("BYTEPS_UCX_QUEUE_SENDS", kNoUcx),
      Ign("BYTEPS_UCX_ERRH_ENABLE", kNoUcx),
      Ign("BYTEPS_UCX_RECONNECT_TMO", kNoUcx),
      Ign("PSLITE_UCX_USE_MT_MUTEX", kNoUcx),
      Ign("PSLITE_UCX_SOCKADDR_CM_ENABLE", kNoUcx),
      Ign("PSLITE_UCX_RNDV_THRESH", kNoUcx),
      Ign("PSLITE_UCX_IB_TRAFFIC_CLASS", kNoUcx),
      Unchecked(Ign("FI_EFA_ENABLE_SHM_TRANSFER", "No libfabric.")),
      Unchecked(Ign("DEBUG_MODE", "Read only by a ps-lite benchmark server; there is none here.")),
      // --- launcher ---
      Unchecked(Repl("NVIDIA_VISIBLE_DEVICES", "BYTEPS_LOCAL_SIZE",
                     "bpslaunch starts BYTEPS_LOCAL_SIZE worker processes per machine (upstream "
                     "mode; --local-size in local mode), default 1; it does not count devices.")),
      Ign("BYTEPS_ENABLE_GDB", "bpslaunch runs COMMAND as given (put gdb in COMMAND to debug).",
          {}, kOff),
      Ign("BYTEPS_NUMA_ON", kNoBind, {}, kOff),
      Ign("BYTEPS_VISIBLE_CPU_CORES", kNoBind),
      Ign("BYTEPS_NUMA_DEFAULT_QUOTA", kNoBind),
      Ign("BYTEPS_NUMA_ROOT_QUOTA", kNoBind),
      Ign("BYTEPS_CPU_BLACKLIST", kNoBind),
      Ign("BYTEPS_MULTITHREADED_CPU", kNoBind),
      Unchecked(Ign("UCX_HANDLE_ERRORS", "bpslaunch does not set it (no UCX).")),
      Impl("PYTHONUNBUFFERED", "bpslaunch sets PYTHONUNBUFFERED=1 in every child, as upstream.",
           false),
      // --- build ---
      Ign("BYTEPS_WITH_TENSORFLOW", kOneCore),
      Ign("BYTEPS_WITH_PYTORCH", kOneCore),
      Ign("BYTEPS_WITH_MXNET", kOneCore),
      Ign("BYTEPS_WITHOUT_TENSORFLOW", kOneCore),
      Ign("BYTEPS_WITHOUT_PYTORCH", kOneCore),
      Ign("BYTEPS_WITHOUT_MXNET", kOneCore),
      Ign("BYTEPS_WITH_UCX", "Upstream build switch; the build has no UCX.", {}, kOff),
      Ign("BYTEPS_UCX_HOME", "Upstream build path; the build has no UCX."),
      Ign("BYTEPS_UCX_PREFIX", "Upstream build path; the build has no UCX."),
      Ign("BYTEPS_UCX_TARBALL_PATH", "Upstream build path; the build has no UCX."),
      Ign("BYTEPS_CUDA_HOME", "Upstream build path; the build uses neither CUDA nor NCCL."),
      Ign("BYTEPS_CUDA_INCLUDE", "Upstream build path; the build uses neither CUDA nor NCCL."),
      Ign("BYTEPS_CUDA_LIB", "Upstream build path; the build uses neither CUDA nor NCCL."),
      Ign("BYTEPS_NCCL_HOME", "Upstream build path; the build uses neither CUDA nor NCCL."),
      Ign("BYTEPS_NCCL_LINK", "Upstream build switch; the build uses neither CUDA nor NCCL."),
      Ign("BYTEPS_USE_MPI", "Upstream build switch; the build uses no MPI.", {}, kOff),
      Ign("BYTEPS_MPICXX_SHOW", "Upstream build switch; the build uses no MPI."),
      Ign("BYTEPS_WITHOUT_PRESETUP", "Upstream build switch; the build has no pre-setup step."),
      Unchecked(Ign("MXNET_USE_MKLDNN", "byteps.mxnet is pure Python: nothing is compiled "
                                        "against MXNet.")),
      Unchecked(Ign("MXNET_SOURCE_ROOT", "byteps.mxnet is pure Python: nothing is compiled "
                                         "against MXNet.")),
  };
}

bool HasPrefix(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

std::string Upper(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::toupper(c); });
  return s;
}

// The name without its BYTEPS_ / DMLC_ prefix (so DMLC_LOCAL_SIZE is close to BYTEPS_LOCAL_SIZE).
std::string Stem(const std::string& s) {
  for (const char* p : {"BYTEPS_", "DMLC_"})
    if (HasPrefix(s, p)) return s.substr(std::char_traits<char>::length(p));
  return s;
}

// Optimal string alignment distance (insertions, deletions, substitutions, transpositions).
size_t Distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

std::string OffHint(const UpstreamVar& v) {
  if (v.same_off) return "unset it or set it to 0";
  if (!v.same.empty()) return "unset it or set it to " + v.same.front();
  return "unset it";
}

}  // namespace

const std::vector<UpstreamVar>& UpstreamVars() {
  static const std::vector<UpstreamVar>* table = new std::vector<UpstreamVar>(BuildUpstream());
  return *table;
}

const UpstreamVar* FindUpstreamVar(const std::string& name) {
  for (auto& v : UpstreamVars())
    if (v.name == name) return &v;
  return nullptr;
}

const char* UpstreamStatusName(UpstreamStatus s) {
  switch (s) {
    case S::kImplemented: return "implemented";
    case S::kReplaced: return "replaced";
    case S::kIgnored: return "ignored";
    case S::kRefused: return "refused";
  }
  return "?";
}

bool UpstreamValueIsSame(const UpstreamVar& v, const std::string& value) {
  if (std::find(v.same.begin(), v.same.end(), value) != v.same.end()) return true;
  if (!v.same_off) return false;
  static const char* kFalse[] = {"", "0", "false", "no", "off", "n"};
  const std::string low = Upper(value);
  for (auto* f : kFalse)
    if (low == Upper(f)) return true;
  return false;
}

bool IsWatchedName(const std::string& name) {
  if (HasPrefix(name, "BYTEPS_") || HasPrefix(name, "DMLC_")) return true;
  const UpstreamVar* v = FindUpstreamVar(name);
  return v && v->checked;
}

std::string ClosestKnownName(const std::string& name) {
  const std::string un = Upper(name), stem = Stem(un);
  std::string best;
  size_t best_d = std::string::npos;
  auto consider = [&](const std::string& cand) {
    if (cand == name) return;
    const std::string uc = Upper(cand);
    // A different prefix counts as one edit: DMLC_LOCAL_SIZE -> BYTEPS_LOCAL_SIZE.
    size_t d = std::min(Distance(un, uc), Distance(stem, Stem(uc)) + 1);
    if (d < best_d) best_d = d, best = cand;
  };
  for (auto& k : AllKnobs()) {
    consider(k.name);
    for (auto& a : k.aliases) consider(a);
  }
  for (auto& v : UpstreamVars())
    if (v.checked) consider(v.name);
  // Plausible misspellings only: about one edit per four characters of the stem, at most 3.
  const size_t limit = std::max<size_t>(1, std::min<size_t>(3, stem.size() / 4));
  return best_d <= limit ? best : "";
}

Status CheckEnvironmentNames(const std::map<std::string, std::string>& env,
                             std::vector<EnvNotice>* notices) {
  std::string refused;
  for (auto& [name, value] : env) {
    if (!IsWatchedName(name)) continue;
    bool known = FindKnob(name) != nullptr;
    for (auto& k : AllKnobs())
      known = known || std::find(k.aliases.begin(), k.aliases.end(), name) != k.aliases.end();
    if (known) continue;
    const UpstreamVar* v = FindUpstreamVar(name);
    if (v == nullptr) {
      // Never echo the value of an unknown variable: it may be a misspelt secret.
      std::string text = name + " is not a byteps variable and is ignored";
      std::string close = ClosestKnownName(name);
      if (!close.empty()) text += "; did you mean " + close + "?";
      notices->push_back({name, true, text + " (docs/env.md lists every variable)"});
      continue;
    }
    const std::string set = name + "=" + value;
    if (UpstreamValueIsSame(*v, value)) {
      std::string text = set + " is an upstream BytePS variable set to a value that changes "
                               "nothing here";
      if (v->status != S::kRefused) text += ": " + v->here;
      notices->push_back({name, false, text});
      continue;
    }
    switch (v->status) {
      case S::kRefused:
        refused += (refused.empty() ? "" : "; ") + set + " is refused: " + v->here + "; " +
                   OffHint(*v) + " to run";
        break;
      case S::kReplaced:
        notices->push_back({name, true, set + " is an upstream BytePS variable that byteps does "
                                        "not read (replaced by " + v->replaced_by + "): " +
                                        v->here});
        break;
      case S::kIgnored:
        notices->push_back({name, true, set + " is an upstream BytePS variable that byteps does "
                                        "not implement; it is ignored: " + v->here});
        break;
      case S::kImplemented: break;  // not a knob: nothing a process reads (PYTHONUNBUFFERED)
    }
  }
  if (!refused.empty()) return Status::Config(refused);
  return Status::OK();
}

void LogEnvironmentNotices(const Knobs& k) {
  static std::mutex mu;
  static std::set<std::string>* reported = new std::set<std::string>();
  std::lock_guard<std::mutex> lk(mu);
  for (auto& n : k.notices()) {
    if (!reported->insert(n.name).second) continue;
    if (n.warning) BPS_LOG(WARNING) << n.text;
    else BPS_LOG(INFO) << n.text;
  }
}

}  // namespace byteps
