// SPDX-License-Identifier: Apache-2.0
// Elastic sizing (docs/design.md, "Elastic sizing"): replicas of tensor x pipeline ranks line up
// with pods; after a loss the degree is the number of complete surviving replicas (at least the
// minimum); the global batch's micro-batches are spread over the replicas.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "plugin/config.h"

namespace regroup {

// How a job's replicas sit on its pods. Valid only for an aligned configuration (validated).
class Layout {
 public:
  Layout(int64_t pods, int64_t processes_per_pod, int64_t replica_ranks)
      : pods_(pods), ppp_(processes_per_pod), ranks_(replica_ranks) {}
  static Layout Of(const JobConfig& c, int64_t pods) {
    return Layout(pods, c.processes_per_pod, c.replica_ranks());
  }

  int64_t pods() const { return pods_; }
  int64_t replica_ranks() const { return ranks_; }
  int64_t replicas() const { return pods_ * ppp_ / ranks_; }
  // The pods holding replica r, in order.
  std::vector<int64_t> PodsOfReplica(int64_t r) const;
  // The pod holding local rank `local` of replica r.
  int64_t PodOfRank(int64_t r, int64_t local) const { return (r * ranks_ + local) / ppp_; }

 private:
  int64_t pods_, ppp_, ranks_;
};

// A plan for the next generation.
struct SizingPlan {
  int64_t dp = 0;
  std::vector<int64_t> keep_replicas;    // original replica indices, in data-parallel order
  std::vector<int64_t> standby_pods;     // healthy pods that host no kept replica
  std::vector<int64_t> microbatches;     // per kept replica; empty when no batch is configured
};

// Micro-batches of one step spread over dp replicas as evenly as possible: the first
// (m % dp) replicas get one more.
std::vector<int64_t> SpreadMicroBatches(int64_t micro_batches, int64_t dp);

// Plans the largest feasible generation from the pods available (available[p] true when pod p
// is healthy and registered), or says why none is feasible.
std::optional<SizingPlan> PlanGeneration(const JobConfig& c, const Layout& layout,
                                         const std::vector<bool>& available, std::string* why);

}  // namespace regroup
