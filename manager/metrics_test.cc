// SPDX-License-Identifier: Apache-2.0
// The /metrics text through prometheus-cpp: base units, the histograms, the build's version, and
// a hostile job id that cannot inject a line.
#include "manager/metrics.h"

#include <gtest/gtest.h>

#include "common/version.h"

namespace regroup::manager {
namespace {

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::unique_ptr<JobControl> Job(const std::string& id, uint64_t epoch) {
  JobSpec spec;
  spec.id = id;
  spec.pods = 1;
  spec.processes_per_pod = 1;
  auto resolved = spec.Resolve();
  JobControlOptions options;
  options.epoch = epoch;
  return std::make_unique<JobControl>(spec, resolved.config, options,
                                      std::make_unique<EmbeddedDecisions>(spec));
}

TEST(ManagerMetrics, TimingsAreHistogramsInSecondsBesideTheBuildInfo) {
  auto job = Job("ns/a", 1'796'100'000'000);
  ManagerMetrics metrics(job->spec().id);
  metrics.Observe(JobControl::Timing::kRecovery, 4.5);
  metrics.Observe(JobControl::Timing::kRecovery, 50);
  metrics.Observe(JobControl::Timing::kVoteRoundTrip, 0.003);
  metrics.Observe(JobControl::Timing::kFaultDetection, 1.5);
  const std::string text = metrics.Text(*job, {2, 10, 1});
  // A sample of this job: NAME{regroup_job="ns/a"LABELS} VALUE.
  auto sample = [](const std::string& name, const std::string& labels, const std::string& value) {
    return name + "{regroup_job=\"ns/a\"" + labels + "} " + value + "\n";
  };
  EXPECT_TRUE(Contains(text, "# TYPE regroup_recovery_seconds histogram\n")) << text;
  EXPECT_TRUE(Contains(text, sample("regroup_recovery_seconds_bucket", ",le=\"2\"", "0"))) << text;
  EXPECT_TRUE(Contains(text, sample("regroup_recovery_seconds_bucket", ",le=\"5\"", "1"))) << text;
  EXPECT_TRUE(Contains(text, sample("regroup_recovery_seconds_bucket", ",le=\"+Inf\"", "2")))
      << text;
  EXPECT_TRUE(Contains(text, sample("regroup_recovery_seconds_count", "", "2"))) << text;
  EXPECT_TRUE(Contains(text, sample("regroup_recovery_seconds_sum", "", "54.5"))) << text;
  EXPECT_TRUE(
      Contains(text, sample("regroup_vote_round_trip_seconds_bucket", ",le=\"0.005\"", "1")))
      << text;
  EXPECT_TRUE(Contains(text, sample("regroup_fault_detection_seconds_count", "", "1"))) << text;
  EXPECT_TRUE(Contains(text, std::string("regroup_build_info{regroup_job=\"ns/a\",version=\"") +
                                 REGROUP_VERSION_STRING + "\"} 1\n"))
      << text;
  EXPECT_TRUE(Contains(text, sample("regroup_last_recovery_seconds", "", "0"))) << text;
  EXPECT_FALSE(Contains(text, "_ms")) << "base units only: " << text;
  EXPECT_TRUE(Contains(text, sample("regroup_epoch", "", "1796100000000"))) << "printed whole";
  EXPECT_TRUE(Contains(text, sample("regroup_agents_connected", "", "2"))) << text;
  EXPECT_TRUE(Contains(text, "# TYPE regroup_messages_total counter\n")) << text;
  EXPECT_TRUE(Contains(text, sample("regroup_messages_total", "", "10"))) << text;
  // A second scrape counts on from the first: counters never go back.
  const std::string again = metrics.Text(*job, {0, 15, 1});
  EXPECT_TRUE(Contains(again, sample("regroup_messages_total", "", "15"))) << again;
  EXPECT_TRUE(Contains(again, sample("regroup_refusals_total", "", "1"))) << again;
}

// Before: the job id went into the labels as it was (a quote and a newline injected a metric
// line).
TEST(ManagerMetrics, AJobIdWithAQuoteAndANewlineCannotInjectALine) {
  auto job = Job("ns/a\"} 1\nregroup_injected{x=\"\\", 3);
  ManagerMetrics metrics(job->spec().id);
  const std::string text = metrics.Text(*job, {});
  EXPECT_FALSE(Contains(text, "\nregroup_injected")) << text;
  EXPECT_TRUE(Contains(
      text, "regroup_epoch{regroup_job=\"ns/a\\\"} 1\\nregroup_injected{x=\\\"\\\\\"} 3\n"))
      << text;
}

}  // namespace
}  // namespace regroup::manager
