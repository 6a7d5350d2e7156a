// SPDX-License-Identifier: Apache-2.0
#include "agent/warm_starter.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "agent/process.h"
#include "common/framing.h"
#include "regroup/v1/wire.pb.h"

namespace regroup::agent {
namespace {

namespace v1 = ::regroup::v1;

// A fork server's answers are a few hundred bytes.
constexpr size_t kMaxReplyBytes = 64 << 10;

// Waits up to `timeout` for `fd` to be readable.
bool WaitReadable(int fd, std::chrono::milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    int n = poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count())));
    if (n > 0) return true;
    if (n == 0 || errno != EINTR) return false;
  }
}

}  // namespace

Status MakeSubreaper() {
  if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0)
    return FailedPrecondition(std::string("prctl(PR_SET_CHILD_SUBREAPER): ") +
                              std::strerror(errno));
  return Status::Ok();
}

Status WarmStarter::Start() {
  Stop();
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0)
    return FailedPrecondition(std::string("socketpair: ") + std::strerror(errno));
  std::string imports;
  for (const auto& m : config_.imports) imports += (imports.empty() ? "" : ",") + m;
  std::vector<std::string> argv = {config_.python, "-u", "-m", "regroup.warm", "--import", imports};
  if (!config_.script_dir.empty()) argv.insert(argv.end(), {"--script-dir", config_.script_dir});
  auto pid = SpawnProcessGroup(config_.python, argv, config_.env, pair[1]);
  close(pair[1]);
  if (!pid.ok()) {
    close(pair[0]);
    return pid.status();
  }
  pid_ = *pid;
  sock_ = pair[0];
  ready_ = false;
  // Every read of its answers is bounded, even one of a frame it stopped writing halfway.
  timeval bound{2, 0};
  setsockopt(sock_, SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof bound);
  return Status::Ok();
}

Status WarmStarter::OnReadable() {
  if (sock_ < 0) return FailedPrecondition("no fork server runs");
  std::string payload;
  StatusOr<bool> got = ReadFrame(sock_, &payload, kMaxReplyBytes);
  v1::WarmReady ready;
  Status why = !got.ok()    ? got.status()
               : !*got      ? FailedPrecondition("it exited before it was ready (see its output)")
                            : ParseFrame(payload, &ready, "the fork server's WarmReady");
  if (why.ok() && !ready.error().empty()) why = FailedPrecondition(ready.error());
  if (!why.ok()) {
    Stop();
    return why;
  }
  ready_ = true;
  return Status::Ok();
}

StatusOr<pid_t> WarmStarter::Fork(uint32_t local_rank, bool module,
                                  const std::vector<std::string>& args,
                                  const std::vector<std::string>& env,
                                  std::chrono::milliseconds timeout) {
  if (!ready_) return FailedPrecondition("the fork server is not ready");
  v1::WarmStart request;
  request.set_local_rank(local_rank);
  request.set_module(module);
  for (const auto& a : args) request.add_args(a);
  for (const auto& e : env) request.add_env(e);
  std::error_code ec;
  request.set_cwd(std::filesystem::current_path(ec).string());
  request.set_reaper_pid(getpid());
  Status sent = WriteFrame(sock_, request, static_cast<int>(timeout.count()));
  std::string payload;
  StatusOr<bool> got = false;
  if (sent.ok() && !WaitReadable(sock_, timeout))
    sent = FailedPrecondition("no answer within " + std::to_string(timeout.count()) + " ms");
  if (sent.ok()) got = ReadFrame(sock_, &payload, kMaxReplyBytes);
  v1::WarmStarted reply;
  Status why = !sent.ok()   ? sent
               : !got.ok()  ? got.status()
               : !*got      ? FailedPrecondition("the fork server closed its socket")
                            : ParseFrame(payload, &reply, "the fork server's WarmStarted");
  if (!why.ok()) {
    const std::string server = "fork server (pid " + std::to_string(pid_) + "): ";
    Stop();  // its framing or its process is lost
    return FailedPrecondition(server + why.message());
  }
  if (reply.pid() <= 0) return FailedPrecondition("fork server: " + reply.error());
  return static_cast<pid_t>(reply.pid());
}

void WarmStarter::OnExited() {
  pid_ = -1;
  ready_ = false;
  if (sock_ >= 0) close(sock_);
  sock_ = -1;
}

void WarmStarter::Stop() {
  if (pid_ > 0) SignalGroup(pid_, SIGKILL);  // reaped by the agent, as any child
  OnExited();
}

}  // namespace regroup::agent
