// SPDX-License-Identifier: Apache-2.0
#include "plugin/engine.h"

#include <algorithm>
#include <map>
#include <set>
#include <array>
#include <cstring>

#include "common/text.h"
#include "plugin/engine_names.h"

namespace regroup {

using namespace engine_names;

namespace {

bool IsTerminal(Phase p) {
  return p == REGROUP_PHASE_DUMPING || p == REGROUP_PHASE_EXITING || p == REGROUP_PHASE_FAILED;
}

std::string List(const std::vector<int64_t>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ",";
    out += std::to_string(items[i]);
  }
  return out + "]";
}

std::string Seconds(int64_t ms) {
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
  return std::to_string(ms) + " ms";
}

bool PodPresent(PodPhase p) {
  return p == REGROUP_POD_PENDING || p == REGROUP_POD_BOUND || p == REGROUP_POD_RUNNING;
}

// Whether `uid` is the incarnation `known` names. A restored state knows a uid only by its
// fingerprint: a match takes the full uid back, so later reports compare whole uids again.
bool SameIncarnation(std::string& known, std::string_view uid) {
  if (known == uid) return true;
  if (!IsUidFingerprint(known) || known != UidFingerprint(uid)) return false;
  known = std::string(uid);
  return true;
}

// Whether `uid`, a pod as the scheduler reports it, is the pod whose agent `known` names: that
// pod, or its agent readmitted as its own replacement (`<pod uid>/<n>`, PodOfUid). A restored
// state knows the pod by its fingerprint (JobStateJson saves the pod's, not the agent's): a
// match takes the uid back.
bool SamePod(std::string& known, std::string_view uid) {
  const std::string_view pod = PodOfUid(uid);
  if (PodOfUid(known) == pod) return true;
  if (!IsUidFingerprint(known) || known != UidFingerprint(pod)) return false;
  known = std::string(uid);
  return true;
}

// A lost pod, node or device: what MindCluster reschedules whatever fault-retry-times says (a
// fault of the training's own, a process or a collective, counts against it).
bool HasHardwareFault(const std::vector<PendingFault>& faults) {
  return std::any_of(faults.begin(), faults.end(), [](const PendingFault& f) {
    return f.kind == FaultKind::kPodLost || f.kind == FaultKind::kDeviceError;
  });
}

}  // namespace

std::string_view PodOfUid(std::string_view uid) {
  const size_t slash = uid.rfind('/');
  if (slash == std::string_view::npos || slash + 1 == uid.size()) return uid;
  for (size_t i = slash + 1; i < uid.size(); ++i)
    if (uid[i] < '0' || uid[i] > '9') return uid;
  return PodOfUid(uid.substr(0, slash));
}

std::string_view PhaseName(Phase phase) { return NameOf(kPhaseNames, phase); }
std::string_view DirectiveKindName(DirectiveKind kind) { return NameOf(kDirectiveNames, kind); }
std::string_view NodeHealthName(NodeHealth health) { return NameOf(kHealthNames, health); }
std::string_view PodPhaseName(PodPhase phase) { return NameOf(kPodPhaseNames, phase); }
std::string_view FaultKindName(FaultKind kind) {
  return NameOf(kFaultKindNames, static_cast<int>(kind));
}
std::optional<FaultKind> ParseFaultKind(std::string_view name) {
  return ParseName<FaultKind>(kFaultKindNames, name);
}

constexpr size_t kFingerprintChars = 8;  // of 6 bits each: 48 bits

std::string UidFingerprint(std::string_view uid) {
  if (IsUidFingerprint(uid)) return std::string(uid);
  static constexpr char kDigits[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  uint64_t h = 14695981039346656037ull;  // FNV-1a, then a finalizer that spreads every bit
  for (unsigned char c : uid) h = (h ^ c) * 1099511628211ull;
  h = (h ^ (h >> 33)) * 0xFF51AFD7ED558CCDull;
  h ^= h >> 33;
  std::string out = "~";
  for (size_t i = 0; i < kFingerprintChars; ++i, h >>= 6) out += kDigits[h & 63];
  return out;
}

bool IsUidFingerprint(std::string_view uid) {
  if (uid.size() != kFingerprintChars + 1 || uid[0] != '~') return false;
  return std::all_of(uid.begin() + 1, uid.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '_';
  });
}

// ---------------------------------------------------------------------------------------------
// Job: events
// ---------------------------------------------------------------------------------------------

Job::Job(JobSpec spec, JobConfig config)
    : spec_(std::move(spec)),
      config_(config),
      layout_(Layout::Of(config_, spec_.pods)),
      slots_(static_cast<size_t>(spec_.pods)) {
  dp_ = layout_.replicas();
  for (int64_t r = 0; r < dp_; ++r) generation_replicas_.push_back(r);
  directive_.dp = dp_;
  directive_.keep_replicas = generation_replicas_;
}

void Job::UpdateSpec(JobSpec spec, JobConfig config) {
  // The size of a job is fixed at submission; only its keys may change while it runs.
  spec_ = std::move(spec);
  config_ = config;
}

void Job::MarkLost(int64_t pod, LostCause cause, int64_t now, bool avoid_node) {
  PodSlot& slot = slots_[static_cast<size_t>(pod)];
  if (slot.status == PodSlot::Status::kLost) return;
  slot.status = PodSlot::Status::kLost;
  // Its replacement, or the pod readmitted, holds nothing it can be trusted with; during a job
  // restart every process takes the checkpoint anyway.
  if (cause != LostCause::kJobRestart && phase_ != REGROUP_PHASE_RESTARTING) {
    stateless_pods_.insert(pod);
    stateless_after_step_ = manager_.committed_step;
  }
  slot.lost_uid = slot.uid;
  slot.lost_cause = cause;
  slot.replacement_seen = false;
  if (!slot.node.empty()) slot.previous_node = slot.node;
  if (avoid_node && !slot.node.empty() && config_.node_avoid_s > 0)
    avoid_[slot.node] = now + config_.node_avoid_s * 1000;
}

void Job::OnNode(std::string_view node, NodeHealth health, std::string_view reason, int64_t now) {
  if (health == REGROUP_NODE_HEALTHY) return;
  PendingFault fault{FaultKind::kPodLost, {}, {}, -1, now, {}};
  for (size_t p = 0; p < slots_.size(); ++p) {
    PodSlot& slot = slots_[p];
    if (slot.node != node || slot.status == PodSlot::Status::kLost) continue;
    std::string why = "node " + std::string(node) + " is " +
                      std::string(NodeHealthName(health)) +
                      (reason.empty() ? "" : " (" + std::string(reason) + ")");
    MarkLost(static_cast<int64_t>(p),
             health == REGROUP_NODE_FAULTY ? LostCause::kNodeFaulty : LostCause::kNodeUnknown, now,
             true);
    fault.pods.push_back(static_cast<int64_t>(p));
    fault.detail = why;
  }
  if (!fault.pods.empty()) (void)OnFault(std::move(fault));
}

Status Job::OnPod(int64_t index, std::string_view uid, PodPhase phase, std::string_view node,
                  int64_t now) {
  if (index < 0 || index >= spec_.pods)
    return InvalidArgument("job " + spec_.id + " has no pod " + std::to_string(index) +
                           " (it has " + std::to_string(spec_.pods) + ")");
  if (uid.empty()) return InvalidArgument("a pod event for job " + spec_.id + " has no uid");
  PodSlot& slot = slots_[static_cast<size_t>(index)];
  const bool gone = phase == REGROUP_POD_FAILED || phase == REGROUP_POD_DELETED;
  if (slot.uid.empty()) slot.uid = std::string(uid);  // first sight: the original incarnation

  // The scheduler names pods: the slot's agent (or the lost one) may be a readmitted incarnation
  // of the pod it reports, which is that pod all the same.
  const bool lost_one = SamePod(slot.lost_uid, uid);
  if (SamePod(slot.uid, uid)) {
    if (slot.phase == phase && (node.empty() || slot.node == node)) return Status::Ok();
    slot.phase = phase;
    if (!node.empty()) slot.node = std::string(node);
    if (gone && slot.status != PodSlot::Status::kLost) {
      const bool failed = phase == REGROUP_POD_FAILED;
      MarkLost(index, failed ? LostCause::kPodFailed : LostCause::kPodDeleted, now, failed);
      (void)OnFault(
          {FaultKind::kPodLost, {index}, {}, -1, now, failed ? "pod failed" : "pod deleted"});
    } else if (gone) {
      slot.replacement_seen = false;
    }
    return Status::Ok();
  }
  if (lost_one) return Status::Ok();  // the old one ending
  // First seen ending while the slot's incarnation is registered (its agent is up): an earlier
  // one that ended unseen (the scheduler was paused or restarted while it came and went, and its
  // session reports what ended first). It replaces nobody: taken for the newest, it would mark
  // the registered one lost, whose own report would then read as the old one ending. Had the
  // registered one ended too, its own report says so.
  if (gone && slot.status != PodSlot::Status::kLost) return Status::Ok();
  // Nor while the slot's incarnation is present (pending or running), lost or not: the job
  // controller makes a slot's next pod only once the last one is gone, so a live pod is the
  // newest, and one seen ending now ended before it (simulation seed 142 with a coordinator and
  // 12 faults: taken for the newest, it left the live one, which the engine had lost, never
  // evicted, and the job restart waited for good).
  if (gone && PodPresent(slot.phase)) return Status::Ok();

  // A new incarnation of the slot.
  if (slot.status != PodSlot::Status::kLost) {
    MarkLost(index, LostCause::kPodReplaced, now, false);
    (void)OnFault({FaultKind::kPodLost, {index}, {}, -1, now, "pod replaced by a new incarnation"});
  }
  slot.uid = std::string(uid);
  slot.phase = phase;
  slot.node = std::string(node);
  slot.replacement_seen = !gone;
  return Status::Ok();
}

int64_t Job::PodOfRank(int64_t rank) const {
  const int64_t r = layout_.replica_ranks();
  if (rank < 0) return -1;
  const auto k = static_cast<size_t>(rank / r);
  if (k >= generation_replicas_.size()) return -1;
  return layout_.PodOfRank(generation_replicas_[k], rank % r);
}

Status Job::OnFault(PendingFault fault) {
  for (int64_t p : fault.pods)
    if (p < 0 || p >= spec_.pods)
      return InvalidArgument("job " + spec_.id + " has no pod " + std::to_string(p));
  if (!fault.local_ranks.empty()) {
    if (fault.pods.size() != 1)
      return InvalidArgument("a fault for job " + spec_.id + " names local ranks of " +
                             std::to_string(fault.pods.size()) + " pods; they must be of one");
    const int64_t ppp = spec_.processes_per_pod, size = layout_.replica_ranks();
    for (int64_t local : fault.local_ranks) {
      if (local < 0 || local >= ppp)
        return InvalidArgument("job " + spec_.id + " has " + std::to_string(ppp) +
                               " processes per pod, so no local rank " + std::to_string(local));
      const int64_t global = fault.pods[0] * ppp + local;
      const auto k = std::find(generation_replicas_.begin(), generation_replicas_.end(),
                               global / size);
      if (k != generation_replicas_.end())
        fault.ranks.push_back((k - generation_replicas_.begin()) * size + global % size);
    }
    fault.local_ranks.clear();
  }
  if (fault.pods.empty()) {
    for (int64_t rank : fault.ranks) {
      const int64_t pod = PodOfRank(rank);
      if (pod < 0)
        return InvalidArgument("job " + spec_.id + " has no rank " + std::to_string(rank) +
                               " in its current generation of " +
                               std::to_string(dp_ * layout_.replica_ranks()) + " ranks");
      fault.pods.push_back(pod);
    }
  }
  if (fault.pods.empty() && fault.kind != FaultKind::kCollectiveError &&
      fault.kind != FaultKind::kStateLost)
    return InvalidArgument("a " + std::string(FaultKindName(fault.kind)) + " fault for job " +
                           spec_.id + " names no pod and no rank");
  if (fault.kind == FaultKind::kDeviceError || fault.kind == FaultKind::kPodLost) {
    // Both avoid the pod's node: a lost pod is reported long before Kubernetes marks its node
    // NotReady (40 s by default), and its replacement must not be placed back on a dead node.
    const bool device = fault.kind == FaultKind::kDeviceError;
    for (int64_t p : fault.pods)
      MarkLost(p, device ? LostCause::kDeviceError : LostCause::kPodLost, fault.at_ms, true);
  }
  if (pending_.empty()) window_start_ms_ = fault.at_ms;
  // Faults in one report window are bounded: past the bound, a fault joins the first pending one
  // of its kind (its pods and ranks added, its detail counted, not kept), so a flood of reports
  // costs the job's size in memory, never the flood's.
  if (pending_.size() >= kMaxFaultsPerWindow) {
    auto same = std::find_if(pending_.begin(), pending_.end(),
                             [&](const PendingFault& p) { return p.kind == fault.kind; });
    if (same != pending_.end()) {
      auto join = [](std::vector<int64_t>& into, const std::vector<int64_t>& more) {
        into.insert(into.end(), more.begin(), more.end());
        std::sort(into.begin(), into.end());
        into.erase(std::unique(into.begin(), into.end()), into.end());
      };
      join(same->pods, fault.pods);
      join(same->ranks, fault.ranks);
      same->merged += 1 + fault.merged;
      return Status::Ok();
    }
  }
  pending_.push_back(std::move(fault));
  return Status::Ok();
}

Status Job::OnReplacementRegistered(int64_t index, std::string_view uid, int64_t now) {
  (void)now;
  if (index < 0 || index >= spec_.pods)
    return InvalidArgument("job " + spec_.id + " has no pod " + std::to_string(index));
  if (uid.empty()) return InvalidArgument("a replacement for job " + spec_.id + " has no uid");
  PodSlot& slot = slots_[static_cast<size_t>(index)];
  if (SameIncarnation(slot.lost_uid, uid))
    return FailedPrecondition("pod " + std::to_string(index) + " of job " + spec_.id +
                              " with uid " + std::string(uid) +
                              " is the incarnation that was lost (a zombie); a replacement "
                              "registers with its own new uid");
  if (slot.status != PodSlot::Status::kLost) {
    if (SamePod(slot.uid, uid)) {  // already registered, or readmitted in its pod
      slot.uid = std::string(uid);
      return Status::Ok();
    }
    return FailedPrecondition("pod " + std::to_string(index) + " of job " + spec_.id +
                              " is not lost, so uid " + std::string(uid) +
                              " cannot replace it (its uid is " + slot.uid + ")");
  }
  slot.uid = std::string(uid);
  slot.status = PodSlot::Status::kStandby;
  slot.replacement_seen = false;
  slot.lost_cause = LostCause::kNone;
  if (!PodPresent(slot.phase)) slot.phase = REGROUP_POD_RUNNING;
  return Status::Ok();
}

void Job::OnFaultsSettled(int64_t generation) {
  // Of a generation before the manager's latest: a report sent again after a reconnect, about
  // faults already decided on.
  if (generation < manager_.generation) return;
  if (!pending_.empty()) window_settled_ = true;
}

void Job::OnManagerProgress(const ManagerProgress& status) {
  if (status.epoch < manager_.epoch) return;  // a fenced manager's report
  if (status.epoch == manager_.epoch && status.generation < manager_.generation) return;
  manager_ = status;
  // A generation of every rank committed: its census gave each of them the state.
  if (status.committed_step > stateless_after_step_ &&
      status.live_ranks >= dp_ * layout_.replica_ranks())
    for (int64_t r : generation_replicas_) {
      for (int64_t p : layout_.PodsOfReplica(r))
        if (slots_[static_cast<size_t>(p)].status != PodSlot::Status::kLost) stateless_pods_.erase(p);
      for (int64_t position = 0; position < layout_.replica_ranks(); ++position)
        stateless_.erase({r, position});
    }
  for (auto it = step_failures_.begin(); it != step_failures_.end();) {
    it = it->first <= status.committed_step ? step_failures_.erase(it) : std::next(it);
  }
  SettleProgress();
}

// A transition completes when the manager reports a newer generation that committed a step.
void Job::SettleProgress() {
  const bool in_transition = phase_ == REGROUP_PHASE_RECOVERING ||
                             phase_ == REGROUP_PHASE_SCALING_OUT;
  if (!in_transition) return;
  const bool newer = manager_.epoch > manager_at_directive_.epoch ||
                     manager_.generation > manager_at_directive_.generation;
  // A restart in place may have been carried out before this decision reached the manager (it
  // restarts a dead process at once while the survivors continue): then the generation it
  // reported at the decision trains on, and its next commit completes the transition.
  // A retry likewise, when the manager formed a generation after the fault and before the
  // decision (that generation does the step again).
  const bool same_training = (directive_.kind == REGROUP_DIRECTIVE_RESTART_IN_PLACE ||
                              directive_.kind == REGROUP_DIRECTIVE_RETRY) &&
                             manager_.epoch == manager_at_directive_.epoch &&
                             manager_.generation == manager_at_directive_.generation;
  if ((!newer && !same_training) || manager_.committed_step <= manager_at_directive_.committed_step)
    return;
  phase_ = dp_ < original_dp() ? REGROUP_PHASE_SCALED_IN : REGROUP_PHASE_RUNNING;
}

// ---------------------------------------------------------------------------------------------
// Job: decisions
// ---------------------------------------------------------------------------------------------

std::vector<bool> Job::Available() const {
  std::vector<bool> out(slots_.size());
  for (size_t p = 0; p < slots_.size(); ++p) out[p] = slots_[p].status != PodSlot::Status::kLost;
  return out;
}

bool Job::HasCompleteReplica() const {
  const auto available = Available();
  for (int64_t r : generation_replicas_) {
    bool ok = true;
    for (int64_t p : layout_.PodsOfReplica(r))
      ok = ok && available[static_cast<size_t>(p)] && !stateless_pods_.count(p);
    for (int64_t position = 0; ok && position < layout_.replica_ranks(); ++position)
      ok = !stateless_.count({r, position});
    if (ok) return true;
  }
  return false;
}

void Job::NoteStateless(int64_t replica, int64_t position) {
  stateless_.insert({replica, position});
  stateless_after_step_ = manager_.committed_step;
}

bool Job::ShardLost(int64_t now, const std::string& what, const std::set<int64_t>& lost,
                    const std::vector<int64_t>& dead_ranks, const std::vector<int64_t>* keep) {
  const auto gone = PositionsLost(lost, dead_ranks, keep);
  if (gone.empty()) return false;
  JobLevel(now, what + "; no surviving rank holds the state of replica position" +
                    (gone.size() > 1 ? "s " : " ") + List(gone) + ": a checkpoint is needed");
  return true;
}

std::vector<int64_t> Job::PositionsLost(const std::set<int64_t>& lost,
                                        const std::vector<int64_t>& dead_ranks,
                                        const std::vector<int64_t>* keep) const {
  std::vector<int64_t> out;
  if (manager_.committed_step < 0) return out;
  const int64_t size = layout_.replica_ranks();
  // A set, not a scan per replica: with thousands of replicas a scan made this quadratic.
  std::set<int64_t> kept;
  if (keep) kept.insert(keep->begin(), keep->end());
  for (int64_t position = 0; position < size; ++position) {
    bool held = false;
    for (size_t k = 0; k < generation_replicas_.size() && !held; ++k) {
      if (keep && !kept.count(generation_replicas_[k])) continue;
      const int64_t pod = layout_.PodOfRank(generation_replicas_[k], position);
      held = slots_[static_cast<size_t>(pod)].status != PodSlot::Status::kLost && !lost.count(pod) &&
             !std::binary_search(dead_ranks.begin(), dead_ranks.end(),
                                 static_cast<int64_t>(k) * size + position) &&
             !stateless_pods_.count(pod) && !stateless_.count({generation_replicas_[k], position});
    }
    if (!held) out.push_back(position);
  }
  return out;
}

int64_t Job::RecoveriesInWindow(int64_t now) const {
  const int64_t since = now - config_.recovery_window_s * 1000;
  return std::count_if(recoveries_ms_.begin(), recoveries_ms_.end(),
                       [&](int64_t t) { return t > since; });
}

void Job::Issue(int64_t now, Phase phase, Directive d) {
  d.id = next_directive_id_++;
  d.at_ms = now;
  d.committed_step = manager_.committed_step;
  if (d.dp == 0) d.dp = dp_;
  if (d.keep_replicas.empty()) d.keep_replicas = generation_replicas_;
  phase_ = phase;
  directive_ = std::move(d);
  manager_at_directive_ = manager_;
  // Ranks it restarts hold nothing until the census of a generation of every rank gives it them.
  const int64_t size = layout_.replica_ranks();
  for (int64_t rank : directive_.restart_ranks)
    if (rank >= 0 && static_cast<size_t>(rank / size) < generation_replicas_.size())
      NoteStateless(generation_replicas_[static_cast<size_t>(rank / size)], rank % size);
  history_.push_back({now, phase_, directive_});
  while (history_.size() > history_limit_) history_.pop_front();
}

std::string Job::RescheduleCount() const {
  const int64_t limit = RescheduleLimit();
  return "(reschedule " + std::to_string(job_restarts_) +
         (limit > 0 ? " of " + std::to_string(limit) : "") + ")";
}

std::string Job::RescheduleRefused() const {
  if (config_.fault_scheduling_mode() == FaultScheduling::kOff)
    return "fault-scheduling is off, so the job is not rescheduled";
  const int64_t limit = RescheduleLimit();
  if (limit > 0 && job_restarts_ >= limit)
    return "the reschedules are used up (" + std::to_string(job_restarts_) + " of " +
           std::to_string(limit) +
           (config_.backoff_limit > 0 ? ", regroup.io/backoff-limit)" : ", fault-retry-times)");
  if (!hardware_fault_ && business_restarts_ >= config_.fault_retry_times)
    return config_.fault_retry_times == 0
               ? std::string("a fault of the training's own reschedules only with "
                             "fault-retry-times set")
               : "fault-retry-times is used up (" + std::to_string(business_restarts_) + " of " +
                     std::to_string(config_.fault_retry_times) + ")";
  return "";
}

void Job::JobLevel(int64_t now, const std::string& why) {
  Directive d;
  if (const std::string refused = RescheduleRefused(); !refused.empty()) {
    d.kind = REGROUP_DIRECTIVE_EXIT;
    d.strategy = "exit";
    d.reason = why + "; " + refused + "; exiting";
    Issue(now, REGROUP_PHASE_EXITING, std::move(d));
    return;
  }
  ++job_restarts_;
  if (!hardware_fault_) ++business_restarts_;
  // MindCluster's pod-level rescheduling replaces the faulty pods only, unless rank 0's pod is
  // one of them; its job-level rescheduling replaces them all. A pod that is not lost is faulty
  // only by its processes, which restart with every other process anyway.
  const bool pod_level = config_.pod_rescheduling != 0 &&
                         slots_[0].status != PodSlot::Status::kLost;
  if (!pod_level)
    for (size_t p = 0; p < slots_.size(); ++p)
      MarkLost(static_cast<int64_t>(p), LostCause::kJobRestart, now, false);
  stateless_.clear();  // every process restarts from the checkpoint
  stateless_pods_.clear();
  stateless_after_step_ = -1;
  d.kind = REGROUP_DIRECTIVE_RESTART_JOB;
  d.strategy = pod_level ? "pod-rescheduling" : "job-rescheduling";
  d.reason = why + (pod_level ? "; replacing the faulty pods (pod-level rescheduling)"
                              : "; replacing every pod (job-level rescheduling)") +
             ": every process restarts from the newest checkpoint " + RescheduleCount();
  Issue(now, REGROUP_PHASE_RESTARTING, std::move(d));
}

void Job::Escalate(int64_t now, const std::string& why) {
  if (config_.recovery_on() && config_.allows(Strategy::kDump) && HasCompleteReplica()) {
    Directive d;
    d.kind = REGROUP_DIRECTIVE_DUMP;
    d.strategy = "dump";
    d.reason = why + "; the survivors write a checkpoint and exit";
    Issue(now, REGROUP_PHASE_DUMPING, std::move(d));
    return;
  }
  JobLevel(now, why);
}

void Job::ScaleIn(int64_t now, const std::string& what, bool waited) {
  if (!config_.allows(Strategy::kElasticTraining)) {
    Escalate(now, what + (waited ? "; no replacement registered in time" : "") +
                      "; elastic-training is not allowed");
    return;
  }
  std::string why;
  auto plan = PlanGeneration(config_, layout_, Available(), &why);
  if (!plan) {
    Escalate(now, what + "; cannot scale in: " + why);
    return;
  }
  // The replicas it keeps must hold the state between them: a holder on a replica left
  // incomplete does not train, and nobody outside the generation sends.
  if (ShardLost(now, what + "; scaling in would keep no holder", {}, {}, &plan->keep_replicas)) return;
  Directive d;
  d.kind = REGROUP_DIRECTIVE_SCALE_IN;
  d.strategy = "elastic-training";
  d.dp = plan->dp;
  d.keep_replicas = plan->keep_replicas;
  const std::set<int64_t> kept(plan->keep_replicas.begin(), plan->keep_replicas.end());
  for (int64_t r : generation_replicas_)
    if (!kept.count(r)) d.remove_replicas.push_back(r);
  d.standby_pods = plan->standby_pods;
  d.microbatches = plan->microbatches;
  d.reason = what + "; scaling in from dp=" + std::to_string(dp_) + " to dp=" +
             std::to_string(plan->dp) + " (replicas " + List(d.remove_replicas) + " removed" +
             (d.standby_pods.empty() ? "" : ", pods " + List(d.standby_pods) + " kept as standbys") +
             ")";
  generation_replicas_ = plan->keep_replicas;
  dp_ = plan->dp;
  for (auto& slot : slots_)
    if (slot.status == PodSlot::Status::kActive) slot.status = PodSlot::Status::kStandby;
  for (int64_t r : generation_replicas_)
    for (int64_t p : layout_.PodsOfReplica(r))
      slots_[static_cast<size_t>(p)].status = PodSlot::Status::kActive;
  Issue(now, REGROUP_PHASE_SCALED_IN, std::move(d));
}

void Job::RecoverPods(int64_t now, const std::string& what, const std::vector<int64_t>& ranks) {
  const auto wait = config_.replacement_wait_ms();
  if (config_.prefer_elastic && config_.allows(Strategy::kElasticTraining)) {
    ScaleIn(now, what + "; regroup.io/prefer-elastic: scaling in at once", false);
    return;
  }
  std::vector<int64_t> lost;
  for (size_t p = 0; p < slots_.size(); ++p)
    if (slots_[p].status == PodSlot::Status::kLost) lost.push_back(static_cast<int64_t>(p));
  Directive d;
  d.kind = REGROUP_DIRECTIVE_WAIT;
  d.restart_ranks = ranks;
  if (config_.allows(Strategy::kRecover)) {
    d.strategy = "recover";
    d.deadline_ms = now + *wait;
    d.reason = what + "; waiting up to " + Seconds(*wait) +
               " (wait-reschedule-timeout) for replacements of pods " + List(lost);
    Issue(now, REGROUP_PHASE_WAITING, std::move(d));
    return;
  }
  if (config_.allows(Strategy::kElasticTraining)) {
    if (wait && *wait > 0) {
      d.strategy = "elastic-training";
      d.deadline_ms = now + *wait;
      d.reason = what + "; recover is not allowed: waiting MINDIO_WAIT_MINDX_TIME - 10 s = " +
                 Seconds(*wait) + " for replacements of pods " + List(lost) +
                 " before scaling in";
      Issue(now, REGROUP_PHASE_WAITING, std::move(d));
      return;
    }
    ScaleIn(now, what + "; MINDIO_WAIT_MINDX_TIME - 10 s leaves no wait: scaling in at once",
            false);
    return;
  }
  Escalate(now, what + "; neither recover nor elastic-training is allowed");
}

namespace {

// What happened, in one sentence: the first faults in full (details cut), the rest counted by
// kind, so that a mass failure's reason still fits a message (it once took 4.2 MB at 1,024
// faults).
std::string DescribeFaults(const std::vector<PendingFault>& batch) {
  std::string what;
  size_t described = 0;
  std::map<std::string, int64_t> not_described;
  for (const auto& f : batch) {
    if (described < kFaultsDescribed) {
      ++described;
      if (!what.empty()) what += "; ";
      what += std::string(FaultKindName(f.kind));
      if (!f.ranks.empty()) what += " on ranks " + BoundedText(List(f.ranks), kListBytes);
      if (!f.pods.empty()) what += " on pods " + BoundedText(List(f.pods), kListBytes);
      if (f.step >= 0) what += " at step " + std::to_string(f.step);
      if (!f.detail.empty()) what += " (" + BoundedText(f.detail, kDetailBytes) + ")";
      if (f.merged > 0) what += " (and " + std::to_string(f.merged) + " more merged into it)";
    } else {
      not_described[std::string(FaultKindName(f.kind))] += 1 + f.merged;
    }
  }
  if (!not_described.empty()) {
    std::string more;
    for (const auto& [kind, count] : not_described)
      more += (more.empty() ? "" : ", ") + std::to_string(count) + " " + kind;
    what += "; and " + more + " more";
  }
  return what;
}

}  // namespace

// What a report window's faults amount to: the facts Decide works from, read once.
struct Job::FaultSummary {
  std::string what;                       // DescribeFaults
  std::vector<int64_t> dead_ranks;        // exited or hung, on pods not lost; sorted, unique
  bool collective = false;                // a collective failed
  std::vector<int64_t> collective_ranks;  // the ranks that said so
  bool state_lost = false;                // the manager found a shard no rank holds
  std::set<int64_t> lost_in_batch;        // pods reported lost, or whose device failed
  std::optional<std::string> poison;      // a fault of a kind already seen at the same step
};

Job::FaultSummary Job::SummarizeFaults(const std::vector<PendingFault>& batch) const {
  FaultSummary s;
  s.what = DescribeFaults(batch);
  for (const auto& f : batch) {
    if (f.kind == FaultKind::kProcessExit || f.kind == FaultKind::kHang) {
      for (int64_t p : f.pods)
        if (slots_[static_cast<size_t>(p)].status != PodSlot::Status::kLost)
          s.dead_ranks.insert(s.dead_ranks.end(), f.ranks.begin(), f.ranks.end());
    }
    s.state_lost = s.state_lost || f.kind == FaultKind::kStateLost;
    if (f.kind == FaultKind::kCollectiveError) {
      s.collective = true;
      s.collective_ranks.insert(s.collective_ranks.end(), f.ranks.begin(), f.ranks.end());
    }
    if (f.kind == FaultKind::kPodLost || f.kind == FaultKind::kDeviceError)
      s.lost_in_batch.insert(f.pods.begin(), f.pods.end());
    if (f.step >= 0 && !s.poison) {
      auto step = step_failures_.find(f.step);
      if (step != step_failures_.end() && step->second.count(std::string(FaultKindName(f.kind))))
        s.poison = "poison step " + std::to_string(f.step) + ": " +
                   std::string(FaultKindName(f.kind)) + " twice at the same step";
    }
  }
  std::sort(s.dead_ranks.begin(), s.dead_ranks.end());
  s.dead_ranks.erase(std::unique(s.dead_ranks.begin(), s.dead_ranks.end()), s.dead_ranks.end());
  return s;
}

// A pod lost now, or one the batch reports lost whose replacement (or own readmission) registered
// within the report window: the manager aborted the generation either way.
bool Job::GenerationLostAPod(const std::set<int64_t>& lost_in_batch) const {
  for (int64_t r : generation_replicas_)
    for (int64_t p : layout_.PodsOfReplica(r))
      if (slots_[static_cast<size_t>(p)].status == PodSlot::Status::kLost ||
          lost_in_batch.count(p) > 0)
        return true;
  return false;
}

void Job::Decide(int64_t now) {
  std::vector<PendingFault> batch = std::move(pending_);
  pending_.clear();
  window_start_ms_ = -1;
  window_settled_ = false;
  if (IsTerminal(phase_) || phase_ == REGROUP_PHASE_RESTARTING) return;
  if (phase_ == REGROUP_PHASE_PAUSED) {
    for (auto& f : batch) held_.push_back(std::move(f));
    return;
  }
  hardware_fault_ = HasHardwareFault(batch);
  const FaultSummary faults = SummarizeFaults(batch);
  // The manager found a shard no rank of the next generation holds: what this engine knows may be
  // older (a restarted manager's embedded engine is new; survivors that trained on without the
  // other replicas left those behind), the manager's knowledge is the ranks' own reports.
  if (faults.state_lost) {
    JobLevel(now, faults.what + "; a checkpoint is needed");
    return;
  }
  // A generation that lost a pod always gets a directive; with no rank dead and no collective
  // failed, only standbys were touched: nothing to recover, the lost pods are wanted back.
  const bool broken = GenerationLostAPod(faults.lost_in_batch);
  if (!broken && faults.dead_ranks.empty() && !faults.collective) return;
  if (!ClearedToRecover(now, std::move(batch), faults)) return;
  if (broken)
    RecoverPods(now, faults.what, faults.dead_ranks);
  else if (!faults.dead_ranks.empty())
    RestartDeadRanks(now, faults);
  else
    RecoverCollective(now, faults);
}

// What stands between a decided fault and its recovery, in this order: a poison step escalates,
// process-level recovery switched off reschedules, pause holds the faults, a shard whose every
// copy is gone needs a checkpoint, and the recovery budget must have room. True when the recovery
// goes ahead.
bool Job::ClearedToRecover(int64_t now, std::vector<PendingFault> batch,
                           const FaultSummary& faults) {
  const std::string& what = faults.what;
  if (faults.poison) {
    Escalate(now, *faults.poison + " (" + what + ")");
    return false;
  }
  if (!config_.recovery_on()) {
    JobLevel(now, what + "; process-level recovery is off (fault-scheduling=" +
                      KeyValueText(*FindKey("fault-scheduling"), config_.fault_scheduling) +
                      ", process-recover-enable=" +
                      KeyValueText(*FindKey("process-recover-enable"), config_.process_recover) +
                      ")");
    return false;
  }
  if (config_.process_recover_mode() == ProcessRecover::kPause) {
    HoldWhilePaused(now, std::move(batch), what);
    return false;
  }
  // Whatever the strategy, the survivors' census would find no rank to send such a shard
  // (python/regroup/sync.py).
  if (ShardLost(now, what, faults.lost_in_batch, faults.dead_ranks)) return false;
  // Counted only once a fault is decided on, so a fault held while paused counts once.
  for (const auto& f : batch)
    if (f.step >= 0) ++step_failures_[f.step][std::string(FaultKindName(f.kind))];
  return SpendRecoveryBudget(now, what);
}

void Job::HoldWhilePaused(int64_t now, std::vector<PendingFault> batch, const std::string& what) {
  held_ = std::move(batch);
  held_since_ms_ = now;
  Directive d;
  d.kind = REGROUP_DIRECTIVE_WAIT;
  d.strategy = "pause";
  d.deadline_ms = now + config_.mindio_wait_s * 1000;
  d.reason = what + "; process-recover-enable=pause: the fault is held until it is on again "
                    "or MINDIO_WAIT_MINDX_TIME (" + std::to_string(config_.mindio_wait_s) +
             " s) runs out";
  Issue(now, REGROUP_PHASE_PAUSED, std::move(d));
}

bool Job::SpendRecoveryBudget(int64_t now, const std::string& what) {
  const int64_t recent = RecoveriesInWindow(now);
  if (recent >= config_.recovery_budget) {
    Escalate(now, what + "; recovery budget exhausted: " + std::to_string(recent) +
                      " recoveries in the last " + std::to_string(config_.recovery_window_s) +
                      " s (regroup.io/recovery-budget=" +
                      std::to_string(config_.recovery_budget) + ")");
    return false;
  }
  recoveries_ms_.push_back(now);
  last_recovery_ms_ = now;
  const int64_t since = now - config_.recovery_window_s * 1000;
  recoveries_ms_.erase(std::remove_if(recoveries_ms_.begin(), recoveries_ms_.end(),
                                      [&](int64_t t) { return t <= since; }),
                       recoveries_ms_.end());
  return true;
}

void Job::RestartDeadRanks(int64_t now, const FaultSummary& faults) {
  const std::string& what = faults.what;
  const std::vector<int64_t>& dead_ranks = faults.dead_ranks;
  if (config_.allows(Strategy::kRecoverInPlace)) {
    if (!HasReplicaClearOf(dead_ranks)) {
      JobLevel(now, what + "; no healthy replica is left to give the restarted ranks their "
                           "state: a checkpoint is needed");
      return;
    }
    Directive d;
    d.kind = REGROUP_DIRECTIVE_RESTART_IN_PLACE;
    d.strategy = "recover-in-place";
    d.restart_ranks = dead_ranks;
    d.reason = what + "; restarting ranks " + List(dead_ranks) +
               " in place, state from a peer replica";
    Issue(now, REGROUP_PHASE_RECOVERING, std::move(d));
    return;
  }
  if (config_.allows(Strategy::kRecover) || config_.allows(Strategy::kElasticTraining)) {
    for (int64_t rank : dead_ranks)
      if (int64_t p = PodOfRank(rank); p >= 0) MarkLost(p, LostCause::kProcessDied, now, false);
    // Replacing a pod gives up its healthy ranks too, and one of them may hold the last copy of a
    // shard.
    const std::string replacing = what + "; recover-in-place is not allowed: replacing the pods";
    if (ShardLost(now, replacing, faults.lost_in_batch, dead_ranks)) return;
    RecoverPods(now, replacing, {});
    return;
  }
  Escalate(now, what + "; no allowed strategy restarts a process");
}

bool Job::HasReplicaClearOf(const std::vector<int64_t>& ranks) const {
  std::vector<bool> touched(slots_.size(), false);
  for (int64_t rank : ranks)
    if (int64_t p = PodOfRank(rank); p >= 0) touched[static_cast<size_t>(p)] = true;
  for (int64_t r : generation_replicas_) {
    bool clear = true;
    for (int64_t p : layout_.PodsOfReplica(r)) clear = clear && !touched[static_cast<size_t>(p)];
    if (clear) return true;
  }
  return false;
}

void Job::RecoverCollective(int64_t now, const FaultSummary& faults) {
  if (config_.allows(Strategy::kRetry)) {
    Directive d;
    d.kind = REGROUP_DIRECTIVE_RETRY;
    d.strategy = "retry";
    d.reason = faults.what + "; every rank aborts the step and does it again";
    Issue(now, REGROUP_PHASE_RECOVERING, std::move(d));
    return;
  }
  if (config_.allows(Strategy::kRecoverInPlace) && !faults.collective_ranks.empty()) {
    Directive d;
    d.kind = REGROUP_DIRECTIVE_RESTART_IN_PLACE;
    d.strategy = "recover-in-place";
    d.restart_ranks = faults.collective_ranks;
    d.reason = faults.what + "; retry is not allowed: restarting the reporting ranks in place";
    Issue(now, REGROUP_PHASE_RECOVERING, std::move(d));
    return;
  }
  Escalate(now, faults.what + "; retry is not allowed");
}

void Job::DecideHeldWhilePaused(int64_t now) {
  if (config_.process_recover_mode() == ProcessRecover::kOn) {
    // Resumed: decide on the held faults as if they had just arrived.
    phase_ = dp_ < original_dp() ? REGROUP_PHASE_SCALED_IN : REGROUP_PHASE_RUNNING;
    for (auto& f : held_) pending_.push_back(std::move(f));
    held_.clear();
    held_since_ms_ = -1;
    window_start_ms_ = now;
    Decide(now);
  } else if (config_.process_recover_mode() == ProcessRecover::kOff ||
             now >= held_since_ms_ + config_.mindio_wait_s * 1000) {
    hardware_fault_ = HasHardwareFault(held_);
    held_.clear();
    held_since_ms_ = -1;
    JobLevel(now, config_.process_recover_mode() == ProcessRecover::kOff
                      ? "process-recover-enable turned off while a fault was held"
                      : "process-recover-enable stayed paused for MINDIO_WAIT_MINDX_TIME (" +
                            std::to_string(config_.mindio_wait_s) + " s)");
  }
}

bool Job::TryGrow(int64_t now) {
  const bool waiting = phase_ == REGROUP_PHASE_WAITING || phase_ == REGROUP_PHASE_RESTARTING;
  if (!waiting && phase_ != REGROUP_PHASE_SCALED_IN) return false;
  auto plan = PlanGeneration(config_, layout_, Available(), nullptr);
  if (!plan) return false;
  const int64_t needed = phase_ == REGROUP_PHASE_RESTARTING ? original_dp() : dp_;
  if (waiting && plan->dp < needed) return false;
  // A resume with the survivors' state waits until the replicas it keeps hold every shard (a
  // holder's replica may still lack a pod); its deadline's scale-in decides otherwise.
  if (phase_ == REGROUP_PHASE_WAITING && !PositionsLost({}, {}, &plan->keep_replicas).empty())
    return false;
  if (!waiting && plan->dp <= dp_) return false;

  const int64_t since = now - config_.recovery_window_s * 1000;
  scale_outs_in_window_ = 0;
  int64_t last_scale_in = -1;
  for (const auto& h : history_) {
    if (h.directive.kind == REGROUP_DIRECTIVE_SCALE_OUT && h.at_ms > since) ++scale_outs_in_window_;
    if (h.directive.kind == REGROUP_DIRECTIVE_SCALE_IN) last_scale_in = h.at_ms;
  }
  if (!waiting && scale_outs_in_window_ > 0) {
    const int64_t shift = std::min<int64_t>(scale_outs_in_window_ - 1, 16);
    const int64_t backoff = std::min(config_.scale_out_backoff_s * 1000 * (int64_t{1} << shift),
                                     config_.recovery_window_s * 1000);
    if (now < last_scale_in + backoff) return false;
  }

  Directive d;
  d.dp = plan->dp;
  d.keep_replicas = plan->keep_replicas;
  d.standby_pods = plan->standby_pods;
  d.microbatches = plan->microbatches;
  std::vector<int64_t> joined;
  for (auto& slot : slots_)
    if (slot.status == PodSlot::Status::kActive) slot.status = PodSlot::Status::kStandby;
  const std::set<int64_t> had(generation_replicas_.begin(), generation_replicas_.end());
  for (int64_t r : plan->keep_replicas) {
    for (int64_t p : layout_.PodsOfReplica(r)) {
      auto& slot = slots_[static_cast<size_t>(p)];
      slot.status = PodSlot::Status::kActive;
    }
    if (!had.count(r)) {
      joined.push_back(r);
      for (int64_t position = 0; position < layout_.replica_ranks(); ++position)
        NoteStateless(r, position);
    }
  }
  const int64_t old_dp = dp_;
  generation_replicas_ = plan->keep_replicas;
  dp_ = plan->dp;
  if (waiting) {
    d.kind = REGROUP_DIRECTIVE_RESUME;
    d.strategy = directive_.strategy;
    // A rescheduling's resume says which reschedule it ends: the manager may see it alone
    // (its restart_job superseded in the same tick).
    d.reason = "replacements registered; resuming at dp=" + std::to_string(dp_) +
               (phase_ == REGROUP_PHASE_RESTARTING
                    ? " from the newest checkpoint " + RescheduleCount()
                    : " with the survivors' state");
    Issue(now, dp_ < original_dp() ? REGROUP_PHASE_SCALED_IN : REGROUP_PHASE_RUNNING,
          std::move(d));
  } else {
    d.kind = REGROUP_DIRECTIVE_SCALE_OUT;
    d.strategy = "elastic-training";
    d.reason = "replacements registered; scaling out from dp=" + std::to_string(old_dp) +
               " to dp=" + std::to_string(dp_) + " (replicas " + List(joined) +
               " join at the next step boundary)";
    Issue(now, REGROUP_PHASE_SCALING_OUT, std::move(d));
  }
  return true;
}

bool Job::Tick(int64_t now) {
  const uint64_t before = directive_.id;
  for (auto it = avoid_.begin(); it != avoid_.end();)
    it = it->second <= now ? avoid_.erase(it) : std::next(it);
  if (IsTerminal(phase_)) {
    pending_.clear();
    window_settled_ = false;
    return false;
  }
  if (!pending_.empty() &&
      (window_settled_ || now >= window_start_ms_ + config_.report_window_ms))
    Decide(now);
  if (phase_ == REGROUP_PHASE_PAUSED) DecideHeldWhilePaused(now);
  if (!TryGrow(now) && phase_ == REGROUP_PHASE_WAITING && directive_.deadline_ms >= 0 &&
      now >= directive_.deadline_ms) {
    ScaleIn(now, "no replacement registered by the deadline (" + Seconds(directive_.deadline_ms -
                                                                         directive_.at_ms) +
                     ")",
            true);
  }
  return directive_.id != before;
}

// ---------------------------------------------------------------------------------------------
// Job: the scheduler's part
// ---------------------------------------------------------------------------------------------

std::vector<Eviction> Job::Evictions() const {
  std::vector<Eviction> out;
  if (config_.fault_scheduling_mode() == FaultScheduling::kOff) return out;
  const bool force = config_.fault_scheduling_mode() == FaultScheduling::kForce;
  // A failed pod stays failed (Volcano's job controller creates again only a pod that is gone):
  // deleted, while the job wants its pods back.
  const bool wants = WantsPods();
  for (size_t p = 0; p < slots_.size(); ++p) {
    const PodSlot& s = slots_[p];
    // A fingerprint is not a pod to evict: the pod's next report gives its uid back.
    if (s.status == PodSlot::Status::kLost && !s.replacement_seen && s.uid == s.lost_uid &&
        !s.uid.empty() && !IsUidFingerprint(s.uid) &&
        (PodPresent(s.phase) || (wants && s.phase == REGROUP_POD_FAILED)))
      // The pod, not its agent's incarnation: a readmitted agent's uid names no pod the
      // scheduler has: it would never be evicted, and its replacement would never come.
      out.push_back({static_cast<int64_t>(p), std::string(PodOfUid(s.uid)), s.node, force});
  }
  return out;
}

uint32_t Job::GangMin() const {
  const int64_t managers = spec_.volcano ? spec_.volcano->manager_pods : 0;
  if (phase_ != REGROUP_PHASE_SCALED_IN && phase_ != REGROUP_PHASE_SCALING_OUT)
    return static_cast<uint32_t>(spec_.pods + managers);
  int64_t active = 0;
  for (const auto& s : slots_) active += s.status == PodSlot::Status::kActive;
  return static_cast<uint32_t>(active + managers);
}

bool Job::WantsPods() const {
  if (IsTerminal(phase_)) return false;
  // Without process-level recovery a lost pod is wanted back only by a rescheduling.
  if (!config_.recovery_on() && phase_ != REGROUP_PHASE_RESTARTING) return false;
  for (const auto& s : slots_)
    if (s.status == PodSlot::Status::kLost) return true;
  return false;
}

int32_t Job::Score(int64_t pod, std::string_view node) const {
  if (pod < 0 || pod >= spec_.pods || Avoids(node)) return 0;
  const PodSlot& slot = slots_[static_cast<size_t>(pod)];
  if (slot.previous_node == node) return 100;
  // A node that hosts another pod of the same replica keeps the replica close.
  const int64_t replica = pod * spec_.processes_per_pod / layout_.replica_ranks();
  if (replica < layout_.replicas()) {
    for (int64_t p : layout_.PodsOfReplica(replica)) {
      const PodSlot& peer = slots_[static_cast<size_t>(p)];
      if (p != pod && peer.status != PodSlot::Status::kLost && peer.node == node) return 50;
    }
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Engine
// ---------------------------------------------------------------------------------------------

Status Engine::UpsertJob(JobSpec spec, ResolvedConfig* report, int64_t now) {
  (void)now;
  ResolvedConfig resolved = spec.Resolve();
  if (report) *report = resolved;
  if (!resolved.ok()) {
    std::string first;
    for (const auto& p : resolved.problems)
      if (p.severity == Problem::Severity::kError) {
        first = p.message;
        break;
      }
    return {REGROUP_VALIDATION_FAILED, "job " + spec.id + " is invalid: " + first};
  }
  auto it = jobs_.find(spec.id);
  if (it != jobs_.end()) {
    Job& job = *it->second;
    if (job.spec().uid != spec.uid || job.spec().pods != spec.pods ||
        job.spec().processes_per_pod != spec.processes_per_pod ||
        job.config().replica_ranks() != resolved.config.replica_ranks()) {
      // A different incarnation or shape: a new job under the same name.
      it->second = std::make_unique<Job>(std::move(spec), resolved.config);
      it->second->history_limit_ = options_.history_length;
    } else {
      job.UpdateSpec(std::move(spec), resolved.config);
    }
    return Status::Ok();
  }
  if (jobs_.size() >= options_.max_jobs)
    return {REGROUP_RESOURCE_EXHAUSTED,
            "the engine already holds " + std::to_string(jobs_.size()) +
                " jobs, its limit (regroup_engine_options.max_jobs)"};
  std::string id = spec.id;
  auto job = std::make_unique<Job>(std::move(spec), resolved.config);
  job->history_limit_ = options_.history_length;
  jobs_.emplace(std::move(id), std::move(job));
  return Status::Ok();
}

Status Engine::RemoveJob(std::string_view id) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return NotFound("no job \"" + std::string(id) + "\" in the engine");
  jobs_.erase(it);
  return Status::Ok();
}

Job* Engine::FindJob(std::string_view id) {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

const Job* Engine::FindJob(std::string_view id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

Status Engine::SetNodeHealth(std::string_view node, NodeHealth health, std::string_view reason,
                             int64_t now) {
  if (node.empty() || node.size() > 512)
    return InvalidArgument("a node name must be 1 to 512 characters");
  if (health < REGROUP_NODE_HEALTHY || health > REGROUP_NODE_UNKNOWN)
    return InvalidArgument("node health " + std::to_string(static_cast<int>(health)) +
                           " is not healthy (0), faulty (1) or unknown (2)");
  auto it = nodes_.find(node);
  if (it == nodes_.end()) {
    it = nodes_.emplace(std::string(node), NodeState{}).first;
  } else if (it->second.health == health) {
    return Status::Ok();
  }
  NodeState& state = it->second;
  if (health == REGROUP_NODE_HEALTHY)
    unhealthy_.erase(it->first);
  else
    unhealthy_.insert(it->first);
  state.health = health;
  state.reason = std::string(reason);
  state.since_ms = now;
  if (health != REGROUP_NODE_HEALTHY)
    for (auto& [id, job] : jobs_) job->OnNode(node, health, reason, now);
  return Status::Ok();
}

Status Engine::SetPodState(std::string_view job_id, int64_t index, std::string_view uid,
                           PodPhase phase, std::string_view node, int64_t now) {
  Job* job = FindJob(job_id);
  if (!job) return NotFound("no job " + std::string(job_id) + " in the engine");
  if (phase < REGROUP_POD_PENDING || phase > REGROUP_POD_DELETED)
    return InvalidArgument("pod phase " + std::to_string(static_cast<int>(phase)) +
                           " is not one of pending, bound, running, failed, deleted");
  if (node.size() > 512) return InvalidArgument("a node name must be at most 512 characters");
  REGROUP_RETURN_IF_ERROR(job->OnPod(index, uid, phase, node, now));
  // A pod bound to a node already known faulty is lost at once.
  auto it = node.empty() || unhealthy_.empty() ? nodes_.end() : nodes_.find(node);
  if (it != nodes_.end() && it->second.health != REGROUP_NODE_HEALTHY &&
      (phase == REGROUP_POD_BOUND || phase == REGROUP_POD_RUNNING))
    job->OnNode(node, it->second.health, it->second.reason, now);
  return Status::Ok();
}

StatusOr<Job*> Engine::JobFor(std::string_view job, std::string_view where) {
  Job* found = FindJob(job);
  if (!found) return NotFound(std::string(where) + "no job " + std::string(job) + " in the engine");
  return found;
}

Status Engine::ReportFault(std::string_view job, PendingFault fault) {
  auto found = JobFor(job, "");
  if (!found.ok()) return found.status();
  if (fault.step < -1 || fault.step > kMaxTime)
    return InvalidArgument("a fault of job " + std::string(job) + " names step " +
                           std::to_string(fault.step) + "; steps are from -1 (unknown) to " +
                           std::to_string(kMaxTime));
  return (*found)->OnFault(std::move(fault));
}

Status Engine::ReportReplacementRegistered(std::string_view job, int64_t index,
                                           std::string_view uid, int64_t now) {
  auto found = JobFor(job, "");
  if (!found.ok()) return found.status();
  return (*found)->OnReplacementRegistered(index, uid, now);
}

Status Engine::ReportFaultsSettled(std::string_view job, int64_t generation) {
  auto found = JobFor(job, "");
  if (!found.ok()) return found.status();
  (*found)->OnFaultsSettled(generation);
  return Status::Ok();
}

Status Engine::ReportProgress(std::string_view job, const ManagerProgress& status) {
  auto found = JobFor(job, "");
  if (!found.ok()) return found.status();
  const auto out_of_range = [](int64_t v, int64_t min) { return v < min || v > kMaxTime; };
  if (out_of_range(status.epoch, 0) || out_of_range(status.generation, 0) ||
      out_of_range(status.committed_step, -1) || out_of_range(status.live_ranks, 0))
    return InvalidArgument("the manager status of job " + std::string(job) +
                           " holds an epoch, generation, step or rank count out of range (0 to " +
                           std::to_string(kMaxTime) + ", the step from -1)");
  (*found)->OnManagerProgress(status);
  return Status::Ok();
}

uint32_t Engine::Tick(int64_t now) {
  uint32_t changed = 0;
  for (auto& [id, job] : jobs_) changed += job->Tick(now);
  return changed;
}

bool Engine::NodeAllowed(const Job* job, std::string_view node) const {
  if (!unhealthy_.empty() && unhealthy_.find(node) != unhealthy_.end()) return false;
  return !job || !job->Avoids(node);
}

namespace {

// A small set of names for the predicate loop: open addressing over a power-of-two table,
// hashed eight bytes at a time. Thousands of node names are checked against a few excluded
// ones, so the check must cost a few nanoseconds and stay in cache.
class NameSet {
 public:
  explicit NameSet(size_t expected) {
    size_t size = 16;
    while (size < expected * 4) size <<= 1;
    slots_.resize(size);
    mask_ = size - 1;
  }
  static uint64_t Hash(const char* p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    for (; n >= 8; p += 8, n -= 8) {
      uint64_t w;
      std::memcpy(&w, p, 8);
      h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
      h ^= h >> 31;
    }
    uint64_t tail = 0;
    std::memcpy(&tail, p, n);
    h = (h ^ tail) * 0x94D049BB133111EBull;
    return (h ^ (h >> 29)) | 1;  // never 0: 0 marks an empty slot
  }
  void Insert(std::string_view name) {
    const uint64_t h = Hash(name.data(), name.size());
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].hash == 0) {
        slots_[i] = {h, name};
        ++count_;
        return;
      }
      if (slots_[i].hash == h && slots_[i].name == name) return;
    }
  }
  bool Contains(std::string_view name) const {
    const uint64_t h = Hash(name.data(), name.size());
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].hash == 0) return false;
      if (slots_[i].hash == h && slots_[i].name == name) return true;
    }
  }
  bool empty() const { return count_ == 0; }

 private:
  struct Slot {
    uint64_t hash = 0;
    std::string_view name;
  };
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t count_ = 0;
};

}  // namespace

void Engine::FilterNodes(const Job* job, const char* const* nodes, size_t count,
                         uint8_t* out) const {
  NameSet excluded(unhealthy_.size() + (job ? job->avoided_nodes().size() : 0));
  for (const auto& name : unhealthy_) excluded.Insert(name);
  if (job)
    for (const auto& [name, until] : job->avoided_nodes()) excluded.Insert(name);
  for (size_t i = 0; i < count; ++i)
    out[i] = nodes[i] && (excluded.empty() || !excluded.Contains(nodes[i])) ? 1 : 0;
}

}  // namespace regroup
