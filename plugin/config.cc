// SPDX-License-Identifier: Apache-2.0
#include "plugin/config.h"

#include <array>
#include <charconv>
#include <sstream>

namespace regroup {
namespace {

constexpr std::array<std::string_view, kStrategyCount> kStrategyNames = {
    "retry", "recover-in-place", "recover", "elastic-training", "dump", "exit"};

constexpr int64_t Bit(Strategy s) { return int64_t{1} << static_cast<int>(s); }
constexpr int64_t kExitOnly = Bit(Strategy::kExit);

using S = KeySource;
using O = KeyOwner;
using T = KeyType;

// The table. Ranges are inclusive. Keep in documentation order.
constexpr KeySpec kKeys[] = {
    {"fault-scheduling", S::kLabel, O::kMindCluster, T::kEnum, 0, 0, "off|grace|force", "off", 0,
     &JobConfig::fault_scheduling,
     "How pods on a faulty node are removed: `force` at once, `grace` with the pod's grace "
     "period; `off` turns recovery off."},
    {"process-recover-enable", S::kLabel, O::kMindCluster, T::kEnum, 0, 0, "off|pause|on",
     "`on` if `recover-strategy` is set, else `off`", 0, &JobConfig::process_recover,
     "Process-level recovery on, paused (faults are held until it is `on` again or "
     "`MINDIO_WAIT_MINDX_TIME` runs out) or off."},
    {"pod-rescheduling", S::kLabel, O::kMindCluster, T::kEnum, 0, 0, "off|on", "off", 0,
     &JobConfig::pod_rescheduling,
     "When the job is rescheduled (process-level recovery off or exhausted): `on` replaces "
     "only the faulty pods (every pod when rank 0's is one of them), `off` every pod; either "
     "way every process restarts from the newest checkpoint."},
    {"recover-strategy", S::kAnnotation, O::kMindCluster, T::kStrategies, 0, 0, "", "exit",
     kExitOnly, &JobConfig::strategies,
     "Comma list of the strategies allowed: retry, recover-in-place, recover, elastic-training, "
     "dump, exit (`exit` is always implied)."},
    {"wait-reschedule-timeout", S::kAnnotation, O::kMindCluster, T::kInt, 30, 270, "", "270", 270,
     &JobConfig::wait_reschedule_timeout_s,
     "Seconds `recover` waits for a replacement before the next strategy."},
    {"MINDIO_WAIT_MINDX_TIME", S::kEnv, O::kMindCluster, T::kInt, 1, 3600, "", "30", 30,
     &JobConfig::mindio_wait_s,
     "Seconds trainers wait for a control-plane decision; without `recover` but with "
     "`elastic-training`, the replacement wait is this minus 10 s (0 at least)."},
    {"fault-retry-times", S::kLabel, O::kMindCluster, T::kInt, 0, 1000, "", "0", 0,
     &JobConfig::fault_retry_times,
     "Reschedules after a fault of the training's own (a process failed or hung, a collective "
     "failed); 0: such a fault exits when nothing else recovers it. A lost pod, node or device "
     "reschedules whatever this says. Also bounds every reschedule when "
     "`regroup.io/backoff-limit` is not set."},
    {"regroup.io/tensor-parallel", S::kAnnotation, O::kRegroup, T::kInt, 1, 4096, "", "1", 1,
     &JobConfig::tensor_parallel, "Tensor-parallel size."},
    {"regroup.io/pipeline-parallel", S::kAnnotation, O::kRegroup, T::kInt, 1, 4096, "", "1", 1,
     &JobConfig::pipeline_parallel,
     "Pipeline-parallel size. A replica is tensor x pipeline ranks; it must divide the "
     "processes per pod or be a multiple of them."},
    {"regroup.io/min-data-parallel", S::kAnnotation, O::kRegroup, T::kInt, 1, 65536, "", "1", 1,
     &JobConfig::min_data_parallel, "The smallest data-parallel degree the job may shrink to."},
    {"regroup.io/global-batch-size", S::kAnnotation, O::kRegroup, T::kInt, 1, int64_t{1} << 40, "",
     "not set", 0, &JobConfig::global_batch_size,
     "Samples per step; never changes with the number of replicas."},
    {"regroup.io/micro-batch-size", S::kAnnotation, O::kRegroup, T::kInt, 1, int64_t{1} << 40, "",
     "not set", 0, &JobConfig::micro_batch_size,
     "Samples per micro-batch; must divide the global batch size."},
    {"regroup.io/prefer-elastic", S::kAnnotation, O::kRegroup, T::kBool, 0, 1, "", "false", 0,
     &JobConfig::prefer_elastic,
     "Scale in at once instead of waiting for a replacement; scale out when it registers."},
    {"regroup.io/survivors-continue", S::kAnnotation, O::kRegroup, T::kBool, 0, 1, "", "true", 1,
     &JobConfig::survivors_continue,
     "When a process dies, the other data-parallel replicas train on at once while it restarts in "
     "place; its replica rejoins at a step boundary. false: they wait for it (recover-in-place)."},
    {"regroup.io/even-split", S::kAnnotation, O::kRegroup, T::kBool, 0, 1, "", "false", 0,
     &JobConfig::even_split,
     "Require the data-parallel degree to divide the number of micro-batches per step."},
    {"regroup.io/heartbeat-interval-ms", S::kAnnotation, O::kRegroup, T::kInt, 10, 10000, "",
     "100", 100, &JobConfig::heartbeat_interval_ms,
     "Milliseconds between heartbeats; stretched for a job of more than 2,000 pods, so that its "
     "manager hears at most 20,000 beats a second."},
    {"regroup.io/liveness-misses", S::kAnnotation, O::kRegroup, T::kInt, 2, 100, "", "5", 5,
     &JobConfig::liveness_misses,
     "Missed heartbeats after which a pod or rank is lost; up to 4 times as many for one whose "
     "beats lately came late (3 times its longest silence lately)."},
    {"regroup.io/hang-step-factor", S::kAnnotation, O::kRegroup, T::kInt, 2, 1000, "", "10", 10,
     &JobConfig::hang_step_factor,
     "A step is hung after this many median step times (and at least the hang minimum)."},
    {"regroup.io/hang-timeout-min-s", S::kAnnotation, O::kRegroup, T::kInt, 1, 86400, "", "30", 30,
     &JobConfig::hang_timeout_min_s, "The hang timeout's floor, in seconds."},
    {"regroup.io/collective-timeout-s", S::kAnnotation, O::kRegroup, T::kInt, 10, 86400, "", "600",
     600, &JobConfig::collective_timeout_s,
     "The collectives' own timeout, a last-resort backstop, in seconds."},
    {"regroup.io/report-window-ms", S::kAnnotation, O::kRegroup, T::kInt, 0, 10000, "", "200", 200,
     &JobConfig::report_window_ms, "How long fault reports are collected before one decision."},
    {"regroup.io/manager-failover-s", S::kAnnotation, O::kRegroup, T::kInt, 1, 600, "", "5", 5,
     &JobConfig::manager_failover_s, "Expected time for a restarted manager to take over."},
    {"regroup.io/recovery-budget", S::kAnnotation, O::kRegroup, T::kInt, 1, 1000, "", "10", 10,
     &JobConfig::recovery_budget,
     "Recoveries allowed per recovery window; one more escalates to `dump` or `exit`."},
    {"regroup.io/recovery-window-s", S::kAnnotation, O::kRegroup, T::kInt, 60, 604800, "", "3600",
     3600, &JobConfig::recovery_window_s, "The recovery budget's window, in seconds."},
    {"regroup.io/backoff-limit", S::kAnnotation, O::kRegroup, T::kInt, 0, 1000000, "",
     "0 (no limit)", 0, &JobConfig::backoff_limit,
     "Reschedules of the job allowed in all, whatever the fault (an AscendJob's "
     "`runPolicy.backoffLimit`, which `regroupctl convert` carries here); 0: "
     "`fault-retry-times` bounds them if set, else nothing does."},
    {"regroup.io/scale-out-backoff-s", S::kAnnotation, O::kRegroup, T::kInt, 0, 3600, "", "10", 10,
     &JobConfig::scale_out_backoff_s,
     "Delay before a scale-out, doubled for each earlier recovery in the window (the first "
     "scale-out is immediate)."},
    {"regroup.io/node-avoid-s", S::kAnnotation, O::kRegroup, T::kInt, 0, 86400, "", "600", 600,
     &JobConfig::node_avoid_s, "How long the job's pods avoid a node that failed, in seconds."},
    {"regroup.io/checksum-interval", S::kAnnotation, O::kRegroup, T::kInt, 0, 1000000, "", "100",
     100, &JobConfig::checksum_interval,
     "Steps between parameter-checksum comparisons of the replicas (0: never)."},
    {"regroup.io/checkpoint-interval", S::kAnnotation, O::kRegroup, T::kInt, 0, 1000000, "", "0", 0,
     &JobConfig::checkpoint_interval, "Steps between periodic checkpoints (0: never)."},
};

std::vector<std::string_view> Split(std::string_view text, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    size_t end = text.find(sep, start);
    out.push_back(text.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return out;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::optional<int64_t> ParseInt(std::string_view text) {
  text = Trim(text);
  int64_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

std::string AllowedText(const KeySpec& key) {
  switch (key.type) {
    case T::kInt:
      return "an integer from " + std::to_string(key.min) + " to " + std::to_string(key.max);
    case T::kBool:
      return "\"true\" or \"false\"";
    case T::kEnum: {
      std::string out;
      auto values = Split(key.enum_values, '|');
      for (size_t i = 0; i < values.size(); ++i) {
        if (i > 0) out += i + 1 == values.size() ? " or " : ", ";
        out += "\"" + std::string(values[i]) + "\"";
      }
      return out;
    }
    case T::kStrategies:
      return "a comma list of retry, recover-in-place, recover, elastic-training, dump, exit";
  }
  return "";
}

}  // namespace

std::string KeyValueText(const KeySpec& key, int64_t value) {
  switch (key.type) {
    case T::kInt:
      if (value == key.default_value && value < key.min) return std::string(key.default_text);
      return std::to_string(value);
    case T::kBool:
      return value ? "true" : "false";
    case T::kEnum:
      return std::string(Split(key.enum_values, '|').at(static_cast<size_t>(value)));
    case T::kStrategies: {
      std::string out;
      for (int i = 0; i < kStrategyCount; ++i) {
        if (!((value >> i) & 1)) continue;
        if (!out.empty()) out += ",";
        out += kStrategyNames[static_cast<size_t>(i)];
      }
      return out;
    }
  }
  return "";
}

namespace {

// Parses one raw value; nullopt when it is not one of the allowed values.
std::optional<int64_t> ParseValue(const KeySpec& key, std::string_view raw) {
  switch (key.type) {
    case T::kInt: {
      auto v = ParseInt(raw);
      if (!v || *v < key.min || *v > key.max) return std::nullopt;
      return v;
    }
    case T::kBool: {
      auto v = Trim(raw);
      if (v == "true") return 1;
      if (v == "false") return 0;
      return std::nullopt;
    }
    case T::kEnum: {
      auto values = Split(key.enum_values, '|');
      for (size_t i = 0; i < values.size(); ++i)
        if (Trim(raw) == values[i]) return static_cast<int64_t>(i);
      return std::nullopt;
    }
    case T::kStrategies: {
      int64_t mask = kExitOnly;
      for (auto item : Split(raw, ',')) {
        auto s = ParseStrategy(Trim(item));
        if (!s) return std::nullopt;
        mask |= Bit(*s);
      }
      return mask;
    }
  }
  return std::nullopt;
}

const std::map<std::string, std::string>& SourceMap(
    KeySource source, const std::map<std::string, std::string>& labels,
    const std::map<std::string, std::string>& annotations,
    const std::map<std::string, std::string>& env) {
  switch (source) {
    case S::kLabel:
      return labels;
    case S::kAnnotation:
      return annotations;
    case S::kEnv:
      return env;
  }
  return env;
}

class Checker {
 public:
  explicit Checker(std::vector<Problem>& problems) : problems_(problems) {}
  void Error(std::string key, std::string value, std::string message) {
    problems_.push_back({Problem::Severity::kError, std::move(key), std::move(value),
                         std::move(message)});
  }
  void Warning(std::string key, std::string value, std::string message) {
    problems_.push_back({Problem::Severity::kWarning, std::move(key), std::move(value),
                         std::move(message)});
  }

 private:
  std::vector<Problem>& problems_;
};

std::string Quote(std::string_view s) { return "\"" + std::string(s) + "\""; }

void CheckSizing(const JobConfig& c, int64_t pods, Checker& check) {
  const int64_t ranks = c.replica_ranks();
  const int64_t ppp = c.processes_per_pod;
  const std::string tp_pp = std::to_string(c.tensor_parallel) + "x" +
                            std::to_string(c.pipeline_parallel) + "=" + std::to_string(ranks);
  if (ppp < 1 || ppp > kMaxProcessesPerPod) {
    check.Error("processes_per_pod", std::to_string(ppp),
                "the job has " + std::to_string(ppp) + " processes per pod; it may have 1 to " +
                    std::to_string(kMaxProcessesPerPod));
    return;
  }
  if (pods < 1 || pods > kMaxPods) {
    check.Error("pods", std::to_string(pods),
                "the job has " + std::to_string(pods) + " pods; it may have 1 to " +
                    std::to_string(kMaxPods));
    return;
  }
  if (ranks % ppp != 0 && ppp % ranks != 0) {
    check.Error("regroup.io/tensor-parallel", tp_pp,
                "a replica of tensor x pipeline = " + tp_pp + " ranks does not line up with " +
                    std::to_string(ppp) +
                    " processes per pod: one must divide the other, so replicas and pods line up");
    return;
  }
  const int64_t world = pods * ppp;
  if (world % ranks != 0) {
    check.Error("regroup.io/tensor-parallel", tp_pp,
                "the job's " + std::to_string(world) + " ranks (" + std::to_string(pods) +
                    " pods x " + std::to_string(ppp) + ") are not a whole number of " + tp_pp +
                    "-rank replicas");
    return;
  }
  const int64_t dp = world / ranks;
  if (c.min_data_parallel > dp) {
    check.Error("regroup.io/min-data-parallel", std::to_string(c.min_data_parallel),
                "the minimum data-parallel degree " + std::to_string(c.min_data_parallel) +
                    " exceeds the job's full degree " + std::to_string(dp));
  }
  const bool has_g = c.global_batch_size > 0, has_m = c.micro_batch_size > 0;
  if (has_g != has_m) {
    check.Error(has_g ? "regroup.io/micro-batch-size" : "regroup.io/global-batch-size", "",
                "regroup.io/global-batch-size and regroup.io/micro-batch-size must be set "
                "together");
    return;
  }
  if (!has_g) {
    if (c.even_split)
      check.Error("regroup.io/even-split", "true",
                  "regroup.io/even-split needs regroup.io/global-batch-size and "
                  "regroup.io/micro-batch-size");
    return;
  }
  if (c.global_batch_size % c.micro_batch_size != 0) {
    check.Error("regroup.io/micro-batch-size", std::to_string(c.micro_batch_size),
                "the micro-batch size " + std::to_string(c.micro_batch_size) +
                    " does not divide the global batch size " +
                    std::to_string(c.global_batch_size));
    return;
  }
  const int64_t micro_batches = c.global_batch_size / c.micro_batch_size;
  if (micro_batches < dp) {
    check.Error("regroup.io/global-batch-size", std::to_string(c.global_batch_size),
                "a step has " + std::to_string(micro_batches) + " micro-batches, fewer than the " +
                    std::to_string(dp) + " replicas: every replica needs at least one");
  } else if (c.even_split && micro_batches % dp != 0) {
    check.Error("regroup.io/even-split", "true",
                "with regroup.io/even-split the " + std::to_string(dp) +
                    " replicas must divide the " + std::to_string(micro_batches) +
                    " micro-batches of a step");
  }
}

void CheckTimeouts(const JobConfig& c, Checker& check) {
  const int64_t liveness_ms = c.heartbeat_interval_ms * c.liveness_misses;
  const int64_t hang_ms = c.hang_timeout_min_s * 1000;
  const int64_t collective_ms = c.collective_timeout_s * 1000;
  if (liveness_ms >= hang_ms) {
    check.Error("regroup.io/hang-timeout-min-s", std::to_string(c.hang_timeout_min_s),
                "the liveness timeout (heartbeat interval " +
                    std::to_string(c.heartbeat_interval_ms) + " ms x " +
                    std::to_string(c.liveness_misses) + " misses = " + std::to_string(liveness_ms) +
                    " ms) must be below the hang timeout's floor (" + std::to_string(hang_ms) +
                    " ms)");
  }
  if (hang_ms >= collective_ms) {
    check.Error("regroup.io/collective-timeout-s", std::to_string(c.collective_timeout_s),
                "the collective timeout (" + std::to_string(c.collective_timeout_s) +
                    " s) must be above the hang timeout's floor (" +
                    std::to_string(c.hang_timeout_min_s) + " s)");
  }
  const int64_t needed_ms =
      c.report_window_ms + kDecisionTimeBudgetMs + c.manager_failover_s * 1000;
  if (c.mindio_wait_s * 1000 <= needed_ms) {
    check.Warning("MINDIO_WAIT_MINDX_TIME", std::to_string(c.mindio_wait_s),
                  "the decision wait MINDIO_WAIT_MINDX_TIME=" + std::to_string(c.mindio_wait_s) +
                      " s does not exceed the report window + decision time + manager failover (" +
                      std::to_string(needed_ms) +
                      " ms): a manager failover may outlast it and trainers would give up");
  }
}

bool IsWholeJobAction(std::string_view action) {
  return action == "RestartJob" || action == "AbortJob" || action == "TerminateJob";
}

// Volcano's job controller kills every pod of the task (or of the partition) the faulty pod
// belongs to: the survivors too (checked against vc-controller-manager, deploy/README.md).
bool IsWholeTaskAction(std::string_view action) {
  return action == "RestartTask" || action == "RestartPartition";
}

bool IsFaultEvent(std::string_view event) {
  return event == "PodEvicted" || event == "PodFailed" || event == "Unknown" || event == "*";
}

void CheckVolcano(const JobConfig& c, int64_t pods, const VolcanoFacts& v, Checker& check) {
  if (c.recovery_on()) {
    // Without a policy the job controller creates again the pod Regroup evicts, and nothing else.
    for (const auto& p : v.policies) {
      if (!IsFaultEvent(p.event)) continue;
      const std::string policy =
          "the Volcano policy " + p.where + " (" + p.event + " -> " + p.action + ")";
      if (IsWholeJobAction(p.action)) {
        check.Error(p.where, p.event + ": " + p.action,
                    policy + " would " + (p.action == "RestartJob" ? "restart" : "stop") +
                        " the whole job on a fault while recovery is on; remove it (the job "
                        "controller recreates the pod Regroup evicts without one)");
      } else if (IsWholeTaskAction(p.action) && !p.manager_task) {
        check.Error(p.where, p.event + ": " + p.action,
                    policy + " would restart every training pod of the faulty pod's " +
                        (p.action == "RestartTask" ? "task" : "partition") +
                        ", the survivors too, while recovery is on; remove it (the job "
                        "controller recreates the pod Regroup evicts without one)");
      } else if (p.action == "RestartPod" || IsWholeTaskAction(p.action)) {
        check.Warning(p.where, p.event + ": " + p.action,
                      policy + " counts each fault against spec.maxRetry, and Volcano fails "
                               "the whole job once they reach it; without it the job "
                               "controller recreates a deleted pod all the same");
      }
    }
  }
  if (v.node_ranks_given && !*v.node_ranks_given && v.manager_pods > 0 && pods > 1) {
    check.Warning("volcano.spec.plugins", "",
                  "no training pod is told its node rank (no env plugin in spec.plugins, no "
                  "PET_NODE_RANK, VC_TASK_INDEX or --node-rank): the manager would rank the "
                  "agents as they register while the scheduler names each pod by its index, and "
                  "a fault would be taken for another pod's; add `env: []` to spec.plugins");
  }
  if (v.task_index_ranked.size() > 1) {
    std::string tasks;
    for (const auto& t : v.task_index_ranked) tasks += (tasks.empty() ? "" : ", ") + t;
    check.Warning("volcano.spec.tasks", tasks,
                  "the training tasks " + tasks + " each number their pods from 0 "
                  "(VC_TASK_INDEX, the env plugin), so their agents claim the same node ranks "
                  "and the manager refuses all but the first; put the training pods in one task "
                  "(as regroupctl convert does), or give the pods of each task after the first "
                  "their node ranks past the tasks before it (--node-rank or PET_NODE_RANK)");
  }
  if (!v.min_available) return;
  const int64_t every_pod = pods + v.manager_pods;
  const int64_t elastic_min = ElasticMinAvailable(c, pods, v.manager_pods);
  if (elastic_min <= 0 || *v.min_available <= elastic_min || *v.min_available == every_pod) return;
  const std::string min = std::to_string(elastic_min);
  check.Error("volcano.spec.minAvailable", std::to_string(*v.min_available),
              "minAvailable " + std::to_string(*v.min_available) + " is " +
                  (*v.min_available > every_pod
                       ? "more than the job's " + std::to_string(every_pod) + " pods"
                       : "above the job's elastic minimum of " + min + " pods (for "
                         "regroup.io/min-data-parallel=" + std::to_string(c.min_data_parallel) +
                         (v.manager_pods > 0 ? ", the manager's included" : "") +
                         ") and below its " + std::to_string(every_pod) +
                         " pods: Volcano would stop the job when it scales in") +
                  "; set minAvailable to " + min + ", or to every pod (" +
                  std::to_string(every_pod) + ", as MindCluster does: the scheduler lowers it to " +
                  min + " once the job runs)");
}

}  // namespace

int64_t ElasticMinAvailable(const JobConfig& c, int64_t pods, int64_t manager_pods) {
  if (!c.recovery_on() || !c.allows(Strategy::kElasticTraining) || pods <= 0) return 0;
  const int64_t ranks = c.replica_ranks();
  const int64_t ppp = std::max<int64_t>(1, c.processes_per_pod);
  const int64_t pods_per_replica = ranks >= ppp ? ranks / ppp : 1;
  const int64_t replicas_per_pod = ranks >= ppp ? 1 : ppp / ranks;
  const int64_t min_pods = ranks >= ppp
                               ? c.min_data_parallel * pods_per_replica
                               : (c.min_data_parallel + replicas_per_pod - 1) / replicas_per_pod;
  return std::min(min_pods, pods) + manager_pods;
}

std::optional<Strategy> ParseStrategy(std::string_view name) {
  for (size_t i = 0; i < kStrategyNames.size(); ++i)
    if (kStrategyNames[i] == name) return static_cast<Strategy>(i);
  return std::nullopt;
}

std::span<const KeySpec> ConfigKeys() { return kKeys; }

const KeySpec* FindKey(std::string_view name) {
  for (const auto& key : kKeys)
    if (key.name == name) return &key;
  return nullptr;
}

std::string_view SourceName(KeySource source) {
  switch (source) {
    case S::kLabel:
      return "label";
    case S::kAnnotation:
      return "annotation";
    case S::kEnv:
      return "env";
  }
  return "";
}

std::optional<int64_t> JobConfig::replacement_wait_ms() const {
  if (allows(Strategy::kRecover)) return wait_reschedule_timeout_s * 1000;
  if (allows(Strategy::kElasticTraining) &&
      fault_scheduling_mode() != FaultScheduling::kOff) {
    return std::max<int64_t>(0, mindio_wait_s - 10) * 1000;
  }
  return std::nullopt;
}

bool ResolvedConfig::ok() const {
  for (const auto& p : problems)
    if (p.severity == Problem::Severity::kError) return false;
  return true;
}

ResolvedConfig ResolveConfig(const std::map<std::string, std::string>& labels,
                             const std::map<std::string, std::string>& annotations,
                             const std::map<std::string, std::string>& env, int64_t pods,
                             int64_t processes_per_pod,
                             const std::optional<VolcanoFacts>& volcano) {
  ResolvedConfig out;
  JobConfig& c = out.config;
  Checker check(out.problems);
  c.processes_per_pod = processes_per_pod;

  for (const auto& key : kKeys) {
    c.*key.field = key.default_value;
    const auto& source = SourceMap(key.source, labels, annotations, env);
    auto it = source.find(std::string(key.name));
    if (it == source.end()) continue;
    if (auto value = ParseValue(key, it->second)) {
      c.*key.field = *value;
      continue;
    }
    std::string what = std::string(SourceName(key.source)) + " " + std::string(key.name) + "=" +
                       Quote(it->second);
    if (key.owner == O::kRegroup) {
      check.Error(std::string(key.name), it->second,
                  what + " is invalid: it must be " + AllowedText(key));
    } else {
      check.Warning(std::string(key.name), it->second,
                    what + " is not allowed (" + AllowedText(key) + "); using " +
                        Quote(KeyValueText(key, key.default_value)) + " as MindCluster does");
    }
  }
  // Regroup-prefixed keys this version does not know are refused: a typo must not pass silently.
  for (const auto& [name, value] : annotations) {
    if (name.rfind(kRegroupKeyPrefix, 0) == 0 && !FindKey(name))
      check.Error(name, value,
                  "annotation " + name + " is not a Regroup key; see `regroupctl keys`");
  }
  for (const auto& [name, value] : labels) {
    if (name.rfind(kRegroupKeyPrefix, 0) == 0)
      check.Error(name, value,
                  "label " + name + " is not read: Regroup keys are annotations");
  }

  // MindCluster derives process-recover-enable=on from a recover-strategy.
  if (!labels.count("process-recover-enable") && annotations.count("recover-strategy"))
    c.process_recover = static_cast<int64_t>(ProcessRecover::kOn);
  if (c.fault_scheduling_mode() == FaultScheduling::kOff &&
      c.process_recover_mode() != ProcessRecover::kOff && c.strategies != kExitOnly) {
    check.Warning("fault-scheduling", labels.count("fault-scheduling")
                                          ? labels.at("fault-scheduling")
                                          : std::string(),
                  "label fault-scheduling is off or absent, so recovery is off and "
                  "recover-strategy \"" + KeyValueText(*FindKey("recover-strategy"), c.strategies) +
                      "\" is not used; set fault-scheduling to \"force\" or \"grace\"");
  }

  CheckSizing(c, pods, check);
  CheckTimeouts(c, check);
  if (volcano) CheckVolcano(c, pods, *volcano, check);
  return out;
}

std::string ConfigTableMarkdown() {
  std::ostringstream out;
  out << "| key | where | values | default | bad value |\n|---|---|---|---|---|\n";
  for (const auto& key : kKeys) {
    out << "| `" << key.name << "` | " << SourceName(key.source) << " | " << AllowedText(key)
        << " | " << key.default_text << " | "
        << (key.owner == O::kMindCluster ? "warning, default used" : "validation fails")
        << " |\n";
  }
  out << "\n";
  for (const auto& key : kKeys) out << "- `" << key.name << "`: " << key.meaning << "\n";
  return out.str();
}

}  // namespace regroup
