// SPDX-License-Identifier: Apache-2.0
#include "manager/reconciliation.h"

#include "common/text.h"

namespace regroup::manager {

namespace {

std::string Join(const std::vector<int64_t>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? "," : "") + std::to_string(items[i]);
  return out;
}

}  // namespace

void Reconciliation::Formed(const RankLayout& running, bool interim) {
  interim_ = interim;
  if (!interim) known_ = running;
}

void Reconciliation::JobRestarts() {
  pending_.reset();  // the decision maker resumes the job once every pod is back
  interim_ = false;
}

int64_t Reconciliation::KnownRank(const RankLayout& running, uint32_t rank) const {
  if (!interim_ || rank >= running.size()) return rank;
  const RankPlace& p = running.places()[rank];
  return known_.RankOf(p.pod, p.local_rank);
}

void Reconciliation::Decided(DirectiveKind kind) {
  if (kind != REGROUP_DIRECTIVE_RESTART_IN_PLACE && kind != REGROUP_DIRECTIVE_RETRY)
    restarted_early_.clear();
}

std::map<int64_t, std::vector<uint32_t>> Reconciliation::RanksToRestart(
    const Directive& d, const Pods& pods, bool skip_restarted_early) {
  std::map<int64_t, std::vector<uint32_t>> by_pod;
  for (int64_t rank : d.restart_ranks) {
    if (rank < 0 || static_cast<size_t>(rank) >= known_.size()) continue;
    const RankPlace& p = known_.places()[static_cast<size_t>(rank)];
    if (skip_restarted_early && restarted_early_.count({p.pod, p.local_rank}) &&
        !pods[p.pod].failed.count(p.local_rank))
      continue;
    by_pod[p.pod].push_back(p.local_rank);
  }
  if (skip_restarted_early) restarted_early_.clear();
  return by_pod;
}

Directive Reconciliation::Rejoin(const std::string& reason) const {
  Directive d;
  d.kind = REGROUP_DIRECTIVE_RESTART_IN_PLACE;
  d.strategy = "recover-in-place";
  d.keep_replicas = known_.replicas();
  d.reason = reason;
  return d;
}

void Reconciliation::Continued(Directive rejoin, int64_t committed_step) {
  pending_ = std::move(rejoin);
  pending_since_ms_ = -1;
  continued_after_step_ = committed_step;
}

std::optional<Directive> Reconciliation::TakePending() {
  std::optional<Directive> d = std::move(pending_);
  pending_.reset();
  return d;
}

void Reconciliation::Drop() {
  pending_.reset();
  pending_since_ms_ = -1;
}

bool Reconciliation::WaitIsBounded(bool training) const {
  const bool rejoin = pending_ && pending_->kind == REGROUP_DIRECTIVE_RESTART_IN_PLACE;
  return !training || rejoin;
}

std::optional<std::vector<int64_t>> Reconciliation::OverdueWait(
    bool bounded, bool aborted, int64_t hang_ms, const Layout& shape, const Pods& pods,
    int64_t now, std::string* reason) {
  if (!pending_ || !bounded) {
    pending_since_ms_ = pending_ ? pending_since_ms_ : -1;
    return std::nullopt;
  }
  if (pending_since_ms_ < 0) pending_since_ms_ = now;
  if (now - pending_since_ms_ <= hang_ms) return std::nullopt;
  std::vector<int64_t> waiting;
  for (int64_t r : pending_->keep_replicas)
    for (int64_t p : shape.PodsOfReplica(r))
      if (!pods.Ready(p)) waiting.push_back(p);
  const std::string kind(DirectiveKindName(pending_->kind));
  const int64_t waited = now - pending_since_ms_;
  pending_.reset();
  pending_since_ms_ = -1;
  if (waiting.empty() && !aborted) {
    // Nobody to blame: the directive waits for no pod this incarnation does not have (a loss of
    // no pod would abort the generation and give the decision maker nothing to decide).
    log_.Add(now, "wait",
             "the " + kind + " directive waited " + std::to_string(waited) +
                 " ms for no pod that is not available: it is over");
    return std::nullopt;
  }
  *reason = "pods " + Join(waiting) + " did not become available within " +
            std::to_string(hang_ms) + " ms for the " + kind + " directive";
  return waiting;
}

bool Reconciliation::DecisionWaitOver(bool waiting, bool available, int64_t wait_s, bool dump,
                                      int64_t now, std::string* reason) {
  if (!waiting || available) {
    if (waiting && unavailable_ms_ >= 0)
      log_.Add(now, "decisions_available",
               "the coordinator is reachable again after " +
                   std::to_string(now - unavailable_ms_) + " ms; survivors wait for its decision");
    unavailable_ms_ = -1;
    return false;
  }
  if (unavailable_ms_ < 0) {
    unavailable_ms_ = now;
    log_.Add(now, "decisions_unavailable",
             "the coordinator is unreachable while survivors wait for a decision: they stay "
             "paused for up to " + std::to_string(wait_s) + " s (MINDIO_WAIT_MINDX_TIME)");
    return false;
  }
  if (now - unavailable_ms_ < wait_s * 1000) return false;
  *reason = "no decision: the coordinator was unreachable for " +
            std::to_string(now - unavailable_ms_) + " ms, past the decision wait of " +
            std::to_string(wait_s) + " s (MINDIO_WAIT_MINDX_TIME); " +
            (dump ? "survivors dump a checkpoint and this incarnation stops"
                  : "this incarnation stops (dump is not allowed)");
  log_.Add(now, "decision_timeout", *reason);
  unavailable_ms_ = -1;
  return true;
}

}  // namespace regroup::manager
