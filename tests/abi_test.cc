// The C ABI through the header-only C++ wrapper: the same calls a foreign caller makes.
#include <gtest/gtest.h>

#include <thread>

#include <nlohmann/json.hpp>

#include "regroup.hh"

namespace {

using nlohmann::json;
using regroup::abi::Engine;

const char kJob[] = R"({"id":"default/demo","uid":"u1","labels":{"fault-scheduling":"force"},
  "annotations":{"recover-strategy":"recover,elastic-training","wait-reschedule-timeout":"30",
  "regroup.io/tensor-parallel":"2"},
  "pods":4,"processes_per_pod":2})";

Engine Started() {
  auto e = Engine::Create();
  EXPECT_TRUE(e.ok());
  EXPECT_TRUE(e->UpsertJob(kJob, 0).ok());
  for (uint32_t i = 0; i < 4; ++i)
    EXPECT_TRUE(e->SetPodState("default/demo", i, "p" + std::to_string(i), REGROUP_POD_RUNNING,
                               "n" + std::to_string(i), 0)
                    .ok());
  return std::move(*e);
}

TEST(Abi, VersionAndStatusTable) {
  EXPECT_EQ(regroup_abi_version(), static_cast<uint32_t>(REGROUP_ABI_VERSION));
  EXPECT_STREQ(regroup_status_name(REGROUP_NOT_FOUND), "REGROUP_NOT_FOUND");
  EXPECT_STREQ(regroup_status_name(static_cast<regroup_status>(999)), "REGROUP_UNKNOWN_STATUS");
  EXPECT_STREQ(regroup_status_message(REGROUP_OK), "success");
}

TEST(Abi, NodeLossWaitScaleInScaleOut) {
  Engine e = Started();
  ASSERT_TRUE(e.SetNodeHealth("n3", REGROUP_NODE_FAULTY, "NotReady", 1000).ok());
  ASSERT_TRUE(e.Tick(1200).ok());
  auto d = e.Decision("default/demo");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->phase, REGROUP_PHASE_WAITING);
  EXPECT_EQ(d->kind, REGROUP_DIRECTIVE_WAIT);
  EXPECT_EQ(d->deadline_ms, 31200);
  EXPECT_EQ(d->wants_pods, 1u);
  EXPECT_EQ(d->evictions, 1u);
  auto allowed = e.FilterNodes("default/demo", {"n0", "n3", "elsewhere"});
  EXPECT_EQ(*allowed, (std::vector<uint8_t>{1, 0, 1}));
  ASSERT_EQ(*e.Tick(31200), 1u);
  d = e.Decision("default/demo");
  EXPECT_EQ(d->kind, REGROUP_DIRECTIVE_SCALE_IN);
  EXPECT_EQ(d->dp, 3u);
  EXPECT_EQ(d->gang_min, 3u);
  json decision = json::parse(*e.DecisionJson("default/demo"));
  EXPECT_EQ(decision["directive"]["remove_replicas"], json::array({3}));
  EXPECT_EQ(decision["scheduler"]["evict"][0]["mode"], "force");
  ASSERT_TRUE(e.ApplyEvents(R"([{"type":"pod","job":"default/demo","index":3,"uid":"p3b",
      "phase":"running","node":"n9"},{"type":"replacement_registered","job":"default/demo",
      "index":3,"uid":"p3b"}])", 40000).ok());
  e.Tick(40100).ok();
  d = e.Decision("default/demo");
  EXPECT_EQ(d->phase, REGROUP_PHASE_SCALING_OUT);
  EXPECT_EQ(d->dp, 4u);
  auto scores = e.ScoreNodes("default/demo", 3, {"n3", "n9", "n0"});
  EXPECT_EQ((*scores)[0], 0) << "avoided";
  json history = json::parse(*e.HistoryJson("default/demo"));
  ASSERT_EQ(history.size(), 3u);
  EXPECT_EQ(history[2]["kind"], "scale_out");
}

TEST(Abi, ValidationFailureReportsEveryProblemAndKeepsTheJob) {
  Engine e = Started();
  auto bad = e.UpsertJob(R"({"id":"default/demo","uid":"u1","pods":4,"processes_per_pod":2,
      "annotations":{"regroup.io/tensor-parallel":"3","regroup.io/min-data-parallel":"x"}})", 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status(), REGROUP_VALIDATION_FAILED);
  EXPECT_NE(bad.error().message.find("regroup.io/min-data-parallel"), std::string::npos);
  auto v = regroup::abi::ValidateJob(R"({"id":"x","pods":4,"processes_per_pod":2,
      "annotations":{"regroup.io/tensor-parallel":"3","regroup.io/min-data-parallel":"x"}})");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->status, REGROUP_VALIDATION_FAILED);
  EXPECT_EQ(json::parse(v->report)["problems"].size(), 2u);
  EXPECT_TRUE(e.Decision("default/demo").ok()) << "the accepted job is still there";
}

TEST(Abi, BadInputGivesClearErrors) {
  Engine e = Started();
  auto r = e.ApplyEvents("{not json", 0);
  EXPECT_EQ(r.status(), REGROUP_INVALID_ARGUMENT);
  EXPECT_EQ(r.error().message.rfind("the events is not valid JSON", 0), 0u) << r.error().message;
  EXPECT_EQ(e.Decision("default/none").status(), REGROUP_NOT_FOUND);
  EXPECT_EQ(e.RemoveJob("default/none").status(), REGROUP_NOT_FOUND);
  EXPECT_EQ(e.ScoreNodes("default/demo", 99, {"n0"}).status(), REGROUP_INVALID_ARGUMENT);
  EXPECT_EQ(regroup_engine_tick(nullptr, 0, nullptr, nullptr), REGROUP_INVALID_ARGUMENT);
  regroup_engine_options old = REGROUP_ENGINE_OPTIONS_INIT;
  old.version = 99;
  EXPECT_EQ(Engine::Create(&old).status(), REGROUP_VERSION_MISMATCH);
  regroup_engine_options small = REGROUP_ENGINE_OPTIONS_INIT;
  small.max_jobs = 1;
  auto limited = Engine::Create(&small);
  ASSERT_TRUE(limited->UpsertJob(kJob, 0).ok());
  EXPECT_EQ(limited->UpsertJob(R"({"id":"other","pods":1})", 0).status(),
            REGROUP_RESOURCE_EXHAUSTED);
}

TEST(Abi, AJobIdWithAControlCharacterIsRefused) {
  auto e = Engine::Create();
  auto r = e->UpsertJob(std::string_view("{\"id\":\"a\\u0000b\",\"pods\":1}"), 0);
  EXPECT_EQ(r.status(), REGROUP_INVALID_ARGUMENT);
  EXPECT_EQ(r.error().message,
            "job spec field \"id\" holds a control character; use a printable id such as "
            "\"namespace/name\"");
}

TEST(Abi, StateExportImportAndSnapshotRoundTrip) {
  Engine e = Started();
  e.SetNodeHealth("n1", REGROUP_NODE_FAULTY, "x", 0).ok();
  e.Tick(200).ok();
  auto state = e.ExportJobState("default/demo");
  ASSERT_TRUE(state.ok());
  auto fresh = Engine::Create();
  ASSERT_TRUE(fresh->UpsertJob(kJob, 0).ok());
  ASSERT_TRUE(fresh->ImportJobState("default/demo", *state).ok());
  EXPECT_EQ(*fresh->ExportJobState("default/demo"), *state);
  auto snap = e.Snapshot();
  auto other = Engine::Create();
  ASSERT_TRUE(other->Restore(*snap).ok());
  EXPECT_EQ(*other->Snapshot(), *snap);
  EXPECT_EQ(other->Restore("[]").status(), REGROUP_INVALID_ARGUMENT);
  EXPECT_TRUE(other->RemoveJob("default/demo").ok());
}

TEST(Abi, ManyThreadsAtOnce) {
  Engine e = Started();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&e, t] {
      for (int i = 0; i < 2000; ++i) {
        const std::string node = "x" + std::to_string((t * 7919 + i) % 50);
        (void)e.SetNodeHealth(node, i % 3 ? REGROUP_NODE_HEALTHY : REGROUP_NODE_FAULTY, "", i);
        (void)e.Tick(i);
        (void)e.Decision("default/demo");
        (void)e.FilterNodes("default/demo", {node});
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_TRUE(e.Decision("default/demo").ok());
}

}  // namespace
