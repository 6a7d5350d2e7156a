// SPDX-License-Identifier: Apache-2.0
// The job's durable record: what one manager incarnation leaves for the next (docs/design.md,
// "Generations, fencing and the step commit"). Standalone, it is the authority that grants
// epochs, and it carries the last generation's members (the majority a new incarnation needs),
// the pods declared lost (zombies if they come back) and the job's end across a restart.
//
// It lives in a small JSON file on storage that outlives the manager (the job's checkpoint
// folder, a volume), written through WriteFileAtomically (common/safe_file.h): a new temporary
// file, flushed and renamed, so a crash leaves either the old record or the new one and a
// symlink planted beside it is never followed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace regroup::manager {

struct JobRecord {
  // The most lost pods remembered: the oldest are forgotten first (a pod lost that long ago
  // has long been replaced), so the record stays small (under 300 KB at 256-byte uids).
  static constexpr size_t kMaxLost = 1024;
  // The largest epoch or generation a record may hold: far above any epoch granted (the wall
  // clock in ms), far below where the next incarnation's epoch + 1 would wrap.
  static constexpr uint64_t kMaxEpoch = uint64_t{1} << 62;

  struct Member {
    int64_t node_rank = 0;
    std::string uid;
    bool operator==(const Member&) const = default;
  };
  std::string job_id;
  uint64_t epoch = 0;                 // the newest epoch granted: every incarnation's is above it
  uint64_t leader_epoch = 0;          // the incarnation whose generation is on record
  uint64_t generation = 0;            // that generation
  std::vector<Member> members;        // its pods
  std::vector<std::string> lost;      // pod uids declared lost, oldest first
  // A job restart (from the newest checkpoint) was decided and no generation formed since: a
  // pod whose processes were in a generation restarts them when it comes back, under whichever
  // incarnation it reaches.
  bool restarting = false;
  bool stopped = false;               // the job ended: a StopTraining went to every pod
  int32_t stop_mode = 0;              // v1::StopTraining::Mode
  std::string stop_reason;

  bool operator==(const JobRecord&) const = default;
};

std::string JobRecordJson(const JobRecord& record);
// Errors name the field and what it must be.
StatusOr<JobRecord> ParseJobRecord(const std::string& text);

// Why incarnation `epoch` is fenced by the record stored now (a newer incarnation formed a
// generation since), or nothing when it is not. The one rule MergeJobRecord and the commit's
// look at the record (JobRecordWatch) both apply.
std::optional<std::string> FencedBy(const std::optional<JobRecord>& stored, uint64_t epoch);

// What an incarnation writes over the record stored now, or nothing when a newer incarnation has
// formed a generation since (this one is fenced; `why` says so). The granted epoch never goes
// back. An incarnation that has not formed a generation yet adds only its epoch, the pods it
// declared lost, a job restart it decided and the job's end: the generation on record stays its
// leader's.
std::optional<JobRecord> MergeJobRecord(const std::optional<JobRecord>& stored,
                                        const JobRecord& mine, std::string* why);

// The record at `path`: nothing when there is no file yet; an error naming the path when it
// cannot be read or parsed (a corrupt record is never taken as an empty one).
StatusOr<std::optional<JobRecord>> LoadJobRecord(const std::string& path);
// Writes atomically; an error names the path.
Status SaveJobRecord(const std::string& path, const JobRecord& record);
// Merges `mine` into the record at `path` (MergeJobRecord) and writes it, holding a lock
// (`path`.lock) so that two incarnations never interleave. Returns whether it was written:
// false when this incarnation is fenced (`why` says by whom).
StatusOr<bool> UpdateJobRecord(const std::string& path, const JobRecord& mine, std::string* why);

// The record at `path` as it is now, read again only when the file changed (another inode, size
// or modification time: every write renames a new file into place). The manager looks before
// every step it commits, so a stat per step is the cost while nobody else writes, and the record
// (up to 300 KB of lost pods) is neither parsed nor copied again.
class JobRecordWatch {
 public:
  explicit JobRecordWatch(std::string path) : path_(std::move(path)) {}
  // Brings record() up to date; an error names the path (record() is then the last good one).
  Status Refresh();
  // Nothing when there is no file.
  const std::optional<JobRecord>& record() const { return record_; }

 private:
  struct Seen {
    uint64_t device = 0, inode = 0;
    int64_t size = -1, modified_ns = 0;
    bool operator==(const Seen&) const = default;
  };
  std::string path_;
  std::optional<Seen> seen_;  // the file the cached record was read from; nothing: no file
  bool read_ = false;
  std::optional<JobRecord> record_;
};

}  // namespace regroup::manager
