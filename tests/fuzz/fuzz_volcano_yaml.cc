// fuzz_volcano_yaml: a Volcano Job (YAML) through regroup::JobSpecFromVolcanoYaml, the
// reader of `regroupctl validate` and `regroupctl simulate`. Nothing a YAML document holds may
// crash it or throw out of it. A job it reads then goes where the CLI and the plugin send it:
// the validation report `regroupctl validate --json` prints, and the C ABI as job spec JSON.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "plugin/volcano_job.h"
#include "fuzz_common.h"
#include "plugin/job_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view yaml(reinterpret_cast<const char*>(data), size);
  auto spec = regroup::JobSpecFromVolcanoYaml(yaml);
  if (!spec.ok()) {
    if (spec.status().message().empty())
      fuzz::Die("JobSpecFromVolcanoYaml", "refused a document without a message");
    return 0;
  }

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
