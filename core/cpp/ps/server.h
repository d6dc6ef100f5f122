// The summation service's connection side (BytePS, OSDI'20 §3.2; docs/architecture.md §7):
// accepts and owns the worker connections (HELLO, GOODBYE, one connection per worker machine),
// hands every push, pull and stall query to the round logic (ps/summation_engine.h: versioned
// rounds by parity, pointer rotation, engine threads with each key bound to one) and sends what
// that asks for (sums, stall reports, errors) over the connections, as its ReplySink.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "comm/van.h"
#include "ps/control_client.h"
#include "ps/protocol.h"
#include "ps/summation_engine.h"

namespace byteps {

struct ServerOptions {
  std::string scheduler_host;
  int scheduler_port = 0;
  std::string node_host;   // "" = address on the route to the scheduler
  std::string interface;   // used when node_host is empty
  int port = 0;
  int num_worker = 1;
  int num_server = 1;
  int engine_threads = 2;
  uint32_t local_size = 1;
  double timeout_s = 120;
  double heartbeat_interval_s = 1;
  double heartbeat_timeout_s = 15;
  VanSpec van;  // of every connection (the job's: VanSpec::FromKnobs)
  bool trace = false;  // BYTEPS_TRACE_ON: time every round for the workers' timelines
  // HiPS (docs/schemes.md): worker machines per group (BYTEPS_HIPS_GROUP resolved; 0: no
  // HiPS). With at least groups + 1 servers, servers 0..groups-1 are the first level (server i
  // sums group i and forwards to the top), the others the top level.
  int hips_group = 0;
  bool async_mode = false;   // BYTEPS_ENABLE_ASYNC (docs/async.md)
  int max_staleness = -1;    // BYTEPS_ASYNC_MAX_STALENESS
};

class SummationServer : public PsConnectionHandler, public ReplySink {
 public:
  explicit SummationServer(ServerOptions opts);
  ~SummationServer() override;
  // Serves until the scheduler says the job is over (OK) or the job fails (error).
  Status Run();

  Status OnHeader(Connection* c, const FrameHeader& h, void** dest) override;
  void OnFrame(Connection* c, const FrameHeader& h, void* payload) override;
  void OnClosed(Connection* c, const Status& why) override;

 private:
  // ReplySink: over the worker connections.
  std::unique_ptr<KeyAttachment> Attach(const RoundKey& k) override;
  // Fixed slots from the van (Van::AllocateMemory: shared memory colocated workers write into).
  char* AllocateSlot(size_t len) override;
  void FreeSlot(char* p) override;
  void SendSum(int worker, RoundKey& k, int parity) override;
  // A frame of key k's data (a pull response, or HiPS's push up) from this server: type, dtype,
  // key, round and sender set, everything else cleared.
  FrameHeader KeyFrame(MsgType type, const RoundKey& k, uint32_t round) const;
  void Forward(RoundKey& k, int parity) override;
  void SendValue(int worker, RoundKey& k) override;
  void SendStallReport(int worker, uint64_t key, uint32_t round,
                       const std::vector<int>& missing) override;
  void SendError(int worker, const std::string& message) override;

  // A key's reply frames, [worker * 2 + parity], reused every round.
  // Per key: the reply frames, and the key's buffers (sums, staging) registered with the van
  // once for the job (Van::RegisterMemory: a van with remote memory access sends from and
  // receives into them without registering them per message).
  struct Replies : KeyAttachment {
    std::vector<SendItem> items;
    SendItem forward[2];  // HiPS, a first-level key: the group's sum to the top, by parity
    Van* van = nullptr;
    std::vector<char*> registered;
    ~Replies() override {
      for (char* p : registered) van->UnregisterMemory(p);
    }
  };
  void OnAccepted(std::unique_ptr<Connection> conn);
  Connection* Worker(int worker);
  // One-way pull responses (docs/rdma.md): a window a worker offered on where its sums of a key
  // go (PULL_WINDOW), opened on its connection; an odd round's sum goes `stride` bytes in.
  struct PullWindow {
    uint32_t id = 0;
    uint64_t stride = 0;
  };
  // Worker `worker`'s connection and, in *w, its window for `key` (id 0: none).
  Connection* Worker(int worker, uint64_t key, PullWindow* w);
  void OpenPullWindow(Connection* c, const FrameHeader& h, const void* blob);
  // RETIRE_KEYS from the scheduler: the keys of `declared_key` below `generation` are freed.
  void RetireKeys(uint64_t declared_key, uint64_t generation);
  // A first-level HiPS server (by group) connected to this top-level one.
  Connection* Lower(int group);
  // One-way pushes (docs/rdma.md): the window on worker `worker`'s slot of the key of this
  // push, for its first acknowledgement on connection c (empty: none, or sent before).
  std::string WindowFor(Connection* c, const FrameHeader& h, void* slot);
  // Checks a one-way push (FrameHeader::written): its key's window went to this connection.
  Status CheckWritten(Connection* c, const FrameHeader& h);
  // HiPS: a first-level server's connections to every top-level server, made before any
  // worker's frame is read (hips_uplink.cc).
  Status ConnectUplinks(const AddressBook& book);
  int HipsGroups() const;
  // The handler of the uplinks: acknowledgements, and the top level's totals.
  class Uplink : public PsConnectionHandler {
   public:
    explicit Uplink(SummationServer* s) : s_(s) {}
    Status OnHeader(Connection* c, const FrameHeader& h, void** dest) override;
    void OnFrame(Connection* c, const FrameHeader& h, void* payload) override;
    void OnClosed(Connection* c, const Status& why) override;

   private:
    SummationServer* s_;
  };
  // Connection::tag of a first-level server's connection at a top-level one: this + group.
  static constexpr int kServerTag = 1 << 20;

  ServerOptions opts_;
  int rank_ = -1;
  std::atomic<bool> stopping_{false};
  std::mutex book_mu_;  // rounds_.Configure against the handlers' reads
  std::unique_ptr<Van> van_;  // outlives control_ and conns_
  std::unique_ptr<ControlClient> control_;
  std::mutex conns_mu_;
  std::vector<std::unique_ptr<Connection>> conns_;
  std::vector<Connection*> workers_;
  // [worker]: the keys whose window (true) or lack of one (false) its connection was told, since
  // its HELLO; touched only by that connection's handler calls.
  std::vector<std::unordered_map<uint64_t, bool>> windows_;
  // [worker]: the pull windows its connection offered, by key; under conns_mu_ (the engine
  // threads read them as they send sums), cleared at its HELLO.
  std::vector<std::unordered_map<uint64_t, PullWindow>> pull_windows_;
  // Accepted connections are started (their frames read) only once the address book has given
  // rounds_ the job's partition bound: no push is read before it is known, and no handler waits
  // for it (a van may run every connection's handlers on one thread, the UCX van does).
  bool have_book_ = false;
  std::vector<Connection*> unstarted_;
  // HiPS: this first-level server's uplinks (by top-level rank - groups), the roles its
  // first-level keys are made with (same index), the top-level keys' role, and at a top-level
  // server the first-level servers' connections by group.
  Uplink uplink_handler_{this};
  std::vector<std::unique_ptr<Connection>> uplinks_;
  std::vector<KeyRole> first_roles_;
  KeyRole top_role_;
  std::vector<Connection*> lowers_;
  // The round logic; its keys hold the reply frames, so the connections are joined (their
  // queues emptied) before it stops and frees them.
  SummationEngine rounds_;
};

}  // namespace byteps
