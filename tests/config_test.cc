// SPDX-License-Identifier: Apache-2.0
// The configuration table: each key with good, boundary and bad values; fallback warnings and
// errors with their exact messages.
#include <gtest/gtest.h>

#include "plugin/config.h"

namespace regroup {
namespace {

using Map = std::map<std::string, std::string>;

ResolvedConfig Resolve(Map labels, Map annotations, Map env = {}, int64_t pods = 4,
                       int64_t ppp = 2, std::optional<VolcanoFacts> volcano = std::nullopt) {
  return ResolveConfig(labels, annotations, env, pods, ppp, volcano);
}

std::vector<std::string> Messages(const ResolvedConfig& r, Problem::Severity severity) {
  std::vector<std::string> out;
  for (const auto& p : r.problems)
    if (p.severity == severity) out.push_back(p.message);
  return out;
}

TEST(Config, DefaultsWithoutKeysTurnRecoveryOff) {
  auto r = Resolve({}, {});
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(r.problems.empty());
  EXPECT_EQ(r.config.fault_scheduling_mode(), FaultScheduling::kOff);
  EXPECT_EQ(r.config.process_recover_mode(), ProcessRecover::kOff);
  EXPECT_FALSE(r.config.recovery_on());
  EXPECT_TRUE(r.config.allows(Strategy::kExit));
  EXPECT_FALSE(r.config.allows(Strategy::kRecover));
  EXPECT_EQ(r.config.wait_reschedule_timeout_s, 270);
  EXPECT_EQ(r.config.mindio_wait_s, 30);
}

TEST(Config, RecoverStrategyDerivesProcessRecoverOn) {
  auto r = Resolve({{"fault-scheduling", "force"}}, {{"recover-strategy", "recover,dump"}});
  EXPECT_TRUE(r.problems.empty());
  EXPECT_EQ(r.config.process_recover_mode(), ProcessRecover::kOn);
  EXPECT_TRUE(r.config.recovery_on());
  EXPECT_TRUE(r.config.allows(Strategy::kRecover));
  EXPECT_TRUE(r.config.allows(Strategy::kDump));
  EXPECT_TRUE(r.config.allows(Strategy::kExit)) << "exit is always implied";
  EXPECT_FALSE(r.config.allows(Strategy::kElasticTraining));
}

TEST(Config, ExplicitProcessRecoverWinsOverDerivation) {
  auto r = Resolve({{"fault-scheduling", "grace"}, {"process-recover-enable", "pause"}},
                   {{"recover-strategy", "recover"}});
  EXPECT_EQ(r.config.process_recover_mode(), ProcessRecover::kPause);
  r = Resolve({{"fault-scheduling", "grace"}, {"process-recover-enable", "off"}},
              {{"recover-strategy", "recover"}});
  EXPECT_EQ(r.config.process_recover_mode(), ProcessRecover::kOff);
  EXPECT_FALSE(r.config.recovery_on());
}

TEST(Config, WaitRescheduleTimeoutBoundaries) {
  for (auto [text, expected] : {std::pair{"30", 30}, std::pair{"270", 270}, std::pair{"100", 100}}) {
    auto r = Resolve({}, {{"wait-reschedule-timeout", text}});
    EXPECT_TRUE(r.problems.empty()) << text;
    EXPECT_EQ(r.config.wait_reschedule_timeout_s, expected);
  }
}

TEST(Config, WaitRescheduleTimeoutOutOfRangeFallsBackTo270WithWarning) {
  auto r = Resolve({}, {{"wait-reschedule-timeout", "500"}});
  EXPECT_TRUE(r.ok()) << "a MindCluster key never fails validation";
  EXPECT_EQ(r.config.wait_reschedule_timeout_s, 270);
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_EQ(r.problems[0].severity, Problem::Severity::kWarning);
  EXPECT_EQ(r.problems[0].key, "wait-reschedule-timeout");
  EXPECT_EQ(r.problems[0].message,
            "annotation wait-reschedule-timeout=\"500\" is not allowed (an integer from 30 to "
            "270); using \"270\" as MindCluster does");
  for (const char* bad : {"29", "271", "-1", "abc", "", "1e2", "30s"}) {
    auto b = Resolve({}, {{"wait-reschedule-timeout", bad}});
    EXPECT_EQ(b.config.wait_reschedule_timeout_s, 270) << bad;
    EXPECT_EQ(Messages(b, Problem::Severity::kWarning).size(), 1u) << bad;
  }
}

TEST(Config, MindioWaitTimeBoundariesAndFallback) {
  EXPECT_EQ(Resolve({}, {}, {{"MINDIO_WAIT_MINDX_TIME", "3600"}}).config.mindio_wait_s, 3600);
  auto low = Resolve({}, {}, {{"MINDIO_WAIT_MINDX_TIME", "1"}});
  EXPECT_EQ(low.config.mindio_wait_s, 1);
  auto bad = Resolve({}, {}, {{"MINDIO_WAIT_MINDX_TIME", "0"}});
  EXPECT_EQ(bad.config.mindio_wait_s, 30);
  EXPECT_EQ(Messages(bad, Problem::Severity::kWarning)[0],
            "env MINDIO_WAIT_MINDX_TIME=\"0\" is not allowed (an integer from 1 to 3600); using "
            "\"30\" as MindCluster does");
}

TEST(Config, BadMindClusterEnumsFallBackWithWarnings) {
  auto r = Resolve({{"fault-scheduling", "sometimes"}, {"process-recover-enable", "yes"},
                    {"pod-rescheduling", "maybe"}},
                   {{"recover-strategy", "recover,teleport"}});
  EXPECT_TRUE(r.ok());
  auto warnings = Messages(r, Problem::Severity::kWarning);
  ASSERT_GE(warnings.size(), 4u);
  EXPECT_EQ(warnings[0],
            "label fault-scheduling=\"sometimes\" is not allowed (\"off\", \"grace\" or "
            "\"force\"); using \"off\" as MindCluster does");
  EXPECT_EQ(warnings[3],
            "annotation recover-strategy=\"recover,teleport\" is not allowed (a comma list of "
            "retry, recover-in-place, recover, elastic-training, dump, exit); using \"exit\" as "
            "MindCluster does");
  EXPECT_FALSE(r.config.recovery_on());
}

TEST(Config, FaultSchedulingOffWithStrategiesWarnsThatRecoveryIsOff) {
  auto r = Resolve({}, {{"recover-strategy", "recover"}});
  auto warnings = Messages(r, Problem::Severity::kWarning);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0],
            "label fault-scheduling is off or absent, so recovery is off and recover-strategy "
            "\"recover,exit\" is not used; set fault-scheduling to \"force\" or \"grace\"");
}

TEST(Config, BadRegroupKeyFailsWithExactMessage) {
  auto r = Resolve({}, {{"regroup.io/min-data-parallel", "0"}});
  EXPECT_FALSE(r.ok());
  auto errors = Messages(r, Problem::Severity::kError);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0],
            "annotation regroup.io/min-data-parallel=\"0\" is invalid: it must be an integer from "
            "1 to 65536");
  auto b = Resolve({}, {{"regroup.io/prefer-elastic", "yes"}});
  EXPECT_EQ(Messages(b, Problem::Severity::kError)[0],
            "annotation regroup.io/prefer-elastic=\"yes\" is invalid: it must be \"true\" or "
            "\"false\"");
}

TEST(Config, EveryRegroupKeyAcceptsItsBoundsAndRefusesBeyond) {
  for (const auto& key : ConfigKeys()) {
    if (key.owner != KeyOwner::kRegroup || key.type != KeyType::kInt) continue;
    const std::string name(key.name);
    // Bounds are valid values on their own (cross-key checks may still object, e.g. timeouts).
    for (int64_t v : {key.min, key.max}) {
      auto r = Resolve({}, {{name, std::to_string(v)}});
      for (const auto& p : r.problems)
        EXPECT_FALSE(p.key == name && p.message.find("is invalid: it must be") != std::string::npos)
            << name << "=" << v << ": " << p.message;
    }
    for (int64_t v : {key.min - 1, key.max + 1}) {
      auto r = Resolve({}, {{name, std::to_string(v)}});
      EXPECT_FALSE(r.ok()) << name << "=" << v;
    }
  }
}

TEST(Config, UnknownRegroupAnnotationIsAnError) {
  auto r = Resolve({}, {{"regroup.io/min-data-paralel", "2"}});
  EXPECT_EQ(Messages(r, Problem::Severity::kError)[0],
            "annotation regroup.io/min-data-paralel is not a Regroup key; see `regroupctl keys`");
}

TEST(Config, MisalignedReplicaIsRefused) {
  // 3 ranks per replica against 2 processes per pod: neither divides the other.
  auto r = Resolve({}, {{"regroup.io/tensor-parallel", "3"}}, {}, 6, 2);
  EXPECT_EQ(Messages(r, Problem::Severity::kError)[0],
            "a replica of tensor x pipeline = 3x1=3 ranks does not line up with 2 processes per "
            "pod: one must divide the other, so replicas and pods line up");
  // 4 ranks per replica over 2-process pods: aligned, two pods a replica.
  EXPECT_TRUE(Resolve({}, {{"regroup.io/tensor-parallel", "2"}, {"regroup.io/pipeline-parallel", "2"}},
                      {}, 4, 2).ok());
  // 4 pods x 2 = 8 ranks is not a whole number of 8-rank... it is; 3 pods x 2 = 6 is not.
  auto r2 = Resolve({}, {{"regroup.io/tensor-parallel", "4"}}, {}, 3, 2);
  EXPECT_EQ(Messages(r2, Problem::Severity::kError)[0],
            "the job's 6 ranks (3 pods x 2) are not a whole number of 4x1=4-rank replicas");
}

TEST(Config, BatchRules) {
  EXPECT_TRUE(Resolve({}, {{"regroup.io/global-batch-size", "64"},
                           {"regroup.io/micro-batch-size", "4"}}).ok());
  EXPECT_EQ(Messages(Resolve({}, {{"regroup.io/global-batch-size", "64"}}),
                     Problem::Severity::kError)[0],
            "regroup.io/global-batch-size and regroup.io/micro-batch-size must be set together");
  EXPECT_EQ(Messages(Resolve({}, {{"regroup.io/global-batch-size", "64"},
                                  {"regroup.io/micro-batch-size", "5"}}),
                     Problem::Severity::kError)[0],
            "the micro-batch size 5 does not divide the global batch size 64");
  // 8 replicas (4 pods x 2) but only 4 micro-batches.
  EXPECT_EQ(Messages(Resolve({}, {{"regroup.io/global-batch-size", "16"},
                                  {"regroup.io/micro-batch-size", "4"}}),
                     Problem::Severity::kError)[0],
            "a step has 4 micro-batches, fewer than the 8 replicas: every replica needs at least "
            "one");
  EXPECT_EQ(Messages(Resolve({}, {{"regroup.io/global-batch-size", "36"},
                                  {"regroup.io/micro-batch-size", "3"},
                                  {"regroup.io/even-split", "true"}}),
                     Problem::Severity::kError)[0],
            "with regroup.io/even-split the 8 replicas must divide the 12 micro-batches of a step");
}

TEST(Config, TimeoutsOutOfOrderAreReported) {
  auto r = Resolve({}, {{"regroup.io/heartbeat-interval-ms", "10000"},
                        {"regroup.io/liveness-misses", "5"}});
  EXPECT_EQ(Messages(r, Problem::Severity::kError)[0],
            "the liveness timeout (heartbeat interval 10000 ms x 5 misses = 50000 ms) must be "
            "below the hang timeout's floor (30000 ms)");
  auto c = Resolve({}, {{"regroup.io/hang-timeout-min-s", "600"}});
  EXPECT_EQ(Messages(c, Problem::Severity::kError)[0],
            "the collective timeout (600 s) must be above the hang timeout's floor (600 s)");
  auto w = Resolve({}, {}, {{"MINDIO_WAIT_MINDX_TIME", "5"}});
  EXPECT_TRUE(w.ok());
  EXPECT_EQ(Messages(w, Problem::Severity::kWarning)[0],
            "the decision wait MINDIO_WAIT_MINDX_TIME=5 s does not exceed the report window + "
            "decision time + manager failover (6200 ms): a manager failover may outlast it and "
            "trainers would give up");
}

TEST(Config, ReplacementWaitFollowsTheLadder) {
  auto recover = Resolve({{"fault-scheduling", "force"}},
                         {{"recover-strategy", "recover,elastic-training"},
                          {"wait-reschedule-timeout", "60"}});
  EXPECT_EQ(recover.config.replacement_wait_ms(), 60000);
  auto elastic = Resolve({{"fault-scheduling", "force"}}, {{"recover-strategy", "elastic-training"}},
                         {{"MINDIO_WAIT_MINDX_TIME", "45"}});
  EXPECT_EQ(elastic.config.replacement_wait_ms(), 35000) << "MINDIO_WAIT_MINDX_TIME minus 10 s";
  auto edge = Resolve({{"fault-scheduling", "force"}}, {{"recover-strategy", "elastic-training"}},
                      {{"MINDIO_WAIT_MINDX_TIME", "10"}});
  EXPECT_EQ(edge.config.replacement_wait_ms(), 0) << "the lower edge: no wait at all";
  auto below = Resolve({{"fault-scheduling", "force"}}, {{"recover-strategy", "elastic-training"}},
                       {{"MINDIO_WAIT_MINDX_TIME", "3"}});
  EXPECT_EQ(below.config.replacement_wait_ms(), 0);
  auto none = Resolve({{"fault-scheduling", "force"}}, {{"recover-strategy", "dump"}});
  EXPECT_EQ(none.config.replacement_wait_ms(), std::nullopt);
}

TEST(Config, VolcanoPoliciesThatRestartSurvivorsAreRefused) {
  VolcanoFacts v;
  v.policies = {{"PodEvicted", "RestartJob", "spec.policies[0]"},
                {"PodFailed", "RestartTask", "spec.policies[1]"},
                {"Unknown", "AbortJob", "tasks[worker].policies[0]"},
                {"PodEvicted", "RestartPartition", "tasks[worker].policies[1]"},
                {"PodFailed", "RestartTask", "tasks[manager].policies[0]", true},
                {"PodEvicted", "RestartPod", "tasks[worker].policies[2]"},
                {"TaskCompleted", "CompleteJob", "tasks[worker].policies[3]"}};
  auto r = Resolve({{"fault-scheduling", "force"}}, {{"recover-strategy", "recover"}}, {}, 4, 2, v);
  auto errors = Messages(r, Problem::Severity::kError);
  ASSERT_EQ(errors.size(), 4u);
  EXPECT_EQ(errors[0],
            "the Volcano policy spec.policies[0] (PodEvicted -> RestartJob) would restart the "
            "whole job on a fault while recovery is on; remove it (the job controller recreates "
            "the pod Regroup evicts without one)");
  // Volcano's job controller kills every pod of the task: the survivors too
  EXPECT_EQ(errors[1],
            "the Volcano policy spec.policies[1] (PodFailed -> RestartTask) would restart every "
            "training pod of the faulty pod's task, the survivors too, while recovery is on; "
            "remove it (the job controller recreates the pod Regroup evicts without one)");
  EXPECT_EQ(errors[2],
            "the Volcano policy tasks[worker].policies[0] (Unknown -> AbortJob) would stop the "
            "whole job on a fault while recovery is on; remove it (the job controller recreates "
            "the pod Regroup evicts without one)");
  EXPECT_NE(errors[3].find("(PodEvicted -> RestartPartition) would restart every training pod of "
                           "the faulty pod's partition"),
            std::string::npos)
      << errors[3];
  // The manager task's own restart, and RestartPod, restart no survivor, but count against
  // maxRetry, after which Volcano fails the job.
  auto warnings = Messages(r, Problem::Severity::kWarning);
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_EQ(warnings[0],
            "the Volcano policy tasks[manager].policies[0] (PodFailed -> RestartTask) counts each "
            "fault against spec.maxRetry, and Volcano fails the whole job once they reach it; "
            "without it the job controller recreates a deleted pod all the same");
  EXPECT_NE(warnings[1].find("tasks[worker].policies[2] (PodEvicted -> RestartPod) counts each"),
            std::string::npos)
      << warnings[1];
  // With recovery off the same policies are the job's own business.
  EXPECT_TRUE(Resolve({}, {}, {}, 4, 2, v).ok());
}

TEST(Config, ATrainingPodNotToldItsNodeRankIsWarnedOf) {
  VolcanoFacts v;
  v.manager_pods = 1;
  v.node_ranks_given = false;
  auto r = Resolve({{"fault-scheduling", "force"}}, {{"recover-strategy", "recover"}}, {}, 4, 2, v);
  auto warnings = Messages(r, Problem::Severity::kWarning);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("no training pod is told its node rank"), std::string::npos);
  EXPECT_NE(warnings[0].find("add `env: []` to spec.plugins"), std::string::npos);
  v.node_ranks_given = true;
  EXPECT_TRUE(Messages(Resolve({{"fault-scheduling", "force"}}, {{"recover-strategy", "recover"}},
                               {}, 4, 2, v),
                       Problem::Severity::kWarning)
                  .empty());
  v.node_ranks_given.reset();  // the scheduler's view: no document, nothing to say
  EXPECT_TRUE(Messages(Resolve({{"fault-scheduling", "force"}}, {{"recover-strategy", "recover"}},
                               {}, 4, 2, v),
                       Problem::Severity::kWarning)
                  .empty());
}

// minAvailable is the elastic minimum, or every pod as MindCluster has it (the scheduler lowers
// that to the elastic minimum once the job runs); a value in between would stop a scaled-in job.
TEST(Config, MinAvailableIsTheElasticMinimumOrEveryPod) {
  VolcanoFacts v;
  v.manager_pods = 1;
  const auto resolve = [&](int64_t min_available) {
    v.min_available = min_available;
    return Resolve({{"fault-scheduling", "force"}},
                   {{"recover-strategy", "elastic-training"}, {"regroup.io/min-data-parallel", "4"}},
                   {}, 4, 2, v);
  };
  EXPECT_EQ(Messages(resolve(4), Problem::Severity::kError)[0],
            "minAvailable 4 is above the job's elastic minimum of 3 pods (for "
            "regroup.io/min-data-parallel=4, the manager's included) and below its 5 pods: "
            "Volcano would stop the job when it scales in; set minAvailable to 3, or to every "
            "pod (5, as MindCluster does: the scheduler lowers it to 3 once the job runs)");
  EXPECT_TRUE(resolve(3).ok());
  EXPECT_TRUE(resolve(5).ok()) << "every pod, MindCluster's";
  EXPECT_EQ(Messages(resolve(6), Problem::Severity::kError)[0],
            "minAvailable 6 is more than the job's 5 pods; set minAvailable to 3, or to every "
            "pod (5, as MindCluster does: the scheduler lowers it to 3 once the job runs)");
  EXPECT_TRUE(resolve(2).ok()) << "below: the regroup plugin still starts the job at full size";
}

TEST(Config, TheElasticMinimumCountsWholeReplicasAndTheManager) {
  const auto min = [](Map annotations, int64_t manager_pods) {
    auto r = Resolve({{"fault-scheduling", "force"}}, annotations, {}, 4, 2, std::nullopt);
    EXPECT_TRUE(r.ok());
    return ElasticMinAvailable(r.config, 4, manager_pods);
  };
  EXPECT_EQ(min({{"recover-strategy", "elastic-training"}, {"regroup.io/min-data-parallel", "4"}},
                1),
            3)
      << "4 one-rank replicas fill 2 pods of 2 processes, and the manager";
  EXPECT_EQ(min({{"recover-strategy", "elastic-training"}, {"regroup.io/tensor-parallel", "4"}},
                0),
            2)
      << "a replica is 2 pods";
  EXPECT_EQ(min({{"recover-strategy", "recover"}}, 0), 0) << "never scales in";
}

TEST(Config, MarkdownTableListsEveryKey) {
  const std::string md = ConfigTableMarkdown();
  for (const auto& key : ConfigKeys())
    EXPECT_NE(md.find("`" + std::string(key.name) + "`"), std::string::npos) << key.name;
}

}  // namespace
}  // namespace regroup
