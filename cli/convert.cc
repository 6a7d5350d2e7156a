// SPDX-License-Identifier: Apache-2.0
#include "cli/convert.h"

#include <charconv>

#include <yaml-cpp/yaml.h>

#include "plugin/volcano_job.h"

namespace regroup::cli {
namespace {

using Kind = ConvertNote::Kind;

constexpr int kMaxDepth = 200;
// Aliases let a small document expand into a huge one when it is written out; refuse that.
constexpr int64_t kMaxOutputNodes = 1'000'000;
constexpr int kManagerPort = 9601;
constexpr char kCredentialVolume[] = "regroup-credential";
constexpr char kCredentialDir[] = "/etc/regroup/credential";
// The job's token at the coordinator (deploy/README.md, step 2): the Secret NAME + this, written
// by the scheduler's regroup plugin once the job has its uid (go/volcano TokenSecretName), or by
// whoever holds the cluster key (regroupctl token).
constexpr char kCoordinatorSecretSuffix[] = "-regroup-coordinator-token";
constexpr char kCoordinatorVolume[] = "regroup-coordinator-credential";
constexpr char kCoordinatorDir[] = "/etc/regroup/coordinator";
constexpr char kCredentialKey[] = "token";
// The CA that signed the coordinator's certificate: ca.crt of the job's TLS Secret (NAME + this,
// cert-manager's layout: deploy/examples/tls.yaml, deploy/README.md "TLS"), mounted alone.
constexpr char kTlsSecretSuffix[] = "-regroup-tls";
constexpr char kTlsVolume[] = "regroup-tls";
constexpr char kTlsDir[] = "/etc/regroup/tls";
constexpr char kCaKey[] = "ca.crt";

// Lookups on a const node never insert (yaml-cpp's non-const operator[] would); a missing key or
// a parent that is not a map gives a null node.
YAML::Node Child(const YAML::Node& n, const char* key) {
  if (!n || !n.IsMap()) return YAML::Node();
  const YAML::Node& c = n;
  YAML::Node v = c[key];
  return v ? v : YAML::Node();
}

std::string Scalar(const YAML::Node& n) { return n && n.IsScalar() ? n.Scalar() : std::string(); }

std::optional<int64_t> ToInt(const std::string& s) {
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

// A string scalar that must stay a string when read back ("on", "60"): written quoted.
YAML::Node Str(const std::string& s) {
  YAML::Node n(s);
  n.SetTag("!");
  return n;
}

// Marks every scalar under `n` as a string: Kubernetes wants strings for label and annotation
// values, env values, command and args.
void MarkStrings(YAML::Node n) {
  if (n.IsScalar()) n.SetTag("!");
  if (n.IsSequence())
    for (YAML::Node item : n) MarkStrings(item);
  if (n.IsMap())
    for (auto kv : n) MarkStrings(kv.second);
}

bool IsDnsLabel(std::string_view s) {
  if (s.empty() || s.size() > 63) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  return s.front() != '-' && s.back() != '-';
}

std::string Base(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string Pods(int64_t n, std::string_view what = "pod") {
  return std::to_string(n) + " " + std::string(what) + (n == 1 ? "" : "s");
}

std::string Shorten(std::string s, size_t max = 70) {
  for (char& c : s)
    if (c == '\n' || c == '\t') c = ' ';
  return s.size() <= max ? s : s.substr(0, max) + "...";
}

// ------------------------------------------------------------------------------------------
// Writing: yaml-cpp's emitter, driven node by node so that a scalar quoted in the input (or
// marked with Str) stays quoted ("on" stays a string), which emitting a whole Node loses.

// Counts the nodes `n` expands to, stopping at the limit: aliases share nodes, so a short
// document can stand for billions of them once written out.
bool WithinNodeLimit(const YAML::Node& n, int64_t& budget, int depth = 0) {
  if (--budget < 0 || depth > kMaxDepth) return false;
  if (n.IsSequence())
    for (const auto& item : n)
      if (!WithinNodeLimit(item, budget, depth + 1)) return false;
  if (n.IsMap())
    for (const auto& kv : n)
      if (!WithinNodeLimit(kv.first, budget, depth + 1) ||
          !WithinNodeLimit(kv.second, budget, depth + 1))
        return false;
  return true;
}

class Writer {
 public:
  Status Write(const YAML::Node& n, YAML::Emitter& out, int depth = 0) {
    if (depth > kMaxDepth)
      return InvalidArgument("the document nests more than 200 levels (or refers to itself)");
    if (++nodes_ > kMaxOutputNodes)
      return InvalidArgument("the document expands to more than a million nodes (YAML aliases)");
    switch (n.Type()) {
      case YAML::NodeType::Undefined:
      case YAML::NodeType::Null:
        out << YAML::Null;
        break;
      case YAML::NodeType::Scalar:
        WriteScalar(n, out);
        break;
      case YAML::NodeType::Sequence:
        if (n.size() == 0) {
          out << YAML::Flow << YAML::BeginSeq << YAML::EndSeq;
          break;
        }
        out << YAML::BeginSeq;
        for (const auto& item : n) REGROUP_RETURN_IF_ERROR(Write(item, out, depth + 1));
        out << YAML::EndSeq;
        break;
      case YAML::NodeType::Map:
        if (n.size() == 0) {
          out << YAML::Flow << YAML::BeginMap << YAML::EndMap;
          break;
        }
        out << YAML::BeginMap;
        for (const auto& kv : n) {
          out << YAML::Key;
          REGROUP_RETURN_IF_ERROR(Write(kv.first, out, depth + 1));
          out << YAML::Value;
          REGROUP_RETURN_IF_ERROR(Write(kv.second, out, depth + 1));
        }
        out << YAML::EndMap;
        break;
    }
    if (!out.good())
      return InvalidArgument(std::string("cannot write YAML: ") + out.GetLastError());
    return Status::Ok();
  }

 private:
  static void WriteScalar(const YAML::Node& n, YAML::Emitter& out) {
    const std::string& v = n.Scalar();
    const bool quoted = n.Tag() == "!" || n.Tag() == "tag:yaml.org,2002:str";
    if (!quoted) {
      out << v;
      return;
    }
    // A block literal reads back exactly only for text that ends in one newline, has no other
    // control character and does not start with a space; anything else is double-quoted.
    bool literal = v.size() > 1 && v.back() == '\n' && v[v.size() - 2] != '\n' && v[0] != ' ';
    for (char c : v)
      if (static_cast<unsigned char>(c) < 0x20 && c != '\n') literal = false;
    out << (literal ? YAML::Literal : YAML::DoubleQuoted) << v;
  }

  int64_t nodes_ = 0;
};

StatusOr<std::string> Emit(const YAML::Node& doc) {
  YAML::Emitter out;
  out.SetIndent(2);
  out.SetSeqFormat(YAML::Block);
  int64_t budget = kMaxOutputNodes;
  if (!WithinNodeLimit(doc, budget))
    return InvalidArgument(
        budget < 0 ? "the document expands to more than a million nodes (YAML aliases)"
                   : "the document nests more than 200 levels (or refers to itself)");
  Writer writer;
  REGROUP_RETURN_IF_ERROR(writer.Write(doc, out));
  return std::string(out.c_str()) + "\n";
}

// ------------------------------------------------------------------------------------------
// Reading the AscendJob.

struct ReplicaSpec {
  std::string type;  // Master or Worker
  int64_t replicas = 1;
  std::string restart_policy;
  YAML::Node pod_template;  // a deep copy
};

Status CheckStringMap(const YAML::Node& n, const std::string& where) {
  if (!n || n.IsNull()) return Status::Ok();
  if (!n.IsMap()) return InvalidArgument(where + " must be a map of strings");
  for (const auto& kv : n)
    if (!kv.first.IsScalar() || !(kv.second.IsScalar() || kv.second.IsNull()))
      return InvalidArgument(where + " must map names to string values");
  return Status::Ok();
}

StatusOr<ReplicaSpec> ReadReplicaSpec(const std::string& type, const YAML::Node& rs) {
  const std::string where = "spec.replicaSpecs." + type;
  if (type != "Master" && type != "Worker")
    return InvalidArgument(where + " is not a PyTorch replica type: a PyTorch AscendJob has "
                                   "Master and Worker replica specs only");
  if (!rs.IsMap()) return InvalidArgument(where + " must be a map (replicas, template)");
  ReplicaSpec out;
  out.type = type;
  if (const YAML::Node r = Child(rs, "replicas"); r && !r.IsNull()) {
    auto v = ToInt(Scalar(r));
    if (!v || *v < 0 || *v > kMaxPods)
      return InvalidArgument(where + ".replicas must be an integer from 0 to " +
                             std::to_string(kMaxPods));
    out.replicas = *v;
  }
  out.restart_policy = Scalar(Child(rs, "restartPolicy"));
  if (!out.restart_policy.empty() && out.restart_policy != "Never" &&
      out.restart_policy != "OnFailure" && out.restart_policy != "Always" &&
      out.restart_policy != "ExitCode")
    return InvalidArgument(where + ".restartPolicy \"" + out.restart_policy +
                           "\" is not one of Never, OnFailure, Always, ExitCode");
  const YAML::Node tmpl = Child(rs, "template");
  if (!tmpl || !tmpl.IsMap())
    return InvalidArgument(where + ".template is missing: it is the pod template of the " + type +
                           " pods");
  const YAML::Node containers = Child(Child(tmpl, "spec"), "containers");
  if (!containers || !containers.IsSequence() || containers.size() == 0)
    return InvalidArgument(where + ".template.spec.containers must list the pod's containers");
  for (size_t i = 0; i < containers.size(); ++i)
    if (!containers[i].IsMap() || Scalar(Child(containers[i], "name")).empty())
      return InvalidArgument(where + ".template.spec.containers[" + std::to_string(i) +
                             "] must be a container with a name");
  for (const char* field : {"metadata", "spec"})
    if (const YAML::Node f = Child(tmpl, field); f && !f.IsNull() && !f.IsMap())
      return InvalidArgument(where + ".template." + field + " must be a map");
  if (const YAML::Node labels = Child(Child(tmpl, "metadata"), "labels"))
    REGROUP_RETURN_IF_ERROR(CheckStringMap(labels, where + ".template.metadata.labels"));
  for (const char* field : {"env", "ports", "volumeMounts", "command", "args"})
    if (const YAML::Node f = Child(containers[0], field); f && !f.IsNull() && !f.IsSequence())
      return InvalidArgument(where + ".template.spec.containers[0]." + field + " must be a list");
  if (const YAML::Node v = Child(Child(tmpl, "spec"), "volumes"); !v.IsNull() && !v.IsSequence())
    return InvalidArgument(where + ".template.spec.volumes must be a list");
  out.pod_template = YAML::Clone(tmpl);
  return out;
}

// A list field of a map, created empty when missing.
YAML::Node ListField(YAML::Node map, const char* key) {
  if (Child(map, key).IsNull()) map[key] = YAML::Node(YAML::NodeType::Sequence);
  return map[key];
}

YAML::Node MapField(YAML::Node map, const char* key) {
  if (Child(map, key).IsNull()) map[key] = YAML::Node(YAML::NodeType::Map);
  return map[key];
}

bool HasNamed(const YAML::Node& list, const std::string& name) {
  for (const auto& item : list)
    if (Scalar(Child(item, "name")) == name) return true;
  return false;
}

YAML::Node EnvValue(const std::string& name, const std::string& value) {
  YAML::Node e;
  e["name"] = name;
  e["value"] = Str(value);
  return e;
}

YAML::Node EnvField(const std::string& name, const std::string& field_path) {
  YAML::Node e;
  e["name"] = name;
  e["valueFrom"]["fieldRef"]["fieldPath"] = field_path;
  return e;
}

YAML::Node Port(int port) {
  YAML::Node p;
  p["name"] = "taskd-port";
  p["containerPort"] = port;
  return p;
}

// ------------------------------------------------------------------------------------------
// Rewriting the trainer's command: torchrun, or python -m torch.distributed.run, becomes
// regroup-agent (torchrun's flags are its own).

enum class Launcher { kNone, kExec, kShell, kAlreadyAgent };

bool IsPython(const std::string& arg) {
  const std::string b = Base(arg);
  if (!b.starts_with("python")) return false;
  for (char c : std::string_view(b).substr(6))
    if (!((c >= '0' && c <= '9') || c == '.')) return false;
  return true;
}

bool IsShell(const std::string& arg) {
  const std::string b = Base(arg);
  return b == "sh" || b == "bash" || b == "dash" || b == "zsh" || b == "ash";
}

// What ends a word in a shell script, for finding the commands it runs.
bool IsDelimiter(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ';' || c == '&' || c == '|' ||
         c == '(' || c == ')' || c == '`' || c == '\'' || c == '"';
}

// Replaces every torchrun (any path) and `python -m torch.distributed.run` a shell script runs
// by regroup-agent; returns how many. A plain scan, not std::regex, whose recursion a long
// script could overflow.
int RewriteScript(std::string& script) {
  auto word_end = [&](size_t at) {
    while (at < script.size() && !IsDelimiter(script[at])) ++at;
    return at;
  };
  auto skip_blanks = [&](size_t at) {
    while (at < script.size() && (script[at] == ' ' || script[at] == '\t')) ++at;
    return at;
  };
  std::string out;
  int count = 0;
  size_t i = 0;
  while (i < script.size()) {
    if (IsDelimiter(script[i])) {
      out += script[i++];
      continue;
    }
    const size_t end = word_end(i);
    const std::string word = script.substr(i, end - i);
    size_t replaced_to = 0;
    if (Base(word) == "torchrun") {
      replaced_to = end;
    } else if (IsPython(word)) {
      const size_t m = skip_blanks(end), m_end = word_end(m);
      const size_t mod = skip_blanks(m_end), mod_end = word_end(mod);
      if (m > end && script.compare(m, m_end - m, "-m") == 0 && mod > m_end &&
          script.compare(mod, mod_end - mod, "torch.distributed.run") == 0)
        replaced_to = mod_end;
    }
    if (replaced_to > 0) {
      out += "regroup-agent";
      ++count;
      i = replaced_to;
    } else {
      out += word;
      i = end;
    }
  }
  if (count > 0) script = std::move(out);
  return count;
}

struct CommandRewrite {
  Launcher launcher = Launcher::kNone;
  std::string before;  // the command line as it was, shortened
  bool uses_launch = false;
  bool uses_operator_env = false;
  bool gives_nproc = false;  // --nproc-per-node (or --nproc_per_node) in the command
};

// Rewrites `container`'s command and args in place.
CommandRewrite RewriteCommand(YAML::Node container) {
  CommandRewrite r;
  std::vector<YAML::Node> items;
  size_t in_command = 0;  // how many of `items` come from command (the rest from args)
  for (const char* field : {"command", "args"}) {
    YAML::Node list = Child(container, field);
    if (list.IsSequence()) {
      MarkStrings(list);
      for (YAML::Node item : list)
        if (item.IsScalar()) items.push_back(item);
    }
    if (std::string_view(field) == "command") in_command = items.size();
  }
  std::string line;
  for (const auto& item : items) line += (line.empty() ? "" : " ") + item.Scalar();
  r.before = Shorten(line);
  r.uses_launch = line.find("torch.distributed.launch") != std::string::npos;
  r.gives_nproc = line.find("--nproc-per-node") != std::string::npos ||
                  line.find("--nproc_per_node") != std::string::npos;
  for (const char* var : {"MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "WORLD_SIZE"})
    if (line.find(std::string("$") + var) != std::string::npos ||
        line.find(std::string("${") + var) != std::string::npos)
      r.uses_operator_env = true;
  if (items.empty()) return r;
  if (line.find("regroup-agent") != std::string::npos) {
    r.launcher = Launcher::kAlreadyAgent;
    return r;
  }
  const std::string first = items[0].Scalar();
  if (Base(first) == "torchrun" && in_command > 0) {
    items[0] = "regroup-agent";
    r.launcher = Launcher::kExec;
  } else if (IsPython(first) && items.size() >= 3 && items[1].Scalar() == "-m" &&
             items[2].Scalar() == "torch.distributed.run" && in_command > 0) {
    // Drop the three words, wherever command ends and args begin.
    YAML::Node new_command(YAML::NodeType::Sequence), new_args(YAML::NodeType::Sequence);
    new_command.push_back(Str("regroup-agent"));
    for (size_t i = 3; i < items.size(); ++i)
      (i < in_command ? new_command : new_args).push_back(Str(items[i].Scalar()));
    container["command"] = new_command;
    if (new_args.size() > 0) container["args"] = new_args;
    else if (!Child(container, "args").IsNull()) container.remove("args");
    r.launcher = Launcher::kExec;
  } else if (IsShell(first)) {
    // sh -c SCRIPT (or -ec, -xc, ...): the script is the word after the flag.
    for (size_t i = 1; i + 1 < items.size(); ++i) {
      const std::string flag = items[i].Scalar();
      if (flag.size() < 2 || flag[0] != '-' || flag[1] == '-' ||
          flag.find('c') == std::string::npos)
        continue;
      std::string script = items[i + 1].Scalar();
      if (RewriteScript(script) > 0) {
        items[i + 1] = script;
        r.launcher = Launcher::kShell;
      }
      break;
    }
  }
  return r;
}

bool RequestsAccelerator(const std::optional<YAML::Node>& container) {
  if (!container) return false;
  for (const char* kind : {"limits", "requests"}) {
    const YAML::Node res = Child(Child(*container, "resources"), kind);
    if (res.IsMap())
      for (const auto& kv : res)
        if (IsAcceleratorResource(Scalar(kv.first))) return true;
  }
  return false;
}

// ------------------------------------------------------------------------------------------

class Converter {
 public:
  explicit Converter(const ConvertOptions& options) : options_(options) {}

  StatusOr<ConvertResult> Run(const YAML::Node& job) {
    REGROUP_RETURN_IF_ERROR(ReadHeader(job));
    YAML::Node out;
    out["apiVersion"] = "batch.volcano.sh/v1alpha1";
    out["kind"] = "Job";
    Note(Kind::kChanged, "kind",
         "AscendJob (mindxdl.gitee.com/v1) -> Job (batch.volcano.sh/v1alpha1): Regroup runs on "
         "Volcano's Job, scheduled by Volcano with the regroup plugin instead of MindCluster's "
         "Ascend operator");
    out["metadata"] = Metadata();
    REGROUP_RETURN_IF_ERROR(ReadSpec(Child(job, "spec")));
    if (backoff_limit_ && Scalar(Child(Child(meta_, "annotations"), "regroup.io/backoff-limit")).empty()) {
      out["metadata"]["annotations"]["regroup.io/backoff-limit"] =
          Str(std::to_string(*backoff_limit_));
      Note(Kind::kAdded, "metadata.annotations[regroup.io/backoff-limit]",
           "from spec.runPolicy.backoffLimit: as MindCluster's operator does, it bounds every "
           "rescheduling of the job, whatever the fault (Volcano's maxRetry bounds only "
           "Volcano's own restarts)");
    }
    YAML::Node spec = out["spec"];
    spec["schedulerName"] = "volcano";
    spec["minAvailable"] = 0;  // set below, once the job's sizes are known
    for (const auto& [key, value] : volcano_fields_) spec[key] = value;
    spec["plugins"]["svc"] = YAML::Node(YAML::NodeType::Sequence);
    Note(Kind::kAdded, "spec.plugins.svc",
         "Volcano's svc plugin gives every pod a stable hostname (" + name_ + "-manager-0." +
             name_ + " is the manager's address) and a NetworkPolicy admitting only the job's "
             "own pods");
    spec["plugins"]["env"] = YAML::Node(YAML::NodeType::Sequence);
    Note(Kind::kAdded, "spec.plugins.env",
         "Volcano's env plugin gives every pod VC_TASK_INDEX, its index in its task: the agent's "
         "node rank, so that the manager and the scheduler name each pod alike");
    YAML::Node tasks = spec["tasks"];
    YAML::Node manager = ManagerTask();
    tasks.push_back(manager);
    REGROUP_RETURN_IF_ERROR(TrainingTasks(tasks));

    // The job as `regroupctl validate` reads it gives the sizes the manager and minAvailable
    // need, so the converter and the validator cannot disagree about them.
    auto first = Emit(out);
    if (!first.ok()) return first.status();
    auto read = JobSpecFromVolcanoYaml(*first);
    if (!read.ok())
      return InvalidArgument("the converted job cannot be read back: " + read.status().message());
    JobSpec job_spec = std::move(*read);
    for (YAML::Node env : trainer_nproc_env_)
      env["value"] = Str(std::to_string(job_spec.processes_per_pod));
    if (job_spec.processes_per_pod == 1 && !first_trainer_gives_nproc_ &&
        !RequestsAccelerator(first_trainer_))
      Note(Kind::kCheck, "processes per pod",
           "the trainer requests no accelerator (a gpu, npu or Ascend resource) and its command "
           "gives no --nproc-per-node: one process per pod is assumed; request the devices, or "
           "set PET_NPROC_PER_NODE");
    FillManagerCommand(manager, job_spec);
    SetMinAvailable(spec, job_spec);

    ConvertResult result;
    auto text = Emit(out);
    if (!text.ok()) return text.status();
    auto final_spec = JobSpecFromVolcanoYaml(*text);
    if (!final_spec.ok())
      return InvalidArgument("the converted job cannot be read back: " +
                             final_spec.status().message());
    result.spec = std::move(*final_spec);
    result.resolved = result.spec.Resolve();
    AddAdoptionAdvice(result.spec, result.resolved);
    result.yaml = "# Converted from AscendJob " + result.spec.id +
                  " by `regroupctl convert`; its report says what changed and why.\n" + *text;
    result.notes = std::move(notes_);
    return result;
  }

 private:
  void Note(Kind kind, std::string field, std::string message) {
    notes_.push_back({kind, std::move(field), std::move(message)});
  }

  Status ReadHeader(const YAML::Node& job) {
    const std::string api = Scalar(Child(job, "apiVersion"));
    if (api != "mindxdl.gitee.com/v1")
      return InvalidArgument("apiVersion is " + (api.empty() ? "missing" : "\"" + api + "\"") +
                             "; an AscendJob is mindxdl.gitee.com/v1");
    meta_ = Child(job, "metadata");
    if (!meta_ || !meta_.IsMap()) return InvalidArgument("metadata is missing or not a map");
    name_ = Scalar(Child(meta_, "name"));
    if (name_.empty()) return InvalidArgument("metadata.name is missing");
    if (!IsDnsLabel(name_))
      return InvalidArgument("metadata.name \"" + name_ +
                             "\" is not a DNS-1123 label (at most 63 lowercase letters, digits "
                             "and '-'): Volcano names the job's pods and service after it");
    namespace_ = Scalar(Child(meta_, "namespace"));
    if (!namespace_.empty() && !IsDnsLabel(namespace_))
      return InvalidArgument("metadata.namespace \"" + namespace_ +
                             "\" is not a DNS-1123 label (at most 63 lowercase letters, digits "
                             "and '-')");
    REGROUP_RETURN_IF_ERROR(CheckStringMap(Child(meta_, "labels"), "metadata.labels"));
    REGROUP_RETURN_IF_ERROR(CheckStringMap(Child(meta_, "annotations"), "metadata.annotations"));
    const std::string framework = Scalar(Child(Child(meta_, "labels"), "framework"));
    if (framework.empty()) {
      Note(Kind::kCheck, "metadata.labels.framework",
           "no framework label: the job is converted as a PyTorch job (Regroup's trainer library "
           "is for PyTorch)");
    } else if (framework != "pytorch" && framework != "PyTorch") {
      return InvalidArgument("label framework is \"" + framework +
                             "\": regroupctl convert converts PyTorch jobs only (Regroup's trainer "
                             "library is for PyTorch)");
    }
    std::vector<std::string> dropped;
    for (const auto& kv : job) {
      const std::string key = Scalar(kv.first);
      if (key != "apiVersion" && key != "kind" && key != "metadata" && key != "spec")
        dropped.push_back(key);
    }
    for (const auto& kv : meta_) {
      const std::string key = Scalar(kv.first);
      if (key != "name" && key != "namespace" && key != "labels" && key != "annotations")
        dropped.push_back("metadata." + key);
    }
    if (!dropped.empty()) {
      std::string list;
      for (const auto& d : dropped) list += (list.empty() ? "" : ", ") + d;
      Note(Kind::kDropped, list,
           "written by the cluster for the AscendJob; the new job gets its own");
    }
    return Status::Ok();
  }

  Status ReadSpec(const YAML::Node& spec) {
    if (!spec || !spec.IsMap()) return InvalidArgument("spec is missing or not a map");
    const std::string scheduler = Scalar(Child(spec, "schedulerName"));
    if (scheduler != "volcano")
      Note(Kind::kChanged, "spec.schedulerName",
           (scheduler.empty() ? std::string("not set") : "\"" + scheduler + "\"") +
               " -> volcano: Regroup's decisions are made in the Volcano scheduler");
    const YAML::Node specs = Child(spec, "replicaSpecs");
    if (!specs || specs.IsNull())
      return InvalidArgument(
          "spec.replicaSpecs is missing: an AscendJob lists its pods there (Master and Worker)");
    if (!specs.IsMap() || specs.size() == 0)
      return InvalidArgument(
          "spec.replicaSpecs must be a map of replica types (Master, Worker) to replica specs");
    std::optional<ReplicaSpec> master, worker;
    for (const auto& kv : specs) {
      if (!kv.first.IsScalar())
        return InvalidArgument("spec.replicaSpecs has a key that is not a name");
      auto rs = ReadReplicaSpec(kv.first.Scalar(), kv.second);
      if (!rs.ok()) return rs.status();
      (rs->type == "Master" ? master : worker) = std::move(*rs);
    }
    if (master) replicas_.push_back(std::move(*master));
    if (worker) replicas_.push_back(std::move(*worker));
    int64_t pods = 0;
    for (const auto& r : replicas_) pods += r.replicas;
    if (pods < 1)
      return InvalidArgument(
          "the AscendJob has no pods: the replicas of spec.replicaSpecs add up to 0");
    if (pods > kMaxPods)
      return InvalidArgument("the AscendJob has more than " + std::to_string(kMaxPods) + " pods");

    for (const auto& kv : spec) {
      const std::string key = Scalar(kv.first);
      if (key == "schedulerName" || key == "replicaSpecs") continue;
      if (key == "runPolicy") {
        REGROUP_RETURN_IF_ERROR(ReadRunPolicy(kv.second));
      } else if (key == "successPolicy") {
        Note(Kind::kDropped, "spec.successPolicy",
             "no Volcano field: the job completes when its training pods have completed "
             "(TaskCompleted -> CompleteJob)");
      } else {
        Note(Kind::kDropped, "spec." + key, "not a field Regroup's Volcano Job has");
      }
    }
    return Status::Ok();
  }

  Status ReadRunPolicy(const YAML::Node& run) {
    if (!run || run.IsNull()) return Status::Ok();
    if (!run.IsMap()) return InvalidArgument("spec.runPolicy must be a map");
    auto integer = [&](const YAML::Node& n, const std::string& where) -> StatusOr<int64_t> {
      auto v = ToInt(Scalar(n));
      if (!v || *v < 0 || *v > (int64_t{1} << 31) - 1)
        return InvalidArgument(where + " must be a non-negative integer");
      return *v;
    };
    for (const auto& kv : run) {
      const std::string key = Scalar(kv.first);
      const std::string where = "spec.runPolicy." + key;
      if (key == "schedulingPolicy") {
        if (kv.second.IsNull()) continue;
        if (!kv.second.IsMap()) return InvalidArgument(where + " must be a map");
        for (const auto& sp : kv.second) {
          const std::string k = Scalar(sp.first);
          const std::string w = where + "." + k;
          if (k == "minAvailable") {
            auto v = integer(sp.second, w);
            if (!v.ok()) return v.status();
            ascend_min_available_ = *v;
          } else if (k == "queue" || k == "priorityClass") {
            if (!sp.second.IsScalar() || sp.second.Scalar().empty())
              return InvalidArgument(w + " must be a name");
            const std::string to = k == "queue" ? "queue" : "priorityClassName";
            volcano_fields_.emplace_back(to, Str(sp.second.Scalar()));
            Note(Kind::kChanged, w + " -> spec." + to, "the same setting in Volcano's Job");
          } else {
            Note(Kind::kDropped, w,
                 k == "minResources"
                     ? "Volcano derives the job's minimum resources from minAvailable and the "
                       "pods' requests"
                     : "not a field Volcano's Job has");
          }
        }
      } else if (key == "backoffLimit") {
        auto v = integer(kv.second, where);
        if (!v.ok()) return v.status();
        volcano_fields_.emplace_back("maxRetry", YAML::Node(*v));
        Note(Kind::kChanged, where + " -> spec.maxRetry",
             "Volcano's limit on restarts of the whole job");
        if (*v > 0) backoff_limit_ = *v;
      } else if (key == "ttlSecondsAfterFinished") {
        auto v = integer(kv.second, where);
        if (!v.ok()) return v.status();
        volcano_fields_.emplace_back("ttlSecondsAfterFinished", YAML::Node(*v));
        Note(Kind::kChanged, where + " -> spec.ttlSecondsAfterFinished",
             "the same setting in Volcano's Job");
      } else {
        Note(Kind::kDropped, where,
             key == "activeDeadlineSeconds" || key == "cleanPodPolicy"
                 ? "MindCluster documents it as having no effect; Volcano's Job has no such field"
                 : "not a field Volcano's Job has");
      }
    }
    return Status::Ok();
  }

  YAML::Node Metadata() {
    YAML::Node m;
    m["name"] = name_;
    if (!namespace_.empty()) m["namespace"] = namespace_;
    std::string kept;
    for (const char* field : {"labels", "annotations"}) {
      const YAML::Node src = Child(meta_, field);
      if (!src || src.IsNull() || src.size() == 0) continue;
      YAML::Node copy = YAML::Clone(src);
      MarkStrings(copy);
      m[field] = copy;
      for (const auto& kv : src) kept += (kept.empty() ? "" : ", ") + kv.first.Scalar();
    }
    if (!kept.empty())
      Note(Kind::kKept, "metadata.labels, metadata.annotations",
           kept + ": unchanged; Regroup reads MindCluster's keys with MindCluster's meaning");
    return m;
  }

  std::string JobIdExpr() const { return "$(REGROUP_NAMESPACE)/" + name_; }
  std::string ManagerAddr() const {
    return name_ + "-manager-0." + name_ + ":" + std::to_string(kManagerPort);
  }
  std::string SecretName() const {
    return options_.credential_secret.empty() ? name_ + "-regroup-credential"
                                              : options_.credential_secret;
  }

  YAML::Node CredentialVolume() const {
    YAML::Node v;
    v["name"] = kCredentialVolume;
    v["secret"]["secretName"] = SecretName();
    v["secret"]["defaultMode"] = 256;  // 0400: the credential is readable by the container only
    return v;
  }

  YAML::Node CredentialMount() const {
    YAML::Node m;
    m["name"] = kCredentialVolume;
    m["mountPath"] = kCredentialDir;
    m["readOnly"] = true;
    return m;
  }

  std::string TlsSecretName() const {
    return options_.tls_secret.empty() ? name_ + kTlsSecretSuffix : options_.tls_secret;
  }
  // Whether the manager checks the coordinator's certificate (the shipped chart serves TLS).
  bool CoordinatorTls() const {
    return !options_.coordinator.empty() && !options_.plaintext_coordinator;
  }

  YAML::Node ManagerTask() {
    YAML::Node task;
    task["name"] = "manager";
    task["replicas"] = 1;
    // No policies: the kubelet restarts the manager's process in place (OnFailure), and Volcano's
    // job controller recreates a deleted manager pod without one; a Restart* policy would count
    // each against spec.maxRetry (deploy/README.md, "Job policies").
    YAML::Node tmpl = task["template"];
    tmpl["metadata"]["labels"]["regroup.io/job"] = Str(name_);
    tmpl["metadata"]["labels"]["regroup.io/role"] = Str("manager");
    YAML::Node pod = tmpl["spec"];
    pod["restartPolicy"] = "OnFailure";
    YAML::Node c;
    c["name"] = "manager";
    c["image"] = options_.manager_image;
    c["command"].push_back(Str("regroup-manager"));  // the flags follow, once the sizes are known
    c["env"].push_back(EnvField("REGROUP_NAMESPACE", "metadata.namespace"));
    c["env"].push_back(EnvValue("REGROUP_CREDENTIAL_FILE",
                                std::string(kCredentialDir) + "/" + kCredentialKey));
    if (!options_.coordinator.empty()) {
      c["env"].push_back(EnvValue("REGROUP_COORDINATOR_ADDR", options_.coordinator));
      c["env"].push_back(EnvValue("REGROUP_COORDINATOR_CREDENTIAL_FILE",
                                  std::string(kCoordinatorDir) + "/" + kCredentialKey));
    }
    c["ports"].push_back(Port(kManagerPort));
    c["resources"]["requests"]["cpu"] = Str("1");
    c["resources"]["requests"]["memory"] = "512Mi";
    c["resources"]["limits"]["cpu"] = Str("2");
    c["resources"]["limits"]["memory"] = "1Gi";
    c["volumeMounts"].push_back(CredentialMount());
    if (!options_.coordinator.empty()) {
      YAML::Node m;
      m["name"] = kCoordinatorVolume;
      m["mountPath"] = kCoordinatorDir;
      m["readOnly"] = true;
      c["volumeMounts"].push_back(m);
    }
    if (CoordinatorTls()) {
      YAML::Node m;
      m["name"] = kTlsVolume;
      m["mountPath"] = kTlsDir;
      m["readOnly"] = true;
      c["volumeMounts"].push_back(m);
    }
    pod["containers"].push_back(c);
    pod["volumes"].push_back(CredentialVolume());
    if (!options_.coordinator.empty()) {
      YAML::Node v;
      v["name"] = kCoordinatorVolume;
      v["secret"]["secretName"] = name_ + kCoordinatorSecretSuffix;
      v["secret"]["defaultMode"] = 256;
      pod["volumes"].push_back(v);
    }
    if (CoordinatorTls()) {
      YAML::Node v;  // ca.crt only: the manager needs no key to check the coordinator
      v["name"] = kTlsVolume;
      v["secret"]["secretName"] = TlsSecretName();
      YAML::Node item;
      item["key"] = kCaKey;
      item["path"] = kCaKey;
      v["secret"]["items"].push_back(item);
      v["secret"]["defaultMode"] = 292;  // 0444
      pod["volumes"].push_back(v);
    }
    Note(Kind::kAdded, "spec.tasks[manager]",
         "one CPU-only pod running regroup-manager on port " + std::to_string(kManagerPort) +
             " (taskd-port), outside the training pods so that losing any training node, rank "
             "0's included, never takes the manager with it; Volcano restarts it if it fails");
    Note(Kind::kKept, "manager.py",
         "a MindCluster manager.py the pods' script still starts on rank 0 may stay: with "
         "REGROUP_MANAGER_ADDR naming this task's manager, regroup.api's start_taskd_manager "
         "starts no second manager of the job and returns");
    if (!options_.coordinator.empty())
      Note(Kind::kAdded, "spec.tasks[manager] env REGROUP_COORDINATOR_ADDR",
           options_.coordinator +
               ": the manager sends the job's facts to the coordinator in the Volcano scheduler, "
               "whose engine makes the scheduling decisions (--coordinator \"\" for none)");
    if (!options_.coordinator.empty())
      Note(Kind::kCheck, "spec.tasks[manager] volume " + std::string(kCoordinatorVolume),
           "the coordinator accepts this job's token there, which binds the manager to this "
           "job: once the job exists, the scheduler's regroup plugin writes the Secret " +
               name_ + kCoordinatorSecretSuffix + " (key " + kCredentialKey +
               "); without the plugin, whoever holds the cluster key writes it with `regroupctl "
               "token --job NAMESPACE/" + name_ +
               " --uid JOB_UID` (deploy/README.md, step 2); the manager waits for it");
    if (CoordinatorTls()) {
      Note(Kind::kAdded,
           "spec.tasks[manager] --coordinator-ca and volume " + std::string(kTlsVolume),
           "the coordinator serves TLS (the chart's regroup-coordinator-tls): the manager checks "
           "its certificate against " + std::string(kTlsDir) + "/" + kCaKey + ", from the Secret " +
               TlsSecretName() + " (key " + kCaKey + " only)");
      Note(Kind::kCheck, "Secret " + TlsSecretName(),
           "it must hold " + std::string(kCaKey) +
               ", the CA that signed the coordinator's certificate: deploy/examples/tls.yaml has "
               "cert-manager write it (deploy/README.md, \"TLS\"); --tls-secret names another "
               "Secret, --plaintext-coordinator drops the check for a coordinator without TLS");
    }
    Note(Kind::kCheck, "spec.tasks[manager].template.spec.containers[0].image",
         options_.manager_image + " must hold regroup-manager (--manager-image to change it)");
    return task;
  }

  void FillManagerCommand(YAML::Node manager, const JobSpec& spec) {
    YAML::Node command = manager["template"]["spec"]["containers"][0]["command"];
    auto add = [&](const std::string& flag, const std::string& value) {
      command.push_back(Str(flag));
      command.push_back(Str(value));
    };
    add("--job-id", JobIdExpr());
    add("--nodes", std::to_string(spec.pods));
    add("--nproc-per-node", std::to_string(spec.processes_per_pod));
    add("--listen", "0.0.0.0:" + std::to_string(kManagerPort));
    if (CoordinatorTls()) add("--coordinator-ca", std::string(kTlsDir) + "/" + kCaKey);
    // The job's keys, as the manager's flags: it reads them from its command line.
    for (const auto& [key, value] : spec.labels)
      if (const KeySpec* k = FindKey(key); k && k->source == KeySource::kLabel)
        add("--label", key + "=" + value);
    for (const auto& [key, value] : spec.annotations) {
      const KeySpec* k = FindKey(key);
      if ((k && k->source == KeySource::kAnnotation) || key.starts_with(kRegroupKeyPrefix))
        add("--annotation", key + "=" + value);
    }
    for (const auto& [key, value] : spec.env)
      if (const KeySpec* k = FindKey(key); k && k->source == KeySource::kEnv)
        add("--env", key + "=" + value);
    if (options_.coordinator.empty()) {
      // Standalone, nothing but a durable record fences a second manager of the job, and the
      // converter knows no storage that every manager pod reaches: it says so and asks.
      command.push_back(Str("--no-record"));
      Note(Kind::kCheck, "spec.tasks[manager].template.spec.containers[0].command --no-record",
           "without a coordinator nothing fences a second manager of the job (a rescheduled "
           "manager pod beside one cut off): mount storage every manager pod of the job reaches "
           "(e.g. the checkpoint volume) and replace --no-record with --record "
           "<that volume>/regroup-record.json");
    }
  }

  Status TrainingTasks(YAML::Node tasks) {
    // Master and Worker with the same pod template are one task: under Regroup rank 0's pod is
    // not special (the manager assigns node ranks, and rank 0 moves after a fault).
    const bool merge = replicas_.size() == 2 &&
                       YAML::Dump(replicas_[0].pod_template) ==
                           YAML::Dump(replicas_[1].pod_template) &&
                       replicas_[0].restart_policy == replicas_[1].restart_policy;
    if (merge) {
      replicas_[1].replicas += replicas_[0].replicas;
      replicas_.erase(replicas_.begin());
      Note(Kind::kChanged,
           "spec.replicaSpecs.Master, spec.replicaSpecs.Worker -> spec.tasks[worker]",
           "one task of " + Pods(replicas_[0].replicas) +
               ": their pod templates are the same, and under Regroup rank 0's pod is not "
               "special (the manager assigns node ranks)");
    }
    int64_t total = 0;
    for (const auto& r : replicas_) total += r.replicas;
    bool noted_job_label = false;
    for (size_t i = 0; i < replicas_.size(); ++i) {
      ReplicaSpec& r = replicas_[i];
      const std::string task_name = merge || r.type == "Worker" ? "worker" : "master";
      const std::string at = "spec.tasks[" + task_name + "]";
      if (!merge)
        Note(Kind::kChanged, "spec.replicaSpecs." + r.type + " -> " + at,
             Pods(r.replicas));
      YAML::Node task;
      task["name"] = task_name;
      task["replicas"] = r.replicas;
      if (i + 1 == replicas_.size()) {
        YAML::Node policy;
        policy["event"] = "TaskCompleted";
        policy["action"] = "CompleteJob";
        task["policies"].push_back(policy);
        Note(Kind::kAdded, at + ".policies",
             "TaskCompleted -> CompleteJob: the job is complete when its training pods are (the "
             "manager pod never completes by itself)");
      }
      YAML::Node tmpl = r.pod_template;
      YAML::Node labels = MapField(MapField(tmpl, "metadata"), "labels");
      if (Child(labels, "job-name").IsNull()) {
        labels["job-name"] = Str(name_);
        if (!noted_job_label)
          Note(Kind::kAdded, at + ".template.metadata.labels.job-name",
               "MindCluster's operator labels every pod job-name=" + name_ +
                   " and pod affinity rules select on it; Volcano does not");
        noted_job_label = true;
      }
      labels["regroup.io/job"] = Str(name_);
      labels["regroup.io/role"] = Str("trainer");
      YAML::Node pod = MapField(tmpl, "spec");
      if (Child(pod, "restartPolicy").IsNull()) {
        std::string policy = r.restart_policy.empty() ? "Never" : r.restart_policy;
        if (policy == "ExitCode") {
          policy = "Never";
          Note(Kind::kChanged, at + ".template.spec.restartPolicy",
               "ExitCode -> Never: ExitCode is the Ascend operator's (restart on a retryable exit "
               "code); under Regroup the manager decides restarts");
        } else if (r.restart_policy.empty()) {
          Note(Kind::kAdded, at + ".template.spec.restartPolicy",
               "Never, the Ascend operator's default (a pod's own default is Always)");
        } else {
          Note(Kind::kChanged,
               "spec.replicaSpecs." + r.type + ".restartPolicy -> " + at +
                   ".template.spec.restartPolicy",
               policy + ": a Volcano task sets it in the pod template");
        }
        pod["restartPolicy"] = policy;
      }
      YAML::Node container = pod["containers"][0];
      TrainerContainer(container, at + ".template.spec.containers[0]", total);
      YAML::Node volumes = ListField(pod, "volumes");
      if (!HasNamed(volumes, kCredentialVolume)) volumes.push_back(CredentialVolume());
      task["template"] = tmpl;
      tasks.push_back(task);
    }
    return Status::Ok();
  }

  void TrainerContainer(YAML::Node c, const std::string& at, int64_t pods) {
    const CommandRewrite rewrite = RewriteCommand(c);
    if (!first_trainer_) {
      first_trainer_ = c;
      first_trainer_gives_nproc_ = rewrite.gives_nproc;
    }
    switch (rewrite.launcher) {
      case Launcher::kExec:
      case Launcher::kShell:
        Note(Kind::kChanged, at + ".command",
             "torchrun -> regroup-agent, rewritten in the command (was: " + rewrite.before +
                 "): the agent takes torchrun's flags, is the parent of the pod's trainers and "
                 "connects them to the job's manager");
        break;
      case Launcher::kNone:
        if (!commands_noted_)
          Note(Kind::kCheck, at + ".command",
               (rewrite.before.empty() ? std::string("the image's entrypoint")
                                       : "\"" + rewrite.before + "\"") +
                   " does not start torchrun itself: REGROUP_TORCHRUN=on is set, so the "
                   "torchrun a script of the image runs hands over to regroup-agent with the "
                   "same flags where the image ran `python3 -m regroup.torchrun install` (a "
                   "hook in torch's run.py) or `python3 -m regroup.torchrun shim DIR` (a "
                   "torchrun ahead on PATH); in an image with neither, call regroup-agent "
                   "instead of torchrun");
        break;
      case Launcher::kAlreadyAgent:
        break;
    }
    if (rewrite.uses_launch && !commands_noted_)
      Note(Kind::kCheck, at + ".command",
           "torch.distributed.launch is left as it is: replace it by regroup-agent (trainers read "
           "LOCAL_RANK from the environment, as with --use-env)");
    if (rewrite.uses_operator_env && !commands_noted_)
      Note(Kind::kCheck, at + ".command",
           "it uses MASTER_ADDR, MASTER_PORT, NODE_RANK or WORLD_SIZE, which MindCluster's "
           "operator set and a Volcano Job does not: regroup-agent gives the trainers torchrun's "
           "variables itself, so drop --master-addr, --master-port and --node-rank from its flags");
    commands_noted_ = true;

    YAML::Node env = ListField(c, "env");
    std::vector<std::string> added;
    auto add = [&](YAML::Node e) -> std::optional<YAML::Node> {
      const std::string n = e["name"].Scalar();
      if (HasNamed(env, n)) return std::nullopt;
      env.push_back(e);
      added.push_back(n);
      return env[env.size() - 1];
    };
    add(EnvField("REGROUP_NAMESPACE", "metadata.namespace"));
    add(EnvValue("REGROUP_JOB_ID", JobIdExpr()));
    add(EnvValue("REGROUP_MANAGER_ADDR", ManagerAddr()));
    add(EnvField("REGROUP_POD_UID", "metadata.uid"));
    add(EnvField("REGROUP_POD_NAME", "metadata.name"));
    add(EnvField("REGROUP_NODE_NAME", "spec.nodeName"));
    add(EnvField("REGROUP_HOST", "status.podIP"));
    add(EnvValue("REGROUP_CREDENTIAL_FILE", std::string(kCredentialDir) + "/" + kCredentialKey));
    add(EnvValue("PET_NNODES", std::to_string(pods)));
    if (auto e = add(EnvValue("PET_NPROC_PER_NODE", "1"))) trainer_nproc_env_.push_back(*e);
    if (rewrite.launcher == Launcher::kNone) add(EnvValue("REGROUP_TORCHRUN", "on"));
    for (YAML::Node e : env)
      if (!Child(e, "value").IsNull()) MarkStrings(e["value"]);
    if (!added.empty() && !env_noted_) {
      std::string list;
      for (const auto& a : added) list += (list.empty() ? "" : ", ") + a;
      Note(Kind::kAdded, at + ".env",
           list + ": how regroup-agent finds the job's manager and credential and names its pod "
                  "(the pod's uid fences a replaced pod); PET_* are torchrun's defaults for "
                  "--nnodes and --nproc-per-node");
      env_noted_ = true;
    }
    for (const auto& e : env)
      if (Scalar(Child(Child(Child(e, "valueFrom"), "fieldRef"), "fieldPath"))
                  .find("huawei.com/Ascend") != std::string::npos &&
          !ascend_env_noted_) {
        Note(Kind::kCheck, at + ".env." + Scalar(Child(e, "name")),
             "it reads a pod annotation that MindCluster's Ascend Volcano plugin writes: keep that "
             "plugin enabled beside regroup, or remove the variable");
        ascend_env_noted_ = true;
      }

    YAML::Node ports = ListField(c, "ports");
    bool has_port = false;
    for (const auto& p : ports)
      if (Scalar(Child(p, "name")) == "taskd-port" ||
          Scalar(Child(p, "containerPort")) == std::to_string(kManagerPort))
        has_port = true;
    if (!has_port) {
      ports.push_back(Port(kManagerPort));
      if (!port_noted_)
        Note(Kind::kAdded, at + ".ports",
             "9601 named taskd-port, as MindCluster's process-level recovery examples have (a "
             "MindCluster-style manager in the rank-0 pod listens there)");
      port_noted_ = true;
    }
    YAML::Node mounts = ListField(c, "volumeMounts");
    if (!HasNamed(mounts, kCredentialVolume)) mounts.push_back(CredentialMount());
    if (!credential_noted_) {
      Note(Kind::kAdded, "volumes and volumeMounts " + std::string(kCredentialVolume),
           "the job's credential, from the Secret " + SecretName() + " (key " + kCredentialKey +
               ", mounted read-only at " + kCredentialDir + "): every call between the agents "
               "and the manager carries it");
      Note(Kind::kCheck, "Secret " + SecretName(),
           "create it before the job: kubectl create secret generic " + SecretName() +
               (namespace_.empty() ? "" : " -n " + namespace_) + " --from-literal=" +
               kCredentialKey + "=$(openssl rand -hex 32)");
      Note(Kind::kCheck, at + ".image",
           "the trainer image must hold regroup-agent and the Python package regroup, and the "
           "training script must use regroup.Trainer instead of MindCluster's TaskD and MindIO "
           "(a Megatron-core script keeps its --enable-elastic-training and "
           "--enable-high-availability flags: regroup.megatron.activate() then rebuilds its "
           "parallel_state every generation, and its loop runs regroup.Trainer's steps)");
      credential_noted_ = true;
    }
  }

  // The job's elastic minimum when it may scale in (plugin/config.cc's, which the validator
  // checks against), else every pod. (Every pod is accepted too, as MindCluster has it: the
  // scheduler lowers it once the job runs. The elastic minimum needs no such step.)
  void SetMinAvailable(YAML::Node spec, const JobSpec& job) {
    const int64_t managers = job.volcano ? job.volcano->manager_pods : 0;
    const JobConfig c = job.Resolve().config;
    const int64_t elastic_min = ElasticMinAvailable(c, job.pods, managers);
    const bool elastic = elastic_min > 0;
    const int64_t min_available = elastic ? elastic_min : job.pods + managers;
    spec["minAvailable"] = min_available;
    std::string was = ascend_min_available_
                          ? "spec.runPolicy.schedulingPolicy.minAvailable " +
                                std::to_string(*ascend_min_available_) + " -> "
                          : "";
    Note(Kind::kChanged, was + "spec.minAvailable " + std::to_string(min_available),
         elastic ? "the job's elastic minimum (" + Pods(min_available - managers, "training pod") +
                       " for regroup.io/min-data-parallel=" +
                       std::to_string(c.min_data_parallel) + ", and the manager): a job scaled "
                       "in keeps running with fewer pods, and Volcano stops a job below "
                       "minAvailable"
                 : "every pod and the manager: without recovery by elastic-training the job "
                   "needs all its pods at once");
  }

  const ConvertOptions& options_;
  YAML::Node meta_;
  std::string name_, namespace_;
  std::vector<ReplicaSpec> replicas_;
  std::vector<std::pair<std::string, YAML::Node>> volcano_fields_;
  std::optional<int64_t> ascend_min_available_;
  std::optional<int64_t> backoff_limit_;  // spec.runPolicy.backoffLimit, when above 0
  std::optional<YAML::Node> first_trainer_;  // rank 0's container, as the validator reads it
  bool first_trainer_gives_nproc_ = false;
  std::vector<YAML::Node> trainer_nproc_env_;  // set once the processes per pod are known
  std::vector<ConvertNote> notes_;
  bool commands_noted_ = false, env_noted_ = false, ascend_env_noted_ = false,
       port_noted_ = false, credential_noted_ = false;
};

// The documents of a YAML stream, split at the lines that start with a document marker ("---"
// or "..."), which no scalar may hold. yaml-cpp's own LoadAll loops forever on some malformed
// streams (a stray "," at the top level), so each document is loaded on its own.
std::vector<std::string_view> SplitDocuments(std::string_view text) {
  std::vector<std::string_view> out;
  size_t start = 0, line = 0;
  while (line <= text.size()) {
    size_t end = text.find('\n', line);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view l = text.substr(line, end - line);
    const bool marker = (l.starts_with("---") || l.starts_with("...")) &&
                        (l.size() == 3 || l[3] == ' ' || l[3] == '\t' || l[3] == '\r');
    if (marker) {
      out.push_back(text.substr(start, line - start));
      // "--- value" starts the next document on the marker's own line.
      start = l.starts_with("---") ? line + 3 : end;
    }
    line = end + 1;
  }
  out.push_back(text.substr(start));
  return out;
}

}  // namespace

std::string_view NoteKindName(ConvertNote::Kind kind) {
  switch (kind) {
    case Kind::kChanged: return "changed";
    case Kind::kAdded: return "added";
    case Kind::kDropped: return "dropped";
    case Kind::kKept: return "kept";
    case Kind::kCheck: return "check";
  }
  return "";
}

StatusOr<ConvertResult> ConvertAscendJob(std::string_view yaml, const ConvertOptions& options) {
  REGROUP_RETURN_IF_ERROR(CheckYamlText(yaml));
  std::vector<YAML::Node> docs;
  try {
    for (std::string_view text : SplitDocuments(yaml))
      if (YAML::Node doc = YAML::Load(std::string(text)); !doc.IsNull()) docs.push_back(doc);
  } catch (const YAML::Exception& e) {
    return InvalidArgument(std::string("the input is not valid YAML: ") + e.what());
  }
  try {
    std::vector<size_t> jobs;
    for (size_t i = 0; i < docs.size(); ++i)
      if (docs[i].IsMap() && Scalar(Child(docs[i], "kind")) == "AscendJob") jobs.push_back(i);
    if (jobs.size() > 1)
      return InvalidArgument("the input holds " + std::to_string(jobs.size()) +
                             " AscendJobs; convert one at a time");
    if (jobs.empty()) {
      if (docs.empty()) return InvalidArgument("the input holds no YAML document it can read");
      if (docs.size() != 1)
        return InvalidArgument("none of the input's " + std::to_string(docs.size()) +
                               " YAML documents is an AscendJob (kind: AscendJob)");
      const YAML::Node& doc = docs[0];
      if (!doc.IsMap()) return InvalidArgument("the input is not a YAML map (an AscendJob)");
      const std::string kind = Scalar(Child(doc, "kind"));
      return InvalidArgument(
          (kind.empty() ? std::string("kind is missing") : "kind is \"" + kind + "\"") +
          "; expected a MindCluster AscendJob (kind: AscendJob, apiVersion: mindxdl.gitee.com/v1)" +
          (kind == "Job"
               ? "; a Volcano Job needs no conversion: check it with `regroupctl validate`"
               : ""));
    }
    Converter converter(options);
    auto result = converter.Run(docs[jobs[0]]);
    if (!result.ok()) return result.status();
    for (size_t i = 0; i < docs.size(); ++i) {
      if (i == jobs[0]) continue;
      auto text = Emit(docs[i]);
      if (!text.ok()) return text.status();
      result->yaml += "---\n" + *text;
      result->notes.push_back({Kind::kKept, "document " + std::to_string(i + 1),
                               "the input's other document (kind " +
                                   (Scalar(Child(docs[i], "kind")).empty()
                                        ? std::string("not set")
                                        : Scalar(Child(docs[i], "kind"))) +
                                   ") follows the job unchanged"});
    }
    return result;
  } catch (const YAML::Exception& e) {
    return InvalidArgument(std::string("the AscendJob could not be converted: ") + e.what());
  }
}

std::string FormatReport(const ConvertResult& result, std::string_view source,
                         std::string_view verb) {
  const std::string src(source);
  std::string out = src + ": " + std::string(verb) + " AscendJob " + result.spec.id +
                    " into a Volcano Job: " +
                    std::to_string(result.spec.pods) + " training pods x " +
                    std::to_string(result.spec.processes_per_pod) + " processes and a manager\n";
  for (const auto& n : result.notes) {
    std::string kind(NoteKindName(n.kind));
    kind.resize(8, ' ');
    out += "  " + kind + n.field + ": " + n.message + "\n";
  }
  for (const auto& p : result.resolved.problems)
    out += src + ": " +
           (p.severity == Problem::Severity::kError ? "error: " : "warning: ") + p.message + "\n";
  if (result.resolved.problems.empty())
    out += verb == "converted"
               ? src + ": the converted job passes `regroupctl validate`\n"
               : src + ": ok: job " + result.spec.id + ", " + std::to_string(result.spec.pods) +
                     " pods x " + std::to_string(result.spec.processes_per_pod) +
                     " processes, as `regroupctl convert` writes it\n";
  return out;
}

void AddAdoptionAdvice(const JobSpec& spec, ResolvedConfig& resolved) {
  const JobConfig& c = resolved.config;
  const bool warned = std::any_of(resolved.problems.begin(), resolved.problems.end(),
                                  [](const Problem& p) { return p.key == "fault-scheduling"; });
  const bool ladder = c.allows(Strategy::kRetry) || c.allows(Strategy::kRecoverInPlace) ||
                      c.allows(Strategy::kRecover) || c.allows(Strategy::kElasticTraining);
  if (!warned && (!c.recovery_on() || !ladder)) {
    resolved.problems.push_back(
        {Problem::Severity::kWarning, "recover-strategy",
         spec.annotations.count("recover-strategy") ? spec.annotations.at("recover-strategy") : "",
         "recovery is off for this job: a fault ends it. To recover, add the label "
         "fault-scheduling=force and the annotation recover-strategy=retry,recover-in-place,"
         "recover,elastic-training,dump,exit (`regroupctl keys` lists every key)"});
  }
  if (auto it = spec.annotations.find("wait-reschedule-timeout");
      it != spec.annotations.end() && c.recovery_on() && !c.allows(Strategy::kRecover)) {
    resolved.problems.push_back(
        {Problem::Severity::kWarning, "wait-reschedule-timeout", it->second,
         "annotation wait-reschedule-timeout=\"" + it->second +
             "\" is not used: it is how long `recover` waits for a replacement, and "
             "recover-strategy does not allow `recover`; add it to recover-strategy or drop the key"});
  }
}

}  // namespace regroup::cli
