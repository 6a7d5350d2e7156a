// SPDX-License-Identifier: Apache-2.0
// The decisions being carried out, and their reconciliation with what the manager did first.
//
// On a trainer crash the manager acts at once (the survivors continue in an interim generation
// while the crashed ranks restart in place) and the decision maker decides later, about the
// generation it knows. This part keeps that generation's rank layout (faults name its ranks,
// directives restart them), which ranks the manager already restarted, the directive waiting for
// pods or a step boundary, and the decision wait while the decision maker is unreachable.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "manager/event_log.h"
#include "manager/pods.h"
#include "manager/rank_layout.h"
#include "plugin/engine.h"
#include "plugin/sizing.h"

namespace regroup::manager {

class Reconciliation {
 public:
  explicit Reconciliation(EventLog& log) : log_(log) {}

  // --- The generation the decision maker knows ---
  const RankLayout& known() const { return known_; }
  // The running generation is interim: formed by the manager alone while restarted ranks come
  // back (the decision maker keeps the generation before it as its frame of ranks).
  bool interim() const { return interim_; }
  // A generation formed: the running one, `interim` or not.
  void Formed(const RankLayout& running, bool interim);
  // A job restart: no generation is interim any more, no directive waits.
  void JobRestarts();
  // Rank `rank` of the running generation as the rank it holds in the one the decision maker
  // knows (every interim rank holds one: the interim is a subset of it); -1: none.
  int64_t KnownRank(const RankLayout& running, uint32_t rank) const;
  // While an interim generation runs, the rank a pod's process holds in the known one; else -1.
  int64_t KnownRankWhileInterim(int64_t pod, uint32_t local) const {
    return interim_ ? known_.RankOf(pod, local) : -1;
  }

  // --- Ranks the manager restarted at once ---
  void RestartedEarly(int64_t pod, uint32_t local) { restarted_early_.insert({pod, local}); }
  // A decision of another course than restarting ranks in place (or a retry): it owns every
  // rank again.
  void Decided(DirectiveKind kind);
  // A directive's ranks to restart, by pod (pod index -> local ranks), mapped through the
  // generation the decision maker knows; `skip_restarted_early`: not those the manager already
  // restarted at once (unless they died again). With `skip_restarted_early` this decision was
  // about them: they are forgotten.
  std::map<int64_t, std::vector<uint32_t>> RanksToRestart(const Directive& d, const Pods& pods,
                                                          bool skip_restarted_early = false);
  // The return of the ranks restarted in place: the generation the decision maker knows again.
  Directive Rejoin(const std::string& reason) const;
  // The survivors continued past a failed process, after `committed_step`, while `rejoin` waits
  // for the restarted ranks.
  void Continued(Directive rejoin, int64_t committed_step);
  // The survivors already continued after this committed step: the step failing again may be
  // poison, and is not continued past.
  bool ContinuedAfter(int64_t committed_step) const {
    return continued_after_step_ == committed_step;
  }

  // --- The directive waiting for restarted ranks, pods or a step boundary ---
  const std::optional<Directive>& pending() const { return pending_; }
  // `d` waits (its wait, if one is timed, goes on).
  void Await(const Directive& d) { pending_ = d; }
  void AwaitKeeping(const Directive& d, std::vector<int64_t> keep) {
    pending_ = d;
    pending_->keep_replicas = std::move(keep);
  }
  // The directive waiting, taken out (for the generation it forms).
  std::optional<Directive> TakePending();
  // A new directive replaces the one waiting: its wait starts again.
  void Drop();
  // While training, only the return of ranks restarted in place is bounded (the survivors train
  // on meanwhile); a scale-out waits as long as it takes.
  bool WaitIsBounded(bool training) const;
  // A directive waiting longer than the hang timeout (`hang_ms`) for the pods of its replicas
  // (`shape`) is over: it waits for no pod that is not ready (logged; nothing is returned), or
  // the pods it waits for are returned, to be declared lost (`reason` says why). `bounded`: its
  // wait is timed now (WaitIsBounded, and the job has not stopped); `aborted`: the generation
  // is aborted.
  std::optional<std::vector<int64_t>> OverdueWait(bool bounded, bool aborted, int64_t hang_ms,
                                                  const Layout& shape, const Pods& pods,
                                                  int64_t now, std::string* reason);

  // --- The decision wait (docs/design.md, "Who decides what") ---
  // With a coordinator the manager never makes a scheduling decision itself: while the
  // coordinator is unreachable and survivors wait for a decision (`waiting`: a generation
  // aborted, no directive being carried out), they stay paused until it returns or
  // `wait_s` (MINDIO_WAIT_MINDX_TIME) runs out. True when it ran out (`reason` says so); the
  // job control then takes the ladder's last steps. The embedded engine is always available.
  bool DecisionWaitOver(bool waiting, bool available, int64_t wait_s, bool dump, int64_t now,
                        std::string* reason);

 private:
  EventLog& log_;
  RankLayout known_;  // the last generation not formed as interim
  bool interim_ = false;
  std::set<std::pair<int64_t, uint32_t>> restarted_early_;  // (pod, local) restarted at once
  // The committed step when the survivors last continued past a failed process.
  int64_t continued_after_step_ = -2;
  std::optional<Directive> pending_;
  int64_t pending_since_ms_ = -1;
  // Since when survivors wait for a decision while the decision maker is unreachable; -1: not.
  int64_t unavailable_ms_ = -1;
};

}  // namespace regroup::manager
