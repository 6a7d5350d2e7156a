// SPDX-License-Identifier: Apache-2.0
// Aggregating a pod's step votes into one Votes message.
#include "agent/vote_tally.h"

#include <gtest/gtest.h>

namespace regroup::agent {
namespace {

namespace v1 = regroup::v1;

v1::TrainerVote Vote(uint64_t generation, int64_t step, bool ok = true, uint64_t checksum = 0) {
  v1::TrainerVote v;
  v.set_generation(generation);
  v.set_step(step);
  v.set_ok(ok);
  v.set_checksum(checksum);
  return v;
}

auto AllLive = [](uint32_t) { return true; };

TEST(VoteTally, SendsOneVotesOnceEveryAssignedRankVoted) {
  VoteTally tally;
  tally.Start(4, {0, 1, 3});
  EXPECT_FALSE(tally.Add(3, Vote(4, 10, true, 33)));
  EXPECT_FALSE(tally.Add(0, Vote(4, 10, true, 11)));
  EXPECT_TRUE(tally.TakeComplete(AllLive).empty());
  EXPECT_FALSE(tally.Add(1, Vote(4, 10, true, 22)));
  auto done = tally.TakeComplete(AllLive);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].generation(), 4u);
  EXPECT_EQ(done[0].step(), 10);
  EXPECT_TRUE(done[0].ok());
  EXPECT_EQ(std::vector<uint32_t>(done[0].local_ranks().begin(), done[0].local_ranks().end()),
            (std::vector<uint32_t>{0, 1, 3}));
  EXPECT_EQ(std::vector<uint64_t>(done[0].checksums().begin(), done[0].checksums().end()),
            (std::vector<uint64_t>{11, 22, 33}));
  EXPECT_TRUE(tally.TakeComplete(AllLive).empty());  // sent once
}

TEST(VoteTally, OneRankThatCannotCommitMakesTheWholeVoteNotOk) {
  VoteTally tally;
  tally.Start(1, {0, 1});
  tally.Add(0, Vote(1, 5, true));
  tally.Add(1, Vote(1, 5, false));
  auto done = tally.TakeComplete(AllLive);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_FALSE(done[0].ok());
}

TEST(VoteTally, ARankThatDiedBeforeVotingIsLeftOut) {
  VoteTally tally;
  tally.Start(2, {0, 1});
  tally.Add(0, Vote(2, 7));
  EXPECT_TRUE(tally.TakeComplete(AllLive).empty());
  auto done = tally.TakeComplete([](uint32_t r) { return r != 1; });
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].local_ranks_size(), 1);
  EXPECT_EQ(done[0].local_ranks(0), 0u);
}

TEST(VoteTally, NoVotesWhenEveryAssignedRankIsDead) {
  VoteTally tally;
  tally.Start(2, {0});
  EXPECT_TRUE(tally.TakeComplete([](uint32_t) { return false; }).empty());
}

TEST(VoteTally, RefusesVotesOfAnotherGenerationOrAnUnassignedRank) {
  VoteTally tally;
  EXPECT_TRUE(tally.Add(0, Vote(1, 1)).has_value());  // no generation yet
  tally.Start(3, {0});
  auto wrong_generation = tally.Add(0, Vote(2, 1));
  ASSERT_TRUE(wrong_generation);
  EXPECT_NE(wrong_generation->find("generation 2"), std::string::npos) << *wrong_generation;
  auto unassigned = tally.Add(1, Vote(3, 1));
  ASSERT_TRUE(unassigned);
  EXPECT_NE(unassigned->find("no assignment"), std::string::npos) << *unassigned;
  tally.Clear();
  EXPECT_TRUE(tally.Add(0, Vote(3, 1)).has_value());  // aborted
}

TEST(VoteTally, AStepRolledBackIsVotedAfresh) {
  VoteTally tally;
  tally.Start(1, {0, 1});
  tally.Add(0, Vote(1, 9, true, 1));
  tally.Settle(1, 9);  // the outcome came (the other vote was lost): the partial vote is stale
  tally.Add(1, Vote(1, 9, true, 2));
  EXPECT_TRUE(tally.TakeComplete(AllLive).empty());
  tally.Add(0, Vote(1, 9, true, 3));
  auto done = tally.TakeComplete(AllLive);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(std::vector<uint64_t>(done[0].checksums().begin(), done[0].checksums().end()),
            (std::vector<uint64_t>{3, 2}));
}

}  // namespace
}  // namespace regroup::agent
