// SPDX-License-Identifier: Apache-2.0
// The fault script of `regroupctl simulate`: one timed event a line.
//
//   # time  subject  id     verb               [arguments]
//   10s     node     node-3 fails              NPU heartbeat lost
//   40s     node     node-3 recovers
//   200s    node     node-8 joins
//   30s     rank     5      exits|hangs|collective-error|device-error
//   30s     pod      2      fails
//
// Times take ms, s or m (`1.5s`, `250ms`, `2m`); lines are applied in time order, ties in file
// order. `#` starts a comment. Times reach at most 24 h (kMaxScriptMs): the simulation ticks
// every 100 ms up to the last event.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace regroup::cli {

inline constexpr int64_t kMaxScriptMs = 24LL * 3600 * 1000;

struct ScriptEvent {
  enum class Kind : uint8_t {
    kNodeFails,
    kNodeRecovers,
    kNodeJoins,
    kRankExits,
    kRankHangs,
    kRankCollectiveError,
    kRankDeviceError,
    kPodFails,
  };
  int64_t at_ms = 0;
  Kind kind;
  std::string node;  // node events
  int64_t id = -1;   // rank or pod
  std::string detail;
  int line = 0;
};

// Parses a script; the error names the line and what is wrong with it.
StatusOr<std::vector<ScriptEvent>> ParseFaultScript(std::string_view text);
// "250ms", "10s", "1.5s", "2m" -> milliseconds.
StatusOr<int64_t> ParseDuration(std::string_view text);
std::string DescribeScriptEvent(const ScriptEvent& e);

}  // namespace regroup::cli
