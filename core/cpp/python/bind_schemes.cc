// byteps._core: the synchronization schemes' shapes (ps/sync_scheme.h), the one definition that
// the cost model (byteps.sync.cost_formulas: what a scheme costs for n machines) and the
// simulator read, so that neither keeps a copy of its own.
//
//   tree_width(n, requested=0)       ResolveTreeWidth: BYTEPS_TREE_WIDTH for n machines
//   hips_group_size(n, requested=0)  HipsGroupSize: BYTEPS_HIPS_GROUP for n machines
#include <pybind11/pybind11.h>

#include "bindings.h"
#include "ps/sync_scheme.h"

namespace py = pybind11;

namespace byteps {
namespace python {

void BindSchemes(py::module_& m) {
  m.def(
      "tree_width",
      [](int n, int requested) {
        int width = 0;
        Check(ResolveTreeWidth(n, requested, &width));
        return width;
      },
      py::arg("n"), py::arg("requested") = 0,
      "The FlexTree width of a job of n worker machines (ResolveTreeWidth, ps/sync_scheme.h): "
      "requested (BYTEPS_TREE_WIDTH), which must divide n, or for 0 the largest divisor of n not "
      "above ceil(sqrt(n)). Raises byteps.errors.ConfigError naming the divisors otherwise.");
  m.def("hips_group_size", &HipsGroupSize, py::arg("n"), py::arg("requested") = 0,
        "The HiPS group size of a job of n worker machines (HipsGroupSize, ps/sync_scheme.h): "
        "requested (BYTEPS_HIPS_GROUP) at most n, or for 0 ceil(sqrt(n)).");
}

}  // namespace python
}  // namespace byteps
