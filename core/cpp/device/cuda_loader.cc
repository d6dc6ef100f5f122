// Loading the CUDA runtime and NCCL at run time (cuda_api.h; docs/gpu.md "One wheel").
#include <dlfcn.h>

#include <memory>
#include <mutex>

#include "device/cuda_api.h"

namespace byteps {
namespace device {
namespace {

const char* const kCudartSonames[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                                      "libcudart.so"};
const char* const kNcclSonames[] = {"libnccl.so.2", "libnccl.so"};

// Opens the first library that loads: one already in the process (by soname), then the
// candidates, then the system path. *errors gets why each candidate failed, for the message.
void* OpenFirst(const char* const* sonames, size_t n, const std::vector<std::string>& candidates,
                bool system, std::string* from, std::string* errors) {
  for (size_t i = 0; system && i < n; ++i) {
    if (void* h = dlopen(sonames[i], RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD)) {
      *from = sonames[i];
      *from += " (already loaded)";
      return h;
    }
  }
  for (const std::string& path : candidates) {
    if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      *from = path;
      return h;
    }
    const char* e = dlerror();
    *errors += "\n  " + path + ": " + (e ? e : "not loadable");
  }
  for (size_t i = 0; system && i < n; ++i) {
    if (void* h = dlopen(sonames[i], RTLD_NOW | RTLD_LOCAL)) {
      *from = sonames[i];
      return h;
    }
  }
  return nullptr;
}

std::string Tried(const char* lib, const std::vector<std::string>& candidates, bool system,
                  const std::string& errors) {
  std::string s = std::string(lib) + " not found in ";
  if (candidates.empty()) {
    s += "the framework's or nvidia-* wheels' directories (none installed)";
  } else {
    s += std::to_string(candidates.size()) + " candidate file(s)";
  }
  if (system) s += " nor on the system library path (ld.so.cache, LD_LIBRARY_PATH)";
  if (!errors.empty()) s += ";" + errors;
  return s;
}

template <typename F>
bool Resolve(void* h, const char* name, F* fn, std::string* missing) {
  *fn = reinterpret_cast<F>(dlsym(h, name));
  if (!*fn) *missing += std::string(missing->empty() ? "" : ", ") + name;
  return *fn != nullptr;
}

std::mutex g_mu;
CudaApi* g_cuda = nullptr;  // kept for the process (never unloaded)
NcclApi* g_nccl = nullptr;

}  // namespace

std::string CudaApi::Error(const char* call, cudaError_t e) const {
  const char* text = GetErrorString ? GetErrorString(e) : nullptr;
  return std::string(call) + " failed: " + (text ? text : "unknown CUDA error") + " (error " +
         std::to_string(e) + ")";
}

std::string NcclApi::Error(const char* call, ncclResult_t r) const {
  const char* text = GetErrorString ? GetErrorString(r) : nullptr;
  return std::string(call) + " failed: " + (text ? text : "unknown NCCL error") + " (result " +
         std::to_string(r) + ")";
}

const CudaApi* LoadCuda(const std::vector<std::string>& candidates, std::string* why,
                        bool system) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_cuda) return g_cuda;
  std::string from, errors;
  void* h = OpenFirst(kCudartSonames, sizeof(kCudartSonames) / sizeof(*kCudartSonames),
                      candidates, system, &from, &errors);
  if (!h) {
    *why = Tried("libcudart.so (the CUDA runtime)", candidates, system, errors);
    return nullptr;
  }
  auto api = std::make_unique<CudaApi>();
  std::string missing;
  Resolve(h, "cudaGetDeviceCount", &api->GetDeviceCount, &missing);
  Resolve(h, "cudaSetDevice", &api->SetDevice, &missing);
  Resolve(h, "cudaGetDevice", &api->GetDevice, &missing);
  Resolve(h, "cudaRuntimeGetVersion", &api->RuntimeGetVersion, &missing);
  Resolve(h, "cudaDriverGetVersion", &api->DriverGetVersion, &missing);
  Resolve(h, "cudaStreamCreateWithFlags", &api->StreamCreateWithFlags, &missing);
  Resolve(h, "cudaStreamDestroy", &api->StreamDestroy, &missing);
  Resolve(h, "cudaStreamSynchronize", &api->StreamSynchronize, &missing);
  Resolve(h, "cudaMemcpyAsync", &api->MemcpyAsync, &missing);
  Resolve(h, "cudaEventCreateWithFlags", &api->EventCreateWithFlags, &missing);
  Resolve(h, "cudaEventRecord", &api->EventRecord, &missing);
  Resolve(h, "cudaEventSynchronize", &api->EventSynchronize, &missing);
  Resolve(h, "cudaEventQuery", &api->EventQuery, &missing);
  Resolve(h, "cudaEventDestroy", &api->EventDestroy, &missing);
  Resolve(h, "cudaEventElapsedTime", &api->EventElapsedTime, &missing);
  Resolve(h, "cudaStreamWaitEvent", &api->StreamWaitEvent, &missing);
  Resolve(h, "cudaHostAlloc", &api->HostAlloc, &missing);
  Resolve(h, "cudaFreeHost", &api->FreeHost, &missing);
  Resolve(h, "cudaMalloc", &api->Malloc, &missing);
  Resolve(h, "cudaFree", &api->Free, &missing);
  Resolve(h, "cudaPointerGetAttributes", &api->PointerGetAttributes, &missing);
  Resolve(h, "cudaHostRegister", &api->HostRegister, &missing);
  Resolve(h, "cudaHostUnregister", &api->HostUnregister, &missing);
  Resolve(h, "cudaDeviceSynchronize", &api->DeviceSynchronize, &missing);
  Resolve(h, "cudaGetErrorString", &api->GetErrorString, &missing);
  if (!missing.empty()) {
    *why = from + " lacks " + missing;
    return nullptr;
  }
  api->library = from;
  api->RuntimeGetVersion(&api->runtime_version);
  api->DriverGetVersion(&api->driver_version);
  cudaError_t e = api->GetDeviceCount(&api->device_count);
  if (e != 0 || api->device_count <= 0) {
    *why = "no CUDA device (" + from + ", runtime " + std::to_string(api->runtime_version) +
           ", driver " + std::to_string(api->driver_version) + "): " +
           (e != 0 ? api->Error("cudaGetDeviceCount", e) : "cudaGetDeviceCount found 0");
    return nullptr;  // not kept: the library stays open, a later call asks again
  }
  g_cuda = api.release();
  return g_cuda;
}

const CudaApi* LoadedCuda() {
  std::lock_guard<std::mutex> lk(g_mu);
  return g_cuda;
}

const NcclApi* LoadNccl(const std::vector<std::string>& candidates, std::string* why,
                        bool system) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_nccl) return g_nccl;
  std::string from, errors;
  void* h = OpenFirst(kNcclSonames, sizeof(kNcclSonames) / sizeof(*kNcclSonames), candidates,
                      system, &from, &errors);
  if (!h) {
    *why = Tried("libnccl.so (NCCL)", candidates, system, errors);
    return nullptr;
  }
  auto api = std::make_unique<NcclApi>();
  std::string missing;
  Resolve(h, "ncclGetVersion", &api->GetVersion, &missing);
  Resolve(h, "ncclGetUniqueId", &api->GetUniqueId, &missing);
  Resolve(h, "ncclCommInitRank", &api->CommInitRank, &missing);
  Resolve(h, "ncclCommAbort", &api->CommAbort, &missing);
  Resolve(h, "ncclCommDestroy", &api->CommDestroy, &missing);
  Resolve(h, "ncclReduceScatter", &api->ReduceScatter, &missing);
  Resolve(h, "ncclAllGather", &api->AllGather, &missing);
  Resolve(h, "ncclGroupStart", &api->GroupStart, &missing);
  Resolve(h, "ncclGroupEnd", &api->GroupEnd, &missing);
  Resolve(h, "ncclGetErrorString", &api->GetErrorString, &missing);
  Resolve(h, "ncclAllReduce", &api->AllReduce, &missing);
  Resolve(h, "ncclBroadcast", &api->Broadcast, &missing);
  std::string newer;  // optional: only the NCCL stages need them (NcclApi)
  Resolve(h, "ncclCommInitRankConfig", &api->CommInitRankConfig, &newer);
  Resolve(h, "ncclCommGetAsyncError", &api->CommGetAsyncError, &newer);
  if (!missing.empty()) {
    *why = from + " lacks " + missing;
    return nullptr;
  }
  api->library = from;
  api->GetVersion(&api->version);
  g_nccl = api.release();
  return g_nccl;
}

const NcclApi* LoadedNccl() {
  std::lock_guard<std::mutex> lk(g_mu);
  return g_nccl;
}

}  // namespace device
}  // namespace byteps
