// The summation service (BytePS, OSDI'20 §3.2; docs/architecture.md §7): receives the partitions
// pushed by every worker machine, sums them with the SIMD kernels on engine threads (each key bound
// to one thread), and answers pulls once a round is complete.
//
// Rounds are versioned: key state is double-buffered by round parity, so a fast worker's push of
// round r+1 never touches the sum of round r that a slow worker has not pulled. A worker can only
// push round r+2 after every worker has received round r (it needs the r+1 sum, which needs
// everyone's r+1 push, which each sends only after receiving r), which is why two buffers
// suffice. The first push of a round costs no copy: its staging buffer becomes the round's sum
// buffer and the old sum buffer becomes that worker's staging buffer (pointer rotation).
#pragma once
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "comm/van.h"
#include "common/dtype.h"
#include "common/ring_queue.h"
#include "ps/control_client.h"
#include "ps/protocol.h"

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
};

class SummationServer : public PsConnectionHandler {
 public:
  explicit SummationServer(ServerOptions opts);
  ~SummationServer() override;
  // Serves until the scheduler says the job is over (OK) or the job fails (error).
  Status Run();

  Status OnHeader(Connection* c, const FrameHeader& h, void** dest) override;
  void OnFrame(Connection* c, const FrameHeader& h, void* payload) override;
  void OnClosed(Connection* c, const Status& why) override;

 private:
  struct KeyState {
    uint64_t key = 0;
    DType dtype = DType::kFloat32;
    size_t len = 0;
    int engine = 0;
    char* sum[2] = {nullptr, nullptr};
    std::vector<std::atomic<char*>> staging;  // per worker
    uint32_t round[2] = {0, 0};
    int count[2] = {0, 0};
    bool complete[2] = {false, false};
    std::vector<int> waiting[2];   // workers whose pull arrived before the round completed
    std::vector<uint8_t> pushed[2];  // [worker]: pushed in the open round (stall reports)
    std::vector<SendItem> replies;  // [worker * 2 + parity], reused every round
    std::vector<char*> owned;
  };
  struct Event {
    bool is_push = false;
    bool is_stall_query = false;  // kStallQuery: report the workers that have not pushed
    bool pull_too = false;  // a push that is also a pull (kPushFlagPull)
    KeyState* ks = nullptr;
    int worker = 0;
    uint32_t round = 0;
  };
  struct Engine {
    RingQueue<Event> queue;
    std::thread thread;
    uint64_t load_bytes = 0;
  };

  void OnAccepted(std::unique_ptr<Connection> conn);
  void EngineLoop(Engine* e);
  void HandlePush(const Event& ev);
  void HandlePull(const Event& ev);
  void HandleStallQuery(const Event& ev);
  void SendStallReport(int worker, uint64_t key, uint32_t round, const std::vector<int>& missing);
  void Reply(KeyState* ks, int worker, int parity);
  KeyState* CreateKey(uint64_t key, DType dtype, size_t len);
  KeyState* FindKey(uint64_t key);
  void SendError(Connection* c, const std::string& msg);

  ServerOptions opts_;
  int rank_ = -1;
  std::atomic<bool> stopping_{false};
  // The job's partition bound (from the address book): no push may be larger. A worker's HELLO
  // waits for it, so no push is read before it is known.
  std::mutex book_mu_;
  std::condition_variable book_cv_;
  std::atomic<uint64_t> partition_bound_{0};
  std::unique_ptr<Van> van_;  // outlives control_ and conns_
  std::unique_ptr<ControlClient> control_;
  std::mutex conns_mu_;
  std::vector<std::unique_ptr<Connection>> conns_;
  std::vector<Connection*> workers_;
  std::shared_mutex keys_mu_;
  std::unordered_map<uint64_t, std::unique_ptr<KeyState>> keys_;
  std::vector<std::unique_ptr<Engine>> engines_;
};

}  // namespace byteps
