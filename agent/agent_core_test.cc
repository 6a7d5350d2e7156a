// SPDX-License-Identifier: Apache-2.0
// AgentCore without an operating system: a host that records what the core does, and a clock
// the test moves.
#include "agent/agent_core.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

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
  std::vector<std::pair<int, int>> signals;  // (pid, signal)

  void OpenSession() override { ++sessions; }
  void SendToManager(const v1::AgentMessage& m) override { to_manager.push_back(m); }
  void CancelSession() override { ++cancels; }
  bool SendToTrainer(uint32_t r, const v1::AgentReply& reply) override {
    to_trainers.emplace_back(r, reply);
    return true;
  }
  bool TrainerConnected(uint32_t) const override { return true; }
  StatusOr<int> StartProcess(uint32_t) override { return next_pid++; }
  void Signal(int pid, int signal) override { signals.emplace_back(pid, signal); }
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
  int Count(bool (v1::AgentMessage::*has)() const) const {
    int n = 0;
    for (const v1::AgentMessage& m : to_manager) n += (m.*has)();
    return n;
  }
  const v1::Register* LastRegister() const {
    for (auto it = to_manager.rbegin(); it != to_manager.rend(); ++it)
      if (it->has_register_()) return &it->register_();
    return nullptr;
  }
};

// What the core logs while it lives, one line per message ("[level] text").
class CapturedLog {
 public:
  CapturedLog() : previous_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_st>(text_);
    sink->set_pattern("[%l] %v");
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("captured", sink));
  }
  ~CapturedLog() { spdlog::set_default_logger(previous_); }
  CapturedLog(const CapturedLog&) = delete;
  CapturedLog& operator=(const CapturedLog&) = delete;

  std::string text() const { return text_.str(); }
  // The lines containing every one of `parts`.
  int Lines(const std::vector<std::string>& parts) const {
    std::istringstream in(text_.str());
    int n = 0;
    for (std::string line; std::getline(in, line);) {
      bool all = true;
      for (const std::string& p : parts) all = all && line.find(p) != std::string::npos;
      n += all;
    }
    return n;
  }

 private:
  std::ostringstream text_;
  std::shared_ptr<spdlog::logger> previous_;
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

  CapturedLog log_;
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

// A beat summarises the agent's ranks: a rank's report goes only when it changed or its trainer
// is late (a quarter of the 500 ms liveness timeout), so a quiet agent's beat carries no rank
// whatever its nproc; the first beat of every session carries them all.
TEST_F(AgentCoreTest, ABeatCarriesOnlyTheRanksThatChangedOrAreLate) {
  ConnectTrainer(v1::TrainerHello());
  auto beat_at = [&](int64_t ms, std::optional<int64_t> trainer_step) {
    At(ms - 10);
    if (trainer_step) {
      v1::TrainerMessage m;
      m.mutable_heartbeat()->set_step(*trainer_step);
      m.mutable_heartbeat()->set_phase(v1::PHASE_COMPUTING);
      core_.OnTrainerMessage(now_, 0, m);
    }
    At(ms);
    const size_t sent = host_.to_manager.size();
    core_.OnTimers(now_);
    for (size_t i = sent; i < host_.to_manager.size(); ++i)
      if (host_.to_manager[i].has_heartbeat()) return host_.to_manager[i].heartbeat();
    ADD_FAILURE() << "no beat at " << ms << " ms";
    return v1::Heartbeat();
  };
  ASSERT_GE(host_.Count(&v1::AgentMessage::has_heartbeat), 1);
  EXPECT_EQ(host_.to_manager.back().heartbeat().ranks_size(), 1) << "a session's first beat";
  EXPECT_EQ(beat_at(100, 7).ranks_size(), 1) << "the step changed";
  v1::Heartbeat quiet = beat_at(200, 7);
  EXPECT_EQ(quiet.ranks_size(), 0) << "nothing changed, the trainer beats on time";
  EXPECT_GT(quiet.free_ports_size(), 0) << "free ports go in every beat";
  EXPECT_EQ(beat_at(300, 7).ranks_size(), 0);
  // The trainer falls silent: from a beat age of 125 ms its rank is in every beat, its age
  // growing, and once more when it beats again (the manager learns how long the silence was).
  EXPECT_EQ(beat_at(400, std::nullopt).ranks_size(), 0) << "100 ms: on time";
  v1::Heartbeat late = beat_at(500, std::nullopt);
  ASSERT_EQ(late.ranks_size(), 1);
  EXPECT_EQ(late.ranks(0).beat_age_ms(), 210u);
  ASSERT_EQ(beat_at(600, std::nullopt).ranks_size(), 1);
  EXPECT_EQ(beat_at(600 + 100, 7).ranks_size(), 1) << "back: its age went down";
  EXPECT_EQ(beat_at(800, 7).ranks_size(), 0);
  // A new session: its first beat carries every rank again.
  BreakAndReopen(1000);
  Welcome(true);
  ASSERT_TRUE(host_.to_manager.back().has_heartbeat());
  EXPECT_EQ(host_.to_manager.back().heartbeat().ranks_size(), 1);
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
      auto* mine = plan->add_ranks();
      mine->set_local_rank(0);
      mine->set_rank(0);
    });
  };
  auto vote = [&](uint64_t generation, int64_t step, uint64_t checksum = 0) {
    v1::TrainerMessage m;
    m.mutable_vote()->set_generation(generation);
    m.mutable_vote()->set_step(step);
    m.mutable_vote()->set_ok(true);
    m.mutable_vote()->set_checksum(checksum);
    core_.OnTrainerMessage(now_, 0, m);
  };
  start(3, 40, 0);
  vote(3, 41);
  v1::LocalRank r = Reported();
  EXPECT_EQ(r.voted_step(), 41);
  EXPECT_EQ(r.voted_epoch(), 1u);
  EXPECT_EQ(r.voted_generation(), 3u);
  EXPECT_EQ(r.committed_step(), 40);
  // The rest of the vote, with which a restarted manager finishes one whose every rank voted.
  EXPECT_EQ(r.voted_world_size(), 1u) << "the world size of the plan it was cast in";
  EXPECT_TRUE(r.voted_ok());
  EXPECT_EQ(r.voted_checksum(), 0u);
  ASSERT_TRUE(r.has_voted_rank()) << "its rank in that plan, by which checksums compare";
  EXPECT_EQ(r.voted_rank(), 0u);
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
  vote(7, 43, 99);  // a vote in a generation whose plan it never had: its size is not known
  r = Reported();
  EXPECT_EQ(r.voted_generation(), 7u);
  EXPECT_EQ(r.voted_world_size(), 0u);
  EXPECT_EQ(r.voted_checksum(), 99u);
  EXPECT_FALSE(r.has_voted_rank()) << "nor its rank";
  vote(4, 43);
  start(6, 43, 5);  // step 43 was committed by generation 5, which it was not in: dropped
  r = Reported();
  EXPECT_EQ(r.voted_generation(), 0u) << "settled by the plan";
  EXPECT_EQ(r.committed_step(), 42) << "its vote is dropped; the state comes from a peer";
}

// A script that does not use the regroup library never connects: when one of its trainers fails
// before any trainer here connected, a restart would fail the same way (issue 35: the manager
// waited out its join window and restarted everything, and nothing said why). The agent says so
// in one line with the recipe, tells the manager it leaves, stops the other trainers at once and
// exits with its own code, restarting nothing.
TEST_F(AgentCoreTest, ATrainerThatFailsBeforeAnyConnectedIsRefusedWithTheRecipe) {
  options_.nproc = 2;
  options_.script = {"train.py", "--epochs", "3"};
  AgentCore core(options_, &host_);
  core.Start(now_);
  core.OnSessionOpened(now_);
  At(1000);
  core.OnProcessExit(now_, 0, 1, 0);
  EXPECT_EQ(log_.Lines({"[error]", "local rank 0 (pid 100) exited with code 1", "train.py",
                        "does not use the regroup library", "regroup.init_process_group(...)",
                        "regroup.DataLoader(...)", "torchrun", "exiting 3"}),
            1)
      << log_.text();
  EXPECT_TRUE(core.stopping());
  EXPECT_EQ(host_.signals, (std::vector<std::pair<int, int>>{{100, SIGKILL}, {101, SIGTERM}}))
      << "its leftovers, then the other trainer at once";
  core.OnProcessExit(now_, 1, -1, SIGTERM);
  EXPECT_EQ(host_.exit_code, kExitScriptWithoutRegroup);
  EXPECT_EQ(host_.next_pid, 102) << "nothing restarted";
  EXPECT_EQ(log_.Lines({"does not use the regroup library", "[error]"}), 1) << "said once";
}

TEST_F(AgentCoreTest, ARefusedScriptTellsTheManagerItsExitAndThatThePodLeaves) {
  options_.script = {"train.py"};
  AgentCore core(options_, &host_);
  core.Start(now_);
  core.OnSessionOpened(now_);
  v1::ManagerMessage welcome;
  welcome.mutable_header()->set_job_id("job");
  welcome.mutable_header()->set_epoch(1);
  welcome.mutable_welcome()->set_epoch(1);
  core.OnManagerMessage(now_, welcome);
  host_.to_manager.clear();
  core.OnProcessExit(now_, 0, 1, 0);
  ASSERT_EQ(host_.to_manager.size(), 2u);
  EXPECT_EQ(host_.to_manager[0].process_exit().exit_code(), 1);
  ASSERT_TRUE(host_.to_manager[1].has_leave());
  EXPECT_NE(host_.to_manager[1].leave().reason().find("does not use the regroup library"),
            std::string::npos)
      << host_.to_manager[1].leave().reason();
  EXPECT_TRUE(core.leaving());
  EXPECT_EQ(host_.exit_code, kExitScriptWithoutRegroup);
}

// A trainer that connected uses the library: its exit is the manager's to recover, as always.
TEST_F(AgentCoreTest, ATrainerThatConnectedAndThenFailsIsReportedAndLeftToTheManager) {
  ConnectTrainer(v1::TrainerHello());
  core_.OnProcessExit(now_, 0, 1, 0);
  EXPECT_EQ(host_.Count(&v1::AgentMessage::has_process_exit), 1);
  EXPECT_EQ(host_.Count(&v1::AgentMessage::has_leave), 0);
  EXPECT_FALSE(core_.stopping());
  EXPECT_FALSE(host_.exit_code);
  EXPECT_EQ(log_.Lines({"regroup library"}), 0) << log_.text();
}

// Once any trainer here connected, the script uses the library: a restarted process that fails
// before its hello (a bad node, memory) is a fault to recover, not a script to refuse.
TEST_F(AgentCoreTest, AProcessThatFailsBeforeItsHelloIsNotRefusedOnceATrainerHereConnected) {
  ConnectTrainer(v1::TrainerHello());
  core_.OnProcessExit(now_, 0, 1, 0);
  v1::ManagerMessage restart;
  restart.mutable_header()->set_job_id("job");
  restart.mutable_header()->set_epoch(1);
  restart.mutable_restart()->add_local_ranks(0);
  core_.OnManagerMessage(now_, restart);
  ASSERT_EQ(host_.next_pid, 102) << "restarted";
  core_.OnProcessExit(now_, 0, 1, 0);  // pid 101, before its hello
  EXPECT_FALSE(core_.stopping());
  EXPECT_EQ(log_.Lines({"regroup library"}), 0) << log_.text();
}

// A stop of one manager incarnation only (fenced, or it gave up waiting for a decision) does
// not end the job: a newer incarnation may run it. The trainers still dump when told to, but the
// agent exits non-zero, so that its pod is restarted or replaced and finds the newer manager; an
// exit 0 would end the pod for good, and with every pod so ended no incarnation is left to end
// the job (the simulation, 12 faults a run, seed 300388 with a coordinator).
TEST_F(AgentCoreTest, AStopOfOneIncarnationOnlyEndsTheAgentNonZeroEvenWhenItDumps) {
  // The agent's exit code once it was told to stop and its trainer then exited 0.
  const auto exit_after = [&](v1::StopTraining::Mode mode, bool incarnation_only) {
    RecordingHost host;
    AgentCore core(options_, &host);
    core.Start(now_);
    core.OnSessionOpened(now_);
    v1::ManagerMessage stop;
    stop.mutable_header()->set_job_id("job");
    stop.mutable_header()->set_epoch(1);
    stop.mutable_stop()->set_mode(mode);
    stop.mutable_stop()->set_incarnation_only(incarnation_only);
    stop.mutable_stop()->set_reason("no decision: the coordinator was unreachable");
    core.OnManagerMessage(now_, stop);
    core.OnProcessExit(now_, 0, 0, 0);  // the trainer dumped (or left) and exited
    return host.exit_code;
  };
  for (const auto mode : {v1::StopTraining::MODE_DUMP, v1::StopTraining::MODE_LEAVE}) {
    const std::optional<int> code = exit_after(mode, true);
    ASSERT_TRUE(code) << v1::StopTraining::Mode_Name(mode);
    EXPECT_NE(*code, 0) << v1::StopTraining::Mode_Name(mode);
  }
  EXPECT_EQ(exit_after(v1::StopTraining::MODE_DUMP, false), 0) << "the job's own dump ends the pod with 0";
}

// A process killed by a signal says nothing of its script (the OOM killer, an operator).
TEST_F(AgentCoreTest, ATrainerKilledBeforeAnyConnectedIsNotRefused) {
  options_.script = {"train.py"};
  core_.Start(now_);
  core_.OnProcessExit(now_, 0, -1, SIGKILL);
  EXPECT_FALSE(core_.stopping());
  EXPECT_EQ(log_.Lines({"regroup library"}), 0) << log_.text();
}

// A script that never connects and succeeds trained without Regroup: it is done, as under
// torchrun, and one line says that Regroup recovered nothing for it.
TEST_F(AgentCoreTest, ATrainerThatFinishesWithoutConnectingIsDoneAndToldOnce) {
  options_.nproc = 2;
  options_.script = {"train.py"};
  AgentCore core(options_, &host_);
  core.Start(now_);
  core.OnProcessExit(now_, 0, 0, 0);
  core.OnProcessExit(now_, 1, 0, 0);
  EXPECT_FALSE(core.stopping());
  EXPECT_EQ(log_.Lines({"[warning]", "exited with code 0 and never connected", "train.py",
                        "without the regroup library", "regroup.init_process_group(...)"}),
            1)
      << log_.text();
  At(6000);
  core.OnTimers(now_);
  EXPECT_EQ(host_.exit_code, 0) << "training done";
}

// A trainer may take long to connect (a big model builds first): past --connect-timeout-s one
// warning says what it means and how to adopt the library; the trainer is not stopped.
TEST_F(AgentCoreTest, ATrainerThatRunsTheConnectTimeoutWithoutConnectingIsWarnedOnce) {
  options_.connect_timeout_s = 10;
  options_.script = {"train.py"};
  AgentCore core(options_, &host_);
  core.Start(now_);
  At(9000);
  core.OnTimers(now_);
  EXPECT_EQ(log_.Lines({"without connecting"}), 0);
  EXPECT_LE(core.NextDeadline(now_), Millis(10000)) << "woken at the bound";
  At(10000);
  core.OnTimers(now_);
  EXPECT_EQ(log_.Lines({"[warning]", "local rank 0 (pid 100) has run 10 s without connecting",
                        "--connect-timeout-s", "train.py", "regroup.init_process_group(...)",
                        "torchrun"}),
            1)
      << log_.text();
  At(30000);
  core.OnTimers(now_);
  EXPECT_EQ(log_.Lines({"without connecting"}), 1) << "once";
  EXPECT_FALSE(core.stopping());
  EXPECT_TRUE(host_.signals.empty()) << "not stopped";
}

// A trainer that connects within the bound is not warned about.
TEST_F(AgentCoreTest, ATrainerThatConnectsWithinTheConnectTimeoutIsNotWarned) {
  options_.connect_timeout_s = 10;
  ConnectTrainer(v1::TrainerHello());
  At(60000);
  core_.OnTimers(now_);
  EXPECT_EQ(log_.Lines({"without connecting"}), 0) << log_.text();
}

}  // namespace
}  // namespace regroup::agent
