#include "van.h"

#include "comm/tcp/tcp_van.h"
#include "common/knobs.h"
#ifdef BYTEPS_WITH_UCX
#include "comm/ucx/ucx_van.h"
#endif

namespace byteps {

std::vector<std::string> Van::Kinds() {
#ifdef BYTEPS_WITH_UCX
  return {"tcp", "ucx"};
#else
  return {"tcp"};
#endif
}

Status Van::Create(const std::string& kind, std::unique_ptr<Van>* out) {
  if (kind != "tcp" && kind != "ucx") {
    std::string kinds;
    for (const std::string& k : Kinds()) kinds += (kinds.empty() ? "" : ", ") + k;
    return Status::InvalidArgument("unknown van '" + kind + "' (this build has: " + kinds + ")");
  }
  VanSpec spec;
  spec.kind = kind;
  return Create(spec, out);
}

Status Van::Create(const VanSpec& spec, std::unique_ptr<Van>* out) {
  if (spec.kind == "tcp" && !spec.ipc) {
    *out = std::make_unique<TcpVan>();
    return Status::OK();
  }
#ifdef BYTEPS_WITH_UCX
  UcxVan::Options o;
  o.reach = spec.kind == "ucx" ? UcxVan::Reach::kAll : UcxVan::Reach::kColocated;
  o.require_rdma = spec.require_rdma;
  o.spin_s = spec.ucx_spin_s;
  o.one_way = spec.ucx_one_way == "0"   ? UcxOneWay::kOff
              : spec.ucx_one_way == "1" ? UcxOneWay::kOn
                                        : UcxOneWay::kAuto;
  return UcxVan::Create(o, out);
#else
  return Status::Config(
      "the " + spec.Describe() + " van needs UCX, and this byteps was built without it: install "
      "UCX's development files (Debian/Ubuntu: apt-get install libucx-dev pkg-config) and "
      "reinstall byteps from source, or select the TCP van (unset DMLC_ENABLE_RDMA, "
      "DMLC_ENABLE_UCX and BYTEPS_ENABLE_IPC)");
#endif
}

Status VanSpec::FromKnobs(const Knobs& k, VanSpec* out) {
  VanSpec spec;
  const std::string& rdma = k.Str("DMLC_ENABLE_RDMA");
  if (rdma == "ucx" || k.Bool("DMLC_ENABLE_UCX")) spec.kind = "ucx";
  if (rdma == "1" || rdma == "ibverbs") {
    spec.kind = "ucx";
    spec.require_rdma = true;
  }
  spec.ipc = k.Bool("BYTEPS_ENABLE_IPC");
  spec.ucx_spin_s = k.Float("BYTEPS_UCX_SPIN_US") * 1e-6;
  spec.ucx_one_way = k.Str("BYTEPS_UCX_ONE_WAY");
  *out = spec;
  return Status::OK();
}

std::string VanSpec::Describe() const {
  if (kind == "ucx") return require_rdma ? "ucx (rdma required)" : "ucx";
  return ipc ? "tcp + ipc" : "tcp";
}

}  // namespace byteps
