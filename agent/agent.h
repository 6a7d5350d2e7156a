// SPDX-License-Identifier: Apache-2.0
// regroup-agent: the parent of a pod's trainer processes and their link to the job's manager.
//
// One thread (an epoll loop) owns all state: the trainer socket, the children (SIGCHLD through a
// signalfd, so an exit is seen at once), SIGTERM/SIGINT, timers, and the events of the manager
// session, whose gRPC stream runs on two threads of its own (manager_session.h). What the agent
// decides, and what it promises the manager, is AgentCore's (agent_core.h): this class gives it
// processes, the trainer socket, the gRPC stream and the clock.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/agent_core.h"
#include "agent/event_loop.h"
#include "agent/manager_session.h"
#include "agent/options.h"
#include "agent/process.h"
#include "agent/trainer_server.h"
#include "agent/warm_starter.h"
#include "regroup/v1/wire.pb.h"

namespace regroup::agent {

class Agent final : private TrainerServer::Listener, private AgentHost {
 public:
  // `options` with ResolveDefaults applied; `credential` from LoadCredential (may be empty).
  Agent(AgentOptions options, std::string credential);
  ~Agent() override;
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Starts the trainers and runs until done. Blocks SIGCHLD, SIGTERM and SIGINT in the calling
  // thread first: call it before any other thread exists. Returns the process exit code.
  int Run();

 private:
  using Clock = std::chrono::steady_clock;
  static Millis Now();

  Status Setup();
  void OnTimers();
  int NextTimeoutMs() const;
  void OnSignals();
  void ReapChildren();
  void OnInbox();

  // AgentHost.
  void OpenSession() override;
  std::string ConnectFailure() override;
  void SendToManager(const regroup::v1::AgentMessage& message) override;
  void CancelSession() override;
  bool SendToTrainer(uint32_t r, const regroup::v1::AgentReply& reply) override;
  bool TrainerConnected(uint32_t r) const override;
  StatusOr<int> StartProcess(uint32_t r) override;
  void Signal(int pid, int signal) override;
  // Ports free on --host now (distinct), for the stores of the generations whose rank 0 is here.
  std::vector<uint32_t> FreePorts() override;
  std::optional<int64_t> CpuMs(int pid) override { return ProcessCpuMs(pid); }
  void Exit(int code, bool confirm, const std::string& sent_exits) override;

  // Trainers.
  void OnHello(uint32_t local_rank, const regroup::v1::TrainerHello& hello) override;
  void OnMessage(uint32_t local_rank, const regroup::v1::TrainerMessage& message) override;
  void OnDisconnect(uint32_t local_rank) override;

  AgentOptions options_;
  std::string credential_;
  EventLoop loop_;
  Inbox inbox_;
  int signal_fd_ = -1;
  std::unique_ptr<TrainerServer> server_;
  std::string executable_;
  std::vector<std::string> argv_;
  std::vector<std::vector<std::string>> env_;  // per local rank: computed at its first start
  sockaddr_storage host_addr_{};
  socklen_t host_addr_len_ = 0;

  // The manager link.
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<ManagerSession> session_;
  std::unique_ptr<ConnectProbe> probe_;  // why the channel does not connect, for the log
  uint64_t session_ids_ = 0;

  // Warm starts (warm_starter.h): null when off or given up.
  std::unique_ptr<WarmStarter> warm_;
  bool warm_watched_ = false;  // its socket is in the loop, waiting for WarmReady
  bool warm_started_ = false;  // started once (first when every trainer said hello)
  std::optional<Clock::time_point> warm_retry_at_;  // start the server again then
  std::chrono::milliseconds warm_backoff_{1000};
  void StartWarmServer();
  void OnWarmReady();
  // The server is gone (`retry`: it died, start it again later) or cannot serve (give up).
  void DropWarmServer(const std::string& why, bool retry);

  AgentCore core_;
  std::optional<int> exit_code_;
};

}  // namespace regroup::agent
