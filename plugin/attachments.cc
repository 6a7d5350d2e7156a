// SPDX-License-Identifier: Apache-2.0
#include "plugin/attachments.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <mutex>

#include <nlohmann/json.hpp>

#include "common/job_token.h"
#include "common/text.h"
#include "plugin/job_spec.h"
#include "plugin/wire_facts.h"

namespace regroup::coordinator {

using nlohmann::json;

namespace {

// Bounds on what one fact may carry: its lists are pods and ranks of one job, and its detail
// ends up in the engine's reasons and history, which are exported to the PodGroup.
constexpr int kMaxListEntries = static_cast<int>(kMaxPods);

uint32_t U32(int64_t v) {
  return static_cast<uint32_t>(std::clamp<int64_t>(v, 0, std::numeric_limits<uint32_t>::max()));
}

std::string_view FactName(v1::ManagerReport::BodyCase body) {
  switch (body) {
    case v1::ManagerReport::kFault: return "fault";
    case v1::ManagerReport::kReplacement: return "replacement";
    case v1::ManagerReport::kProgress: return "progress";
    case v1::ManagerReport::kSettled: return "settled";
    default: return "report";
  }
}

}  // namespace

std::optional<v1::Directive> DirectiveToProto(const Directive& d) {
  v1::Directive p;
  p.set_id(d.id);
  // The engine issues only kinds of its own enum: anything else is never sent as another kind.
  const std::optional<v1::Directive::Kind> kind = DirectiveKindToWire(d.kind);
  if (!kind) return std::nullopt;
  p.set_kind(*kind);
  p.set_strategy(ValidUtf8(d.strategy));
  p.set_dp(U32(d.dp));
  for (int64_t r : d.keep_replicas) p.add_keep_replicas(U32(r));
  for (int64_t r : d.remove_replicas) p.add_remove_replicas(U32(r));
  for (int64_t pod : d.standby_pods) p.add_standby_pods(U32(pod));
  for (int64_t r : d.restart_ranks) p.add_restart_ranks(U32(r));
  for (int64_t m : d.microbatches) p.add_microbatches(static_cast<uint64_t>(std::max<int64_t>(0, m)));
  p.set_deadline_ms(d.deadline_ms);
  p.set_committed_step(d.committed_step);
  p.set_reason(ValidUtf8(d.reason));
  return p;
}

// The most of a caller's job id echoed back (a real one, namespace/name, is at most 317
// bytes): an id a caller made huge would otherwise ride back in the refusal's header and
// status, whose metadata overflows the client's limit and breaks the connection its other
// streams share.
constexpr size_t kShownJobIdBytes = 384;
// The most of a refusal's reason sent, in the message and in the stream's status.
constexpr size_t kReasonBytes = 1024;
// How soon a manager whose lease waits for its epoch to be stored as the holder asks again: the
// scheduler stores the state at its next session (about a second).
constexpr int64_t kHolderSaveWaitMs = 250;

v1::Header Attachments::MakeHeader(std::string_view job, uint64_t epoch) const {
  v1::Header h;
  h.set_job_id(BoundedText(job, kShownJobIdBytes));
  h.set_sender("coordinator");
  h.set_epoch(epoch);
  return h;
}

Attachments::Outgoing Attachments::Refusal(uint64_t stream, std::string_view job, uint64_t epoch,
                                           const Status& why, bool close) const {
  Outgoing out;
  out.stream = stream;
  *out.message.mutable_header() = MakeHeader(job, epoch);
  auto* r = out.message.mutable_refusal();
  const std::string reason = BoundedText(why.message(), kReasonBytes);
  r->set_reason(reason);
  r->set_epoch(epoch);
  if (const Job* j = engine_.FindJob(job)) r->set_directive_id(j->directive().id);
  out.close = close;
  out.status = Status(why.code(), reason);
  return out;
}

bool Attachments::DirectiveFor(uint64_t stream, Attached& a, Outgoing& out) const {
  const Job* job = engine_.FindJob(a.job);
  if (!job) return false;
  std::optional<v1::Directive> directive = DirectiveToProto(job->directive());
  if (!directive) return false;  // not a kind of the wire: never sent as another one
  out.stream = stream;
  *out.message.mutable_header() = MakeHeader(a.job, a.epoch);
  *out.message.mutable_directive() = std::move(*directive);
  a.sent_directive = job->directive().id;
  return true;
}

uint64_t Attachments::StoredHolder(std::string_view job, const JobEntry& entry) const {
  if (entry.holder_stored) return entry.stored_holder;
  const Job* found = engine_.FindJob(job);
  return found ? static_cast<uint64_t>(std::max<int64_t>(0, found->lease_holder())) : 0;
}

v1::LeaseGrant Attachments::Lease(std::string_view job, JobEntry& entry, uint64_t epoch,
                                  int64_t sent_ms) {
  const int64_t now_ms = lease_clock_();
  v1::LeaseGrant grant;
  grant.set_sent_ms(sent_ms);
  // None while another epoch's may run (a newer manager asking, or one reattaching with an epoch
  // this coordinator learned only now), nor, after this coordinator started, for an epoch a
  // stored state does not name as the holder: a lease granted before the start may still run.
  const uint64_t stored = StoredHolder(job, entry);
  const bool on_record = stored != 0 && epoch == stored;
  const int64_t from = std::max(on_record ? int64_t{0} : started_ms_ + LeaseSpanMs(),
                                epoch == entry.lease_epoch ? int64_t{0} : entry.lease_until_ms);
  if (now_ms < from) {
    grant.set_wait_ms(from - now_ms);
    return grant;
  }
  // A new holder is named in the job's state first; once a stored state names it, the lease.
  entry.holder = epoch;
  if (acks_saved_only_ && !on_record) {
    grant.set_wait_ms(kHolderSaveWaitMs);
    return grant;
  }
  // The manager counts from when it asked, no later than now: its lease ends before this one.
  entry.lease_epoch = epoch;
  entry.lease_until_ms = std::max(entry.lease_until_ms, now_ms + LeaseSpanMs());
  grant.set_lease_ms(lease_ms_);
  return grant;
}

uint64_t Attachments::epoch_of(std::string_view job) const {
  auto it = jobs_.find(job);
  return it == jobs_.end() ? 0 : it->second.epoch;
}

uint64_t Attachments::stream_of(std::string_view job) const {
  auto it = jobs_.find(job);
  return it == jobs_.end() ? 0 : it->second.stream;
}

std::vector<Attachments::Outgoing> Attachments::Hello(uint64_t stream,
                                                      const v1::ManagerReport& report,
                                                      int64_t now_ms,
                                                      std::string_view credential) {
  const std::string& job = report.header().job_id();
  const std::string shown = BoundedText(job, kShownJobIdBytes);  // the id as messages name it
  const uint64_t header_epoch = report.header().epoch();
  // 0: the manager asks for an epoch; else the epoch it was granted, reattaching.
  const uint64_t asked = report.hello().epoch() ? report.hello().epoch() : header_epoch;
  // The engine is read (the job, its directive) and the attachment decided in one critical
  // section, so a job removed meanwhile cannot be attached.
  std::shared_lock lock(engine_mu_);
  const uint64_t served = epoch_of(job);
  auto refuse = [&](Status why) {
    return std::vector<Outgoing>{Refusal(stream, job, served, why, true)};
  };
  // A refusal of who the caller is: PERMISSION_DENIED on the wire, and nothing of the job's
  // state (its epoch, its directive) told.
  auto deny = [&](std::string why) {
    std::vector<Outgoing> out{Refusal(stream, job, 0, FailedPrecondition(std::move(why)), true)};
    out.front().message.mutable_refusal()->clear_directive_id();
    out.front().permission_denied = true;
    return out;
  };
  if (!report.has_hello())
    return refuse(FailedPrecondition(
        "the first message of an Attach stream must be hello, with the job's id in the header "
        "(and epoch 0 to be granted an epoch, or the epoch and ticket granted before)"));
  if (job.empty())
    return refuse(InvalidArgument("the hello names no job: set header.job_id to the job's id"));
  if (report.hello().epoch() && header_epoch && header_epoch != report.hello().epoch())
    return refuse(InvalidArgument("the hello of job " + shown + " says epoch " +
                                  std::to_string(report.hello().epoch()) +
                                  " but its header says " + std::to_string(header_epoch)));
  const Job* found = engine_.FindJob(job);
  if (!found)
    return refuse(NotFound("no job " + shown +
                           " in the engine: a manager attaches only to a job the scheduler "
                           "has given the engine; check the job id"));
  const std::string& uid = found->spec().uid;
  // The token is checked before anything about epochs is said.
  if (!cluster_key_.empty() && !SecretsEqual(credential, JobToken(cluster_key_, job, uid)))
    return deny("the credential is not the token of job " + shown +
                ": a manager attaches only as the job whose token it holds (the job's Secret; "
                "regroupctl token), never with another job's token or the cluster key");
  // The epoch the engine's saved state holds for the job's manager survives a scheduler restart.
  // So does the lease holder it names (an epoch attached before, which may have reported nothing).
  const uint64_t recorded = static_cast<uint64_t>(
      std::max<int64_t>({0, found->manager_progress().epoch, found->lease_holder()}));
  const uint64_t highest = std::max(served, recorded);
  uint64_t epoch = asked;
  if (asked == 0) {
    // The engine keeps epochs as int64.
    if (highest >= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return refuse({REGROUP_RESOURCE_EXHAUSTED, "job " + shown + " has used every epoch"});
    epoch = std::max<uint64_t>({highest + 1, static_cast<uint64_t>(std::max<int64_t>(0, now_ms))});
  } else {
    if (!SecretsEqual(report.hello().ticket(), EpochTicket(cluster_key_, job, uid, asked)))
      return deny("epoch " + std::to_string(asked) + " of job " + shown +
                  " was not granted by the coordinator: a manager asks for its epoch with "
                  "hello.epoch 0 and reattaches with the epoch and ticket it was granted");
    // The refusal names the newest epoch (after a scheduler restart it may be known only from
    // the engine's saved state): the manager learns from it that it is fenced.
    if (asked < highest)
      return std::vector<Outgoing>{Refusal(
          stream, job, highest,
          FailedPrecondition("fenced: manager epoch " + std::to_string(asked) + " of job " + shown +
                             " is older than epoch " + std::to_string(highest) +
                             ", which this coordinator serves; a newer manager has replaced "
                             "this one"),
          true)};
  }

  std::vector<Outgoing> out;
  JobEntry& entry = jobs_[job];
  if (entry.stream != 0 && entry.stream != stream) {
    const uint64_t old = entry.stream;
    const uint64_t old_epoch = streams_[old].epoch;
    out.push_back(Refusal(
        old, job, epoch,
        FailedPrecondition("fenced: manager epoch " + std::to_string(epoch) + " of job " + job +
                           " attached on a new stream and replaces this one (epoch " +
                           std::to_string(old_epoch) + ")"),
        true));
    streams_.erase(old);
  }
  entry.epoch = epoch;
  entry.stream = stream;
  if (entry.applied_epoch != epoch) {
    // A new manager numbers its facts from 1; one this coordinator learns of only now (it
    // restarted) may have facts a stored state holds, applied before: those count as applied and
    // saved, never applied again (its predecessor may have stored them without the manager hearing
    // so).
    const auto [stored_epoch, stored_seq] = found->facts_applied();
    const bool stored = stored_epoch > 0 && static_cast<uint64_t>(stored_epoch) == epoch;
    entry.applied_epoch = epoch;
    entry.applied_seq = entry.saved_seq = stored ? static_cast<uint64_t>(stored_seq) : 0;
  }
  Attached& a = streams_[stream];
  a = Attached{job, epoch, 0};
  Outgoing directive;
  (void)DirectiveFor(stream, a, directive);  // the job exists: checked under this lock
  directive.message.set_epoch_ticket(EpochTicket(cluster_key_, job, uid, epoch));
  // Its keys, for a manager that was given no more than the job's id and sizes.
  const JobSpec& spec = found->spec();
  v1::JobKeys* keys = directive.message.mutable_job();
  keys->mutable_labels()->insert(spec.labels.begin(), spec.labels.end());
  keys->mutable_annotations()->insert(spec.annotations.begin(), spec.annotations.end());
  keys->mutable_env()->insert(spec.env.begin(), spec.env.end());
  keys->set_pods(static_cast<uint32_t>(spec.pods));
  keys->set_processes_per_pod(static_cast<uint32_t>(spec.processes_per_pod));
  if (report.has_lease())
    *directive.message.mutable_lease() = Lease(job, entry, epoch, report.lease().sent_ms());
  out.push_back(std::move(directive));
  return out;
}

Status Attachments::ApplyFact(const Attached& a, const v1::ManagerReport& report,
                              int64_t now_ms) {
  switch (report.body_case()) {
    case v1::ManagerReport::kFault: {
      const v1::FaultFacts& f = report.fault();
      if (f.pods_size() > kMaxListEntries || f.ranks_size() > kMaxListEntries)
        return InvalidArgument("the fault of job " + a.job + " lists " +
                               std::to_string(f.pods_size()) + " pods and " +
                               std::to_string(f.ranks_size()) + " ranks, over the limit of " +
                               std::to_string(kMaxListEntries));
      std::optional<PendingFault> fault = FaultFromWire(f, now_ms);
      if (!fault)
        return InvalidArgument("the fault of job " + a.job + " has kind " +
                               std::to_string(static_cast<int>(f.kind())) +
                               ", which is not a fault kind: set FaultFacts.kind");
      fault->detail = BoundedText(fault->detail, kMaxDetailBytes);
      std::unique_lock lock(engine_mu_);
      return engine_.ReportFault(a.job, std::move(*fault));
    }
    case v1::ManagerReport::kReplacement: {
      const v1::ReplacementRegistered& r = report.replacement();
      // The replacement's pod is running with its new uid (a uid the engine has not seen for
      // that index is a new incarnation), and its agent has registered. A zombie (the lost
      // incarnation's own uid) leaves the pod event without effect and is refused by the second.
      std::unique_lock lock(engine_mu_);
      Status st = engine_.SetPodState(a.job, r.pod(), r.pod_uid(), REGROUP_POD_RUNNING, "", now_ms);
      if (st.ok()) st = engine_.ReportReplacementRegistered(a.job, r.pod(), r.pod_uid(), now_ms);
      return st;
    }
    case v1::ManagerReport::kProgress: {
      const v1::ManagerProgress& p = report.progress();
      ManagerProgress status;
      status.epoch = static_cast<int64_t>(std::min<uint64_t>(a.epoch, INT64_MAX));
      status.generation = static_cast<int64_t>(std::min<uint64_t>(p.generation(), INT64_MAX));
      status.committed_step = std::max<int64_t>(-1, p.committed_step());
      status.live_ranks = p.live_ranks();
      std::unique_lock lock(engine_mu_);
      return engine_.ReportProgress(a.job, status);
    }
    case v1::ManagerReport::kSettled: {
      std::unique_lock lock(engine_mu_);
      return engine_.ReportFaultsSettled(
          a.job, static_cast<int64_t>(std::min<uint64_t>(report.settled().generation(), INT64_MAX)));
    }
    case v1::ManagerReport::kHello:
      return FailedPrecondition("this stream is already attached for job " + a.job +
                                " (epoch " + std::to_string(a.epoch) +
                                "): hello is its first message only");
    default:
      return InvalidArgument("the report of job " + a.job +
                             " has no body: send a fault, replacement, progress, settled or lease request");
  }
}

std::vector<Attachments::Outgoing> Attachments::OnReport(uint64_t stream,
                                                         const v1::ManagerReport& report,
                                                         int64_t now_ms,
                                                         std::string_view credential) {
  std::vector<Outgoing> out = Handle(stream, report, now_ms, credential);
  StampAcks(out);
  return out;
}

void Attachments::StampAcks(std::vector<Outgoing>& out) const {
  for (Outgoing& o : out) {
    auto a = streams_.find(o.stream);
    if (a == streams_.end()) continue;
    auto entry = jobs_.find(a->second.job);
    if (entry == jobs_.end()) continue;
    o.message.set_acks_facts(true);
    o.message.set_applied_seq(acks_saved_only_ ? entry->second.saved_seq
                                               : entry->second.applied_seq);
  }
}

std::vector<Attachments::Outgoing> Attachments::Handle(uint64_t stream,
                                                       const v1::ManagerReport& report,
                                                       int64_t now_ms,
                                                       std::string_view credential) {
  if (started_ms_ < 0) started_ms_ = lease_clock_();
  auto it = streams_.find(stream);
  if (it == streams_.end()) return Hello(stream, report, now_ms, credential);
  const Attached& a = it->second;
  JobEntry& entry = jobs_[a.job];
  Status st;
  if (report.header().job_id() != a.job)
    st = InvalidArgument("the report names job " + report.header().job_id() +
                         " but this stream is attached for job " + a.job);
  else if (report.header().epoch() != 0 && report.header().epoch() != a.epoch)
    st = FailedPrecondition("the report is of manager epoch " +
                            std::to_string(report.header().epoch()) +
                            " but this stream is attached as epoch " + std::to_string(a.epoch));
  else if (report.seq() != 0 && report.seq() <= entry.applied_seq)
    ;  // sent again after a reattach, and applied (or refused) before: once is enough
  else if (report.body_case() != v1::ManagerReport::BODY_NOT_SET || !report.has_lease())
    st = ApplyFact(a, report, now_ms);
  if (report.seq() > entry.applied_seq) {
    entry.applied_seq = report.seq();
    // The job's state holds the mark too, so that a stored state says which facts it holds.
    std::unique_lock lock(engine_mu_);
    if (Job* job = engine_.FindJob(a.job))
      job->NoteFactsApplied(static_cast<int64_t>(a.epoch), static_cast<int64_t>(entry.applied_seq));
  }
  if (st.ok()) {
    if (!report.has_lease()) return {};
    Outgoing grant;
    grant.stream = stream;
    *grant.message.mutable_header() = MakeHeader(a.job, a.epoch);
    std::shared_lock lock(engine_mu_);
    *grant.message.mutable_lease() = Lease(a.job, entry, a.epoch, report.lease().sent_ms());
    return {std::move(grant)};
  }
  if (report.body_case() != v1::ManagerReport::kHello &&
      report.body_case() != v1::ManagerReport::BODY_NOT_SET)
    st = {st.code(), "refused the " + std::string(FactName(report.body_case())) + " of job " +
                         a.job + ": " + st.message()};
  std::shared_lock lock(engine_mu_);
  return {Refusal(stream, a.job, a.epoch, st, false)};
}

std::optional<std::pair<json, Attachments::StateMark>> Attachments::ExportJobState(
    std::string_view job) {
  std::shared_lock lock(engine_mu_);
  const Job* found = engine_.FindJob(job);
  if (!found) return std::nullopt;
  json state = found->StateJson();
  StateMark mark;
  if (auto it = jobs_.find(job); it != jobs_.end()) {
    JobEntry& entry = it->second;
    mark = {entry.applied_epoch, entry.applied_seq};
    if (entry.holder != 0) state["lease_holder"] = entry.holder;
    entry.exported = {mark, state.value("lease_holder", uint64_t{0})};
  }
  return std::make_pair(std::move(state), mark);
}

void Attachments::Saved(std::string_view job, StateMark mark) {
  acks_saved_only_ = true;
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return;
  JobEntry& entry = it->second;
  if (entry.exported && entry.exported->first.epoch == mark.epoch &&
      entry.exported->first.seq == mark.seq) {
    entry.stored_holder = entry.exported->second;
    entry.holder_stored = true;
  }
  if (entry.applied_epoch != mark.epoch) return;
  entry.saved_seq = std::max(entry.saved_seq, mark.seq);
}

bool Attachments::SaveWanted(std::string_view job) const {
  auto it = jobs_.find(job);
  if (!acks_saved_only_ || it == jobs_.end() || it->second.holder == 0) return false;
  std::shared_lock lock(engine_mu_);
  return StoredHolder(job, it->second) != it->second.holder;
}

void Attachments::OnClosed(uint64_t stream) {
  auto it = streams_.find(stream);
  if (it == streams_.end()) return;
  auto job = jobs_.find(it->second.job);
  if (job != jobs_.end() && job->second.stream == stream) job->second.stream = 0;
  streams_.erase(it);
}

std::vector<Attachments::Outgoing> Attachments::Publish() {
  std::vector<Outgoing> out;
  std::vector<uint64_t> gone;
  std::shared_lock lock(engine_mu_);
  for (auto& [id, a] : streams_) {
    const Job* job = engine_.FindJob(a.job);
    if (!job) {
      gone.push_back(id);
      continue;
    }
    if (job->directive().id == a.sent_directive) continue;
    Outgoing d;
    if (DirectiveFor(id, a, d)) out.push_back(std::move(d));
  }
  for (uint64_t id : gone) {
    const Attached a = streams_[id];
    out.push_back(Refusal(id, a.job, a.epoch,
                          NotFound("job " + a.job + " was removed from the engine"), true));
    jobs_.erase(a.job);
    streams_.erase(id);
  }
  // Forget the epochs of jobs the engine no longer has, so the table does not grow forever.
  for (auto it = jobs_.begin(); it != jobs_.end();)
    it = it->second.stream == 0 && !engine_.FindJob(it->first) ? jobs_.erase(it) : std::next(it);
  StampAcks(out);
  return out;
}

}  // namespace regroup::coordinator
