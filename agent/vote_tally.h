// SPDX-License-Identifier: Apache-2.0
// The step votes of one agent's ranks, aggregated into one Votes message per (generation, step):
// sent when every live local rank with an assignment in the generation has voted. A rank that
// dies before voting is left out (its ProcessExit tells the manager); the manager decides.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "regroup/v1/wire.pb.h"

namespace regroup::agent {

class VoteTally {
 public:
  // A generation started: `assigned` are the local ranks that train in it. Drops every open vote.
  void Start(uint64_t generation, const std::vector<uint32_t>& assigned);
  // No generation is running (aborted or stopped). Drops every open vote.
  void Clear();
  // A step's outcome is known: its open votes (and those of earlier steps) are dropped, so a
  // step done again after a rollback is voted afresh.
  void Settle(uint64_t generation, int64_t step);

  // Records a vote. Returns why it was not counted, or nothing when it was.
  std::optional<std::string> Add(uint32_t local_rank, const regroup::v1::TrainerVote& vote);

  // Every step that `live` ranks have all voted for, as Votes (local ranks ascending, checksums
  // in that order), removed from the tally.
  std::vector<regroup::v1::Votes> TakeComplete(const std::function<bool(uint32_t)>& live);

  bool active() const { return active_; }
  uint64_t generation() const { return generation_; }
  bool assigned(uint32_t local_rank) const { return assigned_.count(local_rank) != 0; }

 private:
  struct Ballot {
    bool ok;
    uint64_t checksum;
  };
  bool active_ = false;
  uint64_t generation_ = 0;
  std::set<uint32_t> assigned_;
  std::map<int64_t, std::map<uint32_t, Ballot>> steps_;  // step -> local rank -> vote
};

}  // namespace regroup::agent
