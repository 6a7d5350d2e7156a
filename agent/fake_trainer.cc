// SPDX-License-Identifier: Apache-2.0
// A trainer stand-in for the agent's end-to-end tests: it speaks the real framed protocol over
// $REGROUP_AGENT_SOCKET (hello, heartbeats, votes, faults, acks) and writes one line per reply
// it receives to <log>.rank<L>, so a test can see what reached each trainer.
//
//   regroup_fake_trainer --log PREFIX [--heartbeat-ms N] [--step-base N] [--vote-on-start]
//       [--ack] [--fault-on-start [--fault-detail-bytes N]] [--exit-rank R --exit-after-ms N --exit-code C]
//       [--finish-after-ms N] [--ignore-stop] [--ignore-sigterm] [--checksum N] [--votes N]
//       [--never-connect]
//
// --exit-rank: that rank exits with code C N ms after its hello, once (a marker file keeps its
// restarted process alive), first writing the CLOCK_REALTIME nanoseconds of its exit to
// <log>.rank<R>.exit_ns. --finish-after-ms: every rank exits 0 after N ms. A StopTraining with
// mode exit, dump or leave makes it exit 0 (unless --ignore-stop); standby keeps it waiting.
// --ignore-sigterm: only SIGKILL ends it. --vote-on-start votes for the plan's next step (rank L
// after L*100 ms) with checksum 100+L (or --checksum), and for the following step after each
// commit, --votes steps in all. --never-connect: a script that does not use the regroup library:
// it never connects; the --exit-rank exits N ms after its start, the others run until killed.
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <optional>
#include <string>

#include "common/framing.h"
#include "regroup/v1/wire.pb.h"

namespace {

namespace v1 = regroup::v1;
using Clock = std::chrono::steady_clock;

struct Flags {
  std::string log;
  int heartbeat_ms = 20;
  long step_base = 10;
  bool vote_on_start = false;
  bool ack = false;
  bool fault_on_start = false;
  size_t fault_detail_bytes = 0;  // 0: "allreduce failed"
  int exit_rank = -1;
  int exit_after_ms = 0;
  int exit_code = 0;
  int finish_after_ms = -1;
  bool ignore_stop = false;
  bool ignore_sigterm = false;
  bool never_connect = false;
  int64_t checksum = -1;  // -1: 100 + local rank
  int votes = 1;          // steps voted after each start (the next after each commit)
};

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

class Trainer {
 public:
  Trainer(Flags flags, int local_rank) : flags_(std::move(flags)), rank_(local_rank) {
    log_.open(flags_.log + ".rank" + std::to_string(rank_), std::ios::app);
  }

  void Line(const std::string& text) {
    log_ << text << std::endl;  // flushed: the test reads it while we run
  }

  bool Connect() {
    fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string path = Env("REGROUP_AGENT_SOCKET");
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
    for (int i = 0; i < 200; ++i) {
      if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return true;
      usleep(10000);
    }
    return false;
  }

  void Send(const v1::TrainerMessage& m) {
    if (!regroup::WriteFrame(fd_, m, 5000).ok()) {
      Line("write-failed");
      std::exit(4);
    }
  }

  int Run() {
    Line("env RANK=" + Env("RANK") + " LOCAL_RANK=" + Env("LOCAL_RANK") + " WORLD_SIZE=" +
         Env("WORLD_SIZE") + " LOCAL_WORLD_SIZE=" + Env("LOCAL_WORLD_SIZE") + " GROUP_RANK=" +
         Env("GROUP_RANK") + " MASTER_ADDR=" + Env("MASTER_ADDR") + " MASTER_PORT=" +
         Env("MASTER_PORT") + " REGROUP_LOCAL_RANK=" + Env("REGROUP_LOCAL_RANK") +
         " REGROUP_JOB_ID=" + Env("REGROUP_JOB_ID") + " REGROUP_POD_UID=" + Env("REGROUP_POD_UID"));
    if (flags_.never_connect) {
      if (rank_ == flags_.exit_rank) {
        usleep(static_cast<useconds_t>(flags_.exit_after_ms) * 1000);
        _exit(flags_.exit_code);
      }
      for (;;) pause();
    }
    if (!Connect()) {
      Line("connect-failed");
      return 5;
    }
    v1::TrainerMessage hello;
    hello.mutable_hello()->set_local_rank(static_cast<uint32_t>(rank_));
    hello.mutable_hello()->set_pid(getpid());
    hello.mutable_hello()->set_committed_step(-1);
    hello.mutable_hello()->set_heard_commit_step(-1);
    Send(hello);
    const auto started = Clock::now();
    auto next_beat = started;
    const std::string marker = flags_.log + ".rank" + std::to_string(rank_) + ".exited";
    const bool will_exit = rank_ == flags_.exit_rank && access(marker.c_str(), F_OK) != 0;
    for (;;) {
      const auto now = Clock::now();
      const auto since = std::chrono::duration_cast<std::chrono::milliseconds>(now - started);
      if (will_exit && since.count() >= flags_.exit_after_ms) {
        std::ofstream(marker) << "1";
        timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        std::ofstream(flags_.log + ".rank" + std::to_string(rank_) + ".exit_ns")
            << (int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec);
        _exit(flags_.exit_code);
      }
      if (flags_.finish_after_ms >= 0 && since.count() >= flags_.finish_after_ms) {
        Line("finished");
        return 0;
      }
      if (vote_at_ && now >= *vote_at_) {
        vote_at_.reset();
        v1::TrainerMessage vote;
        vote.mutable_vote()->set_generation(generation_);
        vote.mutable_vote()->set_step(step_);
        vote.mutable_vote()->set_ok(true);
        vote.mutable_vote()->set_checksum(flags_.checksum >= 0
                                              ? static_cast<uint64_t>(flags_.checksum)
                                              : 100 + static_cast<uint64_t>(rank_));
        Send(vote);
      }
      if (now >= next_beat) {
        v1::TrainerMessage beat;
        beat.mutable_heartbeat()->set_step(flags_.step_base + rank_);
        beat.mutable_heartbeat()->set_phase(v1::PHASE_COMPUTING);
        Send(beat);
        next_beat = now + std::chrono::milliseconds(flags_.heartbeat_ms);
      }
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 5) <= 0) continue;
      std::string payload;
      auto got = regroup::ReadFrame(fd_, &payload);
      if (!got.ok() || !*got) {
        Line("eof");
        return 3;
      }
      v1::AgentReply reply;
      if (!reply.ParseFromString(payload)) {
        Line("garbage");
        return 6;
      }
      if (int code = Handle(reply); code >= 0) return code;
    }
  }

 private:
  // Returns an exit code to stop with, or -1 to go on.
  int Handle(const v1::AgentReply& reply) {
    switch (reply.body_case()) {
      case v1::AgentReply::kWelcome:
        Line("welcome epoch=" + std::to_string(reply.welcome().epoch()));
        break;
      case v1::AgentReply::kStart: {
        const auto& s = reply.start();
        Line("start gen=" + std::to_string(s.plan().generation()) +
             " rank=" + std::to_string(s.assignment().rank()) +
             " local=" + std::to_string(s.assignment().local_rank()) +
             " directive=" + std::to_string(s.directive_id()));
        generation_ = s.plan().generation();
        step_ = s.plan().committed_step() + 1;
        votes_left_ = flags_.votes;
        if (flags_.vote_on_start && votes_left_-- > 0)
          vote_at_ = Clock::now() + std::chrono::milliseconds(100 * rank_);
        if (flags_.ack) {
          v1::TrainerMessage ack;
          ack.mutable_ack()->set_directive_id(s.directive_id());
          Send(ack);
        }
        if (flags_.fault_on_start) {
          v1::TrainerMessage fault;
          fault.mutable_fault()->set_kind(v1::FAULT_KIND_COLLECTIVE_ERROR);
          fault.mutable_fault()->set_generation(generation_);
          fault.mutable_fault()->set_step(step_);
          fault.mutable_fault()->set_detail(flags_.fault_detail_bytes
                                                ? std::string(flags_.fault_detail_bytes, 'x')
                                                : std::string("allreduce failed"));
          Send(fault);
        }
        break;
      }
      case v1::AgentReply::kAbort:
        Line("abort gen=" + std::to_string(reply.abort().generation()) +
             " epoch=" + std::to_string(reply.abort().epoch()));
        break;
      case v1::AgentReply::kOutcome:
        Line("outcome step=" + std::to_string(reply.outcome().step()) +
             " commit=" + std::to_string(reply.outcome().commit()));
        if (reply.outcome().commit() && reply.outcome().step() == step_ && votes_left_-- > 0) {
          ++step_;
          vote_at_ = Clock::now() + std::chrono::milliseconds(10);
        }
        break;
      case v1::AgentReply::kStop: {
        const auto mode = reply.stop().mode();
        Line("stop mode=" + v1::StopTraining::Mode_Name(mode));
        if (!flags_.ignore_stop &&
            (mode == v1::StopTraining::MODE_EXIT || mode == v1::StopTraining::MODE_DUMP ||
             mode == v1::StopTraining::MODE_LEAVE))
          return 0;
        break;
      }
      case v1::AgentReply::kPause:
        Line("pause timeout_ms=" + std::to_string(reply.pause().timeout_ms()));
        break;
      default:
        Line("empty");
        break;
    }
    return -1;
  }

  Flags flags_;
  int rank_;
  int fd_ = -1;
  std::ofstream log_;
  uint64_t generation_ = 0;
  int64_t step_ = 0;
  int votes_left_ = 0;
  std::optional<Clock::time_point> vote_at_;
};

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--log") flags.log = next();
    else if (a == "--heartbeat-ms") flags.heartbeat_ms = std::atoi(next().c_str());
    else if (a == "--step-base") flags.step_base = std::atol(next().c_str());
    else if (a == "--vote-on-start") flags.vote_on_start = true;
    else if (a == "--ack") flags.ack = true;
    else if (a == "--fault-on-start") flags.fault_on_start = true;
    else if (a == "--fault-detail-bytes") flags.fault_detail_bytes = std::strtoul(next().c_str(), nullptr, 10);
    else if (a == "--exit-rank") flags.exit_rank = std::atoi(next().c_str());
    else if (a == "--exit-after-ms") flags.exit_after_ms = std::atoi(next().c_str());
    else if (a == "--exit-code") flags.exit_code = std::atoi(next().c_str());
    else if (a == "--finish-after-ms") flags.finish_after_ms = std::atoi(next().c_str());
    else if (a == "--ignore-stop") flags.ignore_stop = true;
    else if (a == "--ignore-sigterm") flags.ignore_sigterm = true;
    else if (a == "--never-connect") flags.never_connect = true;
    else if (a == "--checksum") flags.checksum = std::atoll(next().c_str());
    else if (a == "--votes") flags.votes = std::atoi(next().c_str());
    else {
      std::fprintf(stderr, "fake trainer: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (flags.log.empty()) {
    std::fprintf(stderr, "fake trainer: --log is required\n");
    return 2;
  }
  if (flags.ignore_sigterm) signal(SIGTERM, SIG_IGN);
  Trainer trainer(flags, std::atoi(Env("LOCAL_RANK").c_str()));
  return trainer.Run();
}
