#include "control_client.h"

#include <chrono>
#include <cstdint>

#include "common/logging.h"

namespace byteps {

ControlClient::ControlClient(MessageFn on_message, FailureFn on_failure)
    : on_message_(std::move(on_message)), on_failure_(std::move(on_failure)) {}

ControlClient::~ControlClient() { Close(); }

Status ControlClient::Connect(Van* van, const std::string& host, int port, double timeout_s) {
  sched_name_ = "scheduler at " + host + ":" + std::to_string(port);
  Status st = van->Connect(host, port, timeout_s, this, sched_name_, &conn_);
  if (!st.ok()) return Status(st.code(), "cannot reach the " + sched_name_ + ": " + st.message());
  conn_->Start();
  return Status::OK();
}

std::string ControlClient::LocalAddress() const { return conn_ ? conn_->LocalAddress() : ""; }

Status ControlClient::Register(const RegisterMsg& reg, double timeout_s, AddressBook* book) {
  conn_->SendControl(MsgType::kRegister, Encode(reg));
  std::unique_lock<std::mutex> lk(mu_);
  bool ok = cv_.wait_for(lk, std::chrono::duration<double>(timeout_s),
                         [&] { return have_book_ || !failure_.ok(); });
  if (!failure_.ok()) return failure_;
  if (!ok)
    return Status::Timeout("the " + sched_name_ + " did not complete the rendezvous within " +
                           std::to_string(static_cast<int>(timeout_s)) +
                           " s (are all workers and servers started with the same DMLC_NUM_WORKER "
                           "and DMLC_NUM_SERVER?)");
  *book = book_;
  return Status::OK();
}

namespace {
int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

void ControlClient::StartHeartbeats(double interval_s, double timeout_s) {
  last_heard_ns_ = SteadyNowNs();
  hb_thread_ = std::thread([this, interval_s, timeout_s] {
    std::unique_lock<std::mutex> lk(mu_);
    while (!hb_stop_) {
      cv_.wait_for(lk, std::chrono::duration<double>(interval_s), [&] { return hb_stop_.load(); });
      if (hb_stop_) break;
      bool quiet = failure_.ok() && !finalized_ && !shutdown_ &&
                   (SteadyNowNs() - last_heard_ns_.load()) * 1e-9 > timeout_s;
      lk.unlock();
      if (quiet) {
        Fail(Status::PeerLost("heard nothing from the " + sched_name_ + " for " +
                              std::to_string(static_cast<int>(timeout_s)) +
                              " s (BYTEPS_HEARTBEAT_TIMEOUT): its host or the network to it is "
                              "gone"));
      } else if (conn_) {
        conn_->SendControl(MsgType::kHeartbeat, "");
      }
      lk.lock();
    }
  });
}

void ControlClient::Send(MsgType type, std::string payload, uint64_t key, uint8_t flags) {
  if (!conn_) return;
  auto* item = new SendItem;
  item->heap = true;
  item->owned = std::move(payload);
  item->hdr.type = static_cast<uint16_t>(type);
  item->hdr.key = key;
  item->hdr.flags = flags;
  item->payload = item->owned.data();
  item->len = item->owned.size();
  conn_->Send(item);
}

Status ControlClient::Finalize(double timeout_s) {
  if (!conn_) return Status::OK();
  conn_->SendControl(MsgType::kFinalize, "");
  std::unique_lock<std::mutex> lk(mu_);
  bool ok = cv_.wait_for(lk, std::chrono::duration<double>(timeout_s),
                         [&] { return finalized_ || shutdown_ || !failure_.ok(); });
  if (finalized_ || shutdown_) return Status::OK();
  if (!failure_.ok()) return failure_;
  return ok ? Status::OK()
            : Status::Timeout("the " + sched_name_ + " did not acknowledge shutdown within " +
                              std::to_string(static_cast<int>(timeout_s)) + " s");
}

Status ControlClient::WaitForShutdown() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return shutdown_ || !failure_.ok(); });
  return shutdown_ ? Status::OK() : failure_;
}

void ControlClient::Close() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    closing_ = true;
    hb_stop_ = true;
  }
  cv_.notify_all();
  if (hb_thread_.joinable()) hb_thread_.join();
  if (conn_) {
    conn_->Flush(1.0);
    conn_->Join();
  }
}

void ControlClient::Fail(const Status& st) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!failure_.ok() || closing_ || shutdown_ || finalized_) return;
    failure_ = st;
  }
  cv_.notify_all();
  if (on_failure_) on_failure_(st);
}

Status ControlClient::OnHeader(Connection*, const FrameHeader& h, void**) {
  if (!IsControlType(TypeOf(h)))
    return Status::InvalidArgument(std::string("unexpected ") + MsgTypeName(TypeOf(h)) +
                                   " from the scheduler");
  return Status::OK();
}

void ControlClient::OnFrame(Connection*, const FrameHeader& h, void* payload) {
  const char* p = static_cast<const char*>(payload);
  last_heard_ns_ = SteadyNowNs();
  switch (TypeOf(h)) {
    case MsgType::kAddressBook: {
      AddressBook book;
      Status st = Decode(p, h.payload_len, &book);
      if (!st.ok()) return Fail(st);
      {
        std::lock_guard<std::mutex> lk(mu_);
        book_ = std::move(book);
        have_book_ = true;
      }
      cv_.notify_all();
      return;
    }
    case MsgType::kFinalizeDone:
    case MsgType::kShutdown: {
      {
        std::lock_guard<std::mutex> lk(mu_);
        (TypeOf(h) == MsgType::kShutdown ? shutdown_ : finalized_) = true;
      }
      cv_.notify_all();
      if (on_message_) on_message_(h, p, h.payload_len);
      return;
    }
    case MsgType::kNodeFailed: {
      // A configuration that differs across nodes is the user's to fix: ConfigError on every
      // node; anything else is a lost peer.
      std::string text = DecodeText(p, h.payload_len);
      if (text.rfind("configuration mismatch: ", 0) == 0) return Fail(Status::Config(text));
      return Fail(Status::PeerLost(text));
    }
    default:
      if (on_message_) on_message_(h, p, h.payload_len);
  }
}

void ControlClient::OnClosed(Connection*, const Status& why) {
  Fail(Status::PeerLost("lost the connection to the " + sched_name_ + " (" + why.message() + ")"));
}

}  // namespace byteps
