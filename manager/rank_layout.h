// SPDX-License-Identifier: Apache-2.0
// A generation's rank layout: the replicas it trains and where each of its global ranks runs
// (which pod, which of that pod's processes). The job control keeps two: the running
// generation's, and the one the decision maker knows (they differ while the survivors of a
// process crash train on in an interim generation).
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <vector>

namespace regroup::manager {

// Where a global rank runs.
struct RankPlace {
  int64_t pod = -1;          // the pod's index (the agent's node rank)
  uint32_t local_rank = 0;   // which of the pod's processes
  uint32_t replica = 0;      // the replica's position in the generation
  bool needs_state = false;  // it joined without the committed state: a peer sends it
};

class RankLayout {
 public:
  // Whether the process `local_rank` of pod `pod` holds the committed state.
  using Holds = std::function<bool(int64_t pod, uint32_t local_rank)>;

  RankLayout() = default;
  // The layout over `replicas` (original replica indices, in data-parallel order) of a job of
  // `pods` pods running `ranks_per_pod` processes each, `replica_ranks` ranks per replica.
  static RankLayout Of(const std::vector<int64_t>& replicas, int64_t replica_ranks, int64_t pods,
                       int64_t ranks_per_pod, const Holds& holds);

  const std::vector<int64_t>& replicas() const { return replicas_; }
  const std::vector<RankPlace>& places() const { return places_; }
  size_t size() const { return places_.size(); }
  // The global rank of a pod's process, or -1 when it has none in this layout.
  int64_t RankOf(int64_t pod, uint32_t local_rank) const;
  // The global ranks a pod holds, by local rank (none: a standby, a spare, or no layout yet).
  std::vector<uint32_t> RanksOf(int64_t pod) const;
  // The pods that hold a rank, in order.
  std::set<int64_t> Pods() const;

 private:
  std::vector<int64_t> replicas_;
  std::vector<RankPlace> places_;               // by global rank
  std::vector<std::vector<int32_t>> rank_of_;   // [pod][local rank] -> global rank or -1
};

}  // namespace regroup::manager
