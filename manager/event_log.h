// SPDX-License-Identifier: Apache-2.0
// The job control's event log: the newest events, kept for the status report, and how many were
// ever logged. Every part of the job control writes to it.
//
// Once Describe() names the job, every event is also one log line at info (warn for faults and
// errors), naming the job, the manager's epoch, the generation and the pods concerned:
//   job=default/job epoch=7 generation=3 pod=1 fault: process_exit: rank 3 exited with code 1
// The kinds that a flapping pod or a long wait can repeat (FloodProne) are rate-limited per kind
// and pod: one line per 10 s, the next one saying how many were held back. Faults, decisions,
// generations and stops are never held back. Messages are cut to kMaxLineBytes, with control
// characters escaped (a peer's text cannot forge a line).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/log_limit.h"
#include "common/text.h"
#include "regroup/v1/wire.pb.h"

namespace regroup::manager {

class EventLog {
 public:
  explicit EventLog(size_t keep) : keep_(keep) {}

  // Turns on the log lines: the job's id, this manager's epoch, the running generation's number
  // (read at each event), and the logger (nullptr: spdlog's default logger).
  void Describe(std::string job, uint64_t epoch, std::function<uint64_t()> generation,
                std::shared_ptr<spdlog::logger> logger = nullptr) {
    job_ = std::move(job);
    epoch_ = epoch;
    generation_ = std::move(generation);
    logger_ = std::move(logger);
  }

  // `pods`: the node ranks the event concerns (none: the job as a whole).
  void Add(int64_t now, const std::string& kind, const std::string& message,
           const std::vector<int64_t>& pods = {}) {
    ::regroup::v1::JobEvent e;
    e.set_at_ms(now);
    e.set_kind(kind);
    e.set_message(message);
    events_.push_back(std::move(e));
    ++logged_;
    while (events_.size() > keep_) events_.pop_front();
    if (generation_) Log(now, kind, message, pods);
  }
  const std::deque<::regroup::v1::JobEvent>& events() const { return events_; }
  uint64_t logged() const { return logged_; }

  // The kinds that may repeat without a decision between them.
  static bool FloodProne(const std::string& kind) {
    return kind == "register" || kind == "resume" || kind == "disconnect" ||
           kind == "stale_fault" || kind == "wait" || kind == "manager_stall" ||
           kind == "standby_exit" || kind == "decisions_available" ||
           kind == "decisions_unavailable";
  }
  static constexpr std::chrono::seconds kFloodInterval{10};
  // A message is logged cut to this many bytes (a peer's text may be as long as a message
  // allows), its control characters escaped: one event, one line (common/text.h OneLine).
  static constexpr size_t kMaxLineBytes = 2048;

 private:
  void Log(int64_t now, const std::string& kind, const std::string& message,
           const std::vector<int64_t>& pods) {
    const bool bad = kind == "fault" || kind == "error" || kind == "superseded" ||
                     kind == "manager_stall" || kind == "decision_timeout";
    const auto level = bad ? spdlog::level::warn : spdlog::level::info;
    spdlog::logger& logger = logger_ ? *logger_ : *spdlog::default_logger_raw();
    // Nothing is built for a logger that is off (the simulation runs millions of events).
    if (!logger.should_log(level)) return;
    std::string held_back;
    if (FloodProne(kind)) {
      auto key = std::make_pair(kind, pods.empty() ? int64_t{-1} : pods.front());
      auto it = limits_.try_emplace(std::move(key), kFloodInterval).first;
      const auto at = LogLimit::Clock::time_point(std::chrono::milliseconds(now));
      const auto held = it->second.Allow(at);
      if (!held) return;
      if (*held) held_back = " (and " + std::to_string(*held) + " more " + kind + " not logged)";
    }
    std::string who;
    for (size_t i = 0; i < pods.size(); ++i) who += (i ? "," : " pod=") + std::to_string(pods[i]);
    logger.log(level,
               "job={} epoch={} generation={}{} {}: {}{}", OneLine(job_, 256), epoch_,
               generation_(), who, kind, OneLine(message, kMaxLineBytes), held_back);
  }

  size_t keep_;
  std::deque<::regroup::v1::JobEvent> events_;
  uint64_t logged_ = 0;
  std::string job_;
  uint64_t epoch_ = 0;
  std::function<uint64_t()> generation_;
  std::shared_ptr<spdlog::logger> logger_;
  std::map<std::pair<std::string, int64_t>, LogLimit> limits_;
};

}  // namespace regroup::manager
