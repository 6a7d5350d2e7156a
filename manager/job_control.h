// SPDX-License-Identifier: Apache-2.0
// The manager's control of one job: membership, generations, fencing, fault detection and the step
// commit, as a clocked state machine with no threads and no sockets. The gRPC service
// (service.h) feeds it agent messages and drains what it has to send; tests drive it directly
// with thousands of simulated agents.
//
// Who decides what (docs/design.md): the job control carries out directives; the scheduling
// decisions (wait, scale in or out, dump, exit) come from a Decisions source: the engine embedded
// in the manager (standalone) or the coordinator in the scheduler.
//
// Its parts, each the one owner of its state: Pods (registration and liveness, pods.h),
// Generations (the running generation, generations.h), StepCommit (the vote and the commit,
// step_commit.h) and Reconciliation (the directives carried out, reconciled with what the manager
// did first, reconciliation.h). JobControl wires them, and keeps the job's phase, the durable
// record, the aborts and the stops.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "plugin/engine.h"
#include "plugin/job_spec.h"
#include "plugin/sizing.h"
#include "common/status.h"
#include "manager/job_record.h"
#include "manager/join_window.h"
#include "manager/event_log.h"
#include "manager/generations.h"
#include "manager/peer_reports.h"
#include "manager/pods.h"
#include "manager/rank_layout.h"
#include "manager/reconciliation.h"
#include "manager/step_commit.h"
#include "regroup/v1/wire.pb.h"

namespace regroup::manager {

namespace v1 = ::regroup::v1;

// What the job control tells the decision maker, and what it hears back.
class Decisions {
 public:
  virtual ~Decisions() = default;
  virtual void PodRunning(int64_t pod, const std::string& uid, const std::string& node,
                          int64_t now) = 0;
  virtual void Fault(const v1::FaultFacts& fault, int64_t now) = 0;
  // Every pod of the aborted `generation` that no fault names answered its abort: nothing more
  // of those faults is coming, and the decision maker need not wait out its report window.
  virtual void FaultsSettled(uint64_t generation, int64_t now) = 0;
  virtual void ReplacementRegistered(int64_t pod, const std::string& uid, int64_t now) = 0;
  virtual void ReportProgress(uint64_t epoch, uint64_t generation, int64_t committed_step,
                              uint32_t live_ranks, int64_t now) = 0;
  virtual void Tick(int64_t now) = 0;
  // A directive newer than the last one returned, if any.
  virtual std::optional<Directive> Poll() = 0;
  // The decision maker's standing decision: its newest directive, one issued to an earlier
  // incarnation (which a restarted manager takes as seen) included; nothing if it keeps none.
  virtual std::optional<Directive> Standing() const { return std::nullopt; }
  // False while the decision maker cannot be reached (survivors then stay paused).
  virtual bool Available() const { return true; }
  // Why the decision maker fenced this incarnation (the coordinator serves a newer manager of
  // the job), or nothing. A fenced incarnation commits nothing more and stops its pods.
  virtual std::optional<std::string> FencedBy() const { return std::nullopt; }
  // Whether this incarnation may commit a step now: "" if so, else why not (the coordinator's
  // lease ran out: cut off from it, this manager may have been replaced without hearing so).
  // The decision maker keeps its own clock. Standalone the durable record fences instead.
  virtual std::string WhyNoCommit() const { return ""; }
  // Whether a scheduler replaces the pods a decision gives up (Volcano). Standalone nobody does:
  // a job restart then restarts a healthy pod's processes, and the pod counts as its own
  // replacement.
  virtual bool ReplacesPods() const { return false; }
};

// The header of every message this manager incarnation sends (to agents or to the coordinator).
v1::Header ManagerHeader(const std::string& job_id, uint64_t epoch, uint64_t generation);

// The engine of libregroup, embedded (standalone mode).
class EmbeddedDecisions final : public Decisions {
 public:
  explicit EmbeddedDecisions(const JobSpec& spec);
  void PodRunning(int64_t pod, const std::string& uid, const std::string& node,
                  int64_t now) override;
  void Fault(const v1::FaultFacts& fault, int64_t now) override;
  void FaultsSettled(uint64_t generation, int64_t now) override;
  void ReplacementRegistered(int64_t pod, const std::string& uid, int64_t now) override;
  void ReportProgress(uint64_t epoch, uint64_t generation, int64_t committed_step,
                      uint32_t live_ranks, int64_t now) override;
  void Tick(int64_t now) override;
  std::optional<Directive> Poll() override;

 private:
  Engine engine_;
  std::string job_id_;
  uint64_t last_directive_ = 0;
};

// The most heartbeats a second a manager is asked to take from its agents, whatever the job's
// size: past it, a beat costs the vote and the fault handling their latency (bench/README.md, the
// manager under load: 8,192 agents beating 10 times a second saturated a core).
inline constexpr int64_t kBeatBudgetPerSecond = 20000;

// The heartbeat interval the agents are told (Welcome.heartbeat_interval_ms): the job's
// regroup.io/heartbeat-interval-ms, stretched for a job of more than kBeatBudgetPerSecond / 10
// pods so that the manager hears at most kBeatBudgetPerSecond beats a second; the liveness timeout
// (liveness-misses of these) stretches with it, kept below half the hang timeout's floor. What a
// longer interval costs is only silence detection: an agent or trainer that dies closes its
// connections (peers and the manager see that at once), only a node cut off silently waits.
uint32_t HeartbeatIntervalMs(const JobConfig& config, int64_t pods);

struct JobControlOptions {
  uint64_t epoch = 1;                // this manager incarnation
  int64_t join_window_ms = 30000;    // how long the first (or a restarted) rendezvous waits
  size_t event_log = 256;            // events kept for status
  // The durable record the previous incarnation left (job_record.h): lost pods stay fenced, a
  // stopped job stays stopped, and the first generation needs a majority of its members.
  std::optional<JobRecord> record;
  // The durable record as stored now (other incarnations write it too), looked at before every
  // step this incarnation commits and once a second while it runs: a newer incarnation that
  // formed a generation since fences this one (it commits nothing more and stops its pods:
  // Superseded), and a job another incarnation ended (a second manager beside this one, which
  // formed none since) ends here too. Nothing: no record yet, or none readable (the caller logs
  // why; the last one read serves). Unset: no record is kept. The reference is read at once.
  std::function<const std::optional<JobRecord>&()> stored_record;
  // Where the events are logged, one line each (event_log.h); nullptr: spdlog's default logger.
  std::shared_ptr<spdlog::logger> logger;
};

class JobControl {
 public:
  // One message for one agent.
  struct Outgoing {
    int64_t node_rank;  // the pod's index (its agent's node rank)
    v1::ManagerMessage message;
    bool close = false;  // end that agent's stream after this message
  };

  JobControl(JobSpec spec, JobConfig config, JobControlOptions options,
             std::unique_ptr<Decisions> decisions);

  // An agent stream's first message. On success the stream belongs to the returned pod index
  // (the agent's node rank).
  // Refused (with the status to answer): another job, a duplicate node rank, a zombie pod uid, a
  // node rank out of range, a fenced epoch.
  StatusOr<int64_t> Register(uint64_t stream, const v1::Header& header, const v1::Register& reg,
                             int64_t now);
  // Any later message of a registered stream. An error is answered with a Refusal carrying the
  // current epoch, generation and directive; nothing changes.
  Status Handle(uint64_t stream, const v1::AgentMessage& message, int64_t now);
  // The stream ended (agent gone, network lost).
  void Disconnected(uint64_t stream, int64_t now);
  // Advances time: join window, liveness and hang detection, decisions, deadlines.
  void Tick(int64_t now);

  std::vector<Outgoing> TakeOutgoing();
  // The durable record, when it changed since the last call: the caller stores it before it
  // sends what TakeOutgoing returned.
  std::optional<JobRecord> TakeRecord();
  // The durable record says a newer incarnation formed a generation: this one is fenced. It
  // stops its pods and never writes the record again.
  void Superseded(const std::string& why, int64_t now);
  v1::GetStatusResponse StatusReport() const;
  // A refusal of a message, stamped with this manager's header; `fenced` when the refused pod
  // was declared lost and must stop.
  v1::ManagerMessage MakeRefusal(const std::string& reason, bool fenced = false,
                                 bool readmit = false) const;
  bool IsFenced(const std::string& pod_uid) const { return pods_.IsFenced(pod_uid); }
  // A fenced pod that may come back as its own replacement (see Refusal.readmit).
  bool MayReadmit(const std::string& pod_uid) const {
    return IsFenced(pod_uid) && !pods_.MustBeReplaced(pod_uid);
  }

  uint64_t epoch() const { return options_.epoch; }
  uint64_t generation() const { return generations_.number(); }
  int64_t committed_step() const { return commit_.step(); }
  bool training() const { return state_ == State::kTraining; }
  // The stop this incarnation sent (the job's end, or only its own), if it stopped.
  const v1::StopTraining* stopped() const { return stop_ ? &stop_->stop() : nullptr; }
  uint32_t world_size() const { return static_cast<uint32_t>(running().size()); }
  const JobSpec& spec() const { return spec_; }
  uint32_t heartbeat_interval_ms() const { return heartbeat_interval_ms_; }
  // The event log: the newest JobControlOptions::event_log events, and how many were ever logged.
  const std::deque<v1::JobEvent>& events() const { return log_.events(); }
  uint64_t events_logged() const { return log_.logged(); }

  // The timings the metrics keep as histograms (manager/metrics.h), each measured as it ends:
  // a recovery (abort -> the next generation's first commit), a vote (the first vote of a step
  // -> its outcome), a fault found by a timeout (the last sign of health -> the fault).
  enum class Timing { kRecovery, kVoteRoundTrip, kFaultDetection };
  void OnTiming(std::function<void(Timing, double seconds)> observe) {
    observe_ = std::move(observe);
  }
  // Training finished (every holder of the trained state exited 0).
  bool finished() const { return finished_; }

  // Counters for metrics.
  struct Counters {
    std::map<std::string, uint64_t> faults;      // by kind
    std::map<std::string, uint64_t> directives;  // by kind
    uint64_t generations = 0;
    uint64_t commits = 0;
    uint64_t manager_stalls = 0;   // ticks late by more than half the liveness timeout
    double last_recovery_ms = 0;   // abort -> first commit of the next generation
    int64_t last_commit_ms = 0;    // when the last step was committed (the manager's clock)
    double step_seconds = 0;       // median step time
  };
  const Counters& counters() const { return counters_; }

 private:
  enum class State { kJoining, kTraining, kAborted, kStopped };
  // The pod index a registration may take, or why it may not.
  StatusOr<int64_t> Admissible(const v1::Header& header, const v1::Register& reg) const;
  // A pod registered (or resumed its session): the decision maker hears of it, the pod is
  // welcomed and told what it missed.
  void Registered(int64_t pod, bool resumed, bool replacement, int64_t now);
  // An event for the status report and the log; `pods`: the node ranks it concerns.
  void Event(int64_t now, const std::string& kind, const std::string& message,
             const std::vector<int64_t>& pods = {});
  // A timing for the metrics (OnTiming), in ms; a negative one is not kept.
  void Observe(Timing timing, int64_t ms);
  // The step in flight was committed or rejected: its vote's round trip is over.
  void VoteDecided(int64_t now);
  void Send(int64_t pod, v1::ManagerMessage message, bool close = false);
  v1::Header MakeHeader() const;

  Status OnFault(int64_t pod, const v1::FaultReport& fault, int64_t now);
  // The pod of the running generation (other than `reporter`) whose agent registered from
  // `host`, or -1: none, or more than one (they share an address).
  int64_t PodAtHost(const std::string& host, int64_t reporter) const;
  // Declares lost, at once, a pod of the running generation that its peers' reports of failed
  // collectives show gone (peer_reports.h): its stream broke too, or ranks of PeerReports::kQuorum
  // other pods named it and it has been silent for two heartbeat intervals.
  void SettleLostPeers(int64_t now);
  void OnProcessExit(int64_t pod, const v1::ProcessExit& exit, int64_t now);
  Status OnVotes(int64_t pod, const v1::Votes& votes, int64_t now);
  void OnLeave(int64_t pod, const v1::Leave& leave, int64_t now);
  void Depart(int64_t pod, int64_t now);

  // A fault: abort the generation at once and tell the decision maker. `ranks` are of the
  // running generation; the decision maker hears them as ranks of the generation it knows
  // (Reconciliation::KnownRank), plus `known_ranks` already in that frame (ranks outside the
  // running one), plus the ranks it numbers `local_ranks` of the one pod in `pods`
  // (FaultFacts.local_ranks).
  void Fault(v1::FaultKind kind, std::vector<int64_t> pods, std::vector<uint32_t> ranks,
             int64_t step, const std::string& detail, int64_t now,
             const std::vector<uint32_t>& known_ranks = {},
             const std::vector<uint32_t>& local_ranks = {});
  // A process of an earlier incarnation's generation died, and this incarnation has formed no
  // generation yet (a manager restart in between): a fault the decision maker hears by local
  // rank, once per process. False when it is not such a process (nothing is reported).
  bool EarlierProcessDied(int64_t pod, const v1::LocalRank& rank, const std::string& why,
                          int64_t now);
  // The survivors continue (regroup.io/survivors-continue): a process of the generation just
  // aborted died; its replicas leave, its processes restart in place at once, and the other
  // replicas form the next generation now. The restarted ranks rejoin at a step boundary
  // (pending_). False when the job waits instead (dp 1, no replica left whole, the strategies).
  bool ContinueWithoutFailedRanks(const std::string& reason, int64_t now);
  // The replicas that may train on without the failed ranks of `reason`, or none when the
  // survivors may not continue.
  std::vector<int64_t> Survivors(const std::string& reason, int64_t now);
  // Every rank of replica r is up: its agent usable, the process alive, said hello, not
  // restarting.
  bool ReplicaReady(int64_t replica) const;
  void Abort(const std::string& reason, int64_t now);
  // The latest abort (abort_) to one pod, again: it was away when it went out.
  void SendAbort(int64_t pod);
  // Pod `pod` answered the abort `directive_id` (its agent acknowledged it).
  void AbortAnswered(int64_t pod, uint64_t directive_id, int64_t now);
  // Tells the decision maker the faults are settled once every pod of the aborted generation
  // answered the abort or is lost (a pod whose stream is down keeps the report window open);
  // true when it told it now.
  bool SettleFaults(int64_t now);
  // Carries out the decision maker's new directives.
  void TakeDecisions(int64_t now);
  // A pod that resumed its session: what it missed while its stream was down, sent again.
  void CatchUp(int64_t pod);
  // A pod uid that must never take part again (lost, left or replaced), kept on record too.
  void Forget(const std::string& uid);
  // After a manager restart: whether a majority of the last generation on record is back.
  bool MajorityBack(int64_t now);
  // Declares a pod lost: its uid is fenced for good, and a connected agent is told so at once.
  // `readmit`: it may come back as its own replacement (lost for silence or a broken stream).
  void Fence(int64_t pod, const std::string& reason, bool readmit = true);
  // Asks an agent to restart these local ranks in place.
  void RestartRanks(int64_t pod, const std::vector<uint32_t>& locals, const std::string& reason);
  // Every process of `pod`, for the job restart under way.
  void RestartForJob(int64_t pod, const std::string& reason);
  // During a job restart, a pod whose processes were in a generation (none formed since the
  // restart) restarts them: it was away when the restart was decided, or reached another
  // incarnation. After it, one whose processes heard a commit of a generation older than the one
  // the restart formed (restart_formed_) restarts them too (FromBeforeTheJobRestart).
  void RestartIfItPredatesTheJobRestart(int64_t pod);
  // Whether a process holds the state from before the job restart under way, or before the one
  // restart_formed_ came after: it was in a generation then, or heard a commit of one.
  bool FromBeforeTheJobRestart(const v1::LocalRank& r) const;
  // Pods whose processes failed (exited, or hung) and that no directive restarts: restarted in
  // place when the job allows it, else fenced, so that no generation waits for them and their
  // slots can be refilled.
  void SettleFailedPods(const Directive& d, int64_t now);
  // One pod's failed processes, as SettleFailedPods; `what` says how they failed.
  void SettleFailedPod(int64_t pod, const std::string& what, int64_t now);
  // A directive waiting for its pods longer than the hang timeout: the pods it waits for are
  // declared lost, and the decision maker decides again.
  void CheckPendingWait(int64_t now);
  void Apply(const Directive& d, int64_t now);
  void Retry(const Directive& d, int64_t now);
  void RestartInPlace(const Directive& d, int64_t now);
  // Of the ranks a restart in place names, those that train in the running generation (formed
  // since the fault) are kept, not restarted.
  void KeepTheRunningGenerationsRanks(std::map<int64_t, std::vector<uint32_t>>& restart,
                                      int64_t now);
  // MindCluster's rescheduling (RESTART_JOB): every process of the job restarts and resumes from
  // the newest checkpoint, so the next generation resumes after the step the restarted ranks
  // hold, not after the last commit.
  // The strategies of MindCluster's rescheduling (the engine's restart_job and its resume).
  static bool IsRescheduling(const std::string& strategy);
  void RestartJob(const Directive& d, int64_t now);
  // Forms and announces a generation over these replicas (original indices, in order).
  // `interim`: formed by the manager alone while restarted ranks come back (the decision maker
  // keeps the generation before it as its frame of ranks).
  bool FormGeneration(const std::vector<int64_t>& replicas, const std::vector<int64_t>& micro,
                      const std::string& reason, int64_t now, bool interim = false);
  // Whether a generation may be formed over these replicas now: some, each ready, and this
  // incarnation not fenced.
  bool MayForm(const std::vector<int64_t>& replicas, int64_t now);
  // Whether the ranks of these replicas hold every shard of the committed state between them;
  // if not, the decision maker hears so (state_lost), once a step.
  bool StateHeld(const std::vector<int64_t>& replicas, int64_t now);
  // The micro-batches of one step (0: no batch is configured).
  int64_t MicrobatchesPerStep() const;
  // The generation just formed is the one on the durable record.
  void RecordGeneration();
  // The plan of the generation just formed, its store on the host of rank 0.
  v1::GenerationPlan Plan(const std::string& reason);
  // Each pod that trains or stands by hears the plan, with its ranks.
  void SendStarts(const v1::GenerationPlan& plan, int64_t now);
  const RankLayout& running() const { return generations_.running(); }
  // Whether this incarnation must commit nothing more: fenced by the decision maker (at once)
  // or by the stored record (looked at when `record`: JobControlOptions::stored_record), or the
  // job ended on record under another incarnation.
  bool StopsCommitting(int64_t now, bool record);
  bool LookAtRecord(int64_t now);
  // Whom a stop ends: the job (this incarnation keeps it on record), the job that another
  // incarnation already ended on record, or only this incarnation (fenced, or it gave up before
  // forming a generation): its pods are told so (StopTraining.incarnation_only).
  enum class StopScope { kJob, kJobOnRecord, kIncarnation };
  void StopAll(v1::StopTraining::Mode mode, const std::string& reason, int64_t now,
               StopScope scope = StopScope::kJob);
  void TryFirstGeneration(int64_t now);
  void DetectFailures(int64_t now);
  // Declares a pod lost that fell silent or whose stream broke (it may come back: readmit).
  void LoseSilentPod(int64_t pod, const std::string& why, int64_t now);
  // A rank of the generation holding the trained state finished training (exited 0): its last
  // step is committed.
  bool HolderFinished() const;
  // Training is over: a rank of the generation holding the trained state finished it, and every
  // other such rank has finished too, or is on `gone_pod` (a pod lost just now; -1: none).
  bool EveryHolderFinished(int64_t gone_pod = -1) const;
  // This incarnation formed a generation (its generation is the one on record). Until it does,
  // its decision maker (a restarted manager's is new) knows nothing it was not told.
  bool FormedAGeneration() const { return record_.leader_epoch == options_.epoch; }
  // A restart in place reaching an incarnation that formed no generation yet.
  void BeforeTheFirstGeneration(const Directive& d, int64_t now);
  // Tells the decision maker of a fault.
  void ReportFault(const v1::FaultFacts& fault, int64_t now);
  // Whether a rank holds the state at the committed step (StepCommit::Holds).
  bool HoldsCommittedState(int64_t pod, uint32_t local) const;
  // The positions of a replica at which no rank of `replicas` holds that state (none before the
  // first commit).
  std::vector<int64_t> PositionsUnheld(const std::vector<int64_t>& replicas) const;
  void Finished(int64_t now);
  void Commit(int64_t step, int64_t now);
  // Every rank voted on `step` and it is not committed: its ranks hear so; replicas that
  // disagree on their parameters (`mismatch`) are a fault.
  void Reject(int64_t step, bool mismatch, int64_t now);
  // Commits the step held for the lease once the lease holds again; drops it once its
  // generation is over.
  void CommitHeld(int64_t now);
  int64_t HangTimeoutMs() const;
  // How long a rank that holds its peers up may stop making progress: max(1 s, 2 x the median
  // step), at most the hang timeout (issue 37).
  int64_t StallBoundMs() const;
  // The first rank of the running generation that stopped making progress past StallBoundMs
  // while its peers wait for it: at its step that long, its main thread idle that long (a frozen,
  // stopped or deadlocked process; one starved of CPU still runs), and behind a peer (one at a
  // later step, or in the gradient collective or voted while it computes) or silent that long
  // while its peers beat. Nothing when the commit waits for the lease, or no step committed yet.
  std::optional<Pods::Finding> FirstStalled(int64_t now) const;
  int64_t LivenessMs() const { return int64_t{heartbeat_interval_ms_} * config_.liveness_misses; }
  // Every rank of these replicas is ready (ReplicaReady).
  bool Ready(const std::vector<int64_t>& replicas) const;
  // With a coordinator: the decision wait while it is unreachable (see job_control.cc).
  void CheckDecisionWait(int64_t now);
  // Carries out the decision maker's standing decision (Decisions::Standing) once the replicas
  // it keeps are back, when every pod it keeps is usable and none is in `left_out`: true if so.
  bool AwaitStandingDecision(const std::vector<int64_t>& left_out, const std::string& why,
                             int64_t now);

  JobSpec spec_;
  JobConfig config_;
  JobControlOptions options_;
  std::unique_ptr<Decisions> decisions_;
  Layout layout_;
  uint32_t heartbeat_interval_ms_;

  State state_ = State::kJoining;
  EventLog log_;
  Pods pods_;  // registration and liveness
  Reconciliation reconcile_;  // the decisions carried out, reconciled with what the manager did
  JoinWindow join_;           // the first generation's rendezvous
  JobRecord record_;
  bool record_changed_ = true;
  bool superseded_ = false;

  uint64_t directive_id_ = 0;
  Generations generations_;  // the running generation and how it was formed
  bool job_restarting_ = false;  // RESTART_JOB applied, no generation formed since
  bool restart_on_record_ = false;  // ... by another incarnation: it is on the durable record
  // The first generation this incarnation formed after a job restart, (epoch, generation): a
  // process that heard a commit of an older generation holds the state from before the restart.
  std::pair<uint64_t, uint64_t> restart_formed_{0, 0};
  std::set<std::string> given_up_;  // pod uids a job-level restart gave up to the scheduler
  std::set<std::pair<int64_t, int32_t>> earlier_deaths_;    // (pod, pid) EarlierProcessDied told
  int64_t state_lost_step_ = -2;  // the committed step whose state_lost the decision maker heard
  int64_t undecided_since_ms_ = -1;  // aborted, no directive pending, the decision maker reachable
  StepCommit commit_;  // the vote and the commit
  PeerReports peer_reports_;  // the survivors' reports of failed collectives, by the peer named
  // pod -> when one of its trainers was last reported killed by SIGKILL, and its local rank: a
  // stream that breaks within a heartbeat of it is the pod dying around its processes.
  std::map<int64_t, std::pair<int64_t, uint32_t>> killed_;

  std::optional<v1::ManagerMessage> stop_;     // the StopTraining that ended the job or this
                                               // incarnation
  std::optional<v1::ManagerMessage> abort_;    // the AbortGeneration of the running generation
  std::set<int64_t> leaving_;                  // agents that asked to leave (SIGTERM)
  int64_t abort_ms_ = -1;                      // when the running generation was aborted
  int64_t last_tick_ms_ = -1;                  // the previous Tick (a stall is not the pods')
  int64_t record_looked_ms_ = -1;              // the last look at the stored record (Tick)
  int64_t first_fault_ms_ = -1;
  // A fault aborted `settling_generation_`: the pods of it that have not answered the abort and
  // are not lost. Once none is left, the decision maker hears that the faults are settled.
  std::set<int64_t> unanswered_;
  uint64_t settling_generation_ = 0;  // 0: no fault's abort waits for answers

  std::vector<Outgoing> outgoing_;
  Counters counters_;
  std::function<void(Timing, double)> observe_;
  bool finished_ = false;
  std::pair<uint64_t, int64_t> vote_opened_{0, -1};  // (generation, step) of the vote in flight
  int64_t vote_opened_ms_ = -1;                      // when its first vote came
};

}  // namespace regroup::manager
