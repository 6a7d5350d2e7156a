// SPDX-License-Identifier: Apache-2.0
// fuzz_job_state: a job state (JSON, as stored in a PodGroup's annotations) through
// regroup_engine_import_job_state into valid jobs. An accepted state must then survive every
// read of the ABI, events and ticks that make decisions from it, and the round trips.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_common.h"

namespace {

struct SeedJob {
  const char* spec;
  const char* id;
  uint32_t pods;
};

constexpr SeedJob kJobs[] = {
    // One replica per pod (tp 2, 2 processes per pod): dp 4.
    {R"({"id":"default/train","uid":"t1","labels":{"fault-scheduling":"force"},)"
     R"("annotations":{"recover-strategy":"retry,recover-in-place,recover,elastic-training,dump",)"
     R"("wait-reschedule-timeout":"30","regroup.io/tensor-parallel":"2",)"
     R"("regroup.io/global-batch-size":"64","regroup.io/micro-batch-size":"4"},)"
     R"("pods":4,"processes_per_pod":2})",
     "default/train", 4},
    // Four replicas per pod (tp 2, 8 processes per pod), paused recovery, job restarts.
    {R"({"id":"default/paused","uid":"q1","labels":{"fault-scheduling":"grace",)"
     R"("process-recover-enable":"pause","fault-retry-times":"3"},)"
     R"("annotations":{"recover-strategy":"recover-in-place,elastic-training",)"
     R"("regroup.io/tensor-parallel":"2","regroup.io/min-data-parallel":"2",)"
     R"("regroup.io/global-batch-size":"16","regroup.io/micro-batch-size":"2",)"
     R"("regroup.io/even-split":"true"},"pods":2,"processes_per_pod":8})",
     "default/paused", 2},
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* text = reinterpret_cast<const char*>(data);
  fuzz::Engine engine;
  for (const auto& job : kJobs) engine.MustUpsert(job.spec);

  for (const auto& job : kJobs) {
    const regroup_status imported = FUZZ_CALL(
        regroup_engine_import_job_state(engine.get(), job.id, text, size, &err));
    if (imported != REGROUP_OK) continue;
    fuzz::ExerciseJob(engine, job.id, job.pods);

    // Decisions from the imported state: ticks, a failed node, faults, a replacement.
    const std::string id = job.id;
    engine.Tick(0);
    engine.Tick(1000);
    (void)FUZZ_CALL(regroup_engine_set_pod_state(engine.get(), job.id, 0, "fz0",
                                                 REGROUP_POD_RUNNING, "n0", 1500, &err));
    (void)FUZZ_CALL(regroup_engine_set_node_health(engine.get(), "n1", REGROUP_NODE_FAULTY,
                                                   "fuzz", 2000, &err));
    const std::string faults =
        R"([{"type":"fault","job":")" + id + R"(","kind":"process_exit","ranks":[0],"step":3},)"
        R"({"type":"fault","job":")" + id + R"(","kind":"hang","ranks":[1],"step":3},)"
        R"({"type":"fault","job":")" + id + R"(","kind":"collective_error","step":3},)"
        R"({"type":"fault","job":")" + id + R"(","kind":"device_error","pods":[0]}])";
    (void)engine.Apply(faults, 3000);
    engine.Tick(3500);
    const std::string more =
        R"([{"type":"replacement_registered","job":")" + id + R"(","index":0,"uid":"fz0"},)"
        R"({"type":"manager_progress","job":")" + id +
        R"(","epoch":9,"generation":9,"committed_step":99,"live_ranks":1}])";
    (void)engine.Apply(more, 4000);
    for (int64_t now : {int64_t{4500}, int64_t{40000}, int64_t{400000}, int64_t{4000000}, int64_t{1} << 50}) engine.Tick(now);
    fuzz::ExerciseJob(engine, job.id, job.pods);
  }
  fuzz::CheckSnapshotRoundTrip(engine);
  return 0;
}
