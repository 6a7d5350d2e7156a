// regroup-agent: the parent of a pod's trainer processes and their link to the job's manager.
//
// One thread (an epoll loop) owns all state: the trainer socket, the children (SIGCHLD through a
// signalfd, so an exit is seen at once), SIGTERM/SIGINT, timers, and the events of the manager
// session, whose gRPC stream runs on two threads of its own (manager_session.h).
//
// What it promises the manager (proto/regroup/v1/wire.proto):
//  - Register first on every stream (with the trainers' current states), then a Heartbeat every
//    Welcome.heartbeat_interval_ms, a ProcessExit as soon as a child exits (never restarting it on
//    its own), one Votes per (generation, step) once every live assigned rank voted, a
//    FaultReport per trainer fault, a DirectiveAck per trainer ack, Leave on SIGTERM/SIGINT.
//    Messages that arise while no manager is connected are sent after the next Welcome.
//  - It obeys only the highest epoch seen: a message with a lower header epoch is logged and
//    ignored. A Refusal naming a higher epoch makes it adopt that epoch and register again.
//  - Manager away: trainers get Pause at once and keep running; it reconnects with backoff
//    (100 ms growing to 2 s: the channel's between connection attempts, its own between sessions
//    that open and end) and registers again; after --reconnect-timeout-s without a Welcome (counted from the start too,
//    for a manager that never comes) the trainers are stopped and it exits 1.
//  - All children exited 0: training done; exit 0 once the manager acknowledges (any
//    StopTraining, or it ends the session) or after 5 s.
//
// Exit codes: 0 training done (every child exited 0), left (StopTraining LEAVE) or dumped;
// 1 StopTraining EXIT, the manager gone too long, or SIGTERM with no manager connected.
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

#include "agent/event_loop.h"
#include "agent/manager_session.h"
#include "agent/options.h"
#include "agent/trainer_server.h"
#include "agent/vote_tally.h"
#include "agent/warm_starter.h"
#include "regroup/v1/wire.pb.h"

namespace regroup::agent {

class Agent final : private TrainerServer::Listener {
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

  struct Rank {
    pid_t pid = 0;
    bool alive = false;
    bool restart_pending = false;  // killed on the manager's order: start again once reaped
    Clock::time_point started{};
    Clock::time_point last_heard{};
    bool heard = false;
    int64_t step = 0;
    regroup::v1::Phase phase = regroup::v1::PHASE_STARTING;
    uint64_t generation = 0;
    int64_t committed_step = -1;
    int64_t heard_commit_step = -1;
    uint64_t heard_commit_epoch = 0;       // the generation whose outcome committed it
    uint64_t heard_commit_generation = 0;  // (0, 0: not known)
    bool exited = false;
    int exit_code = 0;
    int exit_signal = 0;
    // The directive that sets this rank's course (start, standby, stop), replayed to a trainer
    // that says hello after it was sent.
    std::optional<regroup::v1::AgentReply> standing;
    std::vector<std::string> env;  // computed at the first start, reused by restarts
  };

  enum class Link {
    kDown,         // no session: the next one starts at reconnect_at_
    kConnecting,   // a session waits for the channel to connect
    kRegistering,  // the stream is open, Register sent, waiting for Welcome
    kUp,           // welcomed
  };

  struct Stopping {
    int exit_code;
    std::string reason;
    Clock::time_point term_at;
    Clock::time_point kill_at;
    Clock::time_point give_up_at;
    bool termed = false;
    bool killed = false;
  };

  Status Setup();
  void OnTimers();
  int NextTimeoutMs() const;

  // Children.
  void StartChild(uint32_t r);
  void OnSignals();
  void ReapChildren();
  void OnChildExit(uint32_t r, int status);
  bool AnyAlive() const;
  bool Live(uint32_t r) const { return ranks_[r].alive && !ranks_[r].restart_pending; }
  void SignalAll(int signal);
  void OnTerminateSignal(const char* name);
  void BeginStop(int exit_code, std::string reason, bool wait_for_trainers);
  void Finish(int exit_code);

  // Manager.
  void Connect();
  void OnInbox();
  void OnSessionOpened();
  void OnSessionClosed(const std::string& detail, bool ended_by_manager);
  void OnManagerMessage(const regroup::v1::ManagerMessage& message);
  void OnWelcome(const regroup::v1::Welcome& welcome);
  void OnStart(const regroup::v1::StartGeneration& start);
  void OnAbort(const regroup::v1::AbortGeneration& abort);
  void OnOutcome(const regroup::v1::StepOutcome& outcome);
  void OnStop(const regroup::v1::StopTraining& stop);
  void OnRestart(const regroup::v1::RestartProcesses& restart);
  void OnRefusal(const regroup::v1::Refusal& refusal);
  regroup::v1::AgentMessage NewMessage() const;
  regroup::v1::LocalRank Report(uint32_t r, Clock::time_point now) const;
  regroup::v1::AgentMessage BuildRegister();
  void SendHeartbeat();
  // Sends now when registered, else keeps it for after the next Welcome.
  void SendEvent(regroup::v1::AgentMessage message);
  // Ports free on --host now (kFreePorts, distinct), for the stores of the generations whose
  // rank 0 is here; and them into a Register or Heartbeat.
  std::vector<uint32_t> FreePorts() const;
  template <typename Message>
  void SetFreePorts(Message* report) const;
  int64_t OutageLeftMs() const;

  // Trainers.
  void OnHello(uint32_t local_rank, const regroup::v1::TrainerHello& hello) override;
  void OnMessage(uint32_t local_rank, const regroup::v1::TrainerMessage& message) override;
  void OnDisconnect(uint32_t local_rank) override;
  void Deliver(uint32_t r, const regroup::v1::AgentReply& reply);
  void DeliverAll(const regroup::v1::AgentReply& reply);
  void PauseTrainers(const std::string& reason);
  void CheckVotes();

  AgentOptions options_;
  std::string credential_;
  EventLoop loop_;
  Inbox inbox_;
  int signal_fd_ = -1;
  std::unique_ptr<TrainerServer> server_;
  std::string executable_;
  std::vector<std::string> argv_;
  std::vector<Rank> ranks_;
  sockaddr_storage host_addr_{};
  socklen_t host_addr_len_ = 0;

  // The manager link.
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<ManagerSession> session_;
  uint64_t session_ids_ = 0;
  Link link_ = Link::kDown;
  Clock::time_point reconnect_at_{};
  std::chrono::milliseconds backoff_{100};
  Clock::time_point register_deadline_{};
  Clock::time_point connect_report_at_{};  // when to log again that no manager answers
  std::optional<Clock::time_point> outage_since_;  // no Welcome since then (set at start)
  bool lost_ = false;  // a session ended since the last Welcome
  // A broken stream is not a lost manager: the trainers go on until then (the manager's
  // liveness timeout), and a session resumed in time continues the generation.
  std::optional<Clock::time_point> pause_at_;
  bool resume_pending_ = false;  // a session that was up broke: the next Welcome may resume it
  std::string pause_reason_;
  std::chrono::milliseconds liveness_timeout_{500};
  // Events sent in this session that a broken stream may have lost: sent again when the next
  // session resumes (votes until their step is settled; exits and faults until the manager
  // acts again: an abort, a start or a restart).
  std::deque<regroup::v1::AgentMessage> unconfirmed_;
  void Unconfirm(const regroup::v1::AgentMessage& message);
  void ForgetConfirmed(bool votes, bool exits);
  bool reregister_now_ = false;
  std::deque<regroup::v1::AgentMessage> pending_;  // events kept for after the next Welcome
  std::deque<std::string> sent_exits_;  // process exits handed to the current session
  std::chrono::milliseconds heartbeat_interval_{100};
  Clock::time_point next_heartbeat_{};

  // This pod's uid towards the manager: the pod's own, then <pod uid>/<n> for the n-th time it
  // came back as its own replacement after being declared lost (Refusal.readmit).
  std::string uid_;
  int readmissions_ = 0;
  void Readmit(const std::string& reason);

  // What the manager told us.
  uint64_t epoch_ = 0;
  uint64_t generation_ = 0;
  int node_rank_ = -1;
  uint32_t last_generation_agents_ = 0;  // GenerationPlan.agents of the last plan followed
  // The epoch of the generation the trainers were last started in: an abort the agent makes up
  // for them names it (epoch_ may already be a newer manager's, whose generation of the same
  // number the abort must not touch).
  uint64_t started_epoch_ = 0;
  VoteTally tally_;

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

  // Ending.
  bool leaving_ = false;                     // Leave sent: wait for StopTraining LEAVE
  std::optional<Clock::time_point> done_at_;  // every child exited 0: exit 0 by then
  std::optional<Stopping> stopping_;
  std::optional<int> exit_code_;
};

}  // namespace regroup::agent
