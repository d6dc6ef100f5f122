// The CUDA runtime and NCCL, loaded at run time (dlopen): the core is never linked against
// either and is built without their headers, so one wheel runs on hosts with and without CUDA
// (docs/gpu.md). The few types and constants used are declared here, with the values of the
// CUDA runtime and NCCL headers (stable across CUDA 11-13 and NCCL 2.x).
#pragma once
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

namespace byteps {
namespace device {

using cudaError_t = int;  // 0: cudaSuccess
using cudaStream_t = void*;
using cudaEvent_t = void*;
constexpr int kCudaMemcpyHostToDevice = 1;
constexpr int kCudaMemcpyDeviceToHost = 2;
constexpr int kCudaMemcpyDeviceToDevice = 3;
constexpr unsigned kCudaStreamNonBlocking = 0x01;
constexpr unsigned kCudaEventBlockingSync = 0x01;
constexpr unsigned kCudaEventDisableTiming = 0x02;
constexpr unsigned kCudaHostAllocPortable = 0x01;
constexpr unsigned kCudaHostRegisterPortable = 0x01;
// cudaPointerAttributes (CUDA >= 11): type is a cudaMemoryType (0 unregistered, 1 host,
// 2 device, 3 managed). Room after it in case a later runtime writes more.
struct CudaPointerAttributes {
  int type = 0;
  int device = -1;
  void* device_pointer = nullptr;
  void* host_pointer = nullptr;
  char reserved[64] = {};
};
constexpr int kCudaMemoryTypeDevice = 2;
constexpr int kCudaMemoryTypeManaged = 3;

// The CUDA runtime functions the core calls (cuda_runtime_api.h signatures).
struct CudaApi {
  std::string library;  // the path (or soname) it was loaded from
  int runtime_version = 0, driver_version = 0, device_count = 0;
  cudaError_t (*GetDeviceCount)(int*) = nullptr;
  cudaError_t (*SetDevice)(int) = nullptr;
  cudaError_t (*GetDevice)(int*) = nullptr;
  cudaError_t (*RuntimeGetVersion)(int*) = nullptr;
  cudaError_t (*DriverGetVersion)(int*) = nullptr;
  cudaError_t (*StreamCreateWithFlags)(cudaStream_t*, unsigned) = nullptr;
  cudaError_t (*StreamDestroy)(cudaStream_t) = nullptr;
  cudaError_t (*StreamSynchronize)(cudaStream_t) = nullptr;
  cudaError_t (*MemcpyAsync)(void*, const void*, size_t, int, cudaStream_t) = nullptr;
  cudaError_t (*EventCreateWithFlags)(cudaEvent_t*, unsigned) = nullptr;
  cudaError_t (*EventRecord)(cudaEvent_t, cudaStream_t) = nullptr;
  cudaError_t (*EventSynchronize)(cudaEvent_t) = nullptr;
  cudaError_t (*EventQuery)(cudaEvent_t) = nullptr;
  cudaError_t (*EventDestroy)(cudaEvent_t) = nullptr;
  cudaError_t (*EventElapsedTime)(float*, cudaEvent_t, cudaEvent_t) = nullptr;
  cudaError_t (*StreamWaitEvent)(cudaStream_t, cudaEvent_t, unsigned) = nullptr;
  cudaError_t (*HostAlloc)(void**, size_t, unsigned) = nullptr;
  cudaError_t (*FreeHost)(void*) = nullptr;
  cudaError_t (*Malloc)(void**, size_t) = nullptr;
  cudaError_t (*Free)(void*) = nullptr;
  cudaError_t (*PointerGetAttributes)(CudaPointerAttributes*, const void*) = nullptr;
  cudaError_t (*HostRegister)(void*, size_t, unsigned) = nullptr;
  cudaError_t (*HostUnregister)(void*) = nullptr;
  cudaError_t (*DeviceSynchronize)() = nullptr;
  const char* (*GetErrorString)(cudaError_t) = nullptr;
  // "cudaMemcpyAsync failed: <the runtime's text> (error N)".
  std::string Error(const char* call, cudaError_t e) const;
};

// NCCL (nccl.h): the types and functions of the REDUCE / BROADCAST stages among the GPUs of
// one machine (nccl_collective.cc).
using ncclResult_t = int;  // 0: ncclSuccess
using ncclComm_t = void*;
struct NcclUniqueId {
  char internal[128];
};
enum NcclDataType : int {
  kNcclInt8 = 0, kNcclUint8 = 1, kNcclInt32 = 2, kNcclUint32 = 3, kNcclInt64 = 4,
  kNcclUint64 = 5, kNcclFloat16 = 6, kNcclFloat32 = 7, kNcclFloat64 = 8, kNcclBfloat16 = 9,
};
constexpr int kNcclSum = 0;
constexpr int kNcclAvg = 4;         // NCCL >= 2.10
constexpr int kNcclInProgress = 7;  // a nonblocking communicator's call not yet settled
// ncclConfig_t's fields up to splitShare (NCCL 2.18); NCCL reads `size` bytes of it. Every
// field not set is NCCL_CONFIG_UNDEF_INT (INT_MIN) or null.
constexpr int kNcclMinVersion = 21800;  // the NCCL stages need 2.18 (the config below)
constexpr int kNcclUndefInt = std::numeric_limits<int>::min();
struct NcclConfig {
  size_t size = sizeof(NcclConfig);
  unsigned magic = 0xcafebeef;
  unsigned version = kNcclMinVersion;  // NCCL_VERSION(2, 18, 0)
  int blocking = kNcclUndefInt;
  int cga_cluster_size = kNcclUndefInt;
  int min_ctas = kNcclUndefInt;
  int max_ctas = kNcclUndefInt;
  const char* net_name = nullptr;
  int split_share = kNcclUndefInt;
};

struct NcclApi {
  std::string library;
  int version = 0;
  ncclResult_t (*GetVersion)(int*) = nullptr;
  ncclResult_t (*GetUniqueId)(NcclUniqueId*) = nullptr;
  ncclResult_t (*CommInitRank)(ncclComm_t*, int, NcclUniqueId, int) = nullptr;
  ncclResult_t (*CommAbort)(ncclComm_t) = nullptr;
  ncclResult_t (*CommDestroy)(ncclComm_t) = nullptr;
  ncclResult_t (*ReduceScatter)(const void*, void*, size_t, int, int, ncclComm_t,
                                cudaStream_t) = nullptr;
  ncclResult_t (*AllGather)(const void*, void*, size_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*AllReduce)(const void*, void*, size_t, int, int, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*Broadcast)(const void*, void*, size_t, int, int, ncclComm_t,
                            cudaStream_t) = nullptr;
  // NCCL >= 2.14 (null before: the NCCL stages are then off, with the version as the reason).
  ncclResult_t (*CommInitRankConfig)(ncclComm_t*, int, NcclUniqueId, int, NcclConfig*) = nullptr;
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*) = nullptr;
  ncclResult_t (*GroupStart)() = nullptr;
  ncclResult_t (*GroupEnd)() = nullptr;
  const char* (*GetErrorString)(ncclResult_t) = nullptr;
  std::string Error(const char* call, ncclResult_t r) const;
};

// Loads the CUDA runtime: first one already in the process (a framework loaded it), then each
// of `candidates` (full paths: the framework's and the nvidia-* wheels' libraries, found by
// byteps.cuda), then the system library path (`system` false: only the candidates, for
// tests). The first success is kept for the process and
// returned again; a failure is not kept (a later call tries again) and says why in *why
// ("libcudart.so not found in ...", "no CUDA device ...").
const CudaApi* LoadCuda(const std::vector<std::string>& candidates, std::string* why,
                        bool system = true);
// The runtime LoadCuda kept, or null.
const CudaApi* LoadedCuda();
// The same for NCCL (needs no GPU to load).
const NcclApi* LoadNccl(const std::vector<std::string>& candidates, std::string* why,
                        bool system = true);
const NcclApi* LoadedNccl();

}  // namespace device
}  // namespace byteps
