// SPDX-License-Identifier: Apache-2.0
#include "manager/rank_layout.h"

#include <gtest/gtest.h>

namespace regroup::manager {
namespace {

// Three pods of two processes, replicas of two ranks: replica r is pod r.
RankLayout OverReplicas(const std::vector<int64_t>& replicas) {
  return RankLayout::Of(replicas, /*replica_ranks=*/2, /*pods=*/3, /*ranks_per_pod=*/2,
                        [](int64_t pod, uint32_t local) { return pod == 0 || local == 1; });
}

TEST(RankLayout, NumbersTheRanksOfTheReplicasItTrainsInTheirOrder) {
  const RankLayout layout = OverReplicas({2, 0});
  ASSERT_EQ(layout.size(), 4u);
  EXPECT_EQ(layout.replicas(), (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(layout.places()[0].pod, 2);
  EXPECT_EQ(layout.places()[0].replica, 0u);
  EXPECT_EQ(layout.places()[3].pod, 0);
  EXPECT_EQ(layout.places()[3].local_rank, 1u);
  EXPECT_EQ(layout.RankOf(2, 1), 1);
  EXPECT_EQ(layout.RankOf(0, 0), 2);
  EXPECT_EQ(layout.RanksOf(0), (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ(layout.Pods(), (std::set<int64_t>{0, 2}));
}

TEST(RankLayout, APodOutsideTheGenerationHoldsNoRank) {
  const RankLayout layout = OverReplicas({0, 2});
  EXPECT_EQ(layout.RankOf(1, 0), -1);
  EXPECT_TRUE(layout.RanksOf(1).empty());
  EXPECT_EQ(layout.RankOf(0, 7), -1) << "a local rank the pod does not run";
  EXPECT_EQ(layout.RankOf(9, 0), -1) << "a pod the job does not have";
}

TEST(RankLayout, ARankThatDoesNotHoldTheCommittedStateNeedsIt) {
  const RankLayout layout = OverReplicas({0, 2});
  EXPECT_FALSE(layout.places()[0].needs_state);  // pod 0 holds it
  EXPECT_TRUE(layout.places()[2].needs_state);   // pod 2, local rank 0
  EXPECT_FALSE(layout.places()[3].needs_state);  // pod 2, local rank 1
}

TEST(RankLayout, BeforeAnyGenerationThereAreNoRanks) {
  const RankLayout none;
  EXPECT_EQ(none.size(), 0u);
  EXPECT_EQ(none.RankOf(0, 0), -1);
  EXPECT_TRUE(none.RanksOf(0).empty());
  EXPECT_TRUE(none.Pods().empty());
}

}  // namespace
}  // namespace regroup::manager
