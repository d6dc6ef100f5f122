// The worker mesh (docs/schemes.md): connections between the local roots of the worker
// machines, for the all-reduce schemes (ring, tree). Each local root listens on the job's van
// (TCP, or UCX when selected), registers that port with the scheduler (RegisterMsg::port), and
// finds the others in the address book (AddressBook::workers). For each pair of machines that
// exchange messages (CollectivePeers) the one with the larger worker id connects, with the
// job-secret handshake of every van connection (comm/auth.h), and says PEER_HELLO; one
// connection per pair carries both directions. Frames: COLLECTIVE (one step of a partition's
// program, handed to the CollectiveSink) and PEER_GOODBYE (the peer shut down).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/van.h"
#include "ps/control_msgs.h"
#include "ps/protocol.h"

namespace byteps {

// The worker core's side: where COLLECTIVE payloads go and what happens to peers.
class CollectiveSink {
 public:
  virtual ~CollectiveSink() = default;
  // A COLLECTIVE frame from worker machine `peer` (its receiving thread): where its payload
  // goes, as ConnectionHandler::OnHeader's *dest. A non-OK status drops the connection.
  virtual Status CollectiveDestination(int peer, const FrameHeader& h, void** dest) = 0;
  // Its payload is in place.
  virtual void OnCollective(int peer, const FrameHeader& h) = 0;
  // The peer said PEER_GOODBYE: it has shut down and will send nothing more.
  virtual void OnPeerLeft(int peer) = 0;
  // The peer gave up on round `round` of declared key `key` (PEER_ABORT): `text` says why.
  virtual void OnPeerAbort(int peer, uint32_t key, uint32_t round, const std::string& text) = 0;
  // The connection to the peer broke while neither side was shutting down (after a short wait
  // for news of a failure elsewhere: `failed()` of the constructor).
  virtual void OnPeerLost(int peer, const Status& why) = 0;
};

class PeerMesh : public PsConnectionHandler {
 public:
  using StateFn = std::function<bool()>;
  // `failed()`, `stopping()`: the worker's state; a lost peer is reported only when neither
  // holds after up to a second (its scheduler may be telling us of the real cause).
  // `peers`: the worker machines this one exchanges messages with (CollectivePeers), known
  // before listening: a peer may connect as soon as it has the address book.
  PeerMesh(int me, int num_worker, std::vector<int> peers, CollectiveSink* sink, StateFn failed,
           StateFn stopping);
  ~PeerMesh() override;

  // Listens on `van` (which must outlive the mesh) at host, any free port.
  Status Listen(Van* van, const std::string& host, int* port);
  // Connects to the peers with a smaller worker id and waits for those with a larger one to
  // connect, all within timeout_s. `book`: every worker's address, by worker id.
  Status Connect(const std::vector<WorkerEntry>& book, double timeout_s);
  bool Connected(int peer) const;
  // Sends a frame to `peer` (its done callback fails with kPeerLost if there is no connection).
  void Send(int peer, SendItem* item);
  // PEER_GOODBYE to every peer, flushed (at most 2 s).
  void Goodbye();
  // PEER_ABORT of (declared key, round) to every peer still here.
  void Abort(uint32_t key, uint32_t round, const std::string& text);
  // Stops listening and joins every connection.
  void Close();

  Status OnHeader(Connection* c, const FrameHeader& h, void** dest) override;
  void OnFrame(Connection* c, const FrameHeader& h, void* payload) override;
  void OnClosed(Connection* c, const Status& why) override;

 private:
  void OnAccepted(std::unique_ptr<Connection> conn);

  const int me_, num_worker_;
  const std::vector<int> peers_;
  CollectiveSink* sink_;
  StateFn failed_, stopping_;
  Van* van_ = nullptr;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Connection>> conns_;  // every one made or accepted
  std::vector<Connection*> by_peer_;                // by worker id, once it said who it is
  std::vector<bool> expected_;                      // peers this machine exchanges data with
  std::unique_ptr<std::atomic<bool>[]> left_;       // said PEER_GOODBYE
  bool closing_ = false;
  std::mutex blame_mu_;
  std::vector<std::thread> blame_;
};

}  // namespace byteps
