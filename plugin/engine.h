// SPDX-License-Identifier: Apache-2.0
// The decision engine: a per-job state machine driven by events and an explicit clock.
//
// Events (node health, pod states, fault reports, replacements registered, manager status)
// update facts at once; decisions are taken only in Tick(now), after a fault's report window,
// so one fault seen from several sides leads to one decision. No function reads the time.
// The engine is not thread-safe by itself: its callers (the C ABI, the coordinator) lock it.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "abi/regroup.h"
#include "plugin/config.h"
#include "plugin/job_spec.h"
#include "plugin/sizing.h"
#include "common/status.h"

namespace regroup {

using Phase = regroup_phase;
using DirectiveKind = regroup_directive_kind;
using NodeHealth = regroup_node_health;
using PodPhase = regroup_pod_phase;

std::string_view PhaseName(Phase phase);
std::string_view DirectiveKindName(DirectiveKind kind);
std::string_view NodeHealthName(NodeHealth health);
std::string_view PodPhaseName(PodPhase phase);

enum class FaultKind : uint8_t {
  kProcessExit,      // a trainer process exited (agent, at once)
  kHang,             // a frozen process or a stalled step
  kCollectiveError,  // a collective failed; no process known dead
  kDeviceError,      // the pod's device failed: the pod must be replaced
  kPodLost,          // the pod is gone: failed, deleted, its node faulty, or its agent lost
  kStateLost,        // no rank of the next generation holds the committed state of a shard
};
std::string_view FaultKindName(FaultKind kind);
std::optional<FaultKind> ParseFaultKind(std::string_view name);

// What the manager is told to do.
struct Directive {
  DirectiveKind kind = REGROUP_DIRECTIVE_CONTINUE;
  uint64_t id = 0;
  int64_t at_ms = 0;
  int64_t deadline_ms = -1;
  std::string strategy;  // the ladder step this directive carries out, "" for continue
  int64_t dp = 0;
  std::vector<int64_t> keep_replicas;
  std::vector<int64_t> remove_replicas;
  std::vector<int64_t> standby_pods;
  std::vector<int64_t> restart_ranks;
  std::vector<int64_t> microbatches;
  int64_t committed_step = -1;
  std::string reason;
};

// Why a pod was lost: a short code, so that a job's persisted state stays small however long
// the fault details were (they are kept in the directive's reason).
enum class LostCause : uint8_t {
  kNone,
  kNodeFaulty,
  kNodeUnknown,
  kPodFailed,
  kPodDeleted,
  kPodReplaced,  // a new incarnation appeared
  kDeviceError,
  kPodLost,      // a pod_lost fault
  kJobRestart,
  kProcessDied,  // its process died and recover-in-place is not allowed
};

// A pod uid as a job's persisted state keeps it: "~" and 8 characters of a 48-bit hash. The full
// uids of a large job would not fit a PodGroup annotation, and a fingerprint is enough to tell
// the incarnation the state names from another; the first report of the pod it matches gives the
// full uid back (SameIncarnation in engine.cc). A fingerprint gives itself.
std::string UidFingerprint(std::string_view uid);
bool IsUidFingerprint(std::string_view uid);

// The Kubernetes pod a uid names: an agent readmitted as its own replacement registers as
// `<pod uid>/<n>` (AgentCore::Readmit) in the same pod; Kubernetes pod uids hold no '/'. What the
// scheduler evicts is that pod.
std::string_view PodOfUid(std::string_view uid);

// One pod of a job, by its index (node rank).
struct PodSlot {
  enum class Status : uint8_t {
    kActive,   // holds ranks of the current generation
    kStandby,  // healthy and registered, not in the generation
    kLost,     // gone; a replacement is wanted
  };
  Status status = Status::kActive;
  std::string uid;           // the current incarnation ("" until first seen; a fingerprint
                             // after a restore until seen again)
  std::string lost_uid;      // the incarnation that was lost (a zombie if it comes back)
  std::string node;          // where the current incarnation is bound
  std::string previous_node; // where the slot last ran, preferred for its replacement
  PodPhase phase = REGROUP_POD_RUNNING;
  bool replacement_seen = false;  // a new incarnation exists (not yet registered)
  LostCause lost_cause = LostCause::kNone;
};

struct ManagerProgress {
  int64_t epoch = 0;
  int64_t generation = 0;
  int64_t committed_step = -1;
  int64_t live_ranks = 0;
};

// A fault not yet decided on (inside the report window or held while paused).
struct PendingFault {
  FaultKind kind;
  std::vector<int64_t> pods;
  std::vector<int64_t> ranks;
  int64_t step = -1;
  int64_t at_ms = 0;
  std::string detail;
  int64_t merged = 0;  // faults of its kind joined into it past a report window's bound
  // Processes of the one pod in `pods` by local rank: OnFault adds the ranks they hold in the
  // job's generation to `ranks` (FaultFacts.local_ranks).
  std::vector<int64_t> local_ranks{};
};

// A report window holds at most this many faults; more join the first of their kind.
inline constexpr size_t kMaxFaultsPerWindow = 256;
// A decision's reason describes this many faults in full (details cut to kDetailBytes, pod and
// rank lists to kListBytes) and counts the rest by kind.
inline constexpr size_t kFaultsDescribed = 16;
inline constexpr size_t kDetailBytes = 512;
inline constexpr size_t kListBytes = 256;

struct HistoryEntry {
  int64_t at_ms;
  Phase phase;
  Directive directive;
};

// The scheduler's view of one job's decision.
struct Eviction {
  int64_t pod;
  std::string uid;
  std::string node;
  bool force;
};

class Engine;

// FNV-1a over a name: cheap for the short names of nodes and jobs, and transparent, so tables
// keyed by std::string are searched by string_view without building a string per lookup.
struct NameHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const {
    uint64_t h = 14695981039346656037ull;
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

// One job's state. Everything here is exported to the PodGroup annotations except the spec
// (which the scheduler has) and the config (resolved from it).
class Job {
 public:
  Job(JobSpec spec, JobConfig config);

  const JobSpec& spec() const { return spec_; }
  const JobConfig& config() const { return config_; }
  Phase phase() const { return phase_; }
  const Directive& directive() const { return directive_; }
  const std::vector<PodSlot>& slots() const { return slots_; }
  const std::deque<HistoryEntry>& history() const { return history_; }
  int64_t original_dp() const { return layout_.replicas(); }
  int64_t current_dp() const { return dp_; }
  const Layout& layout() const { return layout_; }
  // The last progress of the job's manager (its epoch survives in the saved state).
  const ManagerProgress& manager_progress() const { return manager_; }
  // The manager epoch a stored state names as the holder of the coordinator's lease (0: none).
  // The engine only keeps it across a save and a restore; the coordinator decides it
  // (Attachments, docs/membership.md "Leases").
  int64_t lease_holder() const { return lease_holder_; }
  // The manager's facts a stored state holds: the epoch that numbered them and the highest one
  // applied (0, 0: none). Kept only across a save and a restore, as the lease holder, so that a
  // restarted coordinator never applies again a fact its predecessor applied and stored.
  std::pair<int64_t, int64_t> facts_applied() const { return facts_applied_; }
  void NoteFactsApplied(int64_t epoch, int64_t seq) { facts_applied_ = {epoch, seq}; }

  // The scheduler's part.
  std::vector<Eviction> Evictions() const;
  uint32_t GangMin() const;
  bool WantsPods() const;
  bool Avoids(std::string_view node) const { return avoid_.find(node) != avoid_.end(); }
  const std::map<std::string, int64_t, std::less<>>& avoided_nodes() const { return avoid_; }
  int32_t Score(int64_t pod, std::string_view node) const;

  nlohmann::json DecisionJson() const;
  nlohmann::json HistoryJson() const;
  nlohmann::json StateJson() const;
  Status LoadState(const nlohmann::json& state);

 private:
  friend class Engine;

  // Event handlers: update facts and queue faults. Return an error for an event that names a
  // pod or rank the job does not have, or a zombie incarnation.
  void OnNode(std::string_view node, NodeHealth health, std::string_view reason, int64_t now);
  Status OnPod(int64_t index, std::string_view uid, PodPhase phase, std::string_view node,
               int64_t now);
  Status OnFault(PendingFault fault);
  Status OnReplacementRegistered(int64_t index, std::string_view uid, int64_t now);
  void OnManagerProgress(const ManagerProgress& status);
  void OnFaultsSettled(int64_t generation);
  void UpdateSpec(JobSpec spec, JobConfig config);

  // Advances to `now`; returns true when a new directive was issued.
  bool Tick(int64_t now);

  void MarkLost(int64_t pod, LostCause cause, int64_t now, bool avoid_node);
  // Decides on the faults of a closed report window.
  void Decide(int64_t now);
  // Decide's steps, in the order it takes them.
  struct FaultSummary;
  FaultSummary SummarizeFaults(const std::vector<PendingFault>& batch) const;
  // Whether a replica of the current generation lost a pod (now, or in `lost_in_batch`).
  bool GenerationLostAPod(const std::set<int64_t>& lost_in_batch) const;
  // Issues what comes instead of a recovery and returns false, or counts the recovery.
  bool ClearedToRecover(int64_t now, std::vector<PendingFault> batch, const FaultSummary& faults);
  // process-recover-enable=pause: the faults wait for DecideHeldWhilePaused.
  void HoldWhilePaused(int64_t now, std::vector<PendingFault> batch, const std::string& what);
  // Counts a recovery and returns true, or escalates past regroup.io/recovery-budget.
  bool SpendRecoveryBudget(int64_t now, const std::string& what);
  // Processes exited or hung on pods not lost: restarted in place, or their pods replaced.
  void RestartDeadRanks(int64_t now, const FaultSummary& faults);
  // Whether a replica of the generation has none of `ranks`: one to give them their state.
  bool HasReplicaClearOf(const std::vector<int64_t>& ranks) const;
  // A collective failed and no process is known dead: retried, or its reporters restarted.
  void RecoverCollective(int64_t now, const FaultSummary& faults);
  void DecideHeldWhilePaused(int64_t now);
  void RecoverPods(int64_t now, const std::string& what, const std::vector<int64_t>& ranks);
  void ScaleIn(int64_t now, const std::string& what, bool waited);
  bool TryGrow(int64_t now);
  void Escalate(int64_t now, const std::string& why);
  // MindCluster's rescheduling, when process-level recovery is off or has nothing left to try:
  // every pod restarts (job level), or only the faulty ones (pod-rescheduling), and every
  // process resumes from the newest checkpoint; `exit` when that is not allowed or used up.
  void JobLevel(int64_t now, const std::string& why);
  // "(reschedule N of LIMIT)", or "(reschedule N)" with no limit: in the reasons of a restart
  // and of its resume.
  std::string RescheduleCount() const;
  // Why the job may not be rescheduled once more; empty when it may.
  std::string RescheduleRefused() const;
  // Reschedules allowed in all: regroup.io/backoff-limit, else fault-retry-times; 0: no limit.
  int64_t RescheduleLimit() const {
    return config_.backoff_limit > 0 ? config_.backoff_limit : config_.fault_retry_times;
  }
  void Issue(int64_t now, Phase phase, Directive d);
  std::vector<bool> Available() const;
  // A replica of the generation whose every pod is available and whose every rank holds the
  // state (none restarted, joined or replaced since the last commit of every rank): one that can
  // write the checkpoint a dump asks for.
  bool HasCompleteReplica() const;
  // The positions of a replica (its tensor x pipeline shards) that no rank of the running
  // generation holds any more: each of its holders is on a pod in `lost`, among `dead_ranks`, or
  // restarted earlier and not yet given the state.
  // Such a shard comes back only from a checkpoint; none before the first commit (a fresh
  // position starts from its replica's own initialisation).
  // With `keep`, only ranks of those replicas count as holders (the replicas a plan keeps).
  std::vector<int64_t> PositionsLost(const std::set<int64_t>& lost,
                                     const std::vector<int64_t>& dead_ranks,
                                     const std::vector<int64_t>* keep = nullptr) const;
  // When a position is lost, decides the job level (the newest checkpoint) and returns true.
  bool ShardLost(int64_t now, const std::string& what, const std::set<int64_t>& lost,
                 const std::vector<int64_t>& dead_ranks,
                 const std::vector<int64_t>* keep = nullptr);
  int64_t RecoveriesInWindow(int64_t now) const;
  int64_t PodOfRank(int64_t rank) const;
  void SettleProgress();

  JobSpec spec_;
  JobConfig config_;
  Layout layout_;
  size_t history_limit_ = 64;

  Phase phase_ = REGROUP_PHASE_RUNNING;
  Directive directive_;
  uint64_t next_directive_id_ = 1;
  int64_t dp_ = 0;                              // degree of the current generation
  std::vector<int64_t> generation_replicas_;    // kept replicas, in order
  // Ranks that hold no state until a generation of every rank commits a step after
  // stateless_after_step_ (its census gave them the state): restarted in place, or joining at a
  // scale-out, as (replica, position); and every rank on a pod lost since (its replacement, or
  // the pod readmitted, holds nothing it can be trusted with).
  std::set<std::pair<int64_t, int64_t>> stateless_;
  std::set<int64_t> stateless_pods_;
  int64_t stateless_after_step_ = -1;
  int64_t lease_holder_ = 0;
  std::pair<int64_t, int64_t> facts_applied_{0, 0};
  void NoteStateless(int64_t replica, int64_t position);
  std::vector<PodSlot> slots_;
  std::vector<PendingFault> pending_;           // inside the report window
  int64_t window_start_ms_ = -1;
  bool window_settled_ = false;  // the manager will report nothing more of these faults
  std::vector<PendingFault> held_;              // held while process-recover-enable=pause
  int64_t held_since_ms_ = -1;
  std::map<std::string, int64_t, std::less<>> avoid_;  // node -> until (ms)
  std::vector<int64_t> recoveries_ms_;          // when each recovery started
  int64_t scale_outs_in_window_ = 0;
  int64_t last_recovery_ms_ = -1;
  std::map<int64_t, std::map<std::string, int64_t>> step_failures_;  // step -> kind -> count
  int64_t job_restarts_ = 0;        // reschedules, whatever the fault
  int64_t business_restarts_ = 0;   // of them, after a fault of the training's own (fault-retry-times)
  bool hardware_fault_ = false;     // the last decided faults include a pod or device lost
  ManagerProgress manager_;
  ManagerProgress manager_at_directive_;
  std::deque<HistoryEntry> history_;
};

struct EngineOptions {
  uint32_t max_jobs = 100000;
  uint32_t max_input_bytes = 4u << 20;
  uint32_t history_length = 64;
};

class Engine {
 public:
  explicit Engine(EngineOptions options = {}) : options_(options) {}

  const EngineOptions& options() const { return options_; }

  // Validates and adds or updates a job. On validation errors the engine is unchanged.
  Status UpsertJob(JobSpec spec, ResolvedConfig* report, int64_t now);
  Status RemoveJob(std::string_view id);
  Job* FindJob(std::string_view id);
  const Job* FindJob(std::string_view id) const;

  Status SetNodeHealth(std::string_view node, NodeHealth health, std::string_view reason,
                       int64_t now);
  Status SetPodState(std::string_view job, int64_t index, std::string_view uid, PodPhase phase,
                     std::string_view node, int64_t now);
  // Typed facts, for callers in this process (the manager's embedded engine, the coordinator).
  // The same as the JSON events of ApplyEvents, which the C ABI uses. An unknown job is
  // NotFound; a pod or rank the job does not have is InvalidArgument.
  // A fault; `fault.at_ms` is when it was reported.
  Status ReportFault(std::string_view job, PendingFault fault);
  // A replacement pod's agent registered with the job's manager.
  Status ReportReplacementRegistered(std::string_view job, int64_t index, std::string_view uid,
                                     int64_t now);
  // The job's manager's progress (epoch, generation, committed step, live ranks).
  Status ReportProgress(std::string_view job, const ManagerProgress& status);
  // The job's manager will report nothing more of the faults that aborted `generation` (every
  // pod they do not name answered the abort): the report window open now closes at the next
  // Tick. Nothing when no fault waits (a window opened later keeps its length), or when the
  // manager has reported progress of a later generation since (a report sent again).
  Status ReportFaultsSettled(std::string_view job, int64_t generation);

  // Applies one event or an array of events (JSON). Stops at the first bad one.
  Status ApplyEvents(const nlohmann::json& events, int64_t now);
  uint32_t Tick(int64_t now);

  // False when the node is faulty or unknown, or the job avoids it.
  bool NodeAllowed(const Job* job, std::string_view node) const;
  // NodeAllowed over many nodes (a NULL name is not allowed): the scheduler's predicate loop.
  void FilterNodes(const Job* job, const char* const* nodes, size_t count, uint8_t* out) const;

  nlohmann::json Snapshot() const;
  // Replaces everything; on error the engine is unchanged.
  Status Restore(const nlohmann::json& snapshot);

 private:
  struct NodeState {
    NodeHealth health = REGROUP_NODE_HEALTHY;
    std::string reason;
    int64_t since_ms = 0;
  };
  Status ApplyEvent(const nlohmann::json& event, int64_t now, const std::string& where);
  StatusOr<Job*> JobFor(std::string_view job, std::string_view where);

  EngineOptions options_;
  std::unordered_map<std::string, std::unique_ptr<Job>, NameHash, std::equal_to<>> jobs_;
  std::unordered_map<std::string, NodeState, NameHash, std::equal_to<>> nodes_;
  std::set<std::string, std::less<>> unhealthy_;  // the nodes not healthy, usually few
};

}  // namespace regroup
