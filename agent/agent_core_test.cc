// AgentCore without an operating system: a host that records what the core does, and a clock
// the test moves.
#include "agent/agent_core.h"

#include <gtest/gtest.h>

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

  AgentOptions options_;
  RecordingHost host_;
  AgentCore core_{options_, &host_};
  Millis now_{0};
};

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

}  // namespace
}  // namespace regroup::agent
