// SPDX-License-Identifier: Apache-2.0
// One Manager.Session stream to the regroup-manager, driven by two threads of its own (a reader
// and a writer) so the agent's event loop never blocks on the network. Everything the stream
// delivers, and its end, is posted to an Inbox the loop drains; the loop sends by queueing.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "regroup/v1/wire.grpc.pb.h"
#include "regroup/v1/wire.pb.h"

namespace regroup::agent {

struct SessionEvent {
  enum class Kind { kOpened, kMessage, kClosed };
  Kind kind;
  uint64_t session;                      // which ManagerSession posted it
  regroup::v1::ManagerMessage message;   // kMessage
  std::string detail;                    // kClosed: the stream's final status
  bool ended_by_manager = false;         // kClosed: the manager finished the call (status OK)
};

// A thread-safe queue whose readiness is an eventfd the event loop watches.
class Inbox {
 public:
  Inbox();
  ~Inbox();
  Inbox(const Inbox&) = delete;
  Inbox& operator=(const Inbox&) = delete;

  int fd() const { return fd_; }
  void Push(SessionEvent event);
  std::deque<SessionEvent> Drain();  // also clears the eventfd

 private:
  int fd_ = -1;
  std::mutex mutex_;
  std::deque<SessionEvent> events_;
};

class ManagerSession {
 public:
  // The most messages queued and not yet written before the session is given up as stuck.
  static constexpr size_t kMaxQueued = 4096;

  // Opens the stream in the background; `credential` goes in the authorization metadata. The
  // call waits for the channel to connect (wait_for_ready), so a manager that is down is retried
  // by the channel's own backoff (100 ms growing to 0.5 s, set by MakeChannel) with this stream's
  // thread driving the connection attempts; kOpened is posted once the stream is open.
  ManagerSession(uint64_t id, std::shared_ptr<grpc::Channel> channel, std::string credential,
                 Inbox* inbox);
  ~ManagerSession();  // cancels the stream and joins the threads
  ManagerSession(const ManagerSession&) = delete;
  ManagerSession& operator=(const ManagerSession&) = delete;

  uint64_t id() const { return id_; }
  // Queues a message; messages are written in order. Over kMaxQueued the stream is cancelled.
  void Send(const regroup::v1::AgentMessage& message);
  // Waits up to `timeout` for every queued message to be written (or the stream to fail).
  bool Flush(std::chrono::milliseconds timeout);

  // How a Close went. `confirmed`: the manager read every message and then ended the session
  // normally; otherwise `reason` says why not, and `unwritten` holds what never left the queue.
  struct Closed {
    bool confirmed = false;
    std::string reason;
    std::deque<regroup::v1::AgentMessage> unwritten;
  };
  // Ends the session gracefully: writes what is queued, half-closes the stream, and waits up to
  // `timeout` for the manager to end it. A message gRPC accepted is only in the transport's
  // buffer until then: cancelling the call (as the destructor does) can discard it, so an agent
  // that exits calls this first.
  Closed Close(std::chrono::milliseconds timeout);
  // Ends the stream; a kClosed event follows.
  void Cancel();

 private:
  void Read();
  void Write();

  const uint64_t id_;
  std::shared_ptr<grpc::Channel> channel_;
  std::string credential_;
  Inbox* inbox_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<regroup::v1::AgentMessage, regroup::v1::ManagerMessage>>
      stream_;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<regroup::v1::AgentMessage> queue_;
  bool writing_ = false;      // the writer holds a message it took from the queue
  bool closing_ = false;      // the reader saw the end: the writer must stop
  bool write_failed_ = false;
  bool half_close_ = false;   // Close() asked the writer to half-close once the queue is empty
  bool ended_ = false;        // the call is over; end_status_ is its final status
  grpc::Status end_status_;
  std::thread reader_;
  std::thread writer_;
};

// Why the channel to the manager does not connect. A session's call waits for the channel
// (wait_for_ready) and so never fails with the reason; a call that does not wait fails once the
// connection attempt in progress failed, with gRPC's reason in its message (a TLS handshake
// failure's among them). Start() sends one such call, a GetStatus (harmless where the manager
// answers); Last() is the reason the last one gave, in words (regroup::DescribeCallFailure), or
// "" when it answered or none has ended yet.
class ConnectProbe {
 public:
  // `tls`: the channel is TLS (DescribeCallFailure's over_tls).
  ConnectProbe(std::shared_ptr<grpc::Channel> channel, std::string target, std::string credential,
               std::string job_id, bool tls = false);
  ~ConnectProbe();  // cancels the call in flight and waits for it to end
  ConnectProbe(const ConnectProbe&) = delete;
  ConnectProbe& operator=(const ConnectProbe&) = delete;

  // Sends a probe that ends within `deadline`; nothing while one is in flight.
  void Start(std::chrono::milliseconds deadline);
  std::string Last() const;

 private:
  struct Call;
  struct State {
    mutable std::mutex mutex;
    std::condition_variable ended;
    std::shared_ptr<Call> in_flight;
    std::shared_ptr<Call> ended_call;  // kept past its callback; freed by the next Start()
    std::string last;
  };
  std::shared_ptr<grpc::Channel> channel_;
  std::string target_, credential_, job_id_;
  bool tls_ = false;
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

}  // namespace regroup::agent
