#include "knobs.h"

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <sstream>

extern char** environ;

namespace byteps {
namespace {

KnobSpec Int(const char* name, const char* def, double lo, double hi, const char* used_by,
             const char* doc, std::vector<std::string> aliases = {}) {
  KnobSpec k{name, KnobType::kInt, def, doc, used_by, lo, hi, {}, std::move(aliases)};
  return k;
}
KnobSpec Float(const char* name, const char* def, double lo, double hi, const char* used_by,
               const char* doc) {
  return KnobSpec{name, KnobType::kFloat, def, doc, used_by, lo, hi, {}, {}};
}
KnobSpec Bool(const char* name, const char* def, const char* used_by, const char* doc) {
  return KnobSpec{name, KnobType::kBool, def, doc, used_by, 1, 0, {}, {}};
}
KnobSpec Str(const char* name, const char* def, const char* used_by, const char* doc) {
  return KnobSpec{name, KnobType::kString, def, doc, used_by, 1, 0, {}, {}};
}
KnobSpec Choice(const char* name, const char* def, std::vector<std::string> choices,
                const char* used_by, const char* doc) {
  return KnobSpec{name, KnobType::kChoice, def, doc, used_by, 1, 0, std::move(choices), {}};
}

std::vector<KnobSpec> BuildTable() {
  return {
      // --- cluster and bootstrap (upstream DMLC_* contract) ---
      Choice("DMLC_ROLE", "worker", {"worker", "server", "scheduler"}, "all",
             "Role of this process."),
      Int("DMLC_NUM_WORKER", "1", 1, 65535, "all",
          "Number of worker machines (each runs BYTEPS_LOCAL_SIZE worker processes)."),
      Int("DMLC_NUM_SERVER", "0", 0, 65535, "all",
          "Number of server processes of the summation service."),
      Int("DMLC_WORKER_ID", "0", 0, 65534, "worker",
          "Index of this worker machine, 0..DMLC_NUM_WORKER-1. Required when DMLC_NUM_WORKER > 1."),
      Str("DMLC_PS_ROOT_URI", "", "all",
          "IP address of the scheduler. Required in a distributed job."),
      Int("DMLC_PS_ROOT_PORT", "", 1, 65535, "all",
          "TCP port of the scheduler. Required in a distributed job."),
      Str("DMLC_NODE_HOST", "", "worker,server",
          "IP address this node advertises and binds to; default: the local address of the "
          "route to the scheduler."),
      Str("DMLC_INTERFACE", "", "worker,server",
          "Network interface whose IPv4 address this node advertises (used when DMLC_NODE_HOST "
          "is unset)."),
      Int("DMLC_PORT", "0", 0, 65535, "server", "TCP port a server listens on; 0 picks a free one."),
      // --- worker core ---
      Int("BYTEPS_LOCAL_RANK", "0", 0, 1023, "worker",
          "Rank of this process among the worker processes of its machine (set by bpslaunch)."),
      Int("BYTEPS_LOCAL_SIZE", "1", 1, 1024, "worker",
          "Number of worker processes on this machine (set by bpslaunch). Must agree on all "
          "machines."),
      Int("BYTEPS_GLOBAL_RANK", "-1", -1, 1 << 30, "worker",
          "Overrides the computed rank (local_rank + worker_id * local_size); -1 = computed."),
      Bool("BYTEPS_FORCE_DISTRIBUTED", "0", "worker,launcher",
           "Use the scheduler and servers even when DMLC_NUM_WORKER is 1."),
      Int("BYTEPS_PARTITION_BYTES", "262144", 4096, 1LL << 31, "worker",
          "Largest partition of a tensor, in bytes; rounded up to a multiple of "
          "BYTEPS_LOCAL_SIZE * 4096 (ByteScheduler, SOSP'19 §4). A distributed job cuts a "
          "tensor that this bound would cut into fewer than 32 * DMLC_NUM_WORKER partitions at "
          "1/(32 * DMLC_NUM_WORKER) of it rounded down to a multiple of 61440 bytes (at least "
          "one; whole BYTEPS_LOCAL_SIZE pages), so the pipeline stays full and no frame leaves "
          "a tiny TCP segmentation tail; a compressed tensor is cut at this bound only, so the "
          "compressor acts on the partitions asked for. Default chosen by the "
          "scheduling sweep of docs/performance.md (upstream: 4096000). A single-machine job "
          "(no servers) that leaves it unset uses 4194304: with no network to preempt, "
          "smaller partitions only add hand-offs between the local processes."),
      Bool("BYTEPS_AUTOTUNE", "0", "worker",
           "Tune BYTEPS_PARTITION_BYTES and BYTEPS_SCHEDULING_CREDIT during the first "
           "iterations by measured iteration time, and keep the best (docs/autotune.md). A "
           "knob set explicitly is held fixed. Distributed jobs with BYTEPS_LOCAL_SIZE=1; "
           "every worker must set it alike."),
      Str("BYTEPS_AUTOTUNE_LOG", "", "worker",
          "BYTEPS_AUTOTUNE: JSON-lines file with one line per trial (the point and its "
          "iteration time) and one for the choice, written by rank 0; '{rank}' in the path "
          "makes one file per rank. Empty: no file (the INFO log has the same lines)."),
      Int("BYTEPS_AUTOTUNE_WARMUP_SAMPLES", "3", 0, 1 << 20, "worker",
          "BYTEPS_AUTOTUNE: iterations ignored before the first trial (after the first one, "
          "which declares the tensors)."),
      Int("BYTEPS_AUTOTUNE_STEPS_PER_SAMPLE", "5", 1, 1 << 20, "worker",
          "BYTEPS_AUTOTUNE: iterations measured per trial (their median is the trial's time; "
          "each trial also runs one iteration to settle and one while the workers average "
          "their measurements)."),
      Int("BYTEPS_AUTOTUNE_MAX_SAMPLES", "16", 1, 64, "worker",
          "BYTEPS_AUTOTUNE: most points tried (the coordinate search of docs/autotune.md "
          "tries at most 14)."),
      Float("BYTEPS_COST_ALPHA", "", 0, 10, "worker",
            "Cost model (BYTEPS_SYNC=auto, docs/schemes.md): alpha, the latency of one message, "
            "seconds; set, every scheme's latency is its messages times alpha. Unset: each "
            "scheme's latency is measured at start-up (a tiny push_pull of every scheme the job "
            "can run, the median of 15) and averaged over the workers. Every worker must set it "
            "alike."),
      Float("BYTEPS_COST_BETA", "", 0, 1, "worker",
            "Cost model: beta, seconds per byte on one link direction (1 / bandwidth). Unset: "
            "measured at start-up (a 1 MiB push_pull through the summation service, read through "
            "its cost formula) and averaged over the workers. Every worker must set it alike."),
      Float("BYTEPS_COST_GAMMA", "", 0, 1, "worker",
            "Cost model: gamma, seconds per byte summed. Unset: the core's float32 summation "
            "kernel timed on a 1 MiB buffer at start-up, averaged over the workers. Every "
            "worker must set it alike."),
      Int("BYTEPS_MIN_COMPRESS_BYTES", "65536", 0, 1LL << 40, "worker",
          "Tensors smaller than this many bytes are not compressed even when declared with a "
          "compressor (upstream's threshold and default; docs/compression.md). Every worker "
          "must use the same value: it decides what the tensor's declaration says."),
      Choice("BYTEPS_SYNC", "ps", {"ps", "ring", "tree", "hips", "auto"}, "worker,server",
             "How tensors are summed across worker machines (docs/schemes.md): ps = the "
             "summation service; ring = ring all-reduce among the workers; tree = FlexTree-style "
             "tree all-reduce of width BYTEPS_TREE_WIDTH; hips = hierarchical summation "
             "servers; auto = per tensor, by the cost model. Every worker must use the same "
             "value; a tensor's declaration may name its own scheme."),
      Bool("BYTEPS_NCCL", "0", "worker",
           "1: a machine with several worker processes sums their device (CUDA) tensors among "
           "its GPUs with NCCL (REDUCE = reduce-scatter, BROADCAST = all-gather; one machine: "
           "all-reduce), and only each GPU's shard of the machine's sum crosses PCIe "
           "(docs/gpu.md). 0: every process copies its tensor to host memory, where the "
           "machine's processes sum it. Off by default until the NCCL stages have run on a "
           "machine with several GPUs. Every worker process must use the same value."),
      Int("BYTEPS_TREE_WIDTH", "0", 0, 65535, "worker",
          "Width w of the tree all-reduce (BYTEPS_SYNC=tree): ring reduce-scatter inside groups "
          "of w worker machines, a binary tree across the groups, ring all-gather back. w must "
          "divide DMLC_NUM_WORKER; 1 = a plain binary tree, DMLC_NUM_WORKER = the ring; 0 = "
          "the largest divisor of DMLC_NUM_WORKER not above its square root (rounded up)."),
      Int("BYTEPS_HIPS_GROUP", "0", 0, 65535, "worker,server",
          "Worker machines per group of HiPS (BYTEPS_SYNC=hips): servers 0..G-1 (G = "
          "ceil(DMLC_NUM_WORKER / group)) are the first level, server i summing group i and "
          "forwarding to the top level (the other servers; at least one); 0 = "
          "ceil(sqrt(DMLC_NUM_WORKER))."),
      Int("BYTEPS_SCHEDULING_CREDIT", "4", 0, 1 << 20, "worker",
          "Partitions in flight to the servers at once (credit, in units of "
          "BYTEPS_PARTITION_BYTES); queues are priority-ordered. 0 = unlimited (no credit). "
          "Unset: an adaptive window that starts at the default and follows the servers' "
          "acknowledgement delay (docs/architecture.md section 5); set: fixed at this value."),
      Int("BYTEPS_TCP_NOTSENT_LOWAT", "65536", 0, (1LL << 31) - 1, "worker,server",
          "Most not-yet-sent bytes the kernel may hold per data connection (TCP_NOTSENT_LOWAT); "
          "the rest waits in the priority-ordered queues, so a high-priority partition does not "
          "queue behind what the kernel already took. 0 = the kernel's default (no limit)."),
      Float("BYTEPS_TIMEOUT", "120", 1, 1e7, "all",
            "Seconds any rendezvous, declaration or push_pull may wait before it fails with a "
            "timeout naming what is missing."),
      Float("BYTEPS_STALL_WARNING_SECONDS", "60", 0, 1e7, "worker,scheduler",
            "Seconds a push_pull may wait before a warning names the tensor and the ranks that "
            "have not submitted it (0: no warning). BYTEPS_TIMEOUT is the shutdown threshold: "
            "then the operation fails with the same list."),
      Float("BYTEPS_HEARTBEAT_INTERVAL", "1", 0.05, 3600, "all",
            "Seconds between heartbeats from each node to the scheduler."),
      Float("BYTEPS_HEARTBEAT_TIMEOUT", "15", 0.1, 86400, "all",
            "Seconds without a heartbeat after which the scheduler declares a node dead and "
            "fails the job on every rank, and a node that hears nothing from the scheduler "
            "(which echoes every heartbeat) fails itself."),
      Str("BYTEPS_JOB_ID", "", "all",
          "Job identifier naming shared-memory segments and local sockets; bpslaunch sets a "
          "fresh one; default: derived from the scheduler address and worker id."),
      Str("BYTEPS_SECRET", "", "all",
          "Job secret: every TCP connection of a distributed job starts with a mutual "
          "HMAC-SHA256 challenge-response proving knowledge of it. bpslaunch generates it and "
          "passes it only through the environment (never on a command line); never logged."),
      Bool("BYTEPS_ALLOW_UNAUTHENTICATED", "0", "all",
           "1: a distributed process without BYTEPS_SECRET runs unauthenticated (warned once); "
           "0: it refuses to start (ConfigError)."),
      // --- van (comm/van.h: VanSpec) ---
      Choice("DMLC_ENABLE_RDMA", "0", {"0", "zmq", "tcp", "ucx", "1", "ibverbs"}, "all",
             "Transport of every connection of the job: 0 (or zmq, tcp): the TCP van; ucx: the "
             "UCX van (RDMA, shared memory or TCP, as UCX_TLS allows); 1 or ibverbs: the UCX van, "
             "and a process without an RDMA transport fails at start. Must agree on all nodes."),
      Bool("DMLC_ENABLE_UCX", "0", "all",
           "1: the UCX van for every connection (as DMLC_ENABLE_RDMA=ucx). Must agree on all "
           "nodes."),
      Float("BYTEPS_UCX_SPIN_US", "0", 0, 1e6, "all",
            "Microseconds the UCX van's progress thread keeps polling UCX after it last found "
            "work, before it sleeps on UCX's event file descriptor. Polling saves the wake-up "
            "where every process has a core of its own (RDMA hosts: try 10-50); where processes "
            "share cores it takes their CPU, and over UCX's TCP transport each poll is a system "
            "call (measured in docs/performance-notes.md)."),
      Choice("BYTEPS_UCX_ONE_WAY", "auto", {"auto", "1", "0"}, "all",
             "One-way writes over the UCX van: a push larger than UCX's eager limit is written "
             "straight into the server's fixed slot for its key (whose remote key came once, "
             "with the key's first acknowledgement) and announced by a header, instead of a "
             "rendezvous per push; so is a sum into a local root's aggregates (a machine of "
             "several processes) or a lone process's pinned buffer of a GPU tensor (its window "
             "went once, before the key's first push). auto: over "
             "RDMA links (on a host where UCX has no RDMA transport a server keeps its rotating "
             "staging buffers); 1: over shared memory too, for checking the path (there pushes "
             "measured no faster than the rendezvous and sums slower: UCX cannot map the "
             "aggregates, docs/rdma.md); 0: never. Over UCX's TCP transport frames whatever the "
             "value."),
      Bool("BYTEPS_ENABLE_IPC", "0", "all",
           "1: with the TCP van, a worker reaches a server on its own host (and the scheduler, "
           "if there) over UCX shared memory instead of loopback TCP. With the UCX van UCX "
           "already does (unless UCX_TLS excludes shared memory). Must agree on all nodes."),
      // --- server ---
      Int("BYTEPS_SERVER_ENGINE_THREAD", "2", 1, 256, "server",
          "Summation engine threads per server; each key is bound to one thread."),
      // --- asynchronous training (docs/async.md) ---
      Bool("BYTEPS_ENABLE_ASYNC", "0", "all",
           "1: asynchronous training: the servers keep the parameters (initialised from rank "
           "0's first push), each worker pushes its parameter delta and pulls the current "
           "parameters without waiting for the others (tensors named AsyncParam.*; the adapters' "
           "DistributedOptimizer does it). Implies a distributed job. Must be the same on every "
           "worker, server and the scheduler (ConfigError on every rank otherwise)."),
      Int("BYTEPS_ASYNC_MAX_STALENESS", "-1", -1, (1LL << 31) - 1, "all",
          "With BYTEPS_ENABLE_ASYNC=1: a worker more than this many rounds ahead of the slowest "
          "live worker waits for it (bounded staleness; 0: every round waits for every live "
          "worker); -1: unbounded. Must be the same on every node."),
      // --- timeline and telemetry (docs/timeline.md) ---
      Bool("BYTEPS_TRACE_ON", "0", "worker,server,launcher",
           "1: record the timeline: Chrome-trace events of every push_pull and of every stage of "
           "every partition for steps [BYTEPS_TRACE_START_STEP, BYTEPS_TRACE_END_STEP), written "
           "to BYTEPS_TRACE_DIR/<local_rank>/comm.json; servers report their wait and summation "
           "time per round to traced workers."),
      Int("BYTEPS_TRACE_START_STEP", "10", 0, (1LL << 31) - 1, "worker",
          "First traced step; a tensor's step is the number of its push_pulls completed before."),
      Int("BYTEPS_TRACE_END_STEP", "20", 1, (1LL << 31) - 1, "worker",
          "First step not traced (must be larger than BYTEPS_TRACE_START_STEP); the file is "
          "written once every traced tensor has completed step END-1, or at shutdown."),
      Str("BYTEPS_TRACE_DIR", "./trace", "worker,launcher",
          "Directory of the timeline: <dir>/<local_rank>/comm.json. bpslaunch --workers N>1 "
          "gives worker machine w its own <dir>/worker<w>."),
      Bool("BYTEPS_TELEMETRY_ON", "1", "worker",
           "Record push_pull throughput: per-tensor counters (byteps.basics.get_telemetry) and "
           "the samples of get_pushpull_speed."),
      Float("BYTEPS_TELEMETRY_INTERVAL", "10", 0.001, 1e6, "worker",
            "Seconds of push_pull traffic per get_pushpull_speed sample (upstream: fixed 10)."),
      // --- logging ---
      Choice("BYTEPS_LOG_LEVEL", "WARNING",
             {"TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL", "trace", "debug", "info",
              "warning", "error", "fatal"},
             "all", "Log level of the core (lines are prefixed with role and rank)."),
      Bool("BYTEPS_LOG_HIDE_TIME", "0", "all", "Omit timestamps from log lines."),
  };
}

bool ParseBool(const std::string& v, bool* out) {
  static const char* kTrue[] = {"1", "true", "True", "TRUE", "yes", "on", "y"};
  static const char* kFalse[] = {"0", "false", "False", "FALSE", "no", "off", "n", ""};
  for (auto* t : kTrue)
    if (v == t) return *out = true, true;
  for (auto* f : kFalse)
    if (v == f) return *out = false, true;
  return false;
}

std::string Describe(const KnobSpec& k) {
  std::ostringstream os;
  switch (k.type) {
    case KnobType::kInt: os << "an integer"; break;
    case KnobType::kFloat: os << "a number"; break;
    case KnobType::kBool: os << "a boolean (0/1, true/false)"; return os.str();
    case KnobType::kString: return "a string";
    case KnobType::kChoice: {
      os << "one of ";
      for (size_t i = 0; i < k.choices.size(); ++i) os << (i ? ", " : "") << k.choices[i];
      return os.str();
    }
  }
  if (k.min <= k.max) os << " in [" << static_cast<long long>(k.min) << ", "
                         << static_cast<long long>(k.max) << "]";
  return os.str();
}

Status Validate(const KnobSpec& k, const std::string& v, const std::string& from) {
  auto bad = [&]() {
    return Status::Config("invalid value '" + v + "' for " + from + ": expected " + Describe(k) +
                          " (" + k.doc + ")");
  };
  switch (k.type) {
    case KnobType::kInt: {
      if (v.empty()) return bad();
      errno = 0;
      char* end = nullptr;
      long long x = strtoll(v.c_str(), &end, 10);
      if (errno || *end != '\0') return bad();
      if (k.min <= k.max && (x < k.min || x > k.max)) return bad();
      return Status::OK();
    }
    case KnobType::kFloat: {
      if (v.empty()) return bad();
      errno = 0;
      char* end = nullptr;
      double x = strtod(v.c_str(), &end);
      if (errno || *end != '\0' || !std::isfinite(x)) return bad();
      if (k.min <= k.max && (x < k.min || x > k.max)) return bad();
      return Status::OK();
    }
    case KnobType::kBool: {
      bool b;
      return ParseBool(v, &b) ? Status::OK() : bad();
    }
    case KnobType::kString: return Status::OK();
    case KnobType::kChoice:
      for (auto& c : k.choices)
        if (c == v) return Status::OK();
      return bad();
  }
  return bad();
}

}  // namespace

const std::vector<KnobSpec>& AllKnobs() {
  static const std::vector<KnobSpec>* table = new std::vector<KnobSpec>(BuildTable());
  return *table;
}

const KnobSpec* FindKnob(const std::string& name) {
  for (auto& k : AllKnobs())
    if (k.name == name) return &k;
  return nullptr;
}

const char* KnobTypeName(KnobType t) {
  switch (t) {
    case KnobType::kInt: return "int";
    case KnobType::kFloat: return "float";
    case KnobType::kBool: return "bool";
    case KnobType::kString: return "string";
    case KnobType::kChoice: return "choice";
  }
  return "?";
}

Status Knobs::FromEnvironment(Knobs* out) {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    auto eq = kv.find('=');
    if (eq == std::string::npos) continue;
    std::string key = kv.substr(0, eq);
    if (IsWatchedName(key)) env[key] = kv.substr(eq + 1);
  }
  return FromMap(env, out);
}

Status Knobs::FromMap(const std::map<std::string, std::string>& env, Knobs* out) {
  Knobs k;
  for (auto& spec : AllKnobs()) {
    std::string from = spec.name;
    auto it = env.find(spec.name);
    for (size_t a = 0; it == env.end() && a < spec.aliases.size(); ++a) {
      it = env.find(spec.aliases[a]);
      from = spec.aliases[a];
    }
    bool set = it != env.end();
    std::string value = set ? it->second : spec.default_value;
    if (set || !value.empty()) BPS_RETURN_IF_ERROR(Validate(spec, value, from));
    k.raw_[spec.name] = value;
    k.set_[spec.name] = set;
  }
  BPS_RETURN_IF_ERROR(CheckEnvironmentNames(env, &k.notices_));
  *out = std::move(k);
  return Status::OK();
}

int64_t Knobs::Int(const std::string& name) const {
  auto it = raw_.find(name);
  return (it == raw_.end() || it->second.empty()) ? 0 : strtoll(it->second.c_str(), nullptr, 10);
}
double Knobs::Float(const std::string& name) const {
  auto it = raw_.find(name);
  return (it == raw_.end() || it->second.empty()) ? 0.0 : strtod(it->second.c_str(), nullptr);
}
bool Knobs::Bool(const std::string& name) const {
  auto it = raw_.find(name);
  bool b = false;
  if (it != raw_.end()) ParseBool(it->second, &b);
  return b;
}
const std::string& Knobs::Str(const std::string& name) const {
  static const std::string kEmpty;
  auto it = raw_.find(name);
  return it == raw_.end() ? kEmpty : it->second;
}
bool Knobs::IsSet(const std::string& name) const {
  auto it = set_.find(name);
  return it != set_.end() && it->second;
}

}  // namespace byteps
