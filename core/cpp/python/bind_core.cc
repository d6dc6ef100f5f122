// byteps._core: the worker API (init, ranks, push_pull, handles).
#include <cstdint>
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <string>

#include "bindings.h"
#include "common/dtype.h"
#include "compress/compressor.h"
#include "pipeline/api.h"
#include "pipeline/engine_bridge.h"
#include "reduce/sum.h"
#include "scheduling/autotune_search.h"
#include "scheduling/partitioner.h"
#include "scheduling/push_window.h"

namespace py = pybind11;

namespace byteps {
namespace python {
namespace {

std::shared_ptr<WorkerCore> Require() {
  auto core = CoreInstance();
  if (!core) ThrowStatus(Status::Shutdown("byteps is not initialised: call init() first"));
  return core;
}

PushPullArgs ParseArgs(const std::string& name, uintptr_t input, uintptr_t output, size_t nbytes,
                       const std::string& dtype, std::vector<int64_t> shape, bool average,
                       const py::object& priority, const std::string& op) {
  PushPullArgs a;
  if (!ParseDType(dtype, &a.dtype))
    ThrowInvalidType("unsupported dtype '" + dtype + "'; supported: " + SupportedDTypeNames());
  if (!reduce::ParseReduceOp(op, &a.op))
    ThrowInvalidArgument("unsupported op '" + op + "' (sum, min, max, product)");
  a.name = name;
  a.input = reinterpret_cast<char*>(input);
  a.output = reinterpret_cast<char*>(output);
  a.nbytes = nbytes;
  a.shape = std::move(shape);
  a.average = average;
  a.has_priority = !priority.is_none();
  if (a.has_priority) {
    // Python and NumPy integers (__index__); a bool, float or str is refused, not cast.
    if (!PyIndex_Check(priority.ptr()) || py::isinstance<py::bool_>(priority))
      ThrowInvalidType("priority must be an int or None, got " +
                       std::string(Py_TYPE(priority.ptr())->tp_name));
    try {
      a.priority = py::int_(priority).cast<int64_t>();
    } catch (const py::cast_error&) {
      ThrowInvalidArgument("priority " + std::string(py::str(priority)) +
                           " does not fit in 64 bits");
    }
  }
  return a;
}

}  // namespace

void BindCore(py::module_& m) {
  m.def("init", []() {
    Status st;
    {
      py::gil_scoped_release nogil;
      st = CoreInit();
    }
    Check(st);
  });
  m.def("shutdown", []() {
    py::gil_scoped_release nogil;
    CoreShutdown();
  });
  m.def("is_initialized", []() { return CoreInstance() != nullptr; });
  m.def("rank", []() { return Require()->config().rank; });
  m.def("size", []() { return Require()->config().size; });
  m.def("local_rank", []() { return Require()->config().local_rank; });
  m.def("local_size", []() { return Require()->config().local_size; });
  m.def("num_worker", []() { return Require()->config().num_worker; });
  m.def("worker_id", []() { return Require()->config().worker_id; });
  m.def("rank_given", []() { return Require()->config().rank_given; });
  m.def("is_distributed", []() { return Require()->config().distributed; });
  // (servers, CPU-only servers) of the job's address book: the cost model's k (docs/schemes.md).
  m.def("server_placement", []() { return Require()->ServerPlacement(); });
  // Whether a tensor of nbytes declared with a compressor is compressed in this job (so that
  // BYTEPS_SYNC=auto gives it the summation service, the only scheme that carries it).
  m.def("compresses", [](size_t nbytes) { return Require()->Compresses(nbytes); },
        py::arg("nbytes"));
  // The adaptive push window (scheduling/push_window.h): the rule the PUSH stage follows, for
  // the simulator (byteps.sim) and the tests to feed acknowledgements of their own.
  m.attr("ADAPTIVE_CREDIT_MAX_BOUNDS") = kAdaptiveCreditMaxBounds;
  py::class_<PushWindow>(m, "PushWindow")
      .def(py::init([](size_t start, size_t min_bytes, size_t max_bytes, double low, double high) {
             PushWindow::Config c;
             c.start_bytes = start;
             c.min_bytes = min_bytes;
             c.max_bytes = max_bytes;
             c.low = low;
             c.high = high;
             return std::make_unique<PushWindow>(c);
           }),
           py::arg("start_bytes"), py::arg("min_bytes"), py::arg("max_bytes"), py::arg("low") = 2.0,
           py::arg("high") = 4.0)
      .def("on_send", &PushWindow::OnSend, py::arg("path"), py::arg("local"), py::arg("bytes"))
      .def("on_ack", &PushWindow::OnAck, py::arg("path"), py::arg("bytes"), py::arg("delay_ns"),
           py::arg("limited"))
      .def("on_lost", &PushWindow::OnLost, py::arg("path"), py::arg("bytes"))
      .def_property_readonly("window", &PushWindow::window)
      .def_property_readonly("mean_window", &PushWindow::mean_window)
      .def_property_readonly("changes", &PushWindow::changes);

  m.def("push_credit", []() {
    auto [adaptive, window, mean, changes] = Require()->PushCredit();
    py::dict d;
    d["adaptive"] = adaptive;
    d["window_bytes"] = window;
    d["mean_window_bytes"] = mean;
    d["changes"] = changes;
    return d;
  });
  // BYTEPS_ENABLE_ASYNC and BYTEPS_ASYNC_MAX_STALENESS of the running worker (docs/async.md).
  m.def("async_mode", []() { return Require()->config().async_mode; });
  m.def("max_staleness", []() { return Require()->config().max_staleness; });
  m.def("declared_names", []() { return Require()->DeclaredNames(); });
  m.def("rounds", [](const std::string& name) { return Require()->Rounds(name); },
        py::arg("name"));
  // The search of BYTEPS_AUTOTUNE, for tests (scheduling/autotune_search.h): points are
  // (partition_bytes, credit) tuples.
  py::class_<AutotuneSearch>(m, "AutotuneSearch")
      .def(py::init([](std::pair<int64_t, int64_t> start, std::vector<int64_t> partitions,
                       std::vector<int64_t> credits, int max_trials) {
             return AutotuneSearch({start.first, start.second}, std::move(partitions),
                                   std::move(credits), max_trials);
           }),
           py::arg("start"), py::arg("partitions"), py::arg("credits"), py::arg("max_trials"))
      .def("next", [](AutotuneSearch& s) -> py::object {
        TunePoint p;
        if (!s.Next(&p)) return py::none();
        return py::make_tuple(p.partition_bytes, p.credit);
      })
      .def("report", [](AutotuneSearch& s, std::pair<int64_t, int64_t> p, double seconds) {
        s.Report({p.first, p.second}, seconds);
      })
      .def("best", [](AutotuneSearch& s) {
        TuneTrial t = s.Best();
        return py::make_tuple(py::make_tuple(t.point.partition_bytes, t.point.credit), t.seconds);
      })
      .def_static("default_grid", []() {
        return py::make_tuple(DefaultPartitionGrid(), DefaultCreditGrid());
      });
  m.def("autotune_status", []() {  // BYTEPS_AUTOTUNE's trials and choice (docs/autotune.md)
    AutotuneReport r = Require()->AutotuneStatus();
    auto point = [](const TunePoint& p, double s) {
      py::dict d;
      d["partition_bytes"] = p.partition_bytes;
      d["credit"] = p.credit;
      if (s > 0) d["iteration_s"] = s;
      return d;
    };
    py::dict d;
    d["enabled"] = r.enabled;
    d["done"] = r.done;
    d["error"] = r.error;
    py::list trials;
    for (auto& t : r.trials) trials.append(point(t.point, t.seconds));
    d["trials"] = trials;
    d["choice"] = r.done ? py::object(point(r.choice.point, r.choice.seconds)) : py::none();
    d["current"] = point(r.current, 0);
    return d;
  });
  m.def(
      "declare",
      [](const std::string& name, const std::string& compression, const std::string& sync,
         uint32_t process_set) {
        uint32_t key = 0;
        Check(Require()->Declare(name, compression, &key, sync, process_set));
        return key;
      },
      py::arg("name"), py::arg("compression") = std::string(), py::arg("sync") = std::string(),
      py::arg("process_set") = 0);
  m.def("format_compression", [](const std::map<std::string, std::string>& kwargs) {
    return compress::FormatSpec(kwargs);
  });
  m.def("set_learning_rate", [](double lr) { compress::SetLearningRate(lr); });
  m.def("learning_rate", []() { return compress::LearningRate(); });
  m.def(
      "push_pull_async",
      [](const std::string& name, uintptr_t input, uintptr_t output, size_t nbytes,
         const std::string& dtype, std::vector<int64_t> shape, bool average, py::object priority,
         int version, const std::string& device, int device_id, uintptr_t ready_event,
         const std::string& op, const std::string& collective, std::vector<uint64_t> blocks,
         int root, int root_rank, uint32_t process_set, std::vector<int> set_machines,
         int set_size) {
        PushPullArgs a = ParseArgs(name, input, output, nbytes, dtype, std::move(shape), average,
                                   priority, op);
        (void)version;
        // allgather, broadcast, reducescatter (docs/collectives.md): their layout.
        if (!ParseCollective(collective, &a.layout.kind))
          ThrowInvalidArgument("unsupported collective '" + collective +
                               "' (allreduce, allgather, broadcast, reducescatter)");
        a.layout.blocks = std::move(blocks);
        a.layout.root = root;
        a.layout.root_rank = root_rank;
        // A process set's operation (docs/collectives.md, "Process sets").
        a.process_set = process_set;
        a.set_machines = std::move(set_machines);
        a.set_size = set_size;
        // A device tensor (docs/gpu.md): "cuda", or "fake" (the tests' fake device).
        if (!device::ParseKind(device, &a.device_kind))
          ThrowInvalidType("unsupported device '" + device + "' (cpu, cuda, fake)");
        a.device_id = device_id;
        a.ready_event = reinterpret_cast<device::Event>(ready_event);
        int64_t handle = 0;
        Check(Require()->Enqueue(a, &handle));
        return handle;
      },
      py::arg("name"), py::arg("input"), py::arg("output"), py::arg("nbytes"), py::arg("dtype"),
      py::arg("shape"), py::arg("average"), py::arg("priority") = py::none(),
      py::arg("version") = 0, py::arg("device") = "cpu", py::arg("device_id") = 0,
      py::arg("ready_event") = 0, py::arg("op") = "sum", py::arg("collective") = "allreduce",
      py::arg("blocks") = std::vector<uint64_t>{}, py::arg("root") = -1,
      py::arg("root_rank") = -1, py::arg("process_set") = 0,
      py::arg("set_machines") = std::vector<int>{}, py::arg("set_size") = 0);
  m.def(
      "engine_op",
      [](const std::string& name, uintptr_t input, uintptr_t output, size_t nbytes,
         const std::string& dtype, std::vector<int64_t> shape, bool average,
         py::object priority, uintptr_t ndarray, std::vector<uintptr_t> mxnet_api,
         const std::string& reduce_op) {
        Require();
        auto op = std::make_unique<EngineOp>();
        op->args = ParseArgs(name, input, output, nbytes, dtype, std::move(shape), average,
                             priority, reduce_op);
        if (ndarray) {
          if (mxnet_api.size() != 4 || !mxnet_api[0] || !mxnet_api[1] || !mxnet_api[2] ||
              !mxnet_api[3])
            ThrowInvalidArgument("engine_op: an NDArray needs the 4 libmxnet functions "
                                  "(ToDLPack, CallDLPackDeleter, NDArrayFree, GetLastError)");
          op->ndarray = reinterpret_cast<void*>(ndarray);
          op->api.to_dlpack = reinterpret_cast<int (*)(void*, void**)>(mxnet_api[0]);
          op->api.call_dlpack_deleter = reinterpret_cast<int (*)(void*)>(mxnet_api[1]);
          op->api.ndarray_free = reinterpret_cast<int (*)(void*)>(mxnet_api[2]);
          op->api.get_last_error = reinterpret_cast<const char* (*)()>(mxnet_api[3]);
        }
        return reinterpret_cast<uintptr_t>(op.release());
      },
      py::arg("name"), py::arg("input"), py::arg("output"), py::arg("nbytes"), py::arg("dtype"),
      py::arg("shape"), py::arg("average"), py::arg("priority") = py::none(),
      py::arg("ndarray") = 0, py::arg("mxnet_api") = std::vector<uintptr_t>{},
      py::arg("op") = "sum",
      "A push_pull for a framework engine (engine_bridge.h): returns the address of a new "
      "operation record for byteps_engine_push_pull, freed by byteps_engine_op_delete. With "
      "`ndarray` (an MXNet NDArray handle the record then owns) the buffer is looked up when "
      "the operation runs, through `mxnet_api` = addresses of (MXNDArrayToDLPack, "
      "MXNDArrayCallDLPackDeleter, MXNDArrayFree, MXGetLastError).");
  m.def(
      "engine_entry_points",
      []() {
        return py::make_tuple(reinterpret_cast<uintptr_t>(&byteps_engine_push_pull),
                              reinterpret_cast<uintptr_t>(&byteps_engine_op_delete));
      },
      "Addresses of (byteps_engine_push_pull, byteps_engine_op_delete): MXNet's EngineAsyncFunc "
      "and EngineFuncParamDeleter.");
  m.def("poll", [](int64_t handle) {
    bool done = false;
    Check(Require()->handles().Poll(handle, &done));
    return done;
  });
  m.def(
      "wait",
      [](int64_t handle, double timeout_s) {
        auto core = Require();
        Status st;
        {
          py::gil_scoped_release nogil;
          st = core->handles().Wait(handle, timeout_s);
        }
        Check(st);
      },
      py::arg("handle"), py::arg("timeout") = -1.0);
  m.def("release", [](int64_t handle) { Require()->handles().Release(handle); });
  m.def("join", []() {  // Horovod's join (docs/collectives.md): the rank that joined last
    auto core = Require();
    int last = -1;
    Status st;
    {
      py::gil_scoped_release nogil;
      st = core->Join(&last);
    }
    Check(st);
    return last;
  });
}

}  // namespace python
}  // namespace byteps
