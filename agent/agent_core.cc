// SPDX-License-Identifier: Apache-2.0
#include "agent/agent_core.h"

#include <signal.h>

#include <algorithm>
#include <cstring>

#include <spdlog/fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "common/text.h"

namespace regroup::agent {

namespace v1 = regroup::v1;

namespace {

constexpr Millis kFirstBackoff{100};
constexpr Millis kMaxBackoff{500};  // as the channel's own (grpc_settings.cc)
constexpr Millis kRegisterTimeout{5000};
constexpr Millis kConnectReport{5000};
constexpr Millis kDoneWait{5000};
constexpr Millis kKillAfterTerm{5000};  // after a directive's grace: SIGTERM, then SIGKILL
constexpr Millis kMaxWait{1000};        // NextDeadline's furthest
constexpr size_t kMaxPending = 1024;
// How often a pod declared lost comes back as its own replacement before it stops for good (a
// flapping node is then replaced by the scheduler instead).
constexpr int kMaxReadmissions = 5;

// What makes a script one Regroup recovers, said wherever a trainer never connects.
constexpr char kAdoptRecipe[] =
    "adopt it in five lines: import regroup; regroup.init_process_group(...) in place of "
    "torch.distributed.init_process_group; regroup.DDP(...) in place of DDP(...); "
    "regroup.optimizer(opt); regroup.DataLoader(...) in place of DataLoader(...) "
    "(python/README.md, 'The drop-in'); or run it under torchrun";

const char* ModeName(v1::StopTraining::Mode mode) {
  switch (mode) {
    case v1::StopTraining::MODE_EXIT: return "exit";
    case v1::StopTraining::MODE_DUMP: return "dump";
    case v1::StopTraining::MODE_STANDBY: return "standby";
    case v1::StopTraining::MODE_LEAVE: return "leave";
    default: return "unspecified";
  }
}

std::string DescribeExit(const v1::ProcessExit& exit) {
  return exit.signal() != 0 ? fmt::format("local rank {} killed by signal {}", exit.local_rank(),
                                          exit.signal())
                            : fmt::format("local rank {} exited with code {}", exit.local_rank(),
                                          exit.exit_code());
}

const char* BodyName(const v1::ManagerMessage& m) {
  switch (m.body_case()) {
    case v1::ManagerMessage::kWelcome: return "Welcome";
    case v1::ManagerMessage::kStart: return "StartGeneration";
    case v1::ManagerMessage::kAbort: return "AbortGeneration";
    case v1::ManagerMessage::kOutcome: return "StepOutcome";
    case v1::ManagerMessage::kStop: return "StopTraining";
    case v1::ManagerMessage::kRestart: return "RestartProcesses";
    case v1::ManagerMessage::kRefusal: return "Refusal";
    default: return "an empty message";
  }
}

}  // namespace

AgentCore::AgentCore(const AgentOptions& options, AgentHost* host)
    : options_(options), host_(host), uid_(options.pod_uid), node_rank_(options.node_rank) {
  ranks_.resize(static_cast<size_t>(std::max(options.nproc, 0)));
}

void AgentCore::Start(Millis now) {
  now_ = now;
  for (uint32_t r = 0; r < ranks_.size(); ++r) StartChild(r);
  outage_since_ = now;  // the reconnect timeout also bounds the wait for a first manager
  Connect();
}

bool AgentCore::every_trainer_heard() const {
  return std::all_of(ranks_.begin(), ranks_.end(), [](const Rank& x) { return x.heard; });
}

// ---------------------------------------------------------------------------------------------
// Timers
// ---------------------------------------------------------------------------------------------

Millis AgentCore::NextDeadline(Millis now) const {
  Millis next = now + kMaxWait;
  auto consider = [&](Millis t) { next = std::min(next, t); };
  if (exit_code_) return next;
  if (link_ == Link::kUp) consider(next_heartbeat_);
  if (pause_at_ && link_ != Link::kRegistering) consider(*pause_at_);
  if (link_ == Link::kDown && !session_) consider(reconnect_at_);
  if (link_ == Link::kRegistering) consider(register_deadline_);
  if (link_ == Link::kConnecting && !stopping_) consider(connect_report_at_);
  if (stopping_) {
    if (!stopping_->termed) consider(stopping_->term_at);
    if (!stopping_->killed) consider(stopping_->kill_at);
    consider(stopping_->give_up_at);
  } else {
    if (outage_since_) consider(*outage_since_ + std::chrono::seconds(options_.reconnect_timeout_s));
    if (done_at_) consider(*done_at_);
    for (uint32_t r = 0; r < ranks_.size(); ++r)
      if (Live(r) && !ranks_[r].heard && !ranks_[r].connect_warned)
        consider(ConnectDeadline(ranks_[r]));
  }
  return next;
}

Millis AgentCore::ConnectDeadline(const Rank& k) const {
  return k.started + std::chrono::seconds(options_.connect_timeout_s);
}

std::string AgentCore::ScriptName() const {
  if (options_.script.empty()) return "the training script";
  return (options_.module ? "module " : "") + options_.script[0];
}

// Not stopped: a big model may take longer to build than the bound.
void AgentCore::WarnUnconnected(Millis now) {
  for (uint32_t r = 0; r < ranks_.size(); ++r) {
    Rank& k = ranks_[r];
    if (!Live(r) || k.heard || k.connect_warned || now < ConnectDeadline(k)) continue;
    k.connect_warned = true;
    spdlog::warn("local rank {} (pid {}) has run {} s without connecting to this agent "
                 "(--connect-timeout-s): no generation can take it in, so nothing trains under "
                 "Regroup yet; {} does not use the regroup library if it never connects, and "
                 "Regroup cannot recover it: {}",
                 r, k.pid, (now - k.started).count() / 1000, ScriptName(), kAdoptRecipe);
  }
}

void AgentCore::OnTimers(Millis now) {
  now_ = now;
  if (exit_code_) return;
  if (stopping_) {
    if (!stopping_->termed && now >= stopping_->term_at) {
      stopping_->termed = true;
      if (AnyAlive()) {
        spdlog::warn("sending SIGTERM to the trainers still running ({})", stopping_->reason);
        SignalAll(SIGTERM);
      }
    }
    if (!stopping_->killed && now >= stopping_->kill_at) {
      stopping_->killed = true;
      if (AnyAlive()) {
        spdlog::warn("sending SIGKILL to the trainers still running ({})", stopping_->reason);
        SignalAll(SIGKILL);
      }
    }
    if (now >= stopping_->give_up_at) {
      spdlog::error("trainers still running after SIGKILL; exiting without them");
      Finish(stopping_->exit_code);
      return;
    }
  } else if (done_at_ && now >= *done_at_) {
    spdlog::info("training done; no acknowledgement from the manager in {} ms",
                 kDoneWait.count());
    Finish(0);
    return;
  } else if (outage_since_ &&
             now - *outage_since_ >= std::chrono::seconds(options_.reconnect_timeout_s)) {
    const std::string why = host_->ConnectFailure();
    spdlog::error("no manager at {} for {} s (--reconnect-timeout-s){}: stopping the trainers "
                  "and exiting",
                  options_.manager_addr, options_.reconnect_timeout_s,
                  why.empty() ? "" : " (" + why + ")");
    outage_since_.reset();
    BeginStop(1, "the manager is gone", /*wait_for_trainers=*/false);
    return;  // BeginStop ran the timers again
  }
  if (exit_code_) return;
  if (!stopping_) WarnUnconnected(now);
  // A Register in flight told the manager the trainers are still in their generation (it may
  // resume it): they are paused only once the answer is not a resumed session.
  if (pause_at_ && now >= *pause_at_ && link_ != Link::kRegistering) {
    pause_at_.reset();
    spdlog::warn("no session with the manager for {} ms (its liveness timeout): trainers paused",
                 liveness_timeout_.count());
    PauseTrainers(pause_reason_);
    paused_since_welcome_ = true;
  }

  // The manager link, kept up while stopping too: the exits of the last trainers and the
  // heartbeats of a slow dump still reach the manager.
  if (link_ == Link::kDown && !session_ && now >= reconnect_at_) Connect();
  if (link_ == Link::kConnecting && !stopping_ && now >= connect_report_at_) {
    const std::string why = host_->ConnectFailure();
    spdlog::warn("no manager answers at {} yet{}; giving up in {} ms", options_.manager_addr,
                 why.empty() ? "" : ": " + why, OutageLeftMs());
    connect_report_at_ = now + kConnectReport;
  }
  if (link_ == Link::kRegistering && now >= register_deadline_) {
    spdlog::warn("no Welcome from the manager within {} ms of registering; reconnecting",
                 kRegisterTimeout.count());
    register_deadline_ = now + kRegisterTimeout;  // the cancel leads to OnSessionClosed
    if (session_) host_->CancelSession();
  }
  if (link_ == Link::kUp && now >= next_heartbeat_) {
    SendHeartbeat();
    next_heartbeat_ += heartbeat_interval_;
    if (next_heartbeat_ <= now) next_heartbeat_ = now + heartbeat_interval_;
  }
}

// ---------------------------------------------------------------------------------------------
// Children
// ---------------------------------------------------------------------------------------------

void AgentCore::StartChild(uint32_t r) {
  Rank& k = ranks_[r];
  StatusOr<int> pid = host_->StartProcess(r);
  k.started = now_;
  k.heard = false;
  k.connect_warned = false;
  k.cpu_ms = -1;
  k.cpu_grew = now_;
  k.step = 0;
  k.phase = v1::PHASE_STARTING;
  k.generation = 0;
  k.committed_step = -1;
  k.heard_commit_step = -1;
  k.heard_commit_epoch = k.heard_commit_generation = 0;
  k.ForgetVote();
  k.restart_pending = false;
  if (!pid.ok()) {
    spdlog::error("local rank {}: {}", r, pid.status().message());
    k.alive = false;
    k.exited = true;
    k.exit_code = 127;
    k.exit_signal = 0;
    v1::AgentMessage m = NewMessage();
    auto* exit = m.mutable_process_exit();
    exit->set_local_rank(r);
    exit->set_exit_code(127);
    SendEvent(std::move(m));
    return;
  }
  k.pid = *pid;
  k.alive = true;
  k.exited = false;
  k.exit_code = 0;
  k.exit_signal = 0;
}

std::optional<uint32_t> AgentCore::RankOfPid(int pid) const {
  for (uint32_t r = 0; r < ranks_.size(); ++r)
    if (ranks_[r].alive && ranks_[r].pid == pid) return r;
  return std::nullopt;
}

void AgentCore::OnProcessExit(Millis now, uint32_t r, int exit_code, int signal) {
  now_ = now;
  if (exit_code_ || r >= ranks_.size()) return;
  Rank& k = ranks_[r];
  k.alive = false;
  k.exited = true;
  k.exit_code = exit_code;
  k.exit_signal = signal;
  host_->Signal(k.pid, SIGKILL);  // what the trainer left behind in its group
  if (k.restart_pending) {
    k.restart_pending = false;
    spdlog::info("local rank {} (pid {}) stopped for its restart", r, k.pid);
    if (!stopping_) {
      StartChild(r);
    } else if (!AnyAlive()) {
      Finish(stopping_->exit_code);
    }
    return;
  }
  // Failed by itself before any trainer here ever connected: the script does not use the
  // library. One killed by a signal says nothing of its script (the OOM killer, a fault).
  const bool without_regroup = !k.heard && !any_connected_ && !stopping_;
  const bool refuse = without_regroup && k.exit_signal == 0 && k.exit_code != 0;
  if (refuse) {
    spdlog::error("local rank {} (pid {}) exited with code {} and never connected to this agent, "
                  "nor did any other trainer here: {} does not use the regroup library (or "
                  "fails before it connects), and Regroup cannot recover a script that does "
                  "not use its library: {}. Stopping the other trainers and exiting {}, with no "
                  "restart",
                  r, k.pid, k.exit_code, ScriptName(), kAdoptRecipe, kExitScriptWithoutRegroup);
  } else if (without_regroup && k.exit_signal == 0 && !told_no_regroup_) {
    told_no_regroup_ = true;
    spdlog::warn("local rank {} (pid {}) exited with code 0 and never connected to this agent: "
                 "{} ran without the regroup library, so Regroup recovered nothing for it: {}",
                 r, k.pid, ScriptName(), kAdoptRecipe);
  } else if (k.exit_signal != 0) {
    spdlog::warn("local rank {} (pid {}) killed by signal {} ({}) at step {}", r, k.pid,
                 k.exit_signal, strsignal(k.exit_signal), k.step);
  } else if (k.exit_code != 0) {
    spdlog::warn("local rank {} (pid {}) exited with code {} at step {}", r, k.pid, k.exit_code,
                 k.step);
  } else {
    spdlog::info("local rank {} (pid {}) exited with code 0 at step {}", r, k.pid, k.step);
  }
  v1::AgentMessage m = NewMessage();
  auto* exit = m.mutable_process_exit();
  exit->set_local_rank(r);
  exit->set_exit_code(k.exit_code);
  exit->set_signal(k.exit_signal);
  exit->set_step(k.step);
  SendEvent(std::move(m));
  CheckVotes();

  if (refuse) {
    RefuseScriptWithoutRegroup(r);
    return;
  }
  if (stopping_) {
    if (!AnyAlive()) Finish(stopping_->exit_code);
    return;
  }
  const bool all_done = std::all_of(ranks_.begin(), ranks_.end(), [](const Rank& x) {
    return !x.alive && !x.restart_pending && x.exited && x.exit_code == 0 && x.exit_signal == 0;
  });
  if (all_done && !done_at_) {
    spdlog::info("every trainer exited with code 0: training is done; waiting up to {} ms for the "
                 "manager's acknowledgement",
                 kDoneWait.count());
    done_at_ = now_ + kDoneWait;
  }
}

bool AgentCore::AnyAlive() const {
  return std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& k) { return k.alive; });
}

void AgentCore::SignalAll(int signal) {
  for (const Rank& k : ranks_)
    if (k.alive) host_->Signal(k.pid, signal);
}

void AgentCore::OnTerminateSignal(Millis now, const char* name) {
  now_ = now;
  if (exit_code_) return;
  if (stopping_) {
    if (!stopping_->killed && AnyAlive()) {
      spdlog::warn("{} again while stopping: killing the trainers now", name);
      stopping_->termed = stopping_->killed = true;
      SignalAll(SIGKILL);
    }
    return;
  }
  if (done_at_) {
    Finish(0);
    return;
  }
  if (leaving_) {
    spdlog::warn("{} again while leaving: stopping the trainers now", name);
    BeginStop(1, std::string(name) + " twice", /*wait_for_trainers=*/false);
    return;
  }
  if (link_ == Link::kUp) {
    spdlog::info("{}: asking the manager to let this pod leave at the next step boundary", name);
    leaving_ = true;
    v1::AgentMessage m = NewMessage();
    m.mutable_leave()->set_reason(name);
    SendEvent(std::move(m));
    return;
  }
  spdlog::warn("{} with no manager connected: stopping the trainers (grace {} s)", name,
               options_.stop_grace_s);
  BeginStop(1, std::string(name) + " with no manager", /*wait_for_trainers=*/false);
}

void AgentCore::BeginStop(int exit_code, std::string reason, bool wait_for_trainers) {
  if (stopping_) return;
  const Millis grace = std::chrono::seconds(options_.stop_grace_s);
  Stopping s{exit_code, std::move(reason), {}, {}, {}};
  s.term_at = wait_for_trainers ? now_ + grace : now_;
  s.kill_at = s.term_at + (wait_for_trainers ? std::min(grace, kKillAfterTerm) : grace);
  s.give_up_at = s.kill_at + kKillAfterTerm;
  stopping_ = std::move(s);
  done_at_.reset();
  if (!AnyAlive()) {
    Finish(exit_code);
    return;
  }
  OnTimers(now_);  // SIGTERM at once when not waiting
}

// Not the recovery ladder: a restart would fail the same way. The manager hears the exit and a
// Leave (it lets a pod that is in no generation go at once), the other trainers, waiting for a
// peer, are stopped now, and the agent exits with its own code.
void AgentCore::RefuseScriptWithoutRegroup(uint32_t r) {
  v1::AgentMessage m = NewMessage();
  m.mutable_leave()->set_reason("local rank " + std::to_string(r) + " exited before any trainer " +
                                "connected: " + ScriptName() + " does not use the regroup library");
  SendEvent(std::move(m));
  leaving_ = true;
  BeginStop(kExitScriptWithoutRegroup, "its script was refused", /*wait_for_trainers=*/false);
}

void AgentCore::Finish(int exit_code) {
  if (exit_code_) return;
  exit_code_ = exit_code;
  // Every trainer exit this agent saw must reach the manager, or be named here as lost: the
  // manager would otherwise never learn how a rank ended.
  if (session_ && link_ == Link::kUp) {
    host_->Exit(exit_code, /*confirm=*/true,
                sent_exits_.empty() ? "none" : fmt::format("{}", fmt::join(sent_exits_, "; ")));
    return;
  }
  std::vector<std::string> lost;
  for (const v1::AgentMessage& m : pending_)
    if (m.has_process_exit()) lost.push_back(DescribeExit(m.process_exit()));
  if (!lost.empty())
    spdlog::error("no session with the manager: these process exits never reached it: {}",
                  fmt::join(lost, "; "));
  host_->Exit(exit_code, /*confirm=*/false, "");
}

// ---------------------------------------------------------------------------------------------
// The manager
// ---------------------------------------------------------------------------------------------

void AgentCore::Connect() {
  session_ = true;
  sent_exits_.clear();
  link_ = Link::kConnecting;
  connect_report_at_ = now_ + kConnectReport;
  spdlog::debug("manager session: connecting to {}", options_.manager_addr);
  host_->OpenSession();
}

void AgentCore::OnSessionOpened(Millis now) {
  now_ = now;
  if (exit_code_ || !session_) return;
  // Register is built now, so it carries the trainers' states of the moment the stream opened.
  link_ = Link::kRegistering;
  register_deadline_ = now_ + kRegisterTimeout;
  host_->SendToManager(BuildRegister());
  spdlog::debug("manager session: registering with {}", options_.manager_addr);
}

void AgentCore::OnSessionClosed(Millis now, const std::string& detail, bool ended_by_manager) {
  now_ = now;
  if (exit_code_) return;
  const bool was_up = link_ == Link::kUp;
  session_ = false;
  link_ = Link::kDown;
  if (done_at_ && ended_by_manager) {
    spdlog::info("training done; the manager ended the session");
    Finish(0);
    return;
  }
  // Training done but the stream broke: the trainers' exits may not have reached the manager,
  // so the session is resumed to send them again (until done_at_, as for an acknowledgement).
  if (reregister_now_) {
    reregister_now_ = false;
    Connect();
    return;
  }
  if (stopping_) {
    spdlog::warn("lost the manager while stopping ({}); reconnecting", detail);
  } else if (leaving_) {
    spdlog::warn("lost the manager while leaving ({}): stopping the trainers", detail);
    BeginStop(1, "the manager was lost while leaving", /*wait_for_trainers=*/false);
    if (exit_code_) return;
  } else {
    if (!outage_since_) outage_since_ = now_;
    const bool first_loss = !lost_;
    lost_ = true;
    if (was_up) {
      spdlog::warn("the session with the manager at {} broke ({}); resuming it; the trainers "
                   "pause in {} ms unless it is back, and the agent gives up in {} ms",
                   options_.manager_addr, detail, liveness_timeout_.count(), OutageLeftMs());
      pause_at_ = now_ + liveness_timeout_;
      pause_reason_ = "the manager is unreachable: " + detail;
      resume_pending_ = true;
    } else if (first_loss) {
      spdlog::warn("the manager at {} is unreachable ({}); trainers paused; reconnecting, giving "
                   "up in {} ms",
                   options_.manager_addr, detail, OutageLeftMs());
      PauseTrainers("the manager is unreachable: " + detail);
    } else {
      spdlog::debug("manager still unreachable ({}); retrying in {} ms", detail, backoff_.count());
    }
  }
  reconnect_at_ = now_ + backoff_;
  backoff_ = std::min(backoff_ * 2, kMaxBackoff);
}

int64_t AgentCore::OutageLeftMs() const {
  if (!outage_since_) return options_.reconnect_timeout_s * int64_t{1000};
  const Millis left = *outage_since_ + std::chrono::seconds(options_.reconnect_timeout_s) - now_;
  return std::max<int64_t>(0, left.count());
}

void AgentCore::OnManagerMessage(Millis now, const v1::ManagerMessage& message) {
  now_ = now;
  if (exit_code_) return;
  const v1::Header& h = message.header();
  if (h.epoch() < epoch_) {
    spdlog::warn("ignoring {} from epoch {} (sender {}): this agent follows epoch {}",
                 BodyName(message), h.epoch(), h.sender(), epoch_);
    return;
  }
  if (!options_.job_id.empty() && !h.job_id().empty() && h.job_id() != options_.job_id) {
    spdlog::warn("ignoring {} for job {}: this agent belongs to job {}", BodyName(message),
                 h.job_id(), options_.job_id);
    return;
  }
  if (h.epoch() > epoch_) {
    if (epoch_ != 0) spdlog::info("following epoch {} (was {})", h.epoch(), epoch_);
    epoch_ = h.epoch();
    generation_ = h.generation();
  } else {
    generation_ = std::max(generation_, h.generation());
  }
  switch (message.body_case()) {
    case v1::ManagerMessage::kWelcome: OnWelcome(message.welcome()); break;
    case v1::ManagerMessage::kStart: OnStart(message.start()); break;
    case v1::ManagerMessage::kAbort: OnAbort(message.abort()); break;
    case v1::ManagerMessage::kOutcome: OnOutcome(message.outcome()); break;
    case v1::ManagerMessage::kStop: OnStop(message.stop()); break;
    case v1::ManagerMessage::kRestart: OnRestart(message.restart()); break;
    case v1::ManagerMessage::kRefusal: OnRefusal(message.refusal()); break;
    default: spdlog::warn("ignoring a manager message with no body"); break;
  }
}

void AgentCore::OnWelcome(const v1::Welcome& welcome) {
  if (welcome.epoch() < epoch_) {
    spdlog::warn("ignoring a Welcome for epoch {}: this agent follows epoch {}", welcome.epoch(),
                 epoch_);
    return;
  }
  const uint64_t old_epoch = started_epoch_,
                 old_generation = tally_.active() ? tally_.generation() : 0;
  epoch_ = welcome.epoch();
  generation_ = std::max(generation_, welcome.generation());
  node_rank_ = static_cast<int>(welcome.node_rank());
  heartbeat_interval_ =
      Millis(welcome.heartbeat_interval_ms() > 0 ? welcome.heartbeat_interval_ms() : 100);
  if (welcome.liveness_timeout_ms() > 0) liveness_timeout_ = Millis(welcome.liveness_timeout_ms());
  link_ = Link::kUp;
  backoff_ = kFirstBackoff;
  outage_since_.reset();
  lost_ = false;
  // Registered anew after a broken session (a restarted manager, or too late): the generation
  // the trainers are in is gone. Abort it, so that a rank waiting in one of its collectives for
  // a peer that already left comes out at once (a pause would leave it there until the hang
  // timeout), rather than wait for an outcome that will not come.
  if (resume_pending_ && !welcome.resumed() && old_generation > 0) {
    AbortTrainers(old_epoch, old_generation,
                  "the session with the manager was not resumed (" + pause_reason_ +
                      "): generation " + std::to_string(old_generation) + " of epoch " +
                      std::to_string(old_epoch) + " is gone");
  } else if (resume_pending_ && !welcome.resumed()) {
    PauseTrainers(pause_reason_);
  }
  resume_pending_ = false;
  paused_since_welcome_ = false;
  pause_at_.reset();
  spdlog::info("{} with the manager at {}: node rank {}, epoch {}, generation {}, "
               "heartbeat every {} ms",
               welcome.resumed() ? "resumed the session" : "registered", options_.manager_addr,
               node_rank_, epoch_, generation_, heartbeat_interval_.count());
  // Resumed: what the broken stream may have lost goes again (the manager ignores what it
  // already has). Registered anew: the Register carried the trainers' states instead.
  std::deque<v1::AgentMessage> again;
  again.swap(unconfirmed_);
  if (welcome.resumed())
    for (v1::AgentMessage& m : again) {
      *m.mutable_header() = NewMessage().header();
      SendEvent(std::move(m));
    }
  while (!pending_.empty()) {
    v1::AgentMessage m = std::move(pending_.front());
    pending_.pop_front();
    // The header is the one of now: the epoch these events are reported to.
    *m.mutable_header() = NewMessage().header();
    SendEvent(std::move(m));
  }
  // The manager knows the ranks from the Register: the first beat of a session says them all.
  beat_said_.clear();
  beat_age_said_.clear();
  SendHeartbeat();
  next_heartbeat_ = now_ + heartbeat_interval_;
}

void AgentCore::OnStart(const v1::StartGeneration& start) {
  const v1::GenerationPlan& plan = start.plan();
  if (plan.epoch() != 0 && plan.epoch() < epoch_) {
    spdlog::warn("ignoring StartGeneration of generation {} planned in epoch {}: this agent "
                 "follows epoch {}",
                 plan.generation(), plan.epoch(), epoch_);
    return;
  }
  generation_ = std::max(generation_, plan.generation());
  last_generation_agents_ = plan.agents();
  if (stopping_) {
    spdlog::warn("ignoring StartGeneration of generation {}: stopping", plan.generation());
    return;
  }
  std::vector<uint32_t> assigned, standby;
  for (uint32_t r = 0; r < ranks_.size(); ++r) {
    const v1::RankAssignment* mine = nullptr;
    for (const auto& a : plan.ranks())
      if (a.local_rank() == r) mine = &a;
    v1::AgentReply reply;
    if (mine != nullptr) {
      auto* s = reply.mutable_start();
      s->set_directive_id(start.directive_id());
      *s->mutable_plan() = plan;
      *s->mutable_assignment() = *mine;
      assigned.push_back(r);
    } else {
      auto* s = reply.mutable_stop();
      s->set_directive_id(start.directive_id());
      s->set_mode(v1::StopTraining::MODE_STANDBY);
      s->set_reason("local rank " + std::to_string(r) + " has no place in generation " +
                    std::to_string(plan.generation()));
      standby.push_back(r);
    }
    ranks_[r].standing = reply;
    if (ranks_[r].restart_pending) continue;  // its new process gets it after its hello
    Deliver(r, reply);
  }
  for (const auto& a : plan.ranks())
    if (a.local_rank() >= ranks_.size())
      spdlog::warn("generation {} assigns local rank {}, but this agent runs {} processes",
                   plan.generation(), a.local_rank(), ranks_.size());
  tally_.Start(plan.generation(), assigned);
  started_epoch_ = plan.epoch() ? plan.epoch() : epoch_;
  ForgetConfirmed(/*votes=*/true, /*exits=*/true);
  spdlog::info("generation {} (epoch {}): world size {}, committed step {}, local ranks {} "
               "training, {} standing by; {}",
               plan.generation(), plan.epoch(), plan.world_size(), plan.committed_step(),
               assigned, standby, plan.reason());
}

void AgentCore::OnAbort(const v1::AbortGeneration& abort) {
  spdlog::info("generation {} aborted, back to step {}: {}", abort.generation(),
               abort.committed_step(), abort.reason());
  v1::AgentReply reply;
  *reply.mutable_abort() = abort;
  DeliverAll(reply);
  ForgetConfirmed(/*votes=*/true, /*exits=*/true);
  if (!tally_.active() || abort.generation() >= tally_.generation()) LeaveGeneration();
  // The answer: this pod is here and has passed the abort on. Once every pod a fault does not
  // name has answered, the decision maker decides without waiting out its report window.
  v1::AgentMessage ack = NewMessage();
  ack.mutable_ack()->set_directive_id(abort.directive_id());
  SendEvent(std::move(ack));
}

void AgentCore::OnOutcome(const v1::StepOutcome& outcome) {
  spdlog::debug("step {} of generation {}: {}", outcome.step(), outcome.generation(),
                outcome.commit() ? "commit" : "roll back");
  v1::AgentReply reply;
  *reply.mutable_outcome() = outcome;
  for (uint32_t r = 0; r < ranks_.size(); ++r) {
    if (!host_->TrainerConnected(r)) continue;
    Deliver(r, reply);
    if (outcome.commit()) {
      // What this trainer now holds: it applies a step once it hears commit.
      Rank& k = ranks_[r];
      if (outcome.step() > k.heard_commit_step) {  // and which generation committed it
        k.heard_commit_step = outcome.step();
        k.heard_commit_epoch = started_epoch_;
        k.heard_commit_generation = outcome.generation();
      }
      k.committed_step = std::max(k.committed_step, outcome.step());
    }
    // The outcome of its vote: it applies the step or drops it.
    Rank& k = ranks_[r];
    if (k.voted_generation == outcome.generation() && k.voted_step <= outcome.step())
      k.ForgetVote();
  }
  tally_.Settle(outcome.generation(), outcome.step());
  std::erase_if(unconfirmed_, [&](const v1::AgentMessage& m) {
    return m.has_votes() && (m.votes().generation() < outcome.generation() ||
                             (m.votes().generation() == outcome.generation() &&
                              m.votes().step() <= outcome.step()));
  });
}

void AgentCore::OnStop(const v1::StopTraining& stop) {
  spdlog::info("StopTraining ({}{}): {}", ModeName(stop.mode()),
               stop.incarnation_only()
                   ? ", this manager incarnation only: the job may go on under a newer one"
                   : "",
               stop.reason());
  v1::AgentReply reply;
  *reply.mutable_stop() = stop;
  for (uint32_t r = 0; r < ranks_.size(); ++r) {
    ranks_[r].standing = reply;
    Deliver(r, reply);
  }
  if (done_at_) {
    spdlog::info("training done; the manager acknowledged");
    Finish(0);
    return;
  }
  // One incarnation's stop does not end the job: the pod must come back (restarted or replaced)
  // to whichever incarnation runs it next, so the agent exits non-zero even after a dump. An
  // exit 0 would end the pod for good.
  const int done = stop.incarnation_only() ? 1 : 0;
  switch (stop.mode()) {
    case v1::StopTraining::MODE_STANDBY: tally_.Clear(); break;
    case v1::StopTraining::MODE_DUMP: BeginStop(done, "dump", /*wait_for_trainers=*/true); break;
    case v1::StopTraining::MODE_LEAVE: BeginStop(done, "leave", /*wait_for_trainers=*/true); break;
    case v1::StopTraining::MODE_EXIT: BeginStop(1, "exit", /*wait_for_trainers=*/true); break;
    default:
      spdlog::warn("StopTraining without a mode: treated as exit");
      BeginStop(1, "exit", /*wait_for_trainers=*/true);
      break;
  }
}

void AgentCore::OnRestart(const v1::RestartProcesses& restart) {
  if (stopping_) {
    spdlog::warn("ignoring RestartProcesses {}: stopping", restart.local_ranks());
    return;
  }
  spdlog::info("restarting local ranks {} on the manager's order: {}", restart.local_ranks(),
               restart.reason());
  done_at_.reset();
  ForgetConfirmed(/*votes=*/false, /*exits=*/true);
  for (uint32_t r : restart.local_ranks()) {
    if (r >= ranks_.size()) {
      spdlog::warn("RestartProcesses names local rank {}, but this agent runs {} processes", r,
                   ranks_.size());
      continue;
    }
    Rank& k = ranks_[r];
    k.standing.reset();  // the new process waits for the next generation
    if (k.restart_pending) continue;
    if (k.alive) {
      k.restart_pending = true;
      host_->Signal(k.pid, SIGKILL);  // started again once reaped (OnProcessExit)
    } else {
      StartChild(r);
    }
  }
  CheckVotes();
}

void AgentCore::OnRefusal(const v1::Refusal& refusal) {
  spdlog::warn("the manager refused a message: {} (its epoch {}, generation {}, directive {})",
               refusal.reason(), refusal.epoch(), refusal.generation(), refusal.directive_id());
  if (refusal.fenced() && refusal.readmit() && readmissions_ < kMaxReadmissions && !stopping_ &&
      !leaving_) {
    Readmit(refusal.reason());
    return;
  }
  if (refusal.fenced()) {
    // Declared lost while it could not be reached: the job went on without this pod, so its
    // trainers' state is stale. Stop; the job controller's replacement registers anew.
    spdlog::error("the manager declared this pod lost: stopping the trainers and exiting");
    BeginStop(1, "declared lost by the manager: " + refusal.reason(), /*wait_for_trainers=*/false);
    return;
  }
  if (refusal.epoch() > epoch_) {
    spdlog::info("this agent is behind (epoch {} < {}): registering again", epoch_,
                 refusal.epoch());
    epoch_ = refusal.epoch();
    generation_ = refusal.generation();
    reregister_now_ = true;
    if (session_) host_->CancelSession();
  }
}

// Declared lost, but alive (it was paused, or cut off, for longer than the liveness timeout):
// the job went on without this pod, so its trainers' generation is over and their state is
// stale. They leave that generation at once, and the pod registers again as a new incarnation,
// a standby that a later generation takes in with state from a peer, as it would a replacement.
void AgentCore::Readmit(const std::string& reason) {
  ++readmissions_;
  uid_ = options_.pod_uid + "/" + std::to_string(readmissions_ + 1);
  spdlog::warn("the manager declared this pod lost ({}); coming back as its own replacement, "
               "uid {} ({} of at most {} times)",
               reason, uid_, readmissions_, kMaxReadmissions);
  if (tally_.active())
    AbortTrainers(started_epoch_, tally_.generation(), "this pod was declared lost: " + reason);
  LeaveGeneration();
  pending_.clear();
  unconfirmed_.clear();
  pause_at_.reset();
  resume_pending_ = false;
  last_generation_agents_ = 0;  // a new incarnation was in no generation
  reregister_now_ = true;
  if (session_) host_->CancelSession();
}

v1::AgentMessage AgentCore::NewMessage() const {
  v1::AgentMessage m;
  auto* h = m.mutable_header();
  h->set_job_id(options_.job_id);
  h->set_sender(uid_);
  h->set_epoch(epoch_);
  h->set_generation(generation_);
  return m;
}

// Whether each live process ran since the last heartbeat: its CPU time grew.
void AgentCore::ReadCpuTimes() {
  for (Rank& k : ranks_) {
    if (!k.alive || k.restart_pending || k.pid <= 0) continue;
    const std::optional<int64_t> cpu = host_->CpuMs(k.pid);
    if (!cpu) {
      k.cpu_ms = -1;
      continue;
    }
    if (*cpu != k.cpu_ms) k.cpu_grew = now_;
    k.cpu_ms = *cpu;
  }
}

v1::LocalRank AgentCore::Report(uint32_t r) const {
  const Rank& k = ranks_[r];
  v1::LocalRank out;
  out.set_local_rank(r);
  // A process being restarted is not a process that died: it has no pid until the new one
  // starts (a registration in between, a readmission, must not name it failed).
  out.set_pid(k.restart_pending ? 0 : static_cast<uint32_t>(k.pid));
  out.set_alive(k.alive && !k.restart_pending);
  out.set_step(k.step);
  // STARTING means "has not said hello": the manager forms generations only from ranks that
  // did. A trainer that said hello but reports no phase of its own yet is waiting: PAUSED.
  const bool waiting = k.phase == v1::PHASE_STARTING || k.phase == v1::PHASE_UNSPECIFIED;
  out.set_phase(!k.heard ? v1::PHASE_STARTING : waiting ? v1::PHASE_PAUSED : k.phase);
  const Millis age = now_ - (k.heard ? k.last_heard : k.started);
  out.set_beat_age_ms(static_cast<uint32_t>(std::clamp<int64_t>(age.count(), 0, UINT32_MAX)));
  if (k.cpu_ms >= 0 && k.alive && !k.restart_pending)
    out.set_cpu_idle_ms(
        static_cast<uint32_t>(std::clamp<int64_t>((now_ - k.cpu_grew).count(), 0, UINT32_MAX)));
  out.set_generation(k.generation);
  out.set_committed_step(k.committed_step);
  out.set_heard_commit_step(k.heard_commit_step);
  out.set_heard_commit_epoch(k.heard_commit_epoch);
  out.set_heard_commit_generation(k.heard_commit_generation);
  out.set_voted_step(k.voted_step);
  out.set_voted_epoch(k.voted_epoch);
  out.set_voted_generation(k.voted_generation);
  out.set_voted_world_size(k.voted_world_size);
  out.set_voted_ok(k.voted_ok);
  out.set_voted_checksum(k.voted_checksum);
  if (k.voted_rank >= 0) out.set_voted_rank(static_cast<uint32_t>(k.voted_rank));
  return out;
}

v1::AgentMessage AgentCore::BuildRegister() {
  v1::AgentMessage m = NewMessage();
  auto* reg = m.mutable_register_();
  reg->set_pod_uid(uid_);
  reg->set_pod_name(options_.pod_name);
  reg->set_node_rank(node_rank_);
  reg->set_node_name(options_.node_name);
  reg->set_host(options_.host);
  reg->set_nproc(static_cast<uint32_t>(ranks_.size()));
  for (uint32_t r = 0; r < ranks_.size(); ++r) *reg->add_ranks() = Report(r);
  SetFreePorts(reg);
  reg->set_last_generation_agents(last_generation_agents_);
  reg->set_left_generation(paused_since_welcome_);
  return m;
}

// A beat summarises the agent's ranks: it carries a rank's report only when it changed (other
// than its ages) or its trainer is late, so a quiet agent's beat is its header and free ports,
// whatever its nproc; the manager keeps what it last heard of the others (wire.proto: Heartbeat).
void AgentCore::SendHeartbeat() {
  if (!session_) return;
  ReadCpuTimes();
  v1::AgentMessage m = NewMessage();
  auto* hb = m.mutable_heartbeat();
  beat_said_.resize(ranks_.size());
  beat_age_said_.resize(ranks_.size(), 0);
  const auto late = static_cast<uint32_t>(LateBeatMs().count());
  for (uint32_t r = 0; r < ranks_.size(); ++r) {
    v1::LocalRank report = Report(r);
    const uint32_t age = report.beat_age_ms();
    v1::LocalRank ageless = report;
    ageless.clear_beat_age_ms();
    ageless.clear_cpu_idle_ms();
    std::string said = ageless.SerializeAsString();
    if (said == beat_said_[r] && age < late && beat_age_said_[r] < late) continue;
    beat_said_[r] = std::move(said);
    beat_age_said_[r] = age;
    *hb->add_ranks() = std::move(report);
  }
  SetFreePorts(hb);
  host_->SendToManager(m);
}

void AgentCore::SendEvent(v1::AgentMessage message) {
  if (link_ == Link::kUp && session_) {
    if (message.has_process_exit()) {
      if (sent_exits_.size() >= kMaxPending) sent_exits_.pop_front();
      sent_exits_.push_back(DescribeExit(message.process_exit()));
    }
    Unconfirm(message);
    host_->SendToManager(message);
    return;
  }
  if (pending_.size() >= kMaxPending) {
    spdlog::warn("{} events wait for the manager; dropping the oldest", pending_.size());
    pending_.pop_front();
  }
  pending_.push_back(std::move(message));
}

void AgentCore::Unconfirm(const v1::AgentMessage& message) {
  if (!message.has_votes() && !message.has_process_exit() && !message.has_fault()) return;
  if (unconfirmed_.size() >= kMaxPending) unconfirmed_.pop_front();
  unconfirmed_.push_back(message);
}

void AgentCore::ForgetConfirmed(bool votes, bool exits) {
  std::erase_if(unconfirmed_, [&](const v1::AgentMessage& m) {
    return m.has_votes() ? votes : exits;
  });
}

template <typename Message>
void AgentCore::SetFreePorts(Message* report) const {
  const std::vector<uint32_t> ports = host_->FreePorts();
  if (!ports.empty()) report->set_free_port(ports[0]);
  for (uint32_t p : ports) report->add_free_ports(p);
}

// ---------------------------------------------------------------------------------------------
// Trainers
// ---------------------------------------------------------------------------------------------

void AgentCore::OnHello(Millis now, uint32_t r, const v1::TrainerHello& hello) {
  now_ = now;
  if (exit_code_ || r >= ranks_.size()) return;
  Rank& k = ranks_[r];
  if (k.alive && hello.pid() != 0 && static_cast<int>(hello.pid()) != k.pid)
    spdlog::warn("local rank {} said hello from pid {}, but its process is pid {}", r, hello.pid(),
                 k.pid);
  k.heard = true;
  any_connected_ = true;
  k.last_heard = now_;
  k.generation = hello.generation();
  k.committed_step = hello.committed_step();
  k.heard_commit_step = hello.heard_commit_step();
  k.heard_commit_epoch = hello.heard_commit_epoch();
  k.heard_commit_generation = hello.heard_commit_generation();
  spdlog::info("local rank {} connected (pid {}, generation {}, committed step {})", r,
               hello.pid(), hello.generation(), hello.committed_step());
  v1::AgentReply welcome;
  welcome.mutable_welcome()->set_local_rank(r);
  welcome.mutable_welcome()->set_epoch(epoch_);
  host_->SendToTrainer(r, welcome);
  if (lost_ && link_ != Link::kUp && !stopping_) {
    v1::AgentReply pause;
    pause.mutable_pause()->set_reason("the manager is unreachable");
    pause.mutable_pause()->set_timeout_ms(OutageLeftMs());
    host_->SendToTrainer(r, pause);
  } else if (k.standing) {
    Deliver(r, *k.standing);
  }
}

// A trainer computes, reduces, votes for or applies step s only holding the state of step s - 1:
// its own commit, or what its generation's census gave it, which no commit outcome tells this
// agent (a rank given the state at a generation's start would report none until the next commit,
// and a manager would take it for a rank without state). Only in a generation:
// a trainer outside one computes nothing.
void AgentCore::NoteHeldState(Rank& k) {
  const bool in_step = k.phase == v1::PHASE_COMPUTING || k.phase == v1::PHASE_REDUCING ||
                       k.phase == v1::PHASE_VOTED || k.phase == v1::PHASE_APPLYING;
  if (in_step && k.generation > 0 && k.step > 0)
    k.committed_step = std::max(k.committed_step, k.step - 1);
}

void AgentCore::OnTrainerMessage(Millis now, uint32_t r, const v1::TrainerMessage& message) {
  now_ = now;
  if (exit_code_ || r >= ranks_.size()) return;
  Rank& k = ranks_[r];
  k.heard = true;
  k.last_heard = now_;
  switch (message.body_case()) {
    case v1::TrainerMessage::kHeartbeat:
      k.step = message.heartbeat().step();
      k.phase = message.heartbeat().phase();
      NoteHeldState(k);
      break;
    case v1::TrainerMessage::kVote: {
      const v1::TrainerVote& vote = message.vote();
      k.step = vote.step();
      k.phase = v1::PHASE_VOTED;
      k.voted_step = vote.step();
      k.voted_epoch = started_epoch_;
      k.voted_generation = vote.generation();
      k.voted_world_size = vote.generation() == k.plan_generation ? k.plan_world_size : 0;
      k.voted_rank = vote.generation() == k.plan_generation ? k.plan_rank : -1;
      k.voted_ok = vote.ok();
      k.voted_checksum = vote.checksum();
      NoteHeldState(k);
      k.generation = std::max(k.generation, vote.generation());
      if (auto why = tally_.Add(r, vote)) {
        spdlog::warn("ignoring the vote of local rank {} for step {}: {}", r, vote.step(), *why);
        break;
      }
      CheckVotes();
      break;
    }
    case v1::TrainerMessage::kFault: {
      const v1::TrainerFault& fault = message.fault();
      // A trainer's text goes on to the manager, its events and the scheduler: bounded here.
      std::string detail = BoundedText(fault.detail(), kMaxDetailBytes);
      spdlog::warn("local rank {} reports {} ({}) at step {}: {}", r,
                   fault.early() ? "a failed collective at once" : "a fault",
                   v1::FaultKind_Name(fault.kind()), fault.step(), detail);
      v1::AgentMessage m = NewMessage();
      auto* report = m.mutable_fault();
      report->set_kind(fault.kind());
      report->add_local_ranks(r);
      report->set_step(fault.step());
      report->set_generation(fault.generation());
      report->set_detail(std::move(detail));
      report->set_early(fault.early());
      report->set_peer(BoundedText(fault.peer(), 256));  // a host name or address
      *report->mutable_missing_ranks() = fault.missing_ranks();
      SendEvent(std::move(m));
      break;
    }
    case v1::TrainerMessage::kAck: {
      v1::AgentMessage m = NewMessage();
      m.mutable_ack()->set_directive_id(message.ack().directive_id());
      SendEvent(std::move(m));
      break;
    }
    default: break;
  }
}

void AgentCore::Deliver(uint32_t r, const v1::AgentReply& reply) {
  if (!host_->SendToTrainer(r, reply)) return;  // not connected: `standing` replays it on hello
  if (!reply.has_start()) return;
  Rank& k = ranks_[r];
  const v1::GenerationPlan& plan = reply.start().plan();
  k.generation = plan.generation();
  k.plan_generation = plan.generation();
  k.plan_world_size = plan.world_size();
  k.plan_rank = reply.start().has_assignment() ? reply.start().assignment().rank() : -1;
  // A plan that resumes at or after its vote settles it: the trainer applies the step it voted
  // for if the plan resumes after it, committed by the generation it voted in (or nobody knows
  // which), and drops it otherwise (python/regroup/forming.py).
  if (k.voted_generation != 0 && plan.committed_step() >= k.voted_step) {
    const std::pair<uint64_t, uint64_t> by{plan.committed_epoch(), plan.committed_generation()};
    const bool own = by == std::pair<uint64_t, uint64_t>{0, 0} ||
                     by == std::make_pair(k.voted_epoch, k.voted_generation);
    if (own && plan.committed_step() == k.voted_step && k.committed_step + 1 == k.voted_step)
      k.committed_step = k.voted_step;
    k.ForgetVote();
  }
}

void AgentCore::DeliverAll(const v1::AgentReply& reply) {
  for (uint32_t r = 0; r < ranks_.size(); ++r) Deliver(r, reply);
}

void AgentCore::PauseTrainers(const std::string& reason) {
  v1::AgentReply pause;
  pause.mutable_pause()->set_reason(reason);
  pause.mutable_pause()->set_timeout_ms(OutageLeftMs());
  DeliverAll(pause);
}

// An abort the agent makes up for its trainers: the manager that would send it is gone, or no
// longer counts this pod in.
void AgentCore::AbortTrainers(uint64_t epoch, uint64_t generation, const std::string& reason) {
  v1::AgentReply abort;
  auto* a = abort.mutable_abort();
  a->set_epoch(epoch);
  a->set_generation(generation);
  a->set_committed_step(-1);
  a->set_reason(reason);
  spdlog::warn("{}", reason);
  DeliverAll(abort);
  LeaveGeneration();
}

void AgentCore::LeaveGeneration() {
  tally_.Clear();
  for (Rank& k : ranks_) k.standing.reset();
}

void AgentCore::CheckVotes() {
  for (v1::Votes& votes : tally_.TakeComplete([this](uint32_t r) { return Live(r); })) {
    if (votes.ok()) {
      spdlog::debug("step {} of generation {}: local ranks {} voted commit", votes.step(),
                    votes.generation(), votes.local_ranks());
    } else {
      spdlog::warn("step {} of generation {}: local ranks {} voted, not all can commit",
                   votes.step(), votes.generation(), votes.local_ranks());
    }
    v1::AgentMessage m = NewMessage();
    *m.mutable_votes() = std::move(votes);
    SendEvent(std::move(m));
  }
}

}  // namespace regroup::agent
