// byteps._core: the partition rule (scheduling/partitioner.h), the one definition that the
// cost model (byteps.sync.cost_model: the schemes' pipeline fill) and the simulator
// (byteps.sim: how a tensor is cut) read, so neither keeps a copy of its own.
//
//   PIPELINE_DEPTH, SMALL_PARTITION_BYTES, PAGE_BYTES      kPipelineDepth, kSmallPartitionBytes,
//                                                           kPageBytes
//   partition_bound(partition_bytes, local_size=1)         PartitionBound: the job's bound
//   tensor_partition_bound(nbytes, job_bound, num_worker, local_size=1, compressed=False)
//                                                           TensorPartitionBound: one tensor's
#include <pybind11/pybind11.h>

#include <cstdint>

#include "bindings.h"
#include "scheduling/partitioner.h"

namespace py = pybind11;

namespace byteps {
namespace python {

void BindPartition(py::module_& m) {
  m.attr("PIPELINE_DEPTH") = kPipelineDepth;
  m.attr("SMALL_PARTITION_BYTES") = kSmallPartitionBytes;
  m.attr("PAGE_BYTES") = kPageBytes;
  m.def("partition_bound", &PartitionBound, py::arg("partition_bytes"), py::arg("local_size") = 1,
        "The job's partition bound, bytes: BYTEPS_PARTITION_BYTES (at least 1) rounded up to a "
        "multiple of PAGE_BYTES * local_size (PartitionBound, scheduling/partitioner.h).");
  m.def("tensor_partition_bound", &TensorPartitionBound, py::arg("nbytes"), py::arg("job_bound"),
        py::arg("num_worker"), py::arg("local_size") = 1, py::arg("compressed") = false,
        "The partition bound of one tensor of nbytes bytes in a distributed job of num_worker "
        "worker machines, bytes: job_bound, or for a tensor that job_bound would cut into fewer "
        "than PIPELINE_DEPTH * num_worker partitions, nbytes / (PIPELINE_DEPTH * num_worker) "
        "rounded down to a multiple of SMALL_PARTITION_BYTES (at least one), then to whole "
        "pages of PAGE_BYTES * local_size, never above job_bound; a compressed tensor's is "
        "job_bound (TensorPartitionBound, scheduling/partitioner.h).");
}

}  // namespace python
}  // namespace byteps
