// SPDX-License-Identifier: Apache-2.0
// --log-format json: one JSON object a line, its message escaped whatever it holds.
#include "common/log_format.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <sstream>

namespace regroup {
namespace {

TEST(LogFormat, JsonIsOneObjectALineWithTimeLevelLoggerAndMessage) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  spdlog::logger unnamed("", sink);
  unnamed.set_formatter(JsonLogFormatter("regroup-manager"));
  spdlog::logger named("job", sink);
  named.set_formatter(JsonLogFormatter("regroup-manager", {{"pod", "uid-\"1"}}));
  unnamed.warn("a \"quoted\" word,\na second line\tand \xff a bad byte");
  named.info("plain");
  std::istringstream lines(out.str());
  std::string first, second, third;
  ASSERT_TRUE(std::getline(lines, first));
  ASSERT_TRUE(std::getline(lines, second));
  EXPECT_FALSE(std::getline(lines, third)) << "two messages, two lines: " << out.str();
  const auto a = nlohmann::json::parse(first);
  EXPECT_EQ(a["level"], "warning");
  EXPECT_EQ(a["logger"], "regroup-manager") << "the default logger has no name of its own";
  EXPECT_EQ(a["message"], "a \"quoted\" word,\na second line\tand \xef\xbf\xbd a bad byte");
  const std::string time = a["time"];
  ASSERT_EQ(time.size(), 24u) << time;  // 2026-12-06T10:20:00.123Z
  EXPECT_EQ(time[10], 'T');
  EXPECT_EQ(time.back(), 'Z');
  EXPECT_EQ(first.find("{\"time\":"), 0u) << "fields in a fixed order: " << first;
  const auto b = nlohmann::json::parse(second);
  EXPECT_EQ(b["logger"], "job");
  EXPECT_EQ(b["level"], "info");
  EXPECT_EQ(b["message"], "plain");
  EXPECT_EQ(b["pod"], "uid-\"1");
  EXPECT_LT(second.find("\"pod\""), second.find("\"message\"")) << second;
}

TEST(LogFormat, AnUnknownFormatIsRefusedNamingTheChoices) {
  EXPECT_EQ(*ParseLogFormat("json"), LogFormat::kJson);
  EXPECT_EQ(*ParseLogFormat("text"), LogFormat::kText);
  const auto bad = ParseLogFormat("JSON");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "\"JSON\" is not a log format: text or json");
}

}  // namespace
}  // namespace regroup
