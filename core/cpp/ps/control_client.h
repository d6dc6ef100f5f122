// The node side of the control plane (workers' local roots and servers): connect to the
// scheduler, register, receive the address book, send heartbeats, declare tensors, finalize.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/van.h"
#include "ps/control_msgs.h"
#include "ps/protocol.h"

namespace byteps {

class ControlClient : public PsConnectionHandler {
 public:
  // Frames other than ADDRESS_BOOK / FINALIZE_DONE go here (receiver thread).
  using MessageFn = std::function<void(const FrameHeader& h, const char* payload, size_t len)>;
  // The scheduler is gone or declared the job failed (called once).
  using FailureFn = std::function<void(const Status& st)>;

  ControlClient(MessageFn on_message, FailureFn on_failure);
  ~ControlClient() override;

  // Connects through `van` (which must outlive this client) and starts the connection.
  Status Connect(Van* van, const std::string& host, int port, double timeout_s);
  // Address of this host on the route to the scheduler.
  std::string LocalAddress() const;
  // Sends REGISTER and waits for the ADDRESS_BOOK (or a failure / timeout).
  Status Register(const RegisterMsg& reg, double timeout_s, AddressBook* book);
  // Sends a heartbeat every interval_s; the scheduler echoes each one. Nothing heard from the
  // scheduler for timeout_s (BYTEPS_HEARTBEAT_TIMEOUT: its host or the network to it is gone,
  // which TCP alone reports only after many minutes) fails the node with kPeerLost.
  void StartHeartbeats(double interval_s, double timeout_s);
  void Send(MsgType type, std::string payload, uint64_t key = 0, uint8_t flags = 0);
  // Sends FINALIZE and waits for FINALIZE_DONE (workers) or SHUTDOWN.
  Status Finalize(double timeout_s);
  // Servers: waits until the scheduler says SHUTDOWN (OK) or the job fails (error).
  Status WaitForShutdown();
  void Close();
  std::string scheduler_name() const { return sched_name_; }

  Status OnHeader(Connection* c, const FrameHeader& h, void** dest) override;
  void OnFrame(Connection* c, const FrameHeader& h, void* payload) override;
  void OnClosed(Connection* c, const Status& why) override;

 private:
  void Fail(const Status& st);

  MessageFn on_message_;
  FailureFn on_failure_;
  std::unique_ptr<Connection> conn_;
  std::string sched_name_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool have_book_ = false;
  AddressBook book_;
  bool finalized_ = false;
  bool shutdown_ = false;
  bool closing_ = false;
  Status failure_;
  std::thread hb_thread_;
  std::atomic<bool> hb_stop_{false};
  std::atomic<int64_t> last_heard_ns_{0};  // steady clock: the last frame from the scheduler
};

}  // namespace byteps
