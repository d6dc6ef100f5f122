#include "comm/ucx/ucx_connection.h"

#include "comm/socket_util.h"
#include "comm/ucx/ucx_context.h"
#include "common/logging.h"

namespace byteps {

UcxConnection::UcxConnection(std::shared_ptr<UcxLink> link)
    : Connection(link->peer_name()), link_(std::move(link)) {
  link_->SetConnection(this);
}

UcxConnection::~UcxConnection() {
  link_->Close();
  link_->ForgetConnection();
}

void UcxConnection::Join() {
  if (!link_->Join(kJoinTimeoutS))
    BPS_LOG(WARNING) << "UCX link to " << peer_name() << " was not closed within "
                     << kJoinTimeoutS << " s";
}

std::string UcxConnection::LocalAddress() const {
  return link_->lifeline_fd() >= 0 ? LocalAddressOf(link_->lifeline_fd()) : "";
}

Status UcxConnection::ExportWindow(void* addr, size_t len, std::string* blob) {
  UcxContext* ctx = link_->Context();
  if (!ctx) return Status::PeerLost("UCX link to " + peer_name() + " is closed");
  return ctx->PackRemoteKey(link_.get(), addr, len, blob);
}

}  // namespace byteps
