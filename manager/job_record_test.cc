// SPDX-License-Identifier: Apache-2.0
// The job's durable record: its file form, and a manager restart that reads it (the fencing,
// the job's end and the majority survive the restart).
#include "manager/job_record.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

namespace regroup::manager {
namespace {

JobRecord Sample() {
  JobRecord r;
  r.job_id = "ns/job";
  r.epoch = 1796000000000;
  r.generation = 7;
  r.members = {{0, "uid-a"}, {1, "uid-b"}};
  r.lost = {"uid-old"};
  r.restarting = true;
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
            "the job record's \"epoch\" is \"x\"; it must be an integer from 0 to " +
                std::to_string(JobRecord::kMaxEpoch));
  JobRecord many = Sample();
  many.lost.assign(JobRecord::kMaxLost + 1, "u");
  EXPECT_EQ(ParseJobRecord(JobRecordJson(many)).status().message(),
            "the job record lists 1025 lost pods, more than 1024");
}

// Issue 40, finding 5: an epoch of 2^64-1 wrapped to 0 at the next incarnation's +1 (the manager
// fenced itself at every restart), and -5 read as 2^64-5. Every number is range-checked, and the
// refusal names the field and the value (LoadJobRecord adds the file).
TEST(JobRecord, EveryNumberIsRangeCheckedAndARefusalNamesTheFieldAndTheValue) {
  auto with = [](const std::string& field, const std::string& value) {
    nlohmann::json j = nlohmann::json::parse(JobRecordJson(Sample()));
    nlohmann::json v = nlohmann::json::parse(value);
    if (field == "node_rank") j["members"][0]["node_rank"] = v;
    else if (field == "mode") j["stop"]["mode"] = v;
    else j[field] = v;
    return ParseJobRecord(j.dump()).status().message();
  };
  const std::string most = std::to_string(JobRecord::kMaxEpoch);
  EXPECT_EQ(with("epoch", "18446744073709551615"),
            "the job record's \"epoch\" is 18446744073709551615; it must be an integer from 0 "
            "to " + most);
  EXPECT_EQ(with("epoch", "-5"),
            "the job record's \"epoch\" is -5; it must be an integer from 0 to " + most);
  EXPECT_EQ(with("epoch", "1.5"),
            "the job record's \"epoch\" is 1.5; it must be an integer from 0 to " + most);
  EXPECT_EQ(with("leader_epoch", "-1"),
            "the job record's \"leader_epoch\" is -1; it must be an integer from 0 to " + most);
  EXPECT_EQ(with("generation", "-1"),
            "the job record's \"generation\" is -1; it must be an integer from 0 to " + most);
  EXPECT_EQ(with("node_rank", "4294967296"),
            "the job record's \"node_rank\" is 4294967296; it must be an integer from 0 to "
            "2147483647");
  EXPECT_EQ(with("mode", "4294967299"),
            "the job record's \"mode\" is 4294967299; it must be an integer from 0 to 2147483647");
  EXPECT_TRUE(ParseJobRecord(JobRecordJson(Sample())).ok());
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
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    EXPECT_EQ(entry.path().filename(), "record.json") << "no temporary is left behind";
  std::ofstream(path) << "{\"version\": 1,";  // torn by hand: an error, never an empty record
  EXPECT_EQ(LoadJobRecord(path).status().message(),
            path + ": the job record is not a JSON object");
  const std::string nowhere = (dir / "missing" / "record.json").string();
  EXPECT_EQ(SaveJobRecord(nowhere, Sample()).message(),
            "cannot write the job record " + nowhere + ": cannot create a temporary file in " +
                (dir / "missing").string() + ": No such file or directory");
  std::filesystem::remove_all(dir);
}

// Issue 40, finding 4: a symlink planted at <record>.tmp made the manager truncate and overwrite
// its target (the temporary was opened without O_EXCL or O_NOFOLLOW).
TEST(JobRecord, ASymlinkPlantedAtTheTemporaryNameIsNeverFollowed) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("regroup-record-link-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "record.json").string();
  const std::string victim = (dir / "victim").string();
  std::ofstream(victim) << "precious";
  std::filesystem::create_symlink(victim, path + ".tmp");
  std::filesystem::create_symlink(victim, path + ".lock");
  ASSERT_TRUE(SaveJobRecord(path, Sample()).ok());
  std::string why;
  auto updated = UpdateJobRecord(path, Sample(), &why);
  EXPECT_FALSE(updated.ok()) << "a symlink at the lock's name is refused, never followed";
  std::ifstream in(victim);
  std::string kept((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(kept, "precious") << "the symlink's target was written";
  EXPECT_TRUE(std::filesystem::is_symlink(path + ".tmp"));
  auto loaded = LoadJobRecord(path);
  ASSERT_TRUE(loaded.ok() && loaded->has_value()) << loaded.status().message();
  EXPECT_EQ(**loaded, Sample());
  std::filesystem::remove_all(dir);
}

// Found by the chaos soak (integration/chaos.py, seeds 2, 3, 7, 9, 10): a second incarnation took
// epoch record+1, then the running one wrote its own older epoch back over it.
TEST(JobRecord, TheGrantedEpochNeverGoesBack) {
  JobRecord leader = Sample();
  leader.stopped = false;
  leader.leader_epoch = leader.epoch;
  JobRecord newcomer;  // started later, has formed nothing
  newcomer.job_id = leader.job_id;
  newcomer.epoch = leader.epoch + 1;
  newcomer.lost = {"uid-fenced-by-newcomer"};
  auto stored = MergeJobRecord(leader, newcomer, nullptr);
  ASSERT_TRUE(stored);
  EXPECT_EQ(stored->epoch, leader.epoch + 1);
  EXPECT_EQ(stored->leader_epoch, leader.epoch) << "the generation on record stays the leader's";
  EXPECT_EQ(stored->members, leader.members);
  EXPECT_EQ(stored->lost, (std::vector<std::string>{"uid-old", "uid-fenced-by-newcomer"}));
  // The leader writes again (a pod lost): the epoch stays the newcomer's.
  leader.lost.push_back("uid-c");
  auto again = MergeJobRecord(stored, leader, nullptr);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->epoch, leader.epoch + 1);
  EXPECT_EQ(again->lost.back(), "uid-c");
}

TEST(JobRecord, ARecordWrittenBeforeJobRestartsWereRecordedReadsAsNoRestart) {
  JobRecord before = Sample();
  before.restarting = false;
  auto back = ParseJobRecord(JobRecordJson(before));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_FALSE(back->restarting);
  EXPECT_EQ(JobRecordJson(before).find("restarting"), std::string::npos);
}

// Found by the simulation (seeds 227, 857, 1272, 2839 of regroup-sim): a job restart decided by
// one incarnation lived only in its memory; the next one readmitted a pod that was away with
// the processes it had, and resumed from their state, which no restarted process held.
TEST(JobRecord, AJobRestartOrAnEndDecidedBeforeAnyGenerationIsKeptForTheNextIncarnation) {
  JobRecord leader = Sample();
  leader.restarting = false;
  leader.stopped = false;
  leader.leader_epoch = leader.epoch;
  JobRecord newcomer;  // restarted, formed nothing yet, decides a job restart
  newcomer.job_id = leader.job_id;
  newcomer.epoch = leader.epoch + 1;
  newcomer.restarting = true;
  auto stored = MergeJobRecord(leader, newcomer, nullptr);
  ASSERT_TRUE(stored);
  EXPECT_TRUE(stored->restarting);
  EXPECT_EQ(stored->members, leader.members);
  newcomer.stopped = true;
  newcomer.stop_mode = 2;
  newcomer.stop_reason = "only 1 of the last generation's 2 pods on record came back";
  stored = MergeJobRecord(stored, newcomer, nullptr);
  ASSERT_TRUE(stored);
  EXPECT_TRUE(stored->stopped);
  EXPECT_EQ(stored->stop_reason, newcomer.stop_reason);
  // The leader forms a generation: the restart it stood for is over.
  leader.generation += 1;
  stored = MergeJobRecord(stored, leader, nullptr);
  ASSERT_TRUE(stored);
  EXPECT_FALSE(stored->restarting);
}

TEST(JobRecord, AnIncarnationOlderThanTheLeaderOnRecordIsFenced) {
  JobRecord stored = Sample();
  stored.epoch = 20;
  stored.leader_epoch = 20;  // epoch 20 formed a generation
  JobRecord old = Sample();
  old.epoch = old.leader_epoch = 19;
  std::string why;
  EXPECT_FALSE(MergeJobRecord(stored, old, &why));
  EXPECT_EQ(why, "manager epoch 20 formed a generation of job ns/job after this one (epoch 19)");
}

TEST(JobRecord, UpdateMergesIntoTheFileAndRefusesAFencedIncarnation) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("regroup-record-update-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "record.json").string();
  JobRecord leader = Sample();
  leader.epoch = leader.leader_epoch = 30;
  std::string why;
  ASSERT_TRUE(*UpdateJobRecord(path, leader, &why));
  JobRecord older = leader;
  older.epoch = older.leader_epoch = 29;
  auto written = UpdateJobRecord(path, older, &why);
  ASSERT_TRUE(written.ok());
  EXPECT_FALSE(*written);
  EXPECT_EQ((*LoadJobRecord(path))->epoch, 30u) << "the fenced incarnation wrote nothing";
  std::filesystem::remove_all(dir);
}

// Before every commit the manager looks at the record: the watch reads the file again whenever
// another write replaced it (a write of the same size within the same clock tick included: a
// write is a new file renamed into place), and says when there is none.
TEST(JobRecord, TheWatchSeesEveryWriteOfTheRecord) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("regroup-record-watch-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "record.json").string();
  JobRecordWatch watch(path);
  ASSERT_TRUE(watch.Refresh().ok());
  EXPECT_FALSE(watch.record()) << "no record yet";
  JobRecord r = Sample();
  r.epoch = r.leader_epoch = 40;
  ASSERT_TRUE(SaveJobRecord(path, r).ok());
  ASSERT_TRUE(watch.Refresh().ok());
  EXPECT_EQ(watch.record()->leader_epoch, 40u);
  ASSERT_TRUE(watch.Refresh().ok());
  EXPECT_EQ(watch.record()->leader_epoch, 40u) << "unchanged: the same record";
  r.epoch = r.leader_epoch = 41;  // the same size, at once
  ASSERT_TRUE(SaveJobRecord(path, r).ok());
  ASSERT_TRUE(watch.Refresh().ok());
  EXPECT_EQ(watch.record()->leader_epoch, 41u);
  EXPECT_EQ(FencedBy(watch.record(), 40),
            "manager epoch 41 formed a generation of job ns/job after this one (epoch 40)");
  EXPECT_EQ(FencedBy(watch.record(), 41), std::nullopt);
  {
    std::ofstream(path + ".new") << "{not json";
  }
  std::filesystem::rename(path + ".new", path);
  const Status bad = watch.Refresh();
  EXPECT_FALSE(bad.ok()) << "a corrupt record is an error, never taken for the last good one";
  EXPECT_NE(bad.message().find(path), std::string::npos) << bad.message();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace regroup::manager
