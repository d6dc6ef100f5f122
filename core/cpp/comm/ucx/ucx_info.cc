// What UCX reports about itself and this host (byteps._core.doctor.ucx_info), and the helpers
// that capture UCX's printed reports.
#include <cstdlib>
#include <sstream>

#include "comm/ucx/ucx_context.h"
#include "comm/ucx/ucx_link.h"
#include "comm/ucx/ucx_util.h"

namespace byteps {

std::string CaptureUcxOutput(const std::function<void(FILE*)>& print) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  if (!f) return "";
  print(f);
  fclose(f);
  std::string out(buf ? buf : "", len);
  free(buf);
  return out;
}

void ReadUcxConfig(const ucp_config_t* config, std::string* tls, std::string* net_devices,
                   std::string* rndv_thresh) {
  const std::string text = CaptureUcxOutput(
      [&](FILE* f) { ucp_config_print(config, f, nullptr, UCS_CONFIG_PRINT_CONFIG); });
  *tls = *net_devices = "?";
  if (rndv_thresh) *rndv_thresh = "?";
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("UCX_TLS=", 0) == 0) *tls = line.substr(8);
    if (line.rfind("UCX_NET_DEVICES=", 0) == 0) *net_devices = line.substr(16);
    if (rndv_thresh && line.rfind("UCX_RNDV_THRESH=", 0) == 0) *rndv_thresh = line.substr(16);
  }
}

std::vector<std::string> ParseUcxResources(const std::string& context_info) {
  // "#      resource 1  :  md 1  dev 1  flags -- tcp/lo"
  std::vector<std::string> out;
  std::istringstream lines(context_info);
  for (std::string line; std::getline(lines, line);) {
    if (line.find(" resource ") == std::string::npos) continue;
    const size_t dashes = line.rfind("-- ");
    if (dashes == std::string::npos) continue;
    std::string res = line.substr(dashes + 3);
    while (!res.empty() && (res.back() == ' ' || res.back() == '\r')) res.pop_back();
    if (!res.empty()) out.push_back(res);
  }
  return out;
}

std::string ParseUcxAmTransport(const std::string& ep_info) {
  std::istringstream lines(ep_info);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("lane[") == std::string::npos) continue;
    std::istringstream words(line);
    std::string tl;
    bool am = false;
    for (std::string w; words >> w;) {
      const size_t colon = w.find(':'), slash = w.find('/');
      if (tl.empty() && colon != std::string::npos && slash != std::string::npos && colon < slash &&
          w.rfind("lane[", 0) != 0)
        tl = w.substr(colon + 1, slash - colon - 1);
      if (w == "am") am = true;
    }
    if (am && !tl.empty()) return tl;
  }
  return "";
}

bool IsUcxSharedMemoryTransport(const std::string& transport) {
  for (const char* tl : {"posix", "sysv", "xpmem", "cma", "knem"})
    if (transport == tl) return true;
  return false;
}

size_t UcxEagerMax(const std::string& am_transport, bool user_rndv_thresh) {
  if (user_rndv_thresh) return 0;
  if (am_transport == "tcp") return kTcpEagerMax;
  if (IsUcxSharedMemoryTransport(am_transport)) return kShmEagerMax;
  return 0;
}

bool IsRdmaTransport(const std::string& resource) {
  for (const char* prefix : {"rc_", "dc_", "ud_", "ib"})
    if (resource.rfind(prefix, 0) == 0) return true;
  return false;
}

UcxInfo QueryUcxInfo() {
  UcxInfo info;
  info.version = ucp_get_version_string();
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) {
    info.error = std::string("UCX could not read its configuration: ") + ucs_status_string(s);
    return info;
  }
  ReadUcxConfig(config, &info.tls, &info.net_devices);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  ucp_context_h context = nullptr;
  s = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (s != UCS_OK) {
    info.error = "UCX could not start with UCX_TLS=" + info.tls +
                 ", UCX_NET_DEVICES=" + info.net_devices + ": " + ucs_status_string(s);
    return info;
  }
  info.resources =
      ParseUcxResources(CaptureUcxOutput([&](FILE* f) { ucp_context_print_info(context, f); }));
  ucp_cleanup(context);
  return info;
}

}  // namespace byteps
