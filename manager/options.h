// SPDX-License-Identifier: Apache-2.0
// regroup-manager's command line: the job (a file, or its id, sizes, labels and annotations),
// where to serve, the credential, the coordinator and the durable record, most with an
// environment fallback (a MindCluster manager.py that cannot pass a flag sets its pod's env).
//
//   regroup-manager --job-id default/llama --nodes 4 --nproc-per-node 8
//       --annotation recover-strategy=recover,elastic-training --label fault-scheduling=force
//   regroup-manager --job examples/jobs/elastic-job.yaml
//
// Parsing is pure (the environment is passed in) so tests pin every rule. Reading the credential
// and the record, and connecting to the coordinator, are main's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/environment.h"
#include "common/status.h"
#include "plugin/job_spec.h"

namespace regroup::manager {

// The coordinator's Service in a cluster set up from deploy/.
inline constexpr char kInClusterCoordinator[] = "regroup-coordinator.volcano-system.svc:8899";

struct ManagerOptions {
  // The job.
  std::string job_file;                  // --job: a Volcano Job (YAML) or a job spec (*.json)
  std::string job_id;                    // --job-id; else the job file's, $REGROUP_JOB_ID,
                                         // $MINDX_TASK_ID
  int64_t nodes = 0;                     // --nodes; 0: the job file's
  int64_t nproc = 0;                     // --nproc-per-node; 0: the job file's
  std::vector<std::string> labels;       // --label KEY=VALUE, as given
  std::vector<std::string> annotations;  // --annotation KEY=VALUE, as given
  std::vector<std::string> env;          // --env KEY=VALUE, as given
  std::string keys_source;               // --keys-source: where the labels were read, for the log

  // Serving.
  std::string listen = "0.0.0.0:9601";  // --listen, $REGROUP_MANAGER_LISTEN
  std::string http;                     // --http, $REGROUP_MANAGER_HTTP; empty: none
  bool metrics_open = false;            // --metrics-open
  std::string log_format;               // --log-format, $REGROUP_LOG_FORMAT; checked: text, json
  bool stay_after_done = false;         // --stay-after-done: serve on once the job stopped
  std::string port_file;                // --port-file
  std::string credential_file;  // --credential-file (LoadCredential reads the env fallbacks)
  bool insecure = false;        // --insecure: no credential, every client accepted
  std::string tls_cert;         // --tls-cert
  std::string tls_key;          // --tls-key
  std::string tls_client_ca;    // --tls-client-ca: mutual TLS, clients need a certificate
  int64_t join_window_s = 30;   // --join-window-s
  int64_t epoch = 0;            // --epoch; 0: the clock in ms (above the record's)
  std::string record_file;      // --record, $REGROUP_RECORD_FILE
  bool no_record = false;       // --no-record: standalone without a record, the risk accepted

  // The coordinator: --coordinator, $REGROUP_COORDINATOR_ADDR; else, in a Kubernetes pod given a
  // coordinator token, kInClusterCoordinator; else none (the embedded engine decides).
  std::string coordinator;
  std::string coordinator_credential_file;  // --coordinator-credential-file,
                                            // $REGROUP_COORDINATOR_CREDENTIAL_FILE
  std::string coordinator_ca;               // --coordinator-ca
  std::string coordinator_server_name;      // --coordinator-server-name
  // This manager's own certificate and key for a coordinator that requires one (its client CA:
  // mutual TLS): --coordinator-tls-cert, $REGROUP_COORDINATOR_TLS_CERT_FILE and
  // --coordinator-tls-key, $REGROUP_COORDINATOR_TLS_KEY_FILE. Both or neither; need
  // --coordinator-ca.
  std::string coordinator_tls_cert;
  std::string coordinator_tls_key;
};

struct CommandLine {
  ManagerOptions options;
  std::vector<std::string> notices;  // defaults worth a log line (the in-cluster coordinator)
  std::vector<std::string> warnings;  // risks the command line accepts (--no-record): logged
                                      // as warnings at every start
  // --help or --version: what to print on stdout before exiting 0 (nothing else is parsed).
  std::optional<std::string> reply;
};

// Parses the arguments after the program name and applies the environment fallbacks. An error
// names the flag (or the variable), the value and what is allowed; the caller prints it after
// "regroup-manager: " and exits 2. A standalone manager (no coordinator) needs a durable record
// (--record) or --no-record: nothing else fences a second manager of the job (docs/design.md,
// "Generations, fencing and the step commit").
StatusOr<CommandLine> ParseCommandLine(const std::vector<std::string>& args, const EnvLookup& env);

// The rule ParseCommandLine applies last: with no coordinator, a record or --no-record (whose
// warning it adds to `line.warnings`); --no-record with a record is an error.
Status CheckFenced(CommandLine& line);

// The job as the options give it: the --job file, then --job-id (else the file's id, else
// $REGROUP_JOB_ID, $MINDX_TASK_ID), --nodes, --nproc-per-node and the KEY=VALUE flags over it.
// An error names the flag or the file; the caller exits 2.
StatusOr<JobSpec> ReadJobSpec(const ManagerOptions& options, const EnvLookup& env);

// Where the job's labels and annotations came from, for the log: the job file, the
// --label/--annotation flags (or --keys-source) or nowhere.
std::string KeysSource(const ManagerOptions& options);

}  // namespace regroup::manager
