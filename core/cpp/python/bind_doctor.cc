// byteps._core.doctor: what `python -m byteps.doctor` reports about this build and host.
#include <pybind11/stl.h>

#include "bindings.h"
#include "comm/socket_util.h"

namespace py = pybind11;

namespace byteps {
namespace python {

void BindDoctor(py::module_& m) {
  py::module_ d = m.def_submodule("doctor", "Facts about this build and host for byteps.doctor.");
  d.def("vans", []() { return std::vector<std::string>{"tcp"}; },
        "Transports (vans) compiled into this build, by the name that selects them.");
  d.def("interface_addresses", &InterfaceAddresses,
        "Every (interface, IPv4 address) of this host: list of (str, str).");
  d.def("interface_address", &InterfaceAddress, py::arg("name"),
        "IPv4 address of the interface `name` (what DMLC_INTERFACE selects), or '' if none.");
  d.def(
      "route_address",
      [](const std::string& host, int port) -> py::tuple {
        std::string why;
        std::string addr = RouteAddressTo(host, port, &why);
        return py::make_tuple(addr, why);
      },
      py::arg("host"), py::arg("port") = 0,
      "(local IPv4 address on the route to host, '') or ('', why): the address a node "
      "advertises when neither DMLC_NODE_HOST nor DMLC_INTERFACE is set.");
}

}  // namespace python
}  // namespace byteps
