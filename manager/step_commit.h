// SPDX-License-Identifier: Apache-2.0
// The step commit: the vote of the step in flight, the step held for the decision maker's lease,
// the committed step and the generation that committed it, who holds that state, and the
// commit intervals (the hang timeout scales with them). The job control sends the outcomes.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "manager/pods.h"
#include "manager/rank_layout.h"
#include "regroup/v1/wire.pb.h"

namespace regroup::manager {

// (epoch, generation) of a commit; (0, 0): not known.
using CommitMark = std::pair<uint64_t, uint64_t>;

class StepCommit {
 public:
  // Where a vote of the step in flight leaves it.
  enum class Ballot {
    kOpen,      // ranks have yet to vote (or the votes were for a step already committed)
    kRejected,  // every rank voted and one voted against it
    kMismatch,  // every rank voted and replicas disagree on their parameters
    kPassed,    // every rank voted for it
  };

  int64_t step() const { return step_; }
  const CommitMark& mark() const { return mark_; }

  // A pod's votes for the step in flight of the running generation `running`, whose replicas
  // have `replica_ranks` ranks each. An error names what is wrong with them.
  StatusOr<Ballot> Vote(int64_t pod, const v1::Votes& votes, const RankLayout& running,
                        int64_t replica_ranks, uint64_t generation);
  // No step is in flight (the generation was aborted, or the vote fell through).
  void DropVote() { vote_step_ = -1; }
  // A step every rank voted for waits for the lease: false when it already did.
  bool Hold(int64_t step, uint64_t generation);
  // The step held for the lease, if it is still the one in flight of `generation` (training);
  // a hold whose generation is over is dropped.
  std::optional<int64_t> Held(bool training, uint64_t generation);
  void ReleaseHold() { held_step_ = -1; }
  bool holding() const { return held_step_ >= 0; }

  // `step` committed by `mark`, the running generation `running`. True when the interval since
  // the previous commit counts (MedianStepMs).
  bool Committed(int64_t step, const CommitMark& mark, const RankLayout& running, int64_t now);
  // A generation forms: no step in flight, no interval running.
  void NewGeneration();
  // A job restart: it resumes from a checkpoint, not from a commit.
  void Forget();
  // The highest step committed here or heard committed by a pod not lost; with `finish_votes`
  // (an incarnation that has not formed a generation yet), the step after it where the ranks of
  // a generation all voted for it, able to commit it, replicas of `replica_ranks` ranks agreeing
  // on their checksums, and none heard the outcome: the vote the incarnation before this one did
  // not decide, which it would have committed.
  int64_t HighestHeard(const Pods& pods, bool finish_votes, int64_t replica_ranks) const;
  // Whether a rank's report counts for what was committed (a job restart's: not one from before
  // it); none given, every rank's does.
  using Counts = std::function<bool(const v1::LocalRank&)>;
  // A step committed by a generation this incarnation did not run (or a vote finished, as
  // above) becomes the committed one, as the ranks that `count` report it. True when it is a
  // finished vote.
  bool CatchUp(const Pods& pods, bool finish_votes, int64_t replica_ranks,
               const Counts& count = nullptr);
  // The process restarted since the last commit: it holds no vote of its own.
  void Restarted(int64_t pod, uint32_t local) { restarted_since_commit_.insert({pod, local}); }

  // Whether a rank holds the state at the committed step, as far as the manager knows: its
  // reports say it applied or heard that commit (its agent counts a trainer computing a step as
  // holding the one before), or voted for the step in the generation that committed it; or it is
  // a rank of the running generation `running` (`running_mark`), on the pod that was in it
  // (`same_pod`), that committed the step or resumed after it holding it, its process not
  // restarted since.
  bool Holds(int64_t pod, uint32_t local, const Agent& a, const RankLayout& running,
             bool same_pod, const CommitMark& running_mark) const;

  int64_t MedianStepMs() const;

 private:
  struct KnownCommit {
    int64_t step;
    CommitMark mark;
    bool finished_vote;  // the step is a vote finished here, not one heard committed
  };
  KnownCommit Known(const Pods& pods, bool finish_votes, int64_t replica_ranks,
                    const Counts& count = nullptr) const;

  int64_t step_ = -1;    // the committed step
  CommitMark mark_{0, 0};  // who committed it; (0, 0) when it was heard from agents
  // The vote of the step in flight.
  int64_t vote_step_ = -1;
  std::vector<bool> voted_;
  size_t voted_count_ = 0;  // of voted_ set: a vote is O(its ranks), not O(the generation's)
  std::vector<uint64_t> checksums_;
  bool vote_ok_ = true;
  // A step every rank voted for whose commit waits for the decision maker's lease
  // (Decisions::WhyNoCommit), in the generation it was voted in; -1: none.
  int64_t held_step_ = -1;
  uint64_t held_generation_ = 0;
  // (pod, local) whose process restarted since the last commit.
  std::set<std::pair<int64_t, uint32_t>> restarted_since_commit_;
  std::deque<int64_t> step_times_ms_;  // recent commit intervals
  int64_t last_commit_ms_ = -1;
};

}  // namespace regroup::manager
