// Small UCX helpers shared by the context and the doctor: what UCX prints, captured as text.
#pragma once
#include <ucp/api/ucp.h>

#include <cstddef>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace byteps {

// Runs print(stream) on an in-memory stream and returns what it wrote ("" if none could be
// opened).
std::string CaptureUcxOutput(const std::function<void(FILE*)>& print);
// The UCX_TLS and UCX_NET_DEVICES values of `config` (as UCX parsed them from the environment
// and its configuration files), and UCX_RNDV_THRESH's where `rndv_thresh` is given ("auto":
// UCX's default, one the user did not choose).
void ReadUcxConfig(const ucp_config_t* config, std::string* tls, std::string* net_devices,
                   std::string* rndv_thresh = nullptr);
// "tls/device" of every resource line of ucp_context_print_info's text.
std::vector<std::string> ParseUcxResources(const std::string& context_info);
// The transport ("tcp", "sysv", "rc_mlx5"...) of the lane that carries an endpoint's active
// messages, from ucp_ep_print_info's text ("lane[0]:  1:tcp/eth0.0 md[1] ... am am_bw#0");
// "" when no such lane is found.
std::string ParseUcxAmTransport(const std::string& ep_info);
// Whether `transport` is one of UCX's shared-memory transports ("posix", "sysv", "xpmem",
// "cma", "knem").
bool IsUcxSharedMemoryTransport(const std::string& transport);
// The largest frame a link whose active messages travel over `am_transport` sends eager
// (UCP_AM_SEND_FLAG_EAGER) instead of letting UCX choose by its rendezvous threshold:
// kTcpEagerMax over "tcp", kShmEagerMax over UCX's shared-memory transports ("posix", "sysv",
// "xpmem"), 0 (UCX chooses) over anything else, and 0 wherever the user chose UCX's
// rendezvous threshold (`user_rndv_thresh`: UCX_RNDV_THRESH not at its default, "auto"; then
// the threshold is UCX's to apply).
size_t UcxEagerMax(const std::string& am_transport, bool user_rndv_thresh);

}  // namespace byteps
