// SPDX-License-Identifier: Apache-2.0
#include "manager/attach_core.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "common/wire.h"

namespace regroup::manager {
namespace {

// `kind` is p's kind, already decoded (DirectiveKindFromWire).
Directive FromProto(const v1::Directive& p, DirectiveKind kind) {
  Directive d;
  d.kind = kind;
  d.id = p.id();
  d.deadline_ms = p.deadline_ms();
  d.strategy = p.strategy();
  d.dp = p.dp();
  d.keep_replicas.assign(p.keep_replicas().begin(), p.keep_replicas().end());
  d.remove_replicas.assign(p.remove_replicas().begin(), p.remove_replicas().end());
  d.standby_pods.assign(p.standby_pods().begin(), p.standby_pods().end());
  d.restart_ranks.assign(p.restart_ranks().begin(), p.restart_ranks().end());
  for (uint64_t m : p.microbatches()) d.microbatches.push_back(static_cast<int64_t>(m));
  d.committed_step = p.committed_step();
  d.reason = p.reason();
  return d;
}

// The kind of a report of which only the latest matters (0: every one counts): progress, and a
// request for the lease alone.
int LatestOnlyKind(const v1::ManagerReport& r) {
  if (r.has_progress()) return 1;
  if (r.body_case() == v1::ManagerReport::BODY_NOT_SET && r.has_lease()) return 2;
  return 0;
}

}  // namespace

v1::Header AttachCore::MakeHeader() const { return ManagerHeader(job_id_, epoch_, generation_); }

bool AttachCore::Enqueue(v1::ManagerReport report) {
  *report.mutable_header() = MakeHeader();
  if (report.body_case() != v1::ManagerReport::BODY_NOT_SET && !report.has_hello())
    report.set_seq(++next_seq_);
  // Only the latest progress, or request for the lease (worth as much, from later), matters: one
  // waiting behind another of its kind replaces it (never the one being written, the front).
  const int kind = LatestOnlyKind(report);
  if (kind != 0 && queue_.size() > (writing_ ? 1u : 0u) && LatestOnlyKind(queue_.back()) == kind) {
    queue_.back() = std::move(report);
    return false;
  }
  queue_.push_back(std::move(report));
  if (queue_.size() + unacked_.size() <= max_queued_) return false;
  // The oldest fact goes: one written and not acknowledged first (it may have arrived).
  if (!unacked_.empty()) unacked_.pop_front();
  else queue_.erase(queue_.begin() + (writing_ ? 1 : 0));
  ++dropped_;
  return true;
}

v1::ManagerReport AttachCore::Hello(int64_t now_ms) {
  v1::ManagerReport hello;
  *hello.mutable_header() = MakeHeader();
  hello.mutable_hello()->set_epoch(epoch_);
  hello.mutable_hello()->set_ticket(ticket_);
  hello.mutable_lease()->set_sent_ms(now_ms);
  lease_asked_ms_ = now_ms;
  return hello;
}

int64_t AttachCore::RenewalPeriodMs() const {
  if (lease_ms_ > 0) return std::max<int64_t>(lease_ms_ / 4, 1);
  // None granted yet: again once the wait the coordinator named is over, within a second.
  return std::clamp<int64_t>(retry_in_ms_, 1, 1000);
}

bool AttachCore::RenewLease(int64_t now_ms) {
  if (LeaseRenewalIn(now_ms) > 0 || !attached_ || fenced_by_ || leaseless_) return false;
  v1::ManagerReport r;
  r.mutable_lease()->set_sent_ms(now_ms);
  lease_asked_ms_ = now_ms;
  Enqueue(std::move(r));
  return true;
}

int64_t AttachCore::LeaseRenewalIn(int64_t now_ms) const {
  if (!attached_ || fenced_by_ || leaseless_) return RenewalPeriodMs();  // nothing to ask for
  if (lease_asked_ms_ < 0) return 0;
  return std::max<int64_t>(0, lease_asked_ms_ + RenewalPeriodMs() - now_ms);
}

void AttachCore::NoteLease(const v1::LeaseGrant& grant) {
  if (grant.lease_ms() <= 0) {
    retry_in_ms_ = grant.wait_ms() > 0 ? grant.wait_ms() + 1 : 1000;
    if (grant.wait_ms() > 0)
      spdlog::info("no lease yet (an older manager's may still run, or the coordinator is storing "
                   "this one as its holder): asking again in {} ms; commits wait",
                   grant.wait_ms());
    return;
  }
  // A grant answers a request this manager sent, at the time it names (never in the future).
  if (grant.sent_ms() > lease_asked_ms_) return;
  lease_ms_ = grant.lease_ms();
  lease_until_ms_ = std::max(lease_until_ms_, grant.sent_ms() + grant.lease_ms());
}

std::string AttachCore::OnAnswer(const v1::CoordinatorDirective& first) {
  if (first.has_refusal()) {
    NoteRefusal(first.refusal());
    return "refused: " + first.refusal().reason();
  }
  if (!first.has_directive())
    return "the coordinator answered the hello with neither a directive nor a refusal";
  if (epoch_ == 0) {
    epoch_ = first.header().epoch();
    ticket_ = first.epoch_ticket();
    job_keys_ = first.job();
  }
  if (epoch_ == 0 || first.header().epoch() != epoch_)
    return "the coordinator attached this manager as epoch " +
           std::to_string(first.header().epoch()) + ", not the epoch " + std::to_string(epoch_) +
           " it was granted";
  OnDirective(first, /*first=*/true);
  acking_ = first.acks_facts();
  NoteAcks(first);
  if (first.has_lease()) {
    leaseless_ = false;
    NoteLease(first.lease());
  } else if (!leaseless_) {
    leaseless_ = true;
    spdlog::warn("the coordinator answered the hello without a lease (a coordinator older than "
                 "leases): this manager commits without one, and a manager of job {} cut off "
                 "from it may commit beside its replacement until it hears it was replaced",
                 job_id_);
  }
  attached_ = true;
  ever_attached_ = true;
  ++attaches_;
  last_error_.clear();
  return "";
}

void AttachCore::NoteAcks(const v1::CoordinatorDirective& message) {
  if (!message.acks_facts()) return;
  const uint64_t applied = message.applied_seq();
  while (!unacked_.empty() && unacked_.front().seq() <= applied) unacked_.pop_front();
  // Queued again after a reattach but applied before the stream broke: not written again.
  for (auto it = queue_.begin() + (writing_ ? 1 : 0); it != queue_.end();)
    it = it->seq() != 0 && it->seq() <= applied ? queue_.erase(it) : std::next(it);
}

void AttachCore::OnMessage(const v1::CoordinatorDirective& message) {
  NoteAcks(message);
  if (message.has_lease()) NoteLease(message.lease());
  OnDirective(message, /*first=*/false);
}

void AttachCore::OnDirective(const v1::CoordinatorDirective& m, bool first) {
  if (m.has_refusal()) {
    last_error_ = "the coordinator refused: " + m.refusal().reason();
    spdlog::warn("{}", last_error_);
    NoteRefusal(m.refusal());
    return;
  }
  if (!m.has_directive()) return;
  const v1::Directive& d = m.directive();
  // The end of the job is no earlier incarnation's alone: an exit or a dump decided for one that
  // died before it carried it out ends this one too (else a new manager takes the exit as seen,
  // and the job never ends).
  const bool ends_job =
      d.kind() == v1::Directive::KIND_EXIT || d.kind() == v1::Directive::KIND_DUMP;
  if (first && !ends_job && (!ever_attached_ || d.id() < newest_id_)) {
    if (const std::optional<DirectiveKind> kind = DirectiveKindFromWire(d.kind()))
      standing_ = FromProto(d, *kind);
    if (ever_attached_)
      spdlog::warn("the coordinator's directive ids went back from {} to {} (its engine lost the "
                   "job's state): taking {} as seen",
                   newest_id_, d.id(), d.id());
    newest_id_ = d.id();
    unseen_.reset();
    return;
  }
  if (d.id() <= newest_id_) return;
  newest_id_ = d.id();
  const std::optional<DirectiveKind> kind = DirectiveKindFromWire(d.kind());
  if (!kind) {
    spdlog::error("refused directive {} from the coordinator: its kind {} is not one this manager "
                  "knows (a newer coordinator?); waiting for the next directive",
                  d.id(), static_cast<int>(d.kind()));
    return;
  }
  unseen_ = FromProto(d, *kind);
  standing_ = unseen_;
}

void AttachCore::NoteRefusal(const v1::Refusal& refusal) {
  if (epoch_ == 0 || refusal.epoch() <= epoch_ || fenced_by_) return;
  fenced_by_ = "the coordinator serves manager epoch " + std::to_string(refusal.epoch()) +
               " of job " + job_id_ + ", newer than this one's (epoch " + std::to_string(epoch_) +
               "): " + refusal.reason();
  spdlog::error("{}: this manager commits nothing more and stops its pods", *fenced_by_);
}

void AttachCore::Detached() {
  attached_ = false;
  // What was written and not acknowledged may not have arrived: first in line after the next
  // attach, in its order (the coordinator skips what it applied, and takes a number below one
  // it applied for applied). A fact being written now comes after them: once its write ends.
  if (writing_) requeue_after_write_ = true;
  else Requeue();
}

void AttachCore::Requeue() {
  requeue_after_write_ = false;
  if (!acking_) unacked_.clear();
  queue_.insert(queue_.begin(), std::make_move_iterator(unacked_.begin()),
                std::make_move_iterator(unacked_.end()));
  unacked_.clear();
}

void AttachCore::WriteFailed() {
  writing_ = false;
  if (requeue_after_write_) Requeue();
}

v1::ManagerReport AttachCore::FaultReport(const v1::FaultFacts& fault) {
  v1::ManagerReport r;
  *r.mutable_fault() = fault;
  return r;
}

v1::ManagerReport AttachCore::ReplacementReport(int64_t pod, const std::string& uid) {
  v1::ManagerReport r;
  r.mutable_replacement()->set_pod(static_cast<uint32_t>(std::max<int64_t>(0, pod)));
  r.mutable_replacement()->set_pod_uid(uid);
  return r;
}

v1::ManagerReport AttachCore::SettledReport(uint64_t generation) {
  v1::ManagerReport r;
  r.mutable_settled()->set_generation(generation);
  return r;
}

v1::ManagerReport AttachCore::ProgressReport(uint64_t generation, int64_t committed_step,
                                             uint32_t live_ranks) {
  v1::ManagerReport r;
  r.mutable_progress()->set_generation(generation);
  r.mutable_progress()->set_committed_step(committed_step);
  r.mutable_progress()->set_live_ranks(live_ranks);
  return r;
}

std::string AttachCore::WhyNoCommit(int64_t now_ms, const std::string& target) const {
  if (LeaseHeld(now_ms)) return "";
  if (fenced_by_) return "fenced by the coordinator " + target + ": " + *fenced_by_;
  if (lease_until_ms_ == 0)
    return "the coordinator " + target + " has granted this manager no lease yet";
  return "this manager's lease from the coordinator " + target + " ran out " +
         std::to_string(now_ms - lease_until_ms_) +
         " ms ago: cut off from it, a newer manager may lead the job";
}

bool AttachCore::Failed(const std::string& why) {
  const bool news = why != last_error_;
  last_error_ = why;
  return news;
}

const v1::ManagerReport* AttachCore::NextToWrite() {
  if (!HasFactToWrite()) return nullptr;
  writing_ = true;
  return &queue_.front();
}

void AttachCore::Written() {
  if (!writing_) return;
  writing_ = false;
  if (acking_ && queue_.front().seq() != 0) {
    // Only the latest progress matters: one kept for an acknowledgment gives way to a newer
    // one (a coordinator that acknowledges only saved facts may hold them for long).
    if (queue_.front().has_progress())
      std::erase_if(unacked_, [](const v1::ManagerReport& r) { return r.has_progress(); });
    unacked_.push_back(std::move(queue_.front()));
  }
  queue_.pop_front();
  if (requeue_after_write_) Requeue();
}

std::optional<Directive> AttachCore::Poll() {
  std::optional<Directive> d = std::move(unseen_);
  unseen_.reset();
  return d;
}

}  // namespace regroup::manager
