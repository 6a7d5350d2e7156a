// SPDX-License-Identifier: Apache-2.0
// The recovery ladder with the clock injected: every strategy, fallback and guard.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>

#include <nlohmann/json.hpp>

#include "plugin/engine.h"

namespace regroup {
namespace {

using Map = std::map<std::string, std::string>;
using nlohmann::json;

constexpr char kJob[] = "default/train";

class EngineTest : public ::testing::Test {
 protected:
  // A job of `pods` pods x `ppp` processes (tensor-parallel 2 unless set: one replica a pod),
  // its pods running on node-0.. from t=0.
  Job& Submit(Map labels, Map annotations, Map env = {}, int64_t pods = 4, int64_t ppp = 2) {
    annotations.try_emplace("regroup.io/tensor-parallel", "2");
    JobSpec spec;
    spec.id = kJob;
    spec.uid = "job-uid";
    spec.labels = std::move(labels);
    spec.annotations = std::move(annotations);
    spec.env = std::move(env);
    spec.pods = pods;
    spec.processes_per_pod = ppp;
    ResolvedConfig report;
    Status st = engine_.UpsertJob(spec, &report, 0);
    EXPECT_TRUE(st.ok()) << st.message();
    for (int64_t i = 0; i < pods; ++i) {
      EXPECT_TRUE(engine_.SetNodeHealth(Node(i), REGROUP_NODE_HEALTHY, "", 0).ok());
      EXPECT_TRUE(engine_.SetPodState(kJob, i, Uid(i), REGROUP_POD_RUNNING, Node(i), 0).ok());
    }
    return *engine_.FindJob(kJob);
  }
  Job& job() { return *engine_.FindJob(kJob); }
  static std::string Node(int64_t i) { return "node-" + std::to_string(i); }
  static std::string Uid(int64_t i) { return "uid-" + std::to_string(i); }

  void NodeFails(int64_t i, int64_t t) {
    ASSERT_TRUE(engine_.SetNodeHealth(Node(i), REGROUP_NODE_FAULTY, "NotReady", t).ok());
  }
  void Fault(const std::string& kind, std::vector<int64_t> ranks, int64_t step, int64_t t) {
    json e = {{"type", "fault"}, {"job", kJob}, {"kind", kind}, {"ranks", ranks}, {"step", step}};
    Status st = engine_.ApplyEvents(e, t);
    ASSERT_TRUE(st.ok()) << st.message();
  }
  // A replacement for pod i is placed on a spare node and its agent registers.
  void Replace(int64_t i, int64_t t, const std::string& node = "") {
    const std::string uid = Uid(i) + "-r" + std::to_string(t);
    const std::string where = node.empty() ? "spare-" + std::to_string(i) : node;
    ASSERT_TRUE(engine_.SetPodState(kJob, i, uid, REGROUP_POD_RUNNING, where, t).ok());
    json reg = {{"type", "replacement_registered"}, {"job", kJob}, {"index", i}, {"uid", uid}};
    Status st = engine_.ApplyEvents(reg, t);
    ASSERT_TRUE(st.ok()) << st.message();
  }
  // Every pod is replaced (a job restart): pod i's replacement runs on `prefix`-i.
  void ReplaceAll(int64_t t, const std::string& prefix) {
    for (int64_t i = 0; i < 4; ++i) Replace(i, t, prefix + std::to_string(i));
  }
  void NodeNamedFails(const std::string& node, int64_t t) {
    ASSERT_TRUE(engine_.SetNodeHealth(node, REGROUP_NODE_FAULTY, "gone", t).ok());
  }
  void Progress(int64_t generation, int64_t step, int64_t t, int64_t live_ranks = 8) {
    json e = {{"type", "manager_progress"}, {"job", kJob}, {"epoch", 1},
              {"generation", generation}, {"committed_step", step}, {"live_ranks", live_ranks}};
    ASSERT_TRUE(engine_.ApplyEvents(e, t).ok());
  }
  const Directive& Tick(int64_t t) {
    engine_.Tick(t);
    return job().directive();
  }
  // The decision went to the checkpoint (`kind`: a job restart, or an exit where rescheduling is
  // not allowed) because the shards at `positions` ("[0]", "s [2,3]") have no holder left.
  static void ExpectShardLost(const Directive& d, DirectiveKind kind,
                              const std::string& positions) {
    EXPECT_EQ(d.kind, kind);
    EXPECT_NE(d.reason.find("no surviving rank holds the state of replica position" + positions +
                            ": a checkpoint is needed"),
              std::string::npos)
        << d.reason;
  }
  // Two tp-2 replicas, one a pod (ranks 0, 1 on pod 0; 2, 3 on pod 1), after step 10: rank 0
  // dies and is restarted in place; the survivors commit step 12 without it.
  void RestartRank0InPlaceWhileTheSurvivorsTrainOn() {
    Submit({{"fault-scheduling", "force"}}, {{"recover-strategy", "recover-in-place"}}, {}, 2, 2);
    Progress(1, 10, 0, 4);
    Fault("process_exit", {0}, 11, 100);
    ASSERT_EQ(Tick(400).kind, REGROUP_DIRECTIVE_RESTART_IN_PLACE);
    Progress(2, 12, 500, 2);
  }

  Engine engine_;
};

const Map kForce = {{"fault-scheduling", "force"}};

TEST_F(EngineTest, NodeLossWithRecoverWaitsUntilTheDeadlineThenScalesIn) {
  Submit(kForce, {{"recover-strategy", "recover,elastic-training"},
                  {"wait-reschedule-timeout", "30"}});
  NodeFails(3, 1000);
  EXPECT_EQ(Tick(1199).kind, REGROUP_DIRECTIVE_CONTINUE) << "still inside the report window";
  const Directive& wait = Tick(1200);
  EXPECT_EQ(wait.kind, REGROUP_DIRECTIVE_WAIT);
  EXPECT_EQ(wait.strategy, "recover");
  EXPECT_EQ(wait.deadline_ms, 31200);
  EXPECT_EQ(job().phase(), REGROUP_PHASE_WAITING);
  EXPECT_EQ(wait.reason,
            "pod_lost on pods [3] (node node-3 is faulty (NotReady)); waiting up to 30 s "
            "(wait-reschedule-timeout) for replacements of pods [3]");
  EXPECT_TRUE(job().WantsPods());
  ASSERT_EQ(job().Evictions().size(), 1u);
  EXPECT_EQ(job().Evictions()[0].uid, "uid-3");
  EXPECT_TRUE(job().Evictions()[0].force);

  EXPECT_EQ(Tick(31199).kind, REGROUP_DIRECTIVE_WAIT) << "one millisecond before the deadline";
  const Directive& in = Tick(31200);
  EXPECT_EQ(in.kind, REGROUP_DIRECTIVE_SCALE_IN);
  EXPECT_EQ(in.dp, 3);
  EXPECT_EQ(in.keep_replicas, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(in.remove_replicas, (std::vector<int64_t>{3}));
  EXPECT_EQ(job().phase(), REGROUP_PHASE_SCALED_IN);
  EXPECT_EQ(job().GangMin(), 3u) << "the gang minimum follows the smaller generation";
}

// Found on the real control plane (Kubernetes scenario 6): a training pod's container failed
// (restartPolicy Never: its agent exited 1), and Volcano's job controller creates again only a pod
// that is gone, never one that failed; the engine waited for a replacement nobody would create.
// A failed pod of a job that wants its pods back is now evicted (deleted), as on a faulty node.
TEST_F(EngineTest, AFailedPodIsEvictedSoThatTheJobControllerCreatesItAgain) {
  Submit(kForce, {{"recover-strategy", "recover,elastic-training"},
                  {"wait-reschedule-timeout", "30"}});
  ASSERT_TRUE(engine_.SetPodState(kJob, 2, "uid-2", REGROUP_POD_FAILED, Node(2), 1000).ok());
  EXPECT_EQ(Tick(1200).kind, REGROUP_DIRECTIVE_WAIT);
  ASSERT_EQ(job().Evictions().size(), 1u);
  EXPECT_EQ(job().Evictions()[0].uid, "uid-2");
  // Deleted: nothing more to evict; its replacement is what the wait is for.
  ASSERT_TRUE(engine_.SetPodState(kJob, 2, "uid-2", REGROUP_POD_DELETED, Node(2), 1500).ok());
  EXPECT_TRUE(job().Evictions().empty());
  Replace(2, 5000);
  EXPECT_EQ(Tick(5200).kind, REGROUP_DIRECTIVE_RESUME);
}

// Simulation seed 104 with a coordinator: a pod readmitted as its own replacement is known to
// the engine by its agent's uid (`<pod uid>/2`), which names no pod the scheduler has. Its
// eviction names the pod.
TEST_F(EngineTest, AReadmittedPodIsEvictedByThePodsUidNotItsAgents) {
  Submit(kForce, {{"recover-strategy", "recover,elastic-training"},
                  {"wait-reschedule-timeout", "30"}});
  auto pod_lost = [&](int64_t t) {
    const json e = {{"type", "fault"}, {"job", kJob}, {"kind", "pod_lost"}, {"pods", {2}}};
    ASSERT_TRUE(engine_.ApplyEvents(e, t).ok());
  };
  pod_lost(100);
  Tick(400);
  ASSERT_TRUE(engine_.ReportReplacementRegistered(kJob, 2, "uid-2/2", 500).ok());
  pod_lost(1000);
  Tick(1300);
  ASSERT_EQ(job().Evictions().size(), 1u);
  EXPECT_EQ(job().Evictions()[0].uid, "uid-2");
  EXPECT_EQ(regroup::PodOfUid("uid-2/2/3"), "uid-2");
  EXPECT_EQ(regroup::PodOfUid("ns/pod"), "ns/pod") << "only a number after the slash";
}

// Simulation seed 102092 with a coordinator and 12 faults: a pod readmitted as its own
// replacement (`uid-2/2`, in the same Kubernetes pod) was taken for "replaced by a new
// incarnation" when the scheduler reported its pod again (`uid-2`, as every pod is reported after
// a scheduler restart); the job restart that followed waited for good for a replacement of a
// pod the scheduler had no reason to replace. The scheduler's report names the pod, and the
// pod's readmitted agent is that pod: before a restart and after one (from the saved state).
TEST_F(EngineTest, AReadmittedPodIsThePodTheSchedulerReportsBeforeAndAfterARestart) {
  Submit(kForce, {{"recover-strategy", "recover,elastic-training"},
                  {"wait-reschedule-timeout", "30"}});
  const json lost = {{"type", "fault"}, {"job", kJob}, {"kind", "pod_lost"}, {"pods", {2}}};
  ASSERT_TRUE(engine_.ApplyEvents(lost, 100).ok());
  Tick(400);
  ASSERT_TRUE(engine_.ReportReplacementRegistered(kJob, 2, "uid-2/2", 500).ok());
  EXPECT_EQ(Tick(700).kind, REGROUP_DIRECTIVE_RESUME);
  const int64_t directive = job().directive().id;
  // The scheduler reports the pod again: nothing changed.
  ASSERT_TRUE(engine_.SetPodState(kJob, 2, "uid-2", REGROUP_POD_RUNNING, Node(2), 800).ok());
  EXPECT_EQ(Tick(1000).id, directive) << job().StateJson().dump();
  // A scheduler restart: the saved state, then every pod reported as the scheduler finds it.
  const json state = job().StateJson();
  Engine restarted;
  ASSERT_TRUE(restarted.UpsertJob(job().spec(), nullptr, 0).ok());
  Job& again = *restarted.FindJob(kJob);
  ASSERT_TRUE(again.LoadState(state).ok());
  for (int64_t i = 0; i < 4; ++i)
    ASSERT_TRUE(restarted.SetPodState(kJob, i, Uid(i), REGROUP_POD_RUNNING, Node(i), 2000).ok());
  restarted.Tick(2200);
  EXPECT_EQ(again.directive().id, directive) << again.StateJson().dump();
  EXPECT_EQ(again.directive().kind, REGROUP_DIRECTIVE_RESUME);
  // The pod ending is still its agent's end, and the agent that was lost is still a zombie.
  ASSERT_TRUE(restarted.SetPodState(kJob, 2, "uid-2", REGROUP_POD_FAILED, Node(2), 2500).ok());
  restarted.Tick(2700);
  EXPECT_NE(again.directive().id, directive);
  EXPECT_EQ(restarted.ReportReplacementRegistered(kJob, 2, "uid-2", 2800).code(),
            REGROUP_FAILED_PRECONDITION);
}

// A job that no longer wants its pods (it ended) keeps a failed pod: deleting it would only have
// the job controller create it again.
TEST_F(EngineTest, AFailedPodOfAJobThatStoppedIsNotEvicted) {
  Submit(kForce, {});
  Fault("process_exit", {3}, 7, 0);
  ASSERT_EQ(Tick(200).kind, REGROUP_DIRECTIVE_EXIT);
  ASSERT_TRUE(engine_.SetPodState(kJob, 2, "uid-2", REGROUP_POD_FAILED, Node(2), 1000).ok());
  Tick(1200);
  EXPECT_TRUE(job().Evictions().empty());
}

// A replacement's agent registers through its manager as soon as it starts, which may be before
// the scheduler's next session sees the pod (a scheduler paused or restarted, a slow informer),
// and that session may first find an earlier replacement that ended unseen (the plugin reports
// the incarnations that ended first). That one replaces nobody: the registered replacement stays,
// and the job resumes (simulation seed 15679 with a coordinator: the stale failure was taken for
// a new incarnation, the registered one for lost, and its own running report for the old one
// ending; the job waited for good).
TEST_F(EngineTest, AnIncarnationSeenOnlyEndingAfterTheRegisteredReplacementReplacesNobody) {
  Submit(kForce, {{"recover-strategy", "recover"}, {"wait-reschedule-timeout", "30"}});
  NodeFails(1, 0);
  EXPECT_EQ(Tick(200).kind, REGROUP_DIRECTIVE_WAIT);
  ASSERT_TRUE(engine_.SetPodState(kJob, 1, "uid-1", REGROUP_POD_DELETED, "", 500).ok());
  // The second replacement registers; the scheduler has seen neither it nor the first, which
  // failed, and then reports both: the one that ended first.
  json reg = {{"type", "replacement_registered"}, {"job", kJob}, {"index", 1}, {"uid", "uid-1-b"}};
  ASSERT_TRUE(engine_.ApplyEvents(reg, 9000).ok());
  ASSERT_TRUE(engine_.SetPodState(kJob, 1, "uid-1-a", REGROUP_POD_FAILED, "spare-1", 10000).ok());
  ASSERT_TRUE(engine_.SetPodState(kJob, 1, "uid-1-b", REGROUP_POD_RUNNING, "spare-1", 10000).ok());
  const Directive& d = Tick(10100);
  EXPECT_EQ(d.kind, REGROUP_DIRECTIVE_RESUME) << job().StateJson().dump();
  EXPECT_EQ(d.dp, 4);
  EXPECT_TRUE(job().Evictions().empty());
}

TEST_F(EngineTest, ReplacementInTimeResumesAtFullSize) {
  Submit(kForce, {{"recover-strategy", "recover"}, {"wait-reschedule-timeout", "30"}});
  NodeFails(1, 0);
  EXPECT_EQ(Tick(200).kind, REGROUP_DIRECTIVE_WAIT);
  // The lost pod is evicted; its replacement is scheduled and registers.
  ASSERT_TRUE(engine_.SetPodState(kJob, 1, "uid-1", REGROUP_POD_DELETED, "", 500).ok());
  EXPECT_TRUE(job().Evictions().empty());
  Replace(1, 10000);
  const Directive& d = Tick(10100);
  EXPECT_EQ(d.kind, REGROUP_DIRECTIVE_RESUME);
  EXPECT_EQ(d.dp, 4);
  EXPECT_EQ(job().phase(), REGROUP_PHASE_RUNNING);
  EXPECT_FALSE(job().WantsPods());
}

TEST_F(EngineTest, RecoverAloneReschedulesTheJobWhenTheWaitRunsOut) {
  // MindCluster: when process-level recovery fails, the job is rescheduled (a lost node is a
  // hardware fault: no fault-retry-times needed).
  Submit(kForce, {{"recover-strategy", "recover"}, {"wait-reschedule-timeout", "30"}});
  NodeFails(0, 0);
  Tick(200);
  const Directive& d = Tick(30200);
  EXPECT_EQ(d.kind, REGROUP_DIRECTIVE_RESTART_JOB);
  EXPECT_EQ(d.strategy, "job-rescheduling");
  EXPECT_EQ(job().phase(), REGROUP_PHASE_RESTARTING);
  EXPECT_NE(d.reason.find("elastic-training is not allowed"), std::string::npos) << d.reason;
  EXPECT_NE(d.reason.find("replacing every pod (job-level rescheduling): every process restarts "
                          "from the newest checkpoint (reschedule 1)"),
            std::string::npos)
      << d.reason;
}

TEST_F(EngineTest, AHardwareFaultReschedulesTheJobWhateverFaultRetryTimesSays) {
  Submit({{"fault-scheduling", "force"}}, {});  // recover-strategy: exit only
  NodeFails(2, 0);
  const Directive& d = Tick(200);
  EXPECT_EQ(d.kind, REGROUP_DIRECTIVE_RESTART_JOB);
  EXPECT_EQ(job().Evictions().size(), 4u) << "job level: every pod is replaced";
  EXPECT_TRUE(job().WantsPods()) << "without process-level recovery, but rescheduling";
  ReplaceAll(5000, "node-new-");
  const Directive& resumed = Tick(5100);
  EXPECT_EQ(resumed.kind, REGROUP_DIRECTIVE_RESUME);
  EXPECT_EQ(resumed.strategy, "job-rescheduling");
  EXPECT_NE(resumed.reason.find("from the newest checkpoint (reschedule 1)"), std::string::npos)
      << resumed.reason;
  // With no limit set, the next hardware fault reschedules again.
  NodeNamedFails("node-new-1", 9000);
  EXPECT_EQ(Tick(9200).kind, REGROUP_DIRECTIVE_RESTART_JOB);
}

TEST_F(EngineTest, AFaultOfTheTrainingsOwnReschedulesOnlyWithFaultRetryTimes) {
  Submit({{"fault-scheduling", "force"}}, {});
  Fault("process_exit", {3}, 7, 0);
  const Directive& d = Tick(200);
  EXPECT_EQ(d.kind, REGROUP_DIRECTIVE_EXIT);
  EXPECT_NE(d.reason.find("a fault of the training's own reschedules only with fault-retry-times "
                          "set; exiting"),
            std::string::npos)
      << d.reason;
}

TEST_F(EngineTest, FaultRetryTimesCountsTheTrainingsOwnFaultsOnly) {
  Submit({{"fault-scheduling", "force"}, {"fault-retry-times", "1"}},
         {{"regroup.io/backoff-limit", "3"}});
  Fault("process_exit", {3}, 7, 0);
  EXPECT_EQ(Tick(200).kind, REGROUP_DIRECTIVE_RESTART_JOB);
  ReplaceAll(1000, "node-a-");
  EXPECT_EQ(Tick(1100).kind, REGROUP_DIRECTIVE_RESUME);
  // A node: hardware, not counted by fault-retry-times; the backoff limit counts it.
  NodeNamedFails("node-a-1", 2000);
  EXPECT_EQ(Tick(2200).kind, REGROUP_DIRECTIVE_RESTART_JOB);
  ReplaceAll(3000, "node-b-");
  EXPECT_EQ(Tick(3100).kind, REGROUP_DIRECTIVE_RESUME);
  // A second process fault: fault-retry-times (1) is used up.
  Fault("process_exit", {3}, 9, 4000);
  const Directive& d = Tick(4200);
  EXPECT_EQ(d.kind, REGROUP_DIRECTIVE_EXIT);
  EXPECT_NE(d.reason.find("fault-retry-times is used up (1 of 1)"), std::string::npos) << d.reason;
}

TEST_F(EngineTest, TheBackoffLimitBoundsEveryReschedule) {
  Submit({{"fault-scheduling", "force"}}, {{"regroup.io/backoff-limit", "1"}});
  NodeFails(1, 0);
  EXPECT_EQ(Tick(200).kind, REGROUP_DIRECTIVE_RESTART_JOB);
  ReplaceAll(1000, "node-a-");
  EXPECT_EQ(Tick(1100).kind, REGROUP_DIRECTIVE_RESUME);
  NodeNamedFails("node-a-2", 2000);
  const Directive& d = Tick(2200);
  EXPECT_EQ(d.kind, REGROUP_DIRECTIVE_EXIT);
  EXPECT_NE(d.reason.find("the reschedules are used up (1 of 1, regroup.io/backoff-limit)"),
            std::string::npos)
      << d.reason;
}

TEST_F(EngineTest, PodReschedulingReplacesOnlyTheFaultyPods) {
  Submit({{"fault-scheduling", "force"}, {"pod-rescheduling", "on"}}, {});
  NodeFails(2, 0);
  const Directive& d = Tick(200);
  EXPECT_EQ(d.kind, REGROUP_DIRECTIVE_RESTART_JOB);
  EXPECT_EQ(d.strategy, "pod-rescheduling");
  EXPECT_NE(d.reason.find("replacing the faulty pods (pod-level rescheduling): every process "
                          "restarts from the newest checkpoint"),
            std::string::npos)
      << d.reason;
  ASSERT_EQ(job().Evictions().size(), 1u);
  EXPECT_EQ(job().Evictions()[0].pod, 2);
  Replace(2, 1000);
  const Directive& resumed = Tick(1100);
  EXPECT_EQ(resumed.kind, REGROUP_DIRECTIVE_RESUME);
  EXPECT_EQ(resumed.strategy, "pod-rescheduling");
  EXPECT_EQ(resumed.dp, 4);
}

TEST_F(EngineTest, PodReschedulingReplacesEveryPodWhenRankZerosIsFaulty) {
  Submit({{"fault-scheduling", "force"}, {"pod-rescheduling", "on"}}, {});
  NodeFails(0, 0);
  const Directive& d = Tick(200);
  EXPECT_EQ(d.strategy, "job-rescheduling");
  EXPECT_EQ(job().Evictions().size(), 4u);
}

TEST_F(EngineTest, RecoverThenDumpWhenAllowed) {
  Submit(kForce, {{"recover-strategy", "recover,dump"}, {"wait-reschedule-timeout", "30"}});
  NodeFails(0, 0);
  Tick(200);
  EXPECT_EQ(Tick(30200).kind, REGROUP_DIRECTIVE_DUMP);
  EXPECT_EQ(job().phase(), REGROUP_PHASE_DUMPING);
}

TEST_F(EngineTest, ElasticWithoutRecoverWaitsMindioMinusTenSeconds) {
  Submit(kForce, {{"recover-strategy", "elastic-training"}}, {{"MINDIO_WAIT_MINDX_TIME", "25"}});
  NodeFails(2, 0);
  const Directive& d = Tick(200);
  EXPECT_EQ(d.kind, REGROUP_DIRECTIVE_WAIT);
  EXPECT_EQ(d.strategy, "elastic-training");
  EXPECT_EQ(d.deadline_ms, 200 + 15000);
  EXPECT_EQ(Tick(15199).kind, REGROUP_DIRECTIVE_WAIT);
  EXPECT_EQ(Tick(15200).kind, REGROUP_DIRECTIVE_SCALE_IN);
}

TEST_F(EngineTest, ElasticAtTheLowerEdgeOfMindioScalesInAtOnce) {
  Submit(kForce, {{"recover-strategy", "elastic-training"}}, {{"MINDIO_WAIT_MINDX_TIME", "10"}});
  NodeFails(2, 0);
  const Directive& d = Tick(200);
  EXPECT_EQ(d.kind, REGROUP_DIRECTIVE_SCALE_IN);
  EXPECT_NE(d.reason.find("MINDIO_WAIT_MINDX_TIME - 10 s leaves no wait"), std::string::npos);
}

TEST_F(EngineTest, PreferElasticScalesInAtOnceAndOutWhenTheReplacementRegisters) {
  Submit(kForce, {{"recover-strategy", "recover,elastic-training"},
                  {"regroup.io/prefer-elastic", "true"}});
  NodeFails(1, 0);
  const Directive& in = Tick(200);
  EXPECT_EQ(in.kind, REGROUP_DIRECTIVE_SCALE_IN);
  EXPECT_EQ(in.keep_replicas, (std::vector<int64_t>{0, 2, 3}));
  Replace(1, 5000);
  const Directive& out = Tick(5100);
  EXPECT_EQ(out.kind, REGROUP_DIRECTIVE_SCALE_OUT);
  EXPECT_EQ(out.dp, 4);
  EXPECT_EQ(out.keep_replicas, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(job().phase(), REGROUP_PHASE_SCALING_OUT);
  Progress(3, 10, 6000);
  EXPECT_EQ(job().phase(), REGROUP_PHASE_RUNNING) << "the manager's new generation committed";
}

TEST_F(EngineTest, SecondFaultWhileScaledInScalesInAgain) {
  Submit(kForce, {{"recover-strategy", "elastic-training"}, {"regroup.io/prefer-elastic", "true"}});
  NodeFails(1, 0);
  EXPECT_EQ(Tick(200).dp, 3);
  NodeFails(3, 10000);
  const Directive& d = Tick(10200);
  EXPECT_EQ(d.kind, REGROUP_DIRECTIVE_SCALE_IN);
  EXPECT_EQ(d.dp, 2);
  EXPECT_EQ(d.keep_replicas, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(d.remove_replicas, (std::vector<int64_t>{3}));
}

TEST_F(EngineTest, LosingRankZerosPodKeepsTheOtherReplicasInOrder) {
  Submit(kForce, {{"recover-strategy", "elastic-training"}, {"regroup.io/prefer-elastic", "true"}});
  NodeFails(0, 0);
  const Directive& d = Tick(200);
  EXPECT_EQ(d.kind, REGROUP_DIRECTIVE_SCALE_IN);
  EXPECT_EQ(d.keep_replicas, (std::vector<int64_t>{1, 2, 3}))
      << "the first survivor becomes the new rank 0";
}

TEST_F(EngineTest, FaultDuringTheWaitRestartsTheDecisionWithTheNewFacts) {
  Submit(kForce, {{"recover-strategy", "recover,elastic-training"},
                  {"wait-reschedule-timeout", "30"}});
  NodeFails(1, 0);
  EXPECT_EQ(Tick(200).deadline_ms, 30200);
  NodeFails(2, 10000);
  const Directive& d = Tick(10200);
  EXPECT_EQ(d.kind, REGROUP_DIRECTIVE_WAIT);
  EXPECT_EQ(d.deadline_ms, 40200) << "a fresh wait for both pods";
  EXPECT_NE(d.reason.find("replacements of pods [1,2]"), std::string::npos) << d.reason;
  Replace(1, 20000);
  EXPECT_EQ(Tick(20100).kind, REGROUP_DIRECTIVE_WAIT) << "pod 2 is still missing";
  const Directive& in = Tick(40200);
  EXPECT_EQ(in.kind, REGROUP_DIRECTIVE_SCALE_IN);
  EXPECT_EQ(in.keep_replicas, (std::vector<int64_t>{0, 1, 3})) << "pod 1's replacement is in";
}

TEST_F(EngineTest, ReportWindowMergesAnExitAndACollectiveErrorIntoOneDecision) {
  Submit(kForce, {{"recover-strategy", "retry,recover-in-place"}});
  Fault("collective_error", {2}, 7, 1000);
  Fault("process_exit", {5}, 7, 1050);
  EXPECT_EQ(Tick(1199).kind, REGROUP_DIRECTIVE_CONTINUE);
  const Directive& d = Tick(1200);
  EXPECT_EQ(d.kind, REGROUP_DIRECTIVE_RESTART_IN_PLACE) << "the worse fault decides";
  EXPECT_EQ(d.restart_ranks, (std::vector<int64_t>{5}));
  EXPECT_EQ(job().history().size(), 1u) << "one decision for both reports";
}

// Issue 37: the manager says its faults are settled (every other pod answered the abort): the
// window closes at the next tick. A settle with no fault waiting, or one of a generation older
// than the manager's progress (sent again after a reconnect), leaves the next window whole.
TEST_F(EngineTest, FaultsSettledCloseTheReportWindowAtTheNextTick) {
  Submit(kForce, {{"recover-strategy", "retry,recover-in-place"}});
  Progress(3, 6, 900, 8);
  ASSERT_TRUE(engine_.ReportFaultsSettled(kJob, 3).ok());  // nothing waits: no effect
  Fault("process_exit", {5}, 7, 1000);
  EXPECT_EQ(Tick(1010).kind, REGROUP_DIRECTIVE_CONTINUE) << "the window is open";
  ASSERT_TRUE(engine_.ReportFaultsSettled(kJob, 2).ok());  // stale: ignored
  EXPECT_EQ(Tick(1020).kind, REGROUP_DIRECTIVE_CONTINUE);
  ASSERT_TRUE(engine_.ReportFaultsSettled(kJob, 3).ok());
  const Directive& d = Tick(1030);
  EXPECT_EQ(d.kind, REGROUP_DIRECTIVE_RESTART_IN_PLACE) << "decided 30 ms after the fault";
  EXPECT_EQ(d.restart_ranks, (std::vector<int64_t>{5}));
  // The next fault's window is whole again.
  Progress(4, 9, 1500, 8);
  Fault("collective_error", {2}, 10, 2000);
  EXPECT_EQ(Tick(2199).kind, REGROUP_DIRECTIVE_RESTART_IN_PLACE) << "no new decision yet";
  EXPECT_EQ(Tick(2200).kind, REGROUP_DIRECTIVE_RETRY);
  EXPECT_EQ(engine_.ReportFaultsSettled("default/other", 4).code(), REGROUP_NOT_FOUND);
}

TEST_F(EngineTest, CollectiveErrorAloneIsRetried) {
  Submit(kForce, {{"recover-strategy", "retry"}});
  Fault("collective_error", {0}, 12, 0);
  const Directive& d = Tick(200);
  EXPECT_EQ(d.kind, REGROUP_DIRECTIVE_RETRY);
  EXPECT_EQ(job().phase(), REGROUP_PHASE_RECOVERING);
  Progress(2, 12, 1000);
  EXPECT_EQ(job().phase(), REGROUP_PHASE_RUNNING);
}

TEST_F(EngineTest, ProcessExitWithoutInPlaceReplacesThePod) {
  Submit(kForce, {{"recover-strategy", "recover"}, {"wait-reschedule-timeout", "30"}});
  Fault("process_exit", {3}, 4, 0);
  const Directive& d = Tick(200);
  EXPECT_EQ(d.kind, REGROUP_DIRECTIVE_WAIT);
  EXPECT_NE(d.reason.find("recover-in-place is not allowed"), std::string::npos);
  EXPECT_TRUE(job().WantsPods());
  ASSERT_EQ(job().Evictions().size(), 1u);
  EXPECT_EQ(job().Evictions()[0].pod, 1) << "rank 3 lives on pod 1 (2 ranks a pod)";
}

TEST_F(EngineTest, PoisonStepEscalatesToDumpNamingTheStep) {
  Submit(kForce, {{"recover-strategy", "retry,dump"}});
  Fault("collective_error", {1}, 42, 0);
  EXPECT_EQ(Tick(200).kind, REGROUP_DIRECTIVE_RETRY);
  Fault("collective_error", {1}, 42, 1000);
  const Directive& d = Tick(1200);
  EXPECT_EQ(d.kind, REGROUP_DIRECTIVE_DUMP);
  EXPECT_EQ(d.reason.rfind("poison step 42: collective_error twice at the same step", 0), 0u)
      << d.reason;
}

// A dump has a complete replica write the checkpoint: one whose ranks were restarted in place
// since the last commit of every rank holds nothing to write (each replica here lost a rank), so
// the job goes to the checkpoint it has instead.
TEST_F(EngineTest, AReplicaWhoseRanksHoldNoStateDumpsNothing) {
  Submit(kForce, {{"recover-strategy", "recover-in-place,dump"}}, {}, 2, 2);  // a replica a pod
  Progress(1, 10, 0, 4);
  Fault("process_exit", {0}, 11, 100);
  ASSERT_EQ(Tick(400).kind, REGROUP_DIRECTIVE_RESTART_IN_PLACE);
  Fault("process_exit", {3}, 12, 600);
  ASSERT_EQ(Tick(900).kind, REGROUP_DIRECTIVE_RESTART_IN_PLACE) << "position 1 is on pod 0";
  Fault("process_exit", {3}, 12, 1200);  // the same step fails twice: escalated
  const Directive& d = Tick(1500);
  EXPECT_NE(d.reason.find("poison step 12"), std::string::npos) << d.reason;
  EXPECT_EQ(d.kind, REGROUP_DIRECTIVE_EXIT) << "no replica holds the whole state: no dump";
}

TEST_F(EngineTest, APassedStepIsNoLongerPoison) {
  Submit(kForce, {{"recover-strategy", "retry,dump"}});
  Fault("collective_error", {1}, 42, 0);
  Tick(200);
  Progress(2, 42, 500);  // step 42 committed on the retry
  Fault("collective_error", {1}, 42, 1000);
  EXPECT_EQ(Tick(1200).kind, REGROUP_DIRECTIVE_RETRY);
}

// The manager formed a generation after the fault and before the retry reached it (its rejoin,
// at the fault's abort): that generation does the step again, and its next commit ends the
// recovery, as a restart in place carried out before its decision does.
TEST_F(EngineTest, ARetryCarriedOutBeforeItsDecisionEndsAtTheNextCommit) {
  Submit(kForce, {{"recover-strategy", "retry,dump"}});
  Progress(1, 41, 0);
  Fault("collective_error", {1}, 42, 0);
  Progress(2, 41, 50);  // formed at the abort, before the decision
  ASSERT_EQ(Tick(200).kind, REGROUP_DIRECTIVE_RETRY);
  EXPECT_EQ(job().phase(), REGROUP_PHASE_RECOVERING);
  Progress(2, 42, 500);  // the same generation commits the step
  EXPECT_EQ(job().phase(), REGROUP_PHASE_RUNNING);
}

TEST_F(EngineTest, RecoveryBudgetExhaustedEscalates) {
  Submit(kForce, {{"recover-strategy", "retry"}, {"regroup.io/recovery-budget", "2"},
                  {"regroup.io/recovery-window-s", "60"}});
  Fault("collective_error", {0}, 1, 0);
  EXPECT_EQ(Tick(200).kind, REGROUP_DIRECTIVE_RETRY);
  Fault("collective_error", {0}, 2, 1000);
  EXPECT_EQ(Tick(1200).kind, REGROUP_DIRECTIVE_RETRY);
  Fault("collective_error", {0}, 3, 2000);
  const Directive& d = Tick(2200);
  EXPECT_EQ(d.kind, REGROUP_DIRECTIVE_EXIT);
  EXPECT_NE(d.reason.find("recovery budget exhausted: 2 recoveries in the last 60 s"),
            std::string::npos)
      << d.reason;
}

TEST_F(EngineTest, RecoveryBudgetRecoversAfterTheWindow) {
  Submit(kForce, {{"recover-strategy", "retry"}, {"regroup.io/recovery-budget", "1"},
                  {"regroup.io/recovery-window-s", "60"}});
  Fault("collective_error", {0}, 1, 0);
  EXPECT_EQ(Tick(200).kind, REGROUP_DIRECTIVE_RETRY);
  Fault("collective_error", {0}, 2, 60200);
  EXPECT_EQ(Tick(60400).kind, REGROUP_DIRECTIVE_RETRY);
}

TEST_F(EngineTest, ProcessRecoverOffGoesToJobLevelRetriesThenExit) {
  Submit({{"fault-scheduling", "force"}, {"process-recover-enable", "off"},
          {"fault-retry-times", "1"}},
         {{"recover-strategy", "recover"}});
  NodeFails(1, 0);
  const Directive& d = Tick(200);
  EXPECT_EQ(d.kind, REGROUP_DIRECTIVE_RESTART_JOB);
  EXPECT_EQ(job().phase(), REGROUP_PHASE_RESTARTING);
  EXPECT_EQ(job().Evictions().size(), 4u) << "every pod is restarted, the lost one evicted too";
  // All pods come back; the job resumes at full size.
  ReplaceAll(5000, "node-new-");
  EXPECT_EQ(Tick(5100).kind, REGROUP_DIRECTIVE_RESUME);
  EXPECT_EQ(job().phase(), REGROUP_PHASE_RUNNING);
  NodeFails(5, 9000);  // not the job's node: nothing happens
  EXPECT_EQ(Tick(9200).kind, REGROUP_DIRECTIVE_RESUME);
  NodeNamedFails("node-new-2", 10000);
  EXPECT_EQ(Tick(10200).kind, REGROUP_DIRECTIVE_EXIT) << "the retries are used up";
}

TEST_F(EngineTest, FaultSchedulingOffMeansNoRecoveryAndNoEvictions) {
  Submit({}, {{"recover-strategy", "recover,elastic-training"}});
  NodeFails(1, 0);
  EXPECT_TRUE(job().Evictions().empty());
  EXPECT_EQ(Tick(200).kind, REGROUP_DIRECTIVE_EXIT);
  EXPECT_FALSE(job().WantsPods());
}

TEST_F(EngineTest, GraceEvictsWithTheGracePeriod) {
  Submit({{"fault-scheduling", "grace"}}, {{"recover-strategy", "recover"}});
  NodeFails(1, 0);
  ASSERT_EQ(job().Evictions().size(), 1u);
  EXPECT_FALSE(job().Evictions()[0].force);
}

TEST_F(EngineTest, PauseHoldsTheFaultUntilItIsOnAgain) {
  Submit({{"fault-scheduling", "force"}, {"process-recover-enable", "pause"}},
         {{"recover-strategy", "retry"}});
  Fault("collective_error", {0}, 3, 0);
  const Directive& held = Tick(200);
  EXPECT_EQ(held.kind, REGROUP_DIRECTIVE_WAIT);
  EXPECT_EQ(held.strategy, "pause");
  EXPECT_EQ(job().phase(), REGROUP_PHASE_PAUSED);
  // The label flips to on: the held fault is decided.
  JobSpec spec = job().spec();
  spec.labels["process-recover-enable"] = "on";
  ASSERT_TRUE(engine_.UpsertJob(spec, nullptr, 5000).ok());
  EXPECT_EQ(Tick(5000).kind, REGROUP_DIRECTIVE_RETRY);
}

TEST_F(EngineTest, PauseThatOutlastsTheDecisionWaitGoesToJobLevel) {
  Submit({{"fault-scheduling", "force"}, {"process-recover-enable", "pause"}},
         {{"recover-strategy", "retry"}}, {{"MINDIO_WAIT_MINDX_TIME", "20"}});
  Fault("collective_error", {0}, 3, 0);
  Tick(200);
  EXPECT_EQ(Tick(20199).kind, REGROUP_DIRECTIVE_WAIT);
  const Directive& d = Tick(20200);
  EXPECT_EQ(d.kind, REGROUP_DIRECTIVE_EXIT);
  EXPECT_NE(d.reason.find("stayed paused"), std::string::npos);
}

TEST_F(EngineTest, InPlaceRestartWithoutAPeerReplicaNeedsACheckpoint) {
  // One replica (tp=8 over 4 pods x 2): nobody to receive state from.
  Submit(kForce, {{"recover-strategy", "recover-in-place"}, {"regroup.io/tensor-parallel", "8"}});
  Fault("process_exit", {3}, 1, 0);
  const Directive& d = Tick(200);
  EXPECT_EQ(d.kind, REGROUP_DIRECTIVE_EXIT);
  EXPECT_NE(d.reason.find("a checkpoint is needed"), std::string::npos);
}

TEST_F(EngineTest, AShardWhoseEveryCopyIsLostNeedsACheckpoint) {
  // Two replicas of tp=4, each over two pods: replica 0 = pods 0, 1 (positions 0-1, 2-3),
  // replica 1 = pods 2, 3. Losing pod 1 and pod 3 loses positions 2 and 3 of both replicas:
  // their replacements would have nobody to receive those shards from.
  Submit(kForce, {{"recover-strategy", "recover"}, {"regroup.io/tensor-parallel", "4"}});
  Progress(1, 10, 0);
  NodeFails(1, 100);
  NodeFails(3, 100);
  ExpectShardLost(Tick(400), REGROUP_DIRECTIVE_RESTART_JOB, "s [2,3]");
}

TEST_F(EngineTest, ShardsHeldInDifferentReplicasAreRecoveredFromTheSurvivors) {
  // Pods 1 and 2 lost: replica 0 keeps positions 0-1, replica 1 positions 2-3; every shard has
  // a survivor, so the job waits for replacements as `recover` says.
  Submit(kForce, {{"recover-strategy", "recover"}, {"regroup.io/tensor-parallel", "4"}});
  Progress(1, 10, 0);
  NodeFails(1, 100);
  NodeFails(2, 100);
  EXPECT_EQ(Tick(400).kind, REGROUP_DIRECTIVE_WAIT);
}

TEST_F(EngineTest, ARestartedRankWithoutAnotherCopyOfItsShardNeedsACheckpoint) {
  // One replica (tp=8 over 4 pods x 2) after a commit: a process that dies loses the only copy
  // of its shard, whether its pod is replaced or restarted in place.
  Submit(kForce, {{"recover-strategy", "recover"}, {"regroup.io/tensor-parallel", "8"}});
  Progress(1, 10, 0);
  Fault("process_exit", {3}, 11, 100);
  // A fault of the training's own: no reschedule without fault-retry-times.
  ExpectShardLost(Tick(400), REGROUP_DIRECTIVE_EXIT, " [3]");
}

// Found by the simulation (seed 2461): a rank restarted in place holds nothing until the census
// of a generation of every rank gives it the state; while its survivors train on without it, a
// fault of its only peer at that position left no copy, and the engine restarted that peer in
// place "with state from a peer replica" too.
TEST_F(EngineTest, ARankRestartedInPlaceHoldsNoStateUntilAGenerationOfEveryRankCommits) {
  RestartRank0InPlaceWhileTheSurvivorsTrainOn();
  Fault("process_exit", {2}, 13, 600);
  ExpectShardLost(Tick(900), REGROUP_DIRECTIVE_EXIT, " [0]");
}

TEST_F(EngineTest, ARankRestartedInPlaceHoldsTheStateOnceAGenerationOfEveryRankCommitted) {
  RestartRank0InPlaceWhileTheSurvivorsTrainOn();
  Progress(3, 13, 700, 4);  // rank 0 rejoined, received the state, and the step committed
  Fault("process_exit", {2}, 14, 800);
  EXPECT_EQ(Tick(1100).kind, REGROUP_DIRECTIVE_RESTART_IN_PLACE);
}

// Found by the simulation (seed 144): a replica joining at a scale-out holds nothing until a
// generation of every rank commits, and a pod replaced for one hung rank gives up its healthy
// rank too; here that rank was the last holder of the state, and the job scaled in to the
// replicas that had just joined.
TEST_F(EngineTest, ReplacingAPodForAHungRankGivesUpItsHealthyRankToo) {
  // tp=1, 2 pods x 2: replicas 0, 1 on pod 0; replicas 2, 3 on pod 1.
  Submit(kForce, {{"recover-strategy", "elastic-training"}, {"regroup.io/prefer-elastic", "true"},
                  {"regroup.io/tensor-parallel", "1"}},
         {}, 2, 2);
  Progress(1, 10, 0, 4);
  NodeFails(1, 100);
  ASSERT_EQ(Tick(400).kind, REGROUP_DIRECTIVE_SCALE_IN);
  Progress(2, 12, 500, 2);
  Replace(1, 600);
  ASSERT_EQ(Tick(700).kind, REGROUP_DIRECTIVE_SCALE_OUT);
  Fault("hang", {0}, 13, 800);  // before the scaled-out generation committed anything
  ExpectShardLost(Tick(1100), REGROUP_DIRECTIVE_EXIT, " [0]");
}

// Found by the simulation (seed 29096): the replicas a scale-in keeps must hold every shard
// between them. Replica 1 kept the only copy of position 0 (pod 2) but lost pod 3; replica 0
// lost pod 0 and got a replacement with nothing; the deadline's scale-in kept replica 0 alone.
TEST_F(EngineTest, AScaleInThatWouldKeepNoHolderOfAShardNeedsACheckpoint) {
  Submit(kForce, {{"recover-strategy", "recover,elastic-training"},
                  {"wait-reschedule-timeout", "30"}},
         {}, 4, 1);  // tp=2 over 1-process pods: replica 0 = pods 0, 1; replica 1 = pods 2, 3
  Progress(1, 10, 0, 4);
  NodeFails(3, 100);
  ASSERT_EQ(Tick(400).kind, REGROUP_DIRECTIVE_WAIT);
  NodeFails(0, 500);
  ASSERT_EQ(Tick(800).kind, REGROUP_DIRECTIVE_WAIT);
  Replace(0, 900);
  EXPECT_EQ(Tick(1000).kind, REGROUP_DIRECTIVE_WAIT) << "replica 0 alone holds no position 0";
  const Directive& d = Tick(40000);
  ExpectShardLost(d, REGROUP_DIRECTIVE_RESTART_JOB, " [0]");
  EXPECT_NE(d.reason.find("scaling in would keep no holder"), std::string::npos) << d.reason;
}

// Every process of a job restart takes the checkpoint: a pod lost while the job restarts holds
// the state once the job resumed, though the steps after the checkpoint are below the step at
// which it was lost.
TEST_F(EngineTest, APodLostDuringAJobRestartHoldsTheCheckpointOnceTheJobResumed) {
  Submit(kForce, {{"recover-strategy", "recover"}}, {}, 2, 2);  // a tp-2 replica per pod
  Progress(1, 100, 0, 4);
  NodeFails(0, 100);
  NodeFails(1, 100);
  ASSERT_EQ(Tick(400).kind, REGROUP_DIRECTIVE_RESTART_JOB) << "both copies of every shard lost";
  Replace(0, 500);
  NodeNamedFails("spare-0", 600);  // pod 0's replacement is lost too, while the job restarts
  Replace(0, 700, "spare-x");
  Replace(1, 700);
  ASSERT_EQ(Tick(800).kind, REGROUP_DIRECTIVE_RESUME);
  Progress(2, 41, 900, 4);  // resumed from the checkpoint of step 40, every rank training
  NodeNamedFails("spare-1", 1000);
  EXPECT_EQ(Tick(1300).kind, REGROUP_DIRECTIVE_WAIT) << "pod 0 holds every shard";
}

TEST_F(EngineTest, BeforeTheFirstCommitALostShardStartsFromItsInitialisation) {
  Submit(kForce, {{"recover-strategy", "recover"}, {"regroup.io/tensor-parallel", "4"}});
  NodeFails(1, 100);
  NodeFails(3, 100);
  EXPECT_EQ(Tick(400).kind, REGROUP_DIRECTIVE_WAIT);
}

// A restarted manager names a process that died before it formed a generation by its pod's local
// rank (it knows none of the engine's generations): the engine names it by the rank it holds in
// its own generation, and holds nothing against a process that holds no rank in it.
TEST_F(EngineTest, AFaultByLocalRankIsNamedByTheRankItHoldsInTheGeneration) {
  Submit(kForce, {{"recover-strategy", "recover-in-place,elastic-training"},
                  {"regroup.io/prefer-elastic", "true"}},
         {}, 3, 2);  // replica r on pod r
  Progress(1, 10, 0, 6);
  NodeFails(0, 100);
  ASSERT_EQ(Tick(400).kind, REGROUP_DIRECTIVE_SCALE_IN);
  Progress(2, 12, 500, 4);  // replicas 1 and 2: ranks 0, 1 on pod 1; 2, 3 on pod 2
  PendingFault f{FaultKind::kProcessExit, {2}, {}, 13, 600, "exit code 1"};
  f.local_ranks = {1};
  ASSERT_TRUE(engine_.ReportFault(kJob, f).ok());
  const Directive& d = Tick(900);
  EXPECT_EQ(d.kind, REGROUP_DIRECTIVE_RESTART_IN_PLACE) << d.reason;
  EXPECT_EQ(d.restart_ranks, (std::vector<int64_t>{3})) << "pod 2's local rank 1";
}

TEST_F(EngineTest, AFaultByLocalRankNamesOnePodAndALocalRankItHas) {
  Submit(kForce, {{"recover-strategy", "recover-in-place"}}, {}, 2, 2);
  PendingFault f{FaultKind::kProcessExit, {0, 1}, {}, -1, 100, ""};
  f.local_ranks = {0};
  Status st = engine_.ReportFault(kJob, f);
  EXPECT_EQ(st.code(), REGROUP_INVALID_ARGUMENT);
  EXPECT_EQ(st.message(),
            "a fault for job default/train names local ranks of 2 pods; they must be of one");
  f.pods = {1};
  f.local_ranks = {2};
  st = engine_.ReportFault(kJob, f);
  EXPECT_EQ(st.code(), REGROUP_INVALID_ARGUMENT);
  EXPECT_EQ(st.message(),
            "job default/train has 2 processes per pod, so no local rank 2");
  EXPECT_EQ(Tick(400).kind, REGROUP_DIRECTIVE_CONTINUE) << "nothing was taken";
}

// The manager found no rank of the next generation holding a shard (what this engine knows may be
// older): the job goes to the checkpoint, and the fault needs no pod.
TEST_F(EngineTest, AStateLostFaultGoesToTheCheckpoint) {
  Submit({{"fault-scheduling", "force"}, {"fault-retry-times", "1"}},
         {{"recover-strategy", "recover-in-place,elastic-training"}});
  Progress(1, 10, 0);
  Fault("state_lost", {}, -1, 100);
  const Directive& d = Tick(400);
  EXPECT_EQ(d.kind, REGROUP_DIRECTIVE_RESTART_JOB) << d.reason;
  EXPECT_NE(d.reason.find("state_lost"), std::string::npos) << d.reason;
  EXPECT_NE(d.reason.find("a checkpoint is needed"), std::string::npos) << d.reason;
}

TEST_F(EngineTest, ScaleInBelowTheMinimumEscalates) {
  Submit(kForce, {{"recover-strategy", "elastic-training,dump"},
                  {"regroup.io/prefer-elastic", "true"},
                  {"regroup.io/min-data-parallel", "4"}});
  NodeFails(0, 0);
  const Directive& d = Tick(200);
  EXPECT_EQ(d.kind, REGROUP_DIRECTIVE_DUMP);
  EXPECT_NE(d.reason.find("3 complete replicas left, below the minimum data-parallel degree 4"),
            std::string::npos)
      << d.reason;
}

TEST_F(EngineTest, SpanningReplicaLeavesAWarmStandbyThatOneReplacementCompletes) {
  // tp=4 over 2-process pods: replica r = pods 2r, 2r+1.
  Submit(kForce, {{"recover-strategy", "elastic-training"}, {"regroup.io/prefer-elastic", "true"},
                  {"regroup.io/tensor-parallel", "4"}});
  NodeFails(3, 0);
  const Directive& in = Tick(200);
  EXPECT_EQ(in.dp, 1);
  EXPECT_EQ(in.standby_pods, (std::vector<int64_t>{2}));
  Replace(3, 4000);
  const Directive& out = Tick(4100);
  EXPECT_EQ(out.kind, REGROUP_DIRECTIVE_SCALE_OUT);
  EXPECT_EQ(out.dp, 2);
}

TEST_F(EngineTest, StandbyLossNeedsNoRecovery) {
  Submit(kForce, {{"recover-strategy", "elastic-training"}, {"regroup.io/prefer-elastic", "true"},
                  {"regroup.io/tensor-parallel", "4"}});
  NodeFails(3, 0);
  Tick(200);
  const uint64_t id = job().directive().id;
  NodeFails(2, 1000);  // the standby's node
  Tick(1200);
  EXPECT_EQ(job().directive().id, id);
  EXPECT_EQ(job().phase(), REGROUP_PHASE_SCALED_IN);
}

TEST_F(EngineTest, RepeatedScaleOutsBackOff) {
  Submit(kForce, {{"recover-strategy", "elastic-training"}, {"regroup.io/prefer-elastic", "true"},
                  {"regroup.io/scale-out-backoff-s", "10"}});
  NodeFails(1, 0);
  Tick(200);
  Replace(1, 1000, "spare-a");
  EXPECT_EQ(Tick(1100).kind, REGROUP_DIRECTIVE_SCALE_OUT) << "the first scale-out is immediate";
  engine_.SetNodeHealth("spare-a", REGROUP_NODE_FAULTY, "flapping", 2000).ok();
  EXPECT_EQ(Tick(2200).kind, REGROUP_DIRECTIVE_SCALE_IN);
  Replace(1, 3000, "spare-b");
  EXPECT_EQ(Tick(3100).kind, REGROUP_DIRECTIVE_SCALE_IN) << "backing off";
  EXPECT_EQ(Tick(12199).kind, REGROUP_DIRECTIVE_SCALE_IN);
  EXPECT_EQ(Tick(12200).kind, REGROUP_DIRECTIVE_SCALE_OUT) << "10 s after the last scale-in";
}

TEST_F(EngineTest, FailedNodesAreAvoidedForAWhile) {
  Submit(kForce, {{"recover-strategy", "recover"}, {"regroup.io/node-avoid-s", "60"}});
  NodeFails(2, 1000);
  EXPECT_TRUE(job().Avoids("node-2"));
  EXPECT_FALSE(engine_.NodeAllowed(&job(), "node-2"));
  engine_.SetNodeHealth("node-2", REGROUP_NODE_HEALTHY, "", 2000).ok();
  EXPECT_FALSE(engine_.NodeAllowed(&job(), "node-2")) << "healthy again, still avoided";
  Tick(60999);
  EXPECT_TRUE(job().Avoids("node-2"));
  Tick(61000);
  EXPECT_TRUE(engine_.NodeAllowed(&job(), "node-2"));
}

// The manager learns of a lost pod (its stream broke and was not resumed) long before Kubernetes
// marks the node NotReady (40 s by default): the replacement must not go back to that node, which
// is still Ready in the API (found on the real control plane, integration/kube_test.py).
TEST_F(EngineTest, ThePodOfALostPodsNodeIsPlacedElsewhere) {
  Submit(kForce, {{"recover-strategy", "recover"}, {"regroup.io/node-avoid-s", "60"}});
  Fault("pod_lost", {2, 3}, 5, 1000);  // pod 1's ranks (tp 2)
  EXPECT_TRUE(job().Avoids("node-1"));
  EXPECT_FALSE(engine_.NodeAllowed(&job(), "node-1"));
  EXPECT_EQ(job().Score(1, "node-1"), 0);
  EXPECT_TRUE(engine_.NodeAllowed(&job(), "node-0"));
  Tick(61000);
  EXPECT_TRUE(engine_.NodeAllowed(&job(), "node-1"));
}

TEST_F(EngineTest, NodeScorePrefersThePreviousNodeAndTheReplicasPeers) {
  Submit(kForce, {{"recover-strategy", "recover"}, {"regroup.io/tensor-parallel", "4"},
                  {"regroup.io/node-avoid-s", "0"}});
  ASSERT_TRUE(engine_.SetPodState(kJob, 1, "uid-1", REGROUP_POD_FAILED, "", 10).ok());
  EXPECT_EQ(job().Score(1, "node-1"), 100);
  EXPECT_EQ(job().Score(1, "node-0"), 50) << "pod 0 is pod 1's replica peer";
  EXPECT_EQ(job().Score(1, "node-3"), 0);
}

TEST_F(EngineTest, ZombieRegistrationIsRefused) {
  Submit(kForce, {{"recover-strategy", "recover"}});
  NodeFails(1, 0);
  json reg = {{"type", "replacement_registered"}, {"job", kJob}, {"index", 1}, {"uid", "uid-1"}};
  Status st = engine_.ApplyEvents(reg, 100);
  EXPECT_EQ(st.code(), REGROUP_FAILED_PRECONDITION);
  EXPECT_EQ(st.message(),
            "pod 1 of job default/train with uid uid-1 is the incarnation that was lost (a "
            "zombie); a replacement registers with its own new uid");
}

TEST_F(EngineTest, BadEventsNameWhatIsWrongAndChangeNothing) {
  Submit(kForce, {{"recover-strategy", "recover"}});
  json events = json::array({{{"type", "node"}, {"node", "node-1"}, {"health", "faulty"}},
                             {{"type", "pod"}, {"job", kJob}, {"index", 9}, {"uid", "x"},
                              {"phase", "running"}}});
  Status st = engine_.ApplyEvents(events, 0);
  EXPECT_EQ(st.code(), REGROUP_INVALID_ARGUMENT);
  EXPECT_EQ(st.message(), "event 1: job default/train has no pod 9 (it has 4)");
  st = engine_.ApplyEvents(json{{"type", "fault"}, {"job", kJob}, {"kind", "meteor"}}, 0);
  EXPECT_EQ(st.message(), "the event field \"kind\" is not a fault kind: meteor");
  st = engine_.ApplyEvents(json{{"type", "fault"}, {"job", kJob}, {"kind", "hang"},
                                {"ranks", {99}}}, 0);
  EXPECT_EQ(st.message(), "job default/train has no rank 99 in its current generation of 8 ranks");
  st = engine_.ApplyEvents(json{{"type", "pod"}, {"job", "nope"}}, 0);
  EXPECT_EQ(st.code(), REGROUP_NOT_FOUND);
}

// "manager_status" is the former spelling of the "manager_progress" event; the ABI keeps
// accepting it, and it means the same: the same progress, state and decision as the new one.
TEST_F(EngineTest, ManagerProgressEventIsAlsoAcceptedByItsFormerName) {
  Submit(kForce, {{"recover-strategy", "recover-in-place,recover"}});
  Engine former;
  ASSERT_TRUE(former.UpsertJob(job().spec(), nullptr, 0).ok());
  for (int64_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(former.SetNodeHealth(Node(i), REGROUP_NODE_HEALTHY, "", 0).ok());
    ASSERT_TRUE(former.SetPodState(kJob, i, Uid(i), REGROUP_POD_RUNNING, Node(i), 0).ok());
  }
  auto progress = [](const char* type, int64_t step) {
    return json{{"type", type},        {"job", kJob},           {"epoch", 1},
                {"generation", 1},     {"committed_step", step}, {"live_ranks", 8}};
  };
  Status st = engine_.ApplyEvents(progress("manager_progress", 5), 100);
  ASSERT_TRUE(st.ok()) << st.message();
  st = former.ApplyEvents(progress("manager_status", 5), 100);
  ASSERT_TRUE(st.ok()) << st.message();
  const Job& old_named = *former.FindJob(kJob);
  EXPECT_EQ(job().manager_progress().committed_step, 5);
  EXPECT_EQ(old_named.manager_progress().committed_step, 5);
  EXPECT_EQ(old_named.manager_progress().live_ranks, 8);
  EXPECT_EQ(old_named.StateJson(), job().StateJson());
  // The same fault then leads to the same decision on both.
  json fault = {{"type", "fault"}, {"job", kJob}, {"kind", "process_exit"}, {"ranks", {3}},
                {"step", 6}};
  ASSERT_TRUE(engine_.ApplyEvents(fault, 200).ok());
  ASSERT_TRUE(former.ApplyEvents(fault, 200).ok());
  engine_.Tick(500);
  former.Tick(500);
  EXPECT_EQ(job().directive().committed_step, 5);
  EXPECT_EQ(old_named.DecisionJson(), job().DecisionJson());
  EXPECT_EQ(old_named.StateJson(), job().StateJson());
}

TEST_F(EngineTest, InvalidUpdateKeepsTheAcceptedJob) {
  Submit(kForce, {{"recover-strategy", "recover"}});
  NodeFails(1, 0);
  Tick(200);
  JobSpec bad = job().spec();
  bad.annotations["regroup.io/min-data-parallel"] = "zero";
  Status st = engine_.UpsertJob(bad, nullptr, 300);
  EXPECT_EQ(st.code(), REGROUP_VALIDATION_FAILED);
  EXPECT_EQ(job().phase(), REGROUP_PHASE_WAITING) << "nothing already accepted is lost";
  EXPECT_EQ(job().spec().annotations.count("regroup.io/min-data-parallel"), 0u);
}

TEST_F(EngineTest, JobStateRoundTripKeepsTheDeadline) {
  Submit(kForce, {{"recover-strategy", "recover,elastic-training"},
                  {"wait-reschedule-timeout", "30"}});
  NodeFails(3, 0);
  Tick(200);
  const json state = job().StateJson();
  // A scheduler restart: a new engine, the same job, the state from the PodGroup annotation.
  Engine restarted;
  ASSERT_TRUE(restarted.UpsertJob(job().spec(), nullptr, 0).ok());
  Job& again = *restarted.FindJob(kJob);
  ASSERT_TRUE(again.LoadState(state).ok());
  EXPECT_EQ(again.phase(), REGROUP_PHASE_WAITING);
  EXPECT_EQ(again.directive().deadline_ms, 30200);
  restarted.Tick(30199);
  EXPECT_EQ(again.directive().kind, REGROUP_DIRECTIVE_WAIT);
  restarted.Tick(30200);
  EXPECT_EQ(again.directive().kind, REGROUP_DIRECTIVE_SCALE_IN);
  EXPECT_EQ(again.StateJson()["phase"], "scaled_in");
}

// What holds no state survives a scheduler restart: a coordinator restored from its snapshot
// does not take a rank restarted in place for a holder.
TEST_F(EngineTest, JobStateRoundTripKeepsTheRanksWithoutState) {
  Submit(kForce, {{"recover-strategy", "recover-in-place"}}, {}, 2, 2);
  Progress(1, 10, 0, 4);
  Fault("process_exit", {0}, 11, 100);
  ASSERT_EQ(Tick(400).kind, REGROUP_DIRECTIVE_RESTART_IN_PLACE);
  const json state = job().StateJson();
  EXPECT_EQ(state["stateless_ranks"], "0");
  EXPECT_EQ(state["stateless_after_step"], 10);
  Engine restarted;
  ASSERT_TRUE(restarted.UpsertJob(job().spec(), nullptr, 0).ok());
  Job& again = *restarted.FindJob(kJob);
  ASSERT_TRUE(again.LoadState(state).ok());
  EXPECT_EQ(again.StateJson(), state);
  json bad = state;
  bad["stateless_ranks"] = "0-9";
  EXPECT_EQ(again.LoadState(bad).message(),
            "job state field \"stateless_ranks\" holds 9; items must be from 0 to 3");
}

TEST_F(EngineTest, StateOfAnotherJobIsRefused) {
  Submit(kForce, {{"recover-strategy", "recover"}});
  json state = job().StateJson();
  state["uid"] = "another";
  Status st = job().LoadState(state);
  EXPECT_EQ(st.code(), REGROUP_FAILED_PRECONDITION);
  state = job().StateJson();
  state["pods"]["phases"] = "rrr";
  st = job().LoadState(state);
  EXPECT_EQ(st.code(), REGROUP_INVALID_ARGUMENT);
  EXPECT_EQ(st.message(),
            "job state pods field \"phases\" must hold one character a pod (4), not 3");
  state = job().StateJson();
  state["version"] = 3;
  EXPECT_EQ(job().LoadState(state).code(), REGROUP_VERSION_MISMATCH);
}

// A mass failure of a large job: 2,048 pods (a replica each) on their own nodes, half of them
// lost with 4 KiB details (the most a detail keeps upstream), a quarter through their nodes and
// a quarter through device faults. Names are as long as a cluster's: 36-character pod uids.
class LargeJobState {
 public:
  static constexpr int64_t kPods = 2048;
  static std::string PodUid(int64_t i, int64_t incarnation = 0) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%08llx-%04llx-4000-8000-%012llx",
                  static_cast<unsigned long long>(i * 2654435761u % 4294967296u),
                  static_cast<unsigned long long>(incarnation),
                  static_cast<unsigned long long>(i));
    return buf;
  }
  static std::string NodeName(int64_t i) {
    return "gpu-node-" + std::string(i < 10000 ? "0" : "") + std::to_string(10000 + i).substr(1);
  }
  static JobSpec Spec() {
    JobSpec spec;
    spec.id = kJob;
    spec.uid = "job-uid";
    spec.labels = kForce;
    spec.annotations = {{"recover-strategy", "recover,elastic-training"},
                        {"wait-reschedule-timeout", "30"},
                        {"regroup.io/tensor-parallel", "2"}};
    spec.pods = kPods;
    spec.processes_per_pod = 2;
    return spec;
  }
  // The job, running from t=0, then the failure at t=1000.
  static void Fail(Engine& e) {
    ASSERT_TRUE(e.UpsertJob(Spec(), nullptr, 0).ok());
    for (int64_t i = 0; i < kPods; ++i)
      ASSERT_TRUE(e.SetPodState(kJob, i, PodUid(i), REGROUP_POD_RUNNING, NodeName(i), 0).ok());
    const std::string long_text(4096, 'x');
    for (int64_t i = kPods / 2; i < kPods * 3 / 4; ++i)
      ASSERT_TRUE(e.SetNodeHealth(NodeName(i), REGROUP_NODE_FAULTY, long_text, 1000).ok());
    for (int64_t i = kPods * 3 / 4; i < kPods; ++i) {
      PendingFault f{FaultKind::kDeviceError, {i}, {}, 7, 1000, long_text};
      ASSERT_TRUE(e.ReportFault(kJob, std::move(f)).ok());
    }
  }
  // What a restarted scheduler does in its first session (go/volcano): it reports every pod it
  // sees, then the nodes that are not healthy. To an engine that knows them, nothing changes.
  static void Report(Engine& e, int64_t now) {
    for (int64_t i = 0; i < kPods; ++i)
      ASSERT_TRUE(e.SetPodState(kJob, i, PodUid(i), REGROUP_POD_RUNNING, NodeName(i), now).ok());
    for (int64_t i = kPods / 2; i < kPods * 3 / 4; ++i)
      ASSERT_TRUE(e.SetNodeHealth(NodeName(i), REGROUP_NODE_FAULTY, "NotReady", now).ok());
  }
  // A decision without its free text, which a restored state keeps only in part.
  static json Decision(const Engine& e) {
    json d = e.FindJob(kJob)->DecisionJson();
    d["directive"].erase("reason");
    return d;
  }
};

TEST_F(EngineTest, JobStateOfAMassFailureFitsAnAnnotationAndRestoresTheSameDecisions) {
  using L = LargeJobState;
  Engine original;
  L::Fail(original);
  std::string largest_text;
  size_t largest = 0;
  // Saved at each point a scheduler saves it: faults inside their report window, the wait for
  // replacements (its reason names every fault), the scale-in at the deadline, the scale-out.
  for (int64_t now : {int64_t{1000}, int64_t{1200}, int64_t{31200}, int64_t{40000}}) {
    original.Tick(now);
    if (now == 40000)  // half of the lost pods are replaced; the next tick scales out
      for (int64_t i = L::kPods / 2; i < L::kPods * 3 / 4; ++i) {
        ASSERT_TRUE(original.SetPodState(kJob, i, L::PodUid(i, 1), REGROUP_POD_RUNNING,
                                         "spare-" + std::to_string(i), now).ok());
        ASSERT_TRUE(original.ReportReplacementRegistered(kJob, i, L::PodUid(i, 1), now).ok());
      }
    const json state = original.FindJob(kJob)->StateJson();
    const std::string text = state.dump();
    if (text.size() > largest) largest = text.size(), largest_text = text;
    EXPECT_LT(text.size(), 64u * 1024) << "at t=" << now;

    Engine restored;
    ASSERT_TRUE(restored.UpsertJob(L::Spec(), nullptr, 0).ok());
    Status st = restored.FindJob(kJob)->LoadState(state);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(restored.FindJob(kJob)->StateJson().dump(), text) << "export -> import -> export";

    // From here both engines see the same: the scheduler's first session, then ticks until the
    // deadline and past it, replacements, and a survivor's node failing.
    Engine& a = original;
    Engine b = std::move(restored);
    Engine copy_of_a;
    ASSERT_TRUE(copy_of_a.Restore(a.Snapshot()).ok());
    L::Report(copy_of_a, now);
    L::Report(b, now);
    EXPECT_EQ(L::Decision(b), L::Decision(copy_of_a)) << "at t=" << now;
    EXPECT_EQ(b.FindJob(kJob)->directive().id, copy_of_a.FindJob(kJob)->directive().id);
    for (int64_t later : {now + 200, int64_t{31199}, int64_t{31200}, int64_t{50000}}) {
      if (later == 50000) {
        for (Engine* e : {&copy_of_a, &b}) {
          ASSERT_TRUE(e->SetPodState(kJob, L::kPods - 1, L::PodUid(L::kPods - 1, 2),
                                     REGROUP_POD_RUNNING, "spare-last", later).ok());
          ASSERT_TRUE(
              e->ReportReplacementRegistered(kJob, L::kPods - 1, L::PodUid(L::kPods - 1, 2), later)
                  .ok());
          ASSERT_TRUE(
              e->SetNodeHealth(L::NodeName(0), REGROUP_NODE_FAULTY, "NotReady", later).ok());
        }
      }
      if (later <= now) continue;
      copy_of_a.Tick(later);
      b.Tick(later);
      EXPECT_EQ(L::Decision(b), L::Decision(copy_of_a))
          << "saved at t=" << now << ", at t=" << later;
      EXPECT_EQ(b.FindJob(kJob)->phase(), copy_of_a.FindJob(kJob)->phase());
    }
  }
  std::cout << "largest job state of 2,048 pods, half lost: " << largest << " bytes\n";
  // For the real API server's check (integration/kube_test.py): the largest state, written out.
  if (const char* out = std::getenv("REGROUP_DUMP_LARGEST_STATE")) {
    std::ofstream f(out);
    f << largest_text;
    ASSERT_TRUE(f.good()) << "writing " << out;
  }
}

TEST_F(EngineTest, JobStateOfVersionOneStillLoads) {
  Submit(kForce, {{"recover-strategy", "recover,elastic-training"},
                  {"wait-reschedule-timeout", "30"}});
  NodeFails(3, 0);
  Tick(200);
  // What the previous version wrote at this point (one object a pod, whole reasons).
  json v1 = {{"version", 1}, {"job", kJob}, {"uid", "job-uid"}, {"phase", "waiting"},
             {"directive", {{"id", 1}, {"kind", "wait"}, {"at_ms", 200}, {"deadline_ms", 30200},
                            {"strategy", "recover"}, {"dp", 4}, {"keep_replicas", {0, 1, 2, 3}},
                            {"remove_replicas", json::array()}, {"standby_pods", json::array()},
                            {"restart_ranks", json::array()}, {"microbatches", json::array()},
                            {"committed_step", -1}, {"reason", job().directive().reason}}},
             {"next_directive_id", 2}, {"dp", 4}, {"generation_replicas", {0, 1, 2, 3}},
             {"slots", json::array()}, {"pending", json::array()}, {"window_start_ms", -1},
             {"held", json::array()}, {"held_since_ms", -1},
             {"avoid", {{"node-3", 600000}}}, {"recoveries_ms", {200}},
             {"step_failures", json::object()}, {"job_restarts", 0}};
  for (int64_t i = 0; i < 4; ++i)
    v1["slots"].push_back({{"status", i == 3 ? "lost" : "active"}, {"uid", Uid(i)},
                           {"lost_uid", i == 3 ? Uid(i) : ""}, {"node", Node(i)},
                           {"previous_node", i == 3 ? Node(i) : ""}, {"phase", "running"},
                           {"replacement_seen", false},
                           {"lost_reason", i == 3 ? "node node-3 is faulty (NotReady)" : ""}});
  Engine restarted;
  ASSERT_TRUE(restarted.UpsertJob(job().spec(), nullptr, 0).ok());
  Job& again = *restarted.FindJob(kJob);
  Status st = again.LoadState(v1);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(again.StateJson(), job().StateJson()) << "read as version 2 would have kept it";
  EXPECT_EQ(again.Evictions().size(), 1u) << "version 1 kept whole uids";
  restarted.Tick(30200);
  EXPECT_EQ(again.directive().kind, REGROUP_DIRECTIVE_SCALE_IN);
}

TEST_F(EngineTest, CompactJobStateRefusesBadRecordsByName) {
  Submit(kForce, {{"recover-strategy", "recover"}});
  NodeFails(3, 0);
  const json good = job().StateJson();
  auto refused = [&](const std::function<void(json&)>& change) {
    json state = good;
    change(state);
    Status st = job().LoadState(state);
    EXPECT_FALSE(st.ok());
    EXPECT_EQ(job().StateJson(), good) << "a refused state changes nothing";
    return st.message();
  };
  EXPECT_EQ(refused([](json& s) { s["generation_replicas"] = "0-2,x"; }),
            "job state field \"generation_replicas\" is not indexes and ranges like \"0-3,7\" at "
            "character 4: \"x\"");
  EXPECT_EQ(refused([](json& s) { s["generation_replicas"] = "3-0"; }),
            "job state field \"generation_replicas\" holds the range 3-0, which runs backwards");
  EXPECT_EQ(refused([](json& s) { s["generation_replicas"] = "0-9"; }),
            "job state field \"generation_replicas\" holds 9; items must be from 0 to 3");
  EXPECT_EQ(refused([](json& s) { s["generation_replicas"] = "0,1,2,3,"; }),
            "job state field \"generation_replicas\" ends with a comma");
  EXPECT_EQ(refused([](json& s) { s["generation_replicas"] = json::array({0, 1, 2, 3}); }),
            "job state field \"generation_replicas\" must be a string of indexes and ranges, "
            "like \"0-3,7\"");
  EXPECT_EQ(refused([](json& s) { s["pods"]["lost"] = {{"meteor", "3"}}; }),
            "job state pods field \"lost\" names no cause of a loss: meteor");
  EXPECT_EQ(refused([](json& s) { s["pods"]["standby"] = "3"; }),
            "job state pods: pod 3 is listed twice among standbys and lost pods");
  EXPECT_EQ(refused([](json& s) { s["pods"]["phases"] = "rrrz"; }),
            "job state pods field \"phases\" has 'z' for pod 3; a phase is one of pbrfd");
  EXPECT_EQ(refused([](json& s) {
              s["pods"]["uids"] = s["pods"]["uids"].get<std::string>().substr(0, 20);
            }),
            "job state pods field \"uids\" ends at pod 2 of 4");
  EXPECT_EQ(refused([](json& s) {
              s["pods"]["uids"] = s["pods"]["uids"].get<std::string>() + ".";
            }),
            "job state pods field \"uids\" holds more than the job's 4 pods");
  EXPECT_EQ(refused([](json& s) { s["pods"]["previous_nodes"] = {-1, 0}; }),
            "job state pods field \"previous_nodes\" must hold one node a pod (4), not 2");
  EXPECT_EQ(refused([](json& s) { s["nodes"] = {""}; }),
            "job state nodes[0] must be a node name of 1 to 512 characters");
  EXPECT_EQ(refused([](json& s) { s["avoid"] = {{1, "5"}}; }),
            "job state avoid[0] field \"nodes\" holds 5; items must be from 0 to 0");
  EXPECT_EQ(refused([](json& s) {
              s["pending"] = {{{"kind", "pod_lost"}, {"step", -1}, {"at_ms", 0},
                               {"faults", {{"0-99999999"}}}}};
            }),
            "job state pending[0] faults[0] field \"pods\" holds 99999999; items must be from 0 "
            "to 3");
  EXPECT_EQ(refused([](json& s) {
              s["pending"] = {{{"kind", "hang"}, {"step", -1}, {"at_ms", 0},
                               {"faults", json::array({json::array({"0", "0-99999999"})})}}};
            }),
            "job state pending[0] faults[0] field \"ranks\" stands for more items than a job "
            "state may hold");
  EXPECT_EQ(refused([](json& s) { s["pending"] = {{{"kind", "hang"}, {"step", -1}, {"at_ms", 0},
                                                   {"faults", {{"0", "", "", 4}}}}}; }),
            "job state pending[0] faults[0] must be [pods, ranks, detail] (ranks and detail "
            "optional)");
}

TEST_F(EngineTest, SnapshotRestoreReproducesTheEngine) {
  Submit(kForce, {{"recover-strategy", "recover,elastic-training"},
                  {"wait-reschedule-timeout", "30"}});
  NodeFails(3, 0);
  Tick(200);
  const json snap = engine_.Snapshot();
  Engine copy;
  Status st = copy.Restore(snap);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(copy.Snapshot(), snap);
  // Both continue identically.
  engine_.Tick(30200);
  copy.Tick(30200);
  EXPECT_EQ(copy.Snapshot(), engine_.Snapshot());
  // A broken snapshot leaves the target unchanged.
  json broken = snap;
  broken["jobs"][0]["state"]["dp"] = "three";
  EXPECT_FALSE(copy.Restore(broken).ok());
  EXPECT_EQ(copy.Snapshot(), engine_.Snapshot());
}

TEST_F(EngineTest, DecisionsAreReproducibleFromTheirInputs) {
  auto run = [](Engine& e) {
    JobSpec spec;
    spec.id = kJob;
    spec.pods = 4;
    spec.processes_per_pod = 2;
    spec.labels = kForce;
    spec.annotations = {{"recover-strategy", "recover,elastic-training"}};
    EXPECT_TRUE(e.UpsertJob(spec, nullptr, 0).ok());
    for (int i = 0; i < 4; ++i)
      EXPECT_TRUE(e.SetPodState(kJob, i, Uid(i), REGROUP_POD_RUNNING, Node(i), 0).ok());
    EXPECT_TRUE(e.SetNodeHealth("node-2", REGROUP_NODE_FAULTY, "x", 50).ok());
    for (int64_t t = 0; t < 400000; t += 1000) e.Tick(t);
    return e.Snapshot();
  };
  Engine a, b;
  EXPECT_EQ(run(a), run(b));
}

// Issue 12: at 1,024 faults with 4 KiB details in one report window, the decision's reason took
// 4.2 MB (over gRPC's 4 MiB message limit, so the directive could not reach the manager), and
// the window kept every fault however many came.
TEST_F(EngineTest, AMassFailuresDecisionFitsAMessageAndStillCountsEveryLostPod) {
  Engine e;
  LargeJobState::Fail(e);  // 512 nodes fail and 512 devices, 4 KiB of detail each
  e.Tick(1200);
  const Directive& d = e.FindJob(kJob)->directive();
  EXPECT_EQ(d.kind, REGROUP_DIRECTIVE_WAIT) << d.reason.substr(0, 300);
  EXPECT_LT(d.reason.size(), 16u * 1024) << d.reason.substr(0, 300);
  EXPECT_NE(d.reason.find(" more"), std::string::npos);
  // Every lost pod is still known: the scale-in at the deadline removes all 1,024 of them.
  e.Tick(31200);
  const Directive& in = e.FindJob(kJob)->directive();
  ASSERT_EQ(in.kind, REGROUP_DIRECTIVE_SCALE_IN) << in.reason.substr(0, 300);
  EXPECT_EQ(in.dp, LargeJobState::kPods / 2);
}

TEST_F(EngineTest, AFloodOfFaultsInOneWindowIsMergedByKind) {
  Submit(kForce, {{"recover-strategy", "recover-in-place,elastic-training"},
                  {"regroup.io/prefer-elastic", "true"}});
  const std::string detail(4096, 'y');
  for (int i = 0; i < 100000; ++i) {
    PendingFault f{FaultKind::kProcessExit, {}, {i % 2 == 0 ? 0 : 3}, 5, 1000, detail};
    ASSERT_TRUE(engine_.ReportFault(kJob, std::move(f)).ok());
  }
  const Directive& d = Tick(1200);
  EXPECT_EQ(d.kind, REGROUP_DIRECTIVE_RESTART_IN_PLACE) << d.reason.substr(0, 300);
  EXPECT_EQ(d.restart_ranks, (std::vector<int64_t>{0, 3})) << "both ranks, though merged";
  EXPECT_LT(d.reason.size(), 16u * 1024);
  EXPECT_NE(d.reason.find("more merged into it"), std::string::npos) << d.reason.substr(0, 600);
}
}  // namespace
}  // namespace regroup
