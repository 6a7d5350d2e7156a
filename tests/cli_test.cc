// SPDX-License-Identifier: Apache-2.0
// regroupctl's parts: the Volcano Job reader, the fault script and the simulation.
#include <gtest/gtest.h>

#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/fault_script.h"
#include "cli/simulate.h"
#include "plugin/job_spec.h"
#include "plugin/volcano_job.h"
#include "tests/source_file.h"

namespace regroup::cli {
namespace {

std::string Read(const std::string& rel) { return testing::ReadSourceFile(rel); }

constexpr char kJob[] = R"(
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata:
  name: llama
  namespace: ml
  labels:
    fault-scheduling: force
  annotations:
    recover-strategy: recover,elastic-training
    wait-reschedule-timeout: "60"
spec:
  minAvailable: 3
  policies:
    - event: PodEvicted
      action: RestartTask
  tasks:
    - name: manager
      replicas: 1
      policies:
        - {event: PodFailed, action: RestartPod}
      template:
        spec:
          containers:
            - name: manager
              command: [regroup-manager]
    - name: worker
      replicas: 4
      template:
        spec:
          containers:
            - name: trainer
              command: [regroup-agent, --nproc-per-node=8, train.py]
              env:
                - name: MINDIO_WAIT_MINDX_TIME
                  value: "40"
)";

TEST(VolcanoJob, ReadsKeysSizesAndPolicies) {
  auto spec = JobSpecFromVolcanoYaml(kJob);
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->id, "ml/llama");
  EXPECT_EQ(spec->pods, 4);
  EXPECT_EQ(spec->processes_per_pod, 8);
  EXPECT_EQ(spec->labels.at("fault-scheduling"), "force");
  EXPECT_EQ(spec->annotations.at("wait-reschedule-timeout"), "60");
  EXPECT_EQ(spec->env.at("MINDIO_WAIT_MINDX_TIME"), "40");
  ASSERT_TRUE(spec->volcano);
  EXPECT_EQ(spec->volcano->manager_pods, 1);
  EXPECT_EQ(spec->volcano->min_available, 3);
  ASSERT_EQ(spec->volcano->policies.size(), 2u);
  EXPECT_EQ(spec->volcano->policies[0].action, "RestartTask");
  EXPECT_FALSE(spec->volcano->policies[0].manager_task);  // the job's: every task's
  EXPECT_EQ(spec->volcano->policies[1].where, "tasks[manager].policies[0]");
  EXPECT_TRUE(spec->volcano->policies[1].manager_task);
}

// Whether the training pods learn their node ranks: the env plugin, or a rank in every training
// container (a real control plane showed what happens otherwise: deploy/README.md).
TEST(VolcanoJob, ReadsWhetherEveryTrainingPodIsToldItsNodeRank) {
  auto read = [](const std::string& plugins, const std::string& worker_env) {
    std::string yaml = "kind: Job\nmetadata: {name: j}\nspec:\n" + plugins +
                       "  tasks:\n"
                       "    - {name: manager, replicas: 1, template: {spec: {containers: "
                       "[{name: m, command: [regroup-manager]}]}}}\n"
                       "    - {name: worker, replicas: 2, template: {spec: {containers: "
                       "[{name: t, command: [regroup-agent, train.py], env: [" +
                       worker_env + "]}]}}}\n";
    auto spec = JobSpecFromVolcanoYaml(yaml);
    EXPECT_TRUE(spec.ok()) << spec.status().message();
    return spec.ok() ? spec->volcano->node_ranks_given : std::nullopt;
  };
  EXPECT_EQ(read("", ""), false);
  EXPECT_EQ(read("  plugins: {svc: [], env: []}\n", ""), true);
  EXPECT_EQ(read("  plugins: {svc: []}\n", "{name: PET_NODE_RANK, value: '1'}"), true);
  EXPECT_EQ(read("", "{name: HOME, value: /root}"), false);
}

// Two training tasks that both take their node ranks from VC_TASK_INDEX each number their pods
// from 0: their agents would claim the same node ranks. A warning names them; a task whose pods
// are given their ranks (--node-rank, PET_NODE_RANK) is not one of them.
TEST(VolcanoJob, TrainingTasksThatBothNumberTheirPodsFromZeroAreWarnedOf) {
  auto warnings = [](const std::string& master_command) {
    std::string yaml = "kind: Job\nmetadata: {name: j}\n"
                       "spec:\n  plugins: {svc: [], env: []}\n  tasks:\n"
                       "    - {name: manager, replicas: 1, template: {spec: {containers: "
                       "[{name: m, command: [regroup-manager]}]}}}\n"
                       "    - {name: master, replicas: 1, template: {spec: {containers: "
                       "[{name: t, command: [" + master_command + "]}]}}}\n"
                       "    - {name: worker, replicas: 2, template: {spec: {containers: "
                       "[{name: t, command: [regroup-agent, train.py]}]}}}\n";
    auto spec = JobSpecFromVolcanoYaml(yaml);
    EXPECT_TRUE(spec.ok()) << spec.status().message();
    std::vector<std::string> out;
    if (!spec.ok()) return out;
    for (const auto& p : spec->Resolve().problems)
      if (p.key == "volcano.spec.tasks") out.push_back(p.message);
    return out;
  };
  const auto clash = warnings("regroup-agent, train.py");
  ASSERT_EQ(clash.size(), 1u);
  EXPECT_EQ(clash[0].find("the training tasks master, worker each number their pods from 0"), 0u)
      << clash[0];
  EXPECT_TRUE(warnings("regroup-agent, --node-rank=2, train.py").empty());
}

// The tasks ranked by VC_TASK_INDEX travel in the engine's job spec (the scheduler validates what
// it reads back), and a spec that names them wrongly is refused by the field's name.
TEST(VolcanoJob, TheTasksRankedByTheirIndexTravelInTheJobSpec) {
  JobSpec spec;
  spec.id = "default/j";
  spec.pods = 3;
  spec.processes_per_pod = 1;
  spec.volcano = VolcanoFacts{};
  spec.volcano->task_index_ranked = {"master", "worker"};
  const auto json = JobSpecToJson(spec);
  auto back = ParseJobSpec(json);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->volcano->task_index_ranked, spec.volcano->task_index_ranked);
  for (const char* bad : {R"("master")", R"([1])", R"(["a", {}])"}) {
    auto j = json;
    j["volcano"]["task_index_ranked"] = nlohmann::json::parse(bad);
    auto refused = ParseJobSpec(j);
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.status().message().find("task_index_ranked"), std::string::npos)
        << refused.status().message();
  }
}

TEST(VolcanoJob, AcceleratorRequestGivesProcessesPerPod) {
  std::string yaml = R"(
kind: Job
metadata: {name: j}
spec:
  tasks:
    - name: worker
      replicas: 2
      template: {spec: {containers: [{name: t, resources: {limits: {nvidia.com/gpu: 4}}}]}}
)";
  auto spec = JobSpecFromVolcanoYaml(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->id, "default/j");
  EXPECT_EQ(spec->processes_per_pod, 4);
}

// A pod that runs a script (MindCluster's train_start.sh) shows no --nproc-per-node: torchrun's
// own variable for it, PET_NPROC_PER_NODE, in the container's env gives the processes per pod.
TEST(VolcanoJob, TorchrunsNprocVariableGivesProcessesPerPod) {
  std::string yaml = R"(
kind: Job
metadata: {name: j}
spec:
  tasks:
    - name: worker
      replicas: 2
      template: {spec: {containers: [{name: t, command: [bash, scripts/train_start.sh],
                                      env: [{name: PET_NPROC_PER_NODE, value: "8"}]}]}}
)";
  auto spec = JobSpecFromVolcanoYaml(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->processes_per_pod, 8);
}

TEST(VolcanoJob, BadDocumentsGiveClearErrors) {
  EXPECT_EQ(JobSpecFromVolcanoYaml("kind: AscendJob\nmetadata: {name: a}\n").status().message(),
            "kind is \"AscendJob\"; expected a Volcano Job (kind: Job); convert it with "
            "`regroupctl convert`");
  EXPECT_EQ(JobSpecFromVolcanoYaml("kind: Job\nmetadata: {name: a}\nspec: {tasks: []}\n")
                .status()
                .message(),
            "spec.tasks must be a non-empty list");
  EXPECT_EQ(JobSpecFromVolcanoYaml(
                "kind: Job\nmetadata: {name: a}\nspec: {tasks: [{replicas: many}]}\n")
                .status()
                .message(),
            "spec.tasks[0].replicas must be an integer from 0 to 100000");
  EXPECT_FALSE(JobSpecFromVolcanoYaml("kind: [Job").ok());
  EXPECT_FALSE(JobSpecFromVolcanoYaml(std::string(5000, '[')).ok());
}

// Brackets inside a quoted string or a comment are text: only real nesting is refused, and an
// unterminated quote never hides it.
TEST(VolcanoJob, BracketsInQuotedStringsAndCommentsAreNotNesting) {
  const std::string deep(300, '[');
  for (const std::string& value : {"\"" + deep + "\"", "'" + deep + "'", "'it''s " + deep + "'"}) {
    std::string yaml = "kind: Job\nmetadata:\n  name: j\n  annotations:\n    note: " + value +
                       "  # " + deep + "\nspec:\n  tasks: [{replicas: 1}]\n";
    auto spec = JobSpecFromVolcanoYaml(yaml);
    ASSERT_TRUE(spec.ok()) << value << ": " << spec.status().message();
    EXPECT_EQ(spec->annotations.at("note").size(), value.size() - 2 - (value[1] == 'i'));
  }
  // A quote that does not begin a scalar (inside a plain one) hides nothing.
  auto hidden = JobSpecFromVolcanoYaml("kind: Job\nmetadata: {name: j}\nx: it's\ny: " + deep +
                                       "\n'\n");
  EXPECT_EQ(hidden.status().message(), "the YAML document is nested too deeply");
  auto dash = JobSpecFromVolcanoYaml("kind: Job\nmetadata: {name: j}\nx: a - 'b\ny: " + deep +
                                     "\n'\n");
  EXPECT_EQ(dash.status().message(), "the YAML document is nested too deeply");
  auto entry = JobSpecFromVolcanoYaml("kind: Job\nmetadata: {name: j}\nx:\n  - '" + deep +
                                      "'\n  - - \"" + deep + "\"\nspec: {tasks: [{replicas: 1}]}\n");
  EXPECT_TRUE(entry.ok()) << entry.status().message();
  // Nor does a quote left open.
  EXPECT_EQ(JobSpecFromVolcanoYaml("kind: Job\nx: '" + deep).status().message(),
            "the YAML document is nested too deeply");
  EXPECT_EQ(JobSpecFromVolcanoYaml("kind: Job\nx: \"\\\"" + deep).status().message(),
            "the YAML document is nested too deeply");
}

TEST(FaultScript, ParsesTimesSubjectsAndVerbs) {
  auto s = ParseFaultScript(
      "# a comment\n200s node node-8 joins\n10s node node-3 fails NPU lost\n1.5s rank 5 exits\n"
      "250ms pod 2 fails\n2m rank 1 hangs\n");
  ASSERT_TRUE(s.ok()) << s.status().message();
  ASSERT_EQ(s->size(), 5u);
  EXPECT_EQ((*s)[0].at_ms, 250);
  EXPECT_EQ((*s)[1].at_ms, 1500);
  EXPECT_EQ((*s)[2].detail, "NPU lost");
  EXPECT_EQ((*s)[4].at_ms, 200000);
  EXPECT_EQ((*s)[3].kind, ScriptEvent::Kind::kRankHangs);
}

TEST(Readers, TextThatIsNotUtf8IsRefused) {
  EXPECT_EQ(ParseFaultScript("10s node node-3 fails \xff\n").status().message(),
            "the fault script is not valid UTF-8 (byte 22)");
  EXPECT_EQ(JobSpecFromVolcanoYaml("kind: Job\nmetadata: {name: \"\xc0\xaf\"}\n").status().message(),
            "the YAML document is not valid UTF-8 (byte 28)");
  EXPECT_TRUE(ParseFaultScript("10s node n\xc3\xa9ud fails d\xc3\xa9j\xc3\xa0\n").ok());
}

TEST(FaultScript, TimesBeyondTheHorizonAreRefused) {
  EXPECT_EQ(ParseFaultScript("100000000s node node-0 fails\n").status().message(),
            "fault script line 1: 100000000s is beyond the simulation's 24 h horizon");
  EXPECT_TRUE(ParseFaultScript("24h node node-0 fails\n").status().message().find("duration") !=
              std::string::npos);
  EXPECT_TRUE(ParseFaultScript("1440m node node-0 fails\n").ok());
}

TEST(FaultScript, ErrorsNameTheLine) {
  EXPECT_EQ(ParseFaultScript("10s node a fails\nsoon node b fails\n").status().message(),
            "fault script line 2: \"soon\" is not a duration; write it like 250ms, 10s, 1.5s or 2m");
  EXPECT_EQ(ParseFaultScript("10s node a explodes\n").status().message(),
            "fault script line 1: a node fails, recovers or joins, not \"explodes\"");
  EXPECT_EQ(ParseFaultScript("10s rank x exits\n").status().message(),
            "fault script line 1: \"x\" is not a rank number");
  EXPECT_EQ(ParseFaultScript("10s node\n").status().message(),
            "fault script line 1: expected TIME SUBJECT ID VERB, as in \"10s node node-3 fails\"");
}

TEST(Simulate, TheExampleShowsWaitScaleInAndScaleOut) {
  auto spec = JobSpecFromVolcanoYaml(Read("examples/jobs/elastic-job.yaml"));
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  auto script = ParseFaultScript(Read("examples/faults/node-loss.txt"));
  ASSERT_TRUE(script.ok()) << script.status().message();
  std::ostringstream out;
  auto summary = Simulate(*spec, *script, {}, out);
  ASSERT_TRUE(summary.ok()) << summary.status().message();
  std::vector<std::string> kinds;
  for (const auto& h : summary->history) kinds.push_back(h["kind"]);
  EXPECT_EQ(kinds, (std::vector<std::string>{"restart_in_place", "wait", "scale_in", "scale_out"}))
      << out.str();
  EXPECT_EQ(summary->final_phase, REGROUP_PHASE_RUNNING) << out.str();
  EXPECT_EQ(summary->final_dp, summary->original_dp);
  EXPECT_GT(summary->ms_scaled_in, 0);
  EXPECT_NE(out.str().find("scheduler: replacement for pod 3 bound to node-8"), std::string::npos)
      << out.str();
}

TEST(Simulate, ScriptNamingAMissingRankIsRefused) {
  auto spec = JobSpecFromVolcanoYaml(Read("examples/jobs/elastic-job.yaml"));
  auto script = ParseFaultScript("5s rank 999 exits\n");
  std::ostringstream out;
  auto summary = Simulate(*spec, *script, {}, out);
  ASSERT_FALSE(summary.ok());
  EXPECT_NE(summary.status().message().find("fault script line 1: job default/llama-elastic has "
                                            "no rank 999"),
            std::string::npos)
      << summary.status().message();
}

}  // namespace
}  // namespace regroup::cli
