// SPDX-License-Identifier: Apache-2.0
// fuzz_job_spec: a job spec (JSON) through regroup_validate_job and regroup_engine_upsert_job.
// Validation and upsert must agree; an accepted job must then survive every read of the ABI,
// an update, decisions after a node failure, and the state and snapshot round trips.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* text = reinterpret_cast<const char*>(data);

  char* report = nullptr;
  const regroup_status validated =
      FUZZ_CALL(regroup_validate_job(&report, text, size, &err));
  const bool has_report = validated == REGROUP_OK || validated == REGROUP_VALIDATION_FAILED;
  if (has_report != (report != nullptr))
    fuzz::Die("regroup_validate_job", std::string("returned ") + regroup_status_name(validated) +
                                          (report ? " with" : " without") + " a report");
  fuzz::Take(report);

  fuzz::Engine engine;
  report = nullptr;
  const regroup_status upserted =
      FUZZ_CALL(regroup_engine_upsert_job(engine.get(), &report, text, size, 0, &err));
  fuzz::Take(report);
  if (upserted != validated)
    fuzz::Die("regroup_engine_upsert_job",
              std::string("returned ") + regroup_status_name(upserted) +
                  " where regroup_validate_job returned " + regroup_status_name(validated));
  if (upserted != REGROUP_OK) return 0;

  // The input is a valid job: read its id and size the way the plugin knows them.
  const nlohmann::json spec = nlohmann::json::parse(text, text + size);
  const std::string id = spec.at("id").get<std::string>();
  const uint32_t pods = static_cast<uint32_t>(spec.at("pods").get<int64_t>());

  fuzz::ExerciseJob(engine, id, pods);
  // An update of the same job keeps it.
  if (engine.Upsert(std::string_view(text, size), 10) != REGROUP_OK)
    fuzz::Die("regroup_engine_upsert_job", "refused an update to a job it had accepted");

  // Its pods run on n0..; n0 fails; decisions follow.
  for (uint32_t p = 0; p < pods && p < 8; ++p) {
    const std::string uid = "p" + std::to_string(p), node = "n" + std::to_string(p);
    if (FUZZ_CALL(regroup_engine_set_pod_state(engine.get(), id.c_str(), p, uid.c_str(),
                                               REGROUP_POD_RUNNING, node.c_str(), 100, &err)) !=
        REGROUP_OK)
      fuzz::Die("regroup_engine_set_pod_state", "refused a pod of an accepted job");
  }
  if (FUZZ_CALL(regroup_engine_set_node_health(engine.get(), "n0", REGROUP_NODE_FAULTY, "fuzz",
                                               1000, &err)) != REGROUP_OK)
    fuzz::Die("regroup_engine_set_node_health", "refused a node failure");
  for (int64_t now : {1100, 20000, 400000, 400001}) engine.Tick(now);
  if (pods > 0) {
    (void)FUZZ_CALL(regroup_engine_set_pod_state(engine.get(), id.c_str(), 0, "p0b",
                                                 REGROUP_POD_RUNNING, "n9", 400100, &err));
    const std::string reg = "{\"type\":\"replacement_registered\",\"job\":" +
                            nlohmann::json(id).dump() + ",\"index\":0,\"uid\":\"p0b\"}";
    (void)engine.Apply(reg, 400200);
  }
  for (int64_t now : {400300, 2000000}) engine.Tick(now);
  fuzz::ExerciseJob(engine, id, pods);
  fuzz::CheckSnapshotRoundTrip(engine);

  if (FUZZ_CALL(regroup_engine_remove_job(engine.get(), id.c_str(), &err)) != REGROUP_OK)
    fuzz::Die("regroup_engine_remove_job", "could not remove job " + id);
  return 0;
}
