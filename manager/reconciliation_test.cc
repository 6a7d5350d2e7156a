// SPDX-License-Identifier: Apache-2.0
#include "manager/reconciliation.h"

#include <gtest/gtest.h>

namespace regroup::manager {
namespace {

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Two pods of two processes, replicas of two ranks: replica r is pod r.
RankLayout OverReplicas(const std::vector<int64_t>& replicas) {
  return RankLayout::Of(replicas, 2, 2, 2, [](int64_t, uint32_t) { return true; });
}

// Pods whose agents registered with their two processes alive.
Pods Registered(int64_t count) {
  Pods pods(count, /*liveness_ms=*/1000);
  for (int64_t n = 0; n < count; ++n) {
    v1::Register reg;
    reg.set_pod_uid("pod-" + std::to_string(n));
    reg.set_nproc(2);
    pods.Admit(n, static_cast<uint64_t>(n + 1), reg, AgentState::kActive, 0);
  }
  return pods;
}

TEST(Reconciliation, AnInterimGenerationsRanksAreNamedAsInTheGenerationTheDecisionMakerKnows) {
  EventLog log(16);
  Reconciliation r(log);
  r.Formed(OverReplicas({0, 1}), /*interim=*/false);
  const RankLayout interim = OverReplicas({1});  // replica 0 restarts in place
  r.Formed(interim, /*interim=*/true);
  EXPECT_EQ(r.KnownRank(interim, 0), 2);
  EXPECT_EQ(r.KnownRankWhileInterim(0, 1), 1) << "a restarted rank, outside the interim one";
  EXPECT_EQ(r.known().replicas(), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(r.Rejoin("back").keep_replicas, (std::vector<int64_t>{0, 1}));
  r.Formed(OverReplicas({0, 1}), /*interim=*/false);
  EXPECT_EQ(r.KnownRankWhileInterim(0, 1), -1);
}

TEST(Reconciliation, ARestartInPlaceSkipsTheRanksTheManagerRestartedAtOnceUnlessTheyDiedAgain) {
  EventLog log(16);
  Reconciliation r(log);
  Pods pods = Registered(2);
  r.Formed(OverReplicas({0, 1}), false);
  r.RestartedEarly(0, 0);
  r.RestartedEarly(0, 1);
  pods.Exited(0, 1, /*clean=*/false);  // died again before the decision
  Directive d;
  d.kind = REGROUP_DIRECTIVE_RESTART_IN_PLACE;
  d.restart_ranks = {0, 1, 3};
  const auto restart = r.RanksToRestart(d, pods, /*skip_restarted_early=*/true);
  EXPECT_EQ(restart, (std::map<int64_t, std::vector<uint32_t>>{{0, {1}}, {1, {1}}}));
  // The decision was about them: the next one restarts them all.
  EXPECT_EQ(r.RanksToRestart(d, pods, true).at(0), (std::vector<uint32_t>{0, 1}));
}

// Simulation seed 12848 with a coordinator: a manager cut off from it past the decision wait
// stopped "the job" while a newer manager trained on. The wait's end is said once; the job
// control then stops only its own incarnation (Sim.WithACoordinatorWhatItsSeedsFoundIsFixed).
TEST(Reconciliation, TheDecisionWaitRunsOutOnceTheCoordinatorIsUnreachableForItsWholeLength) {
  EventLog log(16);
  Reconciliation r(log);
  std::string why;
  EXPECT_FALSE(r.DecisionWaitOver(true, /*available=*/false, 30, /*dump=*/false, 0, &why));
  EXPECT_FALSE(r.DecisionWaitOver(true, false, 30, false, 29999, &why));
  EXPECT_TRUE(r.DecisionWaitOver(true, false, 30, false, 30000, &why));
  EXPECT_TRUE(Contains(why, "this incarnation stops (dump is not allowed)")) << why;
  EXPECT_EQ(log.events().back().kind(), "decision_timeout");
  EXPECT_FALSE(r.DecisionWaitOver(true, false, 30, false, 30001, &why)) << "a new wait starts";
}

TEST(Reconciliation, TheDecisionWaitStartsAgainOnceTheCoordinatorIsBack) {
  EventLog log(16);
  Reconciliation r(log);
  std::string why;
  EXPECT_FALSE(r.DecisionWaitOver(true, false, 30, true, 0, &why));
  EXPECT_FALSE(r.DecisionWaitOver(true, /*available=*/true, 30, true, 20000, &why));
  EXPECT_EQ(log.events().back().kind(), "decisions_available");
  EXPECT_FALSE(r.DecisionWaitOver(true, false, 30, true, 25000, &why));
  EXPECT_FALSE(r.DecisionWaitOver(true, false, 30, true, 50000, &why)) << "25 s of 30";
  EXPECT_TRUE(r.DecisionWaitOver(true, false, 30, true, 55000, &why));
}

}  // namespace
}  // namespace regroup::manager
