// The UCX transport's Connection (comm/connection.h): a handle on a UcxLink (ucx_link.h), which
// the context keeps alive until its endpoint is closed. Destroying the handle closes the link;
// once the destructor returns no handler call refers to it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "comm/connection.h"
#include "comm/ucx/ucx_link.h"

namespace byteps {

class UcxConnection final : public Connection {
 public:
  // How long Join waits for the endpoint to close and receives into handler buffers to end.
  static constexpr double kJoinTimeoutS = 5.0;

  explicit UcxConnection(std::shared_ptr<UcxLink> link);
  ~UcxConnection() override;

  void Start() override { link_->Start(); }
  void Send(SendItem* item) override { link_->Send(item); }
  bool Flush(double timeout_s) override { return link_->Flush(timeout_s); }
  void Close() override { link_->Close(); }
  void Join() override;
  bool closed() const override { return link_->closed(); }
  // This host's address on the link's lifeline socket (the route to the peer the van's
  // bootstrap took); "" for a link without one (its peers reach this process by its worker
  // address, UcxContext::address()).
  std::string LocalAddress() const override;
  // From OnHeader: an eager payload goes through `sink` from UCX's buffer, a rendezvous one is
  // fetched into a bounce buffer of the link first (Connection::kBounceBytes chunks either way).
  void StreamPayload(PayloadSink sink, void* arg) override { link_->StreamPayload(sink, arg); }

  void set_peer_name(const std::string& n) override {
    Connection::set_peer_name(n);
    link_->SetPeerName(n);
  }

  // One-way writes (comm/connection.h; ucx_link.h "One-way writes").
  Status ExportWindow(void* addr, size_t len, std::string* blob) override;
  Status OpenWindow(const std::string& blob, uint32_t* id) override {
    return link_->OpenWindow(blob, id);
  }

  UcxLink* link() const { return link_.get(); }

 private:
  std::shared_ptr<UcxLink> link_;
};

}  // namespace byteps
