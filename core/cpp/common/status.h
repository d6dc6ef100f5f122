// Status: the error value carried on every core path that can fail (docs/architecture.md §8).
// At the Python boundary a non-OK Status becomes a typed exception (byteps.errors).
#pragma once
#include <string>
#include <utility>

namespace byteps {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // bad input from the caller (shape, dtype, name...)
  kConfig = 2,           // bad or missing environment / knob value
  kMismatch = 3,         // tensors disagree across ranks (name, dtype, shape)
  kPeerLost = 4,         // a peer (worker, server, scheduler) died or its link broke
  kTimeout = 5,          // an operation or rendezvous did not finish in time
  kShutdown = 6,         // the core is shutting down / not initialised
  kInternal = 7,         // a bug or an OS error
};

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string msg) : code_(code), msg_(std::move(msg)) {}
  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status Config(std::string m) { return {StatusCode::kConfig, std::move(m)}; }
  static Status Mismatch(std::string m) { return {StatusCode::kMismatch, std::move(m)}; }
  static Status PeerLost(std::string m) { return {StatusCode::kPeerLost, std::move(m)}; }
  static Status Timeout(std::string m) { return {StatusCode::kTimeout, std::move(m)}; }
  static Status Shutdown(std::string m) { return {StatusCode::kShutdown, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return msg_; }
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string msg_;
};

const char* StatusCodeName(StatusCode c);

// Thrown only at API boundaries (pybind translates it); never inside background threads.
struct StatusError {
  Status status;
};

#define BPS_RETURN_IF_ERROR(expr)        \
  do {                                   \
    ::byteps::Status _st = (expr);       \
    if (!_st.ok()) return _st;           \
  } while (0)

}  // namespace byteps
