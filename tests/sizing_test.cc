// SPDX-License-Identifier: Apache-2.0
// Elastic sizing: tp/pp/dp combinations, uneven spreads, even-split, the minimum, losses of
// several replicas, standbys.
#include <gtest/gtest.h>

#include "plugin/sizing.h"

namespace regroup {
namespace {

JobConfig Config(int64_t tp, int64_t pp, int64_t ppp, int64_t min_dp = 1, int64_t g = 0,
                 int64_t m = 0, bool even = false) {
  JobConfig c;
  c.tensor_parallel = tp;
  c.pipeline_parallel = pp;
  c.processes_per_pod = ppp;
  c.min_data_parallel = min_dp;
  c.global_batch_size = g;
  c.micro_batch_size = m;
  c.even_split = even;
  return c;
}

std::vector<bool> AllBut(int64_t pods, std::initializer_list<int64_t> lost) {
  std::vector<bool> v(static_cast<size_t>(pods), true);
  for (int64_t p : lost) v[static_cast<size_t>(p)] = false;
  return v;
}

TEST(Sizing, SpreadIsAsEvenAsPossible) {
  EXPECT_EQ(SpreadMicroBatches(16, 4), (std::vector<int64_t>{4, 4, 4, 4}));
  EXPECT_EQ(SpreadMicroBatches(16, 3), (std::vector<int64_t>{6, 5, 5}));
  EXPECT_EQ(SpreadMicroBatches(7, 5), (std::vector<int64_t>{2, 2, 1, 1, 1}));
  EXPECT_EQ(SpreadMicroBatches(5, 5), (std::vector<int64_t>{1, 1, 1, 1, 1}));
}

TEST(Sizing, ReplicaSpanningPods) {
  Layout l(8, 4, 8);  // 8 pods of 4 ranks; replicas of 8 ranks span 2 pods
  EXPECT_EQ(l.replicas(), 4);
  EXPECT_EQ(l.PodsOfReplica(0), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(l.PodsOfReplica(3), (std::vector<int64_t>{6, 7}));
  EXPECT_EQ(l.PodOfRank(1, 5), 3);
}

TEST(Sizing, SeveralReplicasPerPod) {
  Layout l(2, 8, 2);  // 2 pods of 8 ranks; replicas of 2 ranks, 4 per pod
  EXPECT_EQ(l.replicas(), 8);
  EXPECT_EQ(l.PodsOfReplica(5), (std::vector<int64_t>{1}));
  EXPECT_EQ(l.PodOfRank(3, 1), 0);
}

TEST(Sizing, LosingOnePodOfASpanningReplicaLeavesItsPeerPodAsStandby) {
  auto c = Config(4, 2, 4);  // 8-rank replicas over 4-rank pods
  Layout l(8, 4, 8);
  auto plan = PlanGeneration(c, l, AllBut(8, {3}), nullptr);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->dp, 3);
  EXPECT_EQ(plan->keep_replicas, (std::vector<int64_t>{0, 2, 3}));
  EXPECT_EQ(plan->standby_pods, (std::vector<int64_t>{2}));
}

TEST(Sizing, LosingAPodWithSeveralReplicasRemovesThemAll) {
  auto c = Config(2, 1, 8);
  Layout l(4, 8, 2);  // 16 replicas, 4 per pod
  auto plan = PlanGeneration(c, l, AllBut(4, {1}), nullptr);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->dp, 12);
  EXPECT_EQ(plan->keep_replicas.front(), 0);
  EXPECT_EQ(plan->keep_replicas[4], 8) << "replicas 4..7 lived on pod 1; order is kept";
  EXPECT_TRUE(plan->standby_pods.empty());
}

TEST(Sizing, MultiReplicaLossKeepsOrderAndSpreadsTheBatch) {
  auto c = Config(1, 1, 1, 1, 64, 4);  // 16 micro-batches
  Layout l(6, 1, 1);
  auto plan = PlanGeneration(c, l, AllBut(6, {1, 4}), nullptr);
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->keep_replicas, (std::vector<int64_t>{0, 2, 3, 5}));
  EXPECT_EQ(plan->microbatches, (std::vector<int64_t>{4, 4, 4, 4}));
  auto plan5 = PlanGeneration(c, l, AllBut(6, {2}), nullptr);
  EXPECT_EQ(plan5->microbatches, (std::vector<int64_t>{4, 3, 3, 3, 3}));
}

TEST(Sizing, EvenSplitChoosesTheLargestDivisorAndKeepsTheRestAsStandbys) {
  auto c = Config(1, 1, 1, 1, 48, 4, true);  // 12 micro-batches
  Layout l(6, 1, 1);
  auto plan = PlanGeneration(c, l, AllBut(6, {0}), nullptr);  // 5 complete
  ASSERT_TRUE(plan);
  EXPECT_EQ(plan->dp, 4);
  EXPECT_EQ(plan->keep_replicas, (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(plan->standby_pods, (std::vector<int64_t>{5}));
  EXPECT_EQ(plan->microbatches, (std::vector<int64_t>{3, 3, 3, 3}));
}

TEST(Sizing, BelowTheMinimumIsInfeasibleWithAReason) {
  auto c = Config(1, 1, 1, 3);
  Layout l(4, 1, 1);
  std::string why;
  EXPECT_FALSE(PlanGeneration(c, l, AllBut(4, {0, 1}), &why));
  EXPECT_EQ(why, "2 complete replicas left, below the minimum data-parallel degree 3");
  auto even = Config(1, 1, 1, 3, 24, 4, true);  // 6 micro-batches; 5 complete -> 3 usable
  Layout l6(6, 1, 1);
  EXPECT_TRUE(PlanGeneration(even, l6, AllBut(6, {0}), nullptr));
  auto even4 = Config(1, 1, 1, 4, 24, 4, true);
  EXPECT_FALSE(PlanGeneration(even4, l6, AllBut(6, {0}), &why));
  EXPECT_EQ(why, "5 complete replicas left (3 usable with regroup.io/even-split), below the "
                 "minimum data-parallel degree 4");
}

}  // namespace
}  // namespace regroup
