// byteps._core: entry point of server and scheduler processes (python -m byteps.server).
#include "bindings.h"
#include "ps/node_main.h"

namespace py = pybind11;

namespace byteps {
namespace python {

void BindServer(py::module_& m) {
  m.def(
      "run_node",
      []() {
        Status st;
        {
          py::gil_scoped_release nogil;
          st = RunNodeFromEnvironment();
        }
        Check(st);
      },
      "Runs a server or the scheduler, by DMLC_ROLE, until the job ends. Raises ConfigError for "
      "bad variables and PeerLostError / BytePSTimeoutError when the job fails.");
}

}  // namespace python
}  // namespace byteps
