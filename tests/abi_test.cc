// SPDX-License-Identifier: Apache-2.0
// The C ABI through the header-only C++ wrapper: the same calls a foreign caller makes.
#include <gtest/gtest.h>

#include <thread>

#include <nlohmann/json.hpp>

#include "common/job_token.h"
#include "plugin/config.h"
#include "plugin/job_spec.h"
#include "plugin/volcano_job.h"
#include "regroup.hh"
#include "tests/source_file.h"

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

// regroup_job_has_keys answers from the configuration table: every key read from a label or an
// annotation counts there and only there, and any Regroup-prefixed name counts in both.
TEST(Abi, JobHasKeysFollowsTheConfigurationTable) {
  using regroup::abi::JobHasKeys;
  for (const auto& key : regroup::ConfigKeys()) {
    const std::string name(key.name);
    const bool prefixed = name.rfind("regroup.io/", 0) == 0;
    const bool label = key.source == regroup::KeySource::kLabel || prefixed;
    const bool annotation = key.source == regroup::KeySource::kAnnotation || prefixed;
    EXPECT_EQ(*JobHasKeys({"app", name}, {}), label) << name;
    EXPECT_EQ(*JobHasKeys({}, {name, "app"}), annotation) << name;
  }
  EXPECT_TRUE(*JobHasKeys({"regroup.io/anything"}, {}));
  EXPECT_TRUE(*JobHasKeys({}, {"regroup.io/not-a-key"}));
  EXPECT_FALSE(*JobHasKeys({"app", "regroup.io"}, {"scheduler.regroup.io/state", "x/regroup.io/y"}));
  EXPECT_FALSE(*JobHasKeys({}, {}));
  EXPECT_FALSE(*JobHasKeys({""}, {""}));
  const char* with_null[] = {"app", nullptr};
  regroup_error* err = nullptr;
  uint8_t has = 9;
  EXPECT_EQ(regroup_job_has_keys(&has, nullptr, 0, with_null, 2, &err), REGROUP_INVALID_ARGUMENT);
  ASSERT_NE(err, nullptr);
  EXPECT_STREQ(regroup_error_message(err), "annotation key 1 is NULL");
  regroup_error_free(err);
  EXPECT_EQ(has, 0);
}

// The ABI reads a Volcano Job exactly as regroupctl and regroup-manager --job do (one reader).
TEST(Abi, VolcanoJobReadIsRegroupctlsReader) {
  for (const char* file : {"examples/jobs/elastic-job.yaml", "examples/jobs/bad-regroup-key.yaml",
                           "deploy/examples/pytorch-job.yaml"}) {
    const std::string yaml = regroup::testing::ReadSourceFile(file);
    auto read = regroup::abi::ReadVolcanoJob(yaml);
    ASSERT_TRUE(read.ok()) << file << ": " << read.error().message;
    auto direct = regroup::JobSpecFromVolcanoYaml(yaml);
    ASSERT_TRUE(direct.ok()) << file;
    const json got = json::parse(*read);
    EXPECT_EQ(got["job"], regroup::JobSpecToJson(*direct)) << file;
    // Its job spec is the engine's: it parses back to the same spec.
    auto parsed = regroup::ParseJobSpec(got["job"]);
    ASSERT_TRUE(parsed.ok()) << parsed.status().message();
    EXPECT_EQ(regroup::JobSpecToJson(*parsed), got["job"]);
  }
  const json elastic = json::parse(
      *regroup::abi::ReadVolcanoJob(regroup::testing::ReadSourceFile("examples/jobs/elastic-job.yaml")));
  EXPECT_EQ(elastic["manager_tasks"], json::array({0}));
  EXPECT_EQ(elastic["job"]["pods"], 4);
  EXPECT_EQ(elastic["job"]["processes_per_pod"], 8);
}

// The document a scheduler plugin writes: JSON, the tasks it sees, quantities as strings.
TEST(Abi, VolcanoJobReadFromJson) {
  const std::string job = R"({"apiVersion":"batch.volcano.sh/v1alpha1","kind":"Job",
    "metadata":{"name":"t","namespace":"ml","uid":"u1","labels":{"fault-scheduling":"force"},
      "annotations":{"recover-strategy":"recover","regroup.io/tensor-parallel":"2"}},
    "spec":{"minAvailable":3,"tasks":[
      {"name":"master","replicas":1,"template":{"spec":{"containers":[{"name":"c",
        "command":["regroup-agent","--nproc_per_node","4"],
        "env":[{"name":"MINDIO_WAIT_MINDX_TIME","value":"45"},{"name":"FROM_SECRET"},{"name":"PATH","value":"/bin"}]}]}}},
      {"name":"worker","replicas":3,"template":{"spec":{"containers":[{"name":"c",
        "resources":{"limits":{"huawei.com/Ascend910":"8"}}}]}}},
      {"name":"lead","replicas":1,"template":{"spec":{"containers":[{"name":"side"},
        {"name":"m","args":["/bin/regroup-manager","--listen=:9601"]}]}}}]}})";
  auto read = regroup::abi::ReadVolcanoJob(job);
  ASSERT_TRUE(read.ok()) << read.error().message;
  const json got = json::parse(*read);
  EXPECT_EQ(got["manager_tasks"], json::array({2}));
  EXPECT_EQ(got["job"]["id"], "ml/t");
  EXPECT_EQ(got["job"]["uid"], "u1");
  EXPECT_EQ(got["job"]["pods"], 4);
  EXPECT_EQ(got["job"]["processes_per_pod"], 4);  // the first training task's
  EXPECT_EQ(got["job"]["env"], json({{"MINDIO_WAIT_MINDX_TIME", "45"}}));
  EXPECT_EQ(got["job"]["volcano"]["manager_pods"], 1);
  EXPECT_EQ(got["job"]["volcano"]["min_available"], 3);
}

TEST(Abi, VolcanoJobWithoutTrainingPodsIsReadWithZeroPods) {
  auto read = regroup::abi::ReadVolcanoJob(
      R"({"kind":"Job","metadata":{"name":"t"},"spec":{"tasks":[{"name":"manager"},
         {"name":"worker","replicas":0}]}})");
  ASSERT_TRUE(read.ok()) << read.error().message;
  const json got = json::parse(*read);
  EXPECT_EQ(got["job"]["pods"], 0);
  EXPECT_EQ(got["job"]["volcano"]["manager_pods"], 1);
  // Not a job the engine takes: upsert says why.
  auto e = Engine::Create();
  auto up = e->UpsertJob(got["job"].dump(), 0);
  EXPECT_EQ(up.status(), REGROUP_INVALID_ARGUMENT);
  EXPECT_NE(up.error().message.find("pods"), std::string::npos) << up.error().message;
}

TEST(Abi, VolcanoJobReadRefusesBadInputWithAClearMessage) {
  struct Case {
    std::string text;
    std::string message;  // a part of the error's message
  };
  const std::vector<Case> cases = {
      {"", "not a YAML map"},
      {"[1, 2]", "not a YAML map"},
      {"{\"kind\": [}", "not valid YAML"},
      {R"({"kind":"AscendJob"})", "regroupctl convert"},
      {R"({"kind":"Job"})", "metadata is missing"},
      {R"({"kind":"Job","metadata":{}})", "metadata.name is missing"},
      {R"({"kind":"Job","metadata":{"name":"t"}})", "spec is missing"},
      {R"({"kind":"Job","metadata":{"name":"t"},"spec":{"tasks":[]}})", "spec.tasks"},
      {R"({"kind":"Job","metadata":{"name":"t","labels":[1]},"spec":{}})", "metadata.labels"},
      {R"({"kind":"Job","metadata":{"name":"t"},"spec":{"tasks":[{"replicas":-1}]}})",
       "spec.tasks[0].replicas"},
      {R"({"kind":"Job","metadata":{"name":"t"},"spec":{"tasks":[{"replicas":1e99}]}})",
       "spec.tasks[0].replicas"},
      {R"({"kind":"Job","metadata":{"name":"t"},"spec":{"minAvailable":"x","tasks":[{}]}})",
       "spec.minAvailable"},
      {R"({"kind":"Job","metadata":{"name":"t"},"spec":{"policies":{},"tasks":[{}]}})",
       "spec.policies"},
      {R"({"kind":"Job","metadata":{"name":"t"},"spec":{"tasks":[{"template":{"spec":{
         "containers":[{"resources":{"limits":{"nvidia.com/gpu":"5000"}}}]}}}]}})",
       "processes per pod"},
      {R"({"kind":"Job","metadata":{"name":"t"},"spec":{"tasks":[{}]}})",
       "control character"},
      {std::string(300, '[') + std::string(300, ']'), "nested too deeply"},
      {"{\"kind\":\"Job\xff\"}", "not valid UTF-8"},
  };
  for (const auto& c : cases) {
    auto read = regroup::abi::ReadVolcanoJob(c.text);
    ASSERT_FALSE(read.ok()) << c.text;
    EXPECT_EQ(read.status(), REGROUP_INVALID_ARGUMENT) << c.text;
    EXPECT_NE(read.error().message.find(c.message), std::string::npos)
        << c.text << " gave: " << read.error().message;
  }
  auto huge = regroup::abi::ReadVolcanoJob(std::string((4u << 20) + 1, ' '));
  EXPECT_EQ(huge.status(), REGROUP_RESOURCE_EXHAUSTED);
  // YAML aliases that would expand without bound are read as they are, not expanded.
  std::string laughs = "a: &a [x, x, x, x, x, x, x, x]\n";
  for (char c = 'b'; c <= 'k'; ++c)
    laughs += std::string(1, c) + ": &" + c + " [*" + char(c - 1) + ", *" + char(c - 1) + ", *" +
              char(c - 1) + ", *" + char(c - 1) + "]\n";
  EXPECT_EQ(regroup::abi::ReadVolcanoJob(laughs).status(), REGROUP_INVALID_ARGUMENT);
  EXPECT_EQ(regroup_volcano_job_read(nullptr, "{}", 2, nullptr), REGROUP_INVALID_ARGUMENT);
}

TEST(Abi, AJobIdWithAControlCharacterIsRefused) {
  auto e = Engine::Create();
  auto r = e->UpsertJob(std::string_view("{\"id\":\"a\\u0000b\",\"pods\":1}"), 0);
  EXPECT_EQ(r.status(), REGROUP_INVALID_ARGUMENT);
  EXPECT_EQ(r.error().message,
            "job spec field \"id\" holds a control character; use a printable id such as "
            "\"namespace/name\"");
}

// A job's coordinator token, as `regroupctl token` prints it: what a scheduler plugin writes
// into the job's namespace when the job appears. Bad input names what was wrong.
TEST(Abi, JobTokenIsRegroupctlsTokenAndRefusesWhatCannotMatch) {
  char* token = nullptr;
  regroup_error* err = nullptr;
  ASSERT_EQ(regroup_job_token(&token, "cluster-key", "team-a/llama", "uid-1", &err), REGROUP_OK);
  EXPECT_EQ(std::string(token), regroup::JobToken("cluster-key", "team-a/llama", "uid-1"));
  EXPECT_EQ(std::string(token).size(), 64u);
  regroup_string_free(token);
  const auto refused = [&](const char* key, const char* job, const char* uid) {
    char* out = reinterpret_cast<char*>(1);
    regroup_error* e = nullptr;
    EXPECT_EQ(regroup_job_token(&out, key, job, uid, &e), REGROUP_INVALID_ARGUMENT);
    EXPECT_EQ(out, nullptr);
    std::string message = e ? regroup_error_message(e) : "";
    regroup_error_free(e);
    return message;
  };
  EXPECT_EQ(refused("", "a/b", "u"), "the cluster key is NULL or empty");
  EXPECT_EQ(refused("k", nullptr, "u"), "the job id is NULL");
  EXPECT_NE(refused("k", "llama", "u").find("job_id must be the job's NAMESPACE/NAME"),
            std::string::npos);
  EXPECT_NE(refused("k", "a/b", "").find("job_uid must be the job's metadata.uid"),
            std::string::npos);
  EXPECT_EQ(regroup_job_token(nullptr, "k", "a/b", "u", nullptr), REGROUP_INVALID_ARGUMENT);
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
