// SPDX-License-Identifier: Apache-2.0
// The clocks of the manager and the coordinator. Decisions never read the wall clock themselves:
// it is read at the edge (a server's tick, a message's arrival) and passed in. Leases count on
// the steady one, which no step of the wall clock moves.
#pragma once

#include <chrono>
#include <cstdint>

namespace regroup {

// Milliseconds since the Unix epoch.
inline int64_t WallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Milliseconds of a monotonic clock (since an unspecified start).
inline int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace regroup
