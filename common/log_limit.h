// SPDX-License-Identifier: Apache-2.0
// Rate-limited logging: a peer that is refused again and again (a zombie pod retrying, a flood
// of connections) must not fill the log or spend the server's time on it.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

namespace regroup {

// Allows one log line per `every`; counts the lines it held back in between.
class LogLimit {
 public:
  using Clock = std::chrono::steady_clock;
  explicit LogLimit(Clock::duration every) : every_(every) {}

  // Whether to log now. When it is, the number of lines held back since the last one (to say
  // "and N more"); std::nullopt when this one is held back too.
  std::optional<uint64_t> Allow(Clock::time_point now) {
    if (logged_ && now - last_ < every_) {
      ++held_;
      return std::nullopt;
    }
    logged_ = true;
    last_ = now;
    uint64_t held = held_;
    held_ = 0;
    return held;
  }

 private:
  Clock::duration every_;
  Clock::time_point last_{};
  bool logged_ = false;
  uint64_t held_ = 0;
};

}  // namespace regroup
