// SPDX-License-Identifier: Apache-2.0
// The agent's logic without an operating system: its session with the manager (registration,
// epochs, heartbeats, a broken stream resumed, readmission as its own replacement), what it tells
// its trainers, their votes, exits and faults, and how it stops. Every input carries the time and
// every effect goes through AgentHost, so the same code runs in regroup-agent (agent.h: processes,
// a trainer socket, a gRPC stream) and in the deterministic simulation (sim/world.h: simulated
// ones, on a simulated clock).
//
// What it promises the manager (proto/regroup/v1/wire.proto):
//  - Register first on every stream (with the trainers' current states), then a Heartbeat every
//    Welcome.heartbeat_interval_ms, a ProcessExit as soon as a child exits (never restarting it on
//    its own), one Votes per (generation, step) once every live assigned rank voted, a
//    FaultReport per trainer fault, a DirectiveAck per trainer ack, Leave on SIGTERM/SIGINT.
//    Messages that arise while no manager is connected are sent after the next Welcome.
//  - It obeys only the highest epoch seen: a message with a lower header epoch is logged and
//    ignored. A Refusal naming a higher epoch makes it adopt that epoch and register again.
//  - Manager away: a broken stream is not a lost manager: the trainers go on for the manager's
//    liveness timeout, and a session resumed in time (Welcome.resumed) continues the generation;
//    past it they get Pause and keep running. It reconnects with backoff (100 ms doubling to
//    500 ms) and registers again; after reconnect_timeout_s without a Welcome (counted from the
//    start too, for a manager that never comes) the trainers are stopped and it exits 1.
//  - Declared lost (a fenced Refusal): with Refusal.readmit it aborts its trainers' generation and
//    registers again as <pod uid>/<n>, its own replacement (at most 5 times); else it stops.
//  - All children exited 0: training done; exit 0 once the manager acknowledges (any
//    StopTraining, or it ends the session) or after 5 s.
//  - A trainer that fails (a non-zero exit code) before any trainer of this agent ever said
//    hello runs a script that does not use the regroup library (or fails before it connects):
//    Regroup cannot recover it. One error line says so with the recipe to adopt it; the agent
//    reports the exit, sends Leave, stops the other trainers at once and exits
//    kExitScriptWithoutRegroup, with no restart. One that runs options.connect_timeout_s without
//    saying hello gets one warning line (it is not stopped: a big model takes long to build).
//
// Exit codes: 0 training done (every child exited 0), left (StopTraining LEAVE) or dumped;
// 1 StopTraining EXIT, the manager gone too long, or SIGTERM with no manager connected;
// 3 (kExitScriptWithoutRegroup) the script does not use the regroup library.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "agent/options.h"
#include "agent/vote_tally.h"
#include "common/status.h"
#include "regroup/v1/wire.pb.h"

namespace regroup::agent {

// Time on a monotonic clock, from any origin.
using Millis = std::chrono::milliseconds;

// The agent's exit code when its trainers fail without ever connecting: the script does not use
// the regroup library (2 is a bad command line, main.cc).
constexpr int kExitScriptWithoutRegroup = 3;

// What the core does to the world. Calls come from inside the core's entry points; a host answers
// with entry-point calls of its own later (never from inside these), as events of its loop.
class AgentHost {
 public:
  virtual ~AgentHost() = default;
  // Opens a new session with the manager: OnSessionOpened, its messages, then OnSessionClosed
  // follow (or OnSessionClosed alone, when no stream opened).
  virtual void OpenSession() = 0;
  // Why the manager cannot be reached, when the host knows (the last failed connection attempt:
  // a TLS handshake failure named as such, with the peer and the reason); "" otherwise.
  virtual std::string ConnectFailure() { return ""; }
  // Sends on the open session.
  virtual void SendToManager(const regroup::v1::AgentMessage& message) = 0;
  // Ends the open session at once (OnSessionClosed follows).
  virtual void CancelSession() = 0;
  // To local rank `r`'s trainer; false when it is not connected.
  virtual bool SendToTrainer(uint32_t r, const regroup::v1::AgentReply& reply) = 0;
  virtual bool TrainerConnected(uint32_t r) const = 0;
  // Starts local rank `r`'s process, as the leader of its own process group; its pid.
  virtual StatusOr<int> StartProcess(uint32_t r) = 0;
  // Signals the process group of `pid`.
  virtual void Signal(int pid, int signal) = 0;
  // Ports free on this pod's host now, distinct (a generation's store takes one).
  virtual std::vector<uint32_t> FreePorts() = 0;
  // How long process `pid` has run on a CPU (ProcessCpuMs); nothing when not known.
  virtual std::optional<int64_t> CpuMs(int pid) { (void)pid; return std::nullopt; }
  // The agent ends with `code`. `confirm`: a session is up; wait briefly for the manager to
  // confirm what was sent on it (`sent_exits` names the process exits among it).
  virtual void Exit(int code, bool confirm, const std::string& sent_exits) = 0;
};

class AgentCore {
 public:
  // `options` with ResolveDefaults applied (the fields of the pod and the manager link are read).
  AgentCore(const AgentOptions& options, AgentHost* host);
  AgentCore(const AgentCore&) = delete;
  AgentCore& operator=(const AgentCore&) = delete;

  // Starts every trainer and the first session.
  void Start(Millis now);

  // The manager session the host opened last.
  void OnSessionOpened(Millis now);
  void OnSessionClosed(Millis now, const std::string& detail, bool ended_by_manager);
  void OnManagerMessage(Millis now, const regroup::v1::ManagerMessage& message);

  // Trainers (over the trainer socket) and their processes.
  void OnHello(Millis now, uint32_t r, const regroup::v1::TrainerHello& hello);
  void OnTrainerMessage(Millis now, uint32_t r, const regroup::v1::TrainerMessage& message);
  std::optional<uint32_t> RankOfPid(int pid) const;  // a live trainer's local rank
  void OnProcessExit(Millis now, uint32_t r, int exit_code, int signal);
  // SIGTERM or SIGINT: leave at the next step boundary (twice: stop now).
  void OnTerminateSignal(Millis now, const char* name);

  // Runs what is due; NextDeadline says when to call again (at most a second away).
  void OnTimers(Millis now);
  Millis NextDeadline(Millis now) const;

  std::optional<int> exit_code() const { return exit_code_; }
  bool stopping() const { return stopping_.has_value(); }  // stopping its trainers, to exit
  bool leaving() const { return leaving_; }     // asked the manager to let it leave
  int node_rank() const { return node_rank_; }
  uint64_t epoch() const { return epoch_; }
  const std::string& uid() const { return uid_; }
  bool every_trainer_heard() const;

 private:
  struct Rank {
    int pid = 0;
    bool alive = false;
    bool restart_pending = false;  // killed on the manager's order: start again once reaped
    Millis started{};
    Millis last_heard{};
    bool heard = false;
    bool connect_warned = false;  // told that it runs --connect-timeout-s without a hello
    int64_t cpu_ms = -1;  // its CPU time when last read (-1: not known), and when it last grew
    Millis cpu_grew{};
    int64_t step = 0;
    regroup::v1::Phase phase = regroup::v1::PHASE_STARTING;
    uint64_t generation = 0;
    int64_t committed_step = -1;
    int64_t heard_commit_step = -1;
    uint64_t heard_commit_epoch = 0;       // the generation whose outcome committed it
    uint64_t heard_commit_generation = 0;  // (0, 0: not known)
    int64_t voted_step = -1;               // a vote whose outcome it has not heard
    uint64_t voted_epoch = 0, voted_generation = 0;  // (0, 0: none)
    uint32_t voted_world_size = 0;         // of the generation it was cast in (0: not known)
    bool voted_ok = false;
    uint64_t voted_checksum = 0;
    int64_t voted_rank = -1;               // its rank in that generation (-1: not known)
    void ForgetVote() {
      voted_step = -1;
      voted_epoch = voted_generation = 0;
      voted_world_size = 0;
      voted_ok = false;
      voted_checksum = 0;
      voted_rank = -1;
    }
    uint64_t plan_generation = 0;  // the last plan delivered to it, its world size and its rank
    uint32_t plan_world_size = 0;
    int64_t plan_rank = -1;
    bool exited = false;
    int exit_code = 0;
    int exit_signal = 0;
    // The directive that sets this rank's course (start, standby, stop), replayed to a trainer
    // that says hello after it was sent.
    std::optional<regroup::v1::AgentReply> standing;
  };
  static void NoteHeldState(Rank& k);
  void ReadCpuTimes();

  enum class Link {
    kDown,         // no session: the next one starts at reconnect_at_
    kConnecting,   // a session waits for the channel to connect
    kRegistering,  // the stream is open, Register sent, waiting for Welcome
    kUp,           // welcomed
  };

  struct Stopping {
    int exit_code;
    std::string reason;
    Millis term_at;
    Millis kill_at;
    Millis give_up_at;
    bool termed = false;
    bool killed = false;
  };

  // Children.
  void StartChild(uint32_t r);
  bool AnyAlive() const;
  bool Live(uint32_t r) const { return ranks_[r].alive && !ranks_[r].restart_pending; }
  void SignalAll(int signal);
  void BeginStop(int exit_code, std::string reason, bool wait_for_trainers);
  // Local rank `r` failed and no trainer here ever connected: says so, leaves and stops.
  void RefuseScriptWithoutRegroup(uint32_t r);
  void WarnUnconnected(Millis now);
  Millis ConnectDeadline(const Rank& k) const;
  std::string ScriptName() const;
  void Finish(int exit_code);

  // Manager.
  void Connect();
  void OnWelcome(const regroup::v1::Welcome& welcome);
  void OnStart(const regroup::v1::StartGeneration& start);
  void OnAbort(const regroup::v1::AbortGeneration& abort);
  void OnOutcome(const regroup::v1::StepOutcome& outcome);
  void OnStop(const regroup::v1::StopTraining& stop);
  void OnRestart(const regroup::v1::RestartProcesses& restart);
  void OnRefusal(const regroup::v1::Refusal& refusal);
  void Readmit(const std::string& reason);
  regroup::v1::AgentMessage NewMessage() const;
  regroup::v1::LocalRank Report(uint32_t r) const;
  regroup::v1::AgentMessage BuildRegister();
  void SendHeartbeat();
  // Sends now when registered, else keeps it for after the next Welcome.
  void SendEvent(regroup::v1::AgentMessage message);
  template <typename Message>
  void SetFreePorts(Message* report) const;
  int64_t OutageLeftMs() const;
  // Events sent in this session that a broken stream may have lost: sent again when the next
  // session resumes (votes until their step is settled; exits and faults until the manager
  // acts again: an abort, a start or a restart).
  void Unconfirm(const regroup::v1::AgentMessage& message);
  void ForgetConfirmed(bool votes, bool exits);

  // Trainers.
  void Deliver(uint32_t r, const regroup::v1::AgentReply& reply);
  void DeliverAll(const regroup::v1::AgentReply& reply);
  void PauseTrainers(const std::string& reason);
  void AbortTrainers(uint64_t epoch, uint64_t generation, const std::string& reason);
  // No generation runs here any more: no votes are open, no directive is replayed on hello.
  void LeaveGeneration();
  void CheckVotes();

  const AgentOptions& options_;
  AgentHost* const host_;
  Millis now_{};  // the time of the entry point running
  std::vector<Rank> ranks_;
  bool any_connected_ = false;     // a trainer of this agent said hello, ever
  bool told_no_regroup_ = false;   // a trainer finished without ever connecting: said so once

  // The manager link.
  bool session_ = false;  // a session is open (from OpenSession to OnSessionClosed)
  Link link_ = Link::kDown;
  Millis reconnect_at_{};
  Millis backoff_{100};
  Millis register_deadline_{};
  Millis connect_report_at_{};  // when to log again that no manager answers
  std::optional<Millis> outage_since_;  // no Welcome since then (set at start)
  bool lost_ = false;  // a session ended since the last Welcome
  // A broken stream is not a lost manager: the trainers go on until then (the manager's
  // liveness timeout), and a session resumed in time continues the generation.
  std::optional<Millis> pause_at_;
  bool resume_pending_ = false;  // a session that was up broke: the next Welcome may resume it
  // The trainers were paused since the last Welcome: they leave their generation at the next
  // step boundary, so no session may resume it (Register.left_generation).
  bool paused_since_welcome_ = false;
  std::string pause_reason_;
  Millis liveness_timeout_{500};
  std::deque<regroup::v1::AgentMessage> unconfirmed_;
  bool reregister_now_ = false;
  std::deque<regroup::v1::AgentMessage> pending_;  // events kept for after the next Welcome
  std::deque<std::string> sent_exits_;  // process exits handed to the current session
  Millis heartbeat_interval_{100};
  Millis next_heartbeat_{};
  // What this session's beats last said of each rank (its report without the ages, serialized;
  // empty: not yet said) and the beat age sent with it: a beat carries only the ranks whose
  // report changed, and every rank whose trainer is late (LateBeatMs), or was at the last beat.
  std::vector<std::string> beat_said_;
  std::vector<uint32_t> beat_age_said_;
  // A trainer beat age from which a rank is in every beat: a quarter of the liveness timeout, so
  // the manager sees every silence that could stretch its bound (manager/silence_bound.h counts
  // a silence only from a third of the timeout) or end in a fault.
  Millis LateBeatMs() const { return liveness_timeout_ / 4; }

  // This pod's uid towards the manager: the pod's own, then <pod uid>/<n> for the n-th time it
  // came back as its own replacement after being declared lost (Refusal.readmit).
  std::string uid_;
  int readmissions_ = 0;

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

  // Ending.
  bool leaving_ = false;                 // Leave sent: wait for StopTraining LEAVE
  std::optional<Millis> done_at_;        // every child exited 0: exit 0 by then
  std::optional<Stopping> stopping_;
  std::optional<int> exit_code_;
};

}  // namespace regroup::agent
