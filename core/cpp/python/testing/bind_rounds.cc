// byteps._core_testing.SummationRounds: the summation service's round logic
// (ps/summation_engine.h, docs/architecture.md §7) driven in process, without sockets, with an
// in-memory reply sink that records every answer. Not a public API.
//
//   r = SummationRounds(num_worker, partition_bound, engines=2, threaded=False, rank=0,
//                       fixed_staging=False)   fixed_staging: set_fixed_staging (no rotation)
//   r.push(key, worker, round, data, dtype="float32", pull=True) -> bool
//       PushBuffer then Push, as a server does for one PUSH frame (data: bytes, the payload).
//       False when refused (the worker got an error reply); raises InvalidArgumentError for a
//       push the server drops the connection for (larger than the partition bound).
//   r.push_buffer(key, worker, nbytes, dtype) -> bool   only PushBuffer (makes the key)
//   r.set_async(on, max_staleness=-1)   asynchronous mode (before the first push); then
//       push(..., async_key=True) is an asynchronous parameter's push, answered by a
//       ("value", worker, key, round, bytes) reply; r.worker_left(worker)
//   r.configure_key(key, worker, count, compression, dtype="float32")   a KEY_CONFIG
//       (compression: the canonical kwargs text); push(..., lr=) then carries the learning rate
//   r.pull(key, worker, round); r.stall_query(key, worker, round)
//   r.replies() -> [("sum" | "value", worker, key, round, bytes)
//                   | ("stall", worker, key, round, [ids])
//                   | ("error", worker, message)], in the order sent; takes them
//   r.wait_replies(n, timeout_s) -> bool: at least n replies are recorded (threaded mode)
//   r.key_state(key) -> dict | None; r.engine_loads; r.num_keys; r.stop()
//   r.retire(declared_key, generation) -> int   RETIRE_KEYS: frees the tensor's keys (bits
//       16-31) of generations (bits 32-47) below `generation`, on their engines
//   r.key_census() -> (keys held, of them of a tensor's older generation)
#include <cstdint>
#include <pybind11/stl.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "testing_bindings.h"
#include "ps/summation_engine.h"

namespace py = pybind11;

namespace byteps {
namespace python {
namespace {

class RecordingSink : public ReplySink {
 public:
  struct Reply {
    std::string kind;  // "sum", "stall", "error"
    int worker = 0;
    uint64_t key = 0;
    uint32_t round = 0;
    std::string data;  // the sum's bytes, or the error message
    std::vector<int> missing;
  };

  void SendSum(int worker, RoundKey& k, int parity) override {
    // Copied now: a worker has received a round once its reply is sent (the engine keeps the
    // buffer until every worker has, and a worker pushes its next round only after that).
    // A compressed key's reply is the encoded sum.
    Record({"sum", worker, k.key, k.round[parity],
            std::string(k.reply(parity), k.reply_len(parity)), {}});
  }
  void SendValue(int worker, RoundKey& k) override {
    Record({"value", worker, k.key, k.reply_round[worker],
            std::string(k.snapshot[worker], k.len), {}});
  }
  void SendStallReport(int worker, uint64_t key, uint32_t round,
                       const std::vector<int>& missing) override {
    Record({"stall", worker, key, round, {}, missing});
  }
  void SendError(int worker, const std::string& message) override {
    Record({"error", worker, 0, 0, message, {}});
  }

  std::vector<Reply> Take() {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<Reply> out;
    out.swap(replies_);
    return out;
  }
  bool Wait(size_t n, double timeout_s) {
    std::unique_lock<std::mutex> lk(mu_);
    return cv_.wait_for(lk, std::chrono::duration<double>(timeout_s),
                        [&] { return replies_.size() >= n; });
  }

 private:
  void Record(Reply r) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      replies_.push_back(std::move(r));
    }
    cv_.notify_all();
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Reply> replies_;
};

class Rounds {
 public:
  Rounds(int num_worker, uint64_t bound, int engines, bool threaded, int rank, bool fixed)
      : engine_(num_worker, engines, threaded, &sink_) {
    if (num_worker < 1 || engines < 1)
      ThrowInvalidArgument("SummationRounds needs num_worker >= 1 and engines >= 1");
    engine_.Configure(rank, bound);
    engine_.set_fixed_staging(fixed);
    engine_.Start();
  }
  SummationEngine& engine() { return engine_; }
  RecordingSink& sink() { return sink_; }

 private:
  RecordingSink sink_;  // before engine_: the engine's threads stop before the sink goes
  SummationEngine engine_;
};

DType ParseName(const std::string& name) {
  DType t;
  if (!ParseDType(name, &t)) ThrowInvalidType("unsupported dtype '" + name + "'");
  return t;
}

void CheckWorker(Rounds& r, int worker) {
  if (worker < 0 || worker >= r.engine().num_worker())
    ThrowInvalidArgument("worker " + std::to_string(worker) + " out of range");
}

py::object KeyState(Rounds& r, uint64_t key) {
  const RoundKey* k = r.engine().Find(key);
  if (!k) return py::none();
  py::dict d;
  d["dtype"] = DTypeName(k->dtype);
  d["len"] = k->len;
  d["engine"] = k->engine;
  d["round"] = std::vector<uint32_t>{k->round[0], k->round[1]};
  d["opened"] = std::vector<bool>{k->opened[0], k->opened[1]};
  d["count"] = std::vector<int>{k->count[0], k->count[1]};
  d["complete"] = std::vector<bool>{k->complete[0], k->complete[1]};
  d["waiting"] = std::vector<std::vector<int>>{k->waiting[0], k->waiting[1]};
  std::vector<std::vector<int>> pushed(2);
  for (int p = 0; p < 2; ++p) pushed[p].assign(k->pushed[p].begin(), k->pushed[p].end());
  d["pushed"] = pushed;
  // The bytes of the sum of the round each parity holds (meaningful once it is complete).
  const size_t sum_len = k->compressed() ? k->raw_len : k->len;
  d["sum"] = std::vector<py::bytes>{py::bytes(k->sum[0], sum_len),
                                    k->sum[1] ? py::bytes(k->sum[1], sum_len) : py::bytes()};
  d["compression"] = k->compression;
  // Where each worker's next push is received (addresses: fixed slots never move).
  std::vector<uintptr_t> staging;
  for (const auto& p : k->staging) staging.push_back(reinterpret_cast<uintptr_t>(p.load()));
  d["staging"] = staging;
  d["fixed_staging"] = k->fixed_staging;
  d["async"] = k->async;
  if (k->async) {
    d["initialized"] = k->initialized;
    d["version"] = k->version;
    d["worker_round"] = k->worker_round;
    d["held"] = k->held;
    d["store"] = py::bytes(k->sum[0], k->len);
  }
  return d;
}

}  // namespace

void BindRounds(py::module_& m) {
  py::class_<Rounds>(m, "SummationRounds")
      .def(py::init<int, uint64_t, int, bool, int, bool>(), py::arg("num_worker"),
           py::arg("partition_bound"), py::arg("engines") = 2, py::arg("threaded") = false,
           py::arg("rank") = 0, py::arg("fixed_staging") = false)
      .def(
          "push",
          [](Rounds& r, uint64_t key, int worker, uint32_t round, py::bytes data,
             const std::string& dtype, bool pull, double lr, bool async_key) {
            CheckWorker(r, worker);
            std::string payload = data;
            DType dt = ParseName(dtype);
            char* dest = nullptr;
            Check(r.engine().PushBuffer(key, dt, payload.size(), worker, &dest, nullptr, async_key));
            if (!dest) return false;
            if (!payload.empty()) memcpy(dest, payload.data(), payload.size());
            py::gil_scoped_release nogil;
            r.engine().Push(key, dt, payload.size(), worker, round, pull, lr, async_key);
            return true;
          },
          py::arg("key"), py::arg("worker"), py::arg("round"), py::arg("data"),
          py::arg("dtype") = "float32", py::arg("pull") = true, py::arg("lr") = 0.0,
          py::arg("async_key") = false)
      .def(
          "set_async",
          [](Rounds& r, bool on, int64_t max_staleness) {
            r.engine().SetAsync(on, max_staleness);
          },
          py::arg("on"), py::arg("max_staleness") = -1)
      .def(
          "worker_left",
          [](Rounds& r, int worker) {
            CheckWorker(r, worker);
            py::gil_scoped_release nogil;
            r.engine().WorkerLeft(worker);
          },
          py::arg("worker"))
      .def(
          "configure_key",
          [](Rounds& r, uint64_t key, int worker, uint64_t count, const std::string& compression,
             const std::string& dtype) {
            CheckWorker(r, worker);
            KeyConfigMsg m;
            m.dtype = static_cast<uint8_t>(ParseName(dtype));
            m.count = count;
            m.compression = compression;
            py::gil_scoped_release nogil;
            r.engine().ConfigureKey(key, m, worker);
          },
          py::arg("key"), py::arg("worker"), py::arg("count"), py::arg("compression"),
          py::arg("dtype") = "float32")
      .def(
          "push_buffer",
          [](Rounds& r, uint64_t key, int worker, uint64_t nbytes, const std::string& dtype) {
            CheckWorker(r, worker);
            char* dest = nullptr;
            Check(r.engine().PushBuffer(key, ParseName(dtype), nbytes, worker, &dest));
            return dest != nullptr;
          },
          py::arg("key"), py::arg("worker"), py::arg("nbytes"), py::arg("dtype") = "float32")
      .def(
          "pull",
          [](Rounds& r, uint64_t key, int worker, uint32_t round) {
            CheckWorker(r, worker);
            py::gil_scoped_release nogil;
            r.engine().Pull(key, worker, round);
          },
          py::arg("key"), py::arg("worker"), py::arg("round"))
      .def(
          "stall_query",
          [](Rounds& r, uint64_t key, int worker, uint32_t round) {
            CheckWorker(r, worker);
            py::gil_scoped_release nogil;
            r.engine().StallQuery(key, worker, round);
          },
          py::arg("key"), py::arg("worker"), py::arg("round"))
      .def("replies",
           [](Rounds& r) {
             py::list out;
             for (auto& x : r.sink().Take()) {
               if (x.kind == "sum" || x.kind == "value")
                 out.append(py::make_tuple(x.kind, x.worker, x.key, x.round, py::bytes(x.data)));
               else if (x.kind == "stall")
                 out.append(py::make_tuple(x.kind, x.worker, x.key, x.round, x.missing));
               else
                 out.append(py::make_tuple(x.kind, x.worker, x.data));
             }
             return out;
           })
      .def(
          "wait_replies",
          [](Rounds& r, size_t n, double timeout_s) {
            py::gil_scoped_release nogil;
            return r.sink().Wait(n, timeout_s);
          },
          py::arg("n"), py::arg("timeout_s"))
      .def("key_state", &KeyState, py::arg("key"))
      .def_property_readonly("engine_loads",
                             [](Rounds& r) {
                               std::vector<uint64_t> loads;
                               for (int i = 0; i < r.engine().num_engines(); ++i)
                                 loads.push_back(r.engine().engine_load(i));
                               return loads;
                             })
      .def_property_readonly("num_keys", [](Rounds& r) { return r.engine().num_keys(); })
      .def(
          "retire",
          [](Rounds& r, uint32_t declared_key, uint32_t generation) {
            return r.engine().Retire(declared_key, generation);
          },
          py::arg("declared_key"), py::arg("generation"))
      .def("key_census", [](Rounds& r) { return r.engine().KeyCensus(); })
      .def("stop", [](Rounds& r) {
        py::gil_scoped_release nogil;
        r.engine().Stop();
      });
}

}  // namespace python
}  // namespace byteps
