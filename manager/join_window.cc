// SPDX-License-Identifier: Apache-2.0
#include "manager/join_window.h"

#include <algorithm>

#include "plugin/engine.h"

namespace regroup::manager {

void JoinWindow::OnRecord(std::vector<JobRecord::Member> members) {
  members_ = std::move(members);
  majority_reported_ = false;
}

std::optional<std::string> JoinWindow::MajorityMissing(const Pods& pods, int64_t now) {
  uint32_t back = 0, needed_of = 0;
  if (!members_.empty()) {
    needed_of = static_cast<uint32_t>(members_.size());
    for (const auto& m : members_) {
      if (m.node_rank < 0 || m.node_rank >= static_cast<int64_t>(pods.size())) continue;
      const Agent& a = pods[m.node_rank];
      back += a.connected && a.state != AgentState::kLost &&
              PodOfUid(a.pod_uid) == PodOfUid(m.uid);
    }
  } else {
    for (const Agent& a : pods.all()) {
      needed_of = std::max(needed_of, a.last_generation_agents);
      // One with a failed process is still with this manager, not with another one.
      back += a.connected && a.state != AgentState::kLost;
    }
  }
  if (needed_of == 0 || back * 2 > needed_of) return std::nullopt;
  const std::string what = "only " + std::to_string(back) + " of the last generation's " +
                           std::to_string(needed_of) + " pods " +
                           (members_.empty() ? "registered" : "on record came back");
  if (!majority_reported_) {
    majority_reported_ = true;
    log_.Add(now, "error", what + ": waiting for a majority before forming a generation");
  }
  return what;
}

}  // namespace regroup::manager
