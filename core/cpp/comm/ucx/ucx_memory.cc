// UcxContext's memory (ucx_context.h): regions registered once (RegisterMemory), the slabs
// UCX allocates for windows (AllocateShared), their remote keys (PackRemoteKey), and the
// registration a send or receive of a region's bytes passes to UCX.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "comm/ucx/ucx_context.h"
#include "comm/ucx/ucx_link.h"

namespace byteps {

const UcxRegion* UcxContext::RegionContaining(const void* p, size_t len) const {
  if (regions_.empty() || !p) return nullptr;
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = regions_.upper_bound(a);
  if (it == regions_.begin()) return nullptr;
  --it;
  const UcxRegion& m = it->second;
  const auto base = reinterpret_cast<uintptr_t>(m.addr);
  return a - base <= m.len && len <= m.len - (a - base) ? &m : nullptr;
}

ucp_mem_h UcxContext::FindMemh(const void* p, size_t len) const {
  const UcxRegion* r = RegionContaining(p, len);
  return r ? r->memh : nullptr;
}

void UcxContext::UseRegistration(ucp_request_param_t* param, const void* p, size_t len) const {
  ++data_ops_;
  if (ucp_mem_h memh = FindMemh(p, len)) {
    param->op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    param->memh = memh;
    ++registered_ops_;
  }
}

Status UcxContext::RegisterMemory(void* addr, size_t len) {
  if (!addr || len == 0) return Status::InvalidArgument("registering an empty memory region");
  return RunSync([this, addr, len]() -> Status {
    const auto a = reinterpret_cast<uintptr_t>(addr);
    if (regions_.count(a))
      return Status::InvalidArgument("a UCX memory region already starts at this address");
    ucp_mem_map_params_t p{};
    p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    p.address = addr;
    p.length = len;
    ucp_mem_h memh;
    ucs_status_t s = ucp_mem_map(context_, &p, &memh);
    if (s != UCS_OK)
      return Status::Internal("UCX could not register " + std::to_string(len) +
                              " bytes: " + ucs_status_string(s));
    regions_[a] = UcxRegion{addr, len, memh};
    return Status::OK();
  });
}

Status UcxContext::AllocateShared(size_t len, void** addr) {
  if (len == 0) return Status::InvalidArgument("allocating 0 bytes of shared memory");
  const size_t need = (len + 4095) / 4096 * 4096;
  auto out = std::make_shared<void*>(nullptr);
  Status st = RunSync([this, need, out]() -> Status {
    auto open = regions_.find(open_slab_);
    if (open == regions_.end() || open->second.len - open->second.used < need) {
      ucp_mem_map_params_t p{};
      p.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
      p.length = std::max(need, kSlabBytes);
      p.flags = UCP_MEM_MAP_ALLOCATE;
      ucp_mem_h memh;
      ucs_status_t s = ucp_mem_map(context_, &p, &memh);
      if (s != UCS_OK)
        return Status::Internal("UCX could not allocate " + std::to_string(p.length) +
                                " bytes: " + ucs_status_string(s));
      ucp_mem_attr_t attr{};
      attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
      s = ucp_mem_query(memh, &attr);
      if (s != UCS_OK || reinterpret_cast<uintptr_t>(attr.address) % 4096 != 0) {
        ucp_mem_unmap(context_, memh);
        return Status::Internal("UCX allocated memory it cannot describe (or not page-aligned)");
      }
      if (open != regions_.end() && open->second.live == 0) {  // nothing left in it
        ucp_mem_unmap(context_, open->second.memh);
        regions_.erase(open);
      }
      UcxRegion r{attr.address, attr.length, memh, /*slab=*/true};
      open_slab_ = reinterpret_cast<uintptr_t>(attr.address);
      open = regions_.emplace(open_slab_, r).first;
    }
    *out = static_cast<char*>(open->second.addr) + open->second.used;
    open->second.used += need;
    ++open->second.live;
    return Status::OK();
  });
  if (st.ok()) *addr = *out;
  return st;
}

void UcxContext::FreeShared(void* addr) {
  Status st = RunSync([this, addr]() -> Status {
    const UcxRegion* found = RegionContaining(addr, 1);
    if (!found || !found->slab || found->live == 0)
      return Status::InvalidArgument("not shared memory of UCX");
    auto it = regions_.find(reinterpret_cast<uintptr_t>(found->addr));
    UcxRegion& r = it->second;
    if (--r.live == 0 && it->first != open_slab_) {
      ucp_mem_unmap(context_, r.memh);
      regions_.erase(it);
    }
    return Status::OK();
  });
  if (!st.ok()) BPS_LOG(WARNING) << "freeing UCX shared memory: " << st.message();
}

Status UcxContext::UnregisterMemory(void* addr) {
  return RunSync([this, addr]() -> Status {
    auto it = regions_.find(reinterpret_cast<uintptr_t>(addr));
    if (it == regions_.end() || it->second.slab)
      return Status::InvalidArgument("no UCX memory region starts at this address");
    ucs_status_t s = ucp_mem_unmap(context_, it->second.memh);
    regions_.erase(it);
    return s == UCS_OK ? Status::OK()
                       : Status::Internal(std::string("ucp_mem_unmap: ") + ucs_status_string(s));
  });
}

Status UcxContext::PackRemoteKey(UcxLink* link, void* addr, size_t len, std::string* blob) {
  auto out = std::make_shared<std::string>();
  Status st = RunSync([this, link, addr, len, out]() -> Status {
    if (!link->one_way())
      return Status::InvalidArgument("the UCX link to " + link->peer_name() +
                                     " has no one-way writes (" + link->one_way_why() + ")");
    ucp_mem_h memh = len ? FindMemh(addr, len) : nullptr;
    if (!memh)
      return Status::InvalidArgument("a window on memory not registered with UCX (" +
                                     std::to_string(len) + " bytes)");
    void* rkey = nullptr;
    size_t rkey_len = 0;
    ucs_status_t s = ucp_rkey_pack(context_, memh, &rkey, &rkey_len);
    if (s != UCS_OK)
      return Status::Internal(std::string("ucp_rkey_pack: ") + ucs_status_string(s));
    WireWriter w;
    w.U32(kUcxWindowMagic).U64(reinterpret_cast<uintptr_t>(addr)).U64(len);
    w.Str(std::string(static_cast<const char*>(rkey), rkey_len));
    ucp_rkey_buffer_release(rkey);
    *out = w.Take();
    return Status::OK();
  });
  if (st.ok()) *blob = std::move(*out);
  return st;
}

}  // namespace byteps
