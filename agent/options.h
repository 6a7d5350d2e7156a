// SPDX-License-Identifier: Apache-2.0
// regroup-agent's command line: torchrun's flags, the agent's own options (each with an
// environment fallback), then the training script and its arguments.
//
//   regroup-agent [agent options] [torchrun flags] SCRIPT [ARGS...]
//   regroup-agent [agent options] [torchrun flags] -- SCRIPT [ARGS...]
//
// Parsing is pure (the environment is passed in) so tests pin every rule; the defaults that need
// the machine (a random pod uid, this host's address, $TMPDIR) are filled in by ResolveDefaults.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/environment.h"
#include "common/status.h"

namespace regroup::agent {

struct AgentOptions {
  // Agent options.
  // --manager, REGROUP_MANAGER_ADDR; else $MASTER_ADDR:9601, else --master-addr:9601 (when
  // given), else 127.0.0.1:9601.
  std::string manager_addr = "127.0.0.1:9601";
  std::string job_id;           // --job-id, REGROUP_JOB_ID, MINDX_TASK_ID
  std::string pod_uid;          // --pod-uid, REGROUP_POD_UID; default: random
  std::string pod_name;         // --pod-name, REGROUP_POD_NAME, HOSTNAME; default: hostname
  std::string node_name;        // --node-name, REGROUP_NODE_NAME; default: hostname
  std::string host;             // --host, REGROUP_HOST; see ResolveDefaults
  std::string socket_dir;       // --socket-dir, REGROUP_SOCKET_DIR; default $TMPDIR/regroup-<uid>
  std::string credential_file;  // --credential-file (LoadCredential reads the env fallbacks)
  std::string tls_ca_file;      // --tls-ca, REGROUP_TLS_CA_FILE; empty: plaintext
  std::string tls_server_name;  // --tls-server-name, REGROUP_TLS_SERVER_NAME; needs --tls-ca
  std::string tls_cert_file;    // --tls-cert, REGROUP_TLS_CERT_FILE: the agent's own (mTLS)
  std::string tls_key_file;     // --tls-key, REGROUP_TLS_KEY_FILE
  int reconnect_timeout_s = 60;  // --reconnect-timeout-s, REGROUP_RECONNECT_TIMEOUT_S
  int stop_grace_s = 30;         // --stop-grace-s, REGROUP_STOP_GRACE_S
  // --connect-timeout-s, REGROUP_CONNECT_TIMEOUT_S: warn once about a trainer that runs this
  // long without connecting to the agent (a script that does not use the regroup library).
  int connect_timeout_s = 300;
  std::string python = "python3";  // --python, PYTHON
  std::string log_level = "info";  // --log-level, REGROUP_LOG_LEVEL
  std::string log_format = "text";  // --log-format, REGROUP_LOG_FORMAT: text or json
  // --warm-start, REGROUP_WARM_START: restarts fork from a server that imported these modules
  // (--warm-imports, REGROUP_WARM_IMPORTS); see warm_starter.h. Never with --no-python.
  bool warm_start = true;
  std::vector<std::string> warm_imports = {"torch", "torch.distributed", "regroup.trainer"};

  // torchrun flags (PET_* environment fallbacks, as torchrun has).
  int nnodes_min = 1;  // --nnodes N or MIN:MAX
  int nnodes_max = 1;
  int nproc = 1;        // --nproc-per-node
  int node_rank = -1;   // --node-rank; -1: the manager assigns one (default when nnodes > 1)
  std::string master_addr = "127.0.0.1";  // --master-addr
  int master_port = 29500;                // --master-port
  bool module = false;     // -m / --module: SCRIPT is a Python module
  bool no_python = false;  // --no-python: SCRIPT is an executable, run without the interpreter

  // The training script and its arguments.
  std::vector<std::string> script;
};

struct CommandLine {
  AgentOptions options;
  std::vector<std::string> notices;  // one per torchrun flag accepted and ignored
  bool help = false;                 // --help: print Usage() and exit 0
  bool version = false;              // --version: print "regroup-agent VERSION" and exit 0
};

// Parses the arguments after the program name. An error names the flag, the value and what is
// allowed (the caller prints it and exits 2).
StatusOr<CommandLine> ParseCommandLine(const std::vector<std::string>& args,
                                       const EnvLookup& env);

// Fills what parsing left to the machine: pod uid (random), pod and node names (hostname),
// host (the --master-addr on node rank 0, else the first non-loopback IPv4, else 127.0.0.1),
// socket directory ($TMPDIR or /tmp, then regroup-<pod uid>).
void ResolveDefaults(AgentOptions& options, const EnvLookup& env);

// Checks what ResolveDefaults produced against the machine: the trainer socket path fits a Unix
// socket address, and the interpreter (or, with --no-python, the script) can be run. An error
// names the flag to change.
Status CheckResolved(const AgentOptions& options, const EnvLookup& env);

// A random RFC 4122 version-4 uid.
std::string RandomUid();

// The first non-loopback IPv4 address of this machine, if any.
std::optional<std::string> FirstNonLoopbackIpv4();

// The trainer's command line: [python, -u, SCRIPT, ARGS...], [python, -u, -m, MODULE, ARGS...]
// or [SCRIPT, ARGS...] with --no-python.
std::vector<std::string> TrainerArgv(const AgentOptions& options);

// The variables a trainer gets on top of the agent's environment: torchrun's (RANK, LOCAL_RANK,
// WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_*, MASTER_ADDR, MASTER_PORT;
// rank and world size are provisional: a generation's StartGeneration has the real ones) and
// Regroup's (REGROUP_AGENT_SOCKET, REGROUP_LOCAL_RANK, REGROUP_JOB_ID, REGROUP_POD_UID). An
// unknown node rank (-1) counts as 0. OMP_NUM_THREADS=1 when several processes share the pod
// and `omp_num_threads_set` is false, as torchrun does.
std::vector<std::pair<std::string, std::string>> TrainerEnvironment(
    const AgentOptions& options, int node_rank, uint32_t local_rank,
    const std::string& socket_path, bool omp_num_threads_set);

std::string Usage();

}  // namespace regroup::agent
