// SPDX-License-Identifier: Apache-2.0
// The manager's Prometheus metrics, kept and written out by prometheus-cpp (its core library:
// the registry, the metric kinds and the text format; the manager's own HTTP server serves the
// text). Every name, unit and label is in the table of docs/operations.md ("Metrics"): base
// units (seconds), counters ending in _total, every sample labelled with the job.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "manager/job_control.h"

namespace regroup::manager {

class ManagerMetrics {
 public:
  explicit ManagerMetrics(const std::string& job_id);

  // A timing the job control measured (JobControl::OnTiming), into its histogram.
  void Observe(JobControl::Timing timing, double seconds);

  // What the server knows beside the job control.
  struct Server {
    uint64_t agents_connected = 0;
    uint64_t messages = 0;
    uint64_t refusals = 0;
  };
  // The text exposition (format 0.0.4) of every metric, the gauges and counters read from `job`
  // now.
  std::string Text(const JobControl& job, const Server& server);

 private:
  prometheus::Gauge& Gauge(const std::string& name, const std::string& help);
  prometheus::Family<prometheus::Counter>& Counters(const std::string& name,
                                                    const std::string& help);
  // Brings a counter to `value` (the job control counts; a counter only goes up).
  static void CountTo(prometheus::Counter& counter, double value);

  std::string job_id_;
  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  std::map<std::string, prometheus::Gauge*> gauges_;
  std::map<std::string, prometheus::Family<prometheus::Counter>*> counters_;
  prometheus::Histogram* recovery_;
  prometheus::Histogram* vote_round_trip_;
  prometheus::Histogram* detection_;
};

}  // namespace regroup::manager
