// SPDX-License-Identifier: Apache-2.0
#include "manager/metrics.h"

#include <prometheus/text_serializer.h>

#include "common/version.h"

namespace regroup::manager {

namespace {

prometheus::Histogram* MakeHistogram(prometheus::Registry& registry, const std::string& job_id,
                                     const std::string& name, const std::string& help,
                                     prometheus::Histogram::BucketBoundaries buckets) {
  return &prometheus::BuildHistogram()
              .Name(name)
              .Help(help)
              .Register(registry)
              .Add({{"regroup_job", job_id}}, std::move(buckets));
}

}  // namespace

ManagerMetrics::ManagerMetrics(const std::string& job_id) : job_id_(job_id) {
  prometheus::BuildGauge()
      .Name("regroup_build_info")
      .Help("Always 1; the labels name the build of regroup-manager.")
      .Register(*registry_)
      .Add({{"regroup_job", job_id_}, {"version", REGROUP_VERSION_STRING}})
      .Set(1);
  recovery_ = MakeHistogram(
      *registry_, job_id_, "regroup_recovery_seconds",
      "From a generation's abort to the first step the next generation commits.",
      {1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800});
  vote_round_trip_ = MakeHistogram(
      *registry_, job_id_, "regroup_vote_round_trip_seconds",
      "From the first vote of a step reaching the manager to its outcome going out (how long "
      "the earliest rank waits on the manager, the slowest rank's lateness included).",
      {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30});
  detection_ = MakeHistogram(
      *registry_, job_id_, "regroup_fault_detection_seconds",
      "For the faults the manager finds by a timeout (a silent or disconnected pod, a hung or "
      "stalled rank): from the last sign of health it had to the fault.",
      {0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900});
}

void ManagerMetrics::Observe(JobControl::Timing timing, double seconds) {
  switch (timing) {
    case JobControl::Timing::kRecovery: recovery_->Observe(seconds); break;
    case JobControl::Timing::kVoteRoundTrip: vote_round_trip_->Observe(seconds); break;
    case JobControl::Timing::kFaultDetection: detection_->Observe(seconds); break;
  }
}

prometheus::Gauge& ManagerMetrics::Gauge(const std::string& name, const std::string& help) {
  auto& g = gauges_[name];
  if (!g)
    g = &prometheus::BuildGauge().Name(name).Help(help).Register(*registry_).Add(
        {{"regroup_job", job_id_}});
  return *g;
}

prometheus::Family<prometheus::Counter>& ManagerMetrics::Counters(const std::string& name,
                                                                 const std::string& help) {
  auto& c = counters_[name];
  if (!c) c = &prometheus::BuildCounter().Name(name).Help(help).Register(*registry_);
  return *c;
}

void ManagerMetrics::CountTo(prometheus::Counter& counter, double value) {
  if (value > counter.Value()) counter.Increment(value - counter.Value());
}

std::string ManagerMetrics::Text(const JobControl& r, const Server& server) {
  const auto& c = r.counters();
  Gauge("regroup_epoch", "The manager incarnation.").Set(static_cast<double>(r.epoch()));
  Gauge("regroup_generation", "The current generation n of (epoch, n).")
      .Set(static_cast<double>(r.generation()));
  Gauge("regroup_world_size", "Ranks in the current generation.")
      .Set(static_cast<double>(r.world_size()));
  Gauge("regroup_committed_step", "The last committed step (-1: none).")
      .Set(static_cast<double>(r.committed_step()));
  Gauge("regroup_training", "1 while a generation trains.").Set(r.training() ? 1 : 0);
  Gauge("regroup_job_stopped", "1 once the job stopped (finished or given up).")
      .Set(r.stopped() ? 1 : 0);
  Gauge("regroup_job_finished", "1 once training finished (every rank exited 0).")
      .Set(r.finished() ? 1 : 0);
  Gauge("regroup_agents_connected", "Agents with a live stream.")
      .Set(static_cast<double>(server.agents_connected));
  Gauge("regroup_step_seconds", "The median time between commits lately.").Set(c.step_seconds);
  Gauge("regroup_last_recovery_seconds",
        "From the last abort to the next generation's first commit (0: none yet).")
      .Set(c.last_recovery_ms / 1000.0);
  Gauge("regroup_last_commit_timestamp_seconds",
        "When the last step was committed, in seconds since the Unix epoch (0: none yet).")
      .Set(static_cast<double>(c.last_commit_ms) / 1000.0);
  auto& faults = Counters("regroup_faults_total", "Faults, by kind.");
  for (const auto& [kind, n] : c.faults)
    CountTo(faults.Add({{"regroup_job", job_id_}, {"kind", kind}}), static_cast<double>(n));
  auto& directives = Counters("regroup_directives_total", "Directives carried out, by kind.");
  for (const auto& [kind, n] : c.directives)
    CountTo(directives.Add({{"regroup_job", job_id_}, {"kind", kind}}), static_cast<double>(n));
  auto count = [&](const std::string& name, const std::string& help, uint64_t value) {
    CountTo(Counters(name, help).Add({{"regroup_job", job_id_}}), static_cast<double>(value));
  };
  count("regroup_generations_total", "Generations formed by this incarnation.", c.generations);
  count("regroup_commits_total", "Steps committed.", c.commits);
  count("regroup_manager_stalls_total",
        "Times the manager ran nothing for over half the liveness timeout (not counted against "
        "any pod).",
        c.manager_stalls);
  count("regroup_messages_total", "Agent messages received.", server.messages);
  count("regroup_refusals_total", "Sessions and messages refused.", server.refusals);
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace regroup::manager
