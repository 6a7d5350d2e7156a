// SPDX-License-Identifier: Apache-2.0
// The generations this manager incarnation forms: the running one's number, rank layout,
// micro-batches and pods, and the StartGeneration each pod was sent (sent again to a pod that
// resumes its session after missing it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "manager/pods.h"
#include "manager/rank_layout.h"
#include "regroup/v1/wire.pb.h"

namespace regroup::manager {

// The largest generation number an agent's report is believed (2^53: exact in /status's JSON);
// a larger one is a bad report, and would wrap the next generation's number to 0 ("not known").
inline constexpr uint64_t kMaxGeneration = uint64_t{1} << 53;

class Generations {
 public:
  // A job of `pods` pods running `ranks_per_pod` processes each, `replica_ranks` ranks per
  // replica.
  Generations(int64_t pods, int64_t ranks_per_pod, int64_t replica_ranks)
      : pods_(pods), ranks_per_pod_(ranks_per_pod), replica_ranks_(replica_ranks),
        uids_(static_cast<size_t>(pods)), starts_(static_cast<size_t>(pods)) {}

  uint64_t number() const { return number_; }  // n of (epoch, n); 0: none formed yet
  const RankLayout& running() const { return running_; }
  const std::vector<int64_t>& microbatches() const { return microbatches_; }
  // Whether pod `pod` was in the running generation as `uid` (not replaced since).
  bool Had(int64_t pod, const std::string& uid) const {
    return uids_[static_cast<size_t>(pod)] == uid;
  }
  // The StartGeneration pod `pod` was sent last, if any.
  const std::optional<v1::ManagerMessage>& start(int64_t pod) const {
    return starts_[static_cast<size_t>(pod)];
  }

  // The next generation over `replicas` (original indices, in order), numbered past every
  // generation an agent reports (a restarted manager's agents come from another epoch's
  // generations: a late report of an old one is then always older than this). `micro`: the
  // micro-batches of each replica, if the directive says; else `micro_total` spread over them.
  // `holds`: whether a rank holds the committed state.
  void Next(const std::vector<int64_t>& replicas, const std::vector<int64_t>& micro,
            int64_t micro_total, const Pods& pods, const RankLayout::Holds& holds);
  // Pod `pod`'s StartGeneration of the running generation under `plan` (its ranks added), kept.
  v1::ManagerMessage Start(int64_t pod, const v1::GenerationPlan& plan, uint64_t directive_id);

 private:
  int64_t pods_, ranks_per_pod_, replica_ranks_;
  uint64_t number_ = 0;
  RankLayout running_;
  std::vector<int64_t> microbatches_;  // per replica; empty when no batch is configured
  std::vector<int64_t> begin_;         // each replica's first micro-batch
  std::vector<std::string> uids_;      // by pod: the pod in the running generation
  std::vector<std::optional<v1::ManagerMessage>> starts_;  // by pod
};

}  // namespace regroup::manager
