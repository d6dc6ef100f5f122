#include "control_msgs.h"

#include <cstdint>
#include <cstring>

#include "comm/frame.h"
#include "common/dtype.h"
#include "ps/collective_programs.h"
#include "reduce/sum.h"

namespace byteps {

const char* NodeRoleName(NodeRole r) {
  switch (r) {
    case NodeRole::kWorker: return "worker";
    case NodeRole::kServer: return "server";
    case NodeRole::kScheduler: return "scheduler";
  }
  return "?";
}

std::string Encode(const RegisterMsg& m) {
  WireWriter w;
  w.U8(static_cast<uint8_t>(m.role)).I32(m.worker_id).Str(m.host).U32(m.port).U32(m.local_size);
  w.U32(m.num_worker).U32(m.num_server).U64(m.partition_bound).U32(m.pid);
  w.U8(m.async_mode ? 1 : 0).I32(m.max_staleness);
  return w.Take();
}

Status Decode(const void* data, size_t len, RegisterMsg* m) {
  WireReader r(data, len);
  uint8_t role = r.U8();
  m->worker_id = r.I32();
  m->host = r.Str(256);
  m->port = r.U32();
  m->local_size = r.U32();
  m->num_worker = r.U32();
  m->num_server = r.U32();
  m->partition_bound = r.U64();
  m->pid = r.U32();
  const uint8_t async_mode = r.U8();
  m->async_mode = async_mode != 0;
  m->max_staleness = r.I32();
  if (!r.done() || role > 1 || async_mode > 1) return Status::InvalidArgument("malformed REGISTER message");
  m->role = static_cast<NodeRole>(role);
  return Status::OK();
}

std::string Encode(const AddressBook& m) {
  WireWriter w;
  w.I32(m.my_rank).U32(static_cast<uint32_t>(m.servers.size()));
  for (auto& s : m.servers) w.U32(s.rank).Str(s.host).U32(s.port).U8(s.colocated).F64(s.share);
  w.U64(m.partition_bound);
  w.U32(static_cast<uint32_t>(m.workers.size()));
  for (auto& wk : m.workers) w.U32(wk.id).Str(wk.host).U32(wk.port);
  return w.Take();
}

Status Decode(const void* data, size_t len, AddressBook* m) {
  WireReader r(data, len);
  m->my_rank = r.I32();
  uint32_t n = r.U32();
  if (!r.ok() || n > 65536) return Status::InvalidArgument("malformed ADDRESS_BOOK message");
  m->servers.resize(n);
  for (auto& s : m->servers) {
    s.rank = r.U32();
    s.host = r.Str(256);
    s.port = r.U32();
    s.colocated = r.U8() != 0;
    s.share = r.F64();
  }
  m->partition_bound = r.U64();
  uint32_t nw = r.U32();
  if (!r.ok() || nw > 65536) return Status::InvalidArgument("malformed ADDRESS_BOOK message");
  m->workers.resize(nw);
  for (auto& wk : m->workers) {
    wk.id = r.U32();
    wk.host = r.Str(256);
    wk.port = r.U32();
  }
  if (!r.done()) return Status::InvalidArgument("malformed ADDRESS_BOOK message");
  return Status::OK();
}

std::string Encode(const DeclareMsg& m) {
  WireWriter w;
  w.U32(m.declared_key).Str(m.name).U8(m.dtype).I64s(m.shape).U64(m.nbytes).Str(m.compression);
  w.U64(m.partition_bound).U32(m.generation).U8(m.sync).U32(m.sync_param).U8(m.op);
  w.U8(m.collective).I32(m.root).I32(m.root_rank).I64s(std::vector<int64_t>(m.blocks.begin(), m.blocks.end()));
  w.I64s(m.members);
  return w.Take();
}

std::string Encode(const KeyConfigMsg& m) {
  WireWriter w;
  w.U8(m.dtype).U64(m.count).Str(m.compression).I64s(m.members).U8(m.op);
  return w.Take();
}

Status Decode(const void* data, size_t len, KeyConfigMsg* m) {
  WireReader r(data, len);
  m->dtype = r.U8();
  m->count = r.U64();
  m->compression = r.Str(kMaxCompressionSpec);
  m->members = r.I64s(1 << 16);
  m->op = r.U8();
  if (!r.done() || (m->compression.empty() && m->members.empty()) || !DTypeValid(m->dtype) ||
      m->op >= reduce::kReduceOpCount)
    return Status::InvalidArgument("malformed KEY_CONFIG message");
  return Status::OK();
}

Status Decode(const void* data, size_t len, DeclareMsg* m) {
  WireReader r(data, len);
  m->declared_key = r.U32();
  m->name = r.Str(1 << 16);
  m->dtype = r.U8();
  m->shape = r.I64s(64);
  m->nbytes = r.U64();
  m->compression = r.Str(kMaxCompressionSpec);
  m->partition_bound = r.U64();
  m->generation = r.U32();
  m->sync = r.U8();
  m->sync_param = r.U32();
  m->op = r.U8();
  m->collective = r.U8();
  m->root = r.I32();
  m->root_rank = r.I32();
  const std::vector<int64_t> blocks = r.I64s(1 << 16);
  m->blocks.assign(blocks.begin(), blocks.end());
  m->members = r.I64s(1 << 16);
  if (!r.done() || !DTypeValid(m->dtype) || m->sync >= 4 || m->op >= reduce::kReduceOpCount ||
      m->collective >= kCollectiveCount)
    return Status::InvalidArgument("malformed DECLARE message");
  return Status::OK();
}

std::string EncodeDeclareOk(const std::vector<int64_t>& servers) {
  WireWriter w;
  w.I64s(servers);
  return w.Take();
}

Status DecodeDeclareOk(const void* data, size_t len, std::vector<int64_t>* servers) {
  WireReader r(data, len);
  *servers = r.I64s(1 << 16);
  if (!r.done()) return Status::InvalidArgument("malformed DECLARE_REPLY message");
  return Status::OK();
}

std::string EncodeText(const std::string& text) {
  WireWriter w;
  w.Str(text);
  return w.Take();
}

std::string DecodeText(const void* data, size_t len) {
  WireReader r(data, len);
  std::string s = r.Str(1 << 20);
  return r.ok() ? s : std::string("<malformed message>");
}

std::string EncodeWorkerIds(const std::vector<int>& ids) {
  std::string out(ids.size() * sizeof(uint32_t), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    uint32_t id = static_cast<uint32_t>(ids[i]);
    memcpy(&out[i * sizeof(id)], &id, sizeof(id));
  }
  return out;
}

Status DecodeWorkerIds(const void* data, size_t len, int num_worker, std::vector<int>* ids) {
  if (len % sizeof(uint32_t) != 0 || len / sizeof(uint32_t) > static_cast<size_t>(num_worker))
    return Status::InvalidArgument("malformed worker id list of " + std::to_string(len) + " bytes");
  ids->resize(len / sizeof(uint32_t));
  for (size_t i = 0; i < ids->size(); ++i) {
    uint32_t id;
    memcpy(&id, static_cast<const char*>(data) + i * sizeof(id), sizeof(id));
    if (id >= static_cast<uint32_t>(num_worker))
      return Status::InvalidArgument("worker id " + std::to_string(id) + " is not in the job");
    (*ids)[i] = static_cast<int>(id);
  }
  return Status::OK();
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1) s += ",";
  return s + ")";
}

std::string EncodeRounds(const std::vector<std::pair<uint32_t, uint32_t>>& rounds) {
  std::string out(rounds.size() * 2 * sizeof(uint32_t), '\0');
  for (size_t i = 0; i < rounds.size(); ++i) {
    memcpy(&out[i * 8], &rounds[i].first, 4);
    memcpy(&out[i * 8 + 4], &rounds[i].second, 4);
  }
  return out;
}

Status DecodeRounds(const void* data, size_t len,
                    std::vector<std::pair<uint32_t, uint32_t>>* rounds) {
  if (len % 8 != 0 || len / 8 > (1u << 20))
    return Status::InvalidArgument("malformed round list of " + std::to_string(len) + " bytes");
  rounds->resize(len / 8);
  for (size_t i = 0; i < rounds->size(); ++i) {
    memcpy(&(*rounds)[i].first, static_cast<const char*>(data) + i * 8, 4);
    memcpy(&(*rounds)[i].second, static_cast<const char*>(data) + i * 8 + 4, 4);
  }
  return Status::OK();
}

}  // namespace byteps
