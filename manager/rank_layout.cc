// SPDX-License-Identifier: Apache-2.0
#include "manager/rank_layout.h"

namespace regroup::manager {

RankLayout RankLayout::Of(const std::vector<int64_t>& replicas, int64_t replica_ranks,
                          int64_t pods, int64_t ranks_per_pod, const Holds& holds) {
  RankLayout out;
  out.replicas_ = replicas;
  out.rank_of_.assign(static_cast<size_t>(pods),
                      std::vector<int32_t>(static_cast<size_t>(ranks_per_pod), -1));
  for (size_t k = 0; k < replicas.size(); ++k)
    for (int64_t local = 0; local < replica_ranks; ++local) {
      const int64_t global = replicas[k] * replica_ranks + local;
      const int64_t pod = global / ranks_per_pod;
      const auto at = static_cast<uint32_t>(global % ranks_per_pod);
      out.rank_of_[static_cast<size_t>(pod)][at] = static_cast<int32_t>(out.places_.size());
      out.places_.push_back({pod, at, static_cast<uint32_t>(k), !holds(pod, at)});
    }
  return out;
}

int64_t RankLayout::RankOf(int64_t pod, uint32_t local_rank) const {
  if (pod < 0 || static_cast<size_t>(pod) >= rank_of_.size()) return -1;
  const auto& locals = rank_of_[static_cast<size_t>(pod)];
  return local_rank < locals.size() ? locals[local_rank] : -1;
}

std::vector<uint32_t> RankLayout::RanksOf(int64_t pod) const {
  std::vector<uint32_t> ranks;
  if (pod < 0 || static_cast<size_t>(pod) >= rank_of_.size()) return ranks;
  for (int32_t r : rank_of_[static_cast<size_t>(pod)])
    if (r >= 0) ranks.push_back(static_cast<uint32_t>(r));
  return ranks;
}

std::set<int64_t> RankLayout::Pods() const {
  std::set<int64_t> pods;
  for (const RankPlace& p : places_) pods.insert(p.pod);
  return pods;
}

}  // namespace regroup::manager
