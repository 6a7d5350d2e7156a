// regroup-manager: one per job. Forms generations from the job's agents, detects faults, runs the
// step commit and carries out the recovery decisions: made by its embedded engine (standalone),
// or with --coordinator by the scheduler's engine, through the coordinator in libregroup.so.
//
//   regroup-manager --job-id default/llama --nodes 4 --nproc-per-node 8
//       --annotation recover-strategy=recover,elastic-training --label fault-scheduling=force
//   regroup-manager --job examples/jobs/elastic-job.yaml
#include <cerrno>
#include <csignal>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "plugin/volcano_job.h"
#include "common/address.h"
#include "common/clock.h"
#include "common/credential.h"
#include "common/grpc_settings.h"
#include "common/log_limit.h"
#include "manager/remote_decisions.h"
#include "manager/service.h"

namespace {

// The coordinator's Service in a cluster set up from deploy/.
constexpr const char* kInClusterCoordinator = "regroup-coordinator.volcano-system.svc:8899";

volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

bool SplitKeyValue(const std::string& item, std::map<std::string, std::string>& into) {
  const auto eq = item.find('=');
  if (eq == std::string::npos || eq == 0) return false;
  into[item.substr(0, eq)] = item.substr(eq + 1);
  return true;
}

const char* Env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"regroup-manager: the per-job manager of Regroup"};
  std::string job_file, job_id, listen = "0.0.0.0:9601", http, credential_file, tls_cert, tls_key,
                                port_file, coordinator, coordinator_ca, coordinator_server_name;
  int64_t nodes = 0, nproc = 0, join_window_s = 30, epoch = 0;
  std::vector<std::string> labels, annotations, envs;
  app.add_option("--job", job_file, "the job: a Volcano Job (YAML) or a job spec (JSON)");
  app.add_option("--job-id", job_id, "the job's id (default: $REGROUP_JOB_ID or $MINDX_TASK_ID)");
  app.add_option("--nodes,--node-nums", nodes, "training pods (agents) of the job")
      ->check(CLI::Range(int64_t{1}, regroup::kMaxPods));
  app.add_option("--nproc-per-node,--proc-per-node", nproc, "processes per pod")
      ->check(CLI::Range(int64_t{1}, regroup::kMaxProcessesPerPod));
  app.add_option("--label", labels, "a job label KEY=VALUE (repeatable)");
  app.add_option("--annotation", annotations, "a job annotation KEY=VALUE (repeatable)");
  app.add_option("--env", envs, "rank 0's environment KEY=VALUE (MINDIO_WAIT_MINDX_TIME)");
  std::string keys_source;
  app.add_option("--keys-source", keys_source,
                 "where the --label/--annotation values were read, for the log (regroup.api "
                 "gives \"the Kubernetes API: Job NS/NAME ...\" when it read them there)");
  app.add_option("--listen", listen,
                 "gRPC address (port 0: any free port; default: $REGROUP_MANAGER_LISTEN, else "
                 "0.0.0.0:9601, MindCluster's port)");
  app.add_option("--http", http,
                 "HTTP address for /metrics and /status (default: $REGROUP_MANAGER_HTTP, else "
                 "none: a manager.py that cannot pass it gets it from its pod's env). On a loopback address "
                 "they are open; elsewhere each request needs \"Authorization: Bearer <the job's "
                 "credential>\". With --tls-cert/--tls-key it is HTTPS");
  bool metrics_open = false;
  app.add_flag("--metrics-open", metrics_open,
               "serve /metrics without the credential on a non-loopback --http (for a Prometheus "
               "that has no token); /status still needs it");
  app.add_option("--port-file", port_file, "write the gRPC port here once listening");
  app.add_option("--credential-file", credential_file,
                 "the job's credential (default: $REGROUP_CREDENTIAL_FILE, $REGROUP_CREDENTIAL)");
  std::string coordinator_credential_file;
  app.add_option("--coordinator-credential-file", coordinator_credential_file,
                 "the job's token at the coordinator (regroupctl token), when it is not the job's "
                 "credential (default: $REGROUP_COORDINATOR_CREDENTIAL_FILE, else the job's "
                 "credential)");
  bool insecure = false;
  app.add_flag("--insecure", insecure,
               "serve without a job credential, accepting every client (tests on a trusted "
               "machine only; a warning says so at every start)");
  app.add_option("--tls-cert", tls_cert, "serve TLS with this certificate (PEM)");
  app.add_option("--tls-key", tls_key, "... and this key (PEM)");
  app.add_option("--join-window-s", join_window_s, "how long the first rendezvous waits")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  app.add_option("--epoch", epoch,
                 "this incarnation's epoch, standalone only: with --coordinator the coordinator "
                 "grants it (default: the clock in ms, above the --record's)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 60));
  std::string record_file;
  app.add_option("--record", record_file,
                 "the job's durable record (a small JSON file on storage that outlives this "
                 "manager, e.g. the checkpoint folder; default: $REGROUP_RECORD_FILE): it grants "
                 "epochs and keeps lost pods fenced, the job's end and the majority a restarted "
                 "manager needs");
  app.add_option("--coordinator", coordinator,
                 "the coordinator HOST:PORT that makes the scheduling decisions and holds the "
                 "job's labels and annotations (default: $REGROUP_COORDINATOR_ADDR; else, in a "
                 "Kubernetes pod given a coordinator token, "
                 "regroup-coordinator.volcano-system.svc:8899; else none: the embedded engine "
                 "decides, by the keys of --job or --label/--annotation)");
  app.add_option("--coordinator-ca", coordinator_ca,
                 "connect to the coordinator over TLS, trusting this CA bundle (PEM)");
  app.add_option("--coordinator-server-name", coordinator_server_name,
                 "the name the coordinator's certificate must carry, when it is not the host of "
                 "--coordinator (needs --coordinator-ca)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help is 0; any bad command line is 2, as the agent's
  }
  if (app.count("--listen") == 0)
    if (const char* v = Env("REGROUP_MANAGER_LISTEN")) listen = v;
  if (http.empty())
    if (const char* v = Env("REGROUP_MANAGER_HTTP")) http = v;
  for (auto [flag, address] : {std::pair{"--listen", &listen}, std::pair{"--http", &http}}) {
    if (address->empty()) continue;
    if (auto st = regroup::CheckHostPort(*address, flag, /*port_zero_allowed=*/true); !st.ok()) {
      std::cerr << "regroup-manager: " << st.message() << "\n";
      return 2;
    }
  }

  regroup::JobSpec spec;
  if (!job_file.empty()) {
    std::ifstream in(job_file);
    if (!in) {
      std::cerr << "regroup-manager: cannot read " << job_file << "\n";
      return 2;
    }
    std::stringstream text;
    text << in.rdbuf();
    auto parsed = job_file.ends_with(".json") ? regroup::ParseJobSpec(std::string_view(text.str()))
                                              : regroup::JobSpecFromVolcanoYaml(text.str());
    if (!parsed.ok()) {
      std::cerr << "regroup-manager: " << job_file << ": " << parsed.status().message() << "\n";
      return 2;
    }
    spec = std::move(*parsed);
  }
  if (!job_id.empty()) spec.id = job_id;
  if (spec.id.empty()) {
    if (const char* v = Env("REGROUP_JOB_ID")) spec.id = v;
    else if (const char* m = Env("MINDX_TASK_ID")) spec.id = m;
  }
  if (nodes > 0) spec.pods = nodes;
  if (nproc > 0) spec.processes_per_pod = nproc;
  for (auto [list, into] : {std::pair{&labels, &spec.labels},
                            std::pair{&annotations, &spec.annotations},
                            std::pair{&envs, &spec.env}})
    for (const auto& item : *list)
      if (!SplitKeyValue(item, *into)) {
        std::cerr << "regroup-manager: \"" << item << "\" is not KEY=VALUE\n";
        return 2;
      }
  if (spec.id.empty() || spec.pods < 1) {
    std::cerr << "regroup-manager: give the job with --job, or --job-id (or $MINDX_TASK_ID) and "
                 "--nodes\n";
    return 2;
  }
  regroup::ResolvedConfig resolved = spec.Resolve();
  for (const auto& p : resolved.problems)
    std::cerr << "regroup-manager: "
              << (p.severity == regroup::Problem::Severity::kError ? "error: " : "warning: ")
              << p.message << "\n";
  if (!resolved.ok()) return 2;
  // Where the job's strategy came from (the coordinator's copy replaces it below).
  std::string source =
      !job_file.empty() ? "the job file " + job_file
      : !labels.empty() || !annotations.empty()
          ? (keys_source.empty() ? std::string("--label/--annotation") : keys_source)
                                                 : std::string("nowhere (no --job, --label or --annotation)");

  auto credential = regroup::LoadCredential(credential_file);
  if (!credential.ok()) {
    std::cerr << "regroup-manager: " << credential.status().message() << "\n";
    return 2;
  }
  if (credential->empty()) {
    // Open mode is never the default: a Secret left unmounted must stop the manager, not open it.
    if (!insecure) {
      std::cerr << "regroup-manager: no job credential: give --credential-file (or "
                   "$REGROUP_CREDENTIAL_FILE, $REGROUP_CREDENTIAL), or --insecure to accept every "
                   "client (testing only)\n";
      return 2;
    }
    spdlog::warn("regroup-manager: --insecure: no job credential, any client reaching {} can act "
                 "as this job's agents and read its status",
                 listen);
  }

  if (coordinator.empty())
    if (const char* v = Env("REGROUP_COORDINATOR_ADDR")) coordinator = v;
  if (coordinator_credential_file.empty())
    if (const char* v = Env("REGROUP_COORDINATOR_CREDENTIAL_FILE")) coordinator_credential_file = v;
  // Inside a Kubernetes pod that holds its job's coordinator token, the coordinator is found at
  // its Service (deploy/volcano/scheduler.yaml) with no address given.
  if (coordinator.empty() && !coordinator_credential_file.empty() && Env("KUBERNETES_SERVICE_HOST")) {
    coordinator = kInClusterCoordinator;
    spdlog::info("regroup-manager: in a Kubernetes pod with a coordinator token: the coordinator "
                 "is {} (set --coordinator or $REGROUP_COORDINATOR_ADDR for another)",
                 coordinator);
  }
  if (!coordinator.empty() && epoch != 0) {
    std::cerr << "regroup-manager: --epoch cannot be given with --coordinator: the coordinator "
                 "grants this manager's epoch\n";
    return 2;
  }
  if (record_file.empty())
    if (const char* v = Env("REGROUP_RECORD_FILE")) record_file = v;
  regroup::manager::JobControlOptions ro;
  ro.epoch = static_cast<uint64_t>(epoch ? epoch : regroup::WallMs());
  if (!record_file.empty()) {
    auto record = regroup::manager::LoadJobRecord(record_file);
    if (!record.ok()) {
      std::cerr << "regroup-manager: --record: " << record.status().message() << "\n";
      return 2;
    }
    if (*record && (*record)->job_id != spec.id) {
      std::cerr << "regroup-manager: --record: " << record_file << " is the record of job "
                << (*record)->job_id << ", not " << spec.id << "\n";
      return 2;
    }
    if (*record) {
      // The record grants the epoch: always above every incarnation that started before.
      ro.epoch = std::max(ro.epoch, (*record)->epoch + 1);
      ro.record = std::move(*record);
      spdlog::info("regroup-manager: resuming the record {}: epoch {}, {} lost pods{}",
                   record_file, ro.epoch, ro.record->lost.size(),
                   ro.record->stopped ? ", the job had stopped: " + ro.record->stop_reason : "");
    }
  }
  ro.join_window_ms = join_window_s * 1000;
  std::unique_ptr<regroup::manager::Decisions> decisions;
  if (!coordinator.empty()) {
    // A manager connects to its coordinator rarely, and must get through a loaded machine's TLS
    // handshakes: each attempt gets 5 s, not the 1 s an agent's does.
    constexpr std::chrono::milliseconds kCoordinatorConnectTimeout{5000};
    const regroup::ClientTls coordinator_tls{coordinator_ca, coordinator_server_name};
    auto channel = regroup::MakeChannel(coordinator, coordinator_tls, kCoordinatorConnectTimeout);
    if (!channel.ok()) {
      std::cerr << "regroup-manager: "
                << (coordinator_ca.empty() ? "--coordinator-server-name: " : "--coordinator-ca: ")
                << channel.status().message() << "\n";
      return 2;
    }
    regroup::manager::RemoteDecisionsOptions rd;
    rd.target = coordinator;
    rd.channel = std::move(*channel);
    rd.make_channel = [coordinator, coordinator_tls,
                       timeout = kCoordinatorConnectTimeout]() -> std::shared_ptr<grpc::Channel> {
      auto fresh = regroup::MakeChannel(coordinator, coordinator_tls, timeout);
      return fresh.ok() ? *fresh : nullptr;  // a CA file gone since the start: keep the old one
    };
    rd.credential = *credential;
    if (!coordinator_credential_file.empty()) {
      // The job's token at the coordinator; the job's own credential guards this manager.
      auto token = regroup::LoadCredential(coordinator_credential_file);
      if (!token.ok()) {
        std::cerr << "regroup-manager: --coordinator-credential-file: " << token.status().message()
                  << "\n";
        return 2;
      }
      rd.credential = *token;
    }
    rd.job_id = spec.id;
    auto remote = std::make_unique<regroup::manager::RemoteDecisions>(rd);
    spdlog::info("regroup-manager: the coordinator at {} makes the scheduling decisions{}; "
                 "waiting for it to grant this manager's epoch",
                 coordinator, coordinator_ca.empty() ? "" : " (TLS)");
    // The agents follow the epoch the coordinator grants: nothing is served before it is known.
    std::signal(SIGTERM, OnSignal);
    std::signal(SIGINT, OnSignal);
    while (!g_stop && !remote->WaitAvailable(std::chrono::milliseconds(100)) &&
           remote->epoch() == 0) {
    }
    if (g_stop) return 0;
    const uint64_t granted = remote->epoch();
    if (ro.record && granted <= ro.record->epoch)
      spdlog::warn("regroup-manager: the coordinator granted epoch {}, not above epoch {} of the "
                   "record {}: agents that followed that incarnation refuse this one until its "
                   "epoch is higher",
                   granted, ro.record->epoch, record_file);
    ro.epoch = granted;
    // The scheduler's engine decides by the job's keys as it holds them: they replace what this
    // manager was given (a MindCluster manager.py gives only the id and sizes).
    const auto taken = regroup::manager::TakeJobKeys(remote->job_keys(), spec);
    if (taken.taken) {
      source = "the coordinator at " + coordinator;
      for (const auto& d : taken.differences)
        spdlog::warn("regroup-manager: job {}: the coordinator's {} replaces what this manager "
                     "was given",
                     spec.id, d);
      resolved = spec.Resolve();
    } else {
      spdlog::warn("regroup-manager: job {}: the coordinator at {} sent no job keys (an older "
                   "version?): keeping those from {}",
                   spec.id, coordinator, source);
    }
    decisions = std::move(remote);
  } else {
    decisions = std::make_unique<regroup::manager::EmbeddedDecisions>(spec);
  }
  // A loud word when the strategy leaves recovery off: a MindCluster manager.py passes only the
  // job id and sizes, and the strategy lives in the job's labels and annotations.
  spdlog::info("regroup-manager: job {}: {} labels and {} annotations from {}", spec.id,
               spec.labels.size(), spec.annotations.size(), source);
  if (!resolved.config.recovery_on())
    spdlog::warn("regroup-manager: job {}: process-level recovery is off (fault-scheduling and "
                 "process-recover-enable as resolved from {}): a fault ends the job unless "
                 "rescheduling restarts it. Give the manager the job's labels and annotations "
                 "(--coordinator, --job FILE, or --label/--annotation; init_manager's \"labels\" "
                 "and \"annotations\")",
                 spec.id, source);
  if (!record_file.empty()) {
    // Before every step it commits, and once a second, the manager looks at the record (a stat;
    // a read only when it changed): a newer incarnation that formed a generation fences this one
    // at once, and a job an older one ended ends here too.
    auto watch = std::make_shared<regroup::manager::JobRecordWatch>(record_file);
    auto log = std::make_shared<regroup::LogLimit>(std::chrono::seconds(10));
    ro.stored_record = [watch, log]() -> const std::optional<regroup::manager::JobRecord>& {
      const regroup::Status looked = watch->Refresh();
      if (!looked.ok()) {
        if (auto held = log->Allow(regroup::LogLimit::Clock::now()))
          spdlog::error("{}: steps are committed without knowing whether a newer manager took "
                        "over (the last record read serves){}",
                        looked.message(),
                        *held ? " (and " + std::to_string(*held) + " more not logged)" : "");
      }
      return watch->record();
    };
  }
  auto job = std::make_unique<regroup::manager::JobControl>(spec, resolved.config, ro,
                                                                std::move(decisions));
  regroup::manager::ServerOptions so;
  so.listen = listen;
  so.http_listen = http;
  so.metrics_open = metrics_open;
  so.credential = *credential;
  so.tls_cert_file = tls_cert;
  so.tls_key_file = tls_key;
  so.record_file = record_file;
  regroup::manager::ManagerServer server(std::move(job), so);
  if (auto st = server.Start(); !st.ok()) {
    std::cerr << "regroup-manager: " << st.message() << "\n";
    return 1;
  }
  spdlog::info("regroup-manager: job {} ({} pods x {} processes), epoch {}, listening on port {}{}",
               spec.id, spec.pods, spec.processes_per_pod, ro.epoch, server.port(),
               http.empty() ? "" : ", HTTP on port " + std::to_string(server.http_port()));
  if (!port_file.empty()) {
    const std::string tmp = port_file + ".tmp";
    std::ofstream out(tmp);
    out << server.port() << "\n";
    out.close();
    if (!out || std::rename(tmp.c_str(), port_file.c_str()) != 0) {
      std::cerr << "regroup-manager: --port-file: cannot write " << port_file << ": "
                << std::strerror(errno) << "\n";
      std::remove(tmp.c_str());
      server.Stop();
      return 1;
    }
  }
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  spdlog::info("regroup-manager: stopping");
  server.Stop();
  return 0;
}
