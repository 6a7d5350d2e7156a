// SPDX-License-Identifier: Apache-2.0
// The first generation's rendezvous: when it opened (the first pod registered), and, after a
// manager restart, the majority of the last generation on record it needs before it forms one,
// so that two managers can never both train. Fresh pods never count; without a record, the
// agents' own word (the size of the last generation they followed) is all there is.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "manager/event_log.h"
#include "manager/job_record.h"
#include "manager/pods.h"

namespace regroup::manager {

class JoinWindow {
 public:
  JoinWindow(int64_t window_ms, EventLog& log) : window_ms_(window_ms), log_(log) {}

  // A pod registered: the window opens with the first one.
  void Opened(int64_t now) {
    if (started_ms_ < 0) started_ms_ = now;
  }
  bool open() const { return started_ms_ >= 0; }
  bool Over(int64_t now) const { return now >= started_ms_ + window_ms_; }
  int64_t started_ms() const { return started_ms_; }

  // The last generation on record (its pods), until this incarnation forms one.
  const std::vector<JobRecord::Member>& members() const { return members_; }
  // The record names these members now (another incarnation formed a generation since).
  void OnRecord(std::vector<JobRecord::Member> members);
  // This incarnation formed a generation: its own is the one on record.
  void Formed() { members_.clear(); }

  // Why a majority of the last generation is not back (said once in the log), or nothing when
  // it is (or there was none): a member counts, or its pod readmitted under a new incarnation of
  // its uid.
  std::optional<std::string> MajorityMissing(const Pods& pods, int64_t now);

  // The pods missing when the window closed are reported once: true the first time.
  bool ReportMissing() { return !std::exchange(missing_reported_, true); }
  bool missing_reported() const { return missing_reported_; }

 private:
  int64_t window_ms_;
  EventLog& log_;
  int64_t started_ms_ = -1;
  std::vector<JobRecord::Member> members_;
  bool majority_reported_ = false;  // "waiting for a majority" said once
  bool missing_reported_ = false;   // the missing pods were reported to the decision maker
};

}  // namespace regroup::manager
