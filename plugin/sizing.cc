// SPDX-License-Identifier: Apache-2.0
#include "plugin/sizing.h"

namespace regroup {

std::vector<int64_t> Layout::PodsOfReplica(int64_t r) const {
  std::vector<int64_t> out;
  const int64_t first = PodOfRank(r, 0), last = PodOfRank(r, ranks_ - 1);
  for (int64_t p = first; p <= last; ++p) out.push_back(p);
  return out;
}

std::vector<int64_t> SpreadMicroBatches(int64_t micro_batches, int64_t dp) {
  std::vector<int64_t> out;
  if (dp <= 0) return out;
  out.reserve(static_cast<size_t>(dp));
  for (int64_t i = 0; i < dp; ++i) out.push_back(micro_batches / dp + (i < micro_batches % dp));
  return out;
}

std::optional<SizingPlan> PlanGeneration(const JobConfig& c, const Layout& layout,
                                         const std::vector<bool>& available, std::string* why) {
  std::vector<int64_t> complete;
  for (int64_t r = 0; r < layout.replicas(); ++r) {
    bool ok = true;
    for (int64_t p : layout.PodsOfReplica(r)) ok = ok && available[static_cast<size_t>(p)];
    if (ok) complete.push_back(r);
  }
  const int64_t micro_batches =
      c.global_batch_size > 0 ? c.global_batch_size / c.micro_batch_size : 0;
  int64_t dp = static_cast<int64_t>(complete.size());
  if (micro_batches > 0 && dp > micro_batches) dp = micro_batches;
  if (c.even_split && micro_batches > 0)
    while (dp > 0 && micro_batches % dp != 0) --dp;
  if (dp < c.min_data_parallel || dp == 0) {
    if (why) {
      *why = std::to_string(complete.size()) + " complete replica" +
             (complete.size() == 1 ? "" : "s") + " left";
      if (dp != static_cast<int64_t>(complete.size()))
        *why += " (" + std::to_string(dp) + " usable with regroup.io/even-split)";
      *why += ", below the minimum data-parallel degree " + std::to_string(c.min_data_parallel);
    }
    return std::nullopt;
  }
  SizingPlan plan;
  plan.dp = dp;
  plan.keep_replicas.assign(complete.begin(), complete.begin() + dp);
  std::vector<bool> hosts_kept(static_cast<size_t>(layout.pods()), false);
  for (int64_t r : plan.keep_replicas)
    for (int64_t p : layout.PodsOfReplica(r)) hosts_kept[static_cast<size_t>(p)] = true;
  for (int64_t p = 0; p < layout.pods(); ++p)
    if (available[static_cast<size_t>(p)] && !hosts_kept[static_cast<size_t>(p)])
      plan.standby_pods.push_back(p);
  if (micro_batches > 0) plan.microbatches = SpreadMicroBatches(micro_batches, dp);
  return plan;
}

}  // namespace regroup
