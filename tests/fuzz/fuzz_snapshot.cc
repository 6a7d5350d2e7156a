// SPDX-License-Identifier: Apache-2.0
// fuzz_snapshot: an engine snapshot (JSON) through regroup_engine_restore. A refused snapshot
// leaves the engine as it was; an accepted one must snapshot back to itself, survive ticks and
// every per-job read of the ABI.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "fuzz_common.h"

namespace {

constexpr const char* kJob =
    R"({"id":"default/train","uid":"t1","labels":{"fault-scheduling":"force"},)"
    R"("annotations":{"recover-strategy":"recover,elastic-training",)"
    R"("wait-reschedule-timeout":"30","regroup.io/tensor-parallel":"2"},)"
    R"("pods":4,"processes_per_pod":2})";

constexpr size_t kMaxJobs = 8;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* text = reinterpret_cast<const char*>(data);
  fuzz::Engine engine;
  engine.MustUpsert(kJob);
  const std::string before = engine.Snapshot();

  const regroup_status restored =
      FUZZ_CALL(regroup_engine_restore(engine.get(), text, size, &err));
  if (restored != REGROUP_OK) {
    if (engine.Snapshot() != before)
      fuzz::Die("regroup_engine_restore", "a refused snapshot changed the engine");
    return 0;
  }
  fuzz::CheckSnapshotRoundTrip(engine);

  // The jobs, as the snapshot names them (the library's own output, so valid JSON).
  const nlohmann::json snapshot = nlohmann::json::parse(engine.Snapshot());
  std::vector<std::pair<std::string, uint32_t>> jobs;
  for (const auto& entry : snapshot.at("jobs")) {
    if (jobs.size() >= kMaxJobs) break;
    jobs.emplace_back(entry.at("spec").at("id").get<std::string>(),
                      static_cast<uint32_t>(entry.at("spec").at("pods").get<int64_t>()));
  }
  for (const auto& [id, pods] : jobs) fuzz::ExerciseJob(engine, id, pods);
  (void)FUZZ_CALL(regroup_engine_set_node_health(engine.get(), "n0", REGROUP_NODE_FAULTY, "fuzz",
                                                 1000, &err));
  for (int64_t now : {int64_t{0}, int64_t{1000}, int64_t{1300}, int64_t{40000}, int64_t{4000000}, int64_t{1} << 50}) engine.Tick(now);
  for (const auto& [id, pods] : jobs) fuzz::ExerciseJob(engine, id, pods);
  fuzz::CheckSnapshotRoundTrip(engine);
  return 0;
}
