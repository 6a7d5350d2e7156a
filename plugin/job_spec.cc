// SPDX-License-Identifier: Apache-2.0
#include "plugin/job_spec.h"

#include <nlohmann/json.hpp>

#include "common/text.h"
#include "plugin/json_util.h"

namespace regroup {

namespace ju = json_util;
using nlohmann::json;

namespace {

constexpr size_t kMaxIdLength = 512;

StatusOr<VolcanoFacts> ParseVolcano(const json& v) {
  if (!v.is_object()) return InvalidArgument("job spec field \"volcano\" must be an object");
  VolcanoFacts facts;
  int64_t min_available = -1;
  REGROUP_RETURN_IF_ERROR(ju::GetInt(v, "min_available", "job spec volcano", 0, kMaxPods * 2,
                             min_available, false));
  if (min_available >= 0) facts.min_available = min_available;
  REGROUP_RETURN_IF_ERROR(
      ju::GetInt(v, "manager_pods", "job spec volcano", 0, kMaxPods, facts.manager_pods, false));
  if (auto given = v.find("node_ranks_given"); given != v.end() && !given->is_null()) {
    bool value = false;
    REGROUP_RETURN_IF_ERROR(ju::GetBool(v, "node_ranks_given", "job spec volcano", value));
    facts.node_ranks_given = value;
  }
  REGROUP_RETURN_IF_ERROR(ju::GetStringList(v, "task_index_ranked", "job spec volcano", 253,
                                            facts.task_index_ranked));
  auto it = v.find("policies");
  if (it != v.end() && !it->is_null()) {
    if (!it->is_array() || it->size() > 1000)
      return InvalidArgument("job spec volcano field \"policies\" must be an array of at most 1000");
    for (size_t i = 0; i < it->size(); ++i) {
      const json& p = (*it)[i];
      std::string where = "job spec volcano.policies[" + std::to_string(i) + "]";
      if (!p.is_object()) return InvalidArgument(where + " must be an object");
      VolcanoFacts::Policy policy;
      REGROUP_RETURN_IF_ERROR(ju::GetString(p, "event", where, policy.event));
      REGROUP_RETURN_IF_ERROR(ju::GetString(p, "action", where, policy.action));
      policy.where = "spec.policies[" + std::to_string(i) + "]";
      REGROUP_RETURN_IF_ERROR(ju::GetString(p, "where", where, policy.where, false));
      REGROUP_RETURN_IF_ERROR(ju::GetBool(p, "manager_task", where, policy.manager_task, false));
      facts.policies.push_back(std::move(policy));
    }
  }
  return facts;
}

}  // namespace

Status CheckJobId(std::string_view id, std::string_view where) {
  if (id.empty() || id.size() > kMaxIdLength)
    return InvalidArgument(std::string(where) + " must be 1 to 512 characters");
  // Callers name a job by a C string: an id with a control character could never be named.
  for (unsigned char c : id)
    if (c < 0x20 || c == 0x7f)
      return InvalidArgument(std::string(where) +
                             " holds a control character; use a printable id such as "
                             "\"namespace/name\"");
  return Status::Ok();
}

Status CheckJobTokenSubject(std::string_view job, std::string_view uid, std::string_view job_where,
                            std::string_view uid_where) {
  REGROUP_RETURN_IF_ERROR(CheckJobId(job, job_where));
  const size_t slash = job.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 == job.size() ||
      job.find('/', slash + 1) != std::string_view::npos)
    return InvalidArgument(std::string(job_where) +
                           " must be the job's NAMESPACE/NAME (for example team-a/llama), not \"" +
                           ValidUtf8(job.substr(0, 256)) +
                           "\": the coordinator knows no job by another form, so a token for it "
                           "could never match");
  const bool printable =
      std::all_of(uid.begin(), uid.end(), [](unsigned char c) { return c > 0x20 && c < 0x7f; });
  if (uid.empty() || uid.size() > 128 || !printable)
    return InvalidArgument(std::string(uid_where) +
                           " must be the job's metadata.uid (1 to 128 printable ASCII "
                           "characters), not \"" +
                           ValidUtf8(uid.substr(0, 128)) + "\"");
  return Status::Ok();
}

StatusOr<JobSpec> ParseJobSpec(const json& j) {
  if (!j.is_object()) return InvalidArgument("the job spec must be a JSON object");
  JobSpec spec;
  REGROUP_RETURN_IF_ERROR(ju::GetString(j, "id", "job spec", spec.id));
  REGROUP_RETURN_IF_ERROR(CheckJobId(spec.id, "job spec field \"id\""));
  REGROUP_RETURN_IF_ERROR(ju::GetString(j, "uid", "job spec", spec.uid, false));
  REGROUP_RETURN_IF_ERROR(ju::GetStringMap(j, "labels", "job spec", spec.labels));
  REGROUP_RETURN_IF_ERROR(ju::GetStringMap(j, "annotations", "job spec", spec.annotations));
  REGROUP_RETURN_IF_ERROR(ju::GetStringMap(j, "env", "job spec", spec.env));
  REGROUP_RETURN_IF_ERROR(ju::GetInt(j, "pods", "job spec", 1, kMaxPods, spec.pods));
  REGROUP_RETURN_IF_ERROR(ju::GetInt(j, "processes_per_pod", "job spec", 1, kMaxProcessesPerPod,
                             spec.processes_per_pod, false));
  if (auto it = j.find("volcano"); it != j.end() && !it->is_null()) {
    auto volcano = ParseVolcano(*it);
    if (!volcano.ok()) return volcano.status();
    spec.volcano = std::move(*volcano);
  }
  return spec;
}

StatusOr<JobSpec> ParseJobSpec(std::string_view text) {
  auto parsed = ju::Parse(text, "the job spec");
  if (!parsed.ok()) return parsed.status();
  return ParseJobSpec(*parsed);
}

json JobSpecToJson(const JobSpec& spec) {
  json j = {{"id", spec.id},
            {"uid", spec.uid},
            {"labels", spec.labels},
            {"annotations", spec.annotations},
            {"env", spec.env},
            {"pods", spec.pods},
            {"processes_per_pod", spec.processes_per_pod}};
  if (spec.volcano) {
    json policies = json::array();
    for (const auto& p : spec.volcano->policies) {
      json policy = {{"event", p.event}, {"action", p.action}, {"where", p.where}};
      if (p.manager_task) policy["manager_task"] = true;
      policies.push_back(std::move(policy));
    }
    j["volcano"] = {{"manager_pods", spec.volcano->manager_pods}, {"policies", policies}};
    if (spec.volcano->min_available) j["volcano"]["min_available"] = *spec.volcano->min_available;
    if (spec.volcano->node_ranks_given)
      j["volcano"]["node_ranks_given"] = *spec.volcano->node_ranks_given;
    if (!spec.volcano->task_index_ranked.empty())
      j["volcano"]["task_index_ranked"] = spec.volcano->task_index_ranked;
  }
  return j;
}

json ValidationReport(const ResolvedConfig& resolved) {
  json problems = json::array();
  for (const auto& p : resolved.problems) {
    problems.push_back({{"severity", p.severity == Problem::Severity::kError ? "error" : "warning"},
                        // What the job gave, echoed: valid UTF-8, or the report could not be
                        // written as JSON (fuzz_volcano_yaml: a label value with byte 0x85).
                        {"key", ValidUtf8(p.key)},
                        {"value", ValidUtf8(p.value)},
                        {"message", ValidUtf8(p.message)}});
  }
  json config = json::object();
  const JobConfig& c = resolved.config;
  for (const auto& key : ConfigKeys())
    config[std::string(key.name)] = KeyValueText(key, c.*key.field);
  config["processes_per_pod"] = c.processes_per_pod;
  return {{"ok", resolved.ok()}, {"problems", problems}, {"config", config}};
}

}  // namespace regroup
