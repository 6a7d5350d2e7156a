// SPDX-License-Identifier: Apache-2.0
// fuzz_volcano_yaml: a Volcano Job (YAML or JSON) through regroup::JobSpecFromVolcanoYaml, the
// reader of `regroupctl validate` and `regroupctl simulate`, and through the C ABI's
// regroup_volcano_job_read (the scheduler plugin's), which must agree with it. Nothing a document
// holds may crash either or throw out of them. A job read then goes where the CLI and the plugin
// send it: the validation report `regroupctl validate --json` prints, regroup_job_has_keys with
// its label and annotation names, and the C ABI as job spec JSON.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "plugin/volcano_job.h"
#include "fuzz_common.h"
#include "plugin/job_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view yaml(reinterpret_cast<const char*>(data), size);
  auto spec = regroup::JobSpecFromVolcanoYaml(yaml);

  // The ABI's reader: the same spec (or pods 0 where the CLI's refuses a job without training
  // pods), the same refusal otherwise, always with a message.
  char* read = nullptr;
  const regroup_status read_status =
      FUZZ_CALL(regroup_volcano_job_read(&read, yaml.data(), yaml.size(), &err));
  std::string read_text = read ? read : "";
  regroup_string_free(read);
  if (read_status == REGROUP_OK) {
    const nlohmann::json got = nlohmann::json::parse(read_text, nullptr, false);
    if (got.is_discarded() || !got.contains("job") || !got.contains("manager_tasks"))
      fuzz::Die("regroup_volcano_job_read", "wrote an unexpected result: " + read_text);
    // Compared as the ABI writes it: invalid UTF-8 a YAML escape made is replaced.
    if (spec.ok() && got["job"] != nlohmann::json::parse(regroup::JobSpecToJson(*spec).dump(
                                       -1, ' ', false, nlohmann::json::error_handler_t::replace)))
      fuzz::Die("regroup_volcano_job_read", "disagrees with JobSpecFromVolcanoYaml: " + read_text);
    if (!spec.ok() && got["job"]["pods"] != 0)
      fuzz::Die("regroup_volcano_job_read", "read a job JobSpecFromVolcanoYaml refuses (" +
                                                spec.status().message() + "): " + read_text);
  } else if (spec.ok() && yaml.size() <= (4u << 20)) {
    fuzz::Die("regroup_volcano_job_read", std::string("refused (") +
                                              regroup_status_name(read_status) +
                                              ") a job JobSpecFromVolcanoYaml reads");
  }
  if (!spec.ok()) {
    if (spec.status().message().empty())
      fuzz::Die("JobSpecFromVolcanoYaml", "refused a document without a message");
    return 0;
  }

  std::vector<const char*> labels, annotations;
  for (const auto& kv : spec->labels) labels.push_back(kv.first.c_str());
  for (const auto& kv : spec->annotations) annotations.push_back(kv.first.c_str());
  uint8_t has = 2;
  if (FUZZ_CALL(regroup_job_has_keys(&has, labels.data(), labels.size(), annotations.data(),
                                     annotations.size(), &err)) != REGROUP_OK ||
      has > 1)
    fuzz::Die("regroup_job_has_keys", "failed on a job's own key names");

  // What `regroupctl validate --json` prints (nlohmann's default, strict UTF-8 dump).
  const regroup::ResolvedConfig resolved = spec->Resolve();
  const std::string report = regroup::ValidationReport(resolved).dump(2);

  // The job spec as the plugin hands it to the library.
  const std::string json = regroup::JobSpecToJson(*spec).dump(
      -1, ' ', false, nlohmann::json::error_handler_t::replace);
  const regroup_status validated =
      FUZZ_CALL(regroup_validate_job(nullptr, json.data(), json.size(), &err));
  if (validated != REGROUP_OK && validated != REGROUP_VALIDATION_FAILED)
    fuzz::Die("regroup_validate_job", std::string("refused, as not a job spec (") +
                                          regroup_status_name(validated) +
                                          "), what the YAML reader produced: " + json);
  fuzz::Engine engine;
  const regroup_status upserted = engine.Upsert(json);
  if (upserted != validated)
    fuzz::Die("regroup_engine_upsert_job", std::string("returned ") +
                                               regroup_status_name(upserted) +
                                               " where validation returned " +
                                               regroup_status_name(validated));
  return 0;
}
