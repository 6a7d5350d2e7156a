// SPDX-License-Identifier: Apache-2.0
#include "manager/job_record.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "common/files.h"
#include "common/safe_file.h"

namespace regroup::manager {

using nlohmann::json;

std::string JobRecordJson(const JobRecord& r) {
  json members = json::array();
  for (const auto& m : r.members) members.push_back({{"node_rank", m.node_rank}, {"uid", m.uid}});
  json j = {{"version", 1},           {"job_id", r.job_id},         {"epoch", r.epoch},
            {"leader_epoch", r.leader_epoch}, {"generation", r.generation}, {"members", members},
            {"lost", r.lost}};
  if (r.restarting) j["restarting"] = true;
  if (r.stopped) j["stop"] = {{"mode", r.stop_mode}, {"reason", r.stop_reason}};
  return j.dump();
}

namespace {

template <typename T>
Status Read(const json& j, const char* key, T& out, bool required = true) {
  if (!j.contains(key)) {
    if (!required) return Status::Ok();
    return InvalidArgument(std::string("the job record has no \"") + key + "\"");
  }
  try {
    out = j.at(key).get<T>();
  } catch (const json::exception&) {
    return InvalidArgument(std::string("the job record's \"") + key + "\" has the wrong type");
  }
  return Status::Ok();
}

// An integer field within [0, most]: the refusal names the field and the value as the file has it
// (issue 40: 2^64-1 wrapped at the next epoch's +1, and -5 read as 2^64-5).
template <typename T>
Status ReadCount(const json& j, const char* key, T& out, uint64_t most) {
  if (!j.contains(key)) return InvalidArgument(std::string("the job record has no \"") + key + "\"");
  const json& v = j.at(key);
  if (!v.is_number_unsigned() || v.get<uint64_t>() > most)
    return InvalidArgument(std::string("the job record's \"") + key + "\" is " + v.dump() +
                           "; it must be an integer from 0 to " + std::to_string(most));
  out = static_cast<T>(v.get<uint64_t>());
  return Status::Ok();
}

constexpr uint64_t kMaxInt32 = 2147483647;

}  // namespace

StatusOr<JobRecord> ParseJobRecord(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument("the job record is not a JSON object");
  int64_t version = 0;
  REGROUP_RETURN_IF_ERROR(Read(j, "version", version));
  if (version != 1)
    return InvalidArgument("the job record has version " + std::to_string(version) +
                           "; this manager reads version 1");
  JobRecord r;
  REGROUP_RETURN_IF_ERROR(Read(j, "job_id", r.job_id));
  REGROUP_RETURN_IF_ERROR(ReadCount(j, "epoch", r.epoch, JobRecord::kMaxEpoch));
  REGROUP_RETURN_IF_ERROR(ReadCount(j, "leader_epoch", r.leader_epoch, JobRecord::kMaxEpoch));
  if (r.leader_epoch > r.epoch)
    return InvalidArgument("the job record's leader_epoch " + std::to_string(r.leader_epoch) +
                           " is above its epoch " + std::to_string(r.epoch));
  REGROUP_RETURN_IF_ERROR(ReadCount(j, "generation", r.generation, JobRecord::kMaxEpoch));
  REGROUP_RETURN_IF_ERROR(Read(j, "lost", r.lost));
  if (r.lost.size() > JobRecord::kMaxLost)
    return InvalidArgument("the job record lists " + std::to_string(r.lost.size()) +
                           " lost pods, more than " + std::to_string(JobRecord::kMaxLost));
  if (!j.contains("members") || !j["members"].is_array())
    return InvalidArgument("the job record's \"members\" must be an array");
  for (const auto& m : j["members"]) {
    if (!m.is_object()) return InvalidArgument("a member of the job record is not an object");
    JobRecord::Member member;
    REGROUP_RETURN_IF_ERROR(ReadCount(m, "node_rank", member.node_rank, kMaxInt32));
    REGROUP_RETURN_IF_ERROR(Read(m, "uid", member.uid));
    r.members.push_back(std::move(member));
  }
  REGROUP_RETURN_IF_ERROR(Read(j, "restarting", r.restarting, /*required=*/false));
  if (j.contains("stop")) {
    r.stopped = true;
    REGROUP_RETURN_IF_ERROR(ReadCount(j["stop"], "mode", r.stop_mode, kMaxInt32));
    REGROUP_RETURN_IF_ERROR(Read(j["stop"], "reason", r.stop_reason));
  }
  return r;
}

std::optional<std::string> FencedBy(const std::optional<JobRecord>& stored, uint64_t epoch) {
  if (!stored || stored->leader_epoch <= epoch) return std::nullopt;
  return "manager epoch " + std::to_string(stored->leader_epoch) + " formed a generation of job " +
         stored->job_id + " after this one (epoch " + std::to_string(epoch) + ")";
}

std::optional<JobRecord> MergeJobRecord(const std::optional<JobRecord>& stored,
                                        const JobRecord& mine, std::string* why) {
  if (!stored) return mine;
  if (auto fenced = FencedBy(stored, mine.epoch)) {
    if (why) *why = std::move(*fenced);
    return std::nullopt;
  }
  JobRecord out = mine.leader_epoch == mine.epoch ? mine : *stored;
  out.epoch = std::max(stored->epoch, mine.epoch);
  if (mine.leader_epoch != mine.epoch) {
    for (const auto& uid : mine.lost)
      if (std::find(out.lost.begin(), out.lost.end(), uid) == out.lost.end()) out.lost.push_back(uid);
    out.restarting = out.restarting || mine.restarting;
    if (mine.stopped && !out.stopped) {
      out.stopped = true;
      out.stop_mode = mine.stop_mode;
      out.stop_reason = mine.stop_reason;
    }
  }
  while (out.lost.size() > JobRecord::kMaxLost) out.lost.erase(out.lost.begin());
  return out;
}

StatusOr<std::optional<JobRecord>> LoadJobRecord(const std::string& path) {
  std::error_code error;
  if (!std::filesystem::exists(path, error) && !error) return std::optional<JobRecord>();
  auto text = ReadSmallFile(path, "job record");
  if (!text.ok()) return text.status();
  auto record = ParseJobRecord(*text);
  if (!record.ok()) return InvalidArgument(path + ": " + record.status().message());
  return std::optional<JobRecord>(std::move(*record));
}

Status SaveJobRecord(const std::string& path, const JobRecord& record) {
  return WriteFileAtomically(path, JobRecordJson(record), "job record");
}

StatusOr<bool> UpdateJobRecord(const std::string& path, const JobRecord& mine, std::string* why) {
  const std::string lock_path = path + ".lock";
  // O_NOFOLLOW: a symlink planted at the lock's name is an error, never a file opened elsewhere.
  const int lock = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (lock < 0)
    return FailedPrecondition("cannot lock the job record " + lock_path + ": " + std::strerror(errno));
  ::flock(lock, LOCK_EX);  // released by close
  auto stored = LoadJobRecord(path);
  StatusOr<bool> result = stored.status();
  if (stored.ok()) {
    auto merged = MergeJobRecord(*stored, mine, why);
    if (!merged) {
      result = false;
    } else {
      Status st = SaveJobRecord(path, *merged);
      result = st.ok() ? StatusOr<bool>(true) : StatusOr<bool>(st);
    }
  }
  ::close(lock);
  return result;
}

Status JobRecordWatch::Refresh() {
  struct stat st {};
  std::optional<Seen> now;
  if (::stat(path_.c_str(), &st) == 0) {
    now = Seen{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
               static_cast<int64_t>(st.st_size),
               static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec};
  } else if (errno != ENOENT) {
    return FailedPrecondition("cannot look at the job record " + path_ + ": " +
                              std::strerror(errno));
  }
  if (read_ && now == seen_) return Status::Ok();
  auto loaded = LoadJobRecord(path_);
  if (!loaded.ok()) return loaded.status();
  // Cached only under the stat taken before the read: a write between the two is read again
  // at the next look, never missed.
  record_ = std::move(*loaded);
  seen_ = now;
  read_ = true;
  return Status::Ok();
}

}  // namespace regroup::manager
