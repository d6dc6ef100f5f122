#include "connection.h"
#include <cstdint>

namespace byteps {
namespace {
char g_discard_tag;
}  // namespace

void* const Connection::kDiscard = &g_discard_tag;

void Connection::SendCopy(uint16_t type, std::string payload, uint64_t key, uint32_t sender,
                          uint64_t aux) {
  auto* item = new SendItem;
  item->heap = true;
  item->owned = std::move(payload);
  item->hdr.type = type;
  item->hdr.key = key;
  item->hdr.sender = sender;
  item->hdr.aux = aux;
  item->hdr.payload_len = item->owned.size();
  item->payload = item->owned.data();
  item->len = item->owned.size();
  Send(item);
}

}  // namespace byteps
