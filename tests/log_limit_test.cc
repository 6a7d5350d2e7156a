// SPDX-License-Identifier: Apache-2.0
#include "common/log_limit.h"

#include <gtest/gtest.h>

namespace regroup {
namespace {

TEST(LogLimit, OneLinePerIntervalAndTheNextSaysHowManyWereHeldBack) {
  LogLimit limit(std::chrono::seconds(1));
  const auto t0 = LogLimit::Clock::time_point{} + std::chrono::hours(1);
  ASSERT_EQ(limit.Allow(t0), 0u) << "the first line is logged";
  for (int i = 1; i <= 1000; ++i)
    EXPECT_FALSE(limit.Allow(t0 + std::chrono::microseconds(i * 900)).has_value());
  EXPECT_EQ(limit.Allow(t0 + std::chrono::seconds(1)), 1000u);
  EXPECT_FALSE(limit.Allow(t0 + std::chrono::milliseconds(1500)).has_value());
  EXPECT_EQ(limit.Allow(t0 + std::chrono::seconds(5)), 1u);
}

}  // namespace
}  // namespace regroup
