// SPDX-License-Identifier: Apache-2.0
#include "manager/step_commit.h"

#include <algorithm>
#include <map>

namespace regroup::manager {

namespace {

constexpr CommitMark kUnknown{0, 0};

// The generation that committed `step`, as the ranks that heard its commit say; (0, 0) when none
// says, or when they disagree (one of them holds a stale mark: no rank may then trust its vote).
CommitMark HeardMark(const Pods& pods, int64_t step, const StepCommit::Counts& count) {
  CommitMark mark = kUnknown;
  for (const Agent& a : pods.all()) {
    if (a.state == AgentState::kLost || a.pod_uid.empty()) continue;
    for (const auto& lr : a.ranks) {
      if (lr.heard_commit_step() != step || (count && !count(lr))) continue;
      const CommitMark said{lr.heard_commit_epoch(), lr.heard_commit_generation()};
      // Generation 0 names no committer: the commit was sent again by an incarnation that did
      // not make it (JobControl::CatchUp), whatever epoch it was heard under.
      if (said.second == 0) continue;
      if (mark != kUnknown && mark != said) return kUnknown;
      mark = said;
    }
  }
  return mark;
}

// Whether replicas agree on their parameters where a checksum was taken, as a vote's tally
// compares them: each rank's against replica 0's rank at its position (0: none taken).
bool ChecksumsAgree(const std::vector<uint64_t>& checksums, int64_t replica_ranks) {
  const auto per_replica = static_cast<size_t>(std::max<int64_t>(replica_ranks, 1));
  for (size_t r = per_replica; r < checksums.size(); ++r) {
    const uint64_t first = checksums[r % per_replica];
    if (checksums[r] != 0 && first != 0 && checksums[r] != first) return false;
  }
  return true;
}

// A vote the incarnation before this one did not decide: every rank of the generation it was
// cast in voted for `step` there, each able to commit it, and replicas' checksums, where taken,
// agree (compared here as the tally would have; a checksum from a rank whose rank in the
// generation is not known, an older agent's, leaves the step to be redone). Returns that
// generation, else (0, 0). Ranks are counted by process, alive: each rank of a generation is
// one process, which holds one vote at most, so the votes of a generation's world size are all
// of its ranks'. A lost pod's ranks, or a rank that took its outcome (its vote is gone), leave
// the count short.
CommitMark UndecidedVoteComplete(const Pods& pods, int64_t step, int64_t replica_ranks) {
  struct Count {
    uint32_t votes = 0, world = 0;
    bool spoiled = false;
    std::map<uint32_t, uint64_t> checksums;  // by rank in the generation (an agent's word: sparse)
  };
  std::map<CommitMark, Count> counts;
  for (const Agent& a : pods.all()) {
    if (a.state == AgentState::kLost || a.pod_uid.empty()) continue;
    for (const auto& lr : a.ranks) {
      if (lr.voted_step() != step || lr.voted_generation() == 0) continue;
      Count& c = counts[{lr.voted_epoch(), lr.voted_generation()}];
      c.spoiled = c.spoiled || !lr.alive() || !lr.voted_ok() || lr.voted_world_size() == 0 ||
                  lr.committed_step() + 1 != step ||
                  (c.world != 0 && c.world != lr.voted_world_size());
      c.world = lr.voted_world_size();
      ++c.votes;
      if (lr.voted_checksum() == 0) continue;
      if (!lr.has_voted_rank() || lr.voted_rank() >= lr.voted_world_size()) {
        c.spoiled = true;
        continue;
      }
      c.checksums[lr.voted_rank()] = lr.voted_checksum();
    }
  }
  CommitMark complete = kUnknown;
  for (const auto& [mark, c] : counts) {
    if (c.spoiled || c.votes != c.world) continue;
    // Whole: its world size is its ranks' count, so the vector is as large as what was reported.
    std::vector<uint64_t> checksums(c.world, 0);
    for (const auto& [rank, sum] : c.checksums) checksums[rank] = sum;
    if (!ChecksumsAgree(checksums, replica_ranks)) continue;
    if (complete != kUnknown) return kUnknown;  // two whole generations: trust neither
    complete = mark;
  }
  return complete;
}

}  // namespace

StatusOr<StepCommit::Ballot> StepCommit::Vote(int64_t pod, const v1::Votes& votes,
                                              const RankLayout& running, int64_t replica_ranks,
                                              uint64_t generation) {
  if (votes.step() >= 0 && votes.step() <= step_)
    return Ballot::kOpen;  // sent again after a resumed session: the step is committed
  if (votes.step() < 0 || votes.step() != step_ + 1)
    return FailedPrecondition("the votes are for step " + std::to_string(votes.step()) +
                              "; the step in flight is " + std::to_string(step_ + 1));
  if (vote_step_ != votes.step()) {
    vote_step_ = votes.step();
    voted_.assign(running.size(), false);
    voted_count_ = 0;
    checksums_.assign(running.size(), 0);
    vote_ok_ = true;
  }
  for (int i = 0; i < votes.local_ranks_size(); ++i) {
    const uint32_t l = votes.local_ranks(i);
    const int64_t rank = running.RankOf(pod, l);
    if (rank < 0)
      return InvalidArgument("local rank " + std::to_string(l) + " of pod " +
                             std::to_string(pod) + " has no rank in generation " +
                             std::to_string(generation));
    if (!voted_[static_cast<size_t>(rank)]) ++voted_count_;
    voted_[static_cast<size_t>(rank)] = true;
    if (i < votes.checksums_size()) checksums_[static_cast<size_t>(rank)] = votes.checksums(i);
  }
  vote_ok_ = vote_ok_ && votes.ok();
  if (voted_count_ < voted_.size()) return Ballot::kOpen;
  // Every rank voted. Replicas must agree on their parameters where a checksum was taken.
  if (!ChecksumsAgree(checksums_, replica_ranks)) return Ballot::kMismatch;
  return vote_ok_ ? Ballot::kPassed : Ballot::kRejected;
}

bool StepCommit::Hold(int64_t step, uint64_t generation) {
  const bool again = held_step_ == step && held_generation_ == generation;
  held_step_ = step;
  held_generation_ = generation;
  return !again;
}

std::optional<int64_t> StepCommit::Held(bool training, uint64_t generation) {
  if (held_step_ < 0) return std::nullopt;
  if (!training || held_generation_ != generation || vote_step_ != held_step_) {
    held_step_ = -1;
    return std::nullopt;
  }
  return held_step_;
}

bool StepCommit::Committed(int64_t step, const CommitMark& mark, const RankLayout& running,
                           int64_t now) {
  step_ = step;
  mark_ = mark;
  for (const auto& p : running.places()) restarted_since_commit_.erase({p.pod, p.local_rank});
  vote_step_ = -1;
  const bool timed = last_commit_ms_ >= 0;
  if (timed) {
    step_times_ms_.push_back(now - last_commit_ms_);
    while (step_times_ms_.size() > 31) step_times_ms_.pop_front();
  }
  last_commit_ms_ = now;
  return timed;
}

void StepCommit::NewGeneration() {
  vote_step_ = -1;
  last_commit_ms_ = -1;
}

void StepCommit::Forget() {
  step_ = -1;
  mark_ = kUnknown;
}

StepCommit::KnownCommit StepCommit::Known(const Pods& pods, bool finish_votes,
                                          int64_t replica_ranks, const Counts& count) const {
  int64_t heard = step_;
  for (const Agent& a : pods.all())
    if (a.state != AgentState::kLost && !a.pod_uid.empty())
      for (const auto& lr : a.ranks)
        if (!count || count(lr))
          heard = std::max({heard, lr.committed_step(), lr.heard_commit_step()});
  if (finish_votes)
    if (const CommitMark voted_in = UndecidedVoteComplete(pods, heard + 1, replica_ranks);
        voted_in != kUnknown)
      return {heard + 1, voted_in, /*finished_vote=*/true};
  return {heard, heard > step_ ? HeardMark(pods, heard, count) : mark_, /*finished_vote=*/false};
}

int64_t StepCommit::HighestHeard(const Pods& pods, bool finish_votes,
                                 int64_t replica_ranks) const {
  return Known(pods, finish_votes, replica_ranks).step;
}

bool StepCommit::CatchUp(const Pods& pods, bool finish_votes, int64_t replica_ranks,
                         const Counts& count) {
  const KnownCommit known = Known(pods, finish_votes, replica_ranks, count);
  if (known.step <= step_) return false;
  step_ = known.step;
  mark_ = known.mark;
  return known.finished_vote;
}

bool StepCommit::Holds(int64_t pod, uint32_t local, const Agent& a, const RankLayout& running,
                       bool same_pod, const CommitMark& running_mark) const {
  if (local >= a.ranks.size() || a.restarting.count(local)) return false;
  const v1::LocalRank& r = a.ranks[local];
  if (std::max(r.committed_step(), r.heard_commit_step()) >= step_) return true;
  // It voted for the step, and has not heard the outcome: it applies the step from its vote if
  // the generation it voted in committed it (or nobody knows which did), as the trainer does
  // (python/regroup/forming.py). What a restarted manager knows of the votes before it.
  const CommitMark voted_in{r.voted_epoch(), r.voted_generation()};
  if (voted_in.second != 0 && r.voted_step() == step_ && r.committed_step() + 1 == step_ &&
      (mark_ == kUnknown || mark_ == voted_in))
    return true;
  // Its reports may be a heartbeat late. A rank of the running generation holds it if that
  // generation committed the step (it voted for it) or resumed after it with this rank holding
  // it, unless its pod was replaced or its process restarted since.
  const int64_t g = running.RankOf(pod, local);
  if (g < 0 || static_cast<size_t>(g) >= running.size() || !same_pod ||
      restarted_since_commit_.count({pod, local}))
    return false;
  return mark_ == running_mark || !running.places()[static_cast<size_t>(g)].needs_state;
}

int64_t StepCommit::MedianStepMs() const {
  if (step_times_ms_.empty()) return 0;
  std::vector<int64_t> t(step_times_ms_.begin(), step_times_ms_.end());
  std::nth_element(t.begin(), t.begin() + static_cast<long>(t.size() / 2), t.end());
  return t[t.size() / 2];
}

}  // namespace regroup::manager
