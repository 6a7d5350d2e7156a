// The wall clock of the manager and the coordinator. Decisions never read it themselves: it is
// read at the edge (a server's tick, a message's arrival) and passed in.
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

}  // namespace regroup
