// SPDX-License-Identifier: Apache-2.0
#include "manager/job_control.h"

#include <algorithm>
#include <csignal>
#include <iterator>
#include <numeric>

#include <nlohmann/json.hpp>

#include "common/text.h"
#include "plugin/wire_facts.h"

namespace regroup::manager {

using nlohmann::json;

namespace {

std::string FaultKindText(v1::FaultKind kind) { return std::string(EngineFaultKind(kind)); }

// How often a running incarnation looks at the stored record besides before every commit (a
// stat of the file; a read only when it changed).
constexpr int64_t kRecordLookMs = 1000;
// How long aborted survivors wait for a directive before the standing decision is carried out
// (JobControl::CheckDecisionWait).
constexpr int64_t kStandingGraceMs = 5000;

std::string Join(const std::vector<int64_t>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? "," : "") + std::to_string(items[i]);
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The embedded engine
// ---------------------------------------------------------------------------------------------

EmbeddedDecisions::EmbeddedDecisions(const JobSpec& spec) : job_id_(spec.id) {
  Status st = engine_.UpsertJob(spec, nullptr, 0);
  (void)st;  // the spec was validated before the job control was built
}

void EmbeddedDecisions::PodRunning(int64_t pod, const std::string& uid, const std::string& node,
                                   int64_t now) {
  (void)engine_.SetPodState(job_id_, pod, uid, REGROUP_POD_RUNNING, node, now);
}

void EmbeddedDecisions::Fault(const v1::FaultFacts& fault, int64_t now) {
  if (auto typed = FaultFromWire(fault, now)) (void)engine_.ReportFault(job_id_, std::move(*typed));
}

void EmbeddedDecisions::FaultsSettled(uint64_t generation, int64_t) {
  (void)engine_.ReportFaultsSettled(job_id_, static_cast<int64_t>(generation));
}

void EmbeddedDecisions::ReplacementRegistered(int64_t pod, const std::string& uid, int64_t now) {
  (void)engine_.ReportReplacementRegistered(job_id_, pod, uid, now);
}

void EmbeddedDecisions::ReportProgress(uint64_t epoch, uint64_t generation, int64_t committed_step,
                                       uint32_t live_ranks, int64_t now) {
  (void)now;
  ManagerProgress status;
  status.epoch = static_cast<int64_t>(epoch);
  status.generation = static_cast<int64_t>(generation);
  status.committed_step = std::max<int64_t>(-1, committed_step);
  status.live_ranks = live_ranks;
  (void)engine_.ReportProgress(job_id_, status);
}

void EmbeddedDecisions::Tick(int64_t now) { engine_.Tick(now); }

std::optional<Directive> EmbeddedDecisions::Poll() {
  const Job* job = engine_.FindJob(job_id_);
  if (!job || job->directive().id == last_directive_) return std::nullopt;
  last_directive_ = job->directive().id;
  return job->directive();
}

// ---------------------------------------------------------------------------------------------
// Registration and messages
// ---------------------------------------------------------------------------------------------

uint32_t HeartbeatIntervalMs(const JobConfig& config, int64_t pods) {
  const int64_t job = config.heartbeat_interval_ms;
  const int64_t budget = (std::max<int64_t>(pods, 1) * 1000 + kBeatBudgetPerSecond - 1) /
                         kBeatBudgetPerSecond;
  const int64_t ceiling =
      config.hang_timeout_min_s * 1000 / (2 * std::max<int64_t>(config.liveness_misses, 1));
  return static_cast<uint32_t>(std::max(job, std::min(budget, ceiling)));
}

JobControl::JobControl(JobSpec spec, JobConfig config, JobControlOptions options,
                       std::unique_ptr<Decisions> decisions)
    : spec_(std::move(spec)),
      config_(config),
      options_(options),
      decisions_(std::move(decisions)),
      layout_(Layout::Of(config_, spec_.pods)),
      heartbeat_interval_ms_(HeartbeatIntervalMs(config_, spec_.pods)),
      log_(options_.event_log),
      pods_(spec_.pods, LivenessMs()),
      reconcile_(log_),
      join_(options_.join_window_ms, log_),
      generations_(spec_.pods, spec_.processes_per_pod, layout_.replica_ranks()) {
  if (options_.record) {
    const JobRecord& before = *options_.record;
    for (const auto& uid : before.lost) Forget(uid);
    join_.OnRecord(before.members);
    if (before.stopped) {
      // The job ended before this incarnation: every pod that registers is told so.
      v1::ManagerMessage m;
      m.mutable_stop()->set_directive_id(++directive_id_);
      m.mutable_stop()->set_mode(static_cast<v1::StopTraining::Mode>(before.stop_mode));
      m.mutable_stop()->set_reason(before.stop_reason);
      stop_ = m;
      state_ = State::kStopped;
      record_.stopped = true;
      record_.stop_mode = before.stop_mode;
      record_.stop_reason = before.stop_reason;
    }
    record_.members = before.members;
    // A job restart was under way: the pods that come back with processes from before it
    // restart them (Register), whichever incarnation decided it.
    if (before.restarting && !before.stopped) {
      job_restarting_ = restart_on_record_ = true;
      record_.restarting = true;
    }
  }
  record_.job_id = spec_.id;
  record_.epoch = options_.epoch;
  log_.Describe(spec_.id, options_.epoch, [this] { return generations_.number(); },
                options_.logger);
}

std::optional<JobRecord> JobControl::TakeRecord() {
  if (!record_changed_ || superseded_) return std::nullopt;
  record_changed_ = false;
  record_.lost = pods_.lost();
  return record_;
}

void JobControl::Superseded(const std::string& why, int64_t now) {
  if (superseded_) return;
  superseded_ = true;
  Event(now, "superseded", why);
  if (state_ != State::kStopped)
    StopAll(v1::StopTraining::MODE_EXIT, "fenced: " + why + "; this incarnation stops", now,
            StopScope::kIncarnation);
}

bool JobControl::StopsCommitting(int64_t now, bool record) {
  if (superseded_) return true;
  if (auto why = decisions_->FencedBy()) {
    Superseded(*why, now);
    return true;
  }
  return record && LookAtRecord(now);
}

bool JobControl::LookAtRecord(int64_t now) {
  if (!options_.stored_record || superseded_) return superseded_;
  record_looked_ms_ = now;
  const std::optional<JobRecord>& stored = options_.stored_record();
  if (auto why = FencedBy(stored, options_.epoch)) {
    Superseded(*why, now);
    return true;
  }
  // The job ended under another incarnation: an older one (a second manager beside this one)
  // finished or stopped it while this one formed no generation (had it formed one, the older
  // would be fenced and could not have written the end). Its pods here are told as it told its
  // own.
  if (stored && stored->stopped && state_ != State::kStopped) {
    Event(now, "ended_on_record",
          "manager epoch " + std::to_string(stored->leader_epoch) + " ended the job: " +
              stored->stop_reason);
    record_.stopped = true;
    record_.stop_mode = stored->stop_mode;
    record_.stop_reason = stored->stop_reason;
    StopAll(static_cast<v1::StopTraining::Mode>(stored->stop_mode), stored->stop_reason, now,
            StopScope::kJobOnRecord);
    return true;
  }
  // Before this incarnation forms a generation, the majority it needs is of the last generation
  // on record as it is now: an older incarnation still running beside it may have formed
  // another since this one started (with fewer pods, or others).
  if (stored && !FormedAGeneration() && !stored->members.empty() &&
      stored->members != join_.members()) {
    Event(now, "record",
          "manager epoch " + std::to_string(stored->leader_epoch) + " formed generation " +
              std::to_string(stored->generation) + " of " +
              std::to_string(stored->members.size()) +
              " pods since: the majority is of those now");
    join_.OnRecord(stored->members);
    record_.members = stored->members;
    if (restart_on_record_ && !stored->restarting) {  // that generation ended the restart
      job_restarting_ = restart_on_record_ = false;
      record_.restarting = false;
    }
  }
  // Another incarnation decided a job restart while this one has formed nothing: the pods here
  // whose processes predate it restart them now, the others when they register.
  if (stored && stored->restarting && !job_restarting_ && !FormedAGeneration() &&
      state_ != State::kStopped) {
    Event(now, "restart_on_record",
          "a job restart is on record: pods whose processes predate it restart them");
    job_restarting_ = restart_on_record_ = true;
    record_.restarting = true;
    commit_.Forget();  // the restart goes back to the checkpoint, as RestartJob
    for (size_t n = 0; n < pods_.size(); ++n)
      RestartIfItPredatesTheJobRestart(static_cast<int64_t>(n));
  }
  return false;
}

void JobControl::Forget(const std::string& uid) {
  if (pods_.Forget(uid)) record_changed_ = true;
}

v1::Header ManagerHeader(const std::string& job_id, uint64_t epoch, uint64_t generation) {
  v1::Header h;
  h.set_job_id(job_id);
  h.set_sender("manager/" + std::to_string(epoch));
  h.set_epoch(epoch);
  h.set_generation(generation);
  return h;
}

v1::Header JobControl::MakeHeader() const {
  return ManagerHeader(spec_.id, options_.epoch, generation());
}

v1::ManagerMessage JobControl::MakeRefusal(const std::string& reason, bool fenced,
                                           bool readmit) const {
  v1::ManagerMessage m;
  *m.mutable_header() = MakeHeader();
  v1::Refusal& r = *m.mutable_refusal();
  r.set_reason(reason);
  r.set_epoch(options_.epoch);
  r.set_generation(generation());
  r.set_directive_id(directive_id_);
  r.set_fenced(fenced);
  r.set_readmit(fenced && readmit);
  return m;
}

void JobControl::Observe(Timing timing, int64_t ms) {
  if (observe_ && ms >= 0) observe_(timing, static_cast<double>(ms) / 1000.0);
}

void JobControl::VoteDecided(int64_t now) {
  if (vote_opened_ms_ >= 0) Observe(Timing::kVoteRoundTrip, now - vote_opened_ms_);
  vote_opened_ms_ = -1;
}

void JobControl::Event(int64_t now, const std::string& kind, const std::string& message,
                       const std::vector<int64_t>& pods) {
  log_.Add(now, kind, message, pods);
}

void JobControl::Send(int64_t pod, v1::ManagerMessage message, bool close) {
  *message.mutable_header() = MakeHeader();
  outgoing_.push_back({pod, std::move(message), close});
}

std::vector<JobControl::Outgoing> JobControl::TakeOutgoing() {
  std::vector<Outgoing> out;
  out.swap(outgoing_);
  return out;
}

bool JobControl::Ready(const std::vector<int64_t>& replicas) const {
  for (int64_t r : replicas)
    if (!ReplicaReady(r)) return false;
  return !replicas.empty();
}

bool JobControl::ReplicaReady(int64_t replica) const {
  const int64_t per_replica = layout_.replica_ranks();
  const int64_t ppp = spec_.processes_per_pod;
  for (int64_t local = 0; local < per_replica; ++local) {
    const int64_t global = replica * per_replica + local;
    if (!pods_.RankReady(global / ppp, static_cast<uint32_t>(global % ppp))) return false;
  }
  return true;
}

StatusOr<int64_t> JobControl::Admissible(const v1::Header& header,
                                         const v1::Register& reg) const {
  if (header.job_id() != spec_.id)
    return NotFound("this manager serves job " + spec_.id + ", not " + header.job_id());
  if (header.epoch() > options_.epoch)
    return FailedPrecondition("fenced: the agent follows manager epoch " +
                              std::to_string(header.epoch()) + ", newer than this manager's " +
                              std::to_string(options_.epoch));
  if (reg.pod_uid().empty() || reg.pod_uid().size() > 256)
    return InvalidArgument("a registration needs a pod uid of 1 to 256 characters");
  if (header.sender() != reg.pod_uid())
    return InvalidArgument("the header's sender " + header.sender() +
                           " is not the registering pod " + reg.pod_uid());
  if (pods_.IsFenced(reg.pod_uid()))
    return FailedPrecondition(
        "pod " + reg.pod_uid() + " was declared lost (a zombie); " +
        (MayReadmit(reg.pod_uid())
             ? "it may come back as its own replacement under a new incarnation of its uid"
             : "its replacement must register with a new pod uid"));
  if (reg.nproc() != spec_.processes_per_pod)
    return InvalidArgument("the agent runs " + std::to_string(reg.nproc()) +
                           " processes but job " + spec_.id + " has " +
                           std::to_string(spec_.processes_per_pod) + " per pod");
  REGROUP_RETURN_IF_ERROR(CheckRanks(reg.ranks(), reg.nproc()));
  int64_t pod = reg.node_rank();
  if (pod < 0) {
    // Assign the first free node rank: never registered, or lost.
    pod = pods_.FreeIndex();
    if (pod < 0) return FailedPrecondition("every node rank of job " + spec_.id + " is taken");
  }
  if (pod >= spec_.pods)
    return InvalidArgument("node rank " + std::to_string(pod) + " is out of range: job " +
                           spec_.id + " has " + std::to_string(spec_.pods) + " pods");
  const Agent& a = pods_[pod];
  // A pod declared lost holds its node rank no longer, even while its fenced stream ends.
  if (a.connected && a.state != AgentState::kLost && a.pod_uid != reg.pod_uid())
    return FailedPrecondition("node rank " + std::to_string(pod) + " is held by pod " +
                              a.pod_uid + "; pod " + reg.pod_uid() + " cannot take it");
  return pod;
}

StatusOr<int64_t> JobControl::Register(uint64_t stream, const v1::Header& header,
                                       const v1::Register& reg, int64_t now) {
  StatusOr<int64_t> admissible = Admissible(header, reg);
  if (!admissible.ok()) return admissible;
  const int64_t pod = *admissible;
  const Agent& a = pods_[pod];
  const bool replacement =
      !a.pod_uid.empty() && a.pod_uid != reg.pod_uid();
  // The same pod on a new stream (a connection reset) before it was declared lost, in the
  // running generation and epoch: it resumes its session, and the generation goes on.
  const bool in_generation = !running().RanksOf(pod).empty();
  const bool resumable = !replacement && a.pod_uid == reg.pod_uid() &&
                         a.state == AgentState::kActive && state_ != State::kJoining &&
                         state_ != State::kStopped && header.epoch() == options_.epoch &&
                         in_generation;
  // ...unless its agent paused its trainers meanwhile (its stream was down longer for it than
  // for this manager): they leave the generation at their next step boundary, and would hold it
  // up for good. The pod is lost to the generation, as if its grace had ended, and comes back as
  // its own replacement.
  if (resumable && reg.left_generation()) {
    LoseSilentPod(pod,
                  "pod " + reg.pod_uid() + " paused its trainers before its session resumed",
                  now);
    return FailedPrecondition("pod " + reg.pod_uid() +
                              " was declared lost: its trainers left generation " +
                              std::to_string(generation()) + " before its session resumed");
  }
  const bool resumed = resumable;
  // A replacement for a pod of the running generation that nothing declared lost yet (its broken
  // stream was within its grace to resume): that pod is lost, and the generation is aborted for
  // it before the replacement counts, so that its peers' failed collectives that follow are the
  // echo of this loss, not a second fault of their own.
  if (replacement && a.state == AgentState::kActive && in_generation &&
      state_ != State::kJoining && state_ != State::kStopped)
    LoseSilentPod(pod,
                  "pod " + reg.pod_uid() + " registered to replace pod " + a.pod_uid +
                      " before its session resumed",
                  now);
  if (replacement && a.state != AgentState::kLost) Forget(a.pod_uid);
  pods_.Admit(pod, stream, reg,
              resumed                     ? AgentState::kActive
              : state_ == State::kJoining ? AgentState::kRegistered
                                          : AgentState::kStandby,
              now);
  join_.Opened(now);
  Registered(pod, resumed, replacement, now);
  return pod;
}

void JobControl::Registered(int64_t pod, bool resumed, bool replacement, int64_t now) {
  const Agent& a = pods_[pod];
  decisions_->PodRunning(pod, a.pod_uid, a.node_name, now);
  // Once the decision maker knows pods lost (a generation ran, or the join window closed with
  // pods missing), a pod that registers anew is the replacement it waits for.
  // During a job restart too: the decision maker resumes once every pod came back (a restarted
  // manager's first pods included, before any generation or join window of its own).
  // A decision maker beside the scheduler may be waiting for replacements that an incarnation
  // still joining knows nothing of (a restart decided for an earlier one, whose directive this
  // one takes as seen): every pod that joins is reported; one the engine does not wait for
  // changes nothing there.
  const bool joining_remote = state_ == State::kJoining && decisions_->ReplacesPods();
  if (!resumed && (replacement || job_restarting_ || joining_remote ||
                   (state_ != State::kJoining && (generation() > 0 || join_.missing_reported()))))
    decisions_->ReplacementRegistered(pod, a.pod_uid, now);
  Event(now, resumed ? "resume" : "register",
        "pod " + a.pod_uid + (resumed ? " resumed its session" : " registered") +
            " as node rank " + std::to_string(pod) +
            (a.node_name.empty() ? "" : " on " + a.node_name) +
            (replacement ? " (a replacement)" : ""),
        {pod});

  v1::ManagerMessage m;
  auto* w = m.mutable_welcome();
  w->set_node_rank(static_cast<uint32_t>(pod));
  w->set_epoch(options_.epoch);
  w->set_generation(generation());
  w->set_heartbeat_interval_ms(heartbeat_interval_ms_);
  w->set_liveness_timeout_ms(static_cast<uint32_t>(LivenessMs()));
  w->set_resumed(resumed);
  Send(pod, std::move(m));
  if (resumed) CatchUp(pod);
  for (uint32_t l : std::vector<uint32_t>(a.failed.begin(), a.failed.end()))
    EarlierProcessDied(pod, a.ranks[l], "died before this manager heard of it", now);
  // A pod that was away when the job restart under way was decided (lost, its stream broken,
  // or never seen by this incarnation) comes back with processes that predate it: they were in
  // a generation, and none formed since. They restart too, so that the job resumes from the
  // checkpoint the restart goes back to, not from the newer state they hold.
  RestartIfItPredatesTheJobRestart(pod);
  // A replacement (a pod readmitted after its loss included) whose processes died or hung while
  // it was away holds nothing the job needs from them: they restart now (or the pod is
  // replaced); else it would wait as a standby with no process, and a directive that counts it
  // in would wait for it until it is declared lost, again and again (simulation seed 4696).
  // During a job restart every pod's do, before any generation too: a process restarted for it
  // that died (generation 0, which RestartIfItPredatesTheJobRestart passes over) restarts again
  // (seed 108960: the join window found the pod missing, and its replacement, registered
  // already, was awaited for good).
  if (!resumed && state_ != State::kStopped &&
      (job_restarting_ || (replacement && FormedAGeneration())))
    SettleFailedPod(pod, "failed or hung while the pod was away", now);
  // A pod that comes after the job stopped (a replacement started late) stops too.
  if (stop_) Send(pod, *stop_);
}

Status JobControl::Handle(uint64_t stream, const v1::AgentMessage& message, int64_t now) {
  const int64_t pod = pods_.PodOf(stream);
  if (pod < 0) return FailedPrecondition("the stream has not registered: send Register first");
  const Agent* agent = &pods_[pod];
  const v1::Header& h = message.header();
  if (h.job_id() != spec_.id)
    return InvalidArgument("the message is for job " + h.job_id() + ", not " + spec_.id);
  if (h.sender() != agent->pod_uid)
    return InvalidArgument("the sender " + h.sender() + " is not this stream's pod " +
                           agent->pod_uid);
  if (h.epoch() != options_.epoch)
    return FailedPrecondition("epoch " + std::to_string(h.epoch()) + " is not this manager's " +
                              std::to_string(options_.epoch));
  pods_.Heard(pod, now);
  switch (message.body_case()) {
    case v1::AgentMessage::kHeartbeat:
      REGROUP_RETURN_IF_ERROR(CheckRanks(message.heartbeat().ranks(), agent->nproc));
      pods_.Heartbeat(pod, message.heartbeat(), now);
      return Status::Ok();
    case v1::AgentMessage::kProcessExit:
      if (message.process_exit().local_rank() >= agent->nproc)
        return InvalidArgument("local rank " + std::to_string(message.process_exit().local_rank()) +
                               " is out of range: the pod runs " + std::to_string(agent->nproc));
      OnProcessExit(pod, message.process_exit(), now);
      return Status::Ok();
    case v1::AgentMessage::kFault:
      return OnFault(pod, message.fault(), now);
    case v1::AgentMessage::kVotes:
      return OnVotes(pod, message.votes(), now);
    case v1::AgentMessage::kLeave:
      OnLeave(pod, message.leave(), now);
      return Status::Ok();
    case v1::AgentMessage::kAck:
      AbortAnswered(pod, message.ack().directive_id(), now);
      return Status::Ok();
    case v1::AgentMessage::kRegister:
      return FailedPrecondition("the stream is already registered");
    default:
      return InvalidArgument("the message has no body");
  }
}

Status JobControl::OnFault(int64_t pod, const v1::FaultReport& f, int64_t now) {
  std::vector<uint32_t> ranks;
  for (uint32_t l : f.local_ranks()) {
    if (l >= pods_[pod].nproc)
      return InvalidArgument("local rank " + std::to_string(l) + " is out of range");
    if (int64_t r = running().RankOf(pod, l); r >= 0) ranks.push_back(static_cast<uint32_t>(r));
  }
  if (state_ != State::kTraining) return Status::Ok();  // already handling a fault
  // A late report of a generation already replaced (its collective failed as it ended) says
  // nothing about the one running now.
  if (f.generation() != 0 && f.generation() < generation()) {
    // (An early one quietly: a rank's peers closing their groups as they left an older
    // generation read to it as peers gone, python/regroup/abort.py's PeerWatch.)
    if (f.early()) return Status::Ok();
    Event(now, "stale_fault",
          "ignored a fault of generation " + std::to_string(f.generation()) + " (now " +
              std::to_string(generation()) + "): " + BoundedText(f.detail(), 256),
          {pod});
    return Status::Ok();
  }
  // Reported the moment the collective failed: a sign of which pod is gone, not yet a fault (the
  // trainer reports the fault after its abort grace if nothing aborts its generation first).
  if (f.early()) {
    if (f.missing_ranks_size() > 0) {
      // Ranks of the generation being formed that have not reached its store (from its host).
      if (f.generation() != generation()) return Status::Ok();  // (a newer one: not ours yet)
      const std::vector<RankPlace>& places = running().places();
      const std::string g = std::to_string(generation());
      if (places.empty() || places[0].pod != pod)
        return InvalidArgument("only the pod of rank 0, the store's host, names the ranks that "
                               "have not reached generation " + g + "'s store");
      for (uint32_t r : f.missing_ranks()) {
        if (r >= places.size())
          return InvalidArgument("missing rank " + std::to_string(r) +
                                 " is out of range: generation " + g + " has " +
                                 std::to_string(places.size()) + " ranks");
        if (places[r].pod != pod) peer_reports_.AddMissing(generation(), places[r].pod, now);
      }
    } else {
      peer_reports_.Add(generation(), pod, PodAtHost(f.peer(), pod), now);
    }
    SettleLostPeers(now);
    return Status::Ok();
  }
  // A collective failed while a pod of the generation has no stream: that pod is gone (its peers
  // lost their connections to it), not merely reconnecting. Declared lost at once, so the
  // decision sees the lost pod, not only a failed collective.
  for (size_t i = 0; i < pods_.size(); ++i) {
    const auto n = static_cast<int64_t>(i);
    if (pods_[n].state == AgentState::kActive && !pods_[n].connected)
      LoseSilentPod(n, "the stream of pod " + pods_[n].pod_uid +
                           " broke and its peers' collectives failed",
                    now);
  }
  // No kind, or one this manager does not know (a newer agent): a failed collective.
  Fault(EngineFaultKind(f.kind()).empty() ? v1::FAULT_KIND_COLLECTIVE_ERROR : f.kind(), {},
        ranks, f.step(), BoundedText(f.detail(), kMaxDetailBytes), now);
  return Status::Ok();
}

void JobControl::OnProcessExit(int64_t pod, const v1::ProcessExit& e, int64_t now) {
  const Agent& a = pods_[pod];
  if (a.failed.count(e.local_rank())) return;  // sent again after a resumed session
  pods_.Died(pod, e.local_rank());
  const v1::LocalRank& r = a.ranks[e.local_rank()];
  if (a.restarting.count(e.local_rank())) return;  // we asked for it
  if (state_ == State::kStopped) return;
  const int64_t rank = running().RankOf(pod, e.local_rank());
  if (e.exit_code() == 0 && e.signal() == 0) {
    Event(now, "rank_done",
          "rank " + std::to_string(rank) + " (pod " + std::to_string(pod) + ") finished", {pod});
    pods_.Exited(pod, e.local_rank(), /*clean=*/true);
    if (EveryHolderFinished()) Finished(now);
    return;
  }
  const std::string why = e.signal() ? "killed by signal " + std::to_string(e.signal())
                                     : "exit code " + std::to_string(e.exit_code());
  pods_.Exited(pod, e.local_rank(), /*clean=*/false);
  if (e.signal() == SIGKILL) killed_[pod] = {now, e.local_rank()};
  // A rank that could not leave its step after an abort (the trainer's watchdog exits it with
  // EXIT_ABORT_STUCK: a collective left it stuck) failed because of the abort, not of its step:
  // its fault names no step, which would otherwise read as the step failing twice (a poison
  // step) beside the fault that caused the abort.
  constexpr int32_t kExitAbortStuck = 75;  // python/regroup/api.py
  const int64_t step = e.signal() == 0 && e.exit_code() == kExitAbortStuck ? -1 : e.step();
  if (rank < 0) {
    const int32_t known =
        reconcile_.KnownRankWhileInterim(pod, e.local_rank());
    if (known >= 0) {
      // Restarted in place while the survivors continued, it died again before it rejoined: the
      // decision maker hears of it (it counts against the recovery budget); the survivors
      // train on.
      Fault(v1::FAULT_KIND_PROCESS_EXIT, {pod}, {}, step,
            "rank " + std::to_string(known) + " (restarted in place, not yet rejoined) " + why,
            now, {static_cast<uint32_t>(known)});
      return;
    }
    if (EarlierProcessDied(pod, r, why, now)) return;
    Event(now, "standby_exit",
          "a standby process of pod " + std::to_string(pod) + " exited (" + why + ")", {pod});
    return;
  }
  const std::string detail = "rank " + std::to_string(rank) + " " + why;
  Fault(v1::FAULT_KIND_PROCESS_EXIT, {pod}, {static_cast<uint32_t>(rank)}, step, detail, now);
  ContinueWithoutFailedRanks(detail, now);
}

Status JobControl::OnVotes(int64_t pod, const v1::Votes& votes, int64_t now) {
  if (votes.generation() != generation())
    return FailedPrecondition("the votes are for generation " +
                              std::to_string(votes.generation()) + "; the current one is " +
                              std::to_string(generation()));
  if (state_ != State::kTraining)
    return FailedPrecondition("the generation was aborted; the step is not voted on");
  StatusOr<StepCommit::Ballot> ballot =
      commit_.Vote(pod, votes, running(), layout_.replica_ranks(), generation());
  if (!ballot.ok()) return ballot.status();
  if (std::make_pair(generation(), votes.step()) != vote_opened_) {
    vote_opened_ = {generation(), votes.step()};
    vote_opened_ms_ = now;
  }
  switch (*ballot) {
    case StepCommit::Ballot::kOpen:
      return Status::Ok();
    case StepCommit::Ballot::kRejected:
    case StepCommit::Ballot::kMismatch:
      Reject(votes.step(), *ballot == StepCommit::Ballot::kMismatch, now);
      return Status::Ok();
    case StepCommit::Ballot::kPassed:
      break;
  }
  // At most one incarnation commits steps: a newer one that formed a generation since (a second
  // manager of the job, standalone) fences this one before its next commit, not at its next
  // write of the record.
  if (StopsCommitting(now, /*record=*/true)) {
    commit_.DropVote();
    return Status::Ok();
  }
  // With a coordinator, a commit needs its lease: cut off from it, this manager may have been
  // replaced without hearing so, and the newer one may commit this very step. The ranks keep
  // their vote until the lease is back (the step is committed then) or the generation is over.
  if (const std::string why = decisions_->WhyNoCommit(); !why.empty()) {
    if (commit_.Hold(votes.step(), generation()))
      Event(now, "wait",
            "step " + std::to_string(votes.step()) +
                " is voted for; it is committed once this manager holds a lease again: " + why);
    return Status::Ok();
  }
  Commit(votes.step(), now);
  return Status::Ok();
}

void JobControl::Reject(int64_t step, bool mismatch, int64_t now) {
  v1::ManagerMessage m;
  auto* o = m.mutable_outcome();
  o->set_generation(generation());
  o->set_step(step);
  o->set_commit(false);
  o->set_checksum_mismatch(mismatch);
  for (int64_t n : running().Pods()) Send(n, m);
  commit_.DropVote();
  VoteDecided(now);
  if (mismatch)
    Fault(v1::FAULT_KIND_CHECKSUM_MISMATCH, {}, {}, step,
          "replicas disagree on their parameters at step " + std::to_string(step), now);
}

void JobControl::CommitHeld(int64_t now) {
  const std::optional<int64_t> held = commit_.Held(state_ == State::kTraining, generation());
  if (!held || !decisions_->WhyNoCommit().empty()) return;
  // As before every commit: a look at the record (a newer incarnation may have formed meanwhile).
  if (StopsCommitting(now, /*record=*/true)) {
    commit_.ReleaseHold();
    commit_.DropVote();
    return;
  }
  const int64_t step = *held;
  commit_.ReleaseHold();
  Event(now, "lease", "the lease holds again: step " + std::to_string(step) + " is committed");
  // The ranks waited for this manager: their time at the step counts from now.
  for (const RankPlace& p : running().places()) pods_.StepClockFrom(p.pod, p.local_rank, now);
  Commit(step, now);
}

void JobControl::Commit(int64_t step, int64_t now) {
  if (commit_.Committed(step, {options_.epoch, generation()}, running(), now))
    counters_.step_seconds = static_cast<double>(commit_.MedianStepMs()) / 1000.0;
  ++counters_.commits;
  counters_.last_commit_ms = now;
  VoteDecided(now);
  v1::ManagerMessage m;
  auto* o = m.mutable_outcome();
  o->set_generation(generation());
  o->set_step(step);
  o->set_commit(true);
  for (int64_t n : running().Pods()) Send(n, m);
  if (abort_ms_ >= 0) {
    counters_.last_recovery_ms = static_cast<double>(now - abort_ms_);
    Observe(Timing::kRecovery, now - abort_ms_);
    Event(now, "resumed",
          "first step committed " + std::to_string(now - abort_ms_) + " ms after the abort");
    abort_ms_ = -1;
  }
  decisions_->ReportProgress(options_.epoch, generation(), commit_.step(), world_size(), now);

  // Work that waits for a step boundary.
  if (!leaving_.empty()) {
    std::vector<int64_t> pods(leaving_.begin(), leaving_.end());
    leaving_.clear();
    Abort("pods " + Join(pods) + " leave at the step boundary (planned departure)", now);
    for (int64_t n : pods) Depart(n, now);
    return;
  }
  // A scale-out, or the return of ranks restarted while the survivors continued, waits for the
  // boundary and for every new rank to have said hello: survivors must not wait in the next
  // generation's rendezvous while new processes still start.
  const std::optional<Directive>& pending = reconcile_.pending();
  if (pending &&
      (pending->kind == REGROUP_DIRECTIVE_SCALE_OUT ||
       pending->kind == REGROUP_DIRECTIVE_RESTART_IN_PLACE) &&
      Ready(pending->keep_replicas)) {
    Directive d = *reconcile_.TakePending();
    Abort(d.kind == REGROUP_DIRECTIVE_SCALE_OUT
              ? "scaling out at the step boundary"
              : "ranks restarted in place rejoin at the step boundary",
          now);
    if (!FormGeneration(std::vector<int64_t>(d.keep_replicas.begin(), d.keep_replicas.end()),
                        d.microbatches, d.reason, now))
      reconcile_.Await(d);
  }
}

// A planned departure now: the pod stops (MODE_LEAVE), its uid is gone for good, and the
// decision maker hears of the lost pod like any other.
void JobControl::Depart(int64_t pod, int64_t now) {
  const Agent& a = pods_[pod];
  v1::ManagerMessage stop;
  stop.mutable_stop()->set_directive_id(++directive_id_);
  stop.mutable_stop()->set_mode(v1::StopTraining::MODE_LEAVE);
  stop.mutable_stop()->set_reason("planned departure: " + a.pod_uid);
  Send(pod, std::move(stop));
  pods_.SetState(pod, AgentState::kLost);
  Forget(a.pod_uid);
  pods_.MustReplace(a.pod_uid);
  v1::FaultFacts f;
  f.set_kind(v1::FAULT_KIND_POD_LOST);
  f.add_pods(static_cast<uint32_t>(pod));
  f.set_step(-1);
  f.set_detail("pod " + a.pod_uid + " left (planned departure)");
  ReportFault(f, now);
}

void JobControl::OnLeave(int64_t pod, const v1::Leave& leave, int64_t now) {
  Event(now, "leave", "pod " + pods_[pod].pod_uid + " asks to leave: " + leave.reason(), {pod});
  if (running().RanksOf(pod).empty() || state_ != State::kTraining) {
    Depart(pod, now);
    return;
  }
  pods_.SetState(pod, AgentState::kLeaving);
  leaving_.insert(pod);
}

void JobControl::Disconnected(uint64_t stream, int64_t now) {
  const std::optional<int64_t> gone = pods_.Disconnect(stream);
  if (!gone) return;
  const int64_t pod = *gone;
  const Agent& a = pods_[pod];
  if (a.state == AgentState::kLost || a.state == AgentState::kDone || state_ == State::kStopped)
    return;
  if (state_ == State::kJoining) {
    Event(now, "disconnect", "pod " + a.pod_uid + " disconnected before the first generation",
          {pod});
    return;
  }
  if (state_ == State::kTraining && a.state == AgentState::kActive) {
    // Unless its peers' collectives with it failed already: its node is gone.
    SettleLostPeers(now);
    if (a.state == AgentState::kLost || state_ == State::kStopped) return;
    // Or one of its trainers was just killed outright: its container, or its node, went down
    // around it (the agent reported the exit before it went too). A heartbeat's time: one
    // stream's blip at that moment costs the pod a replacement, not correctness.
    if (auto k = killed_.find(pod);
        k != killed_.end() && now - k->second.first <= heartbeat_interval_ms_) {
      LoseSilentPod(pod,
                    "the stream of pod " + a.pod_uid + " broke " +
                        std::to_string(now - k->second.first) + " ms after its local rank " +
                        std::to_string(k->second.second) +
                        " was killed (signal 9): the pod died around it",
                    now);
      return;
    }
  }
  if (state_ == State::kTraining && a.state == AgentState::kActive) {
    // A broken stream is not a lost pod: it has its liveness timeout to resume its session
    // (DetectFailures declares it lost after that, as it does a silent one).
    Event(now, "disconnect",
          "the stream of pod " + a.pod_uid + " broke: it has " +
              std::to_string(a.silence.TimeoutMs(LivenessMs(), now) - (now - a.last_seen_ms)) +
              " ms to resume its session",
          {pod});
    return;
  }
  LoseSilentPod(pod, "the stream of pod " + a.pod_uid + " broke (node lost or agent gone)", now);
}

// ---------------------------------------------------------------------------------------------
// Faults and directives
// ---------------------------------------------------------------------------------------------

void JobControl::Fault(v1::FaultKind kind, std::vector<int64_t> pods, std::vector<uint32_t> ranks,
                       int64_t step, const std::string& detail, int64_t now,
                       const std::vector<uint32_t>& known_ranks,
                       const std::vector<uint32_t>& local_ranks) {
  if (pods.empty())
    for (uint32_t r : ranks)
      if (r < running().size()) pods.push_back(running().places()[r].pod);
  std::sort(pods.begin(), pods.end());
  pods.erase(std::unique(pods.begin(), pods.end()), pods.end());
  ++counters_.faults[FaultKindText(kind)];
  Event(now, "fault", FaultKindText(kind) + ": " + detail, pods);
  if (kind == v1::FAULT_KIND_POD_LOST) {
    for (int64_t p : pods) Fence(p, detail);
  }
  // A holder of the trained state finished training: the last step is committed and nothing is
  // left to recover. A fault after it (a rank hung in its last step, a pod that finished and is
  // gone while a recovery waits) ends the training: no recovery may wait for a pod that
  // finished.
  if (HolderFinished() && state_ != State::kStopped) {
    Finished(now);
    return;
  }
  // Only a fault that touches the running generation aborts it: a lost standby or spare, or a
  // replacement that fails before it joins, leaves the generation training.
  bool touches_generation =
      !ranks.empty() || (pods.empty() && known_ranks.empty() && local_ranks.empty());
  if (known_ranks.empty())
    for (int64_t p : pods) touches_generation |= !running().RanksOf(p).empty();
  const bool aborts = state_ == State::kTraining && touches_generation;
  if (aborts) {
    first_fault_ms_ = now;
    Abort(FaultKindText(kind) + ": " + detail, now);
  }
  v1::FaultFacts f;
  f.set_kind(kind);
  for (int64_t p : pods) f.add_pods(static_cast<uint32_t>(p));
  for (uint32_t r : ranks) {
    // An interim generation's rank as the rank it holds in the generation the decision maker
    // knows (every interim rank holds one: the interim is a subset of it).
    const int64_t known = reconcile_.KnownRank(running(), r);
    if (known >= 0) f.add_ranks(static_cast<uint32_t>(known));
  }
  for (uint32_t r : known_ranks) f.add_ranks(r);
  for (uint32_t l : local_ranks) f.add_local_ranks(l);
  f.set_step(step);
  f.set_detail(detail);
  ReportFault(f, now);
  if (aborts) {
    // The report window gathers the other sides of this fault; every other pod's answer to the
    // abort says it has none to add, and the window need not run out (docs/design.md).
    // (Settled at the next Tick at the soonest: never in the middle of this fault's handling.)
    settling_generation_ = abort_->abort().generation();
    unanswered_.clear();
    for (int64_t p : running().Pods())
      if (pods_[p].state != AgentState::kLost) unanswered_.insert(p);
  }
}

bool JobControl::EarlierProcessDied(int64_t pod, const v1::LocalRank& rank,
                                    const std::string& why, int64_t now) {
  // Only before this incarnation's first generation, and only for a process that was in one (it
  // may hold the trained state): the decision maker would otherwise count its rank as a holder
  // of its shard, and resume survivors "with their state" that none of them holds. A job
  // restart under way restarts every process from the checkpoint anyway.
  if (FormedAGeneration() || rank.generation() == 0 ||
      state_ == State::kStopped || job_restarting_ || restart_on_record_)
    return false;
  if (!earlier_deaths_.insert({pod, rank.pid()}).second) return true;
  Fault(v1::FAULT_KIND_PROCESS_EXIT, {pod}, {}, rank.step(),
        "local rank " + std::to_string(rank.local_rank()) + " of pod " + std::to_string(pod) +
            " (in generation " + std::to_string(rank.generation()) + " of an earlier manager) " +
            why,
        now, {}, {rank.local_rank()});
  return true;
}

void JobControl::Fence(int64_t pod, const std::string& reason, bool readmit) {
  const Agent& a = pods_[pod];
  pods_.SetState(pod, AgentState::kLost);
  Forget(a.pod_uid);
  if (!readmit && !a.pod_uid.empty()) pods_.MustReplace(a.pod_uid);
  // Declared lost while its stream is still open (a paused or partitioned agent): tell it at
  // once, so that it stops its trainers or comes back as its own replacement instead of waiting
  // in limbo, and end the stream.
  if (a.connected)
    Send(pod, MakeRefusal("pod " + a.pod_uid + " was declared lost: " + reason, true, readmit),
         true);
}

void JobControl::RestartRanks(int64_t pod, const std::vector<uint32_t>& locals,
                              const std::string& reason) {
  v1::ManagerMessage m;
  m.mutable_restart()->set_directive_id(++directive_id_);
  for (uint32_t l : locals) {
    m.mutable_restart()->add_local_ranks(l);
    commit_.Restarted(pod, l);
  }
  pods_.Restarting(pod, locals);
  m.mutable_restart()->set_reason(reason);
  Send(pod, std::move(m));
}

void JobControl::RestartIfItPredatesTheJobRestart(int64_t pod) {
  const Agent& a = pods_[pod];
  // A process restarted for the job reports no generation (or is not alive yet) until the next
  // one forms; one that reports a generation never got the restart (it went out on a stream
  // that was already broken). One that died since (it failed, and is not restarting) is
  // restarted as well: nothing else starts it before the next generation, and the pod would
  // wait as a standby with no process.
  if (a.pod_uid.empty() || !a.connected || a.state == AgentState::kLost) return;
  const bool predates = std::any_of(a.ranks.begin(), a.ranks.end(), [&](const v1::LocalRank& r) {
    return FromBeforeTheJobRestart(r) && (r.alive() || a.failed.count(r.local_rank()) > 0) &&
           a.restarting.count(r.local_rank()) == 0;
  });
  if (!predates) return;
  if (job_restarting_) {
    RestartForJob(pod, "the job restarts from the newest checkpoint, and this pod's processes "
                       "predate the restart (it was away when it was decided)");
    return;
  }
  RestartForJob(pod, "this pod's processes predate the job restart that generation (" +
                         std::to_string(restart_formed_.first) + ", " +
                         std::to_string(restart_formed_.second) +
                         ") resumed from the newest checkpoint (it was away)");
}

bool JobControl::FromBeforeTheJobRestart(const v1::LocalRank& r) const {
  // A process that heard a commit of a generation the restart left behind predates it too, in no
  // generation though it is: one restarted in place before the restart, that heard the
  // survivors' commits while it waited to rejoin (simulation seed 3776: their step set the
  // restart's first generation's). While no generation formed since the restart, any commit
  // heard is of such a generation; once the restart formed its first, one of an older
  // generation is (its pod was away all along, seed 7765): the highest commit it heard would
  // otherwise set the next generation's step, in a history the job left. (A process restarted
  // for the job heard no commit; one whose commit names no committer is taken as it is.)
  const std::pair<uint64_t, uint64_t> heard{r.heard_commit_epoch(), r.heard_commit_generation()};
  if (job_restarting_) return r.generation() > 0 || heard.second != 0;
  return restart_formed_.second != 0 && heard.second != 0 && heard < restart_formed_;
}

void JobControl::RestartForJob(int64_t pod, const std::string& reason) {
  const Agent& a = pods_[pod];
  std::vector<uint32_t> locals(a.nproc);
  std::iota(locals.begin(), locals.end(), 0u);
  RestartRanks(pod, locals, reason);
}

void JobControl::SettleFailedPods(const Directive& d, int64_t now) {
  // The directive's own restarts first.
  for (auto& [pod, locals] : reconcile_.RanksToRestart(d, pods_))
    if (pods_[pod].connected) RestartRanks(pod, locals, d.reason);
  for (size_t n = 0; n < pods_.size(); ++n)
    SettleFailedPod(static_cast<int64_t>(n), "failed or hung and no directive restarted them",
                    now);
}

void JobControl::SettleFailedPod(int64_t pod, const std::string& what, int64_t now) {
  const Agent& a = pods_[pod];
  std::set<uint32_t> failed = a.failed;
  for (const auto& [local, pid] : a.hung) failed.insert(local);
  if (failed.empty() || !a.connected || a.state == AgentState::kLost) return;
  const std::string ranks = Join(std::vector<int64_t>(failed.begin(), failed.end()));
  // While the job restarts, every process restarts anyway: one that failed (or that a pod
  // readmitted for the restart reported down) is restarted too, never a reason to replace the pod.
  if (config_.allows(Strategy::kRecoverInPlace) || job_restarting_) {
    RestartRanks(pod, {failed.begin(), failed.end()}, "local ranks " + ranks + " " + what);
    return;
  }
  const std::string why = "its local ranks " + ranks + " " + what +
                          ", and recover-in-place is not allowed";
  Event(now, "fence", "pod " + a.pod_uid + " is replaced: " + why, {pod});
  Fence(pod, why, /*readmit=*/false);
}

bool JobControl::ContinueWithoutFailedRanks(const std::string& reason, int64_t now) {
  const std::vector<int64_t> keep = Survivors(reason, now);
  if (keep.empty()) return false;
  // Every dead process must be restartable here: its agent connected and in the job.
  std::vector<int64_t> restart_pods;
  for (size_t n = 0; n < pods_.size(); ++n) {
    const Agent& a = pods_[static_cast<int64_t>(n)];
    if (a.failed.empty()) continue;
    if (!a.usable()) return false;
    restart_pods.push_back(static_cast<int64_t>(n));
  }
  if (restart_pods.empty()) return false;
  std::vector<int64_t> left;
  const std::set<int64_t> kept(keep.begin(), keep.end());  // 65,536 replicas at 8,192 pods of 8
  for (int64_t r : running().replicas())
    if (!kept.count(r)) left.push_back(r);
  std::string restarted;
  for (int64_t n : restart_pods) {
    const Agent& a = pods_[n];
    std::vector<uint32_t> locals(a.failed.begin(), a.failed.end());
    for (uint32_t l : locals) {
      reconcile_.RestartedEarly(n, l);
      restarted += (restarted.empty() ? "" : ", ") +
                   std::to_string(reconcile_.known().RankOf(n, l));
    }
    RestartRanks(n, locals, "recover-in-place at once: " + reason);
  }
  Event(now, "restart_in_place",
        "ranks " + restarted + " restart in place; replicas " + Join(left) +
            " leave until they are back, the other " + std::to_string(keep.size()) +
            " train on (survivors continued)");
  // The generation to come back to is the one the decision maker knows (the running one may
  // already be an interim one).
  Directive rejoin =
      reconcile_.Rejoin("ranks " + restarted + " restarted in place rejoin (" + reason + ")");
  if (!FormGeneration(keep, {}, "survivors continue while ranks " + restarted +
                                    " restart in place (" + reason + ")",
                      now, /*interim=*/true))
    return false;
  reconcile_.Continued(std::move(rejoin), commit_.step());
  return true;
}

std::vector<int64_t> JobControl::Survivors(const std::string& reason, int64_t now) {
  if (!config_.survivors_continue || !config_.recovery_on() ||
      config_.process_recover_mode() != ProcessRecover::kOn ||
      !config_.allows(Strategy::kRecoverInPlace) || state_ != State::kAborted ||
      !decisions_->Available())
    return {};
  // Only over a plain abort or an earlier continuation: a directive in progress keeps its course.
  if (reconcile_.pending() && reconcile_.pending()->kind != REGROUP_DIRECTIVE_RESTART_IN_PLACE)
    return {};
  // A step that failed again before any commit may be poison (a sample that kills whoever trains
  // it): continuing past it would hand it to the next survivor, until no rank holds the committed
  // state. The survivors keep it and wait for the decision maker (its poison-step guard).
  if (reconcile_.ContinuedAfter(commit_.step())) {
    Event(now, "wait",
          "step " + std::to_string(commit_.step() + 1) + " failed again before any commit (" +
              reason + "): the survivors keep their state and wait for the decision maker");
    return {};
  }
  std::vector<int64_t> keep;
  for (int64_t r : running().replicas())
    if (ReplicaReady(r)) keep.push_back(r);
  const auto dp = static_cast<int64_t>(keep.size());
  const int64_t micro_total = MicrobatchesPerStep();
  if (keep.empty() || keep.size() == running().replicas().size() ||
      dp < config_.min_data_parallel ||
      (config_.even_split && micro_total > 0 && micro_total % dp != 0))
    return {};
  // The survivors must hold every shard of the state between them (a rank restarted in place
  // earlier, not yet given the state, holds none): else the decision maker decides.
  if (!PositionsUnheld(keep).empty()) {
    Event(now, "wait",
          "the survivors of " + reason + " do not hold every shard of the state between them: "
          "they wait for the decision maker");
    return {};
  }
  return keep;
}

void JobControl::CheckPendingWait(int64_t now) {
  const bool bounded =
      reconcile_.WaitIsBounded(state_ == State::kTraining) && state_ != State::kStopped;
  std::string reason;
  const std::optional<std::vector<int64_t>> waiting = reconcile_.OverdueWait(
      bounded, state_ == State::kAborted, bounded ? HangTimeoutMs() : 0, layout_, pods_, now,
      &reason);
  if (!waiting) return;
  std::vector<uint32_t> ranks;
  for (int64_t p : *waiting)
    for (uint32_t r : running().RanksOf(p)) ranks.push_back(r);
  Fault(v1::FAULT_KIND_POD_LOST, *waiting, ranks, -1, reason, now);
}

void JobControl::CatchUp(int64_t pod) {
  const Agent& a = pods_[pod];
  if (state_ == State::kAborted) {
    SendAbort(pod);
    return;
  }
  bool behind = false, missed_commit = false;
  for (uint32_t l = 0; l < a.nproc; ++l) {
    if (running().RankOf(pod, l) < 0) continue;
    behind |= a.ranks[l].generation() < generation();
    missed_commit |= a.ranks[l].heard_commit_step() < commit_.step();
  }
  if (behind && generations_.start(pod)) {
    // The generation it was in was aborted and replaced while it was away: the abort first, so
    // that its ranks leave that generation's collectives at once.
    SendAbort(pod);
    Send(pod, *generations_.start(pod));
  }
  if (missed_commit && commit_.step() >= 0) {
    v1::ManagerMessage m;
    auto* o = m.mutable_outcome();
    // Stamped with the generation that committed it, which the agent notes as the committer
    // (a restarted manager's first plan names it); 0, "not known", when an older incarnation
    // did. Not the running generation: that one may not have committed it (a pod readmitted as
    // the next generation formed).
    o->set_generation(commit_.mark().first == options_.epoch ? commit_.mark().second : 0);
    o->set_step(commit_.step());
    o->set_commit(true);
    Send(pod, std::move(m));
  }
}

void JobControl::AbortAnswered(int64_t pod, uint64_t directive_id, int64_t now) {
  if (settling_generation_ == 0 || !abort_ || directive_id != abort_->abort().directive_id())
    return;
  unanswered_.erase(pod);
  // The last answer: the decision is taken now, not at the next tick. (Lost pods leave the set
  // at a tick: no scan of it here, per answer.)
  if (unanswered_.empty() && SettleFaults(now)) {
    decisions_->Tick(now);
    TakeDecisions(now);
  }
}

bool JobControl::SettleFaults(int64_t now) {
  if (settling_generation_ == 0) return false;
  std::erase_if(unanswered_, [&](int64_t p) { return pods_[p].state == AgentState::kLost; });
  if (!unanswered_.empty()) return false;
  decisions_->FaultsSettled(settling_generation_, now);
  settling_generation_ = 0;
  return true;
}

void JobControl::SendAbort(int64_t pod) {
  if (!abort_) return;
  Send(pod, *abort_);
  pods_.AbortedThrough(pod, abort_->abort().generation());
}

void JobControl::Abort(const std::string& reason, int64_t now) {
  if (state_ != State::kTraining) return;
  state_ = State::kAborted;
  abort_ms_ = now;
  settling_generation_ = 0;  // answers to an earlier abort settle nothing now
  unanswered_.clear();
  commit_.DropVote();
  v1::ManagerMessage m;
  auto* a = m.mutable_abort();
  a->set_directive_id(++directive_id_);
  a->set_epoch(options_.epoch);
  a->set_generation(generation());
  a->set_committed_step(commit_.step());
  a->set_reason(reason);
  for (int64_t n : running().Pods()) {
    if (!pods_[static_cast<int64_t>(n)].connected) continue;
    Send(n, m);
    pods_.AbortedThrough(n, generation());
  }
  abort_ = m;
  Event(now, "abort", "generation " + std::to_string(generation()) + " aborted: " + reason);
}

bool JobControl::HoldsCommittedState(int64_t pod, uint32_t local) const {
  const Agent& a = pods_[pod];
  return commit_.Holds(pod, local, a, running(),
                       generations_.Had(pod, a.pod_uid),
                       {options_.epoch, generation()});
}

std::vector<int64_t> JobControl::PositionsUnheld(const std::vector<int64_t>& replicas) const {
  std::vector<int64_t> out;
  if (commit_.step() < 0) return out;  // before the first commit there is no state to hold
  const int64_t size = layout_.replica_ranks();
  const int64_t ppp = spec_.processes_per_pod;
  for (int64_t position = 0; position < size; ++position) {
    bool held = false;
    for (int64_t r : replicas) {
      const int64_t global = r * size + position;
      held = held || HoldsCommittedState(global / ppp, static_cast<uint32_t>(global % ppp));
    }
    if (!held) out.push_back(position);
  }
  return out;
}

void JobControl::ReportFault(const v1::FaultFacts& fault, int64_t now) {
  // Before this incarnation formed a generation, its decision maker (a restarted manager's is
  // new) hears first what the pods back have committed: it takes a job that has not committed
  // anything for one that need not keep any state, and would resume "with the survivors'
  // state" a shard only a lost pod held.
  if (!FormedAGeneration())
    decisions_->ReportProgress(options_.epoch, generation(),
                               commit_.HighestHeard(pods_, /*finish_votes=*/true,
                                                    layout_.replica_ranks()),
                               0, now);
  decisions_->Fault(fault, now);
}

bool JobControl::FormGeneration(const std::vector<int64_t>& replicas,
                                const std::vector<int64_t>& micro, const std::string& reason,
                                int64_t now, bool interim) {
  if (!MayForm(replicas, now)) return false;
  // A generation still training is over: its ranks hear so before the next one starts (a rank
  // still in its rendezvous waits there until its collective timeout otherwise).
  Abort("superseded by the next generation: " + reason, now);
  // The step to resume from: the highest any survivor committed, or heard commit for, kept or
  // not (a standby that heard the commit of step s proves s committed; the kept ranks voted for
  // it in the generation that committed it, and apply it from their vote).
  // committed by a generation this incarnation did not run; before this incarnation's first
  // generation, a vote the one before it did not decide, finished here when every rank of the
  // generation it was cast in voted for the step, none heard the outcome, and each could commit.
  // A job restart resumes from what its restarted processes loaded, whatever a process from
  // before it reports (seed 103039: a second incarnation took on a restart on record and formed
  // after the step a dead process of a pod that had dropped reported, which nobody held).
  const bool restarting = job_restarting_ || restart_on_record_;
  const bool finished_vote = commit_.CatchUp(
      pods_, /*finish_votes=*/!FormedAGeneration() && !restarting, layout_.replica_ranks(),
      [this](const v1::LocalRank& r) { return !FromBeforeTheJobRestart(r); });
  if (finished_vote)
    Event(now, "commit",
          "step " + std::to_string(commit_.step()) + " is committed: every rank of generation (" +
              std::to_string(commit_.mark().first) + ", " +
              std::to_string(commit_.mark().second) +
              ") voted for it, and the manager that ran it stopped before the outcome");
  if (!StateHeld(replicas, now)) return false;
  // Who holds the committed state (HoldsCommittedState), as of the generation that committed it.
  std::set<std::pair<int64_t, uint32_t>> holders;
  for (size_t n = 0; n < pods_.size(); ++n)
    for (uint32_t l = 0; l < pods_[static_cast<int64_t>(n)].ranks.size(); ++l)
      if (HoldsCommittedState(static_cast<int64_t>(n), l)) holders.insert({n, l});
  generations_.Next(replicas, micro, MicrobatchesPerStep(), pods_,
                    [&](int64_t pod, uint32_t local) { return holders.count({pod, local}) > 0; });
  ++counters_.generations;
  if (restarting) restart_formed_ = {options_.epoch, generation()};
  job_restarting_ = restart_on_record_ = false;
  given_up_.clear();
  earlier_deaths_.clear();
  state_lost_step_ = -2;
  RecordGeneration();
  // No state-sync plan here: the ranks of the new generation choose who sends the state to whom
  // from a census over their new group (python/regroup/sync.py); only they know what they hold
  // once their votes are settled. The plan names the step they resume after.
  SendStarts(Plan(reason), now);
  state_ = State::kTraining;
  commit_.NewGeneration();
  reconcile_.Formed(running(), interim);
  Event(now, "generation",
        "generation (" + std::to_string(options_.epoch) + ", " + std::to_string(generation()) +
            "): " + std::to_string(running().size()) + " ranks, dp " +
            std::to_string(replicas.size()) + ", resuming after step " +
            std::to_string(commit_.step()) + "; " + reason);
  decisions_->ReportProgress(options_.epoch, generation(), commit_.step(), world_size(), now);
  return true;
}

bool JobControl::MayForm(const std::vector<int64_t>& replicas, int64_t now) {
  if (replicas.empty()) {
    Event(now, "wait", "generation not formed: no replica to form it from");
    return false;
  }
  // What the record says now decides too (a second incarnation may just have put a job restart
  // on record): fenced, it forms nothing; a job restart on record restarts first the pods whose
  // processes predate it.
  if (StopsCommitting(now, /*record=*/true)) return false;
  for (int64_t r : replicas)
    if (!ReplicaReady(r)) {
      std::vector<int64_t> pods = layout_.PodsOfReplica(r);
      Event(now, "wait",
            "generation not formed: replica " + std::to_string(r) + " (pods " + Join(pods) +
                ") is not available yet",
            pods);
      return false;
    }
  return true;
}

bool JobControl::StateHeld(const std::vector<int64_t>& replicas, int64_t now) {
  // A job restart resumes from the checkpoint anyway.
  if (job_restarting_ || restart_on_record_) return true;
  const auto unheld = PositionsUnheld(replicas);
  if (unheld.empty()) return true;
  // Only a checkpoint has it (the trainers' census would fail: python/regroup/sync.py): the
  // decision maker hears so, once a step, and nothing is formed.
  if (state_lost_step_ != commit_.step()) {
    state_lost_step_ = commit_.step();
    const std::string why = "no rank of the next generation holds the state of step " +
                            std::to_string(commit_.step()) + " at replica position" +
                            (unheld.size() > 1 ? "s " : " ") + Join(unheld);
    Event(now, "wait", "generation not formed: " + why);
    Fault(v1::FAULT_KIND_STATE_LOST, {}, {}, -1, why, now);
  }
  return false;
}

int64_t JobControl::MicrobatchesPerStep() const {
  return config_.global_batch_size > 0 ? config_.global_batch_size / config_.micro_batch_size
                                       : 0;
}

void JobControl::RecordGeneration() {
  record_.leader_epoch = options_.epoch;
  record_.generation = generation();
  record_.restarting = false;
  record_.members.clear();
  for (int64_t n : running().Pods()) record_.members.push_back({n, pods_[n].pod_uid});
  record_changed_ = true;
  join_.Formed();  // this generation is the one on record now
}

v1::GenerationPlan JobControl::Plan(const std::string& reason) {
  const int64_t host = running().places()[0].pod;  // of the store
  v1::GenerationPlan plan;
  plan.set_epoch(options_.epoch);
  plan.set_generation(generation());
  plan.set_world_size(static_cast<uint32_t>(running().size()));
  plan.set_tensor_parallel(static_cast<uint32_t>(config_.tensor_parallel));
  plan.set_pipeline_parallel(static_cast<uint32_t>(config_.pipeline_parallel));
  plan.set_data_parallel(static_cast<uint32_t>(running().replicas().size()));
  plan.set_store_host(pods_[host].host);
  plan.set_store_port(pods_.TakeStorePort(host, generation()));
  plan.set_committed_step(commit_.step());
  plan.set_committed_epoch(commit_.mark().first);
  plan.set_committed_generation(commit_.mark().second);
  plan.set_microbatches_per_step(static_cast<uint64_t>(MicrobatchesPerStep()));
  plan.set_reason(reason);
  plan.set_agents(static_cast<uint32_t>(running().Pods().size()));
  return plan;
}

void JobControl::SendStarts(const v1::GenerationPlan& plan, int64_t now) {
  const std::set<int64_t> training = running().Pods();
  const uint64_t id = ++directive_id_;
  for (size_t i = 0; i < pods_.size(); ++i) {
    const auto n = static_cast<int64_t>(i);
    const Agent& a = pods_[n];
    // Every pod that trains or stands by, including one whose process restarts in place (its
    // other ranks train, or wait for the rejoin as standbys).
    if (!pods_.Ready(n) && !training.count(n) && !(a.usable() && !a.restarting.empty()))
      continue;
    // A pod whose ranks may still be in an earlier generation (it was away when that one's
    // abort went out, or it is back under a new uid) hears the abort first: its ranks leave
    // that generation's rendezvous or collectives now, not at their timeout.
    uint64_t in = 0;
    for (const auto& lr : a.ranks)
      if (lr.alive()) in = std::max(in, lr.generation());
    if (in > a.aborted_through && in < generation()) SendAbort(n);
    v1::ManagerMessage m = generations_.Start(n, plan, id);
    pods_.SetState(n, training.count(n) ? AgentState::kActive : AgentState::kStandby);
    pods_.StepClockFrom(n, now);
    Send(n, std::move(m));
  }
}

void JobControl::StopAll(v1::StopTraining::Mode mode, const std::string& reason, int64_t now,
                         StopScope scope) {
  v1::ManagerMessage m;
  m.mutable_stop()->set_directive_id(++directive_id_);
  m.mutable_stop()->set_mode(mode);
  m.mutable_stop()->set_reason(reason);
  m.mutable_stop()->set_incarnation_only(scope == StopScope::kIncarnation);
  for (size_t n = 0; n < pods_.size(); ++n)
    if (pods_[static_cast<int64_t>(n)].connected) Send(static_cast<int64_t>(n), m);
  stop_ = m;
  state_ = State::kStopped;
  if (scope == StopScope::kJob) {
    record_.stopped = true;
    record_.stop_mode = mode;
    record_.stop_reason = reason;
    record_changed_ = true;
  }
  Event(now, "stop", reason);
}

void JobControl::Apply(const Directive& d, int64_t now) {
  ++counters_.directives[std::string(DirectiveKindName(d.kind))];
  Event(now, "directive", std::string(DirectiveKindName(d.kind)) +
                              (d.strategy.empty() ? "" : " [" + d.strategy + "]") + ": " +
                              d.reason);
  std::vector<int64_t> keep(d.keep_replicas.begin(), d.keep_replicas.end());
  // A rescheduling's resume can arrive in place of its restart_job: when the restart gives up
  // no pod (pod level, after a process fault) the decision maker resumes in the same tick, and
  // only its newest directive is delivered. Every process still restarts first.
  if (d.kind == REGROUP_DIRECTIVE_RESUME && IsRescheduling(d.strategy) && !job_restarting_) {
    Directive restart = d;
    restart.kind = REGROUP_DIRECTIVE_RESTART_JOB;
    RestartJob(restart, now);
  }
  reconcile_.Decided(d.kind);
  if (d.kind != REGROUP_DIRECTIVE_RESTART_IN_PLACE && d.kind != REGROUP_DIRECTIVE_DUMP &&
      d.kind != REGROUP_DIRECTIVE_EXIT && d.kind != REGROUP_DIRECTIVE_RESTART_JOB)
    SettleFailedPods(d, now);
  switch (d.kind) {
    case REGROUP_DIRECTIVE_CONTINUE:
    case REGROUP_DIRECTIVE_WAIT:
      return;  // survivors stay paused (aborted) until the next directive
    case REGROUP_DIRECTIVE_RETRY:
      Retry(d, now);
      return;
    case REGROUP_DIRECTIVE_RESTART_IN_PLACE:
      RestartInPlace(d, now);
      return;
    case REGROUP_DIRECTIVE_SCALE_OUT:
      if (state_ == State::kTraining) {
        reconcile_.Await(d);  // at the next step boundary
        return;
      }
      [[fallthrough]];
    case REGROUP_DIRECTIVE_RESUME:
    case REGROUP_DIRECTIVE_SCALE_IN:
      if (!FormGeneration(keep, d.microbatches, d.reason, now)) reconcile_.Await(d);
      return;
    case REGROUP_DIRECTIVE_DUMP:
      StopAll(v1::StopTraining::MODE_DUMP, d.reason, now);
      return;
    case REGROUP_DIRECTIVE_EXIT:
      StopAll(v1::StopTraining::MODE_EXIT, d.reason, now);
      return;
    case REGROUP_DIRECTIVE_RESTART_JOB:
      RestartJob(d, now);
      return;
  }
}

void JobControl::Retry(const Directive& d, int64_t now) {
  // A generation formed since the fault (its abort let a pending rejoin form one) already does
  // the step again: another would cost a regroup and retry nothing more.
  if (state_ == State::kTraining) {
    Event(now, "retry", "generation " + std::to_string(generation()) +
                            ", formed since the fault, does the step again");
    return;
  }
  // An interim generation is retried as it was, and its restarted ranks still rejoin.
  const bool interim = reconcile_.interim();
  const std::vector<int64_t> replicas = running().replicas();
  FormGeneration(replicas, generations_.microbatches(), d.reason, now, interim);
  if (interim) reconcile_.Await(reconcile_.Rejoin("ranks restarted in place rejoin"));
}

void JobControl::RestartInPlace(const Directive& d, int64_t now) {
  // Ranks the manager restarted at once (the survivors continued) are not restarted again.
  auto restart = reconcile_.RanksToRestart(d, pods_, /*skip_restarted_early=*/true);
  if (state_ == State::kTraining) KeepTheRunningGenerationsRanks(restart, now);
  if (!FormedAGeneration()) {
    BeforeTheFirstGeneration(d, now);
    return;
  }
  for (auto& [pod, locals] : restart) RestartRanks(pod, locals, d.reason);
  // Wait for them (at a step boundary while training), unless they were all restarted at once
  // and have rejoined already.
  if (!restart.empty() || reconcile_.interim() || state_ != State::kTraining)
    reconcile_.AwaitKeeping(d, reconcile_.known().replicas());
}

// A generation formed since the fault (its abort let a pending scale-out or rejoin form one)
// and trains with these ranks: they are not restarted under it (its rejoin would wait for them).
void JobControl::KeepTheRunningGenerationsRanks(
    std::map<int64_t, std::vector<uint32_t>>& restart, int64_t now) {
  std::vector<int64_t> kept;
  for (auto it = restart.begin(); it != restart.end();) {
    std::erase_if(it->second, [&](uint32_t l) {
      if (running().RankOf(it->first, l) < 0) return false;
      kept.push_back(running().RankOf(it->first, l));
      return true;
    });
    it = it->second.empty() ? restart.erase(it) : std::next(it);
  }
  if (!kept.empty())
    Event(now, "restart_in_place",
          "ranks [" + Join(kept) + "] train in generation " + std::to_string(generation()) +
              ", formed since the fault: not restarted for it");
}

// The ranks a restart in place names are of a generation this incarnation never ran (an earlier
// manager's; it formed none yet): their places are not its to map. It restarts the processes of
// its pods that died (whose deaths it reported as an earlier generation's), and its first
// generation starts every rank: the join's own if every pod is back first, else the one this
// decision keeps, formed once they are back (bounded wait), as a scale-in or resume decided while
// joining is. (Waiting for a "rejoin" of replicas it never had would hang it; so would dropping
// the decision while joining: a join window that then closes with a pod missing that the
// decision already left out reports a loss that changes nothing, and no decision follows.)
void JobControl::BeforeTheFirstGeneration(const Directive& d, int64_t now) {
  std::string what;  // "pod 1 local ranks [1], ..."
  for (size_t n = 0; n < pods_.size(); ++n) {
    const Agent& a = pods_[static_cast<int64_t>(n)];
    if (!a.usable()) continue;
    std::vector<uint32_t> dead;
    for (uint32_t l = 0; l < a.ranks.size(); ++l)
      if (!a.ranks[l].alive() && !a.restarting.count(l) && !a.finished.count(l)) dead.push_back(l);
    if (dead.empty()) continue;
    RestartRanks(static_cast<int64_t>(n), dead, d.reason);
    what += (what.empty() ? "pod " : ", pod ") + std::to_string(n) + " local ranks [" +
            Join(std::vector<int64_t>(dead.begin(), dead.end())) + "]";
  }
  Event(now, "restart_in_place",
        "ranks [" + Join(d.restart_ranks) +
            "] are of a generation this incarnation never ran: it restarts " +
            (what.empty() ? std::string("no process of its pods") : what) +
            ", and its first generation starts every rank");
  reconcile_.Await(d);  // formed over the replicas it keeps once they are back (bounded wait)
}

bool JobControl::IsRescheduling(const std::string& strategy) {
  return strategy == "job-rescheduling" || strategy == "pod-rescheduling";
}

void JobControl::RestartJob(const Directive& d, int64_t now) {
  Abort(d.reason, now);
  reconcile_.JobRestarts();
  job_restarting_ = true;
  restart_on_record_ = false;
  record_.restarting = true;
  record_changed_ = true;
  const bool every_pod = d.strategy != "pod-rescheduling";
  commit_.Forget();
  std::vector<std::string> restarted;
  for (size_t n = 0; n < pods_.size(); ++n) {
    const Agent& a = pods_[static_cast<int64_t>(n)];
    if (!a.usable()) continue;
    RestartForJob(static_cast<int64_t>(n), d.reason);
    restarted.push_back(a.pod_uid);
    // The decision maker resumes the job once every pod is back: a pod that registered with
    // this incarnation before the restart was decided (a restarted manager's first pods, while
    // it joined) is back, and may be the replacement it waits for.
    decisions_->ReplacementRegistered(static_cast<int64_t>(n), a.pod_uid, now);
    // Job level, every pod is given up. Standalone nobody recreates them: each comes back as
    // its own replacement, a new incarnation, as a pod readmitted after its loss does. (Pod
    // level, a healthy pod stays itself.)
    if (every_pod && !decisions_->ReplacesPods())
      Fence(static_cast<int64_t>(n), "the job restarts: " + d.reason, /*readmit=*/true);
  }
  // Job level with a scheduler, every pod is given up and recreated: the old incarnations'
  // ends (evicted, or replaced before their broken streams resumed) are this restart, no fault.
  given_up_.clear();
  if (every_pod && decisions_->ReplacesPods())
    for (const Agent& a : pods_.all())
      if (!a.pod_uid.empty()) given_up_.insert(a.pod_uid);
  Event(now, d.strategy == "pod-rescheduling" ? "pod_rescheduling" : "job_rescheduling",
        "every process restarts from the newest checkpoint: " +
            std::to_string(restarted.size()) + " pods restart theirs now" +
            (decisions_->ReplacesPods() ? "; the scheduler replaces the pods given up"
             : every_pod ? " and come back as their own replacements; lost ones wait for theirs"
                         : "; lost ones wait for their replacements"));
}

// ---------------------------------------------------------------------------------------------
// Time
// ---------------------------------------------------------------------------------------------

int64_t JobControl::HangTimeoutMs() const {
  return std::max(config_.hang_timeout_min_s * 1000,
                  config_.hang_step_factor * commit_.MedianStepMs());
}

int64_t JobControl::StallBoundMs() const {
  return std::min(HangTimeoutMs(), std::max<int64_t>(1000, 2 * commit_.MedianStepMs()));
}

std::optional<Pods::Finding> JobControl::FirstStalled(int64_t now) const {
  if (commit_.holding() || commit_.MedianStepMs() <= 0) return std::nullopt;
  const int64_t bound = StallBoundMs();
  const std::vector<RankPlace>& places = running().places();
  const auto phase_order = [](v1::Phase p) {
    return p == v1::PHASE_REDUCING ? 1 : p == v1::PHASE_VOTED || p == v1::PHASE_APPLYING ? 2 : 0;
  };
  for (size_t g = 0; g < places.size(); ++g) {
    const Agent& a = pods_[places[g].pod];
    const uint32_t l = places[g].local_rank;
    if (l >= a.ranks.size() || l >= a.step_since_ms.size()) continue;
    const v1::LocalRank& lr = a.ranks[l];
    if (!lr.alive() || !lr.has_cpu_idle_ms() ||
        (lr.phase() != v1::PHASE_COMPUTING && lr.phase() != v1::PHASE_REDUCING))
      continue;
    if (now - a.step_since_ms[l] <= bound || lr.cpu_idle_ms() < bound) continue;
    const bool silent = lr.beat_age_ms() >= bound;
    bool behind = false, peers_beat = true;
    for (size_t o = 0; o < places.size(); ++o) {
      if (o == g) continue;
      const Agent& b = pods_[places[o].pod];
      if (places[o].local_rank >= b.ranks.size()) continue;
      const v1::LocalRank& other = b.ranks[places[o].local_rank];
      if (!other.alive()) continue;
      behind |= other.step() > lr.step() ||
                (other.step() == lr.step() && phase_order(other.phase()) > phase_order(lr.phase()));
      peers_beat &= other.beat_age_ms() < bound;
    }
    if (!behind && !(silent && peers_beat)) continue;
    return Pods::Finding{
        static_cast<int64_t>(g), lr.step(),
        "rank " + std::to_string(g) + " stopped making progress: at step " +
            std::to_string(lr.step()) + " for " + std::to_string(now - a.step_since_ms[l]) +
            " ms, its process idle for " + std::to_string(lr.cpu_idle_ms()) + " ms, " +
            (behind ? "its peers waiting for it" : "silent while its peers beat") +
            " (bound " + std::to_string(bound) + " ms: max(1 s, 2 x the median step))",
        a.step_since_ms[l]};
  }
  return std::nullopt;
}

// A rank holds the trained state once the generation committed a step, or if it joined holding
// it; one that joined without it (a replica rejoining at the last step's boundary) has nobody
// left to send it, so training is over once every holder finished.
bool JobControl::HolderFinished() const {
  const bool committed_here = commit_.mark() == std::make_pair(options_.epoch, generation());
  const std::vector<RankPlace>& places = running().places();
  return std::any_of(places.begin(), places.end(), [&](const RankPlace& p) {
    const Agent& a = pods_[p.pod];
    return (committed_here || !p.needs_state) && !a.ranks[p.local_rank].alive() &&
           a.finished.count(p.local_rank);
  });
}

bool JobControl::EveryHolderFinished(int64_t gone_pod) const {
  const bool committed_here = commit_.mark() == std::make_pair(options_.epoch, generation());
  const std::vector<RankPlace>& places = running().places();
  return HolderFinished() && std::none_of(places.begin(), places.end(), [&](const RankPlace& p) {
           const Agent& a = pods_[p.pod];
           return (committed_here || !p.needs_state) && a.ranks[p.local_rank].alive() &&
                  p.pod != gone_pod;
         });
}

void JobControl::Finished(int64_t now) {
  finished_ = true;
  // Tell every agent, so each exits at once instead of waiting for an acknowledgement.
  StopAll(v1::StopTraining::MODE_LEAVE,
          "training finished at step " + std::to_string(commit_.step()), now);
  Event(now, "done", "training finished at step " + std::to_string(commit_.step()));
}

void JobControl::LoseSilentPod(int64_t pod, const std::string& why, int64_t now) {
  const std::string& uid = pods_[pod].pod_uid;
  if (given_up_.count(uid)) {
    // The decision maker gave this incarnation up for the job's restart (the scheduler replaces
    // it): its end is no news, and reported it would read as the loss of its replacement.
    Event(now, "fence", "pod " + uid + ", given up for the job's restart, is gone: " + why,
          {pod});
    Fence(pod, why);
    return;
  }
  // Neither a pod whose ranks all finished training nor one lost once every other holder of the
  // trained state finished (cut off during the last step, say) is a fault to recover from: the
  // first leaves nothing undone, the second ends the training.
  if (state_ == State::kTraining) {
    const Agent& a = pods_[pod];
    bool ranks_finished = !running().RanksOf(pod).empty();
    for (uint32_t l = 0; l < a.nproc; ++l)
      ranks_finished = ranks_finished && (running().RankOf(pod, l) < 0 || a.finished.count(l) > 0);
    const bool over = EveryHolderFinished(pod);
    if (ranks_finished || over) {
      Event(now, "fence",
            "pod " + uid + (over ? " is gone as training finished: " : ", whose ranks finished "
                                                                       "training, is gone: ") +
                why,
            {pod});
      Fence(pod, why);
      if (over) Finished(now);
      return;
    }
  }
  Observe(Timing::kFaultDetection, now - pods_[pod].last_seen_ms);
  Fault(v1::FAULT_KIND_POD_LOST, {pod}, running().RanksOf(pod), -1, why, now);
}

int64_t JobControl::PodAtHost(const std::string& host, int64_t reporter) const {
  if (host.empty()) return -1;
  int64_t found = -1;
  for (size_t i = 0; i < pods_.size(); ++i) {
    const auto n = static_cast<int64_t>(i);
    if (n == reporter || pods_[n].host != host || running().RanksOf(n).empty()) continue;
    if (found >= 0) return -1;  // two pods share the address: it names neither
    found = n;
  }
  return found;
}

void JobControl::SettleLostPeers(int64_t now) {
  if (state_ != State::kTraining) return;
  const int64_t window = LivenessMs();
  // Only a pod a report named can be settled here, or, after a report that named none, a pod
  // whose stream broke: with no report (every tick of a healthy job), nothing to walk.
  const std::set<int64_t> named = peer_reports_.Named(generation());
  const bool unnamed = peer_reports_.Unnamed(generation(), window, now);
  const std::set<int64_t> missing = peer_reports_.Missing(generation(), now);
  if (named.empty() && !unnamed && missing.empty()) return;
  for (size_t i = 0; i < pods_.size() && state_ == State::kTraining; ++i) {
    const auto n = static_cast<int64_t>(i);
    const Agent& a = pods_[n];
    // Named by a survivor's failed collective (or, with its stream broken, by an unnamed one).
    const bool reported = named.count(n) || (unnamed && !a.connected);
    if (!reported && !missing.count(n)) continue;
    if (a.state != AgentState::kActive || running().RanksOf(n).empty()) continue;
    const int64_t silent = now - a.last_seen_ms;
    const int64_t two_beats = 2 * static_cast<int64_t>(heartbeat_interval_ms_);
    if (!a.connected && missing.count(n) && silent >= two_beats) {
      LoseSilentPod(n,
                    "the stream of pod " + a.pod_uid + " broke, it sent nothing for " +
                        std::to_string(silent) +
                        " ms, and its ranks have not reached the store of generation " +
                        std::to_string(generation()) + ", where the others wait for them",
                    now);
      continue;
    }
    if (!reported) continue;
    // Only the word of pods that train beside it, and are heard from themselves, counts.
    std::set<int64_t> by = peer_reports_.Reporters(generation(), n, window, now);
    for (auto it = by.begin(); it != by.end();)
      it = pods_[*it].usable() && !running().RanksOf(*it).empty() ? std::next(it) : by.erase(it);
    std::string names;
    for (int64_t r : by) names += (names.empty() ? "" : ", ") + pods_[r].pod_uid;
    if (!a.connected && (!by.empty() || peer_reports_.Unnamed(generation(), window, now))) {
      LoseSilentPod(n,
                    "the stream of pod " + a.pod_uid + " broke and " +
                        (by.empty() ? std::string("a survivor's collective failed")
                                    : "the collectives of pod " + names + " with it failed"),
                    now);
      continue;
    }
    if (a.connected && by.size() >= PeerReports::kQuorum && silent >= two_beats)
      LoseSilentPod(n,
                    "the collectives of pods " + names + " with pod " + a.pod_uid +
                        " failed and it sent nothing for " + std::to_string(silent) + " ms",
                    now);
  }
}

void JobControl::DetectFailures(int64_t now) {
  SettleLostPeers(now);
  // Silent pods, while training and while a recovery waits, the first generation's included (a
  // pod that dies then must not hold its node rank against its replacement until TCP gives up).
  if (auto silent = pods_.FirstSilent(now)) {
    LoseSilentPod(silent->index, silent->why, now);
    return;
  }
  if (state_ != State::kTraining) return;
  auto found = pods_.FirstHang(running(), generation(), HangTimeoutMs(), commit_.holding(), now);
  if (!found) found = FirstStalled(now);
  if (!found) return;
  if (found->since_ms >= 0) Observe(Timing::kFaultDetection, now - found->since_ms);
  Fault(v1::FAULT_KIND_HANG, {}, {static_cast<uint32_t>(found->index)}, found->step, found->why,
        now);
}

// After a manager restart, only a majority of the last generation may form a new one
// (JoinWindow). A majority that does not come back within the join window and the decision wait
// ends this incarnation the way an unreachable decision maker does (dump if allowed, else exit).
bool JobControl::MajorityBack(int64_t now) {
  const std::optional<std::string> missing = join_.MajorityMissing(pods_, now);
  if (!missing) return true;
  const int64_t give_up =
      join_.started_ms() + options_.join_window_ms + config_.mindio_wait_s * 1000;
  // A newer incarnation may have formed a generation meanwhile (these pods reached this one as
  // others reached it): this one is fenced, which its pods are told instead.
  const std::vector<JobRecord::Member> members = join_.members();
  if (now >= give_up && !LookAtRecord(now) && join_.members() == members) {
    const bool dump = config_.allows(Strategy::kDump);
    StopAll(dump ? v1::StopTraining::MODE_DUMP : v1::StopTraining::MODE_EXIT,
            *missing + " within the join window and the decision wait (MINDIO_WAIT_MINDX_TIME); " +
                (dump ? "survivors dump a checkpoint and this incarnation stops"
                      : "this incarnation stops"),
            now, StopScope::kIncarnation);
  }
  return false;
}

void JobControl::TryFirstGeneration(int64_t now) {
  if (!join_.open()) return;
  // A pod here whose processes restart on this manager's order (a job restart) is not missing
  // while they have the hang timeout to come back: reported so, the decision maker would take it
  // for lost and wait for its replacement for good. Past it (a process that dies as it
  // restarts), it is missing like any other.
  std::vector<int64_t> missing;
  bool restarting = false;
  pods_.NoteRestartsSeen(now);
  for (size_t n = 0; n < pods_.size(); ++n) {
    const Agent& a = pods_[static_cast<int64_t>(n)];
    if (pods_.Ready(static_cast<int64_t>(n))) continue;
    if (a.usable() && !a.restarting.empty() &&
        now - a.restart_ms < HangTimeoutMs())
      restarting = true;
    else
      missing.push_back(static_cast<int64_t>(n));
  }
  const bool window_over = join_.Over(now);
  if (!missing.empty() && !window_over) return;
  if (!MajorityBack(now)) return;
  std::vector<int64_t> all;
  for (int64_t r = 0; r < layout_.replicas(); ++r) all.push_back(r);
  if (missing.empty()) {
    if (!restarting)
      FormGeneration(all, {}, "all " + std::to_string(pods_.size()) + " pods registered", now);
    return;
  }
  if (!join_.ReportMissing()) return;
  std::string why;
  std::vector<bool> available(pods_.size());
  for (size_t n = 0; n < pods_.size(); ++n) available[n] = pods_.Ready(static_cast<int64_t>(n));
  if (!PlanGeneration(config_, layout_, available, &why))
    Event(now, "error", "the join window closed with node ranks " + Join(missing) +
                            " missing: " + why + "; waiting for them");
  // The missing pods are faults like any other: the decision maker says whether to wait for
  // them or start smaller.
  state_ = State::kAborted;
  v1::FaultFacts f;
  f.set_kind(v1::FAULT_KIND_POD_LOST);
  for (int64_t p : missing) f.add_pods(static_cast<uint32_t>(p));
  f.set_step(-1);
  f.set_detail("node ranks " + Join(missing) + " did not register within the join window");
  // The decision maker takes each missing pod's incarnation for lost and waits for a new one: a
  // pod that registered and dropped is fenced now, so that it comes back as its own replacement
  // under a new incarnation, not as the one the decision maker gave up on. (One still connected
  // keeps its word: what it heard committed counts.)
  for (int64_t p : missing)
    if (!pods_[p].pod_uid.empty() && !pods_[p].connected && pods_[p].state != AgentState::kLost)
      Fence(p, f.detail(), /*readmit=*/true);
  ReportFault(f, now);
  // A standing decision that already leaves every missing pod out (one issued to an earlier
  // incarnation, which this one took as seen at attach) is what the decision maker will keep:
  // their loss changes nothing it decided, so no new directive follows.
  AwaitStandingDecision(missing, "leaves out node ranks " + Join(missing), now);
}

bool JobControl::AwaitStandingDecision(const std::vector<int64_t>& left_out,
                                       const std::string& why, int64_t now) {
  const std::optional<Directive> standing = decisions_->Standing();
  if (!standing || (standing->kind != REGROUP_DIRECTIVE_RESUME &&
                    standing->kind != REGROUP_DIRECTIVE_SCALE_IN &&
                    standing->kind != REGROUP_DIRECTIVE_SCALE_OUT &&
                    standing->kind != REGROUP_DIRECTIVE_RESTART_IN_PLACE))
    return false;
  std::set<int64_t> kept;
  for (int64_t r : standing->keep_replicas)
    for (int64_t p : layout_.PodsOfReplica(r)) kept.insert(p);
  if (kept.empty() || std::any_of(kept.begin(), kept.end(), [&](int64_t p) {
        return !pods_[p].usable() ||
               std::find(left_out.begin(), left_out.end(), p) != left_out.end();
      }))
    return false;
  Event(now, "wait",
        "the standing " + std::string(DirectiveKindName(standing->kind)) +
            " directive keeps replicas " +
            Join(std::vector<int64_t>(standing->keep_replicas.begin(),
                                      standing->keep_replicas.end())) +
            " and " + why + ": forming it once they are back");
  reconcile_.Await(*standing);  // bounded wait; a newer directive replaces it
  return true;
}

void JobControl::Tick(int64_t now) {
  // A manager that was not scheduled (an overloaded machine) for longer than half the liveness
  // timeout has not heard its pods for that long through no fault of theirs: their messages wait
  // in its sockets. That time is not counted against any pod (it delays detection by as much).
  if (last_tick_ms_ >= 0 && now - last_tick_ms_ > LivenessMs() / 2) {
    const int64_t stall = now - last_tick_ms_;
    pods_.ForgiveStall(stall);
    ++counters_.manager_stalls;
    Event(now, "manager_stall",
          "this manager ran nothing for " + std::to_string(stall) +
              " ms (an overloaded machine?): that time is not counted against any pod");
  }
  last_tick_ms_ = now;
  StopsCommitting(now, record_looked_ms_ < 0 || now - record_looked_ms_ >= kRecordLookMs);
  CommitHeld(now);
  if (state_ == State::kJoining) TryFirstGeneration(now);
  if (state_ != State::kStopped) DetectFailures(now);
  SettleFaults(now);
  decisions_->Tick(now);
  TakeDecisions(now);
  // Work waiting for restarted processes or pods to come back (a scale-out while training
  // waits for a step boundary instead: see Commit).
  if (reconcile_.pending() && state_ != State::kTraining && state_ != State::kStopped &&
      Ready(reconcile_.pending()->keep_replicas)) {
    Directive d = *reconcile_.TakePending();
    if (!FormGeneration(std::vector<int64_t>(d.keep_replicas.begin(), d.keep_replicas.end()),
                        d.microbatches, d.reason, now))
      reconcile_.Await(d);
  }
  CheckPendingWait(now);
  CheckDecisionWait(now);
}

void JobControl::TakeDecisions(int64_t now) {
  while (auto d = decisions_->Poll()) {
    if (state_ == State::kStopped) break;
    reconcile_.Drop();
    Apply(*d, now);
  }
}

// The decision wait (Reconciliation::DecisionWaitOver): once it is over, this incarnation stops,
// dumping a checkpoint if the job allows it. Only this incarnation: cut off from the coordinator,
// it cannot know that the job is over (a newer manager may lead it). Its pods exit, and come back
// to whichever manager the coordinator serves.
void JobControl::CheckDecisionWait(int64_t now) {
  const bool waiting = state_ == State::kAborted && !reconcile_.pending();
  // A fault the decision maker takes for no change (a pod outside the replicas it decided on,
  // which this incarnation had formed beyond them) brings no new directive. Once the survivors
  // waited kStandingGraceMs for one with the decision maker reachable, its standing decision is
  // carried out, when every pod it keeps is here.
  if (!waiting || !decisions_->Available()) {
    undecided_since_ms_ = -1;
  } else if (undecided_since_ms_ < 0) {
    undecided_since_ms_ = now;
  } else if (now - undecided_since_ms_ >= kStandingGraceMs &&
             AwaitStandingDecision({}, "no newer directive came in " +
                                           std::to_string(now - undecided_since_ms_) + " ms",
                                   now)) {
    undecided_since_ms_ = -1;
    return;
  }
  const bool dump = config_.allows(Strategy::kDump);
  std::string reason;
  if (reconcile_.DecisionWaitOver(waiting, !waiting || decisions_->Available(),
                                  config_.mindio_wait_s, dump, now, &reason))
    StopAll(dump ? v1::StopTraining::MODE_DUMP : v1::StopTraining::MODE_EXIT, reason, now,
            StopScope::kIncarnation);
}

v1::GetStatusResponse JobControl::StatusReport() const {
  v1::GetStatusResponse s;
  s.set_job_id(spec_.id);
  s.set_epoch(options_.epoch);
  s.set_generation(generation());
  s.set_world_size(world_size());
  s.set_data_parallel(static_cast<uint32_t>(running().replicas().size()));
  s.set_committed_step(commit_.step());
  static const char* kStates[] = {"joining", "training", "aborted", "stopped"};
  s.set_phase(kStates[static_cast<int>(state_)]);
  static const char* kAgentStates[] = {"registered", "active", "standby", "lost", "leaving", "done"};
  // How long a silence of each pod, and of its trainers, is allowed now (silence_bound.h).
  const int64_t now = std::max<int64_t>(last_tick_ms_, 0), liveness = LivenessMs();
  auto ms = [](int64_t v) {
    return static_cast<uint32_t>(std::clamp<int64_t>(v, 0, UINT32_MAX));
  };
  for (size_t n = 0; n < pods_.size(); ++n) {
    const Agent& a = pods_[static_cast<int64_t>(n)];
    auto* ns = s.add_nodes();
    ns->set_node_rank(static_cast<uint32_t>(n));
    ns->set_node_name(a.node_name);
    ns->set_pod_uid(a.pod_uid);
    ns->set_state(a.pod_uid.empty() ? "missing" : kAgentStates[static_cast<int>(a.state)]);
    for (size_t g = 0; g < running().size(); ++g)
      if (running().places()[g].pod == static_cast<int64_t>(n))
        ns->add_ranks(static_cast<uint32_t>(g));
    ns->set_liveness_timeout_ms(ms(a.silence.TimeoutMs(liveness, now)));
    ns->set_silence_peak_ms(ms(a.silence.PeakMs(now)));
    for (const SilenceBound& r : a.rank_silence) {
      ns->set_rank_liveness_timeout_ms(
          std::max(ns->rank_liveness_timeout_ms(), ms(r.TimeoutMs(liveness, now))));
      ns->set_rank_silence_peak_ms(std::max(ns->rank_silence_peak_ms(), ms(r.PeakMs(now))));
    }
  }
  for (const auto& e : log_.events()) *s.add_events() = e;
  return s;
}

}  // namespace regroup::manager
