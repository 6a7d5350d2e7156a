// SPDX-License-Identifier: Apache-2.0
// The job control's event log: the newest events, kept for the status report, and how many were
// ever logged. Every part of the job control writes to it.
#pragma once

#include <cstdint>
#include <deque>
#include <string>

#include "regroup/v1/wire.pb.h"

namespace regroup::manager {

class EventLog {
 public:
  explicit EventLog(size_t keep) : keep_(keep) {}

  void Add(int64_t now, const std::string& kind, const std::string& message) {
    ::regroup::v1::JobEvent e;
    e.set_at_ms(now);
    e.set_kind(kind);
    e.set_message(message);
    events_.push_back(std::move(e));
    ++logged_;
    while (events_.size() > keep_) events_.pop_front();
  }
  const std::deque<::regroup::v1::JobEvent>& events() const { return events_; }
  uint64_t logged() const { return logged_; }

 private:
  size_t keep_;
  std::deque<::regroup::v1::JobEvent> events_;
  uint64_t logged_ = 0;
};

}  // namespace regroup::manager
