// SPDX-License-Identifier: Apache-2.0
// The trainer socket: a filesystem Unix stream socket in a pod-local directory (mode 0700, the
// socket 0600) where each trainer process connects once and speaks framed protobuf
// (common/framing.h): TrainerMessage in, AgentReply out.
//
// A connection is anonymous until its first message, which must be a hello naming its local
// rank. A hello for a rank that is connected is refused while that connection's process lives
// (another process cannot take a rank over); a restarted trainer's hello replaces the dead
// process's connection. Anonymous connections are bounded: at most kMaxAnonymous at once (more
// are closed at accept), each must say hello within kHelloTimeout, and its frames may be at most
// kMaxHelloBytes until it has. A frame over the bound, a payload that does not parse, or any
// message before the hello closes that connection with a logged error; the server itself never
// fails for what a peer sends.
// Everything runs on the EventLoop's thread; the listener's callbacks run there too.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "agent/event_loop.h"
#include "common/framing.h"
#include "common/log_limit.h"
#include "common/status.h"
#include "regroup/v1/wire.pb.h"

namespace regroup::agent {

class TrainerServer {
 public:
  class Listener {
   public:
    virtual ~Listener() = default;
    // A connection said hello for `local_rank` (already in range) and is now that rank's.
    virtual void OnHello(uint32_t local_rank, const regroup::v1::TrainerHello& hello) = 0;
    // Any later message from that rank's current connection.
    virtual void OnMessage(uint32_t local_rank, const regroup::v1::TrainerMessage& message) = 0;
    // The rank's current connection closed (not called when a newer hello replaced it).
    virtual void OnDisconnect(uint32_t local_rank) = 0;
  };

  // The largest reply backlog a trainer may leave unread before its connection is closed.
  static constexpr size_t kMaxPendingBytes = 64u << 20;
  // Bounds on connections that have not said hello (see above).
  static constexpr size_t kMaxAnonymous = 64;
  static constexpr std::chrono::milliseconds kHelloTimeout{10000};
  static constexpr size_t kMaxHelloBytes = 64u << 10;

  // Creates `dir` (mode 0700; an existing one must be a directory owned by this user) and
  // listens on `dir`/agent.sock (mode 0600) for ranks 0..nproc-1.
  static StatusOr<std::unique_ptr<TrainerServer>> Listen(
      EventLoop* loop, const std::string& dir, uint32_t nproc, Listener* listener,
      size_t max_frame_bytes = kMaxFrameBytes);
  ~TrainerServer();  // closes every connection, removes the socket (and the directory if empty)

  const std::string& socket_path() const { return socket_path_; }
  bool connected(uint32_t local_rank) const { return ranks_.count(local_rank) != 0; }
  // Queues a reply to the rank's connection; false when the rank has none.
  bool Send(uint32_t local_rank, const regroup::v1::AgentReply& reply);
  // The peer pid of the rank's connection (SO_PEERCRED), 0 when unknown.
  pid_t peer_pid(uint32_t local_rank) const;
  // Closes the connections that have not said hello within kHelloTimeout of `now`. The agent
  // calls it from its timers.
  void CloseSilent(std::chrono::steady_clock::time_point now);
  size_t anonymous() const { return connections_.size() - ranks_.size(); }

 private:
  struct Connection {
    int fd = -1;
    int64_t local_rank = -1;  // -1 until the hello
    pid_t peer_pid = 0;
    std::chrono::steady_clock::time_point accepted;
    FrameReader reader;
    std::string pending;  // unsent bytes of queued replies
    explicit Connection(size_t max_frame_bytes) : reader(max_frame_bytes) {}
  };

  TrainerServer(EventLoop* loop, uint32_t nproc, Listener* listener, size_t max_frame_bytes)
      : loop_(loop), nproc_(nproc), listener_(listener), max_frame_bytes_(max_frame_bytes) {}

  void Accept();
  void OnEvents(int fd, uint32_t events);
  void ReadFrom(Connection& c);
  bool Flush(Connection& c);  // false: the connection failed and was closed
  void Close(int fd, bool notify);
  void CloseWithError(Connection& c, const std::string& why);
  std::string Describe(const Connection& c) const;

  EventLoop* loop_;
  uint32_t nproc_;
  Listener* listener_;
  size_t max_frame_bytes_;
  std::string dir_;
  bool created_dir_ = false;
  std::string socket_path_;
  int listen_fd_ = -1;
  bool owns_socket_ = false;  // bound by this server: removed with it
  std::unordered_map<int, std::unique_ptr<Connection>> connections_;  // by descriptor
  std::unordered_map<uint32_t, int> ranks_;                           // local rank -> descriptor
  LogLimit refusal_log_{std::chrono::seconds(5)};  // connections refused over kMaxAnonymous
};

}  // namespace regroup::agent
