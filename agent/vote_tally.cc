// SPDX-License-Identifier: Apache-2.0
#include "agent/vote_tally.h"

namespace regroup::agent {

void VoteTally::Start(uint64_t generation, const std::vector<uint32_t>& assigned) {
  active_ = true;
  generation_ = generation;
  assigned_ = std::set<uint32_t>(assigned.begin(), assigned.end());
  steps_.clear();
}

void VoteTally::Clear() {
  active_ = false;
  assigned_.clear();
  steps_.clear();
}

void VoteTally::Settle(uint64_t generation, int64_t step) {
  if (!active_ || generation != generation_) return;
  steps_.erase(steps_.begin(), steps_.upper_bound(step));
}

std::optional<std::string> VoteTally::Add(uint32_t local_rank,
                                          const regroup::v1::TrainerVote& vote) {
  if (!active_)
    return "no generation is running here (the vote is for generation " +
           std::to_string(vote.generation()) + ")";
  if (vote.generation() != generation_)
    return "it is for generation " + std::to_string(vote.generation()) + ", the current one is " +
           std::to_string(generation_);
  if (!assigned_.count(local_rank))
    return "local rank " + std::to_string(local_rank) + " has no assignment in generation " +
           std::to_string(generation_);
  steps_[vote.step()][local_rank] = Ballot{vote.ok(), vote.checksum()};
  return std::nullopt;
}

std::vector<regroup::v1::Votes> VoteTally::TakeComplete(
    const std::function<bool(uint32_t)>& live) {
  std::vector<regroup::v1::Votes> out;
  for (auto it = steps_.begin(); it != steps_.end();) {
    const auto& ballots = it->second;
    bool complete = !ballots.empty();
    for (uint32_t rank : assigned_)
      if (live(rank) && !ballots.count(rank)) complete = false;
    if (!complete) {
      ++it;
      continue;
    }
    regroup::v1::Votes votes;
    votes.set_generation(generation_);
    votes.set_step(it->first);
    bool ok = true;
    for (const auto& [rank, ballot] : ballots) {  // std::map: ascending local rank
      votes.add_local_ranks(rank);
      votes.add_checksums(ballot.checksum);
      ok = ok && ballot.ok;
    }
    votes.set_ok(ok);
    out.push_back(std::move(votes));
    it = steps_.erase(it);
  }
  return out;
}

}  // namespace regroup::agent
