// SPDX-License-Identifier: Apache-2.0
// The manager's job control with simulated agents and a simulated clock: rendezvous, detection,
// the step commit, fencing, refusals, recovery through the embedded engine, manager restarts.
#include "manager/job_control.h"
#include "manager/engine_decisions_test.h"

#include <algorithm>
#include <csignal>
#include <functional>

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <deque>
#include <sstream>

namespace regroup::manager {
namespace {

using Map = std::map<std::string, std::string>;

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The job-control harness: a job of `pods` scripted agents of `ppp` processes. Pod n registers on
// stream n+1 as "pod-<n>" with host 10.0.0.<n> and free port 30000+n.
class ScriptedAgents {
 public:
  ScriptedAgents(int64_t pods, int64_t ppp, Map labels, Map annotations,
                 JobControlOptions options = {}) {
    spec_.id = "default/job";
    spec_.uid = "job-uid";
    spec_.pods = pods;
    spec_.processes_per_pod = ppp;
    spec_.labels = std::move(labels);
    spec_.annotations = std::move(annotations);
    auto resolved = spec_.Resolve();
    EXPECT_TRUE(resolved.ok());
    options.join_window_ms = 5000;
    rt = std::make_unique<JobControl>(spec_, resolved.config, options,
                                      std::make_unique<EmbeddedDecisions>(spec_));
    uids_.resize(static_cast<size_t>(pods));
    for (int64_t n = 0; n < pods; ++n) uids_[static_cast<size_t>(n)] = "pod-" + std::to_string(n);
  }

  v1::Header Header(int64_t node) const {
    v1::Header h;
    h.set_job_id(spec_.id);
    h.set_sender(uids_[static_cast<size_t>(node)]);
    h.set_epoch(rt->epoch());
    h.set_generation(rt->generation());
    return h;
  }

  StatusOr<int64_t> Register(int64_t node, const std::string& uid = "",
                             std::vector<v1::LocalRank> ranks = {}, uint32_t last_agents = 0,
                             uint64_t stream = 0) {
    if (!uid.empty()) uids_[static_cast<size_t>(node)] = uid;
    v1::Register reg;
    reg.set_pod_uid(uids_[static_cast<size_t>(node)]);
    reg.set_node_rank(static_cast<int32_t>(node));
    reg.set_node_name("node-" + std::to_string(node));
    reg.set_host("10.0.0." + std::to_string(node));
    reg.set_nproc(static_cast<uint32_t>(spec_.processes_per_pod));
    reg.set_free_port(30000 + static_cast<uint32_t>(node));
    reg.set_last_generation_agents(last_agents);
    if (ranks.empty()) {  // trainers that said hello and wait for a generation
      ranks.resize(static_cast<size_t>(spec_.processes_per_pod));
      for (size_t l = 0; l < ranks.size(); ++l) {
        ranks[l].set_local_rank(static_cast<uint32_t>(l));
        ranks[l].set_alive(true);
        ranks[l].set_phase(v1::PHASE_PAUSED);
        ranks[l].set_committed_step(-1);
        ranks[l].set_heard_commit_step(-1);
      }
    }
    for (auto& r : ranks) *reg.add_ranks() = r;
    v1::Header h = Header(node);
    h.set_epoch(0);
    streams_[node] = stream ? stream : next_stream_++;
    return rt->Register(streams_[node], h, reg, now);
  }
  void RegisterAll() {
    for (int64_t n = 0; n < spec_.pods; ++n) ASSERT_TRUE(Register(n).ok());
  }

  Status Send(int64_t node, v1::AgentMessage m) {
    *m.mutable_header() = Header(node);
    return rt->Handle(streams_[node], m, now);
  }
  // What an agent reports of its live local rank `l` (pid 1000 + l).
  static v1::LocalRank Live(uint32_t l, v1::Phase phase, int64_t step, uint64_t generation,
                            int64_t committed) {
    v1::LocalRank r;
    r.set_local_rank(l);
    r.set_pid(1000 + static_cast<int32_t>(l));
    r.set_alive(true);
    r.set_step(step);
    r.set_phase(phase);
    r.set_generation(generation);
    r.set_committed_step(committed);
    r.set_heard_commit_step(committed);
    return r;
  }
  // Every process of `node` heartbeats: alive, at `step`, in generation `generation`.
  Status Beat(int64_t node, int64_t step, uint64_t generation, int64_t committed = -1) {
    v1::AgentMessage m;
    for (int64_t l = 0; l < spec_.processes_per_pod; ++l)
      *m.mutable_heartbeat()->add_ranks() =
          Live(static_cast<uint32_t>(l), v1::PHASE_COMPUTING, step, generation, committed);
    return Send(node, m);
  }
  void BeatAll(int64_t step) {
    for (int64_t n = 0; n < spec_.pods; ++n)
      if (!gone_.count(n)) (void)Beat(n, step, rt->generation(), step - 1);
  }
  Status Vote(int64_t node, int64_t step, uint64_t checksum = 0, bool ok = true) {
    v1::AgentMessage m;
    m.mutable_votes()->set_generation(rt->generation());
    m.mutable_votes()->set_step(step);
    m.mutable_votes()->set_ok(ok);
    for (const auto& r : assigned_[node]) {
      m.mutable_votes()->add_local_ranks(r);
      m.mutable_votes()->add_checksums(checksum);
    }
    return Send(node, m);
  }
  Status Exit(int64_t node, uint32_t local, int32_t code, int32_t signal = 0) {
    v1::AgentMessage m;
    m.mutable_process_exit()->set_local_rank(local);
    m.mutable_process_exit()->set_exit_code(code);
    m.mutable_process_exit()->set_signal(signal);
    return Send(node, m);
  }
  // A pod of two processes, paused in generation 1 after step 0, heartbeats once its local rank
  // `restarted` is back: alive, fresh (generation 0).
  Status RestartedHello(int64_t node, uint32_t restarted) {
    v1::AgentMessage hb;
    for (uint32_t l = 0; l < 2; ++l) {
      auto* r = hb.mutable_heartbeat()->add_ranks();
      r->set_local_rank(l);
      r->set_pid(2000 + static_cast<int32_t>(l));
      r->set_alive(true);
      r->set_generation(l == restarted ? 0 : 1);
      r->set_committed_step(l == restarted ? -1 : 0);
      r->set_phase(v1::PHASE_PAUSED);
    }
    return Send(node, hb);
  }
  // `ticks` ticks of 20 ms, each pod's heartbeat made by `beat` (the first error ends them).
  Status TickWith(int ticks, const std::function<Status(int64_t node)>& beat) {
    for (int t = 0; t < ticks; ++t) {
      now += 20;
      for (int64_t n = 0; n < spec_.pods; ++n) REGROUP_RETURN_IF_ERROR(beat(n));
      rt->Tick(now);
      Collect();
    }
    return Status::Ok();
  }
  // Advances the clock in 20 ms ticks, heartbeating as live agents do.
  void Run(int64_t ms, int64_t step = -2) {
    for (int64_t t = 0; t < ms; t += 20) {
      now += 20;
      if (step != -2) BeatAll(step);
      rt->Tick(now);
      Collect();
    }
  }
  void Collect() {
    for (auto& o : rt->TakeOutgoing()) {
      if (o.message.has_start()) {
        assigned_[o.node_rank].clear();
        for (const auto& r : o.message.start().plan().ranks())
          assigned_[o.node_rank].push_back(r.local_rank());
        starts_[o.node_rank] = o.message.start();
      }
      inbox_[o.node_rank].push_back(std::move(o.message));
    }
  }
  int Count(int64_t node, v1::ManagerMessage::BodyCase body) {
    int n = 0;
    for (const auto& m : inbox_[node]) n += m.body_case() == body;
    return n;
  }
  void Gone(int64_t node) { gone_.insert(node); }
  void Clear() { inbox_.clear(); }

  JobSpec spec_;
  std::unique_ptr<JobControl> rt;
  int64_t now = 1000;
  std::vector<std::string> uids_;
  std::map<int64_t, uint64_t> streams_;
  uint64_t next_stream_ = 1;
  std::map<int64_t, std::vector<v1::ManagerMessage>> inbox_;
  std::map<int64_t, std::vector<uint32_t>> assigned_;
  std::map<int64_t, v1::StartGeneration> starts_;
  std::set<int64_t> gone_;
};

// The job's events, by value (a range-for over a temporary's member would dangle).
std::vector<v1::JobEvent> Events(ScriptedAgents& sim) {
  const auto status = sim.rt->StatusReport();
  return {status.events().begin(), status.events().end()};
}

// How many events of `kind` the job logged whose message holds `text`.
int Logged(ScriptedAgents& sim, const std::string& kind, const std::string& text) {
  int n = 0;
  for (const auto& e : Events(sim))
    n += e.kind() == kind && e.message().find(text) != std::string::npos;
  return n;
}

// The message of the first fault the job logged ("" if none).
std::string FirstFault(ScriptedAgents& sim) {
  for (const auto& e : Events(sim))
    if (e.kind() == "fault") return e.message();
  return "";
}

const Map kForce = {{"fault-scheduling", "force"}};
// Restarts in place, and a hang found after 2 s.
const Map kQuickHang = {{"recover-strategy", "recover-in-place"},
                        {"regroup.io/hang-timeout-min-s", "2"},
                        {"regroup.io/heartbeat-interval-ms", "100"}};
const Map kElastic = {{"recover-strategy", "recover-in-place,elastic-training"},
                      {"regroup.io/prefer-elastic", "true"},
                      {"regroup.io/tensor-parallel", "2"}};

TEST(JobControl, FirstGenerationFormsWhenAllAgentsRegistered) {
  ScriptedAgents sim(4, 2, kForce, kElastic);
  for (int64_t n = 0; n < 3; ++n) ASSERT_TRUE(sim.Register(n).ok());
  sim.Run(100);
  EXPECT_EQ(sim.rt->generation(), 0u) << "one pod is still missing";
  ASSERT_TRUE(sim.Register(3).ok());
  sim.Run(20);
  ASSERT_EQ(sim.rt->generation(), 1u);
  const auto& plan = sim.starts_[2].plan();
  EXPECT_EQ(plan.world_size(), 8u);
  EXPECT_EQ(plan.data_parallel(), 4u);
  EXPECT_EQ(plan.store_host(), "10.0.0.0") << "rank 0's pod hosts the store";
  EXPECT_EQ(plan.store_port(), 30000u);
  ASSERT_EQ(plan.ranks_size(), 2);
  EXPECT_EQ(plan.ranks(0).rank(), 4u);
  EXPECT_EQ(plan.ranks(1).rank(), 5u);
  EXPECT_EQ(plan.ranks(1).replica(), 2u);
  EXPECT_EQ(sim.Count(0, v1::ManagerMessage::kWelcome), 1);
}

// The manager hears at most kBeatBudgetPerSecond beats a second: a job of many pods beats less
// often, its liveness timeout stretched with the interval and kept below half the hang floor.
TEST(JobControl, ABigJobsAgentsBeatLessOftenSoTheManagerHearsABoundedRate) {
  JobConfig c;  // the defaults: 100 ms, 5 misses, a 30 s hang floor
  EXPECT_EQ(HeartbeatIntervalMs(c, 8), 100u);
  EXPECT_EQ(HeartbeatIntervalMs(c, 2000), 100u) << "2,000 pods x 10 a second: the budget";
  EXPECT_EQ(HeartbeatIntervalMs(c, 2048), 103u);
  EXPECT_EQ(HeartbeatIntervalMs(c, 8192), 410u);
  EXPECT_EQ(HeartbeatIntervalMs(c, 1000000), 3000u) << "liveness (5 x 3 s) below half of 30 s";
  c.heartbeat_interval_ms = 1000;
  EXPECT_EQ(HeartbeatIntervalMs(c, 8192), 1000u) << "never shorter than the job's own";
  c.liveness_misses = 100;
  c.heartbeat_interval_ms = 100;
  EXPECT_EQ(HeartbeatIntervalMs(c, 8192), 150u) << "100 misses: 15 s, half the hang floor";

  // What the agents of a job of 8,192 pods are told, and what their silence is held to.
  ScriptedAgents sim(8192, 1, kForce, {});
  ASSERT_TRUE(sim.Register(0).ok());
  sim.Collect();
  ASSERT_EQ(sim.Count(0, v1::ManagerMessage::kWelcome), 1);
  const v1::Welcome& w = sim.inbox_[0].front().welcome();
  EXPECT_EQ(w.heartbeat_interval_ms(), 410u);
  EXPECT_EQ(w.liveness_timeout_ms(), 2050u);
  EXPECT_EQ(sim.rt->StatusReport().nodes(0).liveness_timeout_ms(), 2050u);
}

TEST(JobControl, JoinWindowClosingWithAMissingPodAsksTheEngine) {
  ScriptedAgents sim(4, 2, kForce, kElastic);
  for (int64_t n = 0; n < 3; ++n) ASSERT_TRUE(sim.Register(n).ok());
  sim.Run(5200, -1);  // the registered pods beat as they wait
  ASSERT_EQ(sim.rt->generation(), 1u) << "prefer-elastic: start smaller at once";
  EXPECT_EQ(sim.starts_[0].plan().data_parallel(), 3u);
  auto status = sim.rt->StatusReport();
  EXPECT_EQ(status.nodes(3).state(), "missing");
}

TEST(JobControl, StepCommitsWhenEveryRankVoted) {
  ScriptedAgents sim(2, 2, kForce, kElastic);
  sim.RegisterAll();
  sim.Run(20);
  ASSERT_EQ(sim.rt->generation(), 1u);
  sim.Clear();
  ASSERT_TRUE(sim.Vote(0, 0).ok());
  EXPECT_EQ(sim.rt->committed_step(), -1) << "pod 1 has not voted";
  ASSERT_TRUE(sim.Vote(1, 0).ok());
  EXPECT_EQ(sim.rt->committed_step(), 0);
  sim.Collect();
  ASSERT_EQ(sim.Count(0, v1::ManagerMessage::kOutcome), 1);
  EXPECT_TRUE(sim.inbox_[1].back().outcome().commit());
  // A vote for a step that is not in flight is refused and changes nothing.
  Status st = sim.Vote(0, 5);
  EXPECT_EQ(st.code(), REGROUP_FAILED_PRECONDITION);
  EXPECT_EQ(st.message(), "the votes are for step 5; the step in flight is 1");
}

TEST(JobControl, ARankDyingBetweenItsPodsVoteAndTheDecisionLeavesTheStepUncommitted) {
  Map annotations = kElastic;
  annotations["regroup.io/survivors-continue"] = "false";  // the generation stays aborted
  ScriptedAgents sim(2, 2, kForce, annotations);
  sim.RegisterAll();
  sim.Run(20);
  ASSERT_TRUE(sim.Vote(0, 0).ok());
  sim.Clear();
  ASSERT_TRUE(sim.Exit(1, 0, 9, 9).ok());  // pod 1's rank dies before its pod votes
  sim.Collect();
  EXPECT_EQ(sim.rt->committed_step(), -1);
  EXPECT_EQ(sim.Count(0, v1::ManagerMessage::kOutcome), 0) << "no outcome: the step is redone";
  ASSERT_EQ(sim.Count(0, v1::ManagerMessage::kAbort), 1);
  for (const auto& m : sim.inbox_[0]) {
    if (m.has_abort()) {
      EXPECT_EQ(m.abort().committed_step(), -1) << "survivors roll back to it";
    }
  }
  // A late vote of the dead generation changes nothing.
  EXPECT_EQ(sim.Vote(1, 0).code(), REGROUP_FAILED_PRECONDITION);
  EXPECT_EQ(sim.rt->committed_step(), -1);
}

TEST(JobControl, ChecksumMismatchAbortsTheStep) {
  ScriptedAgents sim(2, 2, kForce,
                     {{"recover-strategy", "retry"}, {"regroup.io/tensor-parallel", "2"}});
  sim.RegisterAll();
  sim.Run(20);
  ASSERT_TRUE(sim.Vote(0, 0, 111).ok());
  ASSERT_TRUE(sim.Vote(1, 0, 222).ok());
  sim.Collect();
  EXPECT_EQ(sim.rt->committed_step(), -1);
  EXPECT_FALSE(sim.inbox_[0].back().has_outcome() && sim.inbox_[0].back().outcome().commit());
  sim.Run(300);
  EXPECT_EQ(sim.rt->generation(), 2u) << "retried in a fresh generation";
}

// The fresh process of local rank `local` of `node` says hello (alive, generation 0); the
// node's other ranks report generation `generation`, having committed `committed`.
v1::AgentMessage RestartedHello(uint32_t nproc, uint32_t local, uint64_t generation,
                                int64_t committed) {
  v1::AgentMessage hb;
  for (uint32_t l = 0; l < nproc; ++l) {
    auto* r = hb.mutable_heartbeat()->add_ranks();
    r->set_local_rank(l);
    r->set_pid(2000 + static_cast<int32_t>(l));
    r->set_alive(true);
    r->set_generation(l == local ? 0 : generation);
    r->set_committed_step(l == local ? -1 : committed);
    r->set_phase(l == local ? v1::PHASE_PAUSED : v1::PHASE_COMPUTING);
  }
  return hb;
}

TEST(JobControl, TheSurvivorsOfAProcessCrashTrainOnAndItsReplicaRejoinsAtAStepBoundary) {
  ScriptedAgents sim(3, 2, kForce, kElastic);  // tp 2: a replica per pod, dp 3
  sim.RegisterAll();
  sim.Run(20);
  for (int64_t n = 0; n < 3; ++n) ASSERT_TRUE(sim.Vote(n, 0).ok());
  sim.Clear();
  ASSERT_TRUE(sim.Exit(2, 1, 1).ok());
  sim.Collect();
  // At once, before the decision maker's report window: the abort, the restart of the dead
  // process, and the next generation over the two whole replicas.
  EXPECT_EQ(sim.Count(0, v1::ManagerMessage::kAbort), 1) << "survivors leave at once";
  ASSERT_EQ(sim.Count(2, v1::ManagerMessage::kRestart), 1);
  for (const auto& m : sim.inbox_[2])
    if (m.has_restart()) {
      ASSERT_EQ(m.restart().local_ranks_size(), 1);
      EXPECT_EQ(m.restart().local_ranks(0), 1u);
    }
  ASSERT_EQ(sim.rt->generation(), 2u) << "the survivors continue without waiting";
  EXPECT_EQ(sim.starts_[0].plan().data_parallel(), 2u);
  EXPECT_EQ(sim.starts_[0].plan().committed_step(), 0);
  EXPECT_EQ(sim.starts_[2].plan().ranks_size(), 0) << "pod 2 stands by while its rank restarts";
  bool named = false;
  for (const auto& e : Events(sim))
    named |= e.kind() == "restart_in_place" && Contains(e.message(), "survivors continued");
  EXPECT_TRUE(named) << "the event says what happened";
  // The decision maker's own restart-in-place arrives after its window: nothing restarts twice.
  sim.Run(300, 1);
  EXPECT_EQ(sim.Count(2, v1::ManagerMessage::kRestart), 1);
  EXPECT_EQ(sim.rt->generation(), 2u);
  // The restarted process says hello; the replica rejoins at the next step boundary.
  ASSERT_TRUE(sim.Send(2, RestartedHello(2, 1, 2, 0)).ok());
  sim.Run(40);
  EXPECT_EQ(sim.rt->generation(), 2u) << "not before a step boundary";
  ASSERT_TRUE(sim.Vote(0, 1).ok());
  ASSERT_TRUE(sim.Vote(1, 1).ok());
  sim.Collect();
  EXPECT_EQ(sim.rt->committed_step(), 1);
  ASSERT_EQ(sim.rt->generation(), 3u) << "the restarted replica rejoins at the boundary";
  EXPECT_EQ(sim.starts_[2].plan().data_parallel(), 3u);
  EXPECT_EQ(sim.starts_[2].plan().world_size(), 6u);
  EXPECT_EQ(sim.starts_[2].plan().committed_step(), 1);
  EXPECT_EQ(sim.starts_[2].plan().ranks_size(), 2);
}

// Found by integration scenario 11 in CI: a poison sample kills whichever rank trains it. The
// survivors continued without the first rank that died, then the next rank to train the same step
// died, and the next: before the decision maker named the poison step, every rank that held the
// committed state had died, and its dump wrote nothing. The same step failing again before any
// commit is not continued past: the survivors keep their state and wait for the decision.
TEST(JobControl, TheSameStepFailingAgainIsNotContinuedPastTheSurvivorsWaitForTheDecision) {
  ScriptedAgents sim(3, 2, kForce, kElastic);  // tp 2: a replica per pod, dp 3
  sim.RegisterAll();
  sim.Run(20);
  for (int64_t n = 0; n < 3; ++n) ASSERT_TRUE(sim.Vote(n, 0).ok());
  sim.Clear();
  ASSERT_TRUE(sim.Exit(2, 1, 1).ok());  // step 1 fails on pod 2
  sim.Collect();
  ASSERT_EQ(sim.rt->generation(), 2u) << "the survivors continue once";
  ASSERT_TRUE(sim.Exit(1, 0, 1).ok());  // and step 1 fails again, on pod 1, before any commit
  sim.Collect();
  EXPECT_EQ(sim.rt->generation(), 2u) << "no second interim generation over the same step";
  EXPECT_FALSE(sim.rt->training());
  bool said = false;
  for (const auto& e : Events(sim))
    said |= e.kind() == "wait" && Contains(e.message(), "failed again");
  EXPECT_TRUE(said) << "the event says why the survivors wait";
}

// A job of 2 pods x 2 ranks, one replica each, training; then pod 1's local rank 1 dies and
// the survivors continue in generation 2.
void StartThenCrashPod1(ScriptedAgents& sim) {
  sim.RegisterAll();
  sim.Run(20);
  sim.Clear();
  ASSERT_TRUE(sim.Exit(1, 1, 1).ok());
  sim.Collect();
  ASSERT_EQ(sim.rt->generation(), 2u);
}

TEST(JobControl, ADecisionArrivingAfterTheRejoinRestartsNothingAndRegroupsNothing) {
  ScriptedAgents sim(2, 2, kForce, kElastic);
  StartThenCrashPod1(sim);
  // Back and rejoined within the decision maker's report window.
  ASSERT_TRUE(sim.Send(1, RestartedHello(2, 1, 2, -1)).ok());
  ASSERT_TRUE(sim.Vote(0, 0).ok());
  sim.Collect();
  ASSERT_EQ(sim.rt->generation(), 3u);
  ASSERT_EQ(sim.rt->world_size(), 4u);
  sim.Run(300, 1);  // the restart-in-place decision arrives now
  EXPECT_EQ(sim.Count(1, v1::ManagerMessage::kRestart), 1) << "the rejoined process stays";
  ASSERT_TRUE(sim.Vote(0, 1).ok());
  ASSERT_TRUE(sim.Vote(1, 1).ok());
  sim.Collect();
  EXPECT_EQ(sim.rt->committed_step(), 1);
  EXPECT_EQ(sim.rt->generation(), 3u) << "no regroup at the boundary: nothing waits to rejoin";
}

// Simulation seed 872: a rank hung while a scale-out waited for the step boundary; the hang's
// abort let the scale-out form the next generation at once, with the hung rank in it, and it
// trained. The restart-in-place decided for the hang arrived after: it restarted that rank, a
// member of the running generation, and waited for its "rejoin"; past the hang timeout it
// reported a loss of no pod ("pods  did not become available") and the job stopped for good.
// A rank of a generation formed since the fault is not restarted for it.
TEST(JobControl, ARestartInPlaceDecidedAfterAGenerationFormedSinceTheFaultRestartsNoneOfItsRanks) {
  ScriptedAgents sim(3, 1, kForce,
          {{"recover-strategy", "recover-in-place,elastic-training"},
           {"regroup.io/prefer-elastic", "true"},
           {"regroup.io/hang-timeout-min-s", "2"},
           {"regroup.io/heartbeat-interval-ms", "100"}});
  sim.RegisterAll();
  sim.Run(20);
  ASSERT_EQ(sim.rt->generation(), 1u);
  sim.rt->Disconnected(sim.streams_[2], sim.now);
  sim.Gone(2);
  int64_t step = 0;
  for (; step < 10; ++step) {  // pod 2 is lost and the job scales in
    sim.Run(100, step);
    for (int64_t n = 0; n < 2; ++n) (void)sim.Vote(n, step);
    sim.Collect();
  }
  ASSERT_EQ(sim.rt->world_size(), 2u);
  const uint64_t scaled_in = sim.rt->generation();
  sim.gone_.erase(2);
  ASSERT_TRUE(sim.Register(2, "pod-2-b").ok());  // the scale-out waits for the step boundary
  // Rank 0 hangs in the step: no vote, at the same step past the hang timeout.
  for (int t = 0; t < 150 && sim.rt->generation() == scaled_in; ++t) {
    sim.Run(20, step);
    (void)sim.Vote(1, step);
    sim.Collect();
  }
  ASSERT_GT(sim.rt->generation(), scaled_in) << "the abort let the scale-out form at once";
  ASSERT_TRUE(sim.rt->training());
  const uint64_t formed = sim.rt->generation();
  sim.Clear();
  for (int64_t s = step; s < step + 60; ++s) {  // it trains; the decision arrives meanwhile
    sim.Run(100, s);
    for (int64_t n = 0; n < 3; ++n) (void)sim.Vote(n, s);
    sim.Collect();
  }
  std::string story;
  for (const auto& e : Events(sim)) story += e.kind() + ": " + e.message() + "\n";
  EXPECT_EQ(sim.Count(0, v1::ManagerMessage::kRestart), 0) << story;
  EXPECT_EQ(sim.rt->generation(), formed) << story;
  EXPECT_TRUE(sim.rt->training()) << story;
  EXPECT_FALSE(Contains(story, "did not become available")) << story;
}

// A decision maker beside the scheduler, spoken for by the test: it takes the facts and
// delivers the directives the test queues (as RemoteDecisions delivers the coordinator's).
class Scripted final : public Decisions {
 public:
  void PodRunning(int64_t, const std::string&, const std::string&, int64_t) override {}
  void Fault(const v1::FaultFacts& fault, int64_t) override { faults.push_back(fault); }
  void FaultsSettled(uint64_t generation, int64_t) override { settled.push_back(generation); }
  void ReplacementRegistered(int64_t, const std::string&, int64_t) override {}
  void ReportProgress(uint64_t, uint64_t, int64_t, uint32_t, int64_t) override {}
  void Tick(int64_t) override {}
  std::optional<Directive> Poll() override {
    if (directives.empty()) return std::nullopt;
    Directive d = directives.front();
    directives.pop_front();
    return d;
  }
  bool ReplacesPods() const override { return true; }
  std::optional<Directive> Standing() const override { return standing; }

  std::vector<v1::FaultFacts> faults;
  std::vector<uint64_t> settled;  // the generations whose faults were settled
  std::deque<Directive> directives;
  std::optional<Directive> standing;  // the decision it keeps (Decisions::Standing)
};

// Gives `sim`'s job control a Scripted decision maker (join window 5 s) and returns it.
Scripted* UseScripted(ScriptedAgents& sim) {
  auto owned = std::make_unique<Scripted>();
  Scripted* decisions = owned.get();
  JobControlOptions o;
  o.join_window_ms = 5000;
  sim.rt = std::make_unique<JobControl>(sim.spec_, sim.spec_.Resolve().config, o,
                                        std::move(owned));
  return decisions;
}

// Dense simulation seed 400466 with a coordinator: a fault outside the replicas the decision
// maker had decided on (this incarnation had formed beyond them) changes nothing it decided, so
// no directive follows. The survivors do not wait for one for good: past a grace of 5 s they
// carry out the standing decision, every pod it keeps being here; a directive that comes first
// is taken instead.
TEST(JobControl, SurvivorsThatHearNoDirectiveCarryOutTheStandingDecision) {
  for (const bool directive_first : {false, true}) {
    ScriptedAgents sim(3, 2, kForce, {{"recover-strategy", "recover-in-place,recover,elastic-training"},
                                      {"regroup.io/tensor-parallel", "2"}});
    Scripted* decisions = UseScripted(sim);
    sim.RegisterAll();
    sim.Run(200, -1);
    ASSERT_TRUE(sim.rt->training());
    ASSERT_EQ(sim.starts_[0].plan().data_parallel(), 3u);
    Directive standing;
    standing.kind = REGROUP_DIRECTIVE_SCALE_IN;
    standing.id = 3;
    standing.strategy = "elastic-training";
    standing.dp = 2;
    standing.keep_replicas = {0, 1};
    standing.reason = "an earlier scale-in";
    decisions->standing = standing;
    sim.Gone(2);
    sim.Run(1500, 0);  // pod 2 falls silent: lost, the generation aborted
    ASSERT_FALSE(sim.rt->training());
    ASSERT_FALSE(decisions->faults.empty());
    sim.Run(3000, 0);  // no directive: the survivors wait
    ASSERT_FALSE(sim.rt->training());
    if (directive_first) {
      Directive d = standing;
      d.id = 4;
      d.kind = REGROUP_DIRECTIVE_SCALE_IN;
      d.dp = 1;
      d.keep_replicas = {0};
      d.reason = "a newer decision";
      decisions->directives.push_back(d);
    }
    sim.Run(2500, 0);
    std::string story;
    for (const auto& e : Events(sim)) story += e.kind() + ": " + e.message() + "\n";
    ASSERT_TRUE(sim.rt->training()) << story;
    EXPECT_EQ(sim.starts_[0].plan().data_parallel(), directive_first ? 1u : 2u) << story;
    EXPECT_EQ(Contains(story, "the standing scale_in directive keeps replicas 0,1"), !directive_first)
        << story;
  }
}

// Simulation seed 36747 with a coordinator: a new manager's join window closed with pods
// missing (its first generation waits for a decision: aborted, generation 0), and a process of
// a pod that had registered died meanwhile. The restart in place decided for it named ranks of
// a generation this incarnation never ran; it restarted the process and then waited for
// "its replicas" (none: it had formed none), and past the hang timeout it reported the loss of
// no pod ("pods  did not become available") and the job hung. The first generation forms over
// the replicas the directive keeps once the restarted process is back.
TEST(JobControl, ARestartInPlaceBeforeTheFirstGenerationFormsItOnceTheProcessIsBack) {
  ScriptedAgents sim(3, 2, kForce, {{"recover-strategy", "recover-in-place,recover"},
                         {"regroup.io/tensor-parallel", "2"},
                         {"regroup.io/hang-timeout-min-s", "2"}});
  Scripted* decisions = UseScripted(sim);
  // The pods' processes were in generation 1 of an earlier manager, which committed step 4.
  auto earlier = [] {
    std::vector<v1::LocalRank> ranks;
    for (uint32_t l = 0; l < 2; ++l)
      ranks.push_back(ScriptedAgents::Live(l, v1::PHASE_PAUSED, 5, 1, 4));
    return ranks;
  };
  sim.Gone(2);
  ASSERT_TRUE(sim.Register(0, "", earlier()).ok());
  ASSERT_TRUE(sim.Register(1, "", earlier()).ok());
  sim.Run(5100, -1);  // the join window closes with pod 2 missing
  ASSERT_EQ(decisions->faults.size(), 1u);
  ASSERT_EQ(decisions->faults[0].kind(), v1::FAULT_KIND_POD_LOST);
  ASSERT_EQ(sim.rt->generation(), 0u);
  sim.gone_.erase(2);
  ASSERT_TRUE(sim.Register(2, "pod-2-b").ok());  // its replacement
  ASSERT_TRUE(sim.Exit(1, 1, 1).ok());           // a process of pod 1 dies meanwhile
  sim.Gone(1);
  sim.Run(100, -1);
  ASSERT_EQ(decisions->faults.size(), 2u);
  ASSERT_EQ(decisions->faults[1].kind(), v1::FAULT_KIND_PROCESS_EXIT);
  Directive d;
  d.kind = REGROUP_DIRECTIVE_RESTART_IN_PLACE;
  d.id = 7;
  d.strategy = "recover-in-place";
  d.dp = 3;
  d.keep_replicas = {0, 1, 2};
  d.restart_ranks = {3};
  d.reason = "process_exit on ranks [3] on pods [1]";
  decisions->directives.push_back(d);
  sim.Clear();
  sim.Run(100, -1);
  std::string story;
  for (const auto& e : Events(sim)) story += e.kind() + ": " + e.message() + "\n";
  ASSERT_EQ(sim.Count(1, v1::ManagerMessage::kRestart), 1) << story;
  ASSERT_TRUE(sim.Send(1, RestartedHello(2, 1, 1, 4)).ok());
  sim.gone_.erase(1);
  sim.Run(100, -1);
  story.clear();
  for (const auto& e : Events(sim)) story += e.kind() + ": " + e.message() + "\n";
  ASSERT_TRUE(sim.rt->training()) << story;
  EXPECT_EQ(sim.starts_[0].plan().data_parallel(), 3u) << story;
  EXPECT_EQ(sim.starts_[0].plan().committed_step(), 4) << story;
  for (int64_t step = 5; step < 40; ++step) {  // past the hang timeout: it trains
    sim.Run(100, step);
    for (int64_t n = 0; n < 3; ++n) ASSERT_TRUE(sim.Vote(n, step).ok()) << story;
    sim.Collect();
  }
  EXPECT_EQ(sim.rt->committed_step(), 39);
  EXPECT_EQ(decisions->faults.size(), 2u) << "the join window's and the process exit's";
}

TEST(JobControl, FaultsDuringAnInterimGenerationNameTheRanksTheDecisionMakerKnows) {
  ScriptedAgents sim(3, 2, kForce, kElastic);
  sim.RegisterAll();
  sim.Run(20);
  sim.Clear();
  ASSERT_TRUE(sim.Exit(1, 0, 1).ok());  // engine rank 2 (replica 1)
  sim.Collect();
  ASSERT_EQ(sim.rt->generation(), 2u);
  ASSERT_EQ(sim.starts_[2].plan().ranks(0).rank(), 2u) << "pod 2 holds interim ranks 2 and 3";
  // Pod 2's rank dies in the interim generation: interim rank 3, engine rank 5.
  ASSERT_TRUE(sim.Exit(2, 1, 1).ok());
  sim.Collect();
  // The same step failed again before a commit: no second interim generation (the step may be
  // poison); the decision maker decides for both.
  ASSERT_EQ(sim.rt->generation(), 2u) << "replica 0 waits for the decision maker";
  sim.Run(400, 0);
  // Each dead process was restarted once (at once), none twice by the later directives, and
  // no healthy process was restarted through a rank of the wrong frame.
  EXPECT_EQ(sim.Count(0, v1::ManagerMessage::kRestart), 0);
  EXPECT_EQ(sim.Count(1, v1::ManagerMessage::kRestart), 1);
  EXPECT_EQ(sim.Count(2, v1::ManagerMessage::kRestart), 1);
  bool engine_frame = false;
  for (const auto& e : Events(sim))
    engine_frame |= e.kind() == "directive" && Contains(e.message(), "ranks [5]");
  EXPECT_TRUE(engine_frame) << "the decision maker heard of rank 5, not interim rank 3";
  // Both come back; the whole job trains again.
  ASSERT_TRUE(sim.Send(1, RestartedHello(2, 0, 2, -1)).ok());
  ASSERT_TRUE(sim.Send(2, RestartedHello(2, 1, 2, -1)).ok());
  sim.Run(200, 0);
  EXPECT_TRUE(sim.rt->training());
  EXPECT_EQ(sim.rt->generation(), 3u);
  EXPECT_EQ(sim.starts_[0].plan().world_size(), 6u);
}

TEST(JobControl, ARankThatDiesAgainBeforeRejoiningIsRestartedAgainAndTheSurvivorsTrainOn) {
  ScriptedAgents sim(2, 2, kForce, kElastic);
  StartThenCrashPod1(sim);
  ASSERT_EQ(sim.Count(1, v1::ManagerMessage::kRestart), 1);
  ASSERT_TRUE(sim.Send(1, RestartedHello(2, 1, 2, -1)).ok());
  ASSERT_TRUE(sim.Exit(1, 1, 1).ok());  // the new process dies too, before it rejoined
  sim.Collect();
  EXPECT_EQ(sim.rt->generation(), 2u) << "the generation it is not in trains on";
  EXPECT_TRUE(sim.rt->training());
  sim.Run(300, 0);
  EXPECT_EQ(sim.Count(1, v1::ManagerMessage::kRestart), 2) << "the decision restarts it again";
  EXPECT_TRUE(sim.rt->training());
}

// Found by the e2e test of a fault during a state sync: two generations formed within one
// heartbeat interval got the same store port; the first one's store was still up, the second's
// rank 0 could not listen, and its peers read the first one's keys.
TEST(JobControl, EveryGenerationsStoreGetsAPortNoRecentStoreHolds) {
  // A replica per pod; pod 0's rank 0 hosts every store.
  ScriptedAgents sim(2, 2, kForce, kElastic);
  sim.RegisterAll();  // pod 0 reported 30000 alone (as an agent before free_ports does)
  sim.Run(20);
  auto ports = [&] {  // the store port of every generation pod 0 started, in order
    std::vector<uint32_t> out;
    for (const auto& m : sim.inbox_[0])
      if (m.has_start()) out.push_back(m.start().plan().store_port());
    return out;
  };
  auto report = [&](std::vector<uint32_t> free) {
    v1::AgentMessage m;
    for (uint32_t p : free) m.mutable_heartbeat()->add_free_ports(p);
    m.mutable_heartbeat()->set_free_port(free[0]);
    ASSERT_TRUE(sim.Send(0, m).ok());
  };
  // Pod 1's process crashes: pod 0 trains on alone in a generation of its own, and pod 1's
  // replica rejoins at the next commit: two generations, two stores.
  auto crash_and_rejoin = [&] {
    const uint64_t before = sim.rt->generation();
    ASSERT_TRUE(sim.Exit(1, 1, 0, 9).ok());
    sim.Collect();
    ASSERT_EQ(sim.rt->generation(), before + 1);
    ASSERT_TRUE(sim.Send(1, RestartedHello(2, 1, before, sim.rt->committed_step())).ok());
    ASSERT_TRUE(sim.Vote(0, sim.rt->committed_step() + 1).ok());
    sim.Collect();
    ASSERT_EQ(sim.rt->generation(), before + 2);
  };
  EXPECT_EQ(ports(), (std::vector<uint32_t>{30000}));
  // A report that still names the port in use (it predates the store's bind), and one more.
  report({30000, 30007});
  crash_and_rejoin();  // 30007, then none reported: a port by generation
  report({31001, 31002, 31003, 31004});
  crash_and_rejoin();
  crash_and_rejoin();
  const std::vector<uint32_t> all = ports();
  ASSERT_EQ(all.size(), 7u);
  EXPECT_EQ(all[1], 30007u) << "not the port of the store just formed";
  EXPECT_EQ(std::vector<uint32_t>(all.begin() + 3, all.end()),
            (std::vector<uint32_t>{31001, 31002, 31003, 31004}))
      << "several generations between two reports each take one of its ports";
  EXPECT_EQ(std::set<uint32_t>(all.begin(), all.end()).size(), all.size())
      << "no two stores on one port";
}

TEST(JobControl, AProcessCrashWaitsForItsRestartWhenSurvivorsDoNotContinue) {
  Map annotations = kElastic;
  annotations["regroup.io/survivors-continue"] = "false";
  ScriptedAgents sim(2, 2, kForce, annotations);
  sim.RegisterAll();
  sim.Run(20);
  ASSERT_TRUE(sim.Vote(0, 0).ok());
  ASSERT_TRUE(sim.Vote(1, 0).ok());
  sim.Clear();
  ASSERT_TRUE(sim.Exit(1, 1, 1).ok());
  sim.Collect();
  EXPECT_EQ(sim.Count(0, v1::ManagerMessage::kAbort), 1) << "survivors leave at once";
  sim.Run(200, 1);
  ASSERT_EQ(sim.Count(1, v1::ManagerMessage::kRestart), 1);
  EXPECT_EQ(sim.inbox_[1].back().restart().local_ranks(0), 1u);
  EXPECT_EQ(sim.rt->generation(), 1u) << "waits for the restarted process";
  // The restarted process says hello: alive, fresh (generation 0).
  ASSERT_TRUE(sim.RestartedHello(1, 1).ok());
  sim.Run(40);
  ASSERT_EQ(sim.rt->generation(), 2u);
  const auto& plan = sim.starts_[0].plan();
  EXPECT_EQ(plan.committed_step(), 0);
  EXPECT_EQ(plan.world_size(), 4u);
}

// The log lines of a job control whose events go to a stream (event_log.h).
struct CapturedLog {
  std::ostringstream text;
  std::shared_ptr<spdlog::logger> logger;
  CapturedLog() {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(text);
    sink->set_pattern("%l %v");
    logger = std::make_shared<spdlog::logger>("job", sink);
  }
  std::vector<std::string> Lines() const {
    std::vector<std::string> lines;
    std::istringstream in(text.str());
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }
  // The lines holding every one of `parts`.
  std::vector<std::string> With(const std::vector<std::string>& parts) const {
    std::vector<std::string> found;
    for (const auto& line : Lines())
      if (std::all_of(parts.begin(), parts.end(),
                      [&](const std::string& p) { return Contains(line, p); }))
        found.push_back(line);
    return found;
  }
};

TEST(JobControl, ACrashIsLoggedAsOneLineForTheFaultEachDecisionAndTheNextGeneration) {
  CapturedLog log;
  JobControlOptions options;
  options.epoch = 7;
  options.logger = log.logger;
  Map annotations = kElastic;
  annotations["regroup.io/survivors-continue"] = "false";
  ScriptedAgents sim(2, 2, kForce, annotations, options);
  sim.RegisterAll();
  sim.Run(20);
  std::map<JobControl::Timing, std::vector<double>> timings;
  sim.rt->OnTiming([&](JobControl::Timing t, double seconds) { timings[t].push_back(seconds); });
  ASSERT_TRUE(sim.Vote(0, 0).ok());
  sim.now += 7;
  ASSERT_TRUE(sim.Vote(1, 0).ok());
  ASSERT_EQ(timings[JobControl::Timing::kVoteRoundTrip], std::vector<double>{0.007})
      << "from the first vote to the commit";
  EXPECT_EQ(log.With({"info job=default/job epoch=7 generation=1 ", "generation: "}).size(), 1u)
      << log.text.str();
  EXPECT_EQ(log.With({"job=default/job", " pod=1 register: pod pod-1 registered"}).size(), 1u)
      << log.text.str();
  ASSERT_TRUE(sim.Exit(1, 1, 1).ok());
  sim.Run(200, 1);
  ASSERT_TRUE(sim.RestartedHello(1, 1).ok());
  sim.Run(40);
  ASSERT_EQ(sim.rt->generation(), 2u);
  EXPECT_TRUE(timings[JobControl::Timing::kRecovery].empty()) << "no step committed since";
  ASSERT_TRUE(sim.Vote(0, 1).ok());
  ASSERT_TRUE(sim.Vote(1, 1).ok());
  ASSERT_EQ(timings[JobControl::Timing::kRecovery].size(), 1u);
  EXPECT_GT(timings[JobControl::Timing::kRecovery][0], 0.2) << "the abort was 240 ms before";
  // The fault names its pod, at warning; the abort, the decision and its strategy, the next
  // generation at info: one line each.
  const auto fault = log.With({"warning job=default/job epoch=7 generation=1 pod=1 fault: "});
  ASSERT_EQ(fault.size(), 1u) << log.text.str();
  EXPECT_TRUE(Contains(fault[0], "exit code 1")) << fault[0];
  EXPECT_EQ(log.With({"info job=default/job epoch=7 generation=1 abort: generation 1 aborted"})
                .size(),
            1u)
      << log.text.str();
  const auto directives = log.With({"info job=default/job epoch=7 ", " directive: "});
  ASSERT_GE(directives.size(), 1u) << log.text.str();
  EXPECT_TRUE(Contains(directives.front(), "[recover-in-place]")) << directives.front();
  EXPECT_EQ(log.With({"info job=default/job epoch=7 generation=2 generation: generation (7, 2)"})
                .size(),
            1u)
      << log.text.str();
  // Every event of the status report is a line of the log.
  EXPECT_EQ(log.Lines().size(), Events(sim).size()) << log.text.str();
}

TEST(JobControl, APodThatReconnectsOverAndOverIsLoggedOnceEveryTenSeconds) {
  CapturedLog log;
  JobControlOptions options;
  options.logger = log.logger;
  ScriptedAgents sim(2, 2, kForce, kElastic, options);
  ASSERT_TRUE(sim.Register(0).ok());
  for (int i = 0; i < 50; ++i) {  // before the first generation: each stream breaks at once
    ASSERT_TRUE(sim.Register(1, "", {}, 0, 100 + static_cast<uint64_t>(i)).ok());
    sim.rt->Disconnected(100 + static_cast<uint64_t>(i), sim.now);
    sim.now += 100;
  }
  EXPECT_EQ(Logged(sim, "disconnect", "pod-1"), 50) << "the status report keeps every event";
  EXPECT_EQ(log.With({" pod=1 disconnect: "}).size(), 1u) << log.text.str();
  EXPECT_EQ(log.With({" pod=1 register: "}).size(), 1u) << log.text.str();
  sim.now += 10000;
  ASSERT_TRUE(sim.Register(1, "", {}, 0, 1000).ok());
  const auto again = log.With({" pod=1 register: "});
  ASSERT_EQ(again.size(), 2u) << log.text.str();
  EXPECT_TRUE(Contains(again.back(), "(and 49 more register not logged)")) << again.back();
  EXPECT_EQ(log.With({" pod=0 register: "}).size(), 1u) << "another pod's lines are its own";
}

// A reason an agent sends (any bytes, up to a message's size) is one line of the log, cut.
TEST(JobControl, APeersTextIsLoggedOnOneLineAndCut) {
  CapturedLog log;
  JobControlOptions options;
  options.logger = log.logger;
  ScriptedAgents sim(2, 1, kForce, kElastic, options);
  sim.RegisterAll();
  sim.Run(20);
  v1::AgentMessage leave;
  leave.mutable_leave()->set_reason("SIGTERM\n[info] job=default/job forged\x1b[31m" +
                                    std::string(100000, 'x'));
  ASSERT_TRUE(sim.Send(1, leave).ok());
  const auto lines = log.With({" pod=1 leave: "});
  ASSERT_EQ(lines.size(), 1u) << log.text.str();
  EXPECT_TRUE(Contains(lines[0], "SIGTERM\\n[info] job=default/job forged\\x1b[31mxxx"))
      << lines[0].substr(0, 200);
  EXPECT_TRUE(Contains(lines[0], " bytes cut]")) << lines[0].substr(0, 200);
  EXPECT_LT(lines[0].size(), EventLog::kMaxLineBytes + 200);
  EXPECT_TRUE(log.With({"forged"}).size() == 1u) << "no forged line";
}

TEST(JobControl, LostAgentScalesInAndItsReplacementScalesOut) {
  ScriptedAgents sim(4, 2, kForce, kElastic);
  sim.RegisterAll();
  sim.Run(20);
  sim.rt->Disconnected(sim.streams_[2], sim.now);  // the node dies: its stream breaks
  sim.Gone(2);
  sim.Run(900, 0);  // past the liveness timeout: the session was not resumed
  ASSERT_EQ(sim.rt->generation(), 2u);
  EXPECT_EQ(sim.starts_[0].plan().data_parallel(), 3u);
  EXPECT_EQ(sim.rt->world_size(), 6u);
  // The zombie cannot come back under its old uid, and its refusal tells it to stop.
  EXPECT_EQ(sim.Register(2).status().code(), REGROUP_FAILED_PRECONDITION);
  const std::string zombie = sim.Header(2).sender();
  ASSERT_TRUE(sim.rt->IsFenced(zombie));
  const v1::ManagerMessage refusal = sim.rt->MakeRefusal("zombie", true);
  EXPECT_TRUE(refusal.refusal().fenced());
  EXPECT_EQ(refusal.header().epoch(), sim.rt->epoch());
  // Its replacement registers with a new uid: scale out at the next step boundary.
  ASSERT_TRUE(sim.Register(2, "pod-2-b").ok());
  sim.Run(200, 0);
  EXPECT_EQ(sim.rt->generation(), 2u) << "not in the middle of a step";
  for (int64_t n : {0, 1, 3}) ASSERT_TRUE(sim.Vote(n, 0).ok());
  sim.Run(40, 1);
  EXPECT_EQ(sim.rt->generation(), 3u);
  EXPECT_EQ(sim.rt->world_size(), 8u);
}

// Issue 11, finding 2: a fault that touches no rank of the running generation never aborts it.
TEST(JobControl, LosingAStandbyPodDoesNotAbortTheGeneration) {
  ScriptedAgents sim(4, 1, kForce, kElastic);  // tp 2: a replica is 2 pods, dp 2
  sim.RegisterAll();
  sim.Run(20);
  ASSERT_EQ(sim.rt->world_size(), 4u);
  sim.rt->Disconnected(sim.streams_[3], sim.now);  // replica 1 breaks: dp 1, pod 2 stands by
  sim.Gone(3);
  sim.Run(900, 0);  // past the liveness timeout: the session was not resumed
  ASSERT_EQ(sim.rt->generation(), 2u);
  ASSERT_EQ(sim.rt->world_size(), 2u);
  ASSERT_TRUE(sim.rt->training());
  sim.Clear();
  sim.rt->Disconnected(sim.streams_[2], sim.now);  // the standby is lost
  sim.Gone(2);
  sim.Run(900, 0);  // past the liveness timeout: the session was not resumed
  EXPECT_TRUE(sim.rt->training()) << "no rank of the generation was touched";
  EXPECT_EQ(sim.rt->generation(), 2u);
  for (int64_t n : {0, 1}) EXPECT_EQ(sim.Count(n, v1::ManagerMessage::kAbort), 0) << "pod " << n;
  // Training goes on: the step commits.
  for (int64_t n : {0, 1}) ASSERT_TRUE(sim.Vote(n, 0).ok());
  sim.Run(40, 1);
  EXPECT_EQ(sim.rt->committed_step(), 0);
  bool fault_seen = false;
  for (const auto& e : Events(sim)) fault_seen = fault_seen || e.kind() == "fault";
  EXPECT_TRUE(fault_seen) << "the lost standby is still a fault the decision maker hears of";
}

TEST(JobControl, ScaleOutWaitsForTheReplacementsTrainersToSayHello) {
  ScriptedAgents sim(4, 2, kForce, kElastic);
  sim.RegisterAll();
  sim.Run(20);
  sim.rt->Disconnected(sim.streams_[3], sim.now);
  sim.Gone(3);
  sim.Run(900, 0);  // past the liveness timeout: the session was not resumed
  ASSERT_EQ(sim.rt->generation(), 2u);
  // The replacement's agent registers while its trainers still import torch (STARTING).
  std::vector<v1::LocalRank> starting(2);
  for (uint32_t l = 0; l < 2; ++l) {
    starting[l].set_local_rank(l);
    starting[l].set_alive(true);
    starting[l].set_phase(v1::PHASE_STARTING);
  }
  ASSERT_TRUE(sim.Register(3, "pod-3-b", starting).ok());
  sim.Run(400);
  for (int64_t n : {0, 1, 2}) ASSERT_TRUE(sim.Vote(n, 0).ok());
  sim.Run(100);
  EXPECT_EQ(sim.rt->generation(), 2u) << "the survivors keep training";
  EXPECT_TRUE(sim.rt->training());
  // The trainers said hello: the next step boundary scales out.
  ASSERT_TRUE(sim.Beat(3, 0, 0).ok());
  for (int64_t n : {0, 1, 2}) ASSERT_TRUE(sim.Vote(n, 1).ok());
  sim.Run(40);
  EXPECT_EQ(sim.rt->generation(), 3u);
  EXPECT_EQ(sim.rt->world_size(), 8u);
}

TEST(JobControl, MissedHeartbeatsAreALostPod) {
  ScriptedAgents sim(2, 2, kForce, kElastic);
  sim.RegisterAll();
  sim.Run(20);
  std::vector<double> detected;
  sim.rt->OnTiming([&](JobControl::Timing t, double seconds) {
    if (t == JobControl::Timing::kFaultDetection) detected.push_back(seconds);
  });
  const int64_t last_beat = sim.now;
  sim.Gone(1);  // frozen agent: no more heartbeats, the stream stays open
  sim.Run(1000, 0);
  const auto status = sim.rt->StatusReport();
  ASSERT_EQ(detected.size(), 1u) << "the loss is a fault found by a timeout";
  EXPECT_GT(detected[0], 0.0);
  EXPECT_LE(detected[0], static_cast<double>(sim.now - last_beat) / 1000.0);
  bool lost = false;
  for (const auto& e : Events(sim))
    lost = lost || e.message().find("no heartbeat from pod pod-1") != std::string::npos;
  EXPECT_TRUE(lost);
  EXPECT_EQ(status.nodes(1).state(), "lost");
}

// Issue 11, finding 1: a paused agent declared lost is told so at once (a fenced refusal that
// ends its stream), and its still-open stream never blocks its replacement.
TEST(JobControl, APodDeclaredLostWhileConnectedIsFencedAndDoesNotBlockItsReplacement) {
  ScriptedAgents sim(2, 2, kForce, kElastic);
  sim.RegisterAll();
  sim.Run(20);
  sim.Gone(1);  // paused (SIGSTOP): no heartbeats, the stream stays open
  bool closed = false, fenced = false;
  for (int64_t t = 0; t < 1000 && !closed; t += 20) {
    sim.now += 20;
    sim.BeatAll(0);
    sim.rt->Tick(sim.now);
    for (auto& o : sim.rt->TakeOutgoing())
      if (o.node_rank == 1 && o.message.has_refusal()) {
        fenced = o.message.refusal().fenced();
        closed = o.close;
      }
  }
  EXPECT_TRUE(fenced) << "the lost pod must learn it is fenced";
  EXPECT_TRUE(closed) << "and its stream must end";
  // Its replacement registers while the old stream has not gone yet.
  auto node = sim.Register(1, "pod-1-b");
  ASSERT_TRUE(node.ok()) << node.status().message();
  EXPECT_EQ(*node, 1);
}

TEST(JobControl, AHungStepIsDetected) {
  ScriptedAgents sim(2, 2, kForce,
          {{"recover-strategy", "recover-in-place"}, {"regroup.io/tensor-parallel", "2"},
           {"regroup.io/hang-timeout-min-s", "2"}, {"regroup.io/heartbeat-interval-ms", "100"}});
  sim.RegisterAll();
  sim.Run(20);
  sim.Run(2100, 0);  // heartbeats keep coming, the step never advances
  bool hang = false;
  for (const auto& e : Events(sim))
    hang = hang || (e.kind() == "fault" && e.message().rfind("hang:", 0) == 0);
  EXPECT_TRUE(hang);
  EXPECT_EQ(sim.Count(0, v1::ManagerMessage::kAbort), 1);
}

// Issue 37: rank 2 (pod 1, local 0) stops making progress at step 5 (deadlocked: its heartbeat
// thread still beats, its main thread runs nothing) while the other ranks wait for it in the
// gradient collective. Found within max(1 s, 2 x the median step), long before the 30 s hang
// timeout; one that still runs (`cpu_idle_ms` stays low: starved, not stuck) is not.
void StallAtStep5(ScriptedAgents& sim, bool runs, int64_t* found_after) {
  sim.RegisterAll();
  sim.Run(20);
  for (int64_t step = 0; step < 5; ++step) {  // steps of about 100 ms commit
    sim.Run(100, step);
    for (int64_t n = 0; n < 2; ++n) ASSERT_TRUE(sim.Vote(n, step).ok());
    sim.Collect();
  }
  ASSERT_EQ(sim.rt->committed_step(), 4);
  const int64_t stalled_at = sim.now;
  const uint64_t g = sim.rt->generation();
  *found_after = -1;
  (void)sim.TickWith(250, [&](int64_t node) -> Status {
    v1::AgentMessage m;
    for (uint32_t l = 0; l < 2; ++l) {
      const bool stuck = node == 1 && l == 0;
      v1::LocalRank r = ScriptedAgents::Live(
          l, stuck ? v1::PHASE_COMPUTING : v1::PHASE_REDUCING, 5, g, 4);
      r.set_cpu_idle_ms(stuck && !runs ? static_cast<uint32_t>(sim.now - stalled_at) : 10);
      *m.mutable_heartbeat()->add_ranks() = r;
    }
    if (*found_after < 0 && Logged(sim, "fault", "stopped making progress") > 0)
      *found_after = sim.now - stalled_at;
    return sim.Send(node, m);
  });
}

TEST(JobControl, ARankThatStopsMakingProgressIsFoundWithinTwoStepsWhileItsPeersWaitForIt) {
  const Map annotations = {{"recover-strategy", "recover-in-place"},
                           {"regroup.io/hang-timeout-min-s", "30"}};
  ScriptedAgents sim(2, 2, kForce, annotations);
  int64_t found_after = -1;
  StallAtStep5(sim, /*runs=*/false, &found_after);
  ASSERT_GE(found_after, 0) << "found before the 30 s hang timeout";
  EXPECT_GT(found_after, 1000) << "not before the bound: max(1 s, 2 x ~100 ms)";
  EXPECT_LE(found_after, 1100);
  EXPECT_EQ(Logged(sim, "fault", "hang: rank 2 stopped making progress"), 1) << FirstFault(sim);

  ScriptedAgents starved(2, 2, kForce, annotations);
  StallAtStep5(starved, /*runs=*/true, &found_after);
  EXPECT_EQ(found_after, -1) << "a rank that runs is slow, not stuck";
  EXPECT_EQ(FirstFault(starved), "");
}

TEST(JobControl, StaleAndForeignMessagesAreRefusedAndChangeNothing) {
  ScriptedAgents sim(2, 2, kForce, kElastic);
  sim.RegisterAll();
  sim.Run(20);
  v1::AgentMessage vote;
  vote.mutable_votes()->set_generation(7);
  vote.mutable_votes()->set_step(0);
  EXPECT_EQ(sim.Send(0, vote).message(),
            "the votes are for generation 7; the current one is 1");
  v1::AgentMessage m;
  m.mutable_heartbeat();
  *m.mutable_header() = sim.Header(0);
  m.mutable_header()->set_epoch(sim.rt->epoch() - 1);
  EXPECT_EQ(sim.rt->Handle(sim.streams_[0], m, sim.now).code(), REGROUP_FAILED_PRECONDITION);
  m.mutable_header()->set_epoch(sim.rt->epoch());
  m.mutable_header()->set_sender("pod-1");
  EXPECT_EQ(sim.rt->Handle(sim.streams_[0], m, sim.now).message(),
            "the sender pod-1 is not this stream's pod pod-0");
  EXPECT_EQ(sim.rt->Handle(999, m, sim.now).code(), REGROUP_FAILED_PRECONDITION);
  v1::AgentMessage exit;
  exit.mutable_process_exit()->set_local_rank(9);
  EXPECT_EQ(sim.Send(0, exit).code(), REGROUP_INVALID_ARGUMENT);
  EXPECT_EQ(sim.rt->generation(), 1u);
  EXPECT_TRUE(sim.rt->training());
}

TEST(JobControl, RegistrationRefusals) {
  ScriptedAgents sim(2, 2, kForce, kElastic);
  ASSERT_TRUE(sim.Register(0).ok());
  // A duplicate node rank from another pod.
  auto dup = sim.Register(0, "intruder", {}, 0, 77);
  EXPECT_EQ(dup.status().code(), REGROUP_FAILED_PRECONDITION);
  EXPECT_EQ(dup.status().message(), "node rank 0 is held by pod pod-0; pod intruder cannot take it");
  sim.uids_[0] = "pod-0";
  // Out of range.
  EXPECT_EQ(sim.Register(1, "", {}, 0, 78).ok(), true);
  v1::Register bad;
  bad.set_pod_uid("x");
  bad.set_node_rank(5);
  bad.set_nproc(2);
  v1::Header h = sim.Header(0);
  h.set_sender("x");
  EXPECT_EQ(sim.rt->Register(90, h, bad, sim.now).status().message(),
            "node rank 5 is out of range: job default/job has 2 pods");
  bad.set_node_rank(1);
  bad.set_nproc(4);
  EXPECT_EQ(sim.rt->Register(91, h, bad, sim.now).status().code(), REGROUP_INVALID_ARGUMENT);
  h.set_job_id("other/job");
  EXPECT_EQ(sim.rt->Register(92, h, bad, sim.now).status().code(), REGROUP_NOT_FOUND);
  h.set_job_id("default/job");
  h.set_epoch(sim.rt->epoch() + 1);
  EXPECT_EQ(sim.rt->Register(93, h, bad, sim.now).status().message().rfind("fenced", 0), 0u);
}

// What a restarted manager hears from a surviving pod of `ppp` processes: each alive and paused,
// last in generation 9 of the old epoch, having applied step `committed`.
std::vector<v1::LocalRank> Survivor(int64_t ppp, int64_t committed) {
  std::vector<v1::LocalRank> ranks(static_cast<size_t>(ppp));
  for (uint32_t l = 0; l < ranks.size(); ++l) {
    ranks[l].set_local_rank(l);
    ranks[l].set_alive(true);
    ranks[l].set_pid(100 + static_cast<int32_t>(l));
    ranks[l].set_phase(v1::PHASE_PAUSED);
    ranks[l].set_generation(9);
    ranks[l].set_committed_step(committed);
    ranks[l].set_heard_commit_step(committed);
  }
  return ranks;
}

// ...each of whose ranks voted for step `step` in generation 9 of epoch 1, and has not heard the
// outcome.
std::vector<v1::LocalRank> Voted(std::vector<v1::LocalRank> ranks, int64_t step) {
  for (auto& r : ranks) {
    r.set_voted_step(step);
    r.set_voted_epoch(1);
    r.set_voted_generation(9);
  }
  return ranks;
}

TEST(JobControl, RestartedManagerResumesAtTheCommitAnySurvivorHeard) {
  // A new manager incarnation (epoch 2): agents report what their trainers hold. Rank 3 heard
  // commit for step 41 before the old manager died; the others only voted.
  JobControlOptions o;
  o.epoch = 2;
  ScriptedAgents sim(2, 2, kForce, kElastic, o);
  for (int64_t n = 0; n < 2; ++n) {
    std::vector<v1::LocalRank> ranks = Voted(Survivor(2, 40), 41);
    if (n == 1) ranks[1].set_heard_commit_step(41);
    ASSERT_TRUE(sim.Register(n, "", ranks, 2).ok());
  }
  sim.Run(20);
  ASSERT_EQ(sim.rt->generation(), 10u) << "numbered past the old epoch's generation 9";
  EXPECT_EQ(sim.starts_[0].plan().committed_step(), 41);
  EXPECT_EQ(sim.starts_[0].plan().epoch(), 2u);
}

// ...and says the rest of that vote, as an agent does: the generation it was cast in had
// `world` ranks, and the rank could commit the step.
std::vector<v1::LocalRank> VotedWhole(std::vector<v1::LocalRank> ranks, int64_t step,
                                      uint32_t world) {
  ranks = Voted(std::move(ranks), step);
  for (auto& r : ranks) {
    r.set_voted_world_size(world);
    r.set_voted_ok(true);
  }
  return ranks;
}

// Pod `n`'s ranks voted for a checksum step: `at[p]` at tensor-parallel position p (tp 2, each
// pod one replica), with their ranks in the generation, as an agent reports them.
std::vector<v1::LocalRank> VotedChecksums(int64_t n, std::vector<uint64_t> at) {
  std::vector<v1::LocalRank> ranks = VotedWhole(Survivor(2, 40), 41, 4);
  for (uint32_t l = 0; l < 2; ++l) {
    ranks[l].set_voted_rank(static_cast<uint32_t>(n) * 2 + l);
    ranks[l].set_voted_checksum(at[l]);
  }
  return ranks;
}

// Issue 37 (scenario 7 redid a step): the manager died with a vote in flight. Every rank of the
// generation voted for step 41, none heard the outcome: the vote was whole, and the old manager
// would have committed it. The restarted one finishes it, naming the generation that cast it
// (whose ranks apply their own votes, python/regroup/forming.py), instead of having it redone.
// A checksum step too (CI's scenario 7 redid step 10, checksums every 5): the restarted manager
// compares the replicas' checksums, position by position, as the tally would have.
TEST(JobControl, ARestartedManagerFinishesAVoteEveryRankOfTheGenerationCast) {
  for (const bool checksums : {false, true}) {
    SCOPED_TRACE(checksums ? "a checksum step whose replicas agree" : "no checksum");
    JobControlOptions o;
    o.epoch = 2;
    ScriptedAgents sim(2, 2, kForce, kElastic, o);
    for (int64_t n = 0; n < 2; ++n)
      ASSERT_TRUE(sim.Register(n, "",
                               checksums ? VotedChecksums(n, {7, 8})
                                         : VotedWhole(Survivor(2, 40), 41, 4),
                               2)
                      .ok());
    sim.Run(20);
    ASSERT_EQ(sim.rt->generation(), 10u);
    const v1::GenerationPlan& plan = sim.starts_[0].plan();
    EXPECT_EQ(plan.committed_step(), 41);
    EXPECT_EQ(plan.committed_epoch(), 1u);
    EXPECT_EQ(plan.committed_generation(), 9u);
    EXPECT_EQ(
        Logged(sim, "commit", "step 41 is committed: every rank of generation (1, 9) voted"), 1);
  }
}

// ...but a vote that is not whole, or that the old manager might have refused, is not finished:
// the step is redone (the ranks drop their votes), as before.
TEST(JobControl, ARestartedManagerFinishesNoVoteItCannotKnowWouldHaveCommitted) {
  struct Case {
    std::string what;
    std::function<void(int64_t pod, std::vector<v1::LocalRank>&)> change;
    bool forms = true;  // a generation forms within the run (a dead process is restarted first)
  };
  const std::vector<Case> cases = {
      {"a rank could not commit the step",
       [](int64_t n, auto& r) { if (n == 1) r[0].set_voted_ok(false); }},
      {"replicas disagree on their checksums (rank 3's against rank 1's, at position 1)",
       [](int64_t n, auto& r) { r = VotedChecksums(n, {7, n == 1 ? 9u : 8u}); }},
      {"a world size no job has, with checksums (a hostile agent: nothing is sized by it)",
       [](int64_t n, auto& r) {
         r = VotedChecksums(n, {7, 8});
         for (auto& x : r) x.set_voted_world_size(4000000000u);
       }},
      {"a checksum whose rank in the generation is not known (an older agent)",
       [](int64_t n, auto& r) {
         r = VotedChecksums(n, {7, 8});
         r[1].clear_voted_rank();
       }},
      {"an older agent (the generation's size not known)",
       [](int64_t, auto& r) { for (auto& x : r) x.set_voted_world_size(0); }},
      {"a rank's process died after it voted",
       [](int64_t n, auto& r) { if (n == 0) r[1].set_alive(false); }, false},
      {"a rank of the generation is not back (its pod is away)",
       [](int64_t, auto& r) { for (auto& x : r) x.set_voted_world_size(6); }},
      {"a rank voted in another generation",
       [](int64_t n, auto& r) { if (n == 1) r[1].set_voted_generation(8); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    JobControlOptions o;
    o.epoch = 2;
    ScriptedAgents sim(2, 2, kForce, kElastic, o);
    for (int64_t n = 0; n < 2; ++n) {
      std::vector<v1::LocalRank> ranks = VotedWhole(Survivor(2, 40), 41, 4);
      c.change(n, ranks);
      ASSERT_TRUE(sim.Register(n, "", ranks, 2).ok());
    }
    sim.Run(1000, -1);
    if (c.forms) ASSERT_GE(sim.rt->generation(), 10u);
    for (const auto& [node, start] : sim.starts_) EXPECT_EQ(start.plan().committed_step(), 40);
    EXPECT_EQ(Logged(sim, "commit", "is committed: every rank"), 0);
  }
}

TEST(JobControl, AMinorityOfTheLastGenerationMustNotFormOne) {
  JobControlOptions o;
  o.epoch = 3;
  ScriptedAgents sim(4, 2, kForce, kElastic, o);
  ASSERT_TRUE(sim.Register(0, "", {}, 4).ok());
  ASSERT_TRUE(sim.Register(1, "", {}, 4).ok());
  sim.Run(6000, -1);  // the registered pods beat as they wait
  EXPECT_EQ(sim.rt->generation(), 0u) << "2 of 4 is no majority";
  bool said = false;
  for (const auto& e : Events(sim))
    said = said || e.message().find("waiting for a majority") != std::string::npos;
  EXPECT_TRUE(said);
  ASSERT_TRUE(sim.Register(2, "", {}, 4).ok());
  sim.Run(400, -1);  // the missing pod goes through the engine's report window
  EXPECT_EQ(sim.rt->generation(), 1u) << "3 of 4 is";
}

// The record of manager epoch 5, whose generation 3 had `pods` pods (pod-0, pod-1, ...).
std::optional<JobRecord> LedByEpoch5(int64_t pods) {
  JobRecord r;
  r.job_id = "default/job";
  r.epoch = r.leader_epoch = 5;
  r.generation = 3;
  for (int64_t n = 0; n < pods; ++n) r.members.push_back({n, "pod-" + std::to_string(n)});
  return r;
}

// Incarnation `epoch`: it read `stored` at its start and looks at it as it is now.
JobControlOptions Watching(std::optional<JobRecord>& stored, uint64_t epoch) {
  JobControlOptions o;
  o.epoch = epoch;
  o.record = stored;
  o.stored_record = [&stored]() -> const std::optional<JobRecord>& { return stored; };
  return o;
}

// Issue 11, a second manager beside the first (simulation seed 104 of second_manager): the newer
// incarnation waited for a majority the older one held, the older one finished the job and
// recorded its end, and the newer one kept its pods waiting for good. A look at the record once
// a second ends the job here too.
TEST(JobControl, AnIncarnationWaitingForAMajorityLearnsFromTheRecordThatTheJobEnded) {
  std::optional<JobRecord> stored = LedByEpoch5(4);
  ScriptedAgents sim(4, 2, kForce, kElastic, Watching(stored, 6));
  ASSERT_TRUE(sim.Register(0, "", {}, 4).ok());
  sim.Run(2000, -1);
  ASSERT_EQ(sim.rt->generation(), 0u) << "1 of 4 is no majority";
  EXPECT_EQ(sim.Count(0, v1::ManagerMessage::kStop), 0);
  stored->stopped = true;  // epoch 5 finished the job with the other three
  stored->stop_mode = v1::StopTraining::MODE_EXIT;
  stored->stop_reason = "training finished at step 370";
  sim.Run(1100, -1);
  ASSERT_EQ(sim.Count(0, v1::ManagerMessage::kStop), 1);
  EXPECT_EQ(sim.inbox_[0].back().stop().reason(), "training finished at step 370");
  EXPECT_EQ(sim.inbox_[0].back().stop().mode(), v1::StopTraining::MODE_EXIT);
  EXPECT_FALSE(sim.inbox_[0].back().stop().incarnation_only()) << "the job is over";
  EXPECT_EQ(sim.rt->StatusReport().phase(), "stopped");
  // A pod that registers afterwards is told too.
  ASSERT_TRUE(sim.Register(1, "", {}, 4).ok());
  sim.Collect();
  ASSERT_EQ(sim.Count(1, v1::ManagerMessage::kStop), 1);
}

// ...and one that waits, or trains, learns within a second that a newer incarnation formed a
// generation: it stops its pods (they come back to the newer one) without waiting for a commit.
TEST(JobControl, AnIncarnationLearnsWithinASecondThatANewerOneFormedAGeneration) {
  std::optional<JobRecord> stored;
  ScriptedAgents sim(2, 1, kForce, {{"recover-strategy", "elastic-training"}}, Watching(stored, 5));
  sim.RegisterAll();
  sim.Run(20);
  ASSERT_EQ(sim.rt->generation(), 1u);
  stored = sim.rt->TakeRecord();
  ASSERT_TRUE(stored);
  stored->epoch = stored->leader_epoch = 6;
  sim.Clear();
  sim.Run(1100, 0);  // no vote: the generation computes a long step
  for (int64_t n = 0; n < 2; ++n) {
    ASSERT_EQ(sim.Count(n, v1::ManagerMessage::kStop), 1);
    EXPECT_EQ(sim.inbox_[n].back().stop().reason(),
              "fenced: manager epoch 6 formed a generation of job default/job after this one "
              "(epoch 5); this incarnation stops");
    EXPECT_TRUE(sim.inbox_[n].back().stop().incarnation_only());
  }
}

// The embedded engine, under a lease the test takes away and gives back (as RemoteDecisions
// holds the coordinator's).
class Leased final : public EngineDecisions {
 public:
  Leased(const JobSpec& spec, const std::string* why_no_commit)
      : EngineDecisions(spec), why_(why_no_commit) {}
  std::string WhyNoCommit() const override { return *why_; }

 private:
  const std::string* why_;
};

// With a coordinator, a manager cut off from it may have been replaced without hearing so: a
// step every rank voted for is committed only under the lease, once it holds again, and never
// once its generation is over.
TEST(JobControl, AStepIsCommittedOnlyUnderTheDecisionMakersLease) {
  ScriptedAgents sim(2, 1, kForce, {{"recover-strategy", "recover-in-place"}});
  std::string no_lease;
  sim.rt = std::make_unique<JobControl>(sim.spec_, sim.spec_.Resolve().config,
                                        JobControlOptions(),
                                        std::make_unique<Leased>(sim.spec_, &no_lease));
  sim.RegisterAll();
  sim.Run(20, 0);
  ASSERT_TRUE(sim.rt->training());
  no_lease = "the lease ran out 5 ms ago";
  ASSERT_TRUE(sim.Vote(0, 0).ok());
  ASSERT_TRUE(sim.Vote(1, 0).ok());
  EXPECT_EQ(sim.rt->committed_step(), -1);
  EXPECT_EQ(Logged(sim, "wait",
                   "step 0 is voted for; it is committed once this manager holds a lease "
                   "again: the lease ran out 5 ms ago"),
            1);
  sim.Run(60000, 0);  // a minute, longer than the hang timeout: nobody is blamed for the wait
  EXPECT_TRUE(sim.rt->training());
  EXPECT_EQ(sim.rt->committed_step(), -1);
  sim.Clear();
  no_lease.clear();
  sim.Run(20, 0);
  EXPECT_EQ(sim.rt->committed_step(), 0);
  EXPECT_EQ(Logged(sim, "fault", ""), 0) << "the wait was this manager's, not its ranks'";
  ASSERT_EQ(sim.Count(1, v1::ManagerMessage::kOutcome), 1);
  EXPECT_TRUE(sim.inbox_[1].back().outcome().commit());
  // A step held when its generation ends is not committed by the lease's return.
  no_lease = "the lease ran out";
  ASSERT_TRUE(sim.Vote(0, 1).ok());
  ASSERT_TRUE(sim.Vote(1, 1).ok());
  const uint64_t generation = sim.rt->generation();
  ASSERT_TRUE(sim.Exit(1, 0, 1).ok());
  ASSERT_TRUE(!sim.rt->training() || sim.rt->generation() != generation);
  no_lease.clear();
  sim.Run(20, 0);
  EXPECT_EQ(sim.rt->committed_step(), 0);
}

TEST(JobControl, PlannedDepartureLeavesAtTheStepBoundaryWithNoLostWork) {
  ScriptedAgents sim(4, 2, kForce, kElastic);
  sim.RegisterAll();
  sim.Run(20);
  v1::AgentMessage leave;
  leave.mutable_leave()->set_reason("SIGTERM");
  ASSERT_TRUE(sim.Send(3, leave).ok());
  sim.Collect();
  EXPECT_EQ(sim.Count(0, v1::ManagerMessage::kAbort), 0) << "the step in flight goes on";
  for (int64_t n = 0; n < 4; ++n) ASSERT_TRUE(sim.Vote(n, 0).ok());
  EXPECT_EQ(sim.rt->committed_step(), 0) << "the step committed with the leaver's work";
  sim.Collect();
  EXPECT_EQ(sim.Count(3, v1::ManagerMessage::kStop), 1);
  EXPECT_EQ(sim.inbox_[3].back().stop().mode(), v1::StopTraining::MODE_LEAVE);
  sim.Gone(3);
  sim.Run(400, 1);
  EXPECT_EQ(sim.rt->generation(), 2u);
  EXPECT_EQ(sim.starts_[0].plan().committed_step(), 0);
  EXPECT_EQ(sim.starts_[0].plan().data_parallel(), 3u);
}

TEST(JobControl, TrainingFinishesWhenEveryRankExitsCleanly) {
  ScriptedAgents sim(2, 2, kForce, kElastic);
  sim.RegisterAll();
  sim.Run(20);
  for (int64_t n = 0; n < 2; ++n)
    for (uint32_t l = 0; l < 2; ++l) ASSERT_TRUE(sim.Exit(n, l, 0).ok());
  EXPECT_EQ(sim.rt->StatusReport().phase(), "stopped");
}

// Found by the simulation (seed 14929): the ranks of one pod finished training, a rank of the
// other hung in its last step; the recovery that followed lost the finished pod too and restarted
// the job from its checkpoint, waiting for good for a pod that had finished. Once a holder of
// the trained state finished, the last step is committed: a later fault ends the training.
TEST(JobControl, AFaultAfterARankFinishedTrainingEndsTheJob) {
  ScriptedAgents sim(2, 1, kForce, {{"recover-strategy", "recover-in-place,elastic-training"}});
  sim.RegisterAll();
  sim.Run(20);
  ASSERT_EQ(sim.rt->generation(), 1u);
  for (int64_t n = 0; n < 2; ++n) ASSERT_TRUE(sim.Vote(n, 0).ok());
  ASSERT_TRUE(sim.Exit(1, 0, 0).ok());  // rank 1 trained its last step
  EXPECT_EQ(sim.rt->StatusReport().phase(), "training") << "rank 0 still runs";
  sim.Clear();
  ASSERT_TRUE(sim.Exit(0, 0, 1).ok());  // rank 0 fails after it
  sim.Collect();
  EXPECT_EQ(sim.rt->StatusReport().phase(), "stopped");
  ASSERT_EQ(sim.Count(0, v1::ManagerMessage::kStop), 1);
  EXPECT_EQ(sim.inbox_[0].back().stop().mode(), v1::StopTraining::MODE_LEAVE);
  EXPECT_EQ(sim.Count(0, v1::ManagerMessage::kRestart), 0) << "nothing is left to recover";
}

// Found by the simulation (sim/, seed 4 of its first sweep): a replacement that registered after
// the job had stopped was welcomed and then never told anything, so its pod ran for good.
TEST(JobControl, APodRegisteringAfterTheJobStoppedIsToldToStop) {
  ScriptedAgents sim(2, 1, kForce, {{"recover-strategy", "elastic-training"}});
  sim.RegisterAll();
  sim.Run(20);
  ASSERT_EQ(sim.rt->generation(), 1u);
  ASSERT_TRUE(sim.Exit(0, 0, 0).ok());
  ASSERT_TRUE(sim.Exit(1, 0, 0).ok());  // every rank finished: the job stops
  sim.rt->Disconnected(sim.streams_[1], sim.now);
  sim.Collect();
  sim.Clear();
  ASSERT_TRUE(sim.Register(1, "pod-1-late").ok());
  sim.Collect();
  ASSERT_EQ(sim.Count(1, v1::ManagerMessage::kWelcome), 1);
  ASSERT_EQ(sim.Count(1, v1::ManagerMessage::kStop), 1);
  EXPECT_EQ(sim.inbox_[1].back().stop().mode(), v1::StopTraining::MODE_LEAVE);
  EXPECT_EQ(sim.inbox_[1].back().stop().reason(), "training finished at step -1");
}

// Found by the simulation (seed 14130): a pod that missed a commit while its stream was down was
// sent it again stamped with the running generation, formed since and not the one that made it.
// Its agent notes the stamp as the committer, which a restarted manager's first plan names.
TEST(JobControl, ACommitSentAgainNamesTheGenerationThatMadeIt) {
  ScriptedAgents sim(3, 1, kForce, {{"recover-strategy", "recover-in-place,elastic-training"},
                         {"regroup.io/prefer-elastic", "true"}});
  sim.RegisterAll();
  sim.Run(100, 0);
  ASSERT_EQ(sim.rt->generation(), 1u);
  for (int64_t n = 0; n < 3; ++n) ASSERT_TRUE(sim.Vote(n, 0).ok());
  ASSERT_EQ(sim.rt->committed_step(), 0);
  ASSERT_TRUE(sim.Exit(2, 0, 1).ok());             // the survivors continue: generation 2
  ASSERT_EQ(sim.rt->generation(), 2u);
  sim.rt->Disconnected(sim.streams_[0], sim.now);  // pod 0 heard neither the commit nor that
  sim.Collect();
  sim.Clear();
  // Voted, heard nothing.
  const v1::LocalRank missed = ScriptedAgents::Live(0, v1::PHASE_VOTED, 0, 1, -1);
  v1::Register reg;
  reg.set_pod_uid("pod-0");
  reg.set_node_rank(0);
  reg.set_nproc(1);
  *reg.add_ranks() = missed;
  sim.streams_[0] = sim.next_stream_++;
  ASSERT_TRUE(sim.rt->Register(sim.streams_[0], sim.Header(0), reg, sim.now).ok());  // resumed
  sim.Collect();
  std::string story;
  for (const auto& e : Events(sim)) story += e.kind() + ": " + e.message() + "\n";
  for (const auto& m : sim.inbox_[0])
    story += "sent: " + m.ShortDebugString().substr(0, 100) + "\n";
  ASSERT_EQ(sim.Count(0, v1::ManagerMessage::kOutcome), 1) << story;
  for (const auto& m : sim.inbox_[0])
    if (m.has_outcome()) {
      EXPECT_EQ(m.outcome().step(), 0);
      EXPECT_TRUE(m.outcome().commit());
      EXPECT_EQ(m.outcome().generation(), 1u) << "generation 1 committed step 0, not 2";
    }
}

// Found by the simulation (seed 78): a process died while the job waited for a lost pod's
// replacement. The engine's wait named the rank to restart, the manager ignored it, and the
// resume that followed waited for that pod for good.
TEST(JobControl, ARankThatDiesDuringAWaitIsRestartedInPlace) {
  ScriptedAgents sim(3, 1, kForce, {{"recover-strategy", "recover-in-place,elastic-training"}});
  sim.RegisterAll();
  sim.Run(20, 0);
  ASSERT_EQ(sim.rt->generation(), 1u);
  sim.rt->Disconnected(sim.streams_[2], sim.now);  // pod 2 is lost: wait for its replacement
  sim.Gone(2);
  sim.Run(300, 0);
  sim.Clear();
  ASSERT_TRUE(sim.Exit(1, 0, 1).ok());  // then pod 1's process dies
  sim.Run(400);
  EXPECT_EQ(sim.Count(1, v1::ManagerMessage::kRestart), 1)
      << "the rank is restarted in place while the job waits";
}

// Found by the simulation (seed 951): without recover-in-place, a pod whose process died was
// neither restarted nor replaced; its slot stayed held, so no replacement could register.
TEST(JobControl, WithoutRecoverInPlaceAPodWhoseProcessDiedIsFencedSoItCanBeReplaced) {
  ScriptedAgents sim(4, 1, kForce, {{"recover-strategy", "elastic-training"},
                         {"regroup.io/prefer-elastic", "true"}});
  sim.RegisterAll();
  sim.Run(20, 0);
  ASSERT_EQ(sim.rt->generation(), 1u);
  sim.Clear();
  ASSERT_TRUE(sim.Exit(3, 0, 1).ok());
  sim.Run(400, 0);
  ASSERT_GE(sim.Count(3, v1::ManagerMessage::kRefusal), 1);
  EXPECT_TRUE(sim.inbox_[3].back().refusal().fenced());
  EXPECT_TRUE(sim.rt->IsFenced("pod-3"));
  sim.rt->Disconnected(sim.streams_[3], sim.now);
  EXPECT_TRUE(sim.Register(3, "pod-3-new").ok()) << "its replacement takes the slot";
}

// A manager restart reads the durable record the previous incarnation left.
JobRecord RecordOf(ScriptedAgents& sim) {
  auto record = sim.rt->TakeRecord();
  EXPECT_TRUE(record.has_value());
  return record.value_or(JobRecord());
}

JobControlOptions Restarted(const JobRecord& record) {
  JobControlOptions o;
  o.epoch = record.epoch + 1;
  o.record = record;
  return o;
}

// Finding 5 of the membership issue: the lost-pod list lived only in memory, so a pod declared
// lost before a restart was readmitted as active afterwards.
TEST(JobControl, APodDeclaredLostStaysFencedAcrossAManagerRestart) {
  ScriptedAgents before(4, 2, kForce, kElastic);
  before.RegisterAll();
  before.Run(20, 0);
  before.rt->Disconnected(before.streams_[2], before.now);  // pod 2 is lost
  before.Gone(2);
  before.Run(600, 0);  // past the liveness timeout: its session was not resumed
  ASSERT_TRUE(before.rt->IsFenced("pod-2"));
  ScriptedAgents after(4, 2, kForce, kElastic, Restarted(RecordOf(before)));
  EXPECT_TRUE(after.rt->IsFenced("pod-2"));
  auto zombie = after.Register(2);
  EXPECT_EQ(zombie.status().code(), REGROUP_FAILED_PRECONDITION);
  EXPECT_TRUE(after.Register(2, "pod-2-new").ok()) << "its replacement is welcome";
}

// Finding 4 (standalone): a second manager given pods of its own formed a generation and
// trained beside the first. Fresh pods never make the majority of a generation on record.
TEST(JobControl, FreshPodsAloneNeverMakeAMajorityAfterARestart) {
  ScriptedAgents before(4, 2, kForce, kElastic);
  before.RegisterAll();
  before.Run(20, 0);
  ASSERT_EQ(before.rt->generation(), 1u);
  ScriptedAgents after(4, 2, kForce, kElastic, Restarted(RecordOf(before)));
  for (int64_t n = 0; n < 4; ++n) ASSERT_TRUE(after.Register(n, "fresh-" + std::to_string(n)).ok());
  after.Run(6000);
  EXPECT_EQ(after.rt->generation(), 0u);
  bool waiting = false;
  for (const auto& e : Events(after))
    waiting |= e.message() ==
               "only 0 of the last generation's 4 pods on record came back: waiting for a "
               "majority before forming a generation";
  EXPECT_TRUE(waiting);
  // Past the join window and the decision wait, this incarnation stops rather than train
  // without it; only itself: the job is not over on record, as a newer one may run it.
  after.Run(31000);
  EXPECT_EQ(after.rt->StatusReport().phase(), "stopped");
  ASSERT_TRUE(after.inbox_[0].back().has_stop());
  EXPECT_TRUE(after.inbox_[0].back().stop().incarnation_only());
  const auto record = after.rt->TakeRecord();
  EXPECT_FALSE(record && record->stopped);
}

TEST(JobControl, AMajorityOfTheMembersOnRecordFormsTheNextGeneration) {
  ScriptedAgents before(4, 2, kForce, kElastic);
  before.RegisterAll();
  before.Run(20, 0);
  ScriptedAgents after(4, 2, kForce, kElastic, Restarted(RecordOf(before)));
  for (int64_t n = 0; n < 3; ++n) ASSERT_TRUE(after.Register(n).ok());
  ASSERT_TRUE(after.Register(3, "fresh-3").ok());
  after.Run(100);
  EXPECT_EQ(after.rt->generation(), 1u) << "3 of 4 members came back";
  EXPECT_EQ(after.rt->epoch(), before.rt->epoch() + 1);
}

// Found by the simulation (seed 9, a second manager and a restart after pods were readmitted):
// every node rank came back, two of them as readmitted incarnations of members on record
// (pod-1/2 of pod-1, pod-2/3 of pod-2/2), which the majority did not count; the job waited and
// stopped for good. A readmitted incarnation is its pod come back, not a fresh one.
TEST(JobControl, AReadmittedIncarnationOfAMemberOnRecordCountsForTheMajority) {
  ScriptedAgents before(4, 2, kForce, kElastic);
  for (int64_t n : {0, 1, 3}) ASSERT_TRUE(before.Register(n).ok());
  ASSERT_TRUE(before.Register(2, "pod-2/2").ok());  // a readmitted incarnation, a member
  before.Run(20, 0);
  ASSERT_EQ(before.rt->generation(), 1u);
  const JobRecord record = RecordOf(before);
  // A restarted manager to which pods 0 to 3 come back as `uids`; the generation it forms.
  auto formed = [&record](const std::vector<std::string>& uids) {
    ScriptedAgents after(4, 2, kForce, kElastic, Restarted(record));
    for (int64_t n = 0; n < 4; ++n)
      EXPECT_TRUE(after.Register(n, uids[static_cast<size_t>(n)]).ok());
    after.Run(100);
    return after.rt->generation();
  };
  EXPECT_EQ(formed({"pod-0", "pod-1/2", "pod-2/3", "fresh-3"}), 1u)
      << "3 of 4 members came back, two readmitted";
  EXPECT_EQ(formed({"pod-0", "pod-1x/2", "pod-2/2/x", "fresh-3"}), 0u)
      << "1 of 4 members: a uid that merely starts like a member's is no member";
}

// Found by the simulation (seed 334: a second manager beside the first): the newer incarnation
// took the members on record when it started (pods 0 and 1); the older one then lost pod 1 and
// formed a generation of pod 0 alone. Pod 0 and pod 1's replacement came to the newer one, which
// counted 1 of the 2 members it had read, waited, and stopped the job for good. The majority is
// of the last generation on record, as it is now.
TEST(JobControl, TheMajorityIsOfTheLastGenerationOnRecordNowNotWhenThisIncarnationStarted) {
  std::optional<JobRecord> stored = LedByEpoch5(2);
  ScriptedAgents sim(2, 1, kForce, {{"recover-strategy", "elastic-training"}}, Watching(stored, 6));
  ASSERT_TRUE(sim.Register(0).ok());
  ASSERT_TRUE(sim.Register(1, "pod-1-r1").ok());  // a fresh pod: no member
  sim.Run(2000, -1);
  ASSERT_EQ(sim.rt->generation(), 0u) << "1 of 2 is no majority";
  stored->generation = 4;  // epoch 5 formed a generation of pod 0 alone, and lost it since
  stored->members = {{0, "pod-0"}};
  sim.Run(1100, -1);
  EXPECT_EQ(sim.rt->generation(), 1u) << "1 of 1 is";
}

// Found by the simulation (seeds 541 and 857): the job stopped, then its manager restarted and
// welcomed the pods that had not heard the stop, which then waited for good.
TEST(JobControl, AJobThatStoppedStaysStoppedAcrossAManagerRestart) {
  ScriptedAgents before(2, 1, kForce, {{"recover-strategy", "elastic-training"}});
  before.RegisterAll();
  before.Run(20);
  ASSERT_TRUE(before.Exit(0, 0, 0).ok());
  ASSERT_TRUE(before.Exit(1, 0, 0).ok());
  ScriptedAgents after(2, 1, kForce, {{"recover-strategy", "elastic-training"}},
                       Restarted(RecordOf(before)));
  ASSERT_TRUE(after.Register(0).ok());
  after.Collect();
  ASSERT_EQ(after.Count(0, v1::ManagerMessage::kStop), 1);
  EXPECT_EQ(after.inbox_[0].back().stop().reason(), "training finished at step -1");
  EXPECT_EQ(after.rt->StatusReport().phase(), "stopped");
}

// A manager that learns from the record that a newer incarnation formed a generation stops its
// pods and never writes the record again.
TEST(JobControl, ASupersededIncarnationStopsItsPodsAndKeepsOffTheRecord) {
  ScriptedAgents sim(2, 1, kForce, {{"recover-strategy", "elastic-training"}});
  sim.RegisterAll();
  sim.Run(20);
  ASSERT_TRUE(sim.rt->TakeRecord().has_value());
  sim.Clear();
  sim.rt->Superseded("manager epoch 9 formed a generation", sim.now);
  sim.Collect();
  ASSERT_EQ(sim.Count(0, v1::ManagerMessage::kStop), 1);
  EXPECT_EQ(sim.inbox_[0].back().stop().mode(), v1::StopTraining::MODE_EXIT);
  EXPECT_EQ(sim.inbox_[0].back().stop().reason(),
            "fenced: manager epoch 9 formed a generation; this incarnation stops");
  EXPECT_FALSE(sim.rt->TakeRecord().has_value());
}

// Issue 11, split brain standalone: a newer incarnation that formed a generation (a second
// manager given its own pods) fences this one at its next commit, not at its next write of the
// record, which a job training steadily may not make for hours.
TEST(JobControl, AnIncarnationFencedOnRecordCommitsNoFurtherStep) {
  std::optional<JobRecord> stored;
  ScriptedAgents sim(2, 1, kForce, {{"recover-strategy", "elastic-training"}}, Watching(stored, 5));
  sim.RegisterAll();
  sim.Run(20);
  ASSERT_EQ(sim.rt->generation(), 1u);
  ASSERT_TRUE(sim.Vote(0, 0).ok());
  ASSERT_TRUE(sim.Vote(1, 0).ok());
  ASSERT_EQ(sim.rt->committed_step(), 0);
  stored = sim.rt->TakeRecord();
  ASSERT_TRUE(stored);
  stored->epoch = stored->leader_epoch = 6;  // epoch 6 formed a generation meanwhile
  sim.Collect();
  sim.Clear();
  ASSERT_TRUE(sim.Vote(0, 1).ok());
  ASSERT_TRUE(sim.Vote(1, 1).ok());
  sim.Collect();
  EXPECT_EQ(sim.rt->committed_step(), 0) << "step 1 was not committed";
  for (int64_t n = 0; n < 2; ++n) {
    EXPECT_EQ(sim.Count(n, v1::ManagerMessage::kOutcome), 0);
    ASSERT_EQ(sim.Count(n, v1::ManagerMessage::kStop), 1);
    EXPECT_EQ(sim.inbox_[n].back().stop().reason(),
              "fenced: manager epoch 6 formed a generation of job default/job after this one "
              "(epoch 5); this incarnation stops");
  }
  EXPECT_FALSE(sim.rt->TakeRecord().has_value()) << "a fenced incarnation writes no record";
}

// Issue 11: a pod declared lost for silence (paused, cut off) may be alive: it is told it may
// come back as its own replacement, and its new incarnation registers as a standby that the
// next scale-out takes in.
TEST(JobControl, APodLostForSilenceMayComeBackAsItsOwnReplacement) {
  ScriptedAgents sim(4, 2, kForce, kElastic);
  sim.RegisterAll();
  sim.Run(20, 0);
  sim.Gone(2);  // paused: it stays connected, and silent
  sim.Run(600, 0);
  ASSERT_TRUE(sim.rt->IsFenced("pod-2"));
  ASSERT_EQ(sim.Count(2, v1::ManagerMessage::kRefusal), 1);
  v1::Refusal refusal;
  for (const auto& m : sim.inbox_[2])
    if (m.has_refusal()) refusal = m.refusal();
  EXPECT_TRUE(refusal.fenced());
  EXPECT_TRUE(refusal.readmit());
  EXPECT_TRUE(sim.rt->MayReadmit("pod-2"));
  sim.rt->Disconnected(sim.streams_[2], sim.now);
  ASSERT_TRUE(sim.Register(2, "pod-2/2").ok()) << "back under a new incarnation of its uid";
  EXPECT_EQ(sim.rt->StatusReport().nodes(2).state(), "standby");
}

// Found by the simulation: a pod that came back within the report window of its own loss made
// the engine see only a standby touched, so it issued no directive while the manager had
// aborted the generation: the job waited for good.
TEST(JobControl, APodBackWithinTheReportWindowOfItsLossStillGetsTheJobADirective) {
  ScriptedAgents sim(4, 2, kForce, kElastic);
  sim.RegisterAll();
  sim.Run(20, 0);
  sim.Gone(2);
  sim.Run(520, 0);  // declared lost: the report window (200 ms) opens
  ASSERT_TRUE(sim.rt->IsFenced("pod-2"));
  ASSERT_FALSE(sim.rt->training());
  sim.rt->Disconnected(sim.streams_[2], sim.now);
  ASSERT_TRUE(sim.Register(2, "pod-2/2").ok());
  sim.gone_.erase(2);
  sim.Run(600, 0);
  EXPECT_TRUE(sim.rt->training()) << "a directive came and a generation formed";
}

TEST(JobControl, APodWhoseProcessesFailedMustBeReplacedNotReadmitted) {
  ScriptedAgents sim(4, 1, kForce, {{"recover-strategy", "elastic-training"},
                         {"regroup.io/prefer-elastic", "true"}});
  sim.RegisterAll();
  sim.Run(20, 0);
  ASSERT_TRUE(sim.Exit(3, 0, 1).ok());
  sim.Run(400, 0);
  ASSERT_TRUE(sim.rt->IsFenced("pod-3"));
  EXPECT_FALSE(sim.inbox_[3].back().refusal().readmit());
  EXPECT_FALSE(sim.rt->MayReadmit("pod-3"));
}

// Issue 11, simulation seed 325: a pod whose rank was declared hung blipped, was declared lost,
// and came back as its own replacement with the process still frozen; it hung the same step
// again until the job stopped on a "poison step". A hung process is a failed one that has not
// exited: where recover-in-place is not allowed its pod is replaced, readmitted or not; once it
// beats again, it is not hung. Pod 3's trainer froze, its stream broke before any directive, and
// it came back as pod-3/2 with the same process, its trainer beating again or not.
void ReadmitAfterAHang(ScriptedAgents& sim, bool beats_again) {
  sim.RegisterAll();
  sim.Run(20, 0);
  ASSERT_TRUE(sim.rt->training());
  v1::LocalRank trainer = ScriptedAgents::Live(0, v1::PHASE_COMPUTING, 0, sim.rt->generation(), -1);
  trainer.set_beat_age_ms(5000);  // its agent reports its beat growing old
  auto beat = [&](int64_t n) {
    if (n != 3) return sim.Beat(n, 0, sim.rt->generation());
    v1::AgentMessage m;  // its agent beats; its trainer does, or not
    trainer.set_beat_age_ms(beats_again ? 10 : trainer.beat_age_ms() + 20);
    *m.mutable_heartbeat()->add_ranks() = trainer;
    return sim.Send(3, m);
  };
  v1::AgentMessage frozen;
  *frozen.mutable_heartbeat()->add_ranks() = trainer;
  ASSERT_TRUE(sim.Send(3, frozen).ok());
  ASSERT_TRUE(sim.TickWith(1, [&](int64_t n) { return n == 3 ? Status::Ok() : beat(n); }).ok());
  ASSERT_FALSE(sim.rt->training());
  ASSERT_EQ(Logged(sim, "fault", "frozen process"), 1);
  sim.rt->Disconnected(sim.streams_[3], sim.now);
  sim.Gone(3);
  sim.Run(600, 0);
  ASSERT_TRUE(sim.rt->MayReadmit("pod-3"));
  sim.gone_.erase(3);
  trainer.set_phase(v1::PHASE_PAUSED);
  trainer.set_beat_age_ms(beats_again ? 10 : 5800);
  ASSERT_TRUE(sim.Register(3, "pod-3/2", {trainer}).ok());
  ASSERT_TRUE(sim.TickWith(100, beat).ok());
}

TEST(JobControl, APodWhoseProcessHungIsReplacedEvenAfterItWasReadmitted) {
  ScriptedAgents sim(4, 1, kForce, {{"recover-strategy", "elastic-training"},
                         {"regroup.io/prefer-elastic", "true"}});
  ReadmitAfterAHang(sim, /*beats_again=*/false);
  ASSERT_TRUE(sim.rt->IsFenced("pod-3/2")) << "the pod with the frozen process is replaced";
  EXPECT_FALSE(sim.rt->MayReadmit("pod-3/2"));
  EXPECT_EQ(Logged(sim, "fence", "pod pod-3/2 is replaced: its local ranks 0 failed or hung"), 1);
  EXPECT_TRUE(sim.rt->training()) << "the others go on without it";
}

// A pod declared lost whose trainer died while it was away comes back as its own replacement
// with the process dead (simulation seed 4696): the process restarts as it registers, where the
// job allows restarts in place. Nothing else would start it while a directive waits for the
// pod, and the pod would be declared lost and readmitted, dead again, for good.
TEST(JobControl, APodReadmittedWithADeadProcessRestartsItAsItRegisters) {
  ScriptedAgents sim(4, 1, kForce, {{"recover-strategy", "recover-in-place,elastic-training"},
                                    {"regroup.io/prefer-elastic", "true"}});
  sim.RegisterAll();
  sim.Run(20, 0);
  ASSERT_TRUE(sim.rt->training());
  sim.rt->Disconnected(sim.streams_[3], sim.now);
  sim.Gone(3);
  sim.Run(800, 0);
  ASSERT_TRUE(sim.rt->MayReadmit("pod-3"));
  ASSERT_EQ(sim.rt->world_size(), 3u) << "scaled in without pod 3";
  v1::LocalRank dead = ScriptedAgents::Live(0, v1::PHASE_PAUSED, 0, 1, -1);
  dead.set_alive(false);
  sim.gone_.erase(3);
  sim.Clear();
  ASSERT_TRUE(sim.Register(3, "pod-3/2", {dead}).ok());
  sim.Collect();
  ASSERT_EQ(sim.Count(3, v1::ManagerMessage::kRestart), 1) << "its dead process restarts";
  EXPECT_EQ(Logged(sim, "fence", "pod-3/2"), 0) << "restarted, not replaced";
}

TEST(JobControl, AProcessThatHungAndBeatsAgainIsNotTakenForAFailedOne) {
  ScriptedAgents sim(4, 1, kForce, {{"recover-strategy", "elastic-training"},
                         {"regroup.io/prefer-elastic", "true"}});
  ReadmitAfterAHang(sim, /*beats_again=*/true);
  EXPECT_FALSE(sim.rt->IsFenced("pod-3/2"));
  EXPECT_EQ(Logged(sim, "fence", "failed or hung"), 0);
}

// A trainer's report of a failed collective on local rank 0 at step 0, in `generation` (0:
// not known).
v1::AgentMessage CollectiveError(uint64_t generation) {
  v1::AgentMessage m;
  m.mutable_fault()->set_kind(v1::FAULT_KIND_COLLECTIVE_ERROR);
  m.mutable_fault()->add_local_ranks(0);
  m.mutable_fault()->set_step(0);
  m.mutable_fault()->set_generation(generation);
  m.mutable_fault()->set_detail("Connection closed by peer");
  return m;
}

// Every start of a generation reaches a pod that trained in the generation before only after
// that one's abort: a rank still forming the old generation (in its rendezvous) is freed by the
// abort, and would otherwise wait there until its collective timeout.
void ExpectEveryStartAfterTheAbortOfTheGenerationBefore(ScriptedAgents& sim) {
  for (const auto& [node, inbox] : sim.inbox_) {
    uint64_t in = 0;  // the generation this pod trains in and that was not aborted yet
    for (const auto& m : inbox) {
      if (m.has_abort() && m.abort().generation() == in) in = 0;
      if (!m.has_start()) continue;
      EXPECT_EQ(in, 0u) << "pod " << node << " got generation " << m.start().plan().generation()
                        << " while generation " << in << " was not aborted";
      in = m.start().plan().ranks_size() > 0 ? m.start().plan().generation() : 0;
    }
  }
}

// Found by the e2e test of a fault during a state sync: the restarted process died again, and in
// the interim generation that followed a survivor's rendezvous failed. The failure aborted the
// interim generation and the rejoin formed the next at once; the decision on the failure (retry)
// came a report window later and formed another generation without aborting that one, whose
// ranks waited in their rendezvous. The generation formed since the fault is the retry: nothing
// regroups again. (Other decisions that form a generation while one trains abort it first: the
// sim's invariant, 38 of 4,000 seeds take that path.)
TEST(JobControl, ARetryDecidedAfterAGenerationFormedSinceTheFaultRegroupsNothing) {
  ScriptedAgents sim(2, 2, kForce,
          {{"recover-strategy", "retry,recover-in-place,recover,elastic-training,dump,exit"},
           {"regroup.io/prefer-elastic", "true"}});
  sim.RegisterAll();
  sim.Run(20);
  sim.Clear();
  ASSERT_TRUE(sim.Exit(1, 1, 0, 9).ok());
  sim.Collect();
  ASSERT_EQ(sim.rt->generation(), 2u) << "the survivors continue";
  sim.Run(240, 0);  // the decision on the crash
  ASSERT_TRUE(sim.Send(1, RestartedHello(2, 1, 2, -1)).ok());
  for (int64_t n = 0; n < 2; ++n) ASSERT_TRUE(sim.Vote(n, 0).ok());
  sim.Collect();
  ASSERT_EQ(sim.rt->generation(), 3u) << "the restarted rank rejoins";
  ASSERT_TRUE(sim.Exit(1, 1, 0, 9).ok());  // and dies again, before its state arrived
  sim.Collect();
  ASSERT_EQ(sim.rt->generation(), 4u);
  sim.Run(240, 0);  // the decision on the second crash: the rank rejoins at a step boundary
  ASSERT_TRUE(sim.Send(1, RestartedHello(2, 1, 4, 0)).ok());
  ASSERT_TRUE(sim.Send(0, CollectiveError(4)).ok());  // a survivor could not form generation 4
  sim.Collect();
  sim.Run(600, 0);
  EXPECT_EQ(sim.rt->generation(), 5u) << "the rejoin, at the failure's abort, and nothing more";
  EXPECT_TRUE(sim.rt->training());
  bool said = false;
  for (const auto& e : Events(sim))
    said |= e.kind() == "retry" && Contains(e.message(), "generation 5, formed since the fault");
  EXPECT_TRUE(said) << "the event says why nothing regrouped";
  ExpectEveryStartAfterTheAbortOfTheGenerationBefore(sim);
}

// A broken stream gets the liveness timeout to resume, but when the pod's peers' collectives
// fail meanwhile, the pod is gone (its node died): declared lost at once, not a timeout later.
TEST(JobControl, ACollectiveFailingWhileAPodsStreamIsDownDeclaresThatPodLostAtOnce) {
  ScriptedAgents sim(2, 2, kForce, kElastic);
  sim.RegisterAll();
  sim.Run(20, 0);
  sim.rt->Disconnected(sim.streams_[1], sim.now);
  sim.Gone(1);
  sim.Run(40, 0);
  EXPECT_FALSE(sim.rt->IsFenced("pod-1")) << "within its grace to resume";
  ASSERT_TRUE(sim.Send(0, CollectiveError(0)).ok());
  EXPECT_TRUE(sim.rt->IsFenced("pod-1"));
  EXPECT_FALSE(sim.rt->training());
}

// A trainer's report, the moment its collective failed, naming the peer at `host` (TrainerFault.
// early): a sign of a lost pod, not a fault of its own.
v1::AgentMessage CollectiveFailedWith(uint64_t generation, const std::string& host) {
  v1::AgentMessage m = CollectiveError(generation);
  m.mutable_fault()->set_early(true);
  m.mutable_fault()->set_peer(host);
  m.mutable_fault()->set_detail("Connection closed by peer [" + host + "]:41233");
  return m;
}

// Issue 37: a node dies with its agent's stream still open (no FIN yet, say); its peers'
// collectives with it fail at once. The reports of three survivors settle the loss two heartbeat
// intervals into its silence, long before its liveness timeout.
TEST(JobControl, ThreeSurvivorsReportsSettleANodeLossBeforeTheLivenessTimeout) {
  ScriptedAgents sim(4, 2, kForce, kElastic);
  sim.RegisterAll();
  sim.Run(20, 0);
  const int64_t lost_at = sim.now;
  sim.Gone(3);  // silent from now on; its stream stays open
  for (int64_t n : {0, 1, 2})
    ASSERT_TRUE(sim.Send(n, CollectiveFailedWith(sim.rt->generation(), "10.0.0.3")).ok());
  EXPECT_TRUE(sim.rt->training()) << "an early report is no fault of its own";
  EXPECT_FALSE(sim.rt->IsFenced("pod-3")) << "heard from just now";
  int64_t fenced_at = -1;
  for (int64_t t = 0; t < 1000 && fenced_at < 0; t += 20) {
    sim.Run(20, 0);
    if (sim.rt->IsFenced("pod-3")) fenced_at = sim.now;
  }
  ASSERT_GE(fenced_at, 0);
  const int64_t liveness = 5 * sim.rt->heartbeat_interval_ms();
  EXPECT_LT(fenced_at - lost_at, liveness) << "settled by the reports, not the timeout";
  EXPECT_LE(fenced_at - lost_at, 2 * sim.rt->heartbeat_interval_ms() + 20);
  EXPECT_EQ(Logged(sim, "fault", "with pod pod-3 failed"), 1);
  for (int64_t n : {0, 1, 2}) EXPECT_FALSE(sim.rt->IsFenced("pod-" + std::to_string(n)));
}

// The store's host (rank 0) names ranks of the forming generation that have not reached its store
// (TrainerFault.missing_ranks, early).
v1::AgentMessage NotArrived(uint64_t generation, std::vector<uint32_t> ranks) {
  v1::AgentMessage m = CollectiveError(generation);
  m.mutable_fault()->set_early(true);
  for (uint32_t r : ranks) m.mutable_fault()->add_missing_ranks(r);
  m.mutable_fault()->set_detail("ranks have not reached its store");
  return m;
}

// Issue 37: a node dies a moment after a generation was planned, before its ranks reached the
// generation's store. The survivors wait there: no collective of theirs fails, and its stream
// would get its grace (the liveness timeout). The store host's word that its ranks have not
// arrived, with its stream broken and two heartbeat intervals of silence, settles it.
TEST(JobControl, APodWhoseStreamBrokeAndWhoseRanksNeverReachedTheStoreIsLostInTwoBeats) {
  ScriptedAgents sim(4, 2, kForce, kElastic);
  sim.RegisterAll();
  sim.Run(20, 0);
  const uint64_t generation = sim.rt->generation();
  const int64_t lost_at = sim.now;
  sim.Gone(3);
  sim.rt->Disconnected(sim.streams_[3], sim.now);
  int64_t fenced_at = -1;
  for (int64_t t = 0; t < 1000 && fenced_at < 0; t += 20) {
    if (t % 500 == 0) ASSERT_TRUE(sim.Send(0, NotArrived(generation, {6, 7})).ok());
    sim.Run(20, 0);
    if (sim.rt->IsFenced("pod-3")) fenced_at = sim.now;
  }
  ASSERT_GE(fenced_at, 0) << "settled before its liveness timeout";
  EXPECT_GE(fenced_at - lost_at, 2 * sim.rt->heartbeat_interval_ms()) << "a blip's time first";
  EXPECT_LE(fenced_at - lost_at, 2 * sim.rt->heartbeat_interval_ms() + 40);
  EXPECT_EQ(Logged(sim, "fault", "its ranks have not reached the store of generation"), 1);
  for (int64_t n : {0, 1, 2}) EXPECT_FALSE(sim.rt->IsFenced("pod-" + std::to_string(n)));
}

// ...but not a pod whose ranks are merely slow (a restarted one importing torch) while its stream
// is up, nor one whose stream blips and comes back within a heartbeat, nor on an old word.
TEST(JobControl, ARankNotAtTheStoreAloneOrWithABlipOrOnAnOldWordLosesNoPod) {
  struct Case {
    std::string what;
    bool breaks, resumes;
    int64_t word_age_ms;  // how long before the break the last word came
  };
  for (const Case& c : {Case{"slow, its stream up", false, false, 0},
                        Case{"a blip", true, true, 0},
                        Case{"a word older than its window", true, false, 1500}}) {
    SCOPED_TRACE(c.what);
    ScriptedAgents sim(4, 2, kForce, kElastic);
    sim.RegisterAll();
    sim.Run(20, 0);
    ASSERT_TRUE(sim.Send(0, NotArrived(sim.rt->generation(), {7})).ok());
    sim.Run(c.word_age_ms, 0);
    if (c.breaks) {
      sim.Gone(3);
      sim.rt->Disconnected(sim.streams_[3], sim.now);
    }
    if (c.resumes) {
      sim.Run(sim.rt->heartbeat_interval_ms(), 0);
      ASSERT_TRUE(sim.Register(3, "", {}, 0, 99).ok());
      sim.gone_.erase(3);
    }
    sim.Run(3 * sim.rt->heartbeat_interval_ms(), 0);  // within the liveness timeout (5 beats)
    EXPECT_FALSE(sim.rt->IsFenced("pod-3"));
    EXPECT_EQ(Logged(sim, "fault", "have not reached the store"), 0);
  }
}

// Only the store's host names missing ranks, and only ranks of the generation.
TEST(JobControl, AWordOfMissingRanksFromAnotherPodOrOutOfRangeIsRefused) {
  ScriptedAgents sim(4, 2, kForce, kElastic);
  sim.RegisterAll();
  sim.Run(20, 0);
  const Status other = sim.Send(1, NotArrived(sim.rt->generation(), {7}));
  EXPECT_FALSE(other.ok());
  EXPECT_TRUE(Contains(other.message(), "only the pod of rank 0")) << other.message();
  const Status range = sim.Send(0, NotArrived(sim.rt->generation(), {8}));
  EXPECT_FALSE(range.ok());
  EXPECT_TRUE(Contains(range.message(), "missing rank 8 is out of range")) << range.message();
  EXPECT_TRUE(sim.rt->training()) << "nothing accepted before is lost";
}

// A replica a rank: a pod's other ranks train on in the interim generation when one dies.
const Map kElasticTp1 = {{"recover-strategy", "recover-in-place,elastic-training"},
                         {"regroup.io/prefer-elastic", "true"}};

// A pod's container killed whole (a forced deletion, a preemption): its agent reported a trainer
// killed (SIGKILL), then its own stream broke. Issue 37: the stream got its grace (the liveness
// timeout), while the survivors waited in a generation that held the dead pod's other ranks, whose
// rendezvous nothing failed. A stream that breaks within a heartbeat of a SIGKILL of one of its
// pod's trainers is the pod dying around it: lost at once.
TEST(JobControl, AStreamThatBreaksJustAfterItsTrainerWasKilledIsAPodThatDied) {
  ScriptedAgents sim(4, 2, kForce, kElasticTp1);
  sim.RegisterAll();
  sim.Run(20, 0);
  ASSERT_TRUE(sim.Exit(3, 0, -1, SIGKILL).ok());
  sim.now += 5;
  sim.Gone(3);
  sim.rt->Disconnected(sim.streams_[3], sim.now);
  EXPECT_TRUE(sim.rt->IsFenced("pod-3")) << "lost at once, not after its grace";
  EXPECT_EQ(Logged(sim, "fault", "pod_lost: the stream of pod pod-3 broke 5 ms after its local "
                                 "rank 0 was killed (signal 9)"),
            1);
  sim.Run(400, 0);  // the decision maker's report window (no agent here answers the abort)
  for (int64_t n : {0, 1, 2}) EXPECT_FALSE(sim.rt->IsFenced("pod-" + std::to_string(n)));
  EXPECT_EQ(sim.rt->world_size(), 6u) << "the survivors go on without it";
}

// A rank whose training thread could not leave its step after an abort exits with
// EXIT_ABORT_STUCK (75; python/regroup/abort.py's watchdog: gloo left it in a collective). The
// abort made it fail, not its step: no poison step. CI's megatron_test had a survivor's watchdog
// exit read as the killed rank's step failing twice, and the job was dumped.
TEST(JobControl, ARankThatCouldNotLeaveItsStepAfterAnAbortMakesNoPoisonStep) {
  ScriptedAgents sim(2, 2, kForce, kElasticTp1);
  sim.RegisterAll();
  sim.Run(20, 0);
  ASSERT_TRUE(sim.Exit(1, 1, -1, SIGKILL).ok());  // at step 0
  sim.Run(300, 0);
  ASSERT_TRUE(sim.Exit(0, 0, 75).ok());  // at step 0 too
  sim.Run(300, 0);
  EXPECT_EQ(Logged(sim, "directive", "poison"), 0);
  EXPECT_GE(Logged(sim, "directive", "restart_in_place"), 2) << "each restarted in place";
}

// ...but a stream that breaks alone, or a heartbeat after the kill, or after an exit with a code
// (a trainer's own failure), keeps its grace: its session may resume.
TEST(JobControl, AStreamBreakingNotJustAfterAKillKeepsItsGrace) {
  struct Case {
    std::string what;
    int32_t code, signal;
    int64_t after_ms;  // from the exit to the break; -1: no exit
  };
  for (const Case& c : {Case{"a break alone", 0, 0, -1},
                        Case{"a break a heartbeat after the kill", -1, SIGKILL, 120},
                        Case{"a break after an exit with a code", 1, 0, 5},
                        Case{"a break after a SIGTERM", -1, SIGTERM, 5}}) {
    SCOPED_TRACE(c.what);
    ScriptedAgents sim(4, 2, kForce, kElasticTp1);
    sim.RegisterAll();
    sim.Run(20, 0);
    if (c.after_ms >= 0) {
      ASSERT_TRUE(sim.Exit(3, 0, c.code, c.signal).ok());
      sim.now += c.after_ms;
    }
    sim.rt->Disconnected(sim.streams_[3], sim.now);
    EXPECT_FALSE(sim.rt->IsFenced("pod-3"));
    EXPECT_EQ(Logged(sim, "fault", "after its local rank"), 0);
  }
}

// One survivor's word is not enough against a pod whose stream is up: it may be the survivor's
// own link that failed. The silent pod gets its liveness timeout.
TEST(JobControl, OneSurvivorsReportAloneDoesNotSettleANodeLoss) {
  ScriptedAgents sim(4, 2, kForce, kElastic);
  sim.RegisterAll();
  sim.Run(20, 0);
  const int64_t lost_at = sim.now;
  sim.Gone(3);
  ASSERT_TRUE(sim.Send(0, CollectiveFailedWith(sim.rt->generation(), "10.0.0.3")).ok());
  int64_t fenced_at = -1;
  for (int64_t t = 0; t < 1500 && fenced_at < 0; t += 20) {
    sim.Run(20, 0);
    if (sim.rt->IsFenced("pod-3")) fenced_at = sim.now;
  }
  ASSERT_GE(fenced_at, 0) << "its silence ends it";
  EXPECT_GE(fenced_at - lost_at, 5 * sim.rt->heartbeat_interval_ms());
  EXPECT_EQ(Logged(sim, "fault", "with pod pod-3 failed"), 0);
}

// Reports naming a pod that keeps beating (one of its trainers died: its agent reports the exit)
// declare nothing lost, and neither does a broken stream that a report did not name, nor a stream
// that resumes within its grace.
TEST(JobControl, PeerReportsNeverDeclareAPodThatIsStillHeardLost) {
  ScriptedAgents sim(4, 2, kForce, kElastic);
  sim.RegisterAll();
  sim.Run(20, 0);
  for (int64_t n : {0, 1, 2})
    ASSERT_TRUE(sim.Send(n, CollectiveFailedWith(sim.rt->generation(), "10.0.0.3")).ok());
  sim.Run(400, 0);  // pod 3 beats on
  EXPECT_FALSE(sim.rt->IsFenced("pod-3"));
  EXPECT_TRUE(sim.rt->training());
  // Pod 2's stream resets while pod 3 is the one named: pod 2 has its grace, and resumes.
  sim.rt->Disconnected(sim.streams_[2], sim.now);
  EXPECT_FALSE(sim.rt->IsFenced("pod-2"));
  std::vector<v1::LocalRank> ranks;
  for (uint32_t l = 0; l < 2; ++l)
    ranks.push_back(ScriptedAgents::Live(l, v1::PHASE_COMPUTING, 0, sim.rt->generation(), -1));
  ASSERT_TRUE(sim.Register(2, "", ranks).ok());
  sim.Run(100, 0);
  EXPECT_FALSE(sim.rt->IsFenced("pod-2"));
  EXPECT_TRUE(sim.rt->training());
}

// The demo's node loss: the node's processes are killed, its agent's stream breaks and its peers'
// collectives fail at once; one early report settles it (the stream and the connections dropped
// together), where the broken stream alone would wait out its grace.
TEST(JobControl, ABrokenStreamAndOneEarlyReportNamingItsPodSettleANodeLossAtOnce) {
  ScriptedAgents sim(4, 2, kForce, kElastic);
  sim.RegisterAll();
  sim.Run(20, 0);
  sim.rt->Disconnected(sim.streams_[3], sim.now);
  sim.Gone(3);
  EXPECT_FALSE(sim.rt->IsFenced("pod-3")) << "a lone broken stream gets its grace";
  ASSERT_TRUE(sim.Send(1, CollectiveFailedWith(sim.rt->generation(), "10.0.0.3")).ok());
  EXPECT_TRUE(sim.rt->IsFenced("pod-3"));
  EXPECT_EQ(Logged(sim, "fault", "the collectives of pod pod-1 with it failed"), 1);
  // The other order: the report first, then the stream breaks.
  ScriptedAgents other(4, 2, kForce, kElastic);
  other.RegisterAll();
  other.Run(20, 0);
  ASSERT_TRUE(other.Send(1, CollectiveFailedWith(other.rt->generation(), "10.0.0.3")).ok());
  EXPECT_FALSE(other.rt->IsFenced("pod-3"));
  other.rt->Disconnected(other.streams_[3], other.now);
  EXPECT_TRUE(other.rt->IsFenced("pod-3"));
  EXPECT_FALSE(other.rt->IsFenced("pod-1"));
}

// Issue 37: the report window gathers the other sides of a fault. Once every pod it does not
// name has answered the abort, nothing more is coming: the decision maker decides at once, not
// when its window (200 ms) runs out. A pod that has not answered keeps the window open.
TEST(JobControl, EveryOtherPodsAnswerToTheAbortSettlesANodeLossWithoutWaitingOutTheWindow) {
  for (const bool all_answer : {true, false}) {
    ScriptedAgents sim(4, 2, kForce, kElastic);
    sim.RegisterAll();
    sim.Run(20, 0);
    ASSERT_EQ(sim.rt->generation(), 1u);
    sim.rt->Disconnected(sim.streams_[3], sim.now);
    sim.Gone(3);
    ASSERT_TRUE(sim.Send(1, CollectiveFailedWith(sim.rt->generation(), "10.0.0.3")).ok());
    ASSERT_TRUE(sim.rt->IsFenced("pod-3"));
    sim.Collect();
    for (int64_t n : {0, 1, 2}) {
      ASSERT_EQ(sim.Count(n, v1::ManagerMessage::kAbort), 1) << n;
      if (n == 2 && !all_answer) continue;
      v1::AgentMessage ack;
      ack.mutable_ack()->set_directive_id(sim.inbox_[n].back().abort().directive_id());
      ASSERT_TRUE(sim.Send(n, ack).ok());
    }
    sim.Collect();
    if (all_answer) {
      EXPECT_EQ(sim.rt->generation(), 2u) << "decided as the last answer came, not at a tick";
      EXPECT_EQ(sim.starts_[0].plan().data_parallel(), 3u);
      continue;
    }
    sim.Run(160, 0);
    EXPECT_EQ(sim.rt->generation(), 1u) << "pod 2 has not answered: the window is still open";
    sim.Run(60, 0);
    EXPECT_EQ(sim.rt->generation(), 2u) << "the window ran out";
    EXPECT_EQ(sim.starts_[0].plan().data_parallel(), 3u);
  }
}

// What the decision maker hears: the aborted generation's faults settled, once, and only on
// answers to the abort that is current (a coordinator ignores a settle of an older generation).
TEST(JobControl, TheFaultsOfTheAbortedGenerationAreSettledOnceOnAnswersToItsAbort) {
  ScriptedAgents sim(4, 2, kForce, kElastic);
  Scripted* decisions = UseScripted(sim);
  sim.RegisterAll();
  sim.Run(20, 0);
  ASSERT_EQ(sim.rt->generation(), 1u);
  sim.rt->Disconnected(sim.streams_[3], sim.now);
  sim.Gone(3);
  ASSERT_TRUE(sim.Send(1, CollectiveFailedWith(1, "10.0.0.3")).ok());
  sim.Collect();
  ASSERT_EQ(decisions->faults.size(), 1u);
  const uint64_t abort_id = sim.inbox_[0].back().abort().directive_id();
  auto answer = [&](int64_t n, uint64_t id) {
    v1::AgentMessage ack;
    ack.mutable_ack()->set_directive_id(id);
    ASSERT_TRUE(sim.Send(n, ack).ok());
  };
  for (int64_t n : {0, 1, 2}) answer(n, abort_id - 1);  // another directive's acknowledgment
  EXPECT_TRUE(decisions->settled.empty());
  answer(0, abort_id);
  answer(1, abort_id);
  EXPECT_TRUE(decisions->settled.empty()) << "pod 2 has not answered";
  answer(2, abort_id);
  EXPECT_EQ(decisions->settled, (std::vector<uint64_t>{1}));
  answer(2, abort_id);  // again: settled already
  sim.Run(100);
  EXPECT_EQ(decisions->settled, (std::vector<uint64_t>{1}));
}

// Found by the integration scenario 6: a collective of generation 1 failed as it ended, its
// report arrived once generation 2 was running, and it aborted generation 2.
TEST(JobControl, ALateFaultOfAnEarlierGenerationDoesNotAbortTheRunningOne) {
  ScriptedAgents sim(4, 2, kForce, kElastic);
  sim.RegisterAll();
  sim.Run(20, 0);
  sim.rt->Disconnected(sim.streams_[3], sim.now);
  sim.Gone(3);
  sim.Run(900, 0);
  ASSERT_EQ(sim.rt->generation(), 2u);
  ASSERT_TRUE(sim.rt->training());
  ASSERT_TRUE(sim.Send(0, CollectiveError(1)).ok());
  EXPECT_TRUE(sim.rt->training());
  EXPECT_EQ(sim.rt->generation(), 2u);
}


// Suspected in the Kubernetes scenario 7 (a manager pod recreated elsewhere): a restarted
// manager's first generation was numbered 1 again, so a collective of the old epoch's generation
// 1 that failed as the agents moved over (a pod that re-registered first aborted it under its
// peers) was taken for a fault of the new generation 1, and ranks were restarted for it.
// Generation numbers now go on from the highest any agent reports: an old one is always older.
TEST(JobControl, ARestartedManagersGenerationsAreNumberedPastEveryOneTheAgentsReport) {
  JobControlOptions o;
  o.epoch = 2;
  ScriptedAgents sim(2, 2, kForce, kElastic, o);
  for (int64_t n = 0; n < 2; ++n) {
    std::vector<v1::LocalRank> ranks = Survivor(2, 40);
    for (auto& r : ranks) r.set_generation(1);  // generation 1 of epoch 1
    ASSERT_TRUE(sim.Register(n, "", ranks, 2).ok());
  }
  sim.Run(20);  // forms it (the sim's beats would claim the new manager's generation 0)
  ASSERT_TRUE(sim.rt->training());
  EXPECT_EQ(sim.rt->generation(), 2u) << "past generation 1, the agents' last";
  EXPECT_EQ(sim.starts_[0].plan().generation(), sim.rt->generation());
  const uint64_t generation = sim.rt->generation();
  ASSERT_TRUE(sim.Send(1, CollectiveError(1)).ok());  // the old epoch's generation 1
  sim.Run(400, 41);
  EXPECT_TRUE(sim.rt->training()) << "the old generation's fault aborts nothing";
  EXPECT_EQ(sim.rt->generation(), generation);
  EXPECT_EQ(sim.Count(1, v1::ManagerMessage::kRestart), 0);
  bool stale = false;
  for (const auto& e : Events(sim)) stale |= e.kind() == "stale_fault";
  EXPECT_TRUE(stale);
}
// Found by the simulation once it ran the agent's own code (seeds 872 and 10434): pod 1's
// stream broke, its agent paused its trainers after its liveness timeout (the manager saw the
// break later, over a slow link), and its session then resumed within the manager's grace. Its
// trainers had left the generation at their next step boundary, which then waited for them for
// good (or, with all its ranks paused, for ever: a paused rank is blamed for no hang). A session
// whose agent paused its trainers resumes nothing: the pod is lost to the generation, and comes
// back as its own replacement.
TEST(JobControl, ASessionWhoseAgentPausedItsTrainersDoesNotResumeTheGeneration) {
  ScriptedAgents sim(2, 2, kForce, kElastic);
  sim.RegisterAll();
  sim.Run(20, 0);
  ASSERT_EQ(sim.rt->generation(), 1u);
  sim.rt->Disconnected(sim.streams_[1], sim.now);
  sim.Run(40, 0);
  ASSERT_TRUE(sim.rt->training()) << "within its grace to resume";
  v1::Register reg;
  reg.set_pod_uid("pod-1");
  reg.set_node_rank(1);
  reg.set_nproc(2);
  for (uint32_t l = 0; l < 2; ++l)
    *reg.add_ranks() = ScriptedAgents::Live(l, v1::PHASE_PAUSED, 0, 1, -1);
  reg.set_left_generation(true);
  sim.streams_[1] = sim.next_stream_++;
  const auto registered = sim.rt->Register(sim.streams_[1], sim.Header(1), reg, sim.now);
  ASSERT_FALSE(registered.ok()) << "resumed a generation its trainers left";
  EXPECT_NE(registered.status().message().find("left generation 1"), std::string::npos)
      << registered.status().message();
  EXPECT_TRUE(sim.rt->IsFenced("pod-1"));
  EXPECT_TRUE(sim.rt->MayReadmit("pod-1")) << "it comes back as its own replacement";
  EXPECT_FALSE(sim.rt->training()) << "the generation lost pod 1's ranks";
  // The same registration without the flag resumes (the rule above is the flag's alone).
  ScriptedAgents other(2, 2, kForce, kElastic);
  other.RegisterAll();
  other.Run(20, 0);
  other.rt->Disconnected(other.streams_[1], other.now);
  other.Run(40, 0);
  reg.set_left_generation(false);
  other.streams_[1] = other.next_stream_++;
  ASSERT_TRUE(other.rt->Register(other.streams_[1], other.Header(1), reg, other.now).ok());
  EXPECT_TRUE(other.rt->training());
}

// Found by the integration scenario 2 under load: the node of pod 1 died, and its replacement
// registered before anything declared pod 1 lost (its broken stream was within its grace to
// resume). The replacement taking a slot of the running generation is that pod's loss: the
// generation is aborted for it, so its peers' failed collectives that follow are its echo, not a
// second fault that "recover" alone cannot answer.
TEST(JobControl, AReplacementTakingASlotOfTheRunningGenerationIsItsPredecessorsLoss) {
  ScriptedAgents sim(2, 2, kForce, {{"recover-strategy", "recover,exit"}});
  sim.RegisterAll();
  sim.Run(20, 0);
  ASSERT_EQ(sim.rt->generation(), 1u);
  sim.rt->Disconnected(sim.streams_[1], sim.now);
  sim.Gone(1);
  sim.Run(40, 0);
  ASSERT_TRUE(sim.rt->training()) << "within its grace to resume";
  ASSERT_TRUE(sim.Register(1, "pod-1-b").ok());
  EXPECT_FALSE(sim.rt->training()) << "the generation lost pod 1's ranks";
  EXPECT_TRUE(sim.rt->IsFenced("pod-1"));
  ASSERT_TRUE(sim.Send(0, CollectiveError(1)).ok());
  sim.Run(200);
  bool stopped = false;
  for (const auto& e : Events(sim)) stopped |= e.kind() == "stop";
  EXPECT_FALSE(stopped) << "the collective error was the lost pod's echo";
  EXPECT_EQ(sim.rt->generation(), 2u);
  EXPECT_EQ(sim.rt->world_size(), 4u);
}

// Found by the chaos soak (seed 1, under load): a generation whose rendezvous never completed
// was blamed on rank 0, the first rank over the hang timeout, four generations in a row. The
// rank that holds a generation up is the one that never entered it (still in an older one);
// the ranks waiting for it in the rendezvous are its victims.
TEST(JobControl, AStalledGenerationIsBlamedOnTheRankThatNeverEnteredIt) {
  ScriptedAgents sim(2, 2, kForce, kQuickHang);
  sim.RegisterAll();
  sim.Run(20);
  ASSERT_EQ(sim.rt->generation(), 1u);
  // Ranks 0, 1 and 3 wait in generation 1's rendezvous; rank 2 (pod 1, local 0) is still in a
  // collective of generation 0 and never took the start.
  auto beat = [&](int64_t node) {
    v1::AgentMessage m;
    for (uint32_t l = 0; l < 2; ++l) {
      const bool stuck = node == 1 && l == 0;
      auto* r = m.mutable_heartbeat()->add_ranks();
      r->set_local_rank(l);
      r->set_pid(1000 + static_cast<int32_t>(l));
      r->set_alive(true);
      r->set_step(stuck ? 7 : -1);
      r->set_phase(stuck ? v1::PHASE_REDUCING : v1::PHASE_SYNCING);
      r->set_generation(stuck ? 0 : 1);
    }
    return sim.Send(node, m);
  };
  ASSERT_TRUE(sim.TickWith(120, beat).ok());
  const std::string fault = FirstFault(sim);
  EXPECT_NE(fault.find("rank 2 "), std::string::npos) << fault;
  ASSERT_GE(sim.Count(1, v1::ManagerMessage::kRestart), 1) << "the stuck rank is restarted";
  EXPECT_EQ(sim.Count(0, v1::ManagerMessage::kRestart), 0) << "not rank 0, which waited for it";
}

// Found by the simulation once it ran the agent's own code (seeds 872 and 10434): a rank of
// the running generation that reports PAUSED has left it (its agent paused it), and was never
// blamed for a hang: the rank waiting for it was restarted instead, or, with every rank
// paused, the generation waited for good. Past the hang timeout the paused rank is the one.
TEST(JobControl, ARankThatLeftTheRunningGenerationIsBlamedForItsHangNotTheOneWaitingForIt) {
  ScriptedAgents sim(2, 1, kForce, kQuickHang);
  sim.RegisterAll();
  sim.Run(20);
  ASSERT_EQ(sim.rt->generation(), 1u);
  // Rank 0 (pod 0) voted for step 5 and waits for its outcome; rank 1 (pod 1) was paused.
  auto beat = [&](int64_t node) {
    v1::AgentMessage m;
    *m.mutable_heartbeat()->add_ranks() =
        ScriptedAgents::Live(0, node == 0 ? v1::PHASE_VOTED : v1::PHASE_PAUSED, 5, 1, 4);
    return sim.Send(node, m);
  };
  ASSERT_TRUE(sim.TickWith(120, beat).ok());
  const std::string fault = FirstFault(sim);
  EXPECT_NE(fault.find("rank 1 "), std::string::npos) << fault;
  EXPECT_NE(fault.find("paused"), std::string::npos) << fault;
  ASSERT_GE(sim.Count(1, v1::ManagerMessage::kRestart), 1) << "the paused rank is restarted";
  EXPECT_EQ(sim.Count(0, v1::ManagerMessage::kRestart), 0) << "not rank 0, which waited for it";
}

// Issue 11, finding 6: a restarted manager took the highest commit heard over the replicas it
// kept only, so a standby that heard the commit of step 41 got step 41 redone (its samples
// twice). Any survivor's word counts.
TEST(JobControl, ARestartedManagerResumesAtACommitOnlyAStandbyHeard) {
  JobControlOptions o;
  o.epoch = 2;
  ScriptedAgents sim(4, 2, kForce, kElastic, o);
  for (int64_t n = 0; n < 4; ++n) {
    std::vector<v1::LocalRank> ranks = Voted(Survivor(2, 40), 41);  // the kept ranks voted
    if (n == 3) {
      ranks = Survivor(2, 40);  // a standby
      for (auto& r : ranks) r.set_heard_commit_step(41);
      ranks[1].set_phase(v1::PHASE_STARTING);  // not back yet: not kept
    }
    ASSERT_TRUE(sim.Register(n, "", ranks, 4).ok());
  }
  sim.Run(6000, -1);  // the join window closes without pod 3; prefer-elastic starts without it
  ASSERT_GE(sim.rt->generation(), 1u);
  ASSERT_EQ(sim.starts_[0].plan().data_parallel(), 3u) << "pod 3 is not in the generation";
  EXPECT_EQ(sim.starts_[0].plan().committed_step(), 41);
}

// Issue 11 ("whose commit, after a manager restart"): a restarted manager learns the last
// committed step from the agents; the ranks that heard its commit also say which generation
// committed it, and its first plan names that generation, so a rank whose pending vote for the
// step is from another (aborted) generation drops it instead of applying it.
TEST(JobControl, ARestartedManagersFirstPlanNamesTheGenerationThatCommittedTheStep) {
  JobControlOptions o;
  o.epoch = 9;
  ScriptedAgents sim(2, 2, kForce, kElastic, o);
  for (int64_t n = 0; n < 2; ++n) {
    std::vector<v1::LocalRank> ranks = Survivor(2, 40);
    for (auto& r : ranks) {
      r.set_heard_commit_step(41);
      r.set_heard_commit_epoch(7);
      r.set_heard_commit_generation(5);
      if (n == 1) r.set_committed_step(40);  // pod 1's ranks heard it, but have not applied it
    }
    ASSERT_TRUE(sim.Register(n, "", ranks, 2).ok());
  }
  sim.Run(1000, -1);
  ASSERT_GE(sim.rt->generation(), 1u);
  const v1::GenerationPlan& plan = sim.starts_[0].plan();
  EXPECT_EQ(plan.committed_step(), 41);
  EXPECT_EQ(plan.committed_epoch(), 7u);
  EXPECT_EQ(plan.committed_generation(), 5u);
}

// At some position of a replica no rank of the generation to form holds the state it would
// resume from (sim seeds 5519, 8780, 29712: the decision maker took a standby, or a replica that
// had stopped while the survivors trained on, for a holder): nothing is formed, the decision
// maker hears a state_lost fault once, and the job goes to the checkpoint.
TEST(JobControl, AGenerationNoRankOfWhichHoldsAShardIsNotFormedAndTheJobGoesToTheCheckpoint) {
  JobControlOptions o;
  o.epoch = 2;
  ScriptedAgents sim(2, 2, {{"fault-scheduling", "force"}, {"fault-retry-times", "1"}}, kElastic,
                     o);
  for (int64_t n = 0; n < 2; ++n) {
    std::vector<v1::LocalRank> ranks = Survivor(2, 40);  // a tp-2 replica a pod
    if (n == 0) ranks[0].set_committed_step(41);  // only position 0 of replica 0 holds step 41
    ranks[0].set_heard_commit_step(41);
    ASSERT_TRUE(sim.Register(n, "", ranks, 2).ok());
  }
  sim.Run(1000, -1);
  EXPECT_EQ(Logged(sim, "fault", "state_lost"), 1) << "told once";
  EXPECT_EQ(Logged(sim, "fault",
                   "state_lost: no rank of the next generation holds the state of step 41 at "
                   "replica position 1"),
            1);
  EXPECT_EQ(Logged(sim, "directive", "restart_job [job-rescheduling]: state_lost"), 1);
  for (const auto& [node, start] : sim.starts_)
    EXPECT_NE(start.plan().committed_step(), 41)
        << "pod " << node << " resumes from state nobody holds";
}

// Ranks that disagree about which generation committed the step they heard (one of them is
// stale) name none: (0, 0), as before.
TEST(JobControl, RanksThatDisagreeAboutWhoCommittedTheStepNameNoGeneration) {
  JobControlOptions o;
  o.epoch = 9;
  ScriptedAgents sim(2, 1, kForce, kElastic, o);
  for (int64_t n = 0; n < 2; ++n) {
    std::vector<v1::LocalRank> ranks = Survivor(1, 40);
    ranks[0].set_heard_commit_step(41);
    ranks[0].set_heard_commit_epoch(7);
    ranks[0].set_heard_commit_generation(n == 0 ? 5 : 6);
    ASSERT_TRUE(sim.Register(n, "", ranks, 2).ok());
  }
  sim.Run(1000, -1);
  ASSERT_GE(sim.rt->generation(), 1u);
  EXPECT_EQ(sim.starts_[0].plan().committed_step(), 41);
  EXPECT_EQ(sim.starts_[0].plan().committed_epoch(), 0u);
  EXPECT_EQ(sim.starts_[0].plan().committed_generation(), 0u);
}

// A commit sent again by an incarnation that did not make it names generation 0 (JobControl's
// catch-up of a resumed session), and an agent notes it under that incarnation's epoch: (6293,
// 0). That names no committer (simulation seed 300204, coordinator, 12 faults: the next
// incarnation's plan said step 0 was committed by (6293, 0), where (33, 1) did). A rank that
// heard it so and one that heard who did agree: the plan names the one that did.
TEST(JobControl, ACommitHeardWithNoGenerationNamesNoCommitter) {
  JobControlOptions o;
  o.epoch = 9;
  for (const bool one_knows : {false, true}) {
    ScriptedAgents sim(2, 1, kForce, kElastic, o);
    for (int64_t n = 0; n < 2; ++n) {
      std::vector<v1::LocalRank> ranks = Survivor(1, 40);
      ranks[0].set_heard_commit_step(41);
      ranks[0].set_heard_commit_epoch(n == 0 && one_knows ? 5 : 7);
      ranks[0].set_heard_commit_generation(n == 0 && one_knows ? 3 : 0);
      ASSERT_TRUE(sim.Register(n, "", ranks, 2).ok());
    }
    sim.Run(1000, -1);
    ASSERT_GE(sim.rt->generation(), 1u);
    const v1::GenerationPlan& plan = sim.starts_[0].plan();
    EXPECT_EQ(plan.committed_step(), 41);
    EXPECT_EQ(plan.committed_epoch(), one_knows ? 5u : 0u);
    EXPECT_EQ(plan.committed_generation(), one_knows ? 3u : 0u);
  }
}

// Issue 11, finding 7: under CPU overload a manager that was not scheduled for a while found
// every pod silent when it ran again (their heartbeats waited in its sockets) and declared them
// lost. Its own stall is not counted against the pods.
TEST(JobControl, AManagerThatWasNotScheduledDoesNotBlameThePods) {
  ScriptedAgents sim(2, 2, kForce, kElastic);
  sim.RegisterAll();
  sim.Run(100, 0);
  ASSERT_TRUE(sim.rt->training());
  sim.now += 3000;  // the manager ran nothing for 3 s; the pods' beats wait in its sockets
  sim.rt->Tick(sim.now);
  sim.Collect();
  EXPECT_TRUE(sim.rt->training()) << "no pod was blamed for the manager's stall";
  EXPECT_FALSE(sim.rt->IsFenced("pod-0"));
  EXPECT_FALSE(sim.rt->IsFenced("pod-1"));
  sim.Run(100, 0);  // the waiting beats arrive
  EXPECT_TRUE(sim.rt->training());
  EXPECT_EQ(sim.rt->generation(), 1u);
  // A pod that really is silent is still found, a liveness timeout after the stall.
  sim.Gone(1);
  sim.Run(1500, 0);
  EXPECT_TRUE(sim.rt->IsFenced("pod-1"));
}

// Issue 11, an overloaded agent: its silence may last 3 times the longest one it ended lately,
// within 1 to 4 times the liveness timeout, halved every 30 s.
TEST(SilenceBound, StretchesTheTimeoutForAPeerWhoseBeatsLatelyCameLateWithinABound) {
  SilenceBound b;
  EXPECT_EQ(b.TimeoutMs(500, 0), 500) << "a peer never heard late keeps the liveness timeout";
  b.Ended(120, 1000);
  EXPECT_EQ(b.TimeoutMs(500, 1000), 500) << "beats on time stretch nothing";
  b.Ended(300, 2000);
  EXPECT_EQ(b.TimeoutMs(500, 2000), 900);
  b.Ended(200, 2100);
  EXPECT_EQ(b.PeakMs(2100), 300) << "the longest silence lately, not the last one";
  b.Ended(1300, 3000);
  EXPECT_EQ(b.TimeoutMs(500, 3000), 2000) << "never more than 4 times the liveness timeout";
  EXPECT_EQ(b.PeakMs(3000 + SilenceBound::kHalfLifeMs), 650);
  EXPECT_EQ(b.TimeoutMs(500, 3000 + SilenceBound::kHalfLifeMs), 1950);
  EXPECT_EQ(b.TimeoutMs(500, 3000 + 3 * SilenceBound::kHalfLifeMs), 500) << "a spike long past";
  EXPECT_EQ(b.TimeoutMs(500, 3000 + 100 * SilenceBound::kHalfLifeMs), 500);
  b.Reset();
  EXPECT_EQ(b.PeakMs(3000), 0);
}

// Issue 11, finding 7: on an overloaded machine a live agent's beats come late. One whose beats
// lately came 300 ms apart is not lost for a silence of 800 ms (the liveness timeout is 500 ms),
// but is for one past 3 times its longest; a pod beating on time is lost after 500 ms as before.
TEST(JobControl, APodWhoseBeatsLatelyCameLateHasLongerButBoundedBeforeItIsLost) {
  ScriptedAgents sim(2, 2, kForce, kElastic);
  sim.RegisterAll();
  sim.Run(100, 0);
  ASSERT_TRUE(sim.rt->training());
  auto run = [&sim](int64_t ms, int64_t late_every_ms) {  // pod 0 beats every 20 ms, pod 1 late
    for (int64_t t = 0; t < ms; t += 20) {
      sim.now += 20;
      if (!sim.gone_.count(0)) (void)sim.Beat(0, 0, sim.rt->generation());
      if (late_every_ms && t % late_every_ms == late_every_ms - 20)
        (void)sim.Beat(1, 0, sim.rt->generation());
      sim.rt->Tick(sim.now);
      sim.Collect();
    }
  };
  run(3000, 300);
  ASSERT_TRUE(sim.rt->training());
  auto status = sim.rt->StatusReport();
  EXPECT_EQ(status.nodes(0).liveness_timeout_ms(), 500u);
  EXPECT_EQ(status.nodes(1).silence_peak_ms(), 300u);
  EXPECT_EQ(status.nodes(1).liveness_timeout_ms(), 900u);
  run(800, 0);  // pod 1 silent for 800 ms
  EXPECT_FALSE(sim.rt->IsFenced("pod-1")) << "within 3 times its longest silence lately";
  run(200, 0);
  ASSERT_TRUE(sim.rt->IsFenced("pod-1"));
  bool said = false;
  for (const auto& e : Events(sim))
    said = said || e.message().find("no heartbeat from pod pod-1 for 920 ms; its timeout was 900 "
                                    "ms, stretched") != std::string::npos;
  EXPECT_TRUE(said);
  // Pod 0, on time all along, is lost 500 ms into its silence.
  sim.Gone(0);
  run(480, 0);
  EXPECT_FALSE(sim.rt->IsFenced("pod-0"));
  run(60, 0);
  EXPECT_TRUE(sim.rt->IsFenced("pod-0"));
}

// The same for a trainer's beats to its agent (the beat ages the agent reports): a rank whose
// beats lately came 240 ms apart is frozen only past 720 ms; its start stretches nothing.
TEST(JobControl, ARankWhoseBeatsLatelyCameLateHasLongerButBoundedBeforeItIsFrozen) {
  ScriptedAgents sim(2, 1, kForce, {{"recover-strategy", "recover-in-place,elastic-training"}});
  sim.RegisterAll();
  sim.Run(100, 0);
  ASSERT_TRUE(sim.rt->training());
  auto beat = [&sim](int64_t node, uint32_t age, v1::Phase phase = v1::PHASE_COMPUTING) {
    v1::AgentMessage m;
    auto* r = m.mutable_heartbeat()->add_ranks();
    *r = ScriptedAgents::Live(0, phase, 0, sim.rt->generation(), -1);
    r->set_beat_age_ms(age);
    return sim.Send(node, m);
  };
  auto run = [&](int64_t ms, uint32_t age_from, uint32_t age_period) {
    for (int64_t t = 0; t < ms; t += 20) {
      sim.now += 20;
      (void)beat(0, 10);
      const uint32_t age = age_from + static_cast<uint32_t>(t);
      (void)beat(1, age_period ? age % age_period : age);
      sim.rt->Tick(sim.now);
      sim.Collect();
    }
  };
  // Its start (seconds importing torch: the age grows from the process's start) stretches nothing.
  ASSERT_TRUE(beat(1, 9000, v1::PHASE_STARTING).ok());
  ASSERT_TRUE(beat(1, 0).ok());
  EXPECT_EQ(sim.rt->StatusReport().nodes(1).rank_liveness_timeout_ms(), 500u);
  run(3000, 0, 260);  // rank 1's trainer beats every 260 ms: ages 0 to 240 reported
  ASSERT_TRUE(sim.rt->training());
  EXPECT_EQ(sim.rt->StatusReport().nodes(1).rank_liveness_timeout_ms(), 720u);
  run(700, 0, 0);  // then it is silent for 700 ms
  EXPECT_TRUE(sim.rt->training()) << "within 3 times its longest silence lately";
  run(200, 700, 0);
  EXPECT_FALSE(sim.rt->training());
  bool said = false;
  for (const auto& e : Events(sim))
    said = said || e.message().find("rank 1 sent no heartbeat for 740 ms (frozen process; its "
                                    "timeout was 720 ms, stretched") != std::string::npos;
  EXPECT_TRUE(said);
}

// A trainer whose heartbeats are late but whose process runs (its CPU time grows: starved on an
// overloaded machine, its heartbeat thread waiting for the interpreter's lock) is not frozen: its
// bound is the hang timeout. One that stopped running is frozen at the liveness bound, as before
// (integration/overload.py: at 4 busy loops a healthy trainer went 558 ms without a beat, its
// first long silence, and was restarted).
TEST(JobControl, ARankWhoseBeatsAreLateButWhoseProcessRunsIsNotFrozen) {
  const Map config = {{"recover-strategy", "recover-in-place,elastic-training"},
                      {"regroup.io/hang-timeout-min-s", "3"}};
  // `ms` of ticks: pod 0 beats on time; pod 1's rank has been silent since `age_from` ms before,
  // and its process last ran `idle(t)` ms before.
  auto run = [](ScriptedAgents& sim, int64_t ms, uint32_t age_from,
                const std::function<uint32_t(int64_t t)>& idle) {
    for (int64_t t = 0; t < ms; t += 20) {
      sim.now += 20;
      for (int64_t n = 0; n < 2; ++n) {
        v1::AgentMessage m;
        auto* r = m.mutable_heartbeat()->add_ranks();
        *r = ScriptedAgents::Live(0, v1::PHASE_COMPUTING, 0, sim.rt->generation(), -1);
        r->set_beat_age_ms(n == 0 ? 10 : age_from + static_cast<uint32_t>(t));
        if (n == 1) r->set_cpu_idle_ms(idle(t));
        (void)sim.Send(n, m);
      }
      sim.rt->Tick(sim.now);
      sim.Collect();
    }
  };
  auto running = [](int64_t t) { return static_cast<uint32_t>(t % 100); };
  ScriptedAgents sim(2, 1, kForce, config);
  sim.RegisterAll();
  sim.Run(100, 0);
  ASSERT_TRUE(sim.rt->training());
  run(sim, 2000, 0, running);  // 2 s without a beat, running all along
  EXPECT_TRUE(sim.rt->training()) << "a running process is late, not frozen";
  EXPECT_EQ(Logged(sim, "fault", ""), 0);
  run(sim, 1200, 2000, running);  // past the hang timeout (no step either): a fault all the same
  EXPECT_FALSE(sim.rt->training());
  EXPECT_EQ(Logged(sim, "fault", ""), 1) << FirstFault(sim);

  // Stopped 100 ms after its last beat: frozen at the liveness bound, as before.
  ScriptedAgents stopped(2, 1, kForce, config);
  stopped.RegisterAll();
  stopped.Run(100, 0);
  run(stopped, 800, 0, [](int64_t t) { return static_cast<uint32_t>(std::max<int64_t>(t - 100, 0)); });
  EXPECT_FALSE(stopped.rt->training());
  EXPECT_EQ(Logged(stopped, "fault", "(frozen process)"), 1);
}

// Found by the simulation (seed 283, once the liveness timeouts stretched): a pod cut off during
// the last step, after its peers finished training, was taken for a loss to recover from: the
// job scaled in, waited for replicas that had finished, and never ended. Training is over.
TEST(JobControl, APodLostAfterEveryOtherHolderOfTheStateFinishedEndsTheTraining) {
  ScriptedAgents sim(3, 1, kForce, {{"recover-strategy", "recover-in-place,elastic-training,dump"},
                         {"regroup.io/prefer-elastic", "true"}});
  sim.RegisterAll();
  sim.Run(100, 0);
  ASSERT_TRUE(sim.rt->training());
  for (int64_t n = 0; n < 3; ++n) ASSERT_TRUE(sim.Vote(n, 0).ok());
  ASSERT_EQ(sim.rt->committed_step(), 0);
  ASSERT_TRUE(sim.Exit(0, 0, 0).ok());
  ASSERT_TRUE(sim.Exit(1, 0, 0).ok());
  ASSERT_TRUE(sim.rt->training()) << "pod 2 has not finished yet";
  sim.Gone(0);  // their agents exit once their trainers finished
  sim.Gone(1);
  sim.Run(1000, 0);
  EXPECT_TRUE(sim.rt->IsFenced("pod-0"));
  EXPECT_TRUE(sim.rt->IsFenced("pod-1"));
  EXPECT_TRUE(sim.rt->training()) << "a pod whose ranks finished is no fault: pod 2 finishes";
  sim.Gone(2);  // cut off
  sim.Run(1000, 0);
  EXPECT_TRUE(sim.rt->IsFenced("pod-2"));
  EXPECT_EQ(sim.rt->StatusReport().phase(), "stopped");
  std::string story;
  for (const auto& e : Events(sim)) story += e.kind() + ": " + e.message() + "\n";
  EXPECT_NE(story.find("done: training finished at step 0"), std::string::npos) << story;
  EXPECT_EQ(story.find("directive"), std::string::npos) << story;
  EXPECT_EQ(sim.inbox_[2].back().stop().mode(), v1::StopTraining::MODE_LEAVE);
}

// Found by the simulation (seed 1412, once reconnects were faster): after a manager restart the
// join window closed without one pod, and while the job waited for it another pod went silent
// (its link cut, its agent then killed). Registered pods were not watched for silence, so the
// dead one held its node rank against its replacement for good.
TEST(JobControl, APodThatGoesSilentWhileTheJobWaitsForItsFirstGenerationIsLost) {
  ScriptedAgents sim(3, 1, kForce, {{"recover-strategy", "recover,elastic-training"}});
  ASSERT_TRUE(sim.Register(0).ok());
  ASSERT_TRUE(sim.Register(1).ok());
  sim.Run(5200, -1);  // the window closes without pod 2: the engine waits for it
  ASSERT_EQ(sim.rt->generation(), 0u);
  sim.Gone(1);        // then pod 1 goes silent
  sim.Run(1500, -1);
  EXPECT_TRUE(sim.rt->IsFenced("pod-1"));
  EXPECT_TRUE(sim.Register(1, "pod-1-b").ok()) << "its replacement takes node rank 1";
}

// The same while a restarted manager gathers its first generation (seed 6941): it waited for a
// majority, a registered pod died, and its replacement was refused for good.
TEST(JobControl, APodThatGoesSilentWhileARestartedManagerGathersIsLost) {
  JobControlOptions o;
  o.epoch = 3;
  ScriptedAgents sim(4, 1, kForce, {{"recover-strategy", "recover,elastic-training"}}, o);
  ASSERT_TRUE(sim.Register(0, "", {}, 4).ok());
  ASSERT_TRUE(sim.Register(1, "", {}, 4).ok());
  sim.Run(400, -1);
  sim.Gone(1);
  sim.Run(1500, -1);
  EXPECT_EQ(sim.rt->generation(), 0u);
  EXPECT_TRUE(sim.rt->IsFenced("pod-1"));
  EXPECT_TRUE(sim.Register(1, "pod-1-b").ok()) << "its replacement takes node rank 1";
}

// Found by the chaos soak (seed 1): a pod readmitted after its loss had voted for step 88 in the
// generation that was aborted for it; the next generation, without it, committed its own step
// 88; rejoining, the pod applied its own vote of 88 (reduced in another order) and the replicas
// disagreed at the next checksum. The plan names the generation that committed the step.
TEST(JobControl, ThePlanNamesTheGenerationThatCommittedItsStep) {
  ScriptedAgents sim(4, 2, kForce, kElastic);
  sim.RegisterAll();
  sim.Run(20, 0);
  EXPECT_EQ(sim.starts_[0].plan().committed_generation(), 0u) << "nothing committed yet";
  for (int64_t n = 0; n < 4; ++n) ASSERT_TRUE(sim.Vote(n, 0).ok());
  sim.Run(20, 1);
  sim.rt->Disconnected(sim.streams_[3], sim.now);
  sim.Gone(3);
  sim.Run(900, 1);
  ASSERT_EQ(sim.rt->generation(), 2u);
  EXPECT_EQ(sim.starts_[0].plan().committed_step(), 0);
  EXPECT_EQ(sim.starts_[0].plan().committed_epoch(), sim.rt->epoch());
  EXPECT_EQ(sim.starts_[0].plan().committed_generation(), 1u) << "step 0 was generation 1's";
}

// The ranks of a pod whose processes all just restarted: each said hello, holding the step of
// the newest checkpoint (`committed`; -1 with none).
std::vector<v1::LocalRank> FreshRanks(uint32_t nproc, int64_t committed) {
  std::vector<v1::LocalRank> ranks(nproc);
  for (uint32_t l = 0; l < nproc; ++l) {
    ranks[l].set_local_rank(l);
    ranks[l].set_pid(3000 + static_cast<int32_t>(l));
    ranks[l].set_alive(true);
    ranks[l].set_phase(v1::PHASE_PAUSED);
    ranks[l].set_committed_step(committed);
    ranks[l].set_heard_commit_step(committed);
  }
  return ranks;
}

// A restarted pod beats with its fresh ranks.
v1::AgentMessage FreshBeat(uint32_t nproc, int64_t committed) {
  v1::AgentMessage m;
  for (const auto& r : FreshRanks(nproc, committed)) *m.mutable_heartbeat()->add_ranks() = r;
  return m;
}

// Standalone nobody recreates pods: each healthy pod of a restarted job restarts every process
// and is told to come back as its own replacement (a new incarnation).
void ExpectRestartedAndReadmitted(ScriptedAgents& sim, int64_t node) {
  ASSERT_EQ(sim.Count(node, v1::ManagerMessage::kRestart), 1) << "pod " << node;
  bool readmitted = false;
  for (const auto& m : sim.inbox_[node]) {
    if (m.has_restart()) {
      EXPECT_EQ(m.restart().local_ranks_size(), 2) << "every process";
    }
    if (m.has_refusal())
      readmitted = m.refusal().fenced() && m.refusal().readmit() &&
                   Contains(m.refusal().reason(), "the job restarts");
  }
  EXPECT_TRUE(readmitted) << "pod " << node;
}

// MindCluster's job-level rescheduling, standalone: process-level recovery is off, a node is
// lost. Every process restarts, every pod comes back as a new incarnation (the lost one's
// replacement too), and the next generation resumes after the step of the newest checkpoint the
// restarted processes hold, not after the last commit.
TEST(JobControl, AJobRestartRestartsEveryProcessAndResumesFromTheirCheckpoint) {
  ScriptedAgents sim(3, 2, kForce, {{"regroup.io/tensor-parallel", "2"}});
  sim.RegisterAll();
  sim.Run(20);
  ASSERT_EQ(sim.rt->generation(), 1u);
  for (int64_t step = 0; step <= 5; ++step)
    for (int64_t n = 0; n < 3; ++n) ASSERT_TRUE(sim.Vote(n, step).ok());
  ASSERT_EQ(sim.rt->committed_step(), 5);
  sim.Clear();
  sim.rt->Disconnected(sim.streams_[1], sim.now);  // pod 1's node dies
  sim.Gone(1);
  sim.Run(800, 5);
  EXPECT_FALSE(sim.rt->training());
  for (int64_t n : {0, 2}) ExpectRestartedAndReadmitted(sim, n);
  bool said = false;
  for (const auto& e : Events(sim))
    said |= e.kind() == "job_rescheduling" &&
            Contains(e.message(), "every process restarts from the newest checkpoint");
  EXPECT_TRUE(said);
  // The pods come back with processes that hold the checkpoint of step 3, pod 1's replacement
  // last; they wait, beating.
  auto wait = [&](int64_t ms) {
    for (int64_t t = 0; t < ms; t += 100) {
      for (int64_t n = 0; n < 3; ++n)
        if (!sim.gone_.count(n)) {
          ASSERT_TRUE(sim.Send(n, FreshBeat(2, 3)).ok());
        }
      sim.Run(100);
    }
  };
  for (int64_t n : {0, 2})
    ASSERT_TRUE(sim.Register(n, "pod-" + std::to_string(n) + "/2", FreshRanks(2, 3)).ok());
  wait(1000);
  EXPECT_EQ(sim.rt->generation(), 1u) << "pod 1 is not back yet";
  ASSERT_TRUE(sim.Register(1, "pod-1-b", FreshRanks(2, 3)).ok());
  sim.gone_.clear();
  wait(400);
  ASSERT_EQ(sim.rt->generation(), 2u);
  EXPECT_TRUE(sim.rt->training());
  const auto& plan = sim.starts_[0].plan();
  EXPECT_EQ(plan.world_size(), 6u);
  EXPECT_EQ(plan.committed_step(), 3) << "after the checkpoint's step, not the last commit (5)";
  for (int64_t n = 0; n < 3; ++n) ASSERT_TRUE(sim.Vote(n, 4).ok());
  EXPECT_EQ(sim.rt->committed_step(), 4) << "step 4 is done again, once";
  ExpectEveryStartAfterTheAbortOfTheGenerationBefore(sim);
}

// Three pods of one tp-2 replica each commit steps 0 to 5; pod 1's link is cut, and the job
// restarts from its checkpoint while it is away (pods 0 and 2 are told to restart theirs).
void RestartTheJobWhilePod1IsAway(ScriptedAgents& sim) {
  sim.RegisterAll();
  sim.Run(20);
  for (int64_t step = 0; step <= 5; ++step)
    for (int64_t n = 0; n < 3; ++n) ASSERT_TRUE(sim.Vote(n, step).ok());
  sim.Clear();
  sim.rt->Disconnected(sim.streams_[1], sim.now);  // pod 1's link is cut
  sim.Gone(1);
  sim.Run(800, 5);
}

// Found by the simulation's census measure (seed 375): a pod lost before a job restart (its link
// cut) came back as its own replacement afterwards with the processes it had, holding step 5;
// the restart had restarted only the pods connected when it was decided. The next generation
// resumed after step 5, which no restarted process held: the real trainers' census fails there
// (no rank at that position holds the state). Its processes predate the restart: they restart
// too, and the job resumes from the checkpoint, as the restart says.
TEST(JobControl, APodLostBeforeAJobRestartRestartsItsProcessesWhenItComesBack) {
  ScriptedAgents sim(3, 2, kForce, {{"regroup.io/tensor-parallel", "2"}});
  RestartTheJobWhilePod1IsAway(sim);
  for (int64_t n : {0, 2}) ExpectRestartedAndReadmitted(sim, n);
  EXPECT_EQ(sim.Count(1, v1::ManagerMessage::kRestart), 0) << "pod 1 was away";
  for (int64_t n : {0, 2})
    ASSERT_TRUE(sim.Register(n, "pod-" + std::to_string(n) + "/2", FreshRanks(2, 3)).ok());
  sim.gone_.clear();
  ASSERT_TRUE(sim.Register(1, "pod-1/2", Survivor(2, 5)).ok());  // its link is back
  sim.Collect();
  ASSERT_EQ(sim.Count(1, v1::ManagerMessage::kRestart), 1)
      << "its processes predate the restart";
  EXPECT_EQ(sim.inbox_[1].back().restart().local_ranks_size(), 2);
  for (int t = 0; t < 5; ++t) {
    for (int64_t n = 0; n < 3; ++n) ASSERT_TRUE(sim.Send(n, FreshBeat(2, 3)).ok());
    sim.Run(100);
  }
  ASSERT_EQ(sim.rt->generation(), 2u);
  EXPECT_EQ(sim.starts_[0].plan().committed_step(), 3) << "from the checkpoint, as restarted";
}

// ...and a pod the restart was sent to that never got it (simulation seed 26796: its link was
// cut, and the manager wrote the restart on a stream that was already dead) comes back with its
// old processes: they restart too. A process restarted for the job reports no generation.
TEST(JobControl, APodThatNeverGotTheJobRestartRestartsItsProcessesWhenItComesBack) {
  ScriptedAgents sim(3, 2, kForce, {{"regroup.io/tensor-parallel", "2"}});
  RestartTheJobWhilePod1IsAway(sim);
  ASSERT_EQ(sim.Count(0, v1::ManagerMessage::kRestart), 1) << "sent, and lost on the cut link";
  sim.Clear();
  ASSERT_TRUE(sim.Register(0, "pod-0/2", Survivor(2, 5)).ok());
  ASSERT_TRUE(sim.Register(2, "pod-2/2", FreshRanks(2, 3)).ok());  // pod 2 restarted them
  sim.Collect();
  EXPECT_EQ(sim.Count(0, v1::ManagerMessage::kRestart), 1) << "its processes predate the restart";
  EXPECT_EQ(sim.Count(2, v1::ManagerMessage::kRestart), 0) << "its processes are the restarted ones";
}

// The same after a manager restart (sim seed 51007): the restarted manager decided a job restart
// before it had seen pod 0, whose processes (in a generation of the old epoch) then came back; it
// restarts them too, and tells the decision maker, which resumes the job once every pod is back
// (it waited for pod 0's return for good: a restarted manager's first pod was never reported).
TEST(JobControl, ARestartedManagersJobRestartRestartsThePodsItHadNotSeenAndResumes) {
  const Map config = {{"recover-strategy", "elastic-training"},
                      {"regroup.io/prefer-elastic", "true"},
                      {"regroup.io/tensor-parallel", "2"}};
  ScriptedAgents before(2, 1, kForce, config);
  before.RegisterAll();
  before.Run(20);
  ASSERT_EQ(before.rt->generation(), 1u);
  ScriptedAgents sim(2, 1, kForce, config, Restarted(RecordOf(before)));
  ASSERT_TRUE(sim.Register(1, "pod-1/2", Survivor(1, 5)).ok());
  sim.Gone(1);  // silent at once: lost, and the job restarts (no complete replica is left)
  sim.Run(1500, 5);
  bool restart = false;
  for (const auto& e : Events(sim)) restart |= e.kind() == "job_rescheduling";
  ASSERT_TRUE(restart);
  sim.gone_.clear();
  ASSERT_TRUE(sim.Register(0, "pod-0/2", Survivor(1, 5)).ok());
  ASSERT_TRUE(sim.Register(1, "pod-1/3", Survivor(1, 5)).ok());
  sim.Collect();
  for (int64_t n = 0; n < 2; ++n)
    EXPECT_EQ(sim.Count(n, v1::ManagerMessage::kRestart), 1)
        << "pod " << n << "'s processes predate the restart";
  for (int t = 0; t < 10 && sim.rt->generation() == 0; ++t) {
    for (int64_t n = 0; n < 2; ++n) ASSERT_TRUE(sim.Send(n, FreshBeat(1, 3)).ok());
    sim.Run(100);
  }
  ASSERT_GT(sim.rt->generation(), 0u) << "the job resumed";
  EXPECT_EQ(sim.starts_[0].plan().committed_step(), 3) << "from the checkpoint";
}

// A process of the last generation that died while no manager heard of it (simulation seed
// 5951: it died while the manager restarted) is a fault to the restarted manager's decision
// maker, named by its local rank, though it holds no rank of a generation of this manager's:
// the decision maker then knows its shard has a copy less, and the loss of the other copy goes
// to the checkpoint instead of resuming with the survivors' state.
TEST(JobControl, AProcessThatDiedBeforeARestartedManagerFormedAGenerationIsAFault) {
  const Map config = {{"recover-strategy", "recover-in-place,elastic-training"},
                      {"regroup.io/prefer-elastic", "true"},
                      {"regroup.io/tensor-parallel", "2"}};
  // Replica 0 on pods 0 and 1, replica 1 on pods 2 and 3.
  ScriptedAgents before(4, 1, kForce, config);
  before.RegisterAll();
  before.Run(20);
  ASSERT_EQ(before.rt->generation(), 1u);
  ScriptedAgents sim(4, 1, kForce, config, Restarted(RecordOf(before)));
  for (int64_t n : {0, 1, 3}) ASSERT_TRUE(sim.Register(n, "", Survivor(1, 5)).ok());
  std::vector<v1::LocalRank> dead = Survivor(1, 5);
  dead[0].set_alive(false);
  ASSERT_TRUE(sim.Register(2, "", dead).ok());
  ASSERT_TRUE(sim.Register(2, "", dead).ok()) << "a new stream: the same death, told once";
  const std::string death = "process_exit: local rank 0 of pod 2 (in generation 9 of an earlier "
                            "manager) died before this manager heard of it";
  EXPECT_EQ(Logged(sim, "fault", death), 1);
  sim.Run(400, 5);
  sim.Gone(0);  // pod 0 is lost: position 0 of replica 0; pod 2 held it in replica 1
  sim.Run(1500, 5);
  EXPECT_EQ(Logged(sim, "directive",
                   "no surviving rank holds the state of replica position [0]: a checkpoint is "
                   "needed"),
            1)
      << "the shard of position 0 is lost";
  EXPECT_EQ(Logged(sim, "fault", death), 1);
}

// ...and across a manager restart (simulation seeds 227, 1272: the job restart lived only in the
// memory of the incarnation that decided it). The next incarnation reads it from the record and
// restarts the processes of the pod that was away, so the job resumes from the checkpoint.
TEST(JobControl, AJobRestartOnRecordRestartsThePodThatWasAwayUnderTheNextIncarnation) {
  ScriptedAgents before(3, 2, kForce, {{"regroup.io/tensor-parallel", "2"}});
  RestartTheJobWhilePod1IsAway(before);
  const JobRecord record = RecordOf(before);
  ASSERT_TRUE(record.restarting) << "the job restart is on record";
  // The manager crashes before anything comes back; pods 0 and 2 restarted their processes.
  ScriptedAgents sim(3, 2, kForce, {{"regroup.io/tensor-parallel", "2"}}, Restarted(record));
  for (int64_t n : {0, 2})
    ASSERT_TRUE(sim.Register(n, "pod-" + std::to_string(n) + "/2", FreshRanks(2, 3)).ok());
  ASSERT_TRUE(sim.Register(1, "pod-1/2", Survivor(2, 5)).ok());  // its link is back
  sim.Collect();
  ASSERT_EQ(sim.Count(1, v1::ManagerMessage::kRestart), 1) << "its processes predate the restart";
  for (int64_t n : {0, 2}) EXPECT_EQ(sim.Count(n, v1::ManagerMessage::kRestart), 0) << "pod " << n;
  for (int t = 0; t < 10 && sim.rt->generation() == 0; ++t) {
    for (int64_t n = 0; n < 3; ++n) ASSERT_TRUE(sim.Send(n, FreshBeat(2, 3)).ok());
    sim.Run(100);
  }
  ASSERT_GT(sim.rt->generation(), 0u);
  EXPECT_EQ(sim.starts_[0].plan().committed_step(), 3) << "from the checkpoint, as restarted";
  EXPECT_FALSE(RecordOf(sim).restarting) << "a generation formed: the restart is over";
}

// ...and when the pod that was away comes back with processes that no rule restarted. The next
// incarnation's job restart restarted only live processes of a generation, and no other rule
// started the others before the next generation. Three ways, each found by the simulation:
//  - its processes of a generation died while it was away (seed 2138, 10 faults): the join
//    window found the pod missing, it was scaled in, and the next generation resumed after the
//    step they last held, which no rank held (a census gap);
//  - a process restarted for the job died before any generation formed (seed 108960, 12 faults:
//    it reports no generation, so it does not predate the restart): the decision maker waited
//    for good for the pod's replacement, which had registered already;
//  - a process restarted in place before the restart heard the survivors' commits while it
//    waited to rejoin (seed 3776, 10 faults: in no generation, it did not predate the restart;
//    the commit it heard set the step of the restart's first generation, a census gap).
// They restart too, and the job resumes from the checkpoint with every pod.
TEST(JobControl, AJobRestartOnRecordRestartsEveryProcessOfAPodThatComesBackFromBeforeIt) {
  std::vector<v1::LocalRank> of_a_generation = Survivor(2, 5);
  for (auto& r : of_a_generation) r.set_alive(false);
  std::vector<v1::LocalRank> died = FreshRanks(2, 3);
  died[1].set_alive(false);
  std::vector<v1::LocalRank> heard = FreshRanks(2, 3);
  heard[0].set_heard_commit_step(40);  // restarted in place, it heard the survivors' commits
  heard[0].set_heard_commit_epoch(1);
  heard[0].set_heard_commit_generation(2);
  for (const auto& [ranks, restarted] : {std::make_pair(of_a_generation, 2),
                                         std::make_pair(died, 1), std::make_pair(heard, 2)}) {
    ScriptedAgents before(3, 2, kForce, {{"regroup.io/tensor-parallel", "2"}});
    RestartTheJobWhilePod1IsAway(before);
    ScriptedAgents sim(3, 2, kForce, {{"regroup.io/tensor-parallel", "2"}},
                       Restarted(RecordOf(before)));
    for (int64_t n : {0, 2})
      ASSERT_TRUE(sim.Register(n, "pod-" + std::to_string(n) + "/2", FreshRanks(2, 3)).ok());
    ASSERT_TRUE(sim.Register(1, "pod-1/2", ranks).ok());
    sim.Collect();
    ASSERT_EQ(sim.Count(1, v1::ManagerMessage::kRestart), 1) << restarted << " restarted";
    EXPECT_EQ(sim.inbox_[1].back().restart().local_ranks_size(), restarted);
    for (int t = 0; t < 10 && sim.rt->generation() == 0; ++t) {
      for (int64_t n = 0; n < 3; ++n) ASSERT_TRUE(sim.Send(n, FreshBeat(2, 3)).ok());
      sim.Run(100);
    }
    ASSERT_GT(sim.rt->generation(), 0u) << restarted << " restarted";
    EXPECT_EQ(sim.rt->world_size(), 6u) << "every pod is in it";
    EXPECT_EQ(sim.starts_[0].plan().committed_step(), 3) << "from the checkpoint";
  }
}

// ...and a pod away all along that comes back once the restart formed its first generation
// (simulation seed 7765, 10 faults: its link was cut before the restart, and it came back as the
// scaled-in job scaled out again). Its process heard commits of a generation before that one:
// it holds the state from before the restart, and the scale-out resumed after its step, 134, in
// the history the job had left (the restarted job was at 27), which no rank at some position
// held (a census gap). It restarts as it registers, and the job resumes in its own history.
TEST(JobControl, AProcessFromBeforeAJobRestartRestartsWhenItsPodComesBackAfterIt) {
  std::optional<JobRecord> stored = LedByEpoch5(3);
  stored->restarting = true;
  JobControlOptions o;
  o.epoch = 6;
  o.record = stored;
  ScriptedAgents sim(3, 1, kForce,
                     {{"recover-strategy", "elastic-training"}, {"regroup.io/prefer-elastic", "true"}},
                     o);
  sim.Gone(2);
  for (int64_t n : {0, 1})
    ASSERT_TRUE(sim.Register(n, "pod-" + std::to_string(n) + "/2", FreshRanks(1, -1)).ok());
  for (int t = 0; t < 150 && sim.rt->generation() == 0; ++t) sim.Run(100, -1);
  ASSERT_GT(sim.rt->generation(), 0u) << "the restart formed its first generation without pod 2";
  ASSERT_EQ(sim.starts_[0].plan().committed_step(), -1);
  for (int64_t step = 0; step <= 3; ++step)
    for (int64_t n : {0, 1}) ASSERT_TRUE(sim.Vote(n, step).ok());
  sim.Clear();
  std::vector<v1::LocalRank> before = Survivor(1, 40);
  before[0].set_heard_commit_epoch(5);  // committed by generation (5, 3), before the restart
  before[0].set_heard_commit_generation(3);
  ASSERT_TRUE(sim.Register(2, "pod-2/2", before).ok());  // still Gone(2) to BeatAll: it beats below
  sim.Collect();
  ASSERT_EQ(sim.Count(2, v1::ManagerMessage::kRestart), 1) << "its process predates the restart";
  for (int64_t step = 4; step < 24 && sim.rt->world_size() < 3; ++step) {
    ASSERT_TRUE(sim.Send(2, FreshBeat(1, -1)).ok());  // restarted
    for (int64_t n : {0, 1}) (void)sim.Vote(n, step);
    sim.Run(100, step + 1);
  }
  ASSERT_EQ(sim.rt->world_size(), 3u) << "scaled out with pod 2";
  EXPECT_LT(sim.starts_[2].plan().committed_step(), 40) << "in the restarted job's history";
  EXPECT_GE(sim.starts_[2].plan().committed_step(), 3);
}

// A second incarnation waiting for its majority learns of a job restart that the running one
// decided (simulation seeds 857, 2839): the processes of its pods that predate it restart.
TEST(JobControl, AnIncarnationWaitingForAMajorityFollowsAJobRestartOnRecord) {
  std::optional<JobRecord> stored = LedByEpoch5(2);
  ScriptedAgents sim(2, 1, kForce, {{"recover-strategy", "elastic-training"}}, Watching(stored, 6));
  ASSERT_TRUE(sim.Register(0, "", Survivor(1, 7)).ok());
  sim.Run(1100, -1);
  ASSERT_EQ(sim.rt->generation(), 0u) << "1 of 2 is no majority";
  EXPECT_EQ(sim.Count(0, v1::ManagerMessage::kRestart), 0);
  stored->restarting = true;  // epoch 5 restarts the job from its checkpoint
  sim.Run(1100, -1);
  EXPECT_EQ(sim.Count(0, v1::ManagerMessage::kRestart), 1);
  bool noted = false;
  for (const auto& e : Events(sim)) noted |= e.kind() == "restart_on_record";
  EXPECT_TRUE(noted);
}

// An incarnation that formed nothing takes on a job restart from the record (simulation seed
// 103039, 12 faults: a second manager beside the first). A pod whose process from before the
// restart died had dropped before its first generation, and stayed on its books: the generation
// the incarnation formed resumed after that process's step, which nobody held (a census gap). A
// job restart resumes from what its restarted processes loaded.
TEST(JobControl, AJobRestartTakenFromTheRecordResumesFromTheCheckpointNotFromAProcessBeforeIt) {
  std::optional<JobRecord> stored = LedByEpoch5(2);
  stored->members = {{1, "pod-1"}};  // epoch 5 scaled in to pod 1 last
  ScriptedAgents sim(2, 1, kForce,
                     {{"recover-strategy", "elastic-training"}, {"regroup.io/prefer-elastic", "true"}},
                     Watching(stored, 6));
  std::vector<v1::LocalRank> before = Survivor(1, 40);
  before[0].set_heard_commit_epoch(5);
  before[0].set_heard_commit_generation(3);
  ASSERT_TRUE(sim.Register(0, "", before).ok());
  before[0].set_alive(false);
  ASSERT_TRUE(sim.Register(0, "", before).ok());  // its process died
  sim.rt->Disconnected(sim.streams_[0], sim.now);  // and its agent went
  sim.Gone(0);
  stored->restarting = true;  // epoch 5 restarts the job from its checkpoint
  sim.Run(1100, -1);
  ASSERT_TRUE(sim.Register(1, "", FreshRanks(1, 3)).ok());  // restarted: the checkpoint of step 3
  for (int t = 0; t < 150 && sim.rt->generation() == 0; ++t) {
    ASSERT_TRUE(sim.Send(1, FreshBeat(1, 3)).ok());
    sim.Run(100);
  }
  ASSERT_GT(sim.rt->generation(), 0u);
  EXPECT_EQ(sim.starts_[1].plan().committed_step(), 3) << "from the checkpoint";
}

// A fault of the training's own reschedules with fault-retry-times: every process restarts;
// without a checkpoint, the job starts over.
TEST(JobControl, AJobRestartAfterAFaultOfTheTrainingsOwnRestartsEveryProcess) {
  ScriptedAgents sim(2, 2, {{"fault-scheduling", "force"}, {"fault-retry-times", "2"}}, {});
  sim.RegisterAll();
  sim.Run(20);
  for (int64_t n = 0; n < 2; ++n) ASSERT_TRUE(sim.Vote(n, 0).ok());
  sim.Clear();
  ASSERT_TRUE(sim.Exit(1, 0, 1).ok());
  sim.Run(400, 0);
  for (int64_t n : {0, 1}) ExpectRestartedAndReadmitted(sim, n);
  for (int64_t n : {0, 1})
    ASSERT_TRUE(sim.Register(n, "pod-" + std::to_string(n) + "/2", FreshRanks(2, -1)).ok());
  sim.Run(400);
  ASSERT_EQ(sim.rt->generation(), 2u);
  EXPECT_EQ(sim.starts_[0].plan().committed_step(), -1) << "no checkpoint: from the start";
}

// Pod-level rescheduling standalone: only the lost pod is replaced (a healthy pod stays itself,
// its processes restart), and one decision resumes the job once the replacement is there.
TEST(JobControl, APodLevelRestartResumesOnceEveryPodIsBack) {
  ScriptedAgents sim(3, 2, {{"fault-scheduling", "force"}, {"pod-rescheduling", "on"}},
          {{"regroup.io/tensor-parallel", "2"}});
  sim.RegisterAll();
  sim.Run(20);
  for (int64_t n = 0; n < 3; ++n) ASSERT_TRUE(sim.Vote(n, 0).ok());
  sim.rt->Disconnected(sim.streams_[1], sim.now);
  sim.Gone(1);
  sim.Run(800, 1);
  for (int64_t n : {0, 2}) {
    ASSERT_EQ(sim.Count(n, v1::ManagerMessage::kRestart), 1) << "pod " << n;
    EXPECT_EQ(sim.Count(n, v1::ManagerMessage::kRefusal), 0) << "pod " << n << " stays itself";
  }
  ASSERT_TRUE(sim.Register(1, "pod-1-b", FreshRanks(2, -1)).ok());
  sim.gone_.clear();
  for (int i = 0; i < 10; ++i) {
    for (int64_t n = 0; n < 3; ++n) ASSERT_TRUE(sim.Send(n, FreshBeat(2, -1)).ok());
    sim.Run(100);
  }
  ASSERT_EQ(sim.rt->generation(), 2u);
  int resumes = 0, restarts = 0;
  for (const auto& e : Events(sim)) {
    resumes += e.kind() == "directive" && Contains(e.message(), "resume [pod-rescheduling]");
    restarts += e.kind() == "directive" && Contains(e.message(), "restart_job");
  }
  EXPECT_EQ(restarts, 1);
  EXPECT_EQ(resumes, 1);
}

// Found by integration scenario 15: pod level, a process crash gives up no pod, so the decision
// maker resumes in the tick it restarts the job, and only its newest directive reaches the
// manager. The resume alone must still restart every process, and never replace the pod whose
// process crashed (recover-in-place is not allowed, but this is a restart of the job).
TEST(JobControl, APodLevelRestartAfterAProcessCrashRestartsEveryProcessThoughOnlyItsResumeArrives) {
  ScriptedAgents sim(2, 2, {{"fault-scheduling", "force"}, {"pod-rescheduling", "on"},
                 {"process-recover-enable", "off"}, {"fault-retry-times", "1"}}, {});
  sim.RegisterAll();
  sim.Run(20);
  for (int64_t n = 0; n < 2; ++n) ASSERT_TRUE(sim.Vote(n, 0).ok());
  sim.Clear();
  ASSERT_TRUE(sim.Exit(1, 1, 1).ok());
  sim.Run(400, 0);
  for (int64_t n : {0, 1}) {
    EXPECT_EQ(sim.Count(n, v1::ManagerMessage::kRefusal), 0) << "pod " << n << " stays itself";
    EXPECT_GE(sim.Count(n, v1::ManagerMessage::kRestart), 1) << "pod " << n;
  }
  bool said = false;
  for (const auto& e : Events(sim))
    said |= e.kind() == "pod_rescheduling" &&
            Contains(e.message(), "every process restarts from the newest checkpoint");
  EXPECT_TRUE(said);
  for (int i = 0; i < 10; ++i) {
    for (int64_t n = 0; n < 2; ++n) ASSERT_TRUE(sim.Send(n, FreshBeat(2, -1)).ok());
    sim.Run(100);
  }
  ASSERT_EQ(sim.rt->generation(), 2u);
  EXPECT_TRUE(sim.rt->training());
  EXPECT_EQ(sim.starts_[0].plan().committed_step(), -1) << "no checkpoint: from the start";
}

// Found by integration scenario 13: a pod readmitted for a job restart registered while its
// processes were being restarted, and named them as processes that had died. Replacing it for
// good (recover-in-place not being allowed) left the job waiting for a pod that never came:
// while the job restarts, such processes are restarted.
TEST(JobControl, APodReadmittedForAJobRestartWithItsProcessesDownIsRestartedNotReplaced) {
  ScriptedAgents sim(2, 2, {{"fault-scheduling", "force"}, {"fault-retry-times", "2"}}, {});
  sim.RegisterAll();
  sim.Run(20);
  for (int64_t n = 0; n < 2; ++n) ASSERT_TRUE(sim.Vote(n, 0).ok());
  ASSERT_TRUE(sim.Exit(1, 0, 1).ok());
  sim.Run(400, 0);
  sim.Clear();
  std::vector<v1::LocalRank> down = FreshRanks(2, -1);
  for (auto& r : down) {
    r.set_alive(false);
    r.set_pid(4242);  // as an agent that reported the old pids
  }
  ASSERT_TRUE(sim.Register(0, "pod-0/2", FreshRanks(2, 0)).ok());
  ASSERT_TRUE(sim.Register(1, "pod-1/2", down).ok());
  sim.Run(400);
  EXPECT_FALSE(sim.rt->IsFenced("pod-1/2")) << "not replaced for good";
  ASSERT_EQ(sim.Count(1, v1::ManagerMessage::kRestart), 1) << "its processes restart";
  ASSERT_TRUE(sim.Send(1, FreshBeat(2, 0)).ok());
  ASSERT_TRUE(sim.Send(0, FreshBeat(2, 0)).ok());
  sim.Run(200);
  EXPECT_EQ(sim.rt->generation(), 2u);
  EXPECT_TRUE(sim.rt->training());
}

// Found by the e2e tests on torch 2.x, whose slower start let the survivors finish first: the
// replica of a crashed rank rejoined at the boundary of the job's last step, and the survivors,
// done, exited. No rank that holds the trained state is left to send it, so the rejoined rank
// can never train: training is over, and every agent is told so.
TEST(JobControl, TrainingEndsWhenEveryRankHoldingTheStateFinishedEvenIfARejoinerWaits) {
  ScriptedAgents sim(2, 2, kForce, kElastic);  // tp 2: a replica per pod
  sim.RegisterAll();
  sim.Run(20);
  for (int64_t n = 0; n < 2; ++n) ASSERT_TRUE(sim.Vote(n, 0).ok());
  ASSERT_TRUE(sim.Exit(1, 1, 1).ok());
  sim.Collect();
  ASSERT_EQ(sim.rt->generation(), 2u) << "the survivors continue";
  sim.Run(300, 1);
  ASSERT_TRUE(sim.Send(1, RestartedHello(2, 1, 2, 0)).ok());
  ASSERT_TRUE(sim.Vote(0, 1).ok());  // the last step
  sim.Collect();
  ASSERT_EQ(sim.rt->generation(), 3u) << "the replica rejoins at the last step's boundary";
  sim.Clear();
  // Pod 0's ranks hold step 1 and finish; pod 1's wait for state nobody will send.
  ASSERT_TRUE(sim.Beat(0, 1, 3, 1).ok());
  ASSERT_TRUE(sim.Send(1, RestartedHello(2, 1, 3, -1)).ok());
  ASSERT_TRUE(sim.Exit(0, 0, 0).ok());
  ASSERT_TRUE(sim.Exit(0, 1, 0).ok());
  sim.Collect();
  bool done = false;
  for (const auto& e : Events(sim)) done |= e.kind() == "done";
  EXPECT_TRUE(done) << "training finished at step 1";
  int stops = 0;
  for (const auto& m : sim.inbox_[1])
    stops += m.has_stop() && m.stop().mode() == v1::StopTraining::MODE_LEAVE;
  EXPECT_EQ(stops, 1) << "the waiting pod is told to leave";
}

// Found by the simulation (seed 7332) once a job restart waited for its pods: a pod missing when
// the join window closed (here, after a manager restart) registered later, and the decision maker,
// waiting for exactly that pod, never heard of it. Such a pod is the replacement it waits for.
TEST(JobControl, APodMissingAtTheJoinWindowThatRegistersLaterIsTheAwaitedReplacement) {
  ScriptedAgents sim(2, 1, kForce, {{"recover-strategy", "recover"}});
  ASSERT_TRUE(sim.Register(1).ok());
  sim.Run(5200, -1);
  ASSERT_EQ(sim.rt->generation(), 0u) << "recover waits for pod 0";
  ASSERT_TRUE(sim.Register(0).ok());
  sim.Run(400, -1);
  EXPECT_EQ(sim.rt->generation(), 1u) << "the job starts once the awaited pod is there";
  EXPECT_TRUE(sim.rt->training());
}

}  // namespace
}  // namespace regroup::manager

namespace regroup::manager {
namespace {

// Issue 37: a beat summarises an agent's ranks (wire.proto: Heartbeat). A quiet agent's beat
// carries no rank: its pod stays live and its ranks stay as last reported, so the job trains on
// past the liveness and hang timeouts; a beat naming one late rank changes only that rank's
// record (it is found frozen, its peer on the same pod is not). An agent that sends every rank
// in every beat (older ones) is taken the same way.
TEST(JobControl, ABeatCarryingOnlySomeRanksLeavesTheOthersAsLastReported) {
  const Map config = {{"recover-strategy", "recover-in-place,elastic-training"},
                      {"regroup.io/hang-timeout-min-s", "3"}};
  ScriptedAgents sim(2, 2, kForce, config);
  sim.RegisterAll();
  sim.Run(100, 0);  // full beats, as an older agent sends: the generation forms
  ASSERT_TRUE(sim.rt->training());
  const uint64_t generation = sim.rt->generation();
  // 2 s of quiet beats (no rank), with a commit in the middle: the votes change the ranks'
  // steps, which a summary beat would carry; here the hang timeout (3 s) is not reached.
  auto quiet = [&](int64_t ms) {
    for (int64_t t = 0; t < ms; t += 20) {
      sim.now += 20;
      for (int64_t n = 0; n < 2; ++n) {
        v1::AgentMessage m;
        m.mutable_heartbeat()->set_free_port(30000);
        ASSERT_TRUE(sim.Send(n, m).ok());
      }
      sim.rt->Tick(sim.now);
      sim.Collect();
    }
  };
  quiet(2000);
  EXPECT_TRUE(sim.rt->training()) << FirstFault(sim);
  EXPECT_EQ(sim.rt->generation(), generation);
  EXPECT_EQ(Logged(sim, "fault", ""), 0) << FirstFault(sim);
  // Pod 1's local rank 1 falls silent (no process ran): only it is in pod 1's beats, its age
  // growing; pod 0's beats stay empty. It is found frozen; the fault names its rank alone.
  for (int64_t t = 0; t < 1000 && sim.rt->training(); t += 20) {
    sim.now += 20;
    v1::AgentMessage empty;
    empty.mutable_heartbeat();
    ASSERT_TRUE(sim.Send(0, empty).ok());
    v1::AgentMessage late;
    auto* r = late.mutable_heartbeat()->add_ranks();
    *r = ScriptedAgents::Live(1, v1::PHASE_COMPUTING, 0, generation, -1);
    r->set_beat_age_ms(static_cast<uint32_t>(125 + t));
    r->set_cpu_idle_ms(static_cast<uint32_t>(125 + t));
    ASSERT_TRUE(sim.Send(1, late).ok());
    sim.rt->Tick(sim.now);
    sim.Collect();
  }
  EXPECT_FALSE(sim.rt->training());
  ASSERT_EQ(Logged(sim, "fault", "(frozen process)"), 1) << FirstFault(sim);
  EXPECT_NE(FirstFault(sim).find("sent no heartbeat for"), std::string::npos) << FirstFault(sim);
}

}  // namespace
}  // namespace regroup::manager
