// Payloads of the control-plane messages between nodes and the scheduler (ps/protocol.h types).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace byteps {

enum class NodeRole : uint8_t { kWorker = 0, kServer = 1, kScheduler = 2 };
const char* NodeRoleName(NodeRole r);

struct RegisterMsg {
  NodeRole role = NodeRole::kWorker;
  int32_t worker_id = -1;  // workers: DMLC_WORKER_ID; servers: -1
  std::string host;        // advertised address
  uint32_t port = 0;       // servers: data port; workers: the worker mesh's port (0: none)
  uint32_t local_size = 1;
  uint32_t num_worker = 0;
  uint32_t num_server = 0;
  uint64_t partition_bound = 0;
  uint32_t pid = 0;
  // BYTEPS_ENABLE_ASYNC and BYTEPS_ASYNC_MAX_STALENESS of the node: the scheduler fails the job
  // on every node when they differ from its own (docs/async.md).
  bool async_mode = false;
  int32_t max_staleness = -1;
};

struct ServerEntry {
  uint32_t rank = 0;
  std::string host;
  uint32_t port = 0;
  bool colocated = false;
  double share = 0;
};

// A worker machine's local root as the worker mesh reaches it (ps/peer_mesh.h).
struct WorkerEntry {
  uint32_t id = 0;  // DMLC_WORKER_ID
  std::string host;
  uint32_t port = 0;  // 0: it does not listen (no all-reduce scheme in the job)
};

struct AddressBook {
  int32_t my_rank = -1;  // worker id or server rank of the receiver
  std::vector<ServerEntry> servers;
  std::vector<WorkerEntry> workers;  // by worker id
  // Largest partition any worker pushes (bytes; the workers' common BYTEPS_PARTITION_BYTES
  // bound): a server refuses a larger push before allocating anything for it.
  uint64_t partition_bound = 0;
};

// The longest compressor text a DECLARE or KEY_CONFIG may carry (bytes).
constexpr size_t kMaxCompressionSpec = 4096;

struct DeclareMsg {
  uint32_t declared_key = 0;
  std::string name;
  uint8_t dtype = 0;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
  // The compressor's canonical kwargs (compress::FormatSpec) when the tensor is compressed;
  // empty otherwise. Part of what every worker must declare alike.
  std::string compression;
  // The job-level partition bound the worker cut the tensor with (0: the registered one) and
  // the generation of its keys (bits 32-47 of each key): BYTEPS_AUTOTUNE re-declares a tensor
  // cut anew under new keys (docs/autotune.md). Both must agree across workers.
  uint64_t partition_bound = 0;
  uint32_t generation = 0;
  // The tensor's synchronization scheme (SyncScheme, ps/sync_scheme.h) and its parameter (a
  // tree: its width; hips: worker machines per group; 0 otherwise): both must agree across
  // workers (docs/schemes.md).
  uint8_t sync = 0;
  uint32_t sync_param = 0;
  // How the tensor's values combine (reduce::ReduceOp: sum, min, max, product;
  // docs/collectives.md): must agree across workers.
  uint8_t op = 0;
  // Which collective (Collective, ps/collective_programs.h) and its layout: the blocks'
  // offsets (allgather, reducescatter) or the root machine (broadcast; -1 otherwise). All must
  // agree across workers (docs/collectives.md).
  uint8_t collective = 0;
  int32_t root = -1;
  int32_t root_rank = -1;
  std::vector<uint64_t> blocks;
  // A process set's tensor (declared key bits 16-31 nonzero): the worker machines of the set,
  // ascending, each of which declares it (empty: every worker). Must agree across them.
  std::vector<int64_t> members;
};

// KEY_CONFIG payload, sent by a worker on the connection its pushes of the key take, before
// them: a compressed key's dtype, uncompressed element count and compressor, and a process
// set's key's worker machines (ascending; the only ones that push it). At least one of the two.
struct KeyConfigMsg {
  uint8_t dtype = 0;
  uint64_t count = 0;
  std::string compression;
  std::vector<int64_t> members;
  uint8_t op = 0;  // reduce::ReduceOp of a process set's key (a compressed key sums)
};

std::string Encode(const RegisterMsg& m);
std::string Encode(const AddressBook& m);
std::string Encode(const DeclareMsg& m);
std::string Encode(const KeyConfigMsg& m);
Status Decode(const void* data, size_t len, RegisterMsg* m);
Status Decode(const void* data, size_t len, AddressBook* m);
Status Decode(const void* data, size_t len, DeclareMsg* m);
Status Decode(const void* data, size_t len, KeyConfigMsg* m);

// DECLARE_REPLY: header aux 0 = OK, 1 = mismatch, 2 = timeout. OK: the server rank of each partition. Error: a message.
std::string EncodeDeclareOk(const std::vector<int64_t>& servers);
std::string EncodeText(const std::string& text);
Status DecodeDeclareOk(const void* data, size_t len, std::vector<int64_t>* servers);
std::string DecodeText(const void* data, size_t len);

// Stall reports (DECLARE_REPLY aux 3 from the scheduler, STALL_REPORT from a server): the worker
// machines that have not submitted, as little-endian uint32 ids, nothing else. Decoding fails on
// a ragged length or an id outside [0, num_worker).
std::string EncodeWorkerIds(const std::vector<int>& ids);
// JOIN / JOIN_DONE payload: (declared key, round) pairs, at most 1 << 20 of them.
std::string EncodeRounds(const std::vector<std::pair<uint32_t, uint32_t>>& rounds);
Status DecodeRounds(const void* data, size_t len,
                    std::vector<std::pair<uint32_t, uint32_t>>* rounds);
Status DecodeWorkerIds(const void* data, size_t len, int num_worker, std::vector<int>* ids);

std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace byteps
