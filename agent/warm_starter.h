// SPDX-License-Identifier: Apache-2.0
// Warm trainer starts: the agent's fork server (python/regroup/warm.py), a process that has
// already imported torch, the regroup library and the job's listed modules, and forks a ready
// trainer on request. A crashed rank's new process then skips the interpreter's start and the
// imports (about a second for torch) that every survivor would otherwise wait for.
//
// The server is started with the pod's environment (local rank 0's) next to the trainers, and
// is told what to fork over a socket pair (its descriptor 3; WarmReady, WarmStart, WarmStarted
// in proto/regroup/v1/wire.proto). Each trainer it forks is adopted by the agent, which must be
// a child subreaper (prctl PR_SET_CHILD_SUBREAPER, see MakeSubreaper): the agent reaps and
// signals it exactly like a trainer it started itself. Whenever the server is not ready (still
// importing, refused to fork, died, did not answer in time) the caller starts the process
// plainly; a server that died is started again with a backoff.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace regroup::agent {

// Makes this process the reaper of its orphaned descendants (the forked trainers).
Status MakeSubreaper();

class WarmStarter {
 public:
  struct Config {
    std::string python;                // the interpreter, resolved (as the trainers are run)
    std::vector<std::string> imports;  // modules to import before forking
    std::string script_dir;            // searched first for them (the training script's folder)
    std::vector<std::string> env;      // the server's environment ("NAME=value")
  };

  explicit WarmStarter(Config config) : config_(std::move(config)) {}
  ~WarmStarter() { Stop(); }
  WarmStarter(const WarmStarter&) = delete;
  WarmStarter& operator=(const WarmStarter&) = delete;

  // Starts the server. Its WarmReady arrives later on fd() (call OnReadable then).
  Status Start();
  // The socket to watch until the server is ready; -1 when no server runs.
  int fd() const { return sock_; }
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }
  bool ready() const { return ready_; }
  // Reads the server's WarmReady. An error says why it cannot serve (an import failed, it has a
  // thread...); the server is then stopped, and starting it again would not help.
  Status OnReadable();
  // Forks one trainer that runs `args` (SCRIPT ARGS..., or MODULE ARGS... when `module`) with
  // exactly `env`, in the agent's working directory, adopted by this process. An error says why
  // none was started; the server is then stopped unless it only refused this one request.
  StatusOr<pid_t> Fork(uint32_t local_rank, bool module, const std::vector<std::string>& args,
                       const std::vector<std::string>& env, std::chrono::milliseconds timeout);
  // The server process exited and was reaped by the caller: forget it.
  void OnExited();
  // Kills the server (its process group) and closes the socket.
  void Stop();

 private:
  Config config_;
  pid_t pid_ = -1;
  int sock_ = -1;
  bool ready_ = false;
};

}  // namespace regroup::agent
