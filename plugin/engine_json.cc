// The engine's JSON form: the scheduler's decision view, the history, a job's persisted state
// (PodGroup annotations), the engine snapshot, and the JSON events of the C ABI. The engine's
// logic is in engine.cc; this file only reads and writes it.
#include <algorithm>
#include <charconv>
#include <string>

#include <nlohmann/json.hpp>

#include "plugin/engine.h"
#include "plugin/engine_names.h"
#include "plugin/json_util.h"

namespace regroup {

using nlohmann::json;
using namespace engine_names;

// ---------------------------------------------------------------------------------------------
// Job: JSON
// ---------------------------------------------------------------------------------------------

namespace {

json DirectiveJson(const Directive& d) {
  json j = {{"id", d.id},
            {"kind", DirectiveKindName(d.kind)},
            {"at_ms", d.at_ms},
            {"strategy", d.strategy},
            {"dp", d.dp},
            {"keep_replicas", d.keep_replicas},
            {"remove_replicas", d.remove_replicas},
            {"standby_pods", d.standby_pods},
            {"restart_ranks", d.restart_ranks},
            {"microbatches", d.microbatches},
            {"committed_step", d.committed_step},
            {"reason", d.reason}};
  if (d.deadline_ms >= 0) j["deadline_ms"] = d.deadline_ms;
  return j;
}

json ManagerJson(const ManagerStatus& m) {
  return {{"epoch", m.epoch},
          {"generation", m.generation},
          {"committed_step", m.committed_step},
          {"live_ranks", m.live_ranks}};
}

json FaultJson(const PendingFault& f) {
  return {{"kind", FaultKindName(f.kind)}, {"pods", f.pods}, {"ranks", f.ranks},
          {"step", f.step},                {"at_ms", f.at_ms}, {"detail", f.detail}};
}

namespace ju = json_util;


Status ReadDirective(const json& j, const std::string& where, Directive& d) {
  if (!j.is_object()) return InvalidArgument(where + " must be an object");
  int64_t id = 0;
  std::string kind;
  REGROUP_RETURN_IF_ERROR(ju::GetInt(j, "id", where, 0, kMaxTime, id));
  d.id = static_cast<uint64_t>(id);
  REGROUP_RETURN_IF_ERROR(ju::GetString(j, "kind", where, kind));
  auto k = ParseName<DirectiveKind>(kDirectiveNames, kind);
  if (!k) return InvalidArgument(where + " field \"kind\" is not a directive: " + kind);
  d.kind = *k;
  REGROUP_RETURN_IF_ERROR(ju::GetInt(j, "at_ms", where, -kMaxTime, kMaxTime, d.at_ms));
  REGROUP_RETURN_IF_ERROR(
      ju::GetInt(j, "deadline_ms", where, -kMaxTime, kMaxTime, d.deadline_ms, false));
  REGROUP_RETURN_IF_ERROR(ju::GetString(j, "strategy", where, d.strategy, false));
  REGROUP_RETURN_IF_ERROR(ju::GetInt(j, "dp", where, 0, kMaxPods * kMaxProcessesPerPod, d.dp));
  for (auto [field, list] : {std::pair{"keep_replicas", &d.keep_replicas},
                             std::pair{"remove_replicas", &d.remove_replicas},
                             std::pair{"standby_pods", &d.standby_pods},
                             std::pair{"restart_ranks", &d.restart_ranks},
                             std::pair{"microbatches", &d.microbatches}}) {
    list->clear();
    REGROUP_RETURN_IF_ERROR(ju::GetIntList(j, field, where, 0, kMaxTime, *list));
  }
  REGROUP_RETURN_IF_ERROR(
      ju::GetInt(j, "committed_step", where, -1, kMaxTime, d.committed_step, false));
  REGROUP_RETURN_IF_ERROR(ju::GetString(j, "reason", where, d.reason, false));
  return Status::Ok();
}

Status ReadManager(const json& j, const std::string& where, ManagerStatus& m) {
  if (!j.is_object()) return InvalidArgument(where + " must be an object");
  REGROUP_RETURN_IF_ERROR(ju::GetInt(j, "epoch", where, 0, kMaxTime, m.epoch, false));
  REGROUP_RETURN_IF_ERROR(ju::GetInt(j, "generation", where, 0, kMaxTime, m.generation, false));
  REGROUP_RETURN_IF_ERROR(
      ju::GetInt(j, "committed_step", where, -1, kMaxTime, m.committed_step, false));
  REGROUP_RETURN_IF_ERROR(ju::GetInt(j, "live_ranks", where, 0, kMaxTime, m.live_ranks, false));
  return Status::Ok();
}

Status ReadFault(const json& j, const std::string& where, int64_t pods, PendingFault& f) {
  if (!j.is_object()) return InvalidArgument(where + " must be an object");
  std::string kind;
  REGROUP_RETURN_IF_ERROR(ju::GetString(j, "kind", where, kind));
  auto k = ParseFaultKind(kind);
  if (!k) return InvalidArgument(where + " field \"kind\" is not a fault kind: " + kind);
  f.kind = *k;
  REGROUP_RETURN_IF_ERROR(ju::GetIntList(j, "pods", where, 0, pods - 1, f.pods));
  REGROUP_RETURN_IF_ERROR(ju::GetIntList(j, "ranks", where, 0, kMaxTime, f.ranks));
  REGROUP_RETURN_IF_ERROR(ju::GetInt(j, "step", where, -1, kMaxTime, f.step, false));
  REGROUP_RETURN_IF_ERROR(ju::GetInt(j, "at_ms", where, -kMaxTime, kMaxTime, f.at_ms, false));
  REGROUP_RETURN_IF_ERROR(ju::GetString(j, "detail", where, f.detail, false));
  return Status::Ok();
}

Status ReadFaults(const json& j, std::string_view field, int64_t pods,
                  std::vector<PendingFault>& out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_array() || it->size() > 100000)
    return InvalidArgument("job state field \"" + std::string(field) + "\" must be an array");
  for (size_t i = 0; i < it->size(); ++i) {
    PendingFault f;
    REGROUP_RETURN_IF_ERROR(ReadFault((*it)[i], "job state " + std::string(field) + "[" +
                                                    std::to_string(i) + "]",
                                      pods, f));
    out.push_back(std::move(f));
  }
  return Status::Ok();
}

}  // namespace

json Job::DecisionJson() const {
  json evictions = json::array();
  for (const auto& e : Evictions())
    evictions.push_back({{"pod", e.pod}, {"uid", e.uid}, {"node", e.node},
                         {"mode", e.force ? "force" : "grace"}});
  json avoid = json::array();
  for (const auto& [node, until] : avoid_) avoid.push_back({{"node", node}, {"until_ms", until}});
  return {{"job", spec_.id},
          {"phase", PhaseName(phase_)},
          {"dp", dp_},
          {"original_dp", original_dp()},
          {"directive", DirectiveJson(directive_)},
          {"scheduler",
           {{"evict", evictions},
            {"avoid_nodes", avoid},
            {"gang_min", GangMin()},
            {"wants_pods", WantsPods()}}}};
}

json Job::HistoryJson() const {
  json out = json::array();
  for (const auto& h : history_) {
    json entry = DirectiveJson(h.directive);
    entry["phase"] = PhaseName(h.phase);
    out.push_back(std::move(entry));
  }
  return out;
}

json Job::StateJson() const {
  json slots = json::array();
  for (const auto& s : slots_) {
    slots.push_back({{"status", NameOf(kSlotStatusNames, static_cast<int>(s.status))},
                     {"uid", s.uid},
                     {"lost_uid", s.lost_uid},
                     {"node", s.node},
                     {"previous_node", s.previous_node},
                     {"phase", PodPhaseName(s.phase)},
                     {"replacement_seen", s.replacement_seen},
                     {"lost_reason", s.lost_reason}});
  }
  json pending = json::array(), held = json::array();
  for (const auto& f : pending_) pending.push_back(FaultJson(f));
  for (const auto& f : held_) held.push_back(FaultJson(f));
  json failures = json::object();
  for (const auto& [step, kinds] : step_failures_) failures[std::to_string(step)] = kinds;
  return {{"version", 1},
          {"job", spec_.id},
          {"uid", spec_.uid},
          {"phase", PhaseName(phase_)},
          {"directive", DirectiveJson(directive_)},
          {"next_directive_id", next_directive_id_},
          {"dp", dp_},
          {"generation_replicas", generation_replicas_},
          {"slots", slots},
          {"pending", pending},
          {"window_start_ms", window_start_ms_},
          {"held", held},
          {"held_since_ms", held_since_ms_},
          {"avoid", avoid_},
          {"recoveries_ms", recoveries_ms_},
          {"step_failures", failures},
          {"job_restarts", job_restarts_},
          {"manager", ManagerJson(manager_)},
          {"manager_at_directive", ManagerJson(manager_at_directive_)}};
}

Status Job::LoadState(const json& j) {
  const std::string where = "job state";
  if (!j.is_object()) return InvalidArgument("the job state must be a JSON object");
  int64_t version = 0;
  REGROUP_RETURN_IF_ERROR(ju::GetInt(j, "version", where, 0, 1000, version));
  if (version != 1)
    return {REGROUP_VERSION_MISMATCH,
            "job state version " + std::to_string(version) + " is not supported (this library "
                                                              "reads version 1)"};
  std::string id, uid, phase;
  REGROUP_RETURN_IF_ERROR(ju::GetString(j, "job", where, id));
  REGROUP_RETURN_IF_ERROR(ju::GetString(j, "uid", where, uid, false));
  if (id != spec_.id || uid != spec_.uid)
    return FailedPrecondition("the job state is of job " + id + " (uid " + uid + "), not of " +
                              spec_.id + " (uid " + spec_.uid + ")");

  Job next(spec_, config_);
  next.history_limit_ = history_limit_;
  next.history_ = history_;
  REGROUP_RETURN_IF_ERROR(ju::GetString(j, "phase", where, phase));
  auto p = ParseName<Phase>(kPhaseNames, phase);
  if (!p) return InvalidArgument("job state field \"phase\" is not a phase: " + phase);
  next.phase_ = *p;
  if (auto it = j.find("directive"); it != j.end())
    REGROUP_RETURN_IF_ERROR(ReadDirective(*it, "job state directive", next.directive_));
  int64_t next_id = 1;
  REGROUP_RETURN_IF_ERROR(ju::GetInt(j, "next_directive_id", where, 1, kMaxTime, next_id));
  next.next_directive_id_ = static_cast<uint64_t>(next_id);
  REGROUP_RETURN_IF_ERROR(ju::GetInt(j, "dp", where, 0, layout_.replicas(), next.dp_));
  next.generation_replicas_.clear();
  REGROUP_RETURN_IF_ERROR(ju::GetIntList(j, "generation_replicas", where, 0,
                                         layout_.replicas() - 1, next.generation_replicas_));
  if (static_cast<int64_t>(next.generation_replicas_.size()) != next.dp_)
    return InvalidArgument("job state: " + std::to_string(next.generation_replicas_.size()) +
                           " generation replicas for dp " + std::to_string(next.dp_));

  auto slots = j.find("slots");
  if (slots == j.end() || !slots->is_array() ||
      slots->size() != static_cast<size_t>(spec_.pods))
    return InvalidArgument("job state field \"slots\" must be an array of " +
                           std::to_string(spec_.pods) + " pods");
  for (size_t i = 0; i < slots->size(); ++i) {
    const json& s = (*slots)[i];
    const std::string sw = "job state slots[" + std::to_string(i) + "]";
    if (!s.is_object()) return InvalidArgument(sw + " must be an object");
    PodSlot& slot = next.slots_[i];
    std::string status, pod_phase;
    REGROUP_RETURN_IF_ERROR(ju::GetString(s, "status", sw, status));
    auto st = ParseName<PodSlot::Status>(kSlotStatusNames, status);
    if (!st) return InvalidArgument(sw + " field \"status\" is not a pod status: " + status);
    slot.status = *st;
    REGROUP_RETURN_IF_ERROR(ju::GetString(s, "uid", sw, slot.uid, false));
    REGROUP_RETURN_IF_ERROR(ju::GetString(s, "lost_uid", sw, slot.lost_uid, false));
    REGROUP_RETURN_IF_ERROR(ju::GetString(s, "node", sw, slot.node, false));
    REGROUP_RETURN_IF_ERROR(ju::GetString(s, "previous_node", sw, slot.previous_node, false));
    REGROUP_RETURN_IF_ERROR(ju::GetString(s, "phase", sw, pod_phase));
    auto pp = ParseName<PodPhase>(kPodPhaseNames, pod_phase);
    if (!pp) return InvalidArgument(sw + " field \"phase\" is not a pod phase: " + pod_phase);
    slot.phase = *pp;
    if (auto it = s.find("replacement_seen"); it != s.end()) {
      if (!it->is_boolean()) return InvalidArgument(sw + " field \"replacement_seen\" must be a bool");
      slot.replacement_seen = it->get<bool>();
    }
    REGROUP_RETURN_IF_ERROR(ju::GetString(s, "lost_reason", sw, slot.lost_reason, false));
  }
  REGROUP_RETURN_IF_ERROR(ReadFaults(j, "pending", spec_.pods, next.pending_));
  REGROUP_RETURN_IF_ERROR(ReadFaults(j, "held", spec_.pods, next.held_));
  REGROUP_RETURN_IF_ERROR(
      ju::GetInt(j, "window_start_ms", where, -kMaxTime, kMaxTime, next.window_start_ms_, false));
  REGROUP_RETURN_IF_ERROR(
      ju::GetInt(j, "held_since_ms", where, -kMaxTime, kMaxTime, next.held_since_ms_, false));
  if (auto it = j.find("avoid"); it != j.end() && !it->is_null()) {
    if (!it->is_object() || it->size() > 100000)
      return InvalidArgument("job state field \"avoid\" must be an object of node -> time");
    for (const auto& [node, until] : it->items()) {
      if (!until.is_number_integer())
        return InvalidArgument("job state avoid[\"" + node + "\"] must be an integer time");
      next.avoid_[node] = until.get<int64_t>();
    }
  }
  REGROUP_RETURN_IF_ERROR(
      ju::GetIntList(j, "recoveries_ms", where, -kMaxTime, kMaxTime, next.recoveries_ms_));
  if (auto it = j.find("step_failures"); it != j.end() && !it->is_null()) {
    if (!it->is_object() || it->size() > 100000)
      return InvalidArgument("job state field \"step_failures\" must be an object");
    for (const auto& [step, kinds] : it->items()) {
      int64_t s = 0;
      auto [ptr, ec] = std::from_chars(step.data(), step.data() + step.size(), s);
      if (ec != std::errc() || ptr != step.data() + step.size() || !kinds.is_object())
        return InvalidArgument("job state step_failures entry \"" + step + "\" is malformed");
      for (const auto& [kind, count] : kinds.items()) {
        if (!ParseFaultKind(kind) || !count.is_number_integer())
          return InvalidArgument("job state step_failures[" + step + "] entry \"" + kind +
                                 "\" is malformed");
        next.step_failures_[s][kind] = count.get<int64_t>();
      }
    }
  }
  REGROUP_RETURN_IF_ERROR(
      ju::GetInt(j, "job_restarts", where, 0, kMaxTime, next.job_restarts_, false));
  if (auto it = j.find("manager"); it != j.end())
    REGROUP_RETURN_IF_ERROR(ReadManager(*it, "job state manager", next.manager_));
  if (auto it = j.find("manager_at_directive"); it != j.end())
    REGROUP_RETURN_IF_ERROR(
        ReadManager(*it, "job state manager_at_directive", next.manager_at_directive_));
  *this = std::move(next);
  return Status::Ok();
}

Status Engine::ApplyEvent(const json& e, int64_t now, const std::string& where) {
  if (!e.is_object()) return InvalidArgument(where + " must be a JSON object");
  std::string type;
  REGROUP_RETURN_IF_ERROR(ju::GetString(e, "type", where, type));
  if (type == "node") {
    std::string node, health, reason;
    REGROUP_RETURN_IF_ERROR(ju::GetString(e, "node", where, node));
    REGROUP_RETURN_IF_ERROR(ju::GetString(e, "health", where, health));
    REGROUP_RETURN_IF_ERROR(ju::GetString(e, "reason", where, reason, false));
    auto h = ParseName<NodeHealth>(kHealthNames, health);
    if (!h) return InvalidArgument(where + ": health \"" + health +
                                   "\" is not healthy, faulty or unknown");
    return SetNodeHealth(node, *h, reason, now);
  }
  std::string job_id;
  REGROUP_RETURN_IF_ERROR(ju::GetString(e, "job", where, job_id));
  auto found = JobFor(job_id, where + ": ");
  if (!found.ok()) return found.status();
  Job* job = *found;
  if (type == "pod") {
    std::string uid, phase, node;
    int64_t index = 0;
    REGROUP_RETURN_IF_ERROR(ju::GetInt(e, "index", where, 0, kMaxPods - 1, index));
    REGROUP_RETURN_IF_ERROR(ju::GetString(e, "uid", where, uid));
    REGROUP_RETURN_IF_ERROR(ju::GetString(e, "phase", where, phase));
    REGROUP_RETURN_IF_ERROR(ju::GetString(e, "node", where, node, false));
    auto p = ParseName<PodPhase>(kPodPhaseNames, phase);
    if (!p) return InvalidArgument(where + ": pod phase \"" + phase +
                                   "\" is not pending, bound, running, failed or deleted");
    return SetPodState(job_id, index, uid, *p, node, now);
  }
  if (type == "fault") {
    PendingFault f;
    REGROUP_RETURN_IF_ERROR(ReadFault(e, where, job->spec().pods, f));
    f.at_ms = now;
    return ReportFault(job_id, std::move(f));
  }
  if (type == "replacement_registered") {
    std::string uid;
    int64_t index = 0;
    REGROUP_RETURN_IF_ERROR(ju::GetInt(e, "index", where, 0, kMaxPods - 1, index));
    REGROUP_RETURN_IF_ERROR(ju::GetString(e, "uid", where, uid));
    return ReportReplacementRegistered(job_id, index, uid, now);
  }
  if (type == "manager_status") {
    ManagerStatus m;
    REGROUP_RETURN_IF_ERROR(ReadManager(e, where, m));
    return ReportManagerStatus(job_id, m);
  }
  return InvalidArgument(where + ": type \"" + type +
                         "\" is not node, pod, fault, replacement_registered or manager_status");
}

Status Engine::ApplyEvents(const json& events, int64_t now) {
  if (events.is_object()) return ApplyEvent(events, now, "the event");
  if (!events.is_array())
    return InvalidArgument("events must be a JSON object or an array of objects");
  for (size_t i = 0; i < events.size(); ++i) {
    const std::string where = "event " + std::to_string(i);
    Status st = ApplyEvent(events[i], now, where);
    if (st.ok()) continue;
    if (st.message().rfind(where, 0) == 0) return st;
    return {st.code(), where + ": " + st.message()};
  }
  return Status::Ok();
}

json Engine::Snapshot() const {
  json nodes = json::object();  // an object: its keys are sorted
  for (const auto& [name, n] : nodes_)
    nodes[name] = {{"health", NodeHealthName(n.health)}, {"reason", n.reason},
                   {"since_ms", n.since_ms}};
  std::vector<const Job*> ordered;  // by id, so a snapshot of the same state is the same text
  for (const auto& [id, job] : jobs_) ordered.push_back(job.get());
  std::sort(ordered.begin(), ordered.end(),
            [](const Job* a, const Job* b) { return a->spec().id < b->spec().id; });
  json jobs = json::array();
  for (const Job* job : ordered)
    jobs.push_back({{"spec", JobSpecToJson(job->spec())},
                    {"state", job->StateJson()},
                    {"history", job->HistoryJson()}});
  return {{"version", 1}, {"nodes", nodes}, {"jobs", jobs}};
}

Status Engine::Restore(const json& s) {
  if (!s.is_object()) return InvalidArgument("the snapshot must be a JSON object");
  int64_t version = 0;
  REGROUP_RETURN_IF_ERROR(ju::GetInt(s, "version", "snapshot", 0, 1000, version));
  if (version != 1)
    return {REGROUP_VERSION_MISMATCH,
            "snapshot version " + std::to_string(version) + " is not supported (this library "
                                                             "reads version 1)"};
  Engine next(options_);
  if (auto it = s.find("nodes"); it != s.end() && !it->is_null()) {
    if (!it->is_object()) return InvalidArgument("snapshot field \"nodes\" must be an object");
    for (const auto& [name, n] : it->items()) {
      const std::string where = "snapshot node " + name;
      std::string health, reason;
      int64_t since = 0;
      if (!n.is_object()) return InvalidArgument(where + " must be an object");
      REGROUP_RETURN_IF_ERROR(ju::GetString(n, "health", where, health));
      REGROUP_RETURN_IF_ERROR(ju::GetString(n, "reason", where, reason, false));
      REGROUP_RETURN_IF_ERROR(ju::GetInt(n, "since_ms", where, -kMaxTime, kMaxTime, since, false));
      auto h = ParseName<NodeHealth>(kHealthNames, health);
      if (!h || name.empty()) return InvalidArgument(where + " has a bad name or health");
      next.nodes_[name] = {*h, reason, since};
      if (*h != REGROUP_NODE_HEALTHY) next.unhealthy_.insert(name);
    }
  }
  auto jobs = s.find("jobs");
  if (jobs != s.end() && !jobs->is_null()) {
    if (!jobs->is_array()) return InvalidArgument("snapshot field \"jobs\" must be an array");
    for (size_t i = 0; i < jobs->size(); ++i) {
      const json& entry = (*jobs)[i];
      const std::string where = "snapshot jobs[" + std::to_string(i) + "]";
      if (!entry.is_object() || !entry.contains("spec") || !entry.contains("state"))
        return InvalidArgument(where + " must hold \"spec\" and \"state\"");
      auto spec = ParseJobSpec(entry["spec"]);
      if (!spec.ok()) return InvalidArgument(where + ": " + spec.status().message());
      const std::string id = spec->id;
      Status st = next.UpsertJob(std::move(*spec), nullptr, 0);
      if (!st.ok()) return {st.code(), where + ": " + st.message()};
      Job* job = next.FindJob(id);
      st = job->LoadState(entry["state"]);
      if (!st.ok()) return {st.code(), where + ": " + st.message()};
      if (auto h = entry.find("history"); h != entry.end() && h->is_array()) {
        for (size_t k = 0; k < h->size() && k < options_.history_length; ++k) {
          Directive d;
          REGROUP_RETURN_IF_ERROR(
              ReadDirective((*h)[k], where + " history[" + std::to_string(k) + "]", d));
          std::string phase;
          REGROUP_RETURN_IF_ERROR(ju::GetString((*h)[k], "phase", where + " history", phase));
          auto p = ParseName<Phase>(kPhaseNames, phase);
          if (!p) return InvalidArgument(where + " history has a bad phase: " + phase);
          job->history_.push_back({d.at_ms, *p, std::move(d)});
        }
      }
    }
  }
  jobs_ = std::move(next.jobs_);
  nodes_ = std::move(next.nodes_);
  unhealthy_ = next.unhealthy_;
  return Status::Ok();
}

}  // namespace regroup
