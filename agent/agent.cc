// SPDX-License-Identifier: Apache-2.0
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

namespace regroup::agent {

namespace v1 = regroup::v1;
using std::chrono::duration_cast;
using std::chrono::milliseconds;

namespace {

constexpr milliseconds kFinalClose{2000};  // for the manager to confirm the last messages
// Free ports in each report: a generation whose store this pod hosts takes one, so several can
// form between two heartbeats, each on a port no other store holds.
constexpr size_t kFreePorts = 4;
// The fork server answers a WarmStart in a few milliseconds; past this the process is started
// plainly. A server that died is started again after 1 s, doubling up to a minute.
constexpr milliseconds kWarmForkTimeout{1000};
constexpr milliseconds kWarmFirstBackoff{1000};
constexpr milliseconds kWarmFirstStart{30000};
constexpr milliseconds kWarmMaxBackoff{60000};

std::string DescribeStatus(int status) {
  return WIFSIGNALED(status) ? fmt::format("killed by signal {}", WTERMSIG(status))
                             : fmt::format("exit code {}", WEXITSTATUS(status));
}

}  // namespace

Agent::Agent(AgentOptions options, std::string credential)
    : options_(std::move(options)),
      credential_(std::move(credential)),
      env_(static_cast<size_t>(std::max(options_.nproc, 0))),
      core_(options_, this) {}

Agent::~Agent() {
  session_.reset();
  server_.reset();
  if (signal_fd_ >= 0) close(signal_fd_);
}

Millis Agent::Now() { return duration_cast<Millis>(Clock::now().time_since_epoch()); }

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
          TrainerEnvironment(options_, core_.node_rank(), 0, server_->socket_path(),
                             std::getenv("OMP_NUM_THREADS") != nullptr));
      warm_ = std::make_unique<WarmStarter>(std::move(warm));
    }
  }

  auto channel = MakeChannel(options_.manager_addr,
                             {options_.tls_ca_file, options_.tls_server_name,
                              options_.tls_cert_file, options_.tls_key_file});
  if (!channel.ok()) {
    const std::string why = channel.status().message();
    return InvalidArgument((why.find("TLS CA file") != std::string::npos
                                ? "flag --tls-ca (or REGROUP_TLS_CA_FILE): "
                                : "flags --tls-cert/--tls-key (or REGROUP_TLS_CERT_FILE, "
                                  "REGROUP_TLS_KEY_FILE): ") +
                           why);
  }
  channel_ = std::move(*channel);
  probe_ = std::make_unique<ConnectProbe>(channel_, options_.manager_addr, credential_,
                                          options_.job_id, !options_.tls_ca_file.empty());
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
  // The fork server imports torch too: it starts once every trainer said hello, so that it does
  // not slow their own start on a busy node (or after kWarmFirstStart, whatever comes first).
  if (warm_) warm_retry_at_ = Clock::now() + kWarmFirstStart;
  core_.Start(Now());
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
  const Millis at = Now();
  auto next = now + (core_.NextDeadline(at) - at);
  if (warm_retry_at_ && !core_.stopping()) next = std::min(next, *warm_retry_at_);
  if (next <= now) return 0;
  return static_cast<int>(duration_cast<milliseconds>(next - now).count()) + 1;
}

void Agent::OnTimers() {
  const auto now = Clock::now();
  server_->CloseSilent(now);
  core_.OnTimers(Now());
  if (exit_code_) return;
  if (warm_retry_at_ && now >= *warm_retry_at_ && !core_.stopping()) {
    warm_retry_at_.reset();
    StartWarmServer();
  }
}

// ---------------------------------------------------------------------------------------------
// Children
// ---------------------------------------------------------------------------------------------

StatusOr<int> Agent::StartProcess(uint32_t r) {
  std::vector<std::string>& env = env_[r];
  if (env.empty()) {
    env = MergeEnvironment(
        CurrentEnvironment(),
        TrainerEnvironment(options_, core_.node_rank(), r, server_->socket_path(),
                           std::getenv("OMP_NUM_THREADS") != nullptr));
  }
  const auto began = Clock::now();
  if (warm_ && warm_->ready()) {
    StatusOr<pid_t> pid = warm_->Fork(r, options_.module, options_.script, env, kWarmForkTimeout);
    if (pid.ok()) {
      spdlog::info("local rank {} started: pid {}, forked by the fork server in {:.1f} ms", r,
                   *pid, std::chrono::duration<double, std::milli>(Clock::now() - began).count());
      return static_cast<int>(*pid);
    }
    spdlog::warn("local rank {}: no warm start ({}); starting a new interpreter", r,
                 pid.status().message());
    if (!warm_->running()) DropWarmServer("", /*retry=*/true);
  }
  StatusOr<pid_t> pid = SpawnProcessGroup(executable_, argv_, env);
  if (!pid.ok()) return pid.status();
  spdlog::info("local rank {} started: pid {}", r, *pid);
  return static_cast<int>(*pid);
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
  if (core_.stopping() || exit_code_) return;
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
      case SIGTERM: core_.OnTerminateSignal(Now(), "SIGTERM"); break;
      case SIGINT: core_.OnTerminateSignal(Now(), "SIGINT"); break;
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
    const std::optional<uint32_t> r = core_.RankOfPid(pid);
    if (!r) {
      if (warm_ && pid == warm_->pid()) {
        DropWarmServer("it exited (" + DescribeStatus(status) + ")", /*retry=*/true);
        continue;
      }
      // An orphan adopted as pid 1 or as the subreaper (a trainer's leftover, the fork server's).
      spdlog::debug("reaped process {} (not a trainer)", pid);
      continue;
    }
    core_.OnProcessExit(Now(), *r, WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                        WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    if (exit_code_) return;
  }
}

void Agent::Signal(int pid, int signal) { SignalGroup(pid, signal); }

void Agent::Exit(int code, bool confirm, const std::string& sent_exits) {
  if (exit_code_) return;
  if (confirm && session_) {
    spdlog::info("waiting up to {} ms for the manager to confirm this agent's last messages",
                 kFinalClose.count());
    ManagerSession::Closed closed = session_->Close(kFinalClose);
    if (!closed.confirmed)
      spdlog::error("the manager may not have received this agent's last messages ({}); process "
                    "exits sent in this session: {}",
                    closed.reason, sent_exits);
  }
  exit_code_ = code;
}

// ---------------------------------------------------------------------------------------------
// The manager
// ---------------------------------------------------------------------------------------------

// A probe's answer within the core's first report that no manager answers (5 s).
constexpr std::chrono::milliseconds kProbeDeadline{4000};

void Agent::OpenSession() {
  session_ = std::make_unique<ManagerSession>(++session_ids_, channel_, credential_, &inbox_);
  if (probe_) probe_->Start(kProbeDeadline);
  spdlog::debug("manager session {}: connecting to {}", session_->id(), options_.manager_addr);
}

std::string Agent::ConnectFailure() {
  if (!probe_) return "";
  std::string why = probe_->Last();
  probe_->Start(kProbeDeadline);  // for the next report
  return why;
}

void Agent::SendToManager(const v1::AgentMessage& message) {
  if (session_) session_->Send(message);
}

void Agent::CancelSession() {
  if (session_) session_->Cancel();
}

void Agent::OnInbox() {
  for (SessionEvent& event : inbox_.Drain()) {
    if (exit_code_) return;
    if (!session_ || event.session != session_->id()) continue;  // from an ended session
    if (event.kind == SessionEvent::Kind::kClosed) {
      session_.reset();
      core_.OnSessionClosed(Now(), event.detail, event.ended_by_manager);
    } else if (event.kind == SessionEvent::Kind::kOpened) {
      core_.OnSessionOpened(Now());
    } else {
      core_.OnManagerMessage(Now(), event.message);
    }
  }
}

std::vector<uint32_t> Agent::FreePorts() {
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

// ---------------------------------------------------------------------------------------------
// Trainers
// ---------------------------------------------------------------------------------------------

void Agent::OnHello(uint32_t r, const v1::TrainerHello& hello) {
  core_.OnHello(Now(), r, hello);
  if (warm_ && !warm_started_ && core_.every_trainer_heard()) {
    warm_retry_at_.reset();
    StartWarmServer();
  }
}

void Agent::OnMessage(uint32_t r, const v1::TrainerMessage& message) {
  core_.OnTrainerMessage(Now(), r, message);
}

void Agent::OnDisconnect(uint32_t r) { spdlog::info("local rank {} disconnected", r); }

bool Agent::SendToTrainer(uint32_t r, const v1::AgentReply& reply) {
  return server_->Send(r, reply);
}

bool Agent::TrainerConnected(uint32_t r) const { return server_->connected(r); }

}  // namespace regroup::agent
