// SPDX-License-Identifier: Apache-2.0
// A job as the engine sees it: identity, keys, size. Parsed from the JSON the C ABI accepts;
// `regroupctl` builds it from a Volcano Job (plugin/volcano_job.h).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "plugin/config.h"
#include "common/status.h"

namespace regroup {

struct JobSpec {
  std::string id;
  std::string uid;
  std::map<std::string, std::string> labels;
  std::map<std::string, std::string> annotations;
  std::map<std::string, std::string> env;  // of the rank-0 pod: MINDIO_WAIT_MINDX_TIME
  int64_t pods = 0;                        // training pods
  int64_t processes_per_pod = 1;
  std::optional<VolcanoFacts> volcano;

  ResolvedConfig Resolve() const {
    return ResolveConfig(labels, annotations, env, pods, processes_per_pod, volcano);
  }
};

// A job id: 1 to 512 bytes, no control character (callers name a job by a C string).
Status CheckJobId(std::string_view id, std::string_view where);

// What a job's coordinator token is made for (common/job_token.h): the job as the coordinator
// knows a Volcano Job, NAMESPACE/NAME (a token for any other form could never match), and its
// metadata.uid, 1 to 128 printable ASCII characters. `job_where` and `uid_where` name the two in
// the error ("--job", "job_id").
Status CheckJobTokenSubject(std::string_view job, std::string_view uid, std::string_view job_where,
                            std::string_view uid_where);

// Parses a job spec. Errors name the field and what it must be.
StatusOr<JobSpec> ParseJobSpec(const nlohmann::json& json);
StatusOr<JobSpec> ParseJobSpec(std::string_view text);
nlohmann::json JobSpecToJson(const JobSpec& spec);

// The validation report of regroup_validate_job: {"ok", "problems", "config"}.
nlohmann::json ValidationReport(const ResolvedConfig& resolved);

}  // namespace regroup
