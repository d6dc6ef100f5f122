#include "protocol.h"

#include <cstdint>
#include <string>

#include "common/dtype.h"

namespace byteps {

bool IsControlType(MsgType t) {
  return (static_cast<uint16_t>(t) >= 1 && static_cast<uint16_t>(t) <= 11) ||
         t == MsgType::kJoin || t == MsgType::kJoinDone;
}

const char* MsgTypeName(MsgType t) {
  switch (t) {
    case MsgType::kRegister: return "REGISTER";
    case MsgType::kAddressBook: return "ADDRESS_BOOK";
    case MsgType::kDeclare: return "DECLARE";
    case MsgType::kDeclareReply: return "DECLARE_REPLY";
    case MsgType::kHeartbeat: return "HEARTBEAT";
    case MsgType::kFinalize: return "FINALIZE";
    case MsgType::kFinalizeDone: return "FINALIZE_DONE";
    case MsgType::kShutdown: return "SHUTDOWN";
    case MsgType::kNodeFailed: return "NODE_FAILED";
    case MsgType::kWorkerLeft: return "WORKER_LEFT";
    case MsgType::kRetireKeys: return "RETIRE_KEYS";
    case MsgType::kHello: return "HELLO";
    case MsgType::kPush: return "PUSH";
    case MsgType::kPull: return "PULL";
    case MsgType::kPullResponse: return "PULL_RESPONSE";
    case MsgType::kDataError: return "DATA_ERROR";
    case MsgType::kGoodbye: return "GOODBYE";
    case MsgType::kStallQuery: return "STALL_QUERY";
    case MsgType::kStallReport: return "STALL_REPORT";
    case MsgType::kPushAck: return "PUSH_ACK";
    case MsgType::kKeyConfig: return "KEY_CONFIG";
    case MsgType::kPeerHello: return "PEER_HELLO";
    case MsgType::kCollective: return "COLLECTIVE";
    case MsgType::kPeerGoodbye: return "PEER_GOODBYE";
    case MsgType::kPeerAbort: return "PEER_ABORT";
    case MsgType::kPullWindow: return "PULL_WINDOW";
    case MsgType::kJoin: return "JOIN";
    case MsgType::kJoinDone: return "JOIN_DONE";
  }
  return "UNKNOWN";
}

Status ValidatePsHeader(const FrameHeader& h) {
  MsgType t = TypeOf(h);
  bool known = IsControlType(t) || (h.type >= 20 && h.type <= 34);
  if (!known) return Status::InvalidArgument("unknown message type " + std::to_string(h.type));
  if (!DTypeValid(h.dtype)) return Status::InvalidArgument("bad dtype " + std::to_string(h.dtype));
  uint64_t limit = IsControlType(t) || t == MsgType::kDataError || t == MsgType::kHello ||
                           t == MsgType::kStallReport || t == MsgType::kKeyConfig ||
                           t == MsgType::kPeerAbort
                       ? kMaxControlPayload
                       : kMaxDataPayload;
  if (h.payload_len > limit)
    return Status::InvalidArgument(std::string(MsgTypeName(t)) + " payload of " +
                                   std::to_string(h.payload_len) + " bytes exceeds the limit " +
                                   std::to_string(limit));
  if ((t == MsgType::kPull || t == MsgType::kGoodbye || t == MsgType::kStallQuery ||
       t == MsgType::kRetireKeys ||
       t == MsgType::kPeerHello || t == MsgType::kPeerGoodbye) &&
      h.payload_len != 0)
    return Status::InvalidArgument(std::string(MsgTypeName(t)) + " must not carry a payload");
  if ((t == MsgType::kPushAck || t == MsgType::kPullWindow) && h.payload_len > kMaxWindowBlob)
    return Status::InvalidArgument(std::string(MsgTypeName(t)) + " with a window of " +
                                   std::to_string(h.payload_len) + " bytes (at most " +
                                   std::to_string(kMaxWindowBlob) + ")");
  // A one-way push or pull response (written into the receiver's window) announces its bytes
  // and carries none.
  const bool may_write = t == MsgType::kPush || t == MsgType::kPullResponse;
  if (h.written != 0 && (!may_write || h.payload_len != 0 || h.written > kMaxDataPayload))
    return Status::InvalidArgument(std::string(MsgTypeName(t)) + " announcing " +
                                   std::to_string(h.written) + " bytes written one-way" +
                                   (may_write ? " and carrying a payload too" : ""));
  return Status::OK();
}

}  // namespace byteps
