#include "van.h"

#include "comm/tcp_van.h"

namespace byteps {

std::vector<std::string> Van::Kinds() { return {"tcp"}; }

Status Van::Create(const std::string& kind, std::unique_ptr<Van>* out) {
  if (kind == "tcp") {
    *out = std::make_unique<TcpVan>();
    return Status::OK();
  }
  std::string kinds;
  for (const std::string& k : Kinds()) kinds += (kinds.empty() ? "" : ", ") + k;
  return Status::InvalidArgument("unknown van '" + kind + "' (this build has: " + kinds + ")");
}

}  // namespace byteps
