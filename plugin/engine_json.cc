// SPDX-License-Identifier: Apache-2.0
// The engine's JSON form: the scheduler's decision view, the history, a job's persisted state
// (PodGroup annotations), the engine snapshot, and the JSON events of the C ABI. The engine's
// logic is in engine.cc; this file only reads and writes it.
#include <algorithm>
#include <charconv>
#include <string>

#include <nlohmann/json.hpp>

#include "plugin/engine.h"
#include "plugin/engine_names.h"
#include "common/text.h"
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

json ManagerJson(const ManagerProgress& m) {
  return {{"epoch", m.epoch},
          {"generation", m.generation},
          {"committed_step", m.committed_step},
          {"live_ranks", m.live_ranks}};
}

namespace ju = json_util;

// A job's persisted state must fit a PodGroup annotation (Kubernetes refuses more than 256 KiB
// of annotations in all) during a mass failure too, when it matters most. So the state keeps
// counts, short codes and compact per-pod records, and its free text is bounded: the
// directive's reason and the fault details together hold at most these many bytes. What a
// decision needs (phase, deadlines, directive ids, which pods are lost, the incarnations fenced)
// is kept whole. Version 2; version 1 (one object per pod, whole texts) is still read.
constexpr int64_t kStateVersion = 2;
constexpr size_t kStateReasonBytes = 512;
constexpr size_t kStateDetailBytes = 1024;  // all the faults' details together
constexpr size_t kStateDetailEach = 256;
constexpr size_t kStateDetailLeast = 32;  // below this, a detail is left out
// The most items one ranges text may stand for, as a JSON list may hold (json_util), and all the
// faults' texts together: a short text can stand for many items, so their memory is bounded.
constexpr int64_t kMaxRangeItems = 100000;
constexpr int64_t kMaxFaultItems = 1000000;
constexpr int64_t kMaxStateNodes = 100000;
constexpr size_t kMaxNodeName = 512;  // as SetNodeHealth accepts

// Sorted indexes as text: ascending runs as "first-last", the rest one by one, in their order
// ("0-3,7,5"). Any list reads back as itself.
std::string RangesText(const std::vector<int64_t>& items) {
  std::string out;
  for (size_t i = 0; i < items.size();) {
    size_t last = i;
    while (last + 1 < items.size() && items[last + 1] == items[last] + 1) ++last;
    if (!out.empty()) out += ',';
    out += std::to_string(items[i]);
    if (last > i) out += '-' + std::to_string(items[last]);
    i = last + 1;
  }
  return out;
}

Status ReadRanges(const json& obj, std::string_view field, const std::string& where, int64_t min,
                  int64_t max, std::vector<int64_t>& out, int64_t& budget) {
  out.clear();
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) return Status::Ok();
  const std::string what = where + " field \"" + std::string(field) + "\"";
  if (!it->is_string())
    return InvalidArgument(what + " must be a string of indexes and ranges, like \"0-3,7\"");
  const std::string& text = it->get_ref<const std::string&>();
  size_t i = 0;
  auto number = [&](int64_t& v) {
    const size_t from = i;
    v = 0;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9' && i - from < 18)
      v = v * 10 + (text[i++] - '0');
    return i > from && (i == text.size() || text[i] == ',' || text[i] == '-');
  };
  while (i < text.size()) {
    const size_t at = i;
    int64_t first = 0, last = 0;
    bool ok = number(first);
    last = first;
    if (ok && i < text.size() && text[i] == '-') {
      ++i;
      ok = number(last) && (i == text.size() || text[i] == ',');
    }
    if (!ok)
      return InvalidArgument(what + " is not indexes and ranges like \"0-3,7\" at character " +
                             std::to_string(at) + ": \"" + text.substr(at, 24) + "\"");
    if (last < first)
      return InvalidArgument(what + " holds the range " + std::to_string(first) + "-" +
                             std::to_string(last) + ", which runs backwards");
    if (first < min || last > max)
      return InvalidArgument(what + " holds " + std::to_string(first < min ? first : last) +
                             "; items must be from " + std::to_string(min) + " to " +
                             std::to_string(max));
    if (last - first >= budget)
      return InvalidArgument(what + " stands for more items than a job state may hold");
    budget -= last - first + 1;
    for (int64_t v = first; v <= last; ++v) out.push_back(v);
    if (i < text.size() && ++i == text.size())
      return InvalidArgument(what + " ends with a comma");
  }
  return Status::Ok();
}

Status ReadRanges(const json& obj, std::string_view field, const std::string& where, int64_t min,
                  int64_t max, std::vector<int64_t>& out) {
  int64_t budget = kMaxRangeItems;
  return ReadRanges(obj, field, where, min, max, out, budget);
}

Status ReadDirective(const json& j, const std::string& where, bool ranges, Directive& d) {
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
                             std::pair{"restart_ranks", &d.restart_ranks}}) {
    list->clear();
    if (ranges)
      REGROUP_RETURN_IF_ERROR(ReadRanges(j, field, where, 0, kMaxTime, *list));
    else
      REGROUP_RETURN_IF_ERROR(ju::GetIntList(j, field, where, 0, kMaxTime, *list));
  }
  d.microbatches.clear();
  REGROUP_RETURN_IF_ERROR(ju::GetIntList(j, "microbatches", where, 0, kMaxTime, d.microbatches));
  REGROUP_RETURN_IF_ERROR(
      ju::GetInt(j, "committed_step", where, -1, kMaxTime, d.committed_step, false));
  REGROUP_RETURN_IF_ERROR(ju::GetString(j, "reason", where, d.reason, false));
  return Status::Ok();
}

Status ReadManager(const json& j, const std::string& where, ManagerProgress& m) {
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

Status ReadFaultsV1(const json& j, std::string_view field, int64_t pods,
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

// Faults in groups of the same kind, step and time (a node's or a mass failure's reports share
// them), each fault as [pods, ranks, detail] with what is empty at the end left off.
json FaultGroupsJson(const std::vector<PendingFault>& faults, size_t& detail_budget) {
  json groups = json::array();
  const PendingFault* prev = nullptr;
  for (const auto& f : faults) {
    if (!prev || prev->kind != f.kind || prev->step != f.step || prev->at_ms != f.at_ms)
      groups.push_back({{"kind", FaultKindName(f.kind)}, {"step", f.step}, {"at_ms", f.at_ms},
                        {"faults", json::array()}});
    prev = &f;
    std::string detail;
    if (!f.detail.empty() && detail_budget >= kStateDetailLeast) {
      detail = BoundedText(f.detail, std::min(detail_budget, kStateDetailEach));
      detail_budget -= detail.size();
    }
    json entry = json::array({RangesText(f.pods)});
    if (!f.ranks.empty() || !detail.empty()) entry.push_back(RangesText(f.ranks));
    if (!detail.empty()) entry.push_back(std::move(detail));
    groups.back()["faults"].push_back(std::move(entry));
  }
  return groups;
}

Status ReadFaultGroups(const json& j, std::string_view field, int64_t pods,
                       std::vector<PendingFault>& out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return Status::Ok();
  const std::string what = "job state field \"" + std::string(field) + "\"";
  if (!it->is_array() || it->size() > 100000)
    return InvalidArgument(what + " must be an array of fault groups");
  int64_t budget = kMaxFaultItems;
  for (size_t g = 0; g < it->size(); ++g) {
    const json& group = (*it)[g];
    const std::string where = "job state " + std::string(field) + "[" + std::to_string(g) + "]";
    if (!group.is_object()) return InvalidArgument(where + " must be an object");
    PendingFault f;
    std::string kind;
    REGROUP_RETURN_IF_ERROR(ju::GetString(group, "kind", where, kind));
    auto k = ParseFaultKind(kind);
    if (!k) return InvalidArgument(where + " field \"kind\" is not a fault kind: " + kind);
    f.kind = *k;
    REGROUP_RETURN_IF_ERROR(ju::GetInt(group, "step", where, -1, kMaxTime, f.step));
    REGROUP_RETURN_IF_ERROR(ju::GetInt(group, "at_ms", where, -kMaxTime, kMaxTime, f.at_ms));
    auto list = group.find("faults");
    if (list == group.end() || !list->is_array() || list->empty() ||
        out.size() + list->size() > 100000)
      return InvalidArgument(where + " field \"faults\" must be an array of 1 to 100000 faults");
    for (size_t i = 0; i < list->size(); ++i) {
      const json& e = (*list)[i];
      const std::string ew = where + " faults[" + std::to_string(i) + "]";
      if (!e.is_array() || e.empty() || e.size() > 3)
        return InvalidArgument(ew + " must be [pods, ranks, detail] (ranks and detail optional)");
      const json fields = {{"pods", e[0]},
                           {"ranks", e.size() > 1 ? e[1] : json()},
                           {"detail", e.size() > 2 ? e[2] : json()}};
      REGROUP_RETURN_IF_ERROR(ReadRanges(fields, "pods", ew, 0, pods - 1, f.pods, budget));
      REGROUP_RETURN_IF_ERROR(ReadRanges(fields, "ranks", ew, 0, kMaxTime, f.ranks, budget));
      f.detail.clear();
      REGROUP_RETURN_IF_ERROR(ju::GetString(fields, "detail", ew, f.detail, false));
      out.push_back(f);
    }
  }
  return Status::Ok();
}

// Per-pod codes, one character a pod.
constexpr std::string_view kPodPhaseCodes = "pbrfd";  // in kPodPhaseNames' order

// A uid as one pod's part of "uids" or "lost_uids": "." for none, else its fingerprint's
// characters; `same` (for a lost uid that is what "uids" restores) is "=". "uids" keeps the
// Kubernetes pod's fingerprint (PodOfUid), which the scheduler's reports name; "lost_uids" keeps
// the lost agent's own (a readmitted incarnation of it is not the one that was lost).
std::string UidCode(const std::string& uid, const std::string* same) {
  if (uid.empty()) return ".";
  std::string fingerprint = UidFingerprint(same ? std::string_view(uid) : PodOfUid(uid));
  if (same && !same->empty() && fingerprint == UidFingerprint(PodOfUid(*same))) return "=";
  return fingerprint.substr(1);
}

Status ReadUidCodes(const json& pods, std::string_view field, std::vector<PodSlot>& slots,
                    bool lost) {
  const std::string what = "job state pods field \"" + std::string(field) + "\"";
  auto it = pods.find(field);
  if (it == pods.end() || !it->is_string())
    return InvalidArgument(what + " must be a string: per pod \".\" (none)" +
                           (lost ? ", \"=\" (the current uid)" : "") +
                           " or 8 characters of a uid's fingerprint");
  const std::string& text = it->get_ref<const std::string&>();
  const size_t width = UidFingerprint("").size() - 1;
  size_t i = 0;
  for (size_t p = 0; p < slots.size(); ++p) {
    const bool none = i < text.size() && (text[i] == '.' || (lost && text[i] == '='));
    if (i >= text.size() || (!none && text.size() - i < width))
      return InvalidArgument(what + " ends at pod " + std::to_string(p) + " of " +
                             std::to_string(slots.size()));
    std::string& uid = lost ? slots[p].lost_uid : slots[p].uid;
    if (none) {
      uid = text[i] == '.' ? "" : slots[p].uid;
      ++i;
      continue;
    }
    uid = "~" + text.substr(i, width);
    if (!IsUidFingerprint(uid))
      return InvalidArgument(what + " has no uid fingerprint for pod " + std::to_string(p) +
                             " at character " + std::to_string(i));
    i += width;
  }
  if (i != text.size())
    return InvalidArgument(what + " holds more than the job's " + std::to_string(slots.size()) +
                           " pods");
  return Status::Ok();
}

// The pods' records of state version 2: which pods are standbys and which are lost (by cause),
// their phases, incarnations (fingerprints) and previous nodes (indexes into `nodes`). A pod's
// current node is not kept: the scheduler reports every pod it sees, with its node, in its
// first session, before the engine decides anything.
json PodsJson(const std::vector<PodSlot>& slots, const std::map<std::string, size_t>& node_index) {
  std::vector<int64_t> standby, seen;
  std::map<std::string_view, std::vector<int64_t>> lost;
  std::string phases, uids, lost_uids;
  json previous = json::array();
  bool any_previous = false;
  for (size_t p = 0; p < slots.size(); ++p) {
    const PodSlot& s = slots[p];
    const auto pod = static_cast<int64_t>(p);
    if (s.status == PodSlot::Status::kStandby) standby.push_back(pod);
    if (s.status == PodSlot::Status::kLost)
      lost[NameOf(kLostCauseNames, static_cast<int>(s.lost_cause))].push_back(pod);
    if (s.replacement_seen) seen.push_back(pod);
    phases += kPodPhaseCodes[static_cast<size_t>(s.phase)];
    uids += UidCode(s.uid, nullptr);
    lost_uids += UidCode(s.lost_uid, &s.uid);
    if (s.previous_node.empty()) {
      previous.push_back(-1);
    } else {
      previous.push_back(node_index.at(s.previous_node));
      any_previous = true;
    }
  }
  json lost_json = json::object();
  for (const auto& [cause, list] : lost) lost_json[std::string(cause)] = RangesText(list);
  json out = {{"standby", RangesText(standby)}, {"lost", lost_json},
              {"replacement_seen", RangesText(seen)}, {"phases", phases},
              {"uids", uids}, {"lost_uids", lost_uids}};
  if (any_previous) out["previous_nodes"] = std::move(previous);
  return out;
}

Status ReadPods(const json& j, const std::vector<std::string>& nodes,
                std::vector<PodSlot>& slots) {
  auto it = j.find("pods");
  if (it == j.end() || !it->is_object())
    return InvalidArgument("job state field \"pods\" must be an object");
  const json& pods = *it;
  const std::string where = "job state pods";
  const auto last = static_cast<int64_t>(slots.size()) - 1;
  std::vector<int64_t> list;
  REGROUP_RETURN_IF_ERROR(ReadRanges(pods, "standby", where, 0, last, list));
  for (int64_t p : list) slots[static_cast<size_t>(p)].status = PodSlot::Status::kStandby;
  if (auto lost = pods.find("lost"); lost != pods.end() && !lost->is_null()) {
    if (!lost->is_object())
      return InvalidArgument(where + " field \"lost\" must be an object of cause -> pods");
    for (const auto& [cause, ranges] : lost->items()) {
      auto c = ParseName<LostCause>(kLostCauseNames, cause);
      if (!c || *c == LostCause::kNone)
        return InvalidArgument(where + " field \"lost\" names no cause of a loss: " + cause);
      REGROUP_RETURN_IF_ERROR(ReadRanges(*lost, cause, where + " lost", 0, last, list));
      for (int64_t p : list) {
        PodSlot& slot = slots[static_cast<size_t>(p)];
        if (slot.status != PodSlot::Status::kActive)
          return InvalidArgument(where + ": pod " + std::to_string(p) +
                                 " is listed twice among standbys and lost pods");
        slot.status = PodSlot::Status::kLost;
        slot.lost_cause = *c;
      }
    }
  }
  REGROUP_RETURN_IF_ERROR(ReadRanges(pods, "replacement_seen", where, 0, last, list));
  for (int64_t p : list) slots[static_cast<size_t>(p)].replacement_seen = true;
  std::string phases;
  REGROUP_RETURN_IF_ERROR(ju::GetString(pods, "phases", where, phases));
  if (phases.size() != slots.size())
    return InvalidArgument(where + " field \"phases\" must hold one character a pod (" +
                           std::to_string(slots.size()) + "), not " +
                           std::to_string(phases.size()));
  for (size_t p = 0; p < slots.size(); ++p) {
    const size_t code = kPodPhaseCodes.find(phases[p]);
    if (code == std::string_view::npos)
      return InvalidArgument(where + " field \"phases\" has '" + std::string(1, phases[p]) +
                             "' for pod " + std::to_string(p) + "; a phase is one of " +
                             std::string(kPodPhaseCodes));
    slots[p].phase = static_cast<PodPhase>(code);
  }
  REGROUP_RETURN_IF_ERROR(ReadUidCodes(pods, "uids", slots, false));
  REGROUP_RETURN_IF_ERROR(ReadUidCodes(pods, "lost_uids", slots, true));
  std::vector<int64_t> previous;
  REGROUP_RETURN_IF_ERROR(ju::GetIntList(pods, "previous_nodes", where, -1,
                                         static_cast<int64_t>(nodes.size()) - 1, previous));
  if (!previous.empty() && previous.size() != slots.size())
    return InvalidArgument(where + " field \"previous_nodes\" must hold one node a pod (" +
                           std::to_string(slots.size()) + "), not " +
                           std::to_string(previous.size()));
  for (size_t p = 0; p < previous.size(); ++p)
    if (previous[p] >= 0) slots[p].previous_node = nodes[static_cast<size_t>(previous[p])];
  return Status::Ok();
}

// State version 1 kept one object a pod, with the whole reason of a loss; its reasons map to
// the codes that replaced them (a fault's own detail, which version 1 kept, to pod_lost).
LostCause CauseOfReason(std::string_view reason) {
  using Named = std::pair<std::string_view, LostCause>;
  for (auto [text, cause] : {Named{"pod failed", LostCause::kPodFailed},
                             Named{"pod deleted", LostCause::kPodDeleted},
                             Named{"pod replaced by a new incarnation", LostCause::kPodReplaced},
                             Named{"job restart", LostCause::kJobRestart},
                             Named{"device_error", LostCause::kDeviceError}})
    if (reason == text) return cause;
  if (reason.rfind("node ", 0) == 0)
    return reason.find(" is unknown") != std::string_view::npos ? LostCause::kNodeUnknown
                                                                 : LostCause::kNodeFaulty;
  if (reason.rfind("process of rank ", 0) == 0) return LostCause::kProcessDied;
  return LostCause::kPodLost;
}

Status ReadSlotsV1(const json& j, std::vector<PodSlot>& slots) {
  auto it = j.find("slots");
  if (it == j.end() || !it->is_array() || it->size() != slots.size())
    return InvalidArgument("job state field \"slots\" must be an array of " +
                           std::to_string(slots.size()) + " pods");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& s = (*it)[i];
    const std::string sw = "job state slots[" + std::to_string(i) + "]";
    if (!s.is_object()) return InvalidArgument(sw + " must be an object");
    PodSlot& slot = slots[i];
    std::string status, pod_phase, reason;
    REGROUP_RETURN_IF_ERROR(ju::GetString(s, "status", sw, status));
    auto st = ParseName<PodSlot::Status>(kSlotStatusNames, status);
    if (!st) return InvalidArgument(sw + " field \"status\" is not a pod status: " + status);
    slot.status = *st;
    REGROUP_RETURN_IF_ERROR(ju::GetString(s, "uid", sw, slot.uid, false));
    REGROUP_RETURN_IF_ERROR(ju::GetString(s, "lost_uid", sw, slot.lost_uid, false));
    REGROUP_RETURN_IF_ERROR(ju::GetString(s, "node", sw, slot.node, false));
    REGROUP_RETURN_IF_ERROR(ju::GetString(s, "previous_node", sw, slot.previous_node, false));
    if (slot.previous_node.size() > kMaxNodeName)
      return InvalidArgument(sw + " field \"previous_node\" is longer than " +
                             std::to_string(kMaxNodeName) + " characters");
    REGROUP_RETURN_IF_ERROR(ju::GetString(s, "phase", sw, pod_phase));
    auto pp = ParseName<PodPhase>(kPodPhaseNames, pod_phase);
    if (!pp) return InvalidArgument(sw + " field \"phase\" is not a pod phase: " + pod_phase);
    slot.phase = *pp;
    REGROUP_RETURN_IF_ERROR(ju::GetBool(s, "replacement_seen", sw, slot.replacement_seen, false));
    REGROUP_RETURN_IF_ERROR(ju::GetString(s, "lost_reason", sw, reason, false));
    if (slot.status == PodSlot::Status::kLost) slot.lost_cause = CauseOfReason(reason);
  }
  return Status::Ok();
}

Status ReadAvoidV1(const json& j, std::map<std::string, int64_t, std::less<>>& avoid) {
  auto it = j.find("avoid");
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_object() || it->size() > 100000)
    return InvalidArgument("job state field \"avoid\" must be an object of node -> time");
  for (const auto& [node, until] : it->items()) {
    if (!until.is_number_integer() || node.empty() || node.size() > kMaxNodeName)
      return InvalidArgument("job state avoid[\"" + node.substr(0, 64) +
                             "\"] must be a node name of 1 to " + std::to_string(kMaxNodeName) +
                             " characters with an integer time");
    avoid[node] = until.get<int64_t>();
  }
  return Status::Ok();
}

// Version 2 names each node once, in "nodes"; "avoid" is [until, node indexes] by time.
Status ReadNodes(const json& j, std::vector<std::string>& nodes) {
  auto it = j.find("nodes");
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_array() || it->size() > static_cast<size_t>(kMaxStateNodes))
    return InvalidArgument("job state field \"nodes\" must be an array of at most " +
                           std::to_string(kMaxStateNodes) + " node names");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& n = (*it)[i];
    if (!n.is_string() || n.get_ref<const std::string&>().empty() ||
        n.get_ref<const std::string&>().size() > kMaxNodeName)
      return InvalidArgument("job state nodes[" + std::to_string(i) +
                             "] must be a node name of 1 to " + std::to_string(kMaxNodeName) +
                             " characters");
    nodes.push_back(n.get<std::string>());
  }
  return Status::Ok();
}

Status ReadAvoid(const json& j, const std::vector<std::string>& nodes,
                 std::map<std::string, int64_t, std::less<>>& avoid) {
  auto it = j.find("avoid");
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_array() || it->size() > static_cast<size_t>(kMaxStateNodes))
    return InvalidArgument("job state field \"avoid\" must be an array of [until_ms, nodes]");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& e = (*it)[i];
    const std::string where = "job state avoid[" + std::to_string(i) + "]";
    if (!e.is_array() || e.size() != 2)
      return InvalidArgument(where + " must be [until_ms, node indexes]");
    const json fields = {{"until_ms", e[0]}, {"nodes", e[1]}};
    int64_t until = 0;
    std::vector<int64_t> which;
    REGROUP_RETURN_IF_ERROR(ju::GetInt(fields, "until_ms", where, -kMaxTime, kMaxTime, until));
    REGROUP_RETURN_IF_ERROR(ReadRanges(fields, "nodes", where, 0,
                                       static_cast<int64_t>(nodes.size()) - 1, which));
    for (int64_t n : which) avoid[nodes[static_cast<size_t>(n)]] = until;
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
  // Every node the state names, once: previous nodes in pod order, then the avoided ones.
  std::map<std::string, size_t> node_index;
  json nodes = json::array();
  auto add_node = [&](const std::string& name) {
    if (name.empty() || !node_index.emplace(name, nodes.size()).second) return;
    nodes.push_back(name);
  };
  for (const auto& s : slots_) add_node(s.previous_node);
  std::map<int64_t, std::vector<int64_t>> avoid_by_time;
  for (const auto& [node, until] : avoid_) {
    add_node(node);
    avoid_by_time[until].push_back(static_cast<int64_t>(node_index.at(node)));
  }
  json avoid = json::array();
  for (auto& [until, which] : avoid_by_time) {
    std::sort(which.begin(), which.end());
    avoid.push_back({until, RangesText(which)});
  }
  json directive = DirectiveJson(directive_);
  for (auto [field, list] : {std::pair{"keep_replicas", &directive_.keep_replicas},
                             std::pair{"remove_replicas", &directive_.remove_replicas},
                             std::pair{"standby_pods", &directive_.standby_pods},
                             std::pair{"restart_ranks", &directive_.restart_ranks}})
    directive[field] = RangesText(*list);
  directive["reason"] = BoundedText(directive_.reason, kStateReasonBytes);
  size_t detail_budget = kStateDetailBytes;
  json pending = FaultGroupsJson(pending_, detail_budget);
  json held = FaultGroupsJson(held_, detail_budget);
  json failures = json::object();
  for (const auto& [step, kinds] : step_failures_) failures[std::to_string(step)] = kinds;
  // Ranks without state as ranks of the full layout (replica x replica size + position).
  std::vector<int64_t> stateless;
  for (const auto& [replica, position] : stateless_)
    stateless.push_back(replica * layout_.replica_ranks() + position);
  return {{"version", kStateVersion},
          {"job", spec_.id},
          {"uid", spec_.uid},
          {"phase", PhaseName(phase_)},
          {"directive", std::move(directive)},
          {"next_directive_id", next_directive_id_},
          {"dp", dp_},
          {"generation_replicas", RangesText(generation_replicas_)},
          {"pods", PodsJson(slots_, node_index)},
          {"nodes", std::move(nodes)},
          {"pending", std::move(pending)},
          {"window_start_ms", window_start_ms_},
          {"held", std::move(held)},
          {"held_since_ms", held_since_ms_},
          {"avoid", std::move(avoid)},
          {"recoveries_ms", recoveries_ms_},
          {"step_failures", failures},
          {"job_restarts", job_restarts_},
          {"business_restarts", business_restarts_},
          {"hardware_fault", hardware_fault_},
          {"stateless_ranks", RangesText(stateless)},
          {"stateless_pods", RangesText({stateless_pods_.begin(), stateless_pods_.end()})},
          {"stateless_after_step", stateless_after_step_},
          {"manager", ManagerJson(manager_)},
          {"manager_at_directive", ManagerJson(manager_at_directive_)},
          {"lease_holder", lease_holder_},
          {"facts_epoch", facts_applied_.first},
          {"facts_seq", facts_applied_.second}};
}

Status Job::LoadState(const json& j) {
  const std::string where = "job state";
  if (!j.is_object()) return InvalidArgument("the job state must be a JSON object");
  int64_t version = 0;
  REGROUP_RETURN_IF_ERROR(ju::GetInt(j, "version", where, 0, 1000, version));
  if (version != 1 && version != kStateVersion)
    return {REGROUP_VERSION_MISMATCH,
            "job state version " + std::to_string(version) +
                " is not supported (this library reads versions 1 and 2)"};
  const bool v1 = version == 1;
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
    REGROUP_RETURN_IF_ERROR(ReadDirective(*it, "job state directive", !v1, next.directive_));
  int64_t next_id = 1;
  REGROUP_RETURN_IF_ERROR(ju::GetInt(j, "next_directive_id", where, 1, kMaxTime, next_id));
  next.next_directive_id_ = static_cast<uint64_t>(next_id);
  REGROUP_RETURN_IF_ERROR(ju::GetInt(j, "dp", where, 0, layout_.replicas(), next.dp_));
  next.generation_replicas_.clear();
  const int64_t last_replica = layout_.replicas() - 1;
  if (v1)
    REGROUP_RETURN_IF_ERROR(ju::GetIntList(j, "generation_replicas", where, 0, last_replica,
                                           next.generation_replicas_));
  else
    REGROUP_RETURN_IF_ERROR(ReadRanges(j, "generation_replicas", where, 0, last_replica,
                                       next.generation_replicas_));
  if (static_cast<int64_t>(next.generation_replicas_.size()) != next.dp_)
    return InvalidArgument("job state: " + std::to_string(next.generation_replicas_.size()) +
                           " generation replicas for dp " + std::to_string(next.dp_));

  if (v1) {
    REGROUP_RETURN_IF_ERROR(ReadSlotsV1(j, next.slots_));
    REGROUP_RETURN_IF_ERROR(ReadFaultsV1(j, "pending", spec_.pods, next.pending_));
    REGROUP_RETURN_IF_ERROR(ReadFaultsV1(j, "held", spec_.pods, next.held_));
    REGROUP_RETURN_IF_ERROR(ReadAvoidV1(j, next.avoid_));
  } else {
    std::vector<std::string> nodes;
    REGROUP_RETURN_IF_ERROR(ReadNodes(j, nodes));
    REGROUP_RETURN_IF_ERROR(ReadPods(j, nodes, next.slots_));
    REGROUP_RETURN_IF_ERROR(ReadFaultGroups(j, "pending", spec_.pods, next.pending_));
    REGROUP_RETURN_IF_ERROR(ReadFaultGroups(j, "held", spec_.pods, next.held_));
    REGROUP_RETURN_IF_ERROR(ReadAvoid(j, nodes, next.avoid_));
  }
  REGROUP_RETURN_IF_ERROR(
      ju::GetInt(j, "window_start_ms", where, -kMaxTime, kMaxTime, next.window_start_ms_, false));
  REGROUP_RETURN_IF_ERROR(
      ju::GetInt(j, "held_since_ms", where, -kMaxTime, kMaxTime, next.held_since_ms_, false));
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
  REGROUP_RETURN_IF_ERROR(
      ju::GetInt(j, "business_restarts", where, 0, kMaxTime, next.business_restarts_, false));
  // A state saved before the field: a pod lost to its node, or itself, was a hardware fault.
  next.hardware_fault_ = std::any_of(next.slots_.begin(), next.slots_.end(), [](const PodSlot& s) {
    return s.status == PodSlot::Status::kLost && s.lost_cause != LostCause::kJobRestart &&
           s.lost_cause != LostCause::kProcessDied;
  });
  REGROUP_RETURN_IF_ERROR(ju::GetBool(j, "hardware_fault", where, next.hardware_fault_, false));
  std::vector<int64_t> stateless, stateless_pods;
  const int64_t size = layout_.replica_ranks();
  REGROUP_RETURN_IF_ERROR(ReadRanges(j, "stateless_ranks", where, 0,
                                     layout_.replicas() * size - 1, stateless));
  for (int64_t rank : stateless) next.stateless_.insert({rank / size, rank % size});
  REGROUP_RETURN_IF_ERROR(ReadRanges(j, "stateless_pods", where, 0, spec_.pods - 1, stateless_pods));
  next.stateless_pods_.insert(stateless_pods.begin(), stateless_pods.end());
  if (!j.contains("stateless_pods"))  // a state saved before the field: every lost pod
    for (size_t p = 0; p < next.slots_.size(); ++p)
      if (next.slots_[p].status == PodSlot::Status::kLost)
        next.stateless_pods_.insert(static_cast<int64_t>(p));
  REGROUP_RETURN_IF_ERROR(ju::GetInt(j, "stateless_after_step", where, -1, kMaxTime,
                                     next.stateless_after_step_, false));
  if (auto it = j.find("manager"); it != j.end())
    REGROUP_RETURN_IF_ERROR(ReadManager(*it, "job state manager", next.manager_));
  if (auto it = j.find("manager_at_directive"); it != j.end())
    REGROUP_RETURN_IF_ERROR(
        ReadManager(*it, "job state manager_at_directive", next.manager_at_directive_));
  REGROUP_RETURN_IF_ERROR(
      ju::GetInt(j, "lease_holder", where, 0, kMaxTime, next.lease_holder_, false));
  REGROUP_RETURN_IF_ERROR(
      ju::GetInt(j, "facts_epoch", where, 0, kMaxTime, next.facts_applied_.first, false));
  REGROUP_RETURN_IF_ERROR(ju::GetInt(j, "facts_seq", where, 0, std::numeric_limits<int64_t>::max(),
                                     next.facts_applied_.second, false));
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
  // "manager_status" is the former spelling of "manager_progress", accepted as its alias.
  if (type == "manager_progress" || type == "manager_status") {
    ManagerProgress m;
    REGROUP_RETURN_IF_ERROR(ReadManager(e, where, m));
    return ReportProgress(job_id, m);
  }
  return InvalidArgument(where + ": type \"" + type +
                         "\" is not node, pod, fault, replacement_registered or manager_progress");
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
              ReadDirective((*h)[k], where + " history[" + std::to_string(k) + "]", false, d));
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
