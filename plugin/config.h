// SPDX-License-Identifier: Apache-2.0
// The configuration a job carries: one table of every key (MindCluster's and Regroup's), and
// the resolution of a job's labels, annotations and environment into a validated JobConfig.
//
// The table is the single source of truth: the validator, `regroupctl keys` (which prints the
// configuration reference, docs/configuration.md) and the tests all read it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace regroup {

// The largest job the engine takes: pods, and processes per pod.
inline constexpr int64_t kMaxPods = 100000;
inline constexpr int64_t kMaxProcessesPerPod = 1024;

// The recovery ladder, cheapest first (MindCluster's order).
enum class Strategy : uint8_t { kRetry, kRecoverInPlace, kRecover, kElasticTraining, kDump, kExit };
inline constexpr int kStrategyCount = 6;
std::optional<Strategy> ParseStrategy(std::string_view name);

enum class FaultScheduling : int64_t { kOff = 0, kGrace = 1, kForce = 2 };
enum class ProcessRecover : int64_t { kOff = 0, kPause = 1, kOn = 2 };

// Where a key is read from.
enum class KeySource : uint8_t { kLabel, kAnnotation, kEnv };
// Who defines a key. A MindCluster key with a bad value falls back as MindCluster does, with a
// warning; a Regroup key with a bad value fails validation.
enum class KeyOwner : uint8_t { kMindCluster, kRegroup };
enum class KeyType : uint8_t { kEnum, kInt, kBool, kStrategies };

struct JobConfig;

struct KeySpec {
  std::string_view name;
  KeySource source;
  KeyOwner owner;
  KeyType type;
  int64_t min;                    // kInt: inclusive range
  int64_t max;
  std::string_view enum_values;   // kEnum: values separated by '|', in the enum's order
  std::string_view default_text;  // as shown in the docs
  int64_t default_value;          // kEnum: index; kBool: 0/1; kStrategies: bit mask
  int64_t JobConfig::*field;
  std::string_view meaning;
};

// Every key a job may carry, in documentation order.
std::span<const KeySpec> ConfigKeys();
const KeySpec* FindKey(std::string_view name);
std::string_view SourceName(KeySource source);
// A resolved value as its key's documentation writes it ("force", "true", "recover,exit").
std::string KeyValueText(const KeySpec& key, int64_t value);

// A job's resolved configuration. Fields are int64_t so that one table can drive them; the
// typed accessors below say what they mean.
struct JobConfig {
  // MindCluster's keys.
  int64_t fault_scheduling = 0;
  int64_t process_recover = 0;
  int64_t pod_rescheduling = 0;
  int64_t strategies = 0;  // bit mask over Strategy
  int64_t wait_reschedule_timeout_s = 270;
  int64_t mindio_wait_s = 30;
  int64_t fault_retry_times = 0;
  // Regroup's keys.
  int64_t tensor_parallel = 1;
  int64_t pipeline_parallel = 1;
  int64_t min_data_parallel = 1;
  int64_t processes_per_pod = 1;  // from the job spec
  int64_t global_batch_size = 0;  // 0: not set
  int64_t micro_batch_size = 0;   // 0: not set
  int64_t prefer_elastic = 0;
  int64_t survivors_continue = 1;
  int64_t even_split = 0;
  int64_t heartbeat_interval_ms = 100;
  int64_t liveness_misses = 5;
  int64_t hang_step_factor = 10;
  int64_t hang_timeout_min_s = 30;
  int64_t collective_timeout_s = 600;
  int64_t report_window_ms = 200;
  int64_t manager_failover_s = 5;
  int64_t recovery_budget = 10;
  int64_t recovery_window_s = 3600;
  int64_t backoff_limit = 0;  // 0: not set
  int64_t scale_out_backoff_s = 10;
  int64_t node_avoid_s = 600;
  int64_t checksum_interval = 100;
  int64_t checkpoint_interval = 0;

  FaultScheduling fault_scheduling_mode() const {
    return static_cast<FaultScheduling>(fault_scheduling);
  }
  ProcessRecover process_recover_mode() const {
    return static_cast<ProcessRecover>(process_recover);
  }
  bool allows(Strategy s) const { return (strategies >> static_cast<int>(s)) & 1; }
  int64_t replica_ranks() const { return tensor_parallel * pipeline_parallel; }
  // Process-level recovery is in use: the ladder above `exit` is available.
  bool recovery_on() const {
    return fault_scheduling_mode() != FaultScheduling::kOff &&
           process_recover_mode() != ProcessRecover::kOff;
  }
  // How long `recover` waits for a replacement, in ms; nullopt when no wait applies (the
  // wait-and-replace step of the ladder is not allowed). MINDIO_WAIT_MINDX_TIME minus 10 s when
  // `recover` is not allowed but `elastic-training` and rescheduling are (0 at its lower edge).
  std::optional<int64_t> replacement_wait_ms() const;
};

inline constexpr int64_t kDecisionTimeBudgetMs = 1000;
inline constexpr std::string_view kRegroupKeyPrefix = "regroup.io/";

// One problem found by the validator.
struct Problem {
  enum class Severity : uint8_t { kWarning, kError };
  Severity severity;
  std::string key;  // the key (or "volcano.spec.policies", ...) the problem is about
  std::string value;
  std::string message;  // one sentence: what, to what, and what is used or allowed
};

// What a Volcano Job adds to the job spec, when known: checked by the validator.
struct VolcanoFacts {
  struct Policy {
    std::string event;   // PodEvicted, PodFailed, Unknown, *, ...
    std::string action;  // RestartJob, AbortJob, ...
    std::string where;   // "spec.policies[0]" or "tasks[worker].policies[1]"
    bool manager_task = false;  // a policy of a manager task (it applies to no training pod)
  };
  std::optional<int64_t> min_available;
  int64_t manager_pods = 0;  // pods of the job that are not training pods
  std::vector<Policy> policies;
  // Whether every training pod learns its node rank, the index the scheduler names it by: the
  // env job plugin (VC_TASK_INDEX), or PET_NODE_RANK, VC_TASK_INDEX or --node-rank in every
  // training container. Unknown when the job was not read from a Volcano Job's document.
  std::optional<bool> node_ranks_given;
  // The training tasks whose pods take their node rank from VC_TASK_INDEX (the env plugin, or
  // VC_TASK_INDEX in the env) with no PET_NODE_RANK or --node-rank: each numbers its pods from
  // 0, so two of them claim the same node ranks.
  std::vector<std::string> task_index_ranked;
};

struct ResolvedConfig {
  JobConfig config;
  std::vector<Problem> problems;
  bool ok() const;
};

// Resolves and validates a job's keys. `pods` is the number of training pods.
// `processes_per_pod` come from the job spec, not from a key.
ResolvedConfig ResolveConfig(const std::map<std::string, std::string>& labels,
                             const std::map<std::string, std::string>& annotations,
                             const std::map<std::string, std::string>& env, int64_t pods,
                             int64_t processes_per_pod, const std::optional<VolcanoFacts>& volcano);

// The fewest pods a job of `pods` training pods (and `manager_pods`) runs on once it scaled in
// as far as regroup.io/min-data-parallel allows: the Volcano Job's minAvailable that lets it keep
// running then. 0 when the job never scales in (recovery off, or elastic-training not allowed).
int64_t ElasticMinAvailable(const JobConfig& c, int64_t pods, int64_t manager_pods);

// The configuration reference's table (docs/configuration.md), generated from the table
// (Markdown).
std::string ConfigTableMarkdown();

}  // namespace regroup
