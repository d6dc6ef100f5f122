// The device seam's shared part (device.h): counted wrappers, copy streams, the backends.
#include "device/device.h"

#include "device/cuda_api.h"

namespace byteps {
namespace device {

Device* MakeCudaDevice(const CudaApi* api);  // cuda_device.cc
Device* FakeDevice();                        // fake_device.cc

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kHost: return "cpu";
    case Kind::kCuda: return "cuda";
    case Kind::kFake: return "fake";
  }
  return "?";
}

bool ParseKind(const std::string& s, Kind* out) {
  for (Kind k : {Kind::kHost, Kind::kCuda, Kind::kFake}) {
    if (s == KindName(k)) {
      *out = k;
      return true;
    }
  }
  return false;
}

Status Device::CopyStream(int device, CopyDir dir, Stream* out) {
  std::lock_guard<std::mutex> lk(mu_);
  auto key = std::make_pair(device, static_cast<int>(dir));
  auto it = copy_streams_.find(key);
  if (it != copy_streams_.end()) {
    *out = it->second;
    return Status::OK();
  }
  BPS_RETURN_IF_ERROR(CreateStream(device, out));
  copy_streams_[key] = *out;
  return Status::OK();
}

Status Device::CreateStream(int device, Stream* out) {
  stats_.streams++;
  return DoCreateStream(device, out);
}

Status Device::CreateEvent(Event* out, bool timing) {
  stats_.events++;
  return DoCreateEvent(out, timing);
}

Status Device::AddCopyTime(CopyDir dir, Event start, Event end, size_t n) {
  uint64_t ns = 0;
  BPS_RETURN_IF_ERROR(DoElapsedNs(start, end, &ns));
  Stats::Timed& t = stats_.timed[static_cast<int>(dir)];
  t.copies++;
  t.bytes += n;
  t.busy_ns += ns;
  return Status::OK();
}

Status Device::CopyAsync(void* dst, const void* src, size_t n, CopyDir dir, Stream s) {
  stats_.copies++;
  stats_.copy_bytes += n;
  return DoCopyAsync(dst, src, n, dir, s);
}

Status Device::StreamWait(Stream s, Event e) {
  stats_.stream_waits++;
  return DoStreamWait(s, e);
}

Status Device::HostAlloc(size_t n, void** out) {
  stats_.host_allocs++;
  stats_.host_bytes += n;
  return DoHostAlloc(n, out);
}

Status Device::RegisterHost(void* p, size_t n) {
  stats_.host_registers++;
  return DoRegisterHost(p, n);
}

void Device::HostFree(void* p, size_t n) {
  if (!p) return;
  stats_.host_frees++;
  stats_.host_bytes -= n;
  DoHostFree(p);
}

Status GetDevice(Kind kind, Device** out) {
  switch (kind) {
    case Kind::kFake: *out = FakeDevice(); return Status::OK();
    case Kind::kCuda: {
      static Device* cuda = nullptr;  // made once LoadCuda succeeded; kept for the process
      static std::mutex mu;
      std::lock_guard<std::mutex> lk(mu);
      if (!cuda) {
        const CudaApi* api = LoadedCuda();
        if (!api)
          return Status::InvalidArgument(
              "a CUDA tensor, but CUDA support is off in this process (byteps.cuda_status() "
              "says why)");
        cuda = MakeCudaDevice(api);
      }
      *out = cuda;
      return Status::OK();
    }
    case Kind::kHost: break;
  }
  return Status::InvalidArgument("host memory has no device backend");
}

Status PinnedBuffer::Allocate(Device* d, size_t n) {
  Release();
  void* p = nullptr;
  if (n > 0) BPS_RETURN_IF_ERROR(d->HostAlloc(n, &p));
  device_ = d;
  data_ = static_cast<char*>(p);
  size_ = n;
  return Status::OK();
}

void PinnedBuffer::Release() {
  if (device_ && data_) device_->HostFree(data_, size_);
  device_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

}  // namespace device
}  // namespace byteps
