// SPDX-License-Identifier: Apache-2.0
#include "manager/options.h"

#include <fstream>
#include <map>
#include <sstream>
#include <utility>

#include <CLI/CLI.hpp>

#include "common/address.h"
#include "common/log_format.h"
#include "common/version.h"
#include "plugin/config.h"
#include "plugin/volcano_job.h"

namespace regroup::manager {
namespace {

// The flags, their help and their ranges: `regroup-manager --help` prints them in this order.
void AddFlags(CLI::App& app, ManagerOptions& o) {
  app.add_option("--job", o.job_file, "the job: a Volcano Job (YAML) or a job spec (JSON)");
  app.add_option("--job-id", o.job_id, "the job's id (default: $REGROUP_JOB_ID or $MINDX_TASK_ID)");
  app.add_option("--nodes,--node-nums", o.nodes, "training pods (agents) of the job")
      ->check(CLI::Range(int64_t{1}, kMaxPods));
  app.add_option("--nproc-per-node,--proc-per-node", o.nproc, "processes per pod")
      ->check(CLI::Range(int64_t{1}, kMaxProcessesPerPod));
  app.add_option("--label", o.labels, "a job label KEY=VALUE (repeatable)");
  app.add_option("--annotation", o.annotations, "a job annotation KEY=VALUE (repeatable)");
  app.add_option("--env", o.env, "rank 0's environment KEY=VALUE (MINDIO_WAIT_MINDX_TIME)");
  app.add_option("--keys-source", o.keys_source,
                 "where the --label/--annotation values were read, for the log (regroup.api "
                 "gives \"the Kubernetes API: Job NS/NAME ...\" when it read them there)");
  app.add_option("--listen", o.listen,
                 "gRPC address (port 0: any free port; default: $REGROUP_MANAGER_LISTEN, else "
                 "0.0.0.0:9601, MindCluster's port)");
  app.add_option("--http", o.http,
                 "HTTP address for /metrics and /status (default: $REGROUP_MANAGER_HTTP, else "
                 "none: a manager.py that cannot pass it gets it from its pod's env). On a loopback address "
                 "they are open; elsewhere each request needs \"Authorization: Bearer <the job's "
                 "credential>\". With --tls-cert/--tls-key it is HTTPS");
  app.add_flag("--metrics-open", o.metrics_open,
               "serve /metrics without the credential on a non-loopback --http (for a Prometheus "
               "that has no token); /status still needs it");
  app.add_option("--log-format", o.log_format,
                 "text (spdlog's lines) or json (one object a line: time, level, logger, "
                 "message) (default: $REGROUP_LOG_FORMAT, else text)");
  app.add_flag("--stay-after-done", o.stay_after_done,
               "keep serving /status and regroupctl status once the job stopped and every pod "
               "left (default: exit 0 then)");
  app.add_option("--port-file", o.port_file, "write the gRPC port here once listening");
  app.add_option("--credential-file", o.credential_file,
                 "the job's credential (default: $REGROUP_CREDENTIAL_FILE, $REGROUP_CREDENTIAL)");
  app.add_option("--coordinator-credential-file", o.coordinator_credential_file,
                 "the job's token at the coordinator (regroupctl token), when it is not the job's "
                 "credential (default: $REGROUP_COORDINATOR_CREDENTIAL_FILE, else the job's "
                 "credential)");
  app.add_flag("--insecure", o.insecure,
               "serve without a job credential, accepting every client (tests on a trusted "
               "machine only; a warning says so at every start)");
  app.add_option("--tls-cert", o.tls_cert, "serve TLS with this certificate (PEM)");
  app.add_option("--tls-key", o.tls_key, "... and this key (PEM)");
  app.add_option("--tls-client-ca", o.tls_client_ca,
                 "mutual TLS: every gRPC client (agent, regroupctl) must present a certificate "
                 "this CA bundle (PEM) signed; clients without one are refused at the handshake. "
                 "Off loopback, /status and /metrics (HTTPS) need one too, besides the "
                 "credential; /healthz and /readyz do not (needs --tls-cert/--tls-key)");
  app.add_option("--join-window-s", o.join_window_s, "how long the first rendezvous waits")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  app.add_option("--epoch", o.epoch,
                 "this incarnation's epoch, standalone only: with --coordinator the coordinator "
                 "grants it (default: the clock in ms, above the --record's)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 60));
  app.add_option("--record", o.record_file,
                 "the job's durable record (a small JSON file on storage that outlives this "
                 "manager, e.g. the checkpoint folder; default: $REGROUP_RECORD_FILE): it grants "
                 "epochs and keeps lost pods fenced, the job's end and the majority a restarted "
                 "manager needs. A manager without --coordinator needs it, or --no-record");
  app.add_flag("--no-record", o.no_record,
               "run without --coordinator and without a durable record, accepting the risk that "
               "a second manager started for this job trains beside this one with pods of its "
               "own (nothing fences either); a warning says so at every start");
  app.add_option("--coordinator", o.coordinator,
                 "the coordinator HOST:PORT that makes the scheduling decisions and holds the "
                 "job's labels and annotations (default: $REGROUP_COORDINATOR_ADDR; else, in a "
                 "Kubernetes pod given a coordinator token, "
                 "regroup-coordinator.volcano-system.svc:8899; else none: the embedded engine "
                 "decides, by the keys of --job or --label/--annotation)");
  app.add_option("--coordinator-ca", o.coordinator_ca,
                 "connect to the coordinator over TLS, trusting this CA bundle (PEM)");
  app.add_option("--coordinator-server-name", o.coordinator_server_name,
                 "the name the coordinator's certificate must carry, when it is not the host of "
                 "--coordinator (needs --coordinator-ca)");
  app.add_option("--coordinator-tls-cert", o.coordinator_tls_cert,
                 "mutual TLS: this manager's certificate (PEM) for a coordinator that requires "
                 "one (its client CA); needs --coordinator-ca and --coordinator-tls-key "
                 "(default: $REGROUP_COORDINATOR_TLS_CERT_FILE)");
  app.add_option("--coordinator-tls-key", o.coordinator_tls_key,
                 "... and its key (PEM) (default: $REGROUP_COORDINATOR_TLS_KEY_FILE)");
  app.set_version_flag("--version", std::string("regroup-manager ") + REGROUP_VERSION_STRING,
                       "print the version and exit");
}

// A variable's value; unset and empty are both nothing.
std::optional<std::string> NonEmpty(const EnvLookup& env, const char* name) {
  auto value = env(name);
  if (value && value->empty()) return std::nullopt;
  return value;
}

// Each KEY=VALUE of `items` (given with `flag`) into `into`.
Status SplitKeyValues(const std::vector<std::string>& items, const char* flag,
                      std::map<std::string, std::string>& into) {
  for (const std::string& item : items) {
    const auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      return InvalidArgument(std::string(flag) + " \"" + item +
                             "\" is not KEY=VALUE: give a non-empty key, '=' and the value");
    into[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return Status::Ok();
}

}  // namespace

StatusOr<CommandLine> ParseCommandLine(const std::vector<std::string>& args, const EnvLookup& env) {
  CommandLine out;
  ManagerOptions& o = out.options;
  CLI::App app{"regroup-manager: the per-job manager of Regroup", "regroup-manager"};
  AddFlags(app, o);
  app.allow_extras();  // named below, more plainly than CLI11 does
  try {
    app.parse(std::vector<std::string>(args.rbegin(), args.rend()));  // CLI11 takes them reversed
  } catch (const CLI::ParseError& e) {
    std::ostringstream printed, error;
    if (app.exit(e, printed, error) == 0) {  // --help, --version
      out.reply = printed.str();
      return out;
    }
    std::string message = error.str();
    while (!message.empty() && message.back() == '\n') message.pop_back();
    return InvalidArgument(message);
  }
  if (const auto extras = app.remaining(); !extras.empty())
    return InvalidArgument(extras[0].starts_with("-")
                               ? "unknown flag " + extras[0] + ": see regroup-manager --help"
                               : "unexpected argument \"" + extras[0] +
                                     "\": regroup-manager takes flags only (see --help)");

  if (app.count("--listen") == 0)
    if (auto v = NonEmpty(env, "REGROUP_MANAGER_LISTEN")) o.listen = *v;
  if (o.http.empty()) o.http = NonEmpty(env, "REGROUP_MANAGER_HTTP").value_or("");
  for (auto [flag, address] : {std::pair{"--listen", &o.listen}, std::pair{"--http", &o.http}})
    if (!address->empty())
      REGROUP_RETURN_IF_ERROR(CheckHostPort(*address, flag, /*port_zero_allowed=*/true));
  if (o.record_file.empty()) o.record_file = NonEmpty(env, "REGROUP_RECORD_FILE").value_or("");
  const bool format_given = !o.log_format.empty();
  if (!format_given) o.log_format = NonEmpty(env, "REGROUP_LOG_FORMAT").value_or("text");
  if (auto format = ParseLogFormat(o.log_format); !format.ok())
    return InvalidArgument((format_given ? "--log-format " : "$REGROUP_LOG_FORMAT ") +
                           format.status().message());

  std::string coordinator_from = "--coordinator";  // for the errors
  if (o.coordinator.empty()) {
    o.coordinator = NonEmpty(env, "REGROUP_COORDINATOR_ADDR").value_or("");
    coordinator_from = "$REGROUP_COORDINATOR_ADDR";
  }
  if (o.coordinator_credential_file.empty())
    o.coordinator_credential_file =
        NonEmpty(env, "REGROUP_COORDINATOR_CREDENTIAL_FILE").value_or("");
  if (o.coordinator_tls_cert.empty())
    o.coordinator_tls_cert = NonEmpty(env, "REGROUP_COORDINATOR_TLS_CERT_FILE").value_or("");
  if (o.coordinator_tls_key.empty())
    o.coordinator_tls_key = NonEmpty(env, "REGROUP_COORDINATOR_TLS_KEY_FILE").value_or("");
  // Alone, one of the two would be ignored and the coordinator would refuse this manager at
  // the handshake; without a CA file the link is plaintext and presents nothing.
  if (!o.coordinator_tls_cert.empty() || !o.coordinator_tls_key.empty()) {
    if (o.coordinator_tls_cert.empty() || o.coordinator_tls_key.empty())
      return InvalidArgument(
          "--coordinator-tls-cert and --coordinator-tls-key (or "
          "$REGROUP_COORDINATOR_TLS_CERT_FILE, $REGROUP_COORDINATOR_TLS_KEY_FILE), this "
          "manager's certificate for the coordinator, go together: " +
          (o.coordinator_tls_cert.empty() ? "the key " + o.coordinator_tls_key
                                          : "the certificate " + o.coordinator_tls_cert) +
          " is given alone");
    if (o.coordinator_ca.empty())
      return InvalidArgument("--coordinator-tls-cert " + o.coordinator_tls_cert +
                             " needs --coordinator-ca: without it the link to the coordinator "
                             "is plaintext");
  }
  // Inside a Kubernetes pod that holds its job's coordinator token, the coordinator is found at
  // its Service (deploy/helm/regroup/templates/scheduler.yaml) with no address given.
  if (o.coordinator.empty() && !o.coordinator_credential_file.empty() &&
      NonEmpty(env, "KUBERNETES_SERVICE_HOST")) {
    o.coordinator = kInClusterCoordinator;
    coordinator_from = "a Kubernetes pod with a coordinator token";
    out.notices.push_back(
        std::string("in a Kubernetes pod with a coordinator token: the coordinator is ") +
        kInClusterCoordinator + " (set --coordinator or $REGROUP_COORDINATOR_ADDR for another)");
  }
  if (!o.coordinator.empty() && o.epoch != 0)
    return InvalidArgument("--epoch cannot be given with --coordinator: the coordinator grants "
                           "this manager's epoch (the coordinator is " +
                           o.coordinator + ", from " + coordinator_from + ")");
  REGROUP_RETURN_IF_ERROR(CheckFenced(out));
  return out;
}

Status CheckFenced(CommandLine& line) {
  const ManagerOptions& o = line.options;
  if (o.no_record && !o.record_file.empty())
    return InvalidArgument("--no-record cannot be given with a record (" + o.record_file +
                           ", from --record or $REGROUP_RECORD_FILE): give one of them");
  if (!o.coordinator.empty()) {  // the coordinator's lease fences an older incarnation
    if (o.no_record)
      line.notices.push_back("--no-record: the coordinator at " + o.coordinator +
                             " fences the job's managers; the flag changes nothing");
    return Status::Ok();
  }
  if (!o.record_file.empty()) return Status::Ok();
  if (!o.no_record)
    return InvalidArgument(
        "no durable record: a manager without --coordinator is fenced only by its job's record. "
        "Give --record FILE (or $REGROUP_RECORD_FILE), a file on storage that every incarnation "
        "of this job reaches (e.g. its checkpoint folder), so that a second manager started for "
        "the job stops the older one; or give --no-record to accept the risk that a second "
        "manager trains beside this one with pods of its own");
  line.warnings.push_back(
      "--no-record: no durable record and no coordinator: nothing fences another manager of this "
      "job, so a second one started for it (a rescheduled pod, an operator's retry) trains beside "
      "this one with pods of its own and both commit steps. Give --record FILE on storage every "
      "incarnation of the job reaches to close this");
  return Status::Ok();
}

StatusOr<JobSpec> ReadJobSpec(const ManagerOptions& o, const EnvLookup& env) {
  JobSpec spec;
  if (!o.job_file.empty()) {
    std::ifstream in(o.job_file);
    if (!in) return InvalidArgument("--job: cannot read " + o.job_file);
    std::stringstream text;
    text << in.rdbuf();
    auto parsed = o.job_file.ends_with(".json") ? ParseJobSpec(std::string_view(text.str()))
                                                : JobSpecFromVolcanoYaml(text.str());
    if (!parsed.ok())
      return InvalidArgument("--job " + o.job_file + ": " + parsed.status().message());
    spec = std::move(*parsed);
  }
  if (!o.job_id.empty()) spec.id = o.job_id;
  if (spec.id.empty())
    spec.id = NonEmpty(env, "REGROUP_JOB_ID").value_or(NonEmpty(env, "MINDX_TASK_ID").value_or(""));
  if (o.nodes > 0) spec.pods = o.nodes;
  if (o.nproc > 0) spec.processes_per_pod = o.nproc;
  REGROUP_RETURN_IF_ERROR(SplitKeyValues(o.labels, "--label", spec.labels));
  REGROUP_RETURN_IF_ERROR(SplitKeyValues(o.annotations, "--annotation", spec.annotations));
  REGROUP_RETURN_IF_ERROR(SplitKeyValues(o.env, "--env", spec.env));
  if (spec.id.empty() || spec.pods < 1)
    return InvalidArgument(
        "give the job with --job, or --job-id (or $MINDX_TASK_ID) and --nodes");
  return spec;
}

std::string KeysSource(const ManagerOptions& o) {
  if (!o.job_file.empty()) return "the job file " + o.job_file;
  if (o.labels.empty() && o.annotations.empty())
    return "nowhere (no --job, --label or --annotation)";
  return o.keys_source.empty() ? "--label/--annotation" : o.keys_source;
}

}  // namespace regroup::manager
