// SPDX-License-Identifier: Apache-2.0
// Starting and stopping trainer processes: each in its own process group (so the whole tree a
// trainer starts, DataLoader workers included, can be signalled at once), killed by the kernel
// if the agent dies (PR_SET_PDEATHSIG), with no descriptor of the agent's leaking into it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace regroup::agent {

// Resolves `name` like execvp would: a name with a '/' as is, else the first executable match
// in `path` (a colon-separated list; empty: /usr/local/bin:/usr/bin:/bin).
StatusOr<std::string> FindExecutable(const std::string& name, const std::string& path);

// Starts `executable` with `argv` and `env` ("NAME=value" entries) in a new process group whose
// id is the child's pid. Returns once the exec succeeded; an exec failure is an error naming the
// program. Signals blocked or ignored by the caller are reset for the child. No descriptor past
// stdio is inherited, except `pass_fd` (when >= 0), which the child gets as descriptor 3.
StatusOr<pid_t> SpawnProcessGroup(const std::string& executable,
                                  const std::vector<std::string>& argv,
                                  const std::vector<std::string>& env, int pass_fd = -1);

// Sends `signal` to the process group `pgid`; a group already gone is not an error.
void SignalGroup(pid_t pgid, int signal);

// How long process `pid` has run on a CPU, in milliseconds; nothing for a process that is gone
// or a system without /proc. It grows while the process works, even starved (a few milliseconds a
// period), and stands still while it is stopped or blocked.
//  - kMainThread: its main thread (/proc/<pid>/schedstat, else the user and system time of
//    /proc/<pid>/task/<pid>/stat). A trainer stuck in its main thread while threads of its own
//    spin on does not work.
//  - kProcess: all its threads (the user and system time of /proc/<pid>/stat).
enum class CpuOf { kMainThread, kProcess };
std::optional<int64_t> ProcessCpuMs(pid_t pid, CpuOf of = CpuOf::kMainThread);

// `base` ("NAME=value" entries) with `overrides` set, each replacing an entry of the same name.
std::vector<std::string> MergeEnvironment(
    const std::vector<std::string>& base,
    const std::vector<std::pair<std::string, std::string>>& overrides);

// The calling process's environment as "NAME=value" entries.
std::vector<std::string> CurrentEnvironment();

}  // namespace regroup::agent
