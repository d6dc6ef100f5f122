// byteps._core_testing: direct access to core pieces for unit tests (partitioner, scheduled
// queue, key plan, all-reduce programs, frame codec, the job secret; the server's round logic
// in bind_rounds.cc). Not a public API.
#include <cstdint>
#include <pybind11/stl.h>

#include <chrono>
#include <cstring>

#include "testing_bindings.h"
#include "comm/auth.h"
#include "comm/frame.h"
#include "ps/control_msgs.h"
#include "ps/key_plan.h"
#include "ps/sync_scheme.h"
#include "ps/protocol.h"
#include "scheduling/partitioner.h"
#include "scheduling/scheduled_queue.h"

namespace py = pybind11;

namespace byteps {
namespace python {

void BindUnits(py::module_& m) {
  m.def(
      "set_job_secret", [](const std::string& secret) { SetJobSecret(secret); },
      py::arg("secret"),
      "Installs the process-wide job secret ('' = none: no handshake), as init() and a "
      "P2pChannel do; tests that made channels restore the process with it.");
  m.def("partition", [](size_t nbytes, size_t bound, size_t elem_size) {
    std::vector<Partition> parts;
    Check(PartitionTensor(nbytes, bound, elem_size, &parts));
    std::vector<std::tuple<uint32_t, size_t, size_t>> out;
    for (auto& p : parts) out.emplace_back(p.index, p.offset, p.length);
    return out;
  });
  m.def(
      "pack_server_times",
      [](uint64_t wait_us, uint64_t sum_us) {
        const uint64_t aux = PackServerTimes(wait_us, sum_us);
        return py::make_tuple(aux, ServerWaitUs(aux), ServerSumUs(aux));
      },
      py::arg("wait_us"), py::arg("sum_us"),
      "A traced round's times as a PULL_RESPONSE's aux carries them (PackServerTimes, "
      "ps/protocol.h): (aux, wait_us, sum_us) as a worker reads them back.");
  m.def("partition_key", &PartitionKey, py::arg("declared_key"), py::arg("index"),
        py::arg("generation") = 0);
  m.def(
      "staggered_push_order",
      [](uint32_t partitions, int worker) {
        std::vector<uint32_t> position(partitions);
        for (uint32_t i = 0; i < partitions; ++i)
          position[i] = StaggeredPushPosition(i, partitions, worker);
        return position;
      },
      py::arg("partitions"), py::arg("worker"),
      "Position of each of a tensor's partitions in worker machine `worker`'s push sequence "
      "(StaggeredPushPosition, scheduling/partitioner.h): list of int.");
  m.def("shard_range", [](size_t count, int parts, int i) {
    size_t b, e;
    ShardRange(count, parts, i, &b, &e);
    return py::make_tuple(b, e);
  });

  py::class_<ScheduledQueue>(m, "ScheduledQueue")
      .def(py::init<std::string, size_t>(), py::arg("name"), py::arg("credit_bytes"))
      .def("push", [](ScheduledQueue& q, int64_t priority, uint64_t key, size_t bytes) {
        q.Push(QueueItem{priority, key, bytes, nullptr});
      })
      .def("try_pop", [](ScheduledQueue& q) -> py::object {
        QueueItem it;
        if (!q.TryPop(&it)) return py::none();
        return py::make_tuple(it.priority, it.key, it.bytes);
      })
      .def("pop", [](ScheduledQueue& q, int timeout_ms) -> py::object {
        QueueItem it;
        bool ok;
        {
          py::gil_scoped_release nogil;
          ok = q.Pop(&it, std::chrono::milliseconds(timeout_ms));
        }
        if (!ok) return py::none();
        return py::make_tuple(it.priority, it.key, it.bytes);
      })
      .def("return_credit", &ScheduledQueue::ReturnCredit)
      .def("return_credit_and_try_pop", [](ScheduledQueue& q, size_t bytes) -> py::object {
        QueueItem it;
        if (!q.ReturnCreditAndTryPop(bytes, &it)) return py::none();
        return py::make_tuple(it.priority, it.key, it.bytes);
      })
      .def("close", &ScheduledQueue::Close)
      .def("__len__", &ScheduledQueue::size)
      .def_property_readonly("in_flight_bytes", &ScheduledQueue::in_flight_bytes);

  // The all-reduce programs (ps/sync_scheme.h): a list of (kind, peer, tag, offset, length,
  // scratch, from_input) per op, kind "send" | "recv_sum" | "recv_copy".
  m.def(
      "coll_program",
      [](const std::string& scheme, int n, int width, int me, size_t bytes, size_t elem_size) {
        SyncScheme s;
        if (!ParseSyncScheme(scheme, &s)) ThrowInvalidArgument("unknown scheme " + scheme);
        CollProgram p = BuildCollProgram(s, n, width, me, bytes, elem_size);
        py::list ops;
        static const char* kinds[] = {"send", "recv_sum", "recv_copy"};
        for (const CollOp& op : p.ops)
          ops.append(py::make_tuple(kinds[op.kind], op.peer, op.tag, op.offset, op.length,
                                    op.scratch, op.from_input));
        py::dict d;
        d["ops"] = ops;
        d["scratch_bytes"] = p.scratch_bytes;
        d["gather_begin"] = p.gather_begin;
        d["initial_sends"] = p.initial_sends;
        return d;
      },
      py::arg("scheme"), py::arg("n"), py::arg("width"), py::arg("me"), py::arg("bytes"),
      py::arg("elem_size"));
  m.def("collective_peers", &CollectivePeers, py::arg("n"), py::arg("width"), py::arg("me"));
  m.def("server_shares", &ServerShares, py::arg("num_worker_machines"), py::arg("colocated"));
  m.def("optimal_comm_time", &OptimalCommTime);
  py::class_<KeyPlanner>(m, "KeyPlanner")
      .def(py::init<std::vector<double>>())
      .def("assign", &KeyPlanner::Assign)
      .def_property_readonly("assigned_bytes", &KeyPlanner::assigned_bytes)
      .def("describe", &KeyPlanner::Describe);

  m.def("header_size", []() { return sizeof(FrameHeader); });
  m.def(
      "encode_header",
      [](uint16_t type, uint8_t dtype, uint32_t sender, uint32_t round, uint64_t key,
         uint64_t payload_len, uint64_t aux, uint32_t magic, uint64_t written) {
        FrameHeader h;
        h.magic = magic;
        h.written = written;
        h.type = type;
        h.dtype = dtype;
        h.sender = sender;
        h.round = round;
        h.key = key;
        h.payload_len = payload_len;
        h.aux = aux;
        return py::bytes(reinterpret_cast<const char*>(&h), sizeof(h));
      },
      py::arg("type"), py::arg("dtype") = 0, py::arg("sender") = 0, py::arg("round") = 0,
      py::arg("key") = 0, py::arg("payload_len") = 0, py::arg("aux") = 0,
      py::arg("magic") = kFrameMagic, py::arg("written") = 0);
  m.def("decode_header", [](py::bytes data) {
    std::string s = data;
    if (s.size() != sizeof(FrameHeader)) ThrowInvalidArgument("a header is 48 bytes");
    FrameHeader h;
    memcpy(&h, s.data(), sizeof(h));
    Check(ValidateFrame(h));     // what the van checks
    Check(ValidatePsHeader(h));  // what the PS layer checks before any handler looks
    py::dict d;
    d["type"] = h.type;
    d["type_name"] = MsgTypeName(TypeOf(h));
    d["dtype"] = h.dtype;
    d["sender"] = h.sender;
    d["round"] = h.round;
    d["key"] = h.key;
    d["payload_len"] = h.payload_len;
    d["aux"] = h.aux;
    d["written"] = h.written;
    return d;
  });
  m.def("encode_declare", [](uint32_t key, const std::string& name, uint8_t dtype,
                             std::vector<int64_t> shape, uint64_t nbytes) {
    DeclareMsg d{key, name, dtype, std::move(shape), nbytes};
    return py::bytes(Encode(d));
  });
  m.def("encode_key_config", [](uint8_t dtype, uint64_t count, const std::string& compression) {
    KeyConfigMsg k;
    k.dtype = dtype;
    k.count = count;
    k.compression = compression;
    return py::bytes(Encode(k));
  });
  m.def("decode_key_config", [](py::bytes data) {
    std::string s = data;
    KeyConfigMsg k;
    Check(Decode(s.data(), s.size(), &k));
    return py::make_tuple(k.dtype, k.count, k.compression);
  });
  m.def("decode_declare", [](py::bytes data) {
    std::string s = data;
    DeclareMsg d;
    Check(Decode(s.data(), s.size(), &d));
    return py::make_tuple(d.declared_key, d.name, d.dtype, d.shape, d.nbytes);
  });
  m.def("encode_register", [](uint8_t role, int32_t worker_id, const std::string& host,
                              uint32_t port, uint32_t local_size, uint32_t num_worker,
                              uint32_t num_server, uint64_t bound) {
    RegisterMsg r;
    r.role = static_cast<NodeRole>(role);
    r.worker_id = worker_id;
    r.host = host;
    r.port = port;
    r.local_size = local_size;
    r.num_worker = num_worker;
    r.num_server = num_server;
    r.partition_bound = bound;
    return py::bytes(Encode(r));
  });
  m.def("decode_register", [](py::bytes data) {
    std::string s = data;
    RegisterMsg r;
    Check(Decode(s.data(), s.size(), &r));
    return py::make_tuple(static_cast<int>(r.role), r.worker_id, r.host, r.port, r.local_size,
                          r.num_worker, r.num_server, r.partition_bound);
  });
}

}  // namespace python
}  // namespace byteps
