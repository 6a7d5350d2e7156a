// SPDX-License-Identifier: Apache-2.0
#include "manager/generations.h"

#include <algorithm>

#include "plugin/sizing.h"

namespace regroup::manager {

void Generations::Next(const std::vector<int64_t>& replicas, const std::vector<int64_t>& micro,
                       int64_t micro_total, const Pods& pods, const RankLayout::Holds& holds) {
  for (const Agent& a : pods.all())
    for (const auto& lr : a.ranks)
      if (lr.generation() <= kMaxGeneration) number_ = std::max(number_, lr.generation());
  ++number_;
  for (size_t n = 0; n < pods.size(); ++n) uids_[n] = pods[static_cast<int64_t>(n)].pod_uid;
  running_ = RankLayout::Of(replicas, replica_ranks_, pods_, ranks_per_pod_, holds);
  microbatches_ = !micro.empty() ? micro
                  : micro_total > 0
                      ? SpreadMicroBatches(micro_total, static_cast<int64_t>(replicas.size()))
                      : std::vector<int64_t>();
  begin_.assign(replicas.size(), 0);
  for (size_t k = 1; k < microbatches_.size() && k < begin_.size(); ++k)
    begin_[k] = begin_[k - 1] + microbatches_[k - 1];
}

v1::ManagerMessage Generations::Start(int64_t pod, const v1::GenerationPlan& plan,
                                      uint64_t directive_id) {
  v1::ManagerMessage m;
  auto* start = m.mutable_start();
  start->set_directive_id(directive_id);
  *start->mutable_plan() = plan;
  // The pod's own ranks, in the order of their global ranks (not a walk over every rank of the
  // job for each pod: at 8,192 pods of 8 ranks that was half a billion steps a generation).
  const std::vector<RankPlace>& places = running_.places();
  std::vector<uint32_t> ranks = running_.RanksOf(pod);
  std::sort(ranks.begin(), ranks.end());
  for (const uint32_t g : ranks) {
    auto* ra = start->mutable_plan()->add_ranks();
    ra->set_local_rank(places[g].local_rank);
    ra->set_rank(static_cast<uint32_t>(g));
    ra->set_replica(places[g].replica);
    if (!microbatches_.empty()) {
      ra->set_microbatch_begin(static_cast<uint64_t>(begin_[places[g].replica]));
      ra->set_microbatch_count(static_cast<uint64_t>(microbatches_[places[g].replica]));
    }
  }
  starts_[static_cast<size_t>(pod)] = m;
  return m;
}

}  // namespace regroup::manager
