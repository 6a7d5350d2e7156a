// SPDX-License-Identifier: Apache-2.0
// regroup-manager: one per job. Forms generations from the job's agents, detects faults, runs the
// step commit and carries out the recovery decisions: made by its embedded engine (standalone),
// or with --coordinator by the scheduler's engine, through the coordinator in libregroup.so.
// See options.h for its command line.
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <thread>

#include <spdlog/spdlog.h>

#include "common/clock.h"
#include "common/credential.h"
#include "common/grpc_settings.h"
#include "common/log_format.h"
#include "common/log_limit.h"
#include "common/safe_file.h"
#include "manager/options.h"
#include "manager/remote_decisions.h"
#include "manager/service.h"

namespace {

using regroup::Status;
using regroup::StatusOr;
using namespace regroup::manager;

volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

void StopOnSignals() {
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
}

// The job's credential. Open mode is never the default: a Secret left unmounted must stop the
// manager, not open it.
StatusOr<std::string> LoadJobCredential(const ManagerOptions& o) {
  auto credential = regroup::LoadCredential(o.credential_file);
  if (!credential.ok())
    return regroup::InvalidArgument("--credential-file: " + credential.status().message());
  if (credential->empty()) {
    if (!o.insecure)
      return regroup::InvalidArgument(
          "no job credential: give --credential-file (or $REGROUP_CREDENTIAL_FILE, "
          "$REGROUP_CREDENTIAL), or --insecure to accept every client (testing only)");
    spdlog::warn("regroup-manager: --insecure: no job credential, any client reaching {} can act "
                 "as this job's agents and read its status",
                 o.listen);
  }
  return credential;
}

// This incarnation's epoch (--epoch, else the clock in ms) and what the --record holds: the
// record grants the epoch, always above every incarnation that started before.
StatusOr<JobControlOptions> ResumeRecord(const ManagerOptions& o, const regroup::JobSpec& spec) {
  JobControlOptions ro;
  ro.epoch = static_cast<uint64_t>(o.epoch ? o.epoch : regroup::WallMs());
  ro.join_window_ms = o.join_window_s * 1000;
  if (o.record_file.empty()) return ro;
  auto record = LoadJobRecord(o.record_file);
  if (!record.ok()) return regroup::InvalidArgument("--record: " + record.status().message());
  if (!*record) return ro;
  if ((*record)->job_id != spec.id)
    return regroup::InvalidArgument("--record: " + o.record_file + " is the record of job " +
                                    (*record)->job_id + ", not " + spec.id);
  ro.epoch = std::max(ro.epoch, (*record)->epoch + 1);
  ro.record = std::move(*record);
  spdlog::info("regroup-manager: resuming the record {}: epoch {}, {} lost pods{}", o.record_file,
               ro.epoch, ro.record->lost.size(),
               ro.record->stopped ? ", the job had stopped: " + ro.record->stop_reason : "");
  return ro;
}

// The coordinator's decisions, once it granted this manager's epoch (the agents follow that
// epoch: nothing is served before it is known); nullptr when a signal came first. An error
// names the flag to change.
StatusOr<std::unique_ptr<RemoteDecisions>> AttachToCoordinator(const ManagerOptions& o,
                                                               const std::string& credential,
                                                               const std::string& job_id) {
  // A manager connects to its coordinator rarely, and must get through a loaded machine's TLS
  // handshakes: each attempt gets 5 s, not the 1 s an agent's does.
  constexpr std::chrono::milliseconds kCoordinatorConnectTimeout{5000};
  const regroup::ClientTls tls{o.coordinator_ca, o.coordinator_server_name,
                               o.coordinator_tls_cert, o.coordinator_tls_key};
  auto channel = regroup::MakeChannel(o.coordinator, tls, kCoordinatorConnectTimeout);
  if (!channel.ok()) {
    const std::string why = channel.status().message();
    std::string flag = "--coordinator-tls-cert/--coordinator-tls-key: ";
    if (o.coordinator_ca.empty())
      flag = "--coordinator-server-name: ";
    else if (why.find("TLS CA file") != std::string::npos)
      flag = "--coordinator-ca: ";
    return regroup::InvalidArgument(flag + why);
  }
  RemoteDecisionsOptions rd;
  rd.target = o.coordinator;
  rd.channel = std::move(*channel);
  rd.tls = !o.coordinator_ca.empty();
  rd.make_channel = [coordinator = o.coordinator, tls,
                     timeout = kCoordinatorConnectTimeout]() -> std::shared_ptr<grpc::Channel> {
    auto fresh = regroup::MakeChannel(coordinator, tls, timeout);
    return fresh.ok() ? *fresh : nullptr;  // a CA file gone since the start: keep the old one
  };
  // The job's token at the coordinator; the job's own credential guards this manager.
  rd.credential = credential;
  if (!o.coordinator_credential_file.empty()) {
    auto token = regroup::LoadCredential(o.coordinator_credential_file);
    if (!token.ok())
      return regroup::InvalidArgument("--coordinator-credential-file: " +
                                      token.status().message());
    rd.credential = *token;
  }
  rd.job_id = job_id;
  auto remote = std::make_unique<RemoteDecisions>(rd);
  std::string link;
  if (!o.coordinator_ca.empty())
    link = o.coordinator_tls_cert.empty() ? " (TLS)" : " (TLS, with this manager's certificate)";
  spdlog::info("regroup-manager: the coordinator at {} makes the scheduling decisions{}; "
               "waiting for it to grant this manager's epoch",
               o.coordinator, link);
  StopOnSignals();
  while (!g_stop && !remote->WaitAvailable(std::chrono::milliseconds(100)) &&
         remote->epoch() == 0) {
  }
  if (g_stop) return std::unique_ptr<RemoteDecisions>();
  return remote;
}

// Takes the coordinator's epoch, and the job's keys as the scheduler's engine holds them: they
// replace what this manager was given (a MindCluster manager.py gives only the id and sizes).
// Returns whether the keys were taken.
bool FollowCoordinator(const RemoteDecisions& remote, const ManagerOptions& o,
                       JobControlOptions& ro, regroup::JobSpec& spec, std::string& source) {
  const uint64_t granted = remote.epoch();
  if (ro.record && granted <= ro.record->epoch)
    spdlog::warn("regroup-manager: the coordinator granted epoch {}, not above epoch {} of the "
                 "record {}: agents that followed that incarnation refuse this one until its "
                 "epoch is higher",
                 granted, ro.record->epoch, o.record_file);
  ro.epoch = granted;
  const auto taken = TakeJobKeys(remote.job_keys(), spec);
  if (!taken.taken) {
    spdlog::warn("regroup-manager: job {}: the coordinator at {} sent no job keys (an older "
                 "version?): keeping those from {}",
                 spec.id, o.coordinator, source);
    return false;
  }
  source = "the coordinator at " + o.coordinator;
  for (const auto& d : taken.differences)
    spdlog::warn("regroup-manager: job {}: the coordinator's {} replaces what this manager was "
                 "given",
                 spec.id, d);
  return true;
}

// A loud word when the strategy leaves recovery off: a MindCluster manager.py passes only the
// job id and sizes, and the strategy lives in the job's labels and annotations.
void LogWhereTheStrategyCameFrom(const regroup::JobSpec& spec, const regroup::JobConfig& config,
                                 const std::string& source) {
  spdlog::info("regroup-manager: job {}: {} labels and {} annotations from {}", spec.id,
               spec.labels.size(), spec.annotations.size(), source);
  if (!config.recovery_on())
    spdlog::warn("regroup-manager: job {}: process-level recovery is off (fault-scheduling and "
                 "process-recover-enable as resolved from {}): a fault ends the job unless "
                 "rescheduling restarts it. Give the manager the job's labels and annotations "
                 "(--coordinator, --job FILE, or --label/--annotation; init_manager's \"labels\" "
                 "and \"annotations\")",
                 spec.id, source);
}

// Before every step it commits, and once a second, the manager looks at the record (a stat; a
// read only when it changed): a newer incarnation that formed a generation fences this one at
// once, and a job an older one ended ends here too.
std::function<const std::optional<JobRecord>&()> WatchRecord(const std::string& record_file) {
  auto watch = std::make_shared<JobRecordWatch>(record_file);
  auto log = std::make_shared<regroup::LogLimit>(std::chrono::seconds(10));
  return [watch, log]() -> const std::optional<JobRecord>& {
    const Status looked = watch->Refresh();
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

// Writes the port atomically (common/safe_file.h), so a reader never sees half a number.
Status WritePortFile(const std::string& port_file, int port) {
  Status written = regroup::WriteFileAtomically(port_file, std::to_string(port) + "\n",
                                                /*what=*/"", 0644);
  if (!written.ok()) return regroup::InvalidArgument("--port-file: " + written.message());
  return Status::Ok();
}

// Says why the manager does not run; returns the exit status (2: a bad command line).
int Refuse(const std::string& message, int exit_status = 2) {
  std::cerr << "regroup-manager: " << message << "\n";
  return exit_status;
}

}  // namespace

int main(int argc, char** argv) {
  const regroup::EnvLookup env = regroup::ProcessEnv();
  auto parsed = ParseCommandLine(std::vector<std::string>(argv + 1, argv + argc), env);
  if (!parsed.ok()) return Refuse(parsed.status().message());
  if (parsed->reply) {
    std::cout << *parsed->reply;  // --help, --version
    return 0;
  }
  const ManagerOptions& o = parsed->options;
  regroup::UseLogFormat(*regroup::ParseLogFormat(o.log_format), "regroup-manager");
  for (const std::string& notice : parsed->notices) spdlog::info("regroup-manager: {}", notice);
  for (const std::string& risk : parsed->warnings) spdlog::warn("regroup-manager: {}", risk);

  auto spec = ReadJobSpec(o, env);
  if (!spec.ok()) return Refuse(spec.status().message());
  regroup::ResolvedConfig resolved = spec->Resolve();
  for (const auto& p : resolved.problems)
    std::cerr << "regroup-manager: "
              << (p.severity == regroup::Problem::Severity::kError ? "error: " : "warning: ")
              << p.message << "\n";
  if (!resolved.ok()) return 2;
  std::string source = KeysSource(o);  // the coordinator's copy replaces it below
  auto credential = LoadJobCredential(o);
  if (!credential.ok()) return Refuse(credential.status().message());
  auto ro = ResumeRecord(o, *spec);
  if (!ro.ok()) return Refuse(ro.status().message());

  std::unique_ptr<Decisions> decisions;
  if (!o.coordinator.empty()) {
    auto remote = AttachToCoordinator(o, *credential, spec->id);
    if (!remote.ok()) return Refuse(remote.status().message());
    if (*remote == nullptr) return 0;  // stopped before the coordinator answered
    if (FollowCoordinator(**remote, o, *ro, *spec, source)) resolved = spec->Resolve();
    decisions = std::move(*remote);
  } else {
    decisions = std::make_unique<EmbeddedDecisions>(*spec);
  }
  LogWhereTheStrategyCameFrom(*spec, resolved.config, source);
  if (!o.record_file.empty()) ro->stored_record = WatchRecord(o.record_file);

  auto job = std::make_unique<JobControl>(*spec, resolved.config, *ro, std::move(decisions));
  ServerOptions so;
  so.listen = o.listen;
  so.http_listen = o.http;
  so.metrics_open = o.metrics_open;
  so.credential = *credential;
  so.tls_cert_file = o.tls_cert;
  so.tls_key_file = o.tls_key;
  so.tls_client_ca_file = o.tls_client_ca;
  so.record_file = o.record_file;
  ManagerServer server(std::move(job), so);
  if (auto st = server.Start(); !st.ok()) return Refuse(st.message(), 1);
  spdlog::info("regroup-manager: job {} ({} pods x {} processes), epoch {}, listening on port {}{}",
               spec->id, spec->pods, spec->processes_per_pod, ro->epoch, server.port(),
               o.http.empty() ? "" : ", HTTP on port " + std::to_string(server.http_port()));
  if (!o.port_file.empty())
    if (auto st = WritePortFile(o.port_file, server.port()); !st.ok()) {
      const int exit_status = Refuse(st.message(), 1);
      server.Stop();
      return exit_status;
    }
  StopOnSignals();
  // Once the job stopped and every pod left, the manager exits 0 (unless --stay-after-done):
  // after kLinger of both, so that a pod reconnecting to hear the stop still finds it.
  constexpr auto kLinger = std::chrono::seconds(2);
  auto alone_since = std::chrono::steady_clock::time_point::max();
  while (!g_stop) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (o.stay_after_done) continue;
    const auto now = std::chrono::steady_clock::now();
    if (!server.DoneAndAlone()) {
      alone_since = std::chrono::steady_clock::time_point::max();
    } else if (alone_since == std::chrono::steady_clock::time_point::max()) {
      alone_since = now;
    } else if (now - alone_since >= kLinger) {
      spdlog::info("regroup-manager: job {} stopped and every pod left: exiting "
                   "(--stay-after-done keeps the manager up)",
                   spec->id);
      break;
    }
  }
  if (g_stop) spdlog::info("regroup-manager: stopping");
  server.Stop();
  return 0;
}
