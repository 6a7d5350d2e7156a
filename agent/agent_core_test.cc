// AgentCore without an operating system: a host that records what the core does, and a clock
// the test moves.
#include "agent/agent_core.h"

#include <gtest/gtest.h>

#include <map>
#include <optional>

namespace regroup::agent {
namespace {

namespace v1 = regroup::v1;

struct RecordingHost final : AgentHost {
  int sessions = 0;
  int cancels = 0;
  std::vector<v1::AgentMessage> to_manager;
  std::vector<std::pair<uint32_t, v1::AgentReply>> to_trainers;
  int next_pid = 100;
  std::optional<int> exit_code;
  std::map<int, int64_t> cpu_ms;  // what CpuMs reads for a pid (none: not known)

  void OpenSession() override { ++sessions; }
  void SendToManager(const v1::AgentMessage& m) override { to_manager.push_back(m); }
  void CancelSession() override { ++cancels; }
  bool SendToTrainer(uint32_t r, const v1::AgentReply& reply) override {
    to_trainers.emplace_back(r, reply);
    return true;
  }
  bool TrainerConnected(uint32_t) const override { return true; }
  StatusOr<int> StartProcess(uint32_t) override { return next_pid++; }
  void Signal(int, int) override {}
  std::vector<uint32_t> FreePorts() override { return {40000, 40001}; }
  std::optional<int64_t> CpuMs(int pid) override {
    auto it = cpu_ms.find(pid);
    return it == cpu_ms.end() ? std::nullopt : std::optional<int64_t>(it->second);
  }
  void Exit(int code, bool, const std::string&) override { exit_code = code; }

  int Pauses() const {
    int n = 0;
    for (const auto& [r, reply] : to_trainers) n += reply.has_pause();
    return n;
  }
  const v1::Register* LastRegister() const {
    for (auto it = to_manager.rbegin(); it != to_manager.rend(); ++it)
      if (it->has_register_()) return &it->register_();
    return nullptr;
  }
};

class AgentCoreTest : public ::testing::Test {
 protected:
  AgentCoreTest() {
    options_.job_id = "job";
    options_.pod_uid = "pod-0";
    options_.node_rank = 0;
    options_.nproc = 1;
  }

  void At(int64_t ms) { now_ = Millis(ms); }
  void Welcome(bool resumed) {
    v1::ManagerMessage m;
    m.mutable_header()->set_job_id("job");
    m.mutable_header()->set_epoch(1);
    auto* w = m.mutable_welcome();
    w->set_epoch(1);
    w->set_heartbeat_interval_ms(100);
    w->set_liveness_timeout_ms(500);
    w->set_resumed(resumed);
    core_.OnManagerMessage(now_, m);
  }
  // A session that was up breaks, and the next one opens (Register sent) at `reopen_ms`.
  void BreakAndReopen(int64_t reopen_ms) {
    core_.OnSessionClosed(now_, "connection reset", false);
    At(reopen_ms);
    core_.OnTimers(now_);  // reconnects (its backoff is 100 ms)
    core_.OnSessionOpened(now_);
  }

  // A session up and welcomed, and local rank 0's trainer said `hello` (pid 100).
  void ConnectTrainer(v1::TrainerHello hello) {
    core_.Start(now_);
    core_.OnSessionOpened(now_);
    Welcome(false);
    hello.set_pid(100);
    core_.OnHello(now_, 0, hello);
  }
  // What the next heartbeat reports of local rank 0 (the clock moves past its interval).
  v1::LocalRank Reported() {
    now_ += Millis(200);
    core_.OnTimers(now_);
    for (auto it = host_.to_manager.rbegin(); it != host_.to_manager.rend(); ++it)
      if (it->has_heartbeat()) return it->heartbeat().ranks(0);
    ADD_FAILURE() << "no heartbeat was sent";
    return v1::LocalRank();
  }

  AgentOptions options_;
  RecordingHost host_;
  AgentCore core_{options_, &host_};
  Millis now_{0};
};

// Each heartbeat says how long each process has not run (its CPU time stood still), so that the
// manager tells a starved trainer from a frozen one; nothing when the host cannot tell.
TEST_F(AgentCoreTest, AHeartbeatSaysSinceWhenEachProcessHasNotRun) {
  ConnectTrainer(v1::TrainerHello());
  EXPECT_FALSE(Reported().has_cpu_idle_ms()) << "not known";
  host_.cpu_ms[100] = 40;
  Reported();
  host_.cpu_ms[100] = 90;  // it ran
  v1::LocalRank r = Reported();
  ASSERT_TRUE(r.has_cpu_idle_ms());
  EXPECT_EQ(r.cpu_idle_ms(), 0u);
  r = Reported();  // stopped (SIGSTOP, or blocked): its CPU time stands still
  EXPECT_EQ(r.cpu_idle_ms(), 200u);
  EXPECT_EQ(Reported().cpu_idle_ms(), 400u);
  host_.cpu_ms[100] = 91;
  EXPECT_EQ(Reported().cpu_idle_ms(), 0u);
}

TEST_F(AgentCoreTest, TrainersAreNotPausedWhileARegisterThatMayResumeTheirGenerationIsInFlight) {
  core_.Start(now_);
  core_.OnSessionOpened(now_);
  Welcome(false);
  At(1000);
  BreakAndReopen(1200);  // Register sent 200 ms after the break
  At(1800);              // past the 500 ms liveness timeout, no answer yet
  core_.OnTimers(now_);
  EXPECT_EQ(host_.Pauses(), 0) << "the Register promised the manager the generation";
  Welcome(true);
  At(3000);
  core_.OnTimers(now_);
  EXPECT_EQ(host_.Pauses(), 0) << "the session resumed: the trainers go on";
}

TEST_F(AgentCoreTest, ARegisterAfterTheTrainersWerePausedSaysTheyLeftTheirGeneration) {
  core_.Start(now_);
  core_.OnSessionOpened(now_);
  Welcome(false);
  ASSERT_FALSE(host_.LastRegister()->left_generation());
  At(1000);
  core_.OnSessionClosed(now_, "connection reset", false);
  At(1050);
  core_.OnTimers(now_);  // too early to reconnect
  At(1600);              // past the liveness timeout: paused (the reconnect attempt is not up)
  core_.OnTimers(now_);  // reconnects now: Connect, no stream yet
  core_.OnSessionClosed(now_, "unavailable", false);
  At(1700);
  core_.OnTimers(now_);
  ASSERT_EQ(host_.Pauses(), 1);
  At(1900);
  core_.OnTimers(now_);
  core_.OnSessionOpened(now_);
  ASSERT_NE(host_.LastRegister(), nullptr);
  EXPECT_TRUE(host_.LastRegister()->left_generation()) << "its trainers left the generation";
  Welcome(false);
  At(2500);
  BreakAndReopen(2600);
  EXPECT_FALSE(host_.LastRegister()->left_generation()) << "a Welcome since: nothing left";
}

// A trainer computes a step only holding the one before (its own commit, or what its generation's
// census gave it): the agent reports it holds that step though no commit outcome said so, and
// keeps saying so once the trainer is paused (sim seed 20285: a manager took a rank given the
// state at its generation's start for one without it, and sent a job with every shard held to
// the checkpoint).
TEST_F(AgentCoreTest, ATrainerInAStepHoldsTheStepBeforeIt) {
  v1::TrainerHello hello;
  hello.set_generation(3);  // a trainer of generation 3 when its agent restarted
  hello.set_committed_step(-1);
  hello.set_heard_commit_step(-1);
  ConnectTrainer(hello);
  auto beat = [&](int64_t step, v1::Phase phase) {
    v1::TrainerMessage m;
    m.mutable_heartbeat()->set_step(step);
    m.mutable_heartbeat()->set_phase(phase);
    core_.OnTrainerMessage(now_, 0, m);
    return Reported().committed_step();
  };
  EXPECT_EQ(beat(-1, v1::PHASE_SYNCING), -1) << "receiving the state: not held yet";
  EXPECT_EQ(beat(42, v1::PHASE_COMPUTING), 41);
  EXPECT_EQ(beat(-1, v1::PHASE_PAUSED), 41) << "paused, it still holds it";
}

// A vote whose outcome the trainer has not heard is reported (a restarted manager knows from it
// that the rank applies the step if the generation it voted in committed it) until an outcome
// or a plan settles it, as the trainer does (python/regroup/forming.py): applied when the plan
// says the generation it voted in committed the step, dropped when another one did.
TEST_F(AgentCoreTest, AVoteIsReportedUntilAnOutcomeOrAPlanSettlesIt) {
  v1::TrainerHello hello;
  hello.set_committed_step(40);
  ConnectTrainer(hello);
  auto manager = [&](auto fill) {
    v1::ManagerMessage m;
    m.mutable_header()->set_job_id("job");
    m.mutable_header()->set_epoch(1);
    fill(m);
    core_.OnManagerMessage(now_, m);
  };
  auto start = [&](uint64_t generation, int64_t committed, uint64_t by_generation) {
    manager([&](v1::ManagerMessage& m) {
      auto* plan = m.mutable_start()->mutable_plan();
      plan->set_epoch(1);
      plan->set_generation(generation);
      plan->set_world_size(1);
      plan->set_committed_step(committed);
      plan->set_committed_epoch(by_generation ? 1 : 0);
      plan->set_committed_generation(by_generation);
      plan->add_ranks()->set_local_rank(0);
    });
  };
  auto vote = [&](uint64_t generation, int64_t step) {
    v1::TrainerMessage m;
    m.mutable_vote()->set_generation(generation);
    m.mutable_vote()->set_step(step);
    m.mutable_vote()->set_ok(true);
    core_.OnTrainerMessage(now_, 0, m);
  };
  start(3, 40, 0);
  vote(3, 41);
  v1::LocalRank r = Reported();
  EXPECT_EQ(r.voted_step(), 41);
  EXPECT_EQ(r.voted_epoch(), 1u);
  EXPECT_EQ(r.voted_generation(), 3u);
  EXPECT_EQ(r.committed_step(), 40);
  start(4, 41, 3);  // resumes after step 41, committed by generation 3: it applies its vote
  r = Reported();
  EXPECT_EQ(r.voted_generation(), 0u) << "settled by the plan";
  EXPECT_EQ(r.committed_step(), 41);
  vote(4, 42);
  manager([](v1::ManagerMessage& m) {
    m.mutable_outcome()->set_generation(4);
    m.mutable_outcome()->set_step(42);
    m.mutable_outcome()->set_commit(true);
  });
  r = Reported();
  EXPECT_EQ(r.voted_generation(), 0u) << "settled by the outcome";
  EXPECT_EQ(r.committed_step(), 42);
  vote(4, 43);
  start(6, 43, 5);  // step 43 was committed by generation 5, which it was not in: dropped
  r = Reported();
  EXPECT_EQ(r.voted_generation(), 0u) << "settled by the plan";
  EXPECT_EQ(r.committed_step(), 42) << "its vote is dropped; the state comes from a peer";
}

}  // namespace
}  // namespace regroup::agent
