// SPDX-License-Identifier: Apache-2.0
// How long a silence proves a peer (a pod's agent, or a trainer beating its agent) gone.
//
// An overloaded machine delays a live peer's beats; a frozen or partitioned peer sends none. At
// the moment of deciding the two look the same, but their past does not: a peer whose own beats
// lately arrived far apart is given longer before its silence counts as a fault. The bound is
// the configured liveness timeout, stretched to kMargin times the longest silence the peer ended
// lately, and never more than kMaxStretch times the configured timeout. The margin is wide
// because the tail is long: under a busy loop per core (integration/overload.py) a healthy agent
// went silent for 547 ms when its longest silence yet had been 265 ms. A peer that beats on time
// keeps the configured timeout, so a frozen process on a quiet machine is found as fast as before.
//
// "Lately": the longest silence is halved every kHalfLifeMs, so a load spike long past stops
// stretching the timeout. Integers only, so that the simulation replays it exactly.
#pragma once

#include <algorithm>
#include <cstdint>

namespace regroup::manager {

class SilenceBound {
 public:
  static constexpr int64_t kMargin = 3;
  static constexpr int64_t kMaxStretch = 4;
  static constexpr int64_t kHalfLifeMs = 30000;

  // A silence of `silence_ms` ended at `now` (the peer was heard again).
  void Ended(int64_t silence_ms, int64_t now) {
    if (silence_ms > PeakMs(now)) {
      peak_ms_ = silence_ms;
      peak_at_ms_ = now;
    }
  }

  // The longest silence ended lately, halved for every half-life since.
  int64_t PeakMs(int64_t now) const {
    const int64_t halvings = (now - peak_at_ms_) / kHalfLifeMs;
    return halvings >= 62 ? 0 : peak_ms_ >> std::max<int64_t>(halvings, 0);
  }

  // How long a silence of this peer may last before it is a fault.
  int64_t TimeoutMs(int64_t liveness_ms, int64_t now) const {
    return std::clamp(kMargin * PeakMs(now), liveness_ms, kMaxStretch * liveness_ms);
  }

  void Reset() { *this = SilenceBound(); }

 private:
  int64_t peak_ms_ = 0;
  int64_t peak_at_ms_ = 0;
};

}  // namespace regroup::manager
