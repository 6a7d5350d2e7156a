#include "agent/agent.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <spdlog/fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "agent/process.h"
#include "common/grpc_settings.h"
#include "common/text.h"

namespace regroup::agent {

namespace v1 = regroup::v1;
using std::chrono::duration_cast;
using std::chrono::milliseconds;

namespace {

constexpr milliseconds kMaxBackoff{500};  // as the channel's own (grpc_settings.cc)
constexpr milliseconds kRegisterTimeout{5000};
constexpr milliseconds kConnectReport{5000};
constexpr milliseconds kDoneWait{5000};
constexpr milliseconds kKillAfterTerm{5000};  // after a directive's grace: SIGTERM, then SIGKILL
constexpr milliseconds kFinalClose{2000};  // for the manager to confirm the last messages
constexpr size_t kMaxPending = 1024;
// Free ports in each report: a generation whose store this pod hosts takes one, so several can
// form between two heartbeats, each on a port no other store holds.
constexpr size_t kFreePorts = 4;
// The fork server answers a WarmStart in a few milliseconds; past this the process is started
// plainly. A server that died is started again after 1 s, doubling up to a minute.
constexpr milliseconds kWarmForkTimeout{1000};
constexpr milliseconds kWarmFirstBackoff{1000};
constexpr milliseconds kWarmFirstStart{30000};
constexpr milliseconds kWarmMaxBackoff{60000};
// How often a pod declared lost comes back as its own replacement before it stops for good (a
// flapping node is then replaced by the scheduler instead).
constexpr int kMaxReadmissions = 5;

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

std::string DescribeStatus(int status) {
  return WIFSIGNALED(status) ? fmt::format("killed by signal {}", WTERMSIG(status))
                             : fmt::format("exit code {}", WEXITSTATUS(status));
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

Agent::Agent(AgentOptions options, std::string credential)
    : options_(std::move(options)), credential_(std::move(credential)), uid_(options_.pod_uid) {
  ranks_.resize(static_cast<size_t>(options_.nproc));
  node_rank_ = options_.node_rank;
}

Agent::~Agent() {
  session_.reset();
  server_.reset();
  if (signal_fd_ >= 0) close(signal_fd_);
}

// ---------------------------------------------------------------------------------------------
// Setup and the loop
// ---------------------------------------------------------------------------------------------

Status Agent::Setup() {
  // Signals first, before gRPC starts threads, so every thread inherits the blocked mask and
  // the signalfd is the only place these signals arrive.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
  signal_fd_ = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  if (signal_fd_ < 0) return FailedPrecondition(std::string("signalfd: ") + std::strerror(errno));
  REGROUP_RETURN_IF_ERROR(loop_.Add(signal_fd_, EPOLLIN, [this](uint32_t) { OnSignals(); }));
  REGROUP_RETURN_IF_ERROR(loop_.Add(inbox_.fd(), EPOLLIN, [this](uint32_t) { OnInbox(); }));

  argv_ = TrainerArgv(options_);
  const char* path = std::getenv("PATH");
  auto executable = FindExecutable(argv_[0], path ? path : "");
  if (!executable.ok()) return executable.status();
  executable_ = *executable;

  auto server = TrainerServer::Listen(&loop_, options_.socket_dir,
                                      static_cast<uint32_t>(options_.nproc), this);
  if (!server.ok()) return server.status();
  server_ = std::move(*server);

  // Where FreePort binds: --host when it is (or resolves to) an address, else any address.
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_ADDRCONFIG;
  addrinfo* found = nullptr;
  if (getaddrinfo(options_.host.c_str(), nullptr, &hints, &found) == 0 && found != nullptr) {
    std::memcpy(&host_addr_, found->ai_addr, found->ai_addrlen);
    host_addr_len_ = found->ai_addrlen;
  } else {
    spdlog::warn("cannot resolve --host {}: free ports are taken on any address", options_.host);
  }
  if (found != nullptr) freeaddrinfo(found);

  if (options_.warm_start) {
    Status reaper = MakeSubreaper();
    if (!reaper.ok()) {
      spdlog::warn("warm starts off: {}", reaper.message());
    } else {
      WarmStarter::Config warm;
      warm.python = executable_;
      warm.imports = options_.warm_imports;
      if (!options_.module)
        warm.script_dir = std::filesystem::absolute(options_.script[0]).parent_path().string();
      warm.env = MergeEnvironment(
          CurrentEnvironment(),
          TrainerEnvironment(options_, node_rank_, 0, server_->socket_path(),
                             std::getenv("OMP_NUM_THREADS") != nullptr));
      warm_ = std::make_unique<WarmStarter>(std::move(warm));
    }
  }

  auto channel = MakeChannel(options_.manager_addr,
                             {options_.tls_ca_file, options_.tls_server_name});
  if (!channel.ok())
    return InvalidArgument("flag --tls-ca (or REGROUP_TLS_CA_FILE): " + channel.status().message());
  channel_ = std::move(*channel);
  return Status::Ok();
}

int Agent::Run() {
  Status ready = Setup();
  if (!ready.ok()) {
    spdlog::error("cannot start: {}", ready.message());
    return 1;
  }
  spdlog::info("starting {} trainer process(es): {}; trainer socket {}; manager {}",
               options_.nproc, fmt::join(argv_, " "), server_->socket_path(),
               options_.manager_addr);
  for (uint32_t r = 0; r < ranks_.size(); ++r) StartChild(r);
  // The fork server imports torch too: it starts once every trainer said hello, so that it does
  // not slow their own start on a busy node (or after kWarmFirstStart, whatever comes first).
  if (warm_) warm_retry_at_ = Clock::now() + kWarmFirstStart;
  outage_since_ = Clock::now();  // the reconnect timeout also bounds the wait for a first manager
  Connect();
  while (!exit_code_) {
    loop_.RunOnce(NextTimeoutMs());
    if (!exit_code_) OnTimers();
  }
  if (warm_) DropWarmServer("", /*retry=*/false);
  session_.reset();
  server_.reset();
  spdlog::info("exiting with code {}", *exit_code_);
  return *exit_code_;
}

int Agent::NextTimeoutMs() const {
  const auto now = Clock::now();
  auto next = now + milliseconds(1000);
  auto consider = [&](Clock::time_point t) { next = std::min(next, t); };
  if (link_ == Link::kUp) consider(next_heartbeat_);
  if (pause_at_) consider(*pause_at_);
  if (link_ == Link::kDown && !session_) consider(reconnect_at_);
  if (link_ == Link::kRegistering) consider(register_deadline_);
  if (link_ == Link::kConnecting && !stopping_) consider(connect_report_at_);
  if (stopping_) {
    if (!stopping_->termed) consider(stopping_->term_at);
    if (!stopping_->killed) consider(stopping_->kill_at);
    consider(stopping_->give_up_at);
  } else {
    if (outage_since_)
      consider(*outage_since_ + std::chrono::seconds(options_.reconnect_timeout_s));
    if (done_at_) consider(*done_at_);
    if (warm_retry_at_) consider(*warm_retry_at_);
  }
  if (next <= now) return 0;
  return static_cast<int>(duration_cast<milliseconds>(next - now).count()) + 1;
}

void Agent::OnTimers() {
  const auto now = Clock::now();
  server_->CloseSilent(now);
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
    spdlog::error("no manager at {} for {} s (--reconnect-timeout-s): stopping the trainers and "
                  "exiting",
                  options_.manager_addr, options_.reconnect_timeout_s);
    outage_since_.reset();
    BeginStop(1, "the manager is gone", /*wait_for_trainers=*/false);
    return;  // BeginStop ran the timers again
  }
  if (exit_code_) return;
  if (warm_retry_at_ && now >= *warm_retry_at_ && !stopping_) {
    warm_retry_at_.reset();
    StartWarmServer();
  }
  if (pause_at_ && now >= *pause_at_) {
    pause_at_.reset();
    spdlog::warn("no session with the manager for {} ms (its liveness timeout): trainers paused",
                 liveness_timeout_.count());
    PauseTrainers(pause_reason_);
  }

  // The manager link, kept up while stopping too: the exits of the last trainers and the
  // heartbeats of a slow dump still reach the manager.
  if (link_ == Link::kDown && !session_ && now >= reconnect_at_) Connect();
  if (link_ == Link::kConnecting && !stopping_ && now >= connect_report_at_) {
    spdlog::warn("no manager answers at {} yet; giving up in {} ms", options_.manager_addr,
                 OutageLeftMs());
    connect_report_at_ = now + kConnectReport;
  }
  if (link_ == Link::kRegistering && now >= register_deadline_) {
    spdlog::warn("no Welcome from the manager within {} ms of registering; reconnecting",
                 kRegisterTimeout.count());
    register_deadline_ = now + kRegisterTimeout;  // Cancel() leads to OnSessionClosed
    if (session_) session_->Cancel();
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

void Agent::StartChild(uint32_t r) {
  Rank& k = ranks_[r];
  if (k.env.empty()) {
    k.env = MergeEnvironment(
        CurrentEnvironment(),
        TrainerEnvironment(options_, node_rank_, r, server_->socket_path(),
                           std::getenv("OMP_NUM_THREADS") != nullptr));
  }
  const auto began = Clock::now();
  StatusOr<pid_t> pid = FailedPrecondition("not started");
  bool forked = false;
  if (warm_ && warm_->ready()) {
    pid = warm_->Fork(r, options_.module, options_.script, k.env, kWarmForkTimeout);
    forked = pid.ok();
    if (!forked) {
      spdlog::warn("local rank {}: no warm start ({}); starting a new interpreter", r,
                   pid.status().message());
      if (!warm_->running()) DropWarmServer("", /*retry=*/true);
    }
  }
  if (!forked) pid = SpawnProcessGroup(executable_, argv_, k.env);
  const auto now = Clock::now();
  k.started = now;
  k.heard = false;
  k.step = 0;
  k.phase = v1::PHASE_STARTING;
  k.generation = 0;
  k.committed_step = -1;
  k.heard_commit_step = -1;
  k.heard_commit_epoch = k.heard_commit_generation = 0;
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
  if (forked) {
    spdlog::info("local rank {} started: pid {}, forked by the fork server in {:.1f} ms", r, k.pid,
                 std::chrono::duration<double, std::milli>(now - began).count());
  } else {
    spdlog::info("local rank {} started: pid {}", r, k.pid);
  }
}

void Agent::StartWarmServer() {
  warm_started_ = true;
  Status started = warm_->Start();
  if (!started.ok()) {
    DropWarmServer(started.message(), /*retry=*/true);
    return;
  }
  Status watched = loop_.Add(warm_->fd(), EPOLLIN, [this](uint32_t) { OnWarmReady(); });
  if (!watched.ok()) {
    DropWarmServer(watched.message(), /*retry=*/true);
    return;
  }
  warm_watched_ = true;
  spdlog::debug("fork server starting: pid {}, importing {}", warm_->pid(),
                fmt::join(options_.warm_imports, ","));
}

void Agent::OnWarmReady() {
  loop_.Remove(warm_->fd());
  warm_watched_ = false;
  const pid_t pid = warm_->pid();
  Status ready = warm_->OnReadable();
  if (!ready.ok()) {
    DropWarmServer(ready.message(), /*retry=*/false);
    return;
  }
  warm_backoff_ = kWarmFirstBackoff;
  spdlog::info("fork server ready (pid {}, {} imported): restarted trainers are forked from it",
               pid, fmt::join(options_.warm_imports, ","));
}

void Agent::DropWarmServer(const std::string& why, bool retry) {
  if (warm_watched_) loop_.Remove(warm_->fd());
  warm_watched_ = false;
  warm_->Stop();
  if (why.empty() && !retry) return;
  if (!retry) {
    spdlog::warn("warm starts off: {}; restarted trainers start as new interpreters", why);
    warm_.reset();
    return;
  }
  if (stopping_ || exit_code_) return;
  spdlog::warn("fork server gone{}{}; starting it again in {} ms", why.empty() ? "" : ": ", why,
               warm_backoff_.count());
  warm_retry_at_ = Clock::now() + warm_backoff_;
  warm_backoff_ = std::min(warm_backoff_ * 2, kWarmMaxBackoff);
}

void Agent::OnSignals() {
  signalfd_siginfo info;
  for (;;) {
    ssize_t n = read(signal_fd_, &info, sizeof info);
    if (n != sizeof info) break;
    switch (info.ssi_signo) {
      case SIGCHLD: ReapChildren(); break;
      case SIGTERM: OnTerminateSignal("SIGTERM"); break;
      case SIGINT: OnTerminateSignal("SIGINT"); break;
      default: break;
    }
    if (exit_code_) return;
  }
}

void Agent::ReapChildren() {
  for (;;) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    auto it = std::find_if(ranks_.begin(), ranks_.end(),
                           [pid](const Rank& k) { return k.alive && k.pid == pid; });
    if (it == ranks_.end()) {
      if (warm_ && pid == warm_->pid()) {
        DropWarmServer("it exited (" + DescribeStatus(status) + ")", /*retry=*/true);
        continue;
      }
      // An orphan adopted as pid 1 or as the subreaper (a trainer's leftover, the fork server's).
      spdlog::debug("reaped process {} (not a trainer)", pid);
      continue;
    }
    OnChildExit(static_cast<uint32_t>(it - ranks_.begin()), status);
    if (exit_code_) return;
  }
}

void Agent::OnChildExit(uint32_t r, int status) {
  Rank& k = ranks_[r];
  k.alive = false;
  k.exited = true;
  k.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  k.exit_signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  SignalGroup(k.pid, SIGKILL);  // what the trainer left behind in its group
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
  if (k.exit_signal != 0) {
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
    done_at_ = Clock::now() + kDoneWait;
  }
}

bool Agent::AnyAlive() const {
  return std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& k) { return k.alive; });
}

void Agent::SignalAll(int signal) {
  for (const Rank& k : ranks_)
    if (k.alive) SignalGroup(k.pid, signal);
}

void Agent::OnTerminateSignal(const char* name) {
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

void Agent::BeginStop(int exit_code, std::string reason, bool wait_for_trainers) {
  if (stopping_) return;
  const auto now = Clock::now();
  const milliseconds grace = std::chrono::seconds(options_.stop_grace_s);
  Stopping s{exit_code, std::move(reason), {}, {}, {}};
  s.term_at = wait_for_trainers ? now + grace : now;
  s.kill_at = s.term_at + (wait_for_trainers ? std::min(grace, kKillAfterTerm) : grace);
  s.give_up_at = s.kill_at + kKillAfterTerm;
  stopping_ = std::move(s);
  done_at_.reset();
  if (!AnyAlive()) {
    Finish(exit_code);
    return;
  }
  OnTimers();  // SIGTERM at once when not waiting
}

void Agent::Finish(int exit_code) {
  if (exit_code_) return;
  // Every trainer exit this agent saw must reach the manager, or be named here as lost: the
  // manager would otherwise never learn how a rank ended.
  if (session_ && link_ == Link::kUp) {
    spdlog::info("waiting up to {} ms for the manager to confirm this agent's last messages",
                 kFinalClose.count());
    ManagerSession::Closed closed = session_->Close(kFinalClose);
    if (!closed.confirmed) {
      spdlog::error("the manager may not have received this agent's last messages ({}); process "
                    "exits sent in this session: {}",
                    closed.reason, sent_exits_.empty() ? "none" : fmt::format("{}", fmt::join(sent_exits_, "; ")));
    }
  } else {
    std::vector<std::string> lost;
    for (const v1::AgentMessage& m : pending_)
      if (m.has_process_exit()) lost.push_back(DescribeExit(m.process_exit()));
    if (!lost.empty())
      spdlog::error("no session with the manager: these process exits never reached it: {}",
                    fmt::join(lost, "; "));
  }
  exit_code_ = exit_code;
}

// ---------------------------------------------------------------------------------------------
// The manager
// ---------------------------------------------------------------------------------------------

void Agent::Connect() {
  session_ = std::make_unique<ManagerSession>(++session_ids_, channel_, credential_, &inbox_);
  sent_exits_.clear();
  link_ = Link::kConnecting;
  connect_report_at_ = Clock::now() + kConnectReport;
  spdlog::debug("manager session {}: connecting to {}", session_->id(), options_.manager_addr);
}

void Agent::OnSessionOpened() {
  // Register is built now, so it carries the trainers' states of the moment the stream opened.
  link_ = Link::kRegistering;
  register_deadline_ = Clock::now() + kRegisterTimeout;
  session_->Send(BuildRegister());
  spdlog::debug("manager session {}: registering with {}", session_->id(), options_.manager_addr);
}

void Agent::OnInbox() {
  for (SessionEvent& event : inbox_.Drain()) {
    if (exit_code_) return;
    if (!session_ || event.session != session_->id()) continue;  // from an ended session
    if (event.kind == SessionEvent::Kind::kClosed) {
      OnSessionClosed(event.detail, event.ended_by_manager);
    } else if (event.kind == SessionEvent::Kind::kOpened) {
      OnSessionOpened();
    } else {
      OnManagerMessage(event.message);
    }
  }
}

void Agent::OnSessionClosed(const std::string& detail, bool ended_by_manager) {
  const bool was_up = link_ == Link::kUp;
  session_.reset();
  link_ = Link::kDown;
  const auto now = Clock::now();
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
    if (!outage_since_) outage_since_ = now;
    const bool first_loss = !lost_;
    lost_ = true;
    if (was_up) {
      spdlog::warn("the session with the manager at {} broke ({}); resuming it; the trainers "
                   "pause in {} ms unless it is back, and the agent gives up in {} ms",
                   options_.manager_addr, detail, liveness_timeout_.count(), OutageLeftMs());
      pause_at_ = now + liveness_timeout_;
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
  reconnect_at_ = now + backoff_;
  backoff_ = std::min(backoff_ * 2, kMaxBackoff);
}

int64_t Agent::OutageLeftMs() const {
  if (!outage_since_) return options_.reconnect_timeout_s * int64_t{1000};
  auto left = *outage_since_ + std::chrono::seconds(options_.reconnect_timeout_s) - Clock::now();
  return std::max<int64_t>(0, duration_cast<milliseconds>(left).count());
}

void Agent::OnManagerMessage(const v1::ManagerMessage& message) {
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

void Agent::OnWelcome(const v1::Welcome& welcome) {
  if (welcome.epoch() < epoch_) {
    spdlog::warn("ignoring a Welcome for epoch {}: this agent follows epoch {}", welcome.epoch(),
                 epoch_);
    return;
  }
  const uint64_t old_epoch = started_epoch_, old_generation = tally_.active() ? tally_.generation() : 0;
  epoch_ = welcome.epoch();
  generation_ = std::max(generation_, welcome.generation());
  node_rank_ = static_cast<int>(welcome.node_rank());
  heartbeat_interval_ =
      milliseconds(welcome.heartbeat_interval_ms() > 0 ? welcome.heartbeat_interval_ms() : 100);
  if (welcome.liveness_timeout_ms() > 0)
    liveness_timeout_ = milliseconds(welcome.liveness_timeout_ms());
  link_ = Link::kUp;
  backoff_ = milliseconds(100);
  outage_since_.reset();
  lost_ = false;
  // Registered anew after a broken session (a restarted manager, or too late): the generation
  // the trainers are in is gone. Abort it, so that a rank waiting in one of its collectives for
  // a peer that already left comes out at once (a pause would leave it there until the hang
  // timeout), rather than wait for an outcome that will not come.
  if (resume_pending_ && !welcome.resumed() && old_generation > 0) {
    v1::AgentReply abort;
    auto* a = abort.mutable_abort();
    a->set_epoch(old_epoch);
    a->set_generation(old_generation);
    a->set_committed_step(-1);
    a->set_reason("the session with the manager was not resumed (" + pause_reason_ +
                  "): generation " + std::to_string(old_generation) + " of epoch " +
                  std::to_string(old_epoch) + " is gone");
    spdlog::warn("{}", a->reason());
    DeliverAll(abort);
    tally_.Clear();
    for (Rank& k : ranks_) k.standing.reset();
  } else if (resume_pending_ && !welcome.resumed()) {
    PauseTrainers(pause_reason_);
  }
  resume_pending_ = false;
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
  SendHeartbeat();
  next_heartbeat_ = Clock::now() + heartbeat_interval_;
}

void Agent::OnStart(const v1::StartGeneration& start) {
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

void Agent::OnAbort(const v1::AbortGeneration& abort) {
  spdlog::info("generation {} aborted, back to step {}: {}", abort.generation(),
               abort.committed_step(), abort.reason());
  v1::AgentReply reply;
  *reply.mutable_abort() = abort;
  DeliverAll(reply);
  ForgetConfirmed(/*votes=*/true, /*exits=*/true);
  if (!tally_.active() || abort.generation() >= tally_.generation()) {
    tally_.Clear();
    for (Rank& k : ranks_) k.standing.reset();
  }
}

void Agent::OnOutcome(const v1::StepOutcome& outcome) {
  spdlog::debug("step {} of generation {}: {}", outcome.step(), outcome.generation(),
                outcome.commit() ? "commit" : "roll back");
  v1::AgentReply reply;
  *reply.mutable_outcome() = outcome;
  for (uint32_t r = 0; r < ranks_.size(); ++r) {
    if (!server_->connected(r)) continue;
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
  }
  tally_.Settle(outcome.generation(), outcome.step());
  std::erase_if(unconfirmed_, [&](const v1::AgentMessage& m) {
    return m.has_votes() && (m.votes().generation() < outcome.generation() ||
                             (m.votes().generation() == outcome.generation() &&
                              m.votes().step() <= outcome.step()));
  });
}

void Agent::OnStop(const v1::StopTraining& stop) {
  spdlog::info("StopTraining ({}): {}", ModeName(stop.mode()), stop.reason());
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
  switch (stop.mode()) {
    case v1::StopTraining::MODE_STANDBY: tally_.Clear(); break;
    case v1::StopTraining::MODE_DUMP: BeginStop(0, "dump", /*wait_for_trainers=*/true); break;
    case v1::StopTraining::MODE_LEAVE: BeginStop(0, "leave", /*wait_for_trainers=*/true); break;
    case v1::StopTraining::MODE_EXIT: BeginStop(1, "exit", /*wait_for_trainers=*/true); break;
    default:
      spdlog::warn("StopTraining without a mode: treated as exit");
      BeginStop(1, "exit", /*wait_for_trainers=*/true);
      break;
  }
}

void Agent::OnRestart(const v1::RestartProcesses& restart) {
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
      SignalGroup(k.pid, SIGKILL);  // started again once reaped (OnChildExit)
    } else {
      StartChild(r);
    }
  }
  CheckVotes();
}

void Agent::OnRefusal(const v1::Refusal& refusal) {
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
    if (session_) session_->Cancel();
  }
}

// Declared lost, but alive (it was paused, or cut off, for longer than the liveness timeout):
// the job went on without this pod, so its trainers' generation is over and their state is
// stale. They leave that generation at once, and the pod registers again as a new incarnation,
// a standby that a later generation takes in with state from a peer, as it would a replacement.
void Agent::Readmit(const std::string& reason) {
  ++readmissions_;
  uid_ = options_.pod_uid + "/" + std::to_string(readmissions_ + 1);
  spdlog::warn("the manager declared this pod lost ({}); coming back as its own replacement, "
               "uid {} ({} of at most {} times)",
               reason, uid_, readmissions_, kMaxReadmissions);
  if (tally_.active()) {
    v1::AgentReply abort;
    auto* a = abort.mutable_abort();
    a->set_epoch(started_epoch_);
    a->set_generation(tally_.generation());
    a->set_committed_step(-1);
    a->set_reason("this pod was declared lost: " + reason);
    DeliverAll(abort);
  }
  tally_.Clear();
  for (Rank& k : ranks_) k.standing.reset();
  pending_.clear();
  unconfirmed_.clear();
  pause_at_.reset();
  resume_pending_ = false;
  last_generation_agents_ = 0;  // a new incarnation was in no generation
  reregister_now_ = true;
  if (session_) session_->Cancel();
}

v1::AgentMessage Agent::NewMessage() const {
  v1::AgentMessage m;
  auto* h = m.mutable_header();
  h->set_job_id(options_.job_id);
  h->set_sender(uid_);
  h->set_epoch(epoch_);
  h->set_generation(generation_);
  return m;
}

v1::LocalRank Agent::Report(uint32_t r, Clock::time_point now) const {
  const Rank& k = ranks_[r];
  v1::LocalRank out;
  out.set_local_rank(r);
  // A process being restarted is not a process that died: it has no pid until the new one
  // starts (a registration in between, a readmission, must not name it failed).
  out.set_pid(k.restart_pending ? 0 : k.pid);
  out.set_alive(k.alive && !k.restart_pending);
  out.set_step(k.step);
  // STARTING means "has not said hello": the manager forms generations only from ranks that
  // did. A trainer that said hello but reports no phase of its own yet is waiting: PAUSED.
  const bool waiting = k.phase == v1::PHASE_STARTING || k.phase == v1::PHASE_UNSPECIFIED;
  out.set_phase(!k.heard ? v1::PHASE_STARTING : waiting ? v1::PHASE_PAUSED : k.phase);
  const auto since = k.heard ? k.last_heard : k.started;
  const auto age = duration_cast<milliseconds>(now - since).count();
  out.set_beat_age_ms(static_cast<uint32_t>(std::clamp<int64_t>(age, 0, UINT32_MAX)));
  out.set_generation(k.generation);
  out.set_committed_step(k.committed_step);
  out.set_heard_commit_step(k.heard_commit_step);
  out.set_heard_commit_epoch(k.heard_commit_epoch);
  out.set_heard_commit_generation(k.heard_commit_generation);
  return out;
}

v1::AgentMessage Agent::BuildRegister() {
  v1::AgentMessage m = NewMessage();
  auto* reg = m.mutable_register_();
  reg->set_pod_uid(uid_);
  reg->set_pod_name(options_.pod_name);
  reg->set_node_rank(node_rank_);
  reg->set_node_name(options_.node_name);
  reg->set_host(options_.host);
  reg->set_nproc(static_cast<uint32_t>(ranks_.size()));
  const auto now = Clock::now();
  for (uint32_t r = 0; r < ranks_.size(); ++r) *reg->add_ranks() = Report(r, now);
  SetFreePorts(reg);
  reg->set_last_generation_agents(last_generation_agents_);
  return m;
}

void Agent::SendHeartbeat() {
  if (!session_) return;
  v1::AgentMessage m = NewMessage();
  auto* hb = m.mutable_heartbeat();
  const auto now = Clock::now();
  for (uint32_t r = 0; r < ranks_.size(); ++r) *hb->add_ranks() = Report(r, now);
  SetFreePorts(hb);
  session_->Send(m);
}

void Agent::SendEvent(v1::AgentMessage message) {
  if (link_ == Link::kUp && session_) {
    if (message.has_process_exit()) {
      if (sent_exits_.size() >= kMaxPending) sent_exits_.pop_front();
      sent_exits_.push_back(DescribeExit(message.process_exit()));
    }
    Unconfirm(message);
    session_->Send(message);
    return;
  }
  if (pending_.size() >= kMaxPending) {
    spdlog::warn("{} events wait for the manager; dropping the oldest", pending_.size());
    pending_.pop_front();
  }
  pending_.push_back(std::move(message));
}

void Agent::Unconfirm(const v1::AgentMessage& message) {
  if (!message.has_votes() && !message.has_process_exit() && !message.has_fault()) return;
  if (unconfirmed_.size() >= kMaxPending) unconfirmed_.pop_front();
  unconfirmed_.push_back(message);
}

void Agent::ForgetConfirmed(bool votes, bool exits) {
  std::erase_if(unconfirmed_, [&](const v1::AgentMessage& m) {
    return m.has_votes() ? votes : exits;
  });
}

std::vector<uint32_t> Agent::FreePorts() const {
  // All bound at once, then closed: the ports are distinct. Where --host is an address, on it;
  // else (or when that fails) on any address.
  auto bind_all = [](sockaddr_storage addr, socklen_t len) {
    std::vector<uint32_t> ports;
    std::vector<int> fds;
    for (size_t i = 0; i < kFreePorts; ++i) {
      int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) break;
      fds.push_back(fd);
      sockaddr_storage bound{};
      socklen_t bound_len = sizeof bound;
      if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
          getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &bound_len) != 0)
        break;
      ports.push_back(bound.ss_family == AF_INET6
                          ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                          : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port));
    }
    for (int fd : fds) close(fd);
    return ports;
  };
  if (host_addr_len_ > 0) {
    sockaddr_storage addr = host_addr_;
    if (addr.ss_family == AF_INET6) {
      reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = 0;
    } else {
      reinterpret_cast<sockaddr_in*>(&addr)->sin_port = 0;
    }
    if (auto ports = bind_all(addr, host_addr_len_); !ports.empty()) return ports;
  }
  sockaddr_storage any{};
  auto* in = reinterpret_cast<sockaddr_in*>(&any);
  in->sin_family = AF_INET;
  in->sin_addr.s_addr = htonl(INADDR_ANY);
  return bind_all(any, sizeof(sockaddr_in));
}

template <typename Message>
void Agent::SetFreePorts(Message* report) const {
  const std::vector<uint32_t> ports = FreePorts();
  if (!ports.empty()) report->set_free_port(ports[0]);
  for (uint32_t p : ports) report->add_free_ports(p);
}

// ---------------------------------------------------------------------------------------------
// Trainers
// ---------------------------------------------------------------------------------------------

void Agent::OnHello(uint32_t r, const v1::TrainerHello& hello) {
  Rank& k = ranks_[r];
  if (k.alive && hello.pid() != 0 && hello.pid() != k.pid)
    spdlog::warn("local rank {} said hello from pid {}, but its process is pid {}", r, hello.pid(),
                 k.pid);
  const auto now = Clock::now();
  k.heard = true;
  k.last_heard = now;
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
  server_->Send(r, welcome);
  if (lost_ && link_ != Link::kUp && !stopping_) {
    v1::AgentReply pause;
    pause.mutable_pause()->set_reason("the manager is unreachable");
    pause.mutable_pause()->set_timeout_ms(OutageLeftMs());
    server_->Send(r, pause);
  } else if (k.standing) {
    Deliver(r, *k.standing);
  }
  if (warm_ && !warm_started_ &&
      std::all_of(ranks_.begin(), ranks_.end(), [](const Rank& x) { return x.heard; })) {
    warm_retry_at_.reset();
    StartWarmServer();
  }
}

void Agent::OnMessage(uint32_t r, const v1::TrainerMessage& message) {
  Rank& k = ranks_[r];
  k.heard = true;
  k.last_heard = Clock::now();
  switch (message.body_case()) {
    case v1::TrainerMessage::kHeartbeat:
      k.step = message.heartbeat().step();
      k.phase = message.heartbeat().phase();
      break;
    case v1::TrainerMessage::kVote: {
      const v1::TrainerVote& vote = message.vote();
      k.step = vote.step();
      k.phase = v1::PHASE_VOTED;
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
      spdlog::warn("local rank {} reports a fault ({}) at step {}: {}", r,
                   v1::FaultKind_Name(fault.kind()), fault.step(), detail);
      v1::AgentMessage m = NewMessage();
      auto* report = m.mutable_fault();
      report->set_kind(fault.kind());
      report->add_local_ranks(r);
      report->set_step(fault.step());
      report->set_generation(fault.generation());
      report->set_detail(std::move(detail));
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

void Agent::OnDisconnect(uint32_t r) { spdlog::info("local rank {} disconnected", r); }

void Agent::Deliver(uint32_t r, const v1::AgentReply& reply) {
  if (!server_->Send(r, reply)) return;  // not connected: `standing` replays it on hello
  if (reply.has_start()) ranks_[r].generation = reply.start().plan().generation();
}

void Agent::DeliverAll(const v1::AgentReply& reply) {
  for (uint32_t r = 0; r < ranks_.size(); ++r) Deliver(r, reply);
}

void Agent::PauseTrainers(const std::string& reason) {
  v1::AgentReply pause;
  pause.mutable_pause()->set_reason(reason);
  pause.mutable_pause()->set_timeout_ms(OutageLeftMs());
  DeliverAll(pause);
}

void Agent::CheckVotes() {
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
