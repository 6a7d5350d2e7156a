// SPDX-License-Identifier: Apache-2.0
#include "cli/fault_script.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <sstream>

#include "common/text.h"
#include "plugin/json_util.h"

namespace regroup::cli {

StatusOr<int64_t> ParseDuration(std::string_view text) {
  struct Unit {
    std::string_view suffix;
    double ms;
  };
  for (const Unit& u : {Unit{"ms", 1}, Unit{"s", 1000}, Unit{"m", 60000}}) {
    if (text.size() <= u.suffix.size() || !text.ends_with(u.suffix)) continue;
    std::string number(text.substr(0, text.size() - u.suffix.size()));
    if (number.empty() || number.find_first_not_of("0123456789.") != std::string::npos) break;
    double value = 0;
    std::istringstream in(number);
    in >> value;
    if (!in || !in.eof() || value < 0 || value * u.ms > 1e15) break;
    return static_cast<int64_t>(std::llround(value * u.ms));
  }
  return InvalidArgument("\"" + std::string(text) +
                         "\" is not a duration; write it like 250ms, 10s, 1.5s or 2m");
}

StatusOr<std::vector<ScriptEvent>> ParseFaultScript(std::string_view text) {
  if (size_t bad = InvalidUtf8At(text); bad != std::string_view::npos)
    return InvalidArgument("the fault script is not valid UTF-8 (byte " + std::to_string(bad) +
                           ")");
  std::vector<ScriptEvent> events;
  std::istringstream in{std::string(text)};
  std::string raw;
  int line_no = 0;
  while (std::getline(in, raw)) {
    ++line_no;
    if (auto hash = raw.find('#'); hash != std::string::npos) raw.resize(hash);
    std::istringstream words(raw);
    std::vector<std::string> w;
    for (std::string word; words >> word;) w.push_back(word);
    if (w.empty()) continue;
    const std::string where = "fault script line " + std::to_string(line_no) + ": ";
    if (w.size() < 4)
      return InvalidArgument(where + "expected TIME SUBJECT ID VERB, as in \"10s node node-3 fails\"");
    ScriptEvent e;
    e.line = line_no;
    auto at = ParseDuration(w[0]);
    if (!at.ok()) return InvalidArgument(where + at.status().message());
    if (*at > kMaxScriptMs)
      return InvalidArgument(where + w[0] + " is beyond the simulation's 24 h horizon");
    e.at_ms = *at;
    const std::string& subject = w[1];
    const std::string& verb = w[3];
    for (size_t i = 4; i < w.size(); ++i) e.detail += (i > 4 ? " " : "") + w[i];
    if (subject == "node") {
      e.node = w[2];
      if (verb == "fails") e.kind = ScriptEvent::Kind::kNodeFails;
      else if (verb == "recovers") e.kind = ScriptEvent::Kind::kNodeRecovers;
      else if (verb == "joins") e.kind = ScriptEvent::Kind::kNodeJoins;
      else return InvalidArgument(where + "a node fails, recovers or joins, not \"" + verb + "\"");
    } else if (subject == "rank" || subject == "pod") {
      int64_t id = -1;
      auto [ptr, ec] = std::from_chars(w[2].data(), w[2].data() + w[2].size(), id);
      if (ec != std::errc() || ptr != w[2].data() + w[2].size() || id < 0)
        return InvalidArgument(where + "\"" + w[2] + "\" is not a " + subject + " number");
      e.id = id;
      if (subject == "pod") {
        if (verb != "fails") return InvalidArgument(where + "a pod fails, not \"" + verb + "\"");
        e.kind = ScriptEvent::Kind::kPodFails;
      } else if (verb == "exits") e.kind = ScriptEvent::Kind::kRankExits;
      else if (verb == "hangs") e.kind = ScriptEvent::Kind::kRankHangs;
      else if (verb == "collective-error") e.kind = ScriptEvent::Kind::kRankCollectiveError;
      else if (verb == "device-error") e.kind = ScriptEvent::Kind::kRankDeviceError;
      else
        return InvalidArgument(where + "a rank exits, hangs, collective-error or device-error, not \"" +
                               verb + "\"");
    } else {
      return InvalidArgument(where + "the subject is node, rank or pod, not \"" + subject + "\"");
    }
    events.push_back(std::move(e));
  }
  std::stable_sort(events.begin(), events.end(),
                   [](const ScriptEvent& a, const ScriptEvent& b) { return a.at_ms < b.at_ms; });
  return events;
}

std::string DescribeScriptEvent(const ScriptEvent& e) {
  using K = ScriptEvent::Kind;
  std::string out;
  switch (e.kind) {
    case K::kNodeFails: out = "node " + e.node + " fails"; break;
    case K::kNodeRecovers: out = "node " + e.node + " recovers"; break;
    case K::kNodeJoins: out = "node " + e.node + " joins"; break;
    case K::kRankExits: out = "rank " + std::to_string(e.id) + " exits"; break;
    case K::kRankHangs: out = "rank " + std::to_string(e.id) + " hangs"; break;
    case K::kRankCollectiveError: out = "rank " + std::to_string(e.id) + " reports a collective error"; break;
    case K::kRankDeviceError: out = "rank " + std::to_string(e.id) + " reports a device error"; break;
    case K::kPodFails: out = "pod " + std::to_string(e.id) + " fails"; break;
  }
  if (!e.detail.empty()) out += " (" + e.detail + ")";
  return out;
}

}  // namespace regroup::cli
