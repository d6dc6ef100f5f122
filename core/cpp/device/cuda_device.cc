// The CUDA backend of the device seam (device.h), through the runtime loaded at run time
// (cuda_api.h). Streams are non-blocking; events are created with blocking synchronisation, so
// a host thread waiting for a copy sleeps instead of spinning, and without timing unless asked.
#include "device/cuda_api.h"
#include "device/device.h"

namespace byteps {
namespace device {
namespace {

class CudaDevice : public Device {
 public:
  explicit CudaDevice(const CudaApi* api) : api_(api) {}
  Kind kind() const override { return Kind::kCuda; }
  int count() const override { return api_->device_count; }

  Status Use(int device) override {
    if (device < 0 || device >= api_->device_count)
      return Status::InvalidArgument("CUDA device " + std::to_string(device) +
                                     " does not exist (this process sees " +
                                     std::to_string(api_->device_count) + ")");
    return Check("cudaSetDevice", api_->SetDevice(device));
  }

 protected:
  Status DoCreateStream(int device, Stream* out) override {
    int before = 0;
    BPS_RETURN_IF_ERROR(Check("cudaGetDevice", api_->GetDevice(&before)));
    BPS_RETURN_IF_ERROR(Use(device));
    Status st = Check("cudaStreamCreateWithFlags",
                      api_->StreamCreateWithFlags(out, kCudaStreamNonBlocking));
    api_->SetDevice(before);  // the caller's current device, as it was
    return st;
  }
  Status DoCreateEvent(Event* out, bool timing) override {
    const unsigned flags = kCudaEventBlockingSync | (timing ? 0u : kCudaEventDisableTiming);
    return Check("cudaEventCreateWithFlags", api_->EventCreateWithFlags(out, flags));
  }
  Status DoElapsedNs(Event start, Event end, uint64_t* ns) override {
    float ms = 0;
    BPS_RETURN_IF_ERROR(Check("cudaEventElapsedTime", api_->EventElapsedTime(&ms, start, end)));
    *ns = ms > 0 ? static_cast<uint64_t>(static_cast<double>(ms) * 1e6) : 0;
    return Status::OK();
  }
  void DoDestroyEvent(Event e) override {
    if (e) api_->EventDestroy(e);
  }
  Status DoCopyAsync(void* dst, const void* src, size_t n, CopyDir dir, Stream s) override {
    const int kind = dir == CopyDir::kDeviceToHost   ? kCudaMemcpyDeviceToHost
                     : dir == CopyDir::kHostToDevice ? kCudaMemcpyHostToDevice
                                                     : kCudaMemcpyDeviceToDevice;
    return Check("cudaMemcpyAsync", api_->MemcpyAsync(dst, src, n, kind, s));
  }
  Status DoRecord(Event e, Stream s) override {
    return Check("cudaEventRecord", api_->EventRecord(e, s));
  }
  Status DoStreamWait(Stream s, Event e) override {
    return Check("cudaStreamWaitEvent", api_->StreamWaitEvent(s, e, 0));
  }
  Status DoSynchronize(Event e) override {
    return Check("cudaEventSynchronize", api_->EventSynchronize(e));
  }
  Status DoHostAlloc(size_t n, void** out) override {
    return Check("cudaHostAlloc", api_->HostAlloc(out, n, kCudaHostAllocPortable));
  }
  void DoHostFree(void* p) override { api_->FreeHost(p); }
  Status DoRegisterHost(void* p, size_t n) override {
    return Check("cudaHostRegister", api_->HostRegister(p, n, kCudaHostRegisterPortable));
  }
  void DoUnregisterHost(void* p) override {
    if (p) api_->HostUnregister(p);
  }

 private:
  Status Check(const char* call, cudaError_t e) const {
    if (e == 0) return Status::OK();
    return Status::Internal("CUDA: " + api_->Error(call, e));
  }
  const CudaApi* api_;
};

}  // namespace

Device* MakeCudaDevice(const CudaApi* api) { return new CudaDevice(api); }  // process lifetime

}  // namespace device
}  // namespace byteps
