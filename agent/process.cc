// SPDX-License-Identifier: Apache-2.0
#include "agent/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/close_range.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string_view>
#include <unordered_set>

extern char** environ;

namespace regroup::agent {

StatusOr<std::string> FindExecutable(const std::string& name, const std::string& path) {
  if (name.empty()) return InvalidArgument("an empty program name");
  auto executable = [](const std::string& candidate) {
    struct stat st {};
    return stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
           access(candidate.c_str(), X_OK) == 0;
  };
  if (name.find('/') != std::string::npos) {
    if (executable(name)) return name;
    return FailedPrecondition("cannot run " + name + ": it is not an executable file");
  }
  static const std::string kDefaultPath = "/usr/local/bin:/usr/bin:/bin";
  const std::string& dirs = path.empty() ? kDefaultPath : path;
  size_t start = 0;
  for (;;) {
    size_t colon = dirs.find(':', start);
    std::string_view dir = std::string_view(dirs).substr(
        start, colon == std::string::npos ? colon : colon - start);
    if (dir.empty()) dir = ".";
    std::string candidate = std::string(dir) + "/" + name;
    if (executable(candidate)) return candidate;
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return FailedPrecondition("cannot run " + name + ": not found in PATH (" + dirs + ")");
}

StatusOr<pid_t> SpawnProcessGroup(const std::string& executable,
                                  const std::vector<std::string>& argv,
                                  const std::vector<std::string>& env, int pass_fd) {
  // Everything the child touches is prepared here: after fork only async-signal-safe calls.
  std::vector<char*> c_argv;
  for (const auto& a : argv) c_argv.push_back(const_cast<char*>(a.c_str()));
  c_argv.push_back(nullptr);
  std::vector<char*> c_env;
  for (const auto& e : env) c_env.push_back(const_cast<char*>(e.c_str()));
  c_env.push_back(nullptr);
  const char* path = executable.c_str();

  int error_pipe[2];
  if (pipe2(error_pipe, O_CLOEXEC) != 0)
    return FailedPrecondition(std::string("cannot start a trainer: pipe: ") + std::strerror(errno));
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    int err = errno;
    close(error_pipe[0]);
    close(error_pipe[1]);
    return FailedPrecondition(std::string("cannot start a trainer: fork: ") + std::strerror(err));
  }
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the agent died between fork and prctl
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; ++sig)
      if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    // The descriptor handed over becomes 3 (the error pipe moves out of its way first).
    int error_fd = error_pipe[1];
    int first_closed = 3;
    if (pass_fd >= 0) {
      if (error_fd == 3) error_fd = fcntl(error_fd, F_DUPFD_CLOEXEC, 4);
      if (pass_fd == 3 ? fcntl(3, F_SETFD, 0) != 0 : dup2(pass_fd, 3) != 3) {
        int err = errno;
        ssize_t ignored = write(error_fd, &err, sizeof err);
        (void)ignored;
        _exit(127);
      }
      first_closed = 4;
    }
    // Every other inherited descriptor past stdio closes at exec (gRPC's sockets, the epoll
    // set...).
    if (close_range(static_cast<unsigned>(first_closed), ~0U, CLOSE_RANGE_CLOEXEC) != 0)
      for (int fd = first_closed; fd < 65536; ++fd) fcntl(fd, F_SETFD, FD_CLOEXEC);
    execve(path, c_argv.data(), c_env.data());
    int err = errno;
    ssize_t ignored = write(error_fd, &err, sizeof err);
    (void)ignored;
    _exit(127);
  }
  setpgid(pid, pid);  // also here, so the group exists before anyone signals it
  close(error_pipe[1]);
  int child_errno = 0;
  ssize_t n;
  do {
    n = read(error_pipe[0], &child_errno, sizeof child_errno);
  } while (n < 0 && errno == EINTR);
  close(error_pipe[0]);
  if (n == sizeof child_errno) {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return FailedPrecondition("cannot run " + executable + ": " + std::strerror(child_errno));
  }
  return pid;
}

void SignalGroup(pid_t pgid, int signal) {
  if (pgid > 0) kill(-pgid, signal);
}

std::optional<int64_t> ProcessCpuMs(pid_t pid, CpuOf of) {
  if (pid <= 0) return std::nullopt;
  const std::string dir = "/proc/" + std::to_string(pid);
  if (of == CpuOf::kMainThread) {
    std::ifstream in(dir + "/schedstat");
    uint64_t ns = 0;
    if (in >> ns) return static_cast<int64_t>(ns / 1000000);
  }
  std::ifstream in(of == CpuOf::kMainThread ? dir + "/task/" + std::to_string(pid) + "/stat"
                                            : dir + "/stat");
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses; fields 14 and 15 (utime,
  // stime, in clock ticks) count from the last ')'.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(line.substr(close + 1));
  std::string field;
  uint64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14) utime = std::strtoull(field.c_str(), nullptr, 10);
    if (i == 15) stime = std::strtoull(field.c_str(), nullptr, 10);
  }
  if (!fields) return std::nullopt;
  const long ticks = sysconf(_SC_CLK_TCK);
  if (ticks <= 0) return std::nullopt;
  return static_cast<int64_t>((utime + stime) * 1000 / static_cast<uint64_t>(ticks));
}

std::vector<std::string> MergeEnvironment(
    const std::vector<std::string>& base,
    const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::unordered_set<std::string> replaced;
  for (const auto& [name, value] : overrides) replaced.insert(name);
  std::vector<std::string> out;
  for (const auto& entry : base) {
    std::string name = entry.substr(0, entry.find('='));
    if (!replaced.count(name)) out.push_back(entry);
  }
  for (const auto& [name, value] : overrides) out.push_back(name + "=" + value);
  return out;
}

std::vector<std::string> CurrentEnvironment() {
  std::vector<std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) out.emplace_back(*e);
  return out;
}

}  // namespace regroup::agent
