// SPDX-License-Identifier: Apache-2.0
#include "plugin/volcano_job.h"

#include <charconv>

#include <yaml-cpp/yaml.h>

#include "common/text.h"
#include "plugin/json_util.h"

namespace regroup {
namespace {

constexpr size_t kMaxYamlBytes = 4u << 20;
constexpr int kMaxNesting = 200;

// yaml-cpp recurses per nesting level; refuse absurd nesting before it does.
// Whether the document's flow collections ([...], {...}) nest deeper than kMaxNesting: yaml-cpp
// recurses once per level. Brackets inside quoted scalars and comments are text, not nesting, so
// they are skipped; a quote counts as one only where a YAML scalar can begin (at the start of a
// line, after a line's leading "- " or "? ", or after ": ", "[", "{" or ","), as the parser
// would read it. A quoted scalar
// left open at the end is read the conservative way: every bracket counts.
bool NestingTooDeep(std::string_view text, bool skip_quoted = true) {
  int depth = 0;
  char last = '\n';  // the last character that was not a space or tab
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == ' ' || c == '\t') continue;
    const bool after_space = i > 0 && (text[i - 1] == ' ' || text[i - 1] == '\t');
    const bool scalar_may_begin = last == '\n' || last == '[' || last == '{' || last == ',' ||
                                  (last == ':' && after_space);
    // "- " and "? " at the start of a line (a sequence entry, a complex key): a scalar may
    // begin after them as at the start of the line. Elsewhere they are text.
    if ((c == '-' || c == '?') && last == '\n' &&
        (i + 1 == text.size() || text[i + 1] == ' ' || text[i + 1] == '\t' || text[i + 1] == '\n'))
      continue;
    if (skip_quoted && (c == '\'' || c == '"') && scalar_may_begin) {
      size_t j = i + 1;
      for (; j < text.size(); ++j) {
        if (c == '"' && text[j] == '\\') { ++j; continue; }
        if (text[j] != c) continue;
        if (c == '\'' && j + 1 < text.size() && text[j + 1] == '\'') { ++j; continue; }  // ''
        break;
      }
      if (j >= text.size()) return NestingTooDeep(text, false);
      i = j;
      last = c;
      continue;
    }
    if (c == '#' && (last == '\n' || after_space)) {  // a comment, to the end of the line
      while (i + 1 < text.size() && text[i + 1] != '\n') ++i;
      continue;
    }
    if (c == '[' || c == '{') {
      if (++depth > kMaxNesting) return true;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
    last = c == '\r' ? '\n' : c;
  }
  return false;
}

// yaml-cpp throws on any use of a missing key's node, so every lookup goes through Child():
// a missing key, or a parent that is not a map, gives a null node.
YAML::Node Child(const YAML::Node& n, const char* key) {
  if (!n || !n.IsMap()) return YAML::Node();
  YAML::Node c = n[key];
  return c ? c : YAML::Node();
}

std::string Scalar(const YAML::Node& n) { return n && n.IsScalar() ? n.Scalar() : std::string(); }

Status ReadStringMap(const YAML::Node& n, const std::string& where,
                     std::map<std::string, std::string>& out) {
  if (!n || n.IsNull()) return Status::Ok();
  if (!n.IsMap()) return InvalidArgument(where + " must be a map of strings");
  for (const auto& kv : n) {
    if (!kv.first.IsScalar() || !(kv.second.IsScalar() || kv.second.IsNull()))
      return InvalidArgument(where + " must map names to string values");
    out[kv.first.Scalar()] = kv.second.IsNull() ? "" : kv.second.Scalar();
  }
  return Status::Ok();
}

std::optional<int64_t> ToInt(const std::string& s) {
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

// Every string of a container's command and args, joined by spaces.
std::string CommandLine(const YAML::Node& container) {
  std::string out;
  for (const char* field : {"command", "args"}) {
    const YAML::Node list = Child(container, field);
    if (!list || !list.IsSequence()) continue;
    for (const auto& item : list)
      if (item.IsScalar()) out += item.Scalar() + " ";
  }
  return out;
}

YAML::Node FirstContainer(const YAML::Node& task) {
  const YAML::Node containers = Child(Child(Child(task, "template"), "spec"), "containers");
  if (containers && containers.IsSequence() && containers.size() > 0 && containers[0].IsMap())
    return containers[0];
  return YAML::Node();
}

bool IsManagerTask(const YAML::Node& task) {
  if (Scalar(Child(task, "name")) == "manager") return true;
  const YAML::Node containers = Child(Child(Child(task, "template"), "spec"), "containers");
  if (!containers || !containers.IsSequence()) return false;
  for (const auto& c : containers)
    if (c.IsMap() && CommandLine(c).find("regroup-manager") != std::string::npos) return true;
  return false;
}

// Whether the container's env names `name`.
bool HasEnv(const YAML::Node& container, std::string_view name) {
  const YAML::Node env = Child(container, "env");
  if (env && env.IsSequence())
    for (const auto& e : env)
      if (Scalar(Child(e, "name")) == name) return true;
  return false;
}

// Whether --node-rank (--node_rank) is in the container's command or args.
bool HasNodeRankFlag(const YAML::Node& container) {
  for (const char* field : {"command", "args"}) {
    const YAML::Node words = Child(container, field);
    if (!words || !words.IsSequence()) continue;
    for (const auto& w : words)
      for (std::string_view flag : {"--node-rank", "--node_rank"})
        if (Scalar(w).compare(0, flag.size(), flag) == 0) return true;
  }
  return false;
}

// Whether the container names its node rank: PET_NODE_RANK or VC_TASK_INDEX in its env, or
// --node-rank in its command or args.
bool NodeRankGiven(const YAML::Node& container) {
  return container && (HasEnv(container, "PET_NODE_RANK") || HasEnv(container, "VC_TASK_INDEX") ||
                       HasNodeRankFlag(container));
}

// Whether the container's pods take their node rank from VC_TASK_INDEX alone: the env plugin
// gives it (or the env names it), and neither PET_NODE_RANK nor --node-rank overrides it.
bool RankedByTaskIndex(const YAML::Node& container, bool env_plugin) {
  return (env_plugin || HasEnv(container, "VC_TASK_INDEX")) &&
         !HasEnv(container, "PET_NODE_RANK") && !HasNodeRankFlag(container);
}

// Processes per pod: an accelerator request, else --nproc-per-node in the command, else
// PET_NPROC_PER_NODE in the env, else 1.
std::optional<int64_t> ProcessesPerPod(const YAML::Node& container) {
  if (!container) return std::nullopt;
  for (const char* kind : {"limits", "requests"}) {
    const YAML::Node res = Child(Child(container, "resources"), kind);
    if (!res || !res.IsMap()) continue;
    for (const auto& kv : res) {
      if (!IsAcceleratorResource(Scalar(kv.first))) continue;
      if (auto v = ToInt(Scalar(kv.second)); v && *v > 0) return v;
    }
  }
  // --nproc-per-node=N, --nproc_per_node N (torchrun's spellings).
  const std::string cmd = CommandLine(container);
  for (const char* flag : {"--nproc-per-node", "--nproc_per_node"}) {
    size_t at = cmd.find(flag);
    if (at == std::string::npos) continue;
    at += std::string_view(flag).size();
    while (at < cmd.size() && (cmd[at] == '=' || cmd[at] == ' ')) ++at;
    size_t end = at;
    while (end < cmd.size() && cmd[end] >= '0' && cmd[end] <= '9') ++end;
    if (auto v = ToInt(cmd.substr(at, end - at)); v && *v > 0) return v;
  }
  // torchrun's variable for it, where a script hides the command (MindCluster's train_start.sh).
  if (const YAML::Node env = Child(container, "env"); env && env.IsSequence())
    for (const auto& e : env)
      if (Scalar(Child(e, "name")) == "PET_NPROC_PER_NODE")
        if (auto v = ToInt(Scalar(Child(e, "value"))); v && *v > 0) return v;
  return std::nullopt;
}

// Only the env variables the configuration table reads (MINDIO_WAIT_MINDX_TIME) enter the spec.
bool IsConfigEnv(const std::string& name) {
  const KeySpec* key = FindKey(name);
  return key && key->source == KeySource::kEnv;
}

Status ReadPolicies(const YAML::Node& n, const std::string& where,
                    std::vector<VolcanoFacts::Policy>& out) {
  if (!n || n.IsNull()) return Status::Ok();
  if (!n.IsSequence()) return InvalidArgument(where + " must be a list");
  for (size_t i = 0; i < n.size(); ++i) {
    const YAML::Node p = n[i];
    const std::string at = where + "[" + std::to_string(i) + "]";
    if (!p.IsMap()) return InvalidArgument(at + " must be a map");
    const std::string action = Scalar(Child(p, "action"));
    std::vector<std::string> events;
    if (Child(p, "event").IsScalar()) events.push_back(Scalar(Child(p, "event")));
    if (Child(p, "events").IsSequence())
      for (const auto& e : Child(p, "events")) events.push_back(Scalar(e));
    for (const auto& e : events) out.push_back({e, action, at});
  }
  return Status::Ok();
}

StatusOr<VolcanoJobReading> Convert(const YAML::Node& doc, const VolcanoReadOptions& options) {
  if (!doc.IsMap()) return InvalidArgument("the document is not a YAML map (a Volcano Job)");
  const std::string kind = Scalar(Child(doc, "kind"));
  if (kind != "Job")
    return InvalidArgument("kind is \"" + kind + "\"; expected a Volcano Job (kind: Job)" +
                           (kind == "AscendJob" ? "; convert it with `regroupctl convert`" : ""));
  const YAML::Node meta = Child(doc, "metadata");
  if (!meta || !meta.IsMap()) return InvalidArgument("metadata is missing or not a map");
  VolcanoJobReading reading;
  JobSpec& spec = reading.spec;
  const std::string name = Scalar(Child(meta, "name"));
  if (name.empty()) return InvalidArgument("metadata.name is missing");
  std::string ns = Scalar(Child(meta, "namespace"));
  spec.id = (ns.empty() ? "default" : ns) + "/" + name;
  REGROUP_RETURN_IF_ERROR(CheckJobId(spec.id, "the job id (metadata.namespace/metadata.name)"));
  spec.uid = Scalar(Child(meta, "uid"));
  REGROUP_RETURN_IF_ERROR(ReadStringMap(Child(meta, "labels"), "metadata.labels", spec.labels));
  REGROUP_RETURN_IF_ERROR(
      ReadStringMap(Child(meta, "annotations"), "metadata.annotations", spec.annotations));

  const YAML::Node s = Child(doc, "spec");
  if (!s || !s.IsMap()) return InvalidArgument("spec is missing or not a map");
  VolcanoFacts volcano;
  if (const YAML::Node min = Child(s, "minAvailable"); min && !min.IsNull()) {
    auto v = ToInt(Scalar(min));
    if (!v || *v < 0 || *v > 2 * kMaxPods)
      return InvalidArgument("spec.minAvailable must be an integer from 0 to " +
                             std::to_string(2 * kMaxPods));
    volcano.min_available = v;
  }
  REGROUP_RETURN_IF_ERROR(ReadPolicies(Child(s, "policies"), "spec.policies", volcano.policies));

  const YAML::Node tasks = Child(s, "tasks");
  if (!tasks || !tasks.IsSequence() || tasks.size() == 0)
    return InvalidArgument("spec.tasks must be a non-empty list");
  bool first_training = true;
  const YAML::Node plugins = Child(s, "plugins");
  const bool env_plugin = plugins && plugins.IsMap() && Child(plugins, "env");
  bool ranks_given = true;
  for (size_t i = 0; i < tasks.size(); ++i) {
    const YAML::Node task = tasks[i];
    const std::string where = "spec.tasks[" + std::to_string(i) + "]";
    if (!task.IsMap()) return InvalidArgument(where + " must be a map");
    const YAML::Node replicas_node = Child(task, "replicas");
    auto replicas = replicas_node.IsNull() ? std::optional<int64_t>(1)
                                           : ToInt(Scalar(replicas_node));
    if (!replicas || *replicas < 0 || *replicas > kMaxPods)
      return InvalidArgument(where + ".replicas must be an integer from 0 to " +
                             std::to_string(kMaxPods));
    const std::string task_name = Scalar(Child(task, "name"));
    const size_t first_policy = volcano.policies.size();
    REGROUP_RETURN_IF_ERROR(ReadPolicies(Child(task, "policies"),
                                         "tasks[" + (task_name.empty() ? std::to_string(i) : task_name) +
                                             "].policies",
                                         volcano.policies));
    if (IsManagerTask(task)) {
      for (size_t p = first_policy; p < volcano.policies.size(); ++p)
        volcano.policies[p].manager_task = true;
      reading.manager_tasks.push_back(i);
      volcano.manager_pods += *replicas;
      if (volcano.manager_pods > kMaxPods)
        return InvalidArgument("the job has more than " + std::to_string(kMaxPods) +
                               " manager pods");
      continue;
    }
    spec.pods += *replicas;
    if (spec.pods > kMaxPods) return InvalidArgument("the job has more than 100000 pods");
    ranks_given = ranks_given && NodeRankGiven(FirstContainer(task));
    if (*replicas > 0 && RankedByTaskIndex(FirstContainer(task), env_plugin))
      volcano.task_index_ranked.push_back(task_name.empty() ? std::to_string(i) : task_name);
    if (!first_training) continue;
    first_training = false;
    const YAML::Node container = FirstContainer(task);
    if (auto ppp = ProcessesPerPod(container)) {
      if (*ppp > kMaxProcessesPerPod)
        return InvalidArgument(where + " asks for " + std::to_string(*ppp) +
                               " processes per pod; at most 1024 are supported");
      spec.processes_per_pod = *ppp;
    }
    if (container) {
      const YAML::Node env = Child(container, "env");
      if (env && env.IsSequence())
        for (const auto& e : env)
          if (Child(e, "name").IsScalar() && Child(e, "value").IsScalar() &&
              IsConfigEnv(Scalar(Child(e, "name"))))
            spec.env[Scalar(Child(e, "name"))] = Scalar(Child(e, "value"));
    }
  }
  if (spec.pods < 1 && !options.allow_no_training_pods)
    return InvalidArgument("the job has no training pods (spec.tasks replicas)");
  volcano.node_ranks_given = env_plugin || ranks_given;
  spec.volcano = std::move(volcano);
  return reading;
}

}  // namespace

Status CheckYamlText(std::string_view yaml) {
  if (yaml.size() > kMaxYamlBytes) return InvalidArgument("the YAML document is over 4 MiB");
  if (NestingTooDeep(yaml)) return InvalidArgument("the YAML document is nested too deeply");
  if (size_t bad = InvalidUtf8At(yaml); bad != std::string_view::npos)
    return InvalidArgument("the YAML document is not valid UTF-8 (byte " + std::to_string(bad) +
                           ")");
  return Status::Ok();
}

bool MakesJobRegroups(KeySource source, std::string_view name) {
  if (source == KeySource::kEnv) return false;
  if (name.substr(0, kRegroupKeyPrefix.size()) == kRegroupKeyPrefix) return true;
  const KeySpec* key = FindKey(name);
  return key && key->source == source;
}

bool IsAcceleratorResource(std::string_view name) {
  return name.find("gpu") != std::string_view::npos || name.find("npu") != std::string_view::npos ||
         name.find("Ascend") != std::string_view::npos;
}

StatusOr<JobSpec> JobSpecFromVolcanoYaml(std::string_view yaml) {
  auto reading = ReadVolcanoJob(yaml);
  if (!reading.ok()) return reading.status();
  return std::move(reading->spec);
}

StatusOr<VolcanoJobReading> ReadVolcanoJob(std::string_view yaml, VolcanoReadOptions options) {
  REGROUP_RETURN_IF_ERROR(CheckYamlText(yaml));
  try {
    const YAML::Node doc = YAML::Load(std::string(yaml));
    return Convert(doc, options);
  } catch (const YAML::Exception& e) {
    return InvalidArgument(std::string("the job is not valid YAML: ") + e.what());
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("the job could not be read: ") + e.what());
  }
}

}  // namespace regroup
