// SPDX-License-Identifier: Apache-2.0
// The names of the engine's enums, shared by the engine and its JSON form (engine_json.cc).
// Internal to plugin/: not part of any public interface.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace regroup::engine_names {

// The largest time, step, epoch or count the engine accepts: far beyond any real value, and
// arithmetic on it cannot overflow.
inline constexpr int64_t kMaxTime = int64_t{1} << 60;

constexpr std::array<std::string_view, 10> kPhaseNames = {
    "running", "recovering", "waiting", "scaled_in", "scaling_out",
    "paused",  "dumping",    "exiting", "restarting", "failed"};
constexpr std::array<std::string_view, 10> kDirectiveNames = {
    "continue", "retry",    "restart_in_place", "wait", "resume",
    "scale_in", "scale_out", "dump",            "exit", "restart_job"};
constexpr std::array<std::string_view, 3> kHealthNames = {"healthy", "faulty", "unknown"};
constexpr std::array<std::string_view, 5> kPodPhaseNames = {"pending", "bound", "running",
                                                            "failed", "deleted"};
constexpr std::array<std::string_view, 6> kFaultKindNames = {
    "process_exit", "hang", "collective_error", "device_error", "pod_lost", "state_lost"};
constexpr std::array<std::string_view, 3> kSlotStatusNames = {"active", "standby", "lost"};
constexpr std::array<std::string_view, 10> kLostCauseNames = {
    "none",         "node_faulty", "node_unknown", "pod_failed",  "pod_deleted",
    "pod_replaced", "device_error", "pod_lost",    "job_restart", "process_died"};

template <typename Enum, size_t N>
std::optional<Enum> ParseName(const std::array<std::string_view, N>& names, std::string_view s) {
  for (size_t i = 0; i < N; ++i)
    if (names[i] == s) return static_cast<Enum>(i);
  return std::nullopt;
}

template <size_t N>
std::string_view NameOf(const std::array<std::string_view, N>& names, int value) {
  return value >= 0 && static_cast<size_t>(value) < N ? names[static_cast<size_t>(value)]
                                                      : std::string_view("unknown");
}

}  // namespace regroup::engine_names
