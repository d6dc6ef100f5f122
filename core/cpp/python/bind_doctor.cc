// byteps._core.doctor: what `python -m byteps.doctor` reports about this build and host.
#include <pybind11/stl.h>

#include "bindings.h"
#include "comm/socket_util.h"
#include "comm/van.h"
#include "common/knobs.h"
#ifdef BYTEPS_WITH_UCX
#include "comm/ucx/ucx_context.h"
#endif

namespace py = pybind11;

namespace byteps {
namespace python {

void BindDoctor(py::module_& m) {
  py::module_ d = m.def_submodule("doctor", "Facts about this build and host for byteps.doctor.");
  d.def("vans", &Van::Kinds,
        "Transports (vans) a job of this build can select, by the name that selects them "
        "(Van::Create's kinds).");
  d.def(
      "ucx_linked",
      []() {
#ifdef BYTEPS_WITH_UCX
        return true;
#else
        return false;
#endif
      },
      "Whether this build links UCX (and so has the UCX van).");
  d.def(
      "selected_van",
      [](const std::map<std::string, std::string>& env) {
        Knobs k;
        Check(Knobs::FromMap(env, &k));
        VanSpec spec;
        Check(VanSpec::FromKnobs(k, &spec));
        return spec.Describe();
      },
      py::arg("env"),
      "The van a process with environment `env` (dict of str) selects, as VanSpec::Describe "
      "names it: 'tcp', 'tcp + ipc', 'ucx' or 'ucx (rdma required)'. Raises ConfigError for a "
      "value no van answers to.");
  d.def(
      "ucx_info",
      []() -> py::object {
#ifdef BYTEPS_WITH_UCX
        UcxInfo info;
        {
          py::gil_scoped_release nogil;
          info = QueryUcxInfo();
        }
        py::dict out;
        out["version"] = info.version;
        out["tls"] = info.tls;
        out["net_devices"] = info.net_devices;
        out["resources"] = info.resources;
        std::vector<std::string> rdma;
        for (const std::string& r : info.resources)
          if (IsRdmaTransport(r)) rdma.push_back(r);
        out["rdma_resources"] = rdma;
        out["error"] = info.error.empty() ? py::object(py::none()) : py::object(py::str(info.error));
        return out;
#else
        return py::none();
#endif
      },
      "None in a build without UCX, else {version: UCX's version string, tls / net_devices: the "
      "UCX_TLS / UCX_NET_DEVICES values UCX uses, resources: ['tcp/eth0', 'posix/memory', ...] "
      "the transport/device pairs a UCX context gets after those filters, rdma_resources: those of "
      "them that are RDMA transports (IsRdmaTransport, the van's test for DMLC_ENABLE_RDMA=1 and "
      "BYTEPS_UCX_ONE_WAY=auto), error: why UCX could not start, or None}. Creates and destroys one UCX context; opens no connection.");
#ifdef BYTEPS_WITH_UCX
  d.def("is_rdma_transport", &IsRdmaTransport, py::arg("resource"),
        "Whether a UCX resource ('rc_mlx5/mlx5_0:1', 'tcp/eth0', ...) is an RDMA transport "
        "(IsRdmaTransport, comm/ucx/ucx_context.h): bool. Only in a build with UCX.");
#endif
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
