// The job's durable record: its file form, and a manager restart that reads it (the fencing,
// the job's end and the majority survive the restart).
#include "manager/job_record.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace regroup::manager {
namespace {

JobRecord Sample() {
  JobRecord r;
  r.job_id = "ns/job";
  r.epoch = 1796000000000;
  r.generation = 7;
  r.members = {{0, "uid-a"}, {1, "uid-b"}};
  r.lost = {"uid-old"};
  r.stopped = true;
  r.stop_mode = 3;
  r.stop_reason = "training finished at step 99";
  return r;
}

TEST(JobRecord, RoundTripsThroughItsJson) {
  auto back = ParseJobRecord(JobRecordJson(Sample()));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(*back, Sample());
}

TEST(JobRecord, ABadRecordIsAnErrorThatNamesWhatIsWrong) {
  EXPECT_EQ(ParseJobRecord("{").status().message(), "the job record is not a JSON object");
  EXPECT_EQ(ParseJobRecord(R"({"version": 2})").status().message(),
            "the job record has version 2; this manager reads version 1");
  EXPECT_EQ(ParseJobRecord(R"({"version": 1, "job_id": "j", "epoch": "x"})").status().message(),
            "the job record's \"epoch\" has the wrong type");
  JobRecord many = Sample();
  many.lost.assign(JobRecord::kMaxLost + 1, "u");
  EXPECT_EQ(ParseJobRecord(JobRecordJson(many)).status().message(),
            "the job record lists 1025 lost pods, more than 1024");
}

TEST(JobRecord, SavesAtomicallyAndLoadsBack) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("regroup-record-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "record.json").string();
  auto none = LoadJobRecord(path);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value()) << "no file yet: no record";
  ASSERT_TRUE(SaveJobRecord(path, Sample()).ok());
  auto loaded = LoadJobRecord(path);
  ASSERT_TRUE(loaded.ok() && loaded->has_value());
  EXPECT_EQ(**loaded, Sample());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  std::ofstream(path) << "{\"version\": 1,";  // torn by hand: an error, never an empty record
  EXPECT_EQ(LoadJobRecord(path).status().message(),
            path + ": the job record is not a JSON object");
  const std::string nowhere = (dir / "missing" / "record.json").string();
  EXPECT_EQ(SaveJobRecord(nowhere, Sample()).message(),
            "cannot write the job record " + nowhere + ".tmp: No such file or directory");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace regroup::manager
