// SPDX-License-Identifier: Apache-2.0
// regroupctl: Regroup's command line.
//
//   regroupctl validate JOB.yaml          every problem of a Volcano Job, exit 1 if any
//   regroupctl simulate JOB.yaml FAULTS   a fault script through the engine, as a timeline
//   regroupctl keys                       the configuration keys (the README's table)
//   regroupctl status [--manager H:P]      a running job's state, from its manager
//   regroupctl convert ASCENDJOB.yaml      a MindCluster AscendJob as a Volcano Job for Regroup
//   regroupctl token --cluster-key-file F --job NS/NAME --uid UID
//                                         a job's token at the coordinator, for its Secret
#include <algorithm>
#include <fstream>
#include <iostream>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/convert.h"
#include "cli/fault_script.h"
#include "cli/simulate.h"
#include "cli/status_command.h"
#include "common/credential.h"
#include "common/job_token.h"
#include "common/safe_file.h"
#include "common/text.h"
#include "common/version.h"
#include "plugin/job_spec.h"
#include "plugin/volcano_job.h"
#include "plugin/config.h"

namespace {

using regroup::StatusOr;

// Printed JSON: a job's values may hold bytes that are not UTF-8; they print as U+FFFD.
std::string Dump(const nlohmann::json& j) {
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The most regroupctl reads from any input: a job, a fault script, a MindCluster job.
constexpr size_t kMaxInputBytes = 4u << 20;

// At most kMaxInputBytes of `path`, read in chunks, so that a device (/dev/zero) or an endless
// pipe is refused after the limit instead of filling memory.
StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return regroup::InvalidArgument("cannot read " + path);
  std::string text;
  char chunk[1 << 16];
  while (in.read(chunk, sizeof chunk) || in.gcount() > 0) {
    text.append(chunk, static_cast<size_t>(in.gcount()));
    if (text.size() > kMaxInputBytes)
      return regroup::InvalidArgument(path + " is larger than " +
                                      std::to_string(kMaxInputBytes >> 20) + " MiB");
  }
  if (in.bad()) return regroup::InvalidArgument("cannot read " + path);
  return text;
}

// A job file: a Volcano Job in YAML, or the engine's job spec in JSON (*.json).
StatusOr<regroup::JobSpec> LoadJob(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  if (path.ends_with(".json")) return regroup::ParseJobSpec(std::string_view(*text));
  return regroup::JobSpecFromVolcanoYaml(*text);
}

// An AscendJob as MindCluster's users write it: validated as `regroupctl convert` would make it,
// naming every change convert makes. Exit 0: the converted job has no problem; 1: it has one.
int ValidateAscendJob(const std::string& path, const regroup::cli::ConvertResult& converted,
                      bool json) {
  if (json) {
    nlohmann::json report = regroup::ValidationReport(converted.resolved);
    report["converted_from"] = "AscendJob";
    report["convert_notes"] = nlohmann::json::array();
    for (const auto& n : converted.notes)
      report["convert_notes"].push_back({{"kind", regroup::cli::NoteKindName(n.kind)},
                                         {"field", n.field},
                                         {"message", n.message}});
    std::cout << Dump(report) << "\n";
  } else {
    std::cout << regroup::cli::FormatReport(converted, path, "would convert");
  }
  return converted.resolved.problems.empty() ? 0 : 1;
}

int Validate(const std::string& path, bool json) {
  auto spec = LoadJob(path);
  if (!spec.ok()) {
    if (!path.ends_with(".json")) {
      auto text = ReadFile(path);
      if (text.ok() && text->find("AscendJob") != std::string::npos) {
        auto converted = regroup::cli::ConvertAscendJob(*text, regroup::cli::ConvertOptions());
        if (converted.ok()) return ValidateAscendJob(path, *converted, json);
        std::cerr << path << ": error: " << converted.status().message() << "\n";
        return 2;
      }
    }
    std::cerr << path << ": error: " << spec.status().message() << "\n";
    return 2;
  }
  regroup::ResolvedConfig resolved = spec->Resolve();
  regroup::cli::AddAdoptionAdvice(*spec, resolved);
  if (json) {
    std::cout << Dump(regroup::ValidationReport(resolved)) << "\n";
  } else {
    for (const auto& p : resolved.problems)
      std::cout << path << ": "
                << (p.severity == regroup::Problem::Severity::kError ? "error" : "warning") << ": "
                << p.message << "\n";
    if (resolved.problems.empty())
      std::cout << path << ": ok: job " << spec->id << ", " << spec->pods << " pods x "
                << spec->processes_per_pod << " processes\n";
  }
  return resolved.problems.empty() ? 0 : 1;
}

int Simulate(const std::string& job_path, const std::string& script_path,
             const regroup::cli::SimulateOptions& options, bool json) {
  auto spec = LoadJob(job_path);
  if (!spec.ok()) {
    std::cerr << job_path << ": error: " << spec.status().message() << "\n";
    return 2;
  }
  auto text = ReadFile(script_path);
  if (!text.ok()) {
    std::cerr << "error: " << text.status().message() << "\n";
    return 2;
  }
  auto script = regroup::cli::ParseFaultScript(*text);
  if (!script.ok()) {
    std::cerr << script_path << ": error: " << script.status().message() << "\n";
    return 2;
  }
  std::ostringstream timeline;
  auto summary = regroup::cli::Simulate(*spec, *script, options, json ? timeline : std::cout);
  if (!summary.ok()) {
    std::cerr << "error: " << summary.status().message() << "\n";
    return summary.status().code() == REGROUP_VALIDATION_FAILED ? 1 : 2;
  }
  if (json) std::cout << Dump(summary->history) << "\n";
  return 0;
}

// Writes the Volcano Job to `out_path` (or stdout) and the report to stderr. Exit 2: the input
// was refused; 1: converted, but the job does not validate; 0: converted and valid.
int Convert(const std::string& path, const std::string& out_path,
            const regroup::cli::ConvertOptions& options) {
  auto text = ReadFile(path);
  if (!text.ok()) {
    std::cerr << "error: " << text.status().message() << "\n";
    return 2;
  }
  auto result = regroup::cli::ConvertAscendJob(*text, options);
  if (!result.ok()) {
    std::cerr << path << ": error: " << result.status().message() << "\n";
    return 2;
  }
  if (out_path.empty() || out_path == "-") {
    std::cout << result->yaml;
  } else {
    if (auto written = regroup::WriteFileAtomically(out_path, result->yaml, "", 0644);
        !written.ok()) {
      std::cerr << "error: " << written.message() << "\n";
      return 2;
    }
  }
  std::cerr << regroup::cli::FormatReport(*result, path);
  return result->resolved.ok() ? 0 : 1;
}

// regroupctl token: the job's token (common/job_token.h) on stdout.
int Token(const std::string& key_file, const std::string& job, const std::string& uid) {
  auto key = regroup::LoadCredential(key_file);
  if (!key.ok()) {
    std::cerr << "error: --cluster-key-file: " << key.status().message() << "\n";
    return 2;
  }
  if (regroup::Status st = regroup::CheckJobTokenSubject(job, uid, "--job", "--uid"); !st.ok()) {
    std::cerr << "error: " << st.message() << "\n";
    return 2;
  }
  std::cout << regroup::JobToken(*key, job, uid) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"regroupctl: validate, simulate and convert elastic training jobs for Regroup"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("regroupctl ") + REGROUP_VERSION_STRING,
                       "print the version and exit");

  std::string job_path, script_path;
  bool json = false;
  auto* validate = app.add_subcommand(
      "validate", "Report every problem of a job (Volcano Job YAML, or job spec JSON); exit 1 "
                  "if there is any");
  validate->add_option("job", job_path, "the job file")->required()->check(CLI::ExistingFile);
  validate->add_flag("--json", json, "print the report as JSON");

  regroup::cli::SimulateOptions options;
  std::string step = "1s", register_delay = "5s", until;
  auto* simulate = app.add_subcommand(
      "simulate", "Run a fault script through the engine with a simulated clock and print the "
                  "decision timeline");
  simulate->add_option("job", job_path, "the job file")->required()->check(CLI::ExistingFile);
  simulate->add_option("faults", script_path, "the fault script")
      ->required()
      ->check(CLI::ExistingFile);
  simulate->add_option("--step-time", step, "simulated time per training step")
      ->capture_default_str();
  simulate->add_option("--register-delay", register_delay,
                       "time from placing a replacement to its agent registering")
      ->capture_default_str();
  simulate->add_option("--until", until, "stop at this time (default: when the job settles)");
  simulate->add_flag("--json", json, "print the engine's decisions as JSON instead");

  bool markdown = false;
  auto* keys = app.add_subcommand("keys", "Print the configuration keys a job may carry");
  keys->add_flag("--markdown", markdown, "as the README's Markdown table");

  regroup::cli::StatusOptions status_options;
  auto* status = app.add_subcommand("status", "Show a running job's state, from its manager");
  status->add_option("--manager", status_options.manager, "the manager's address")
      ->envname("REGROUP_MANAGER_ADDR")
      ->capture_default_str();
  status->add_option("--job", status_options.job_id, "the job id (default: the manager's)");
  status->add_option("--credential-file", status_options.credential_file,
                     "the job's credential (default: $REGROUP_CREDENTIAL_FILE, $REGROUP_CREDENTIAL)");
  status->add_option("--tls-ca", status_options.tls.ca_file,
                     "connect over TLS, trusting this CA bundle (PEM) (default: plaintext)")
      ->envname("REGROUP_TLS_CA_FILE");
  status->add_option("--tls-server-name", status_options.tls.server_name,
                     "the name the manager's certificate must carry, when it is not the host of "
                     "--manager (needs --tls-ca)")
      ->envname("REGROUP_TLS_SERVER_NAME");
  status->add_option("--tls-cert", status_options.tls.cert_file,
                     "this client's own certificate (PEM), for a manager that requires one "
                     "(its --tls-client-ca; needs --tls-ca and --tls-key)")
      ->envname("REGROUP_TLS_CERT_FILE");
  status->add_option("--tls-key", status_options.tls.key_file, "... and its key (PEM)")
      ->envname("REGROUP_TLS_KEY_FILE");
  status->add_option("--timeout-ms", status_options.timeout_ms, "the call's deadline")
      ->capture_default_str();
  status->add_flag("--json", status_options.json, "print the status as JSON");

  regroup::cli::ConvertOptions convert_options;
  std::string convert_out;
  auto* convert = app.add_subcommand(
      "convert", "Convert a MindCluster AscendJob into the equivalent Volcano Job for Regroup; "
                 "the report of what changed and why goes to stderr");
  convert->add_option("ascendjob", job_path, "the AscendJob YAML file")
      ->required()
      ->check(CLI::ExistingFile);
  convert->add_option("-o,--output", convert_out, "write the Volcano Job here (default: stdout)");
  convert->add_option("--manager-image", convert_options.manager_image,
                      "the image of the manager task (it must hold regroup-manager)")
      ->capture_default_str();
  convert->add_option("--coordinator", convert_options.coordinator,
                      "the coordinator in the Volcano scheduler the manager reports to (\"\": "
                      "none, the manager decides alone)")
      ->capture_default_str();
  convert->add_option("--credential-secret", convert_options.credential_secret,
                      "the Secret holding the job's credential under the key `token` (default: "
                      "NAME-regroup-credential)");
  convert->add_option("--tls-secret", convert_options.tls_secret,
                      "the Secret whose ca.crt signed the coordinator's certificate (default: "
                      "NAME-regroup-tls, cert-manager's layout)");
  convert->add_flag("--plaintext-coordinator", convert_options.plaintext_coordinator,
                    "the coordinator serves no TLS: the manager checks no certificate");

  std::string key_file, token_job, token_uid;
  auto* token = app.add_subcommand(
      "token", "Print a job's token at the coordinator (for the job's Secret), derived from the "
               "cluster key: it lets a manager act as that job only");
  token->add_option("--cluster-key-file", key_file,
                    "the cluster key (the coordinator's credential file; only the scheduler's "
                    "namespace holds it)")
      ->required();
  token->add_option("--job", token_job, "the job's id, NAMESPACE/NAME")->required();
  token->add_option("--uid", token_uid,
                    "the Volcano Job's uid (kubectl get vcjob NAME -n NAMESPACE -o "
                    "jsonpath='{.metadata.uid}')")
      ->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ConversionError& e) {
    // CLI11 says "Could not convert: --timeout-ms = abc" and exits 104: name the flag plainly.
    std::string what = e.what();
    const auto at = what.find(": ");
    const auto eq = what.find(" = ");
    if (at != std::string::npos && eq != std::string::npos && eq > at)
      what = what.substr(at + 2, eq - at - 2) + ": \"" + what.substr(eq + 3) + "\" is not a number";
    std::cerr << "error: " << what << "\n";
    return 2;
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  if (token->parsed()) return Token(key_file, token_job, token_uid);

  if (status->parsed()) {
    regroup::Status st = regroup::cli::PrintStatus(status_options, std::cout);
    if (!st.ok()) {
      std::cerr << "error: " << st.message() << "\n";
      return 1;
    }
    return 0;
  }

  if (validate->parsed()) return Validate(job_path, json);
  if (convert->parsed()) return Convert(job_path, convert_out, convert_options);
  if (simulate->parsed()) {
    for (auto [text, field] : {std::pair{&step, &options.step_ms},
                               std::pair{&register_delay, &options.register_delay_ms},
                               std::pair{&until, &options.until_ms}}) {
      if (text->empty()) continue;
      auto ms = regroup::cli::ParseDuration(*text);
      if (!ms.ok()) {
        std::cerr << "error: " << ms.status().message() << "\n";
        return 2;
      }
      if (*ms > regroup::cli::kMaxScriptMs) {
        std::cerr << "error: " << *text << " is beyond the simulation's 24 h horizon\n";
        return 2;
      }
      *field = *ms;
    }
    return Simulate(job_path, script_path, options, json);
  }
  if (keys->parsed()) {
    std::cout << regroup::ConfigTableMarkdown();
    return 0;
  }
  return 0;
}
