// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the fuzz targets. Every target drives libregroup through its C ABI, as the
// Volcano plugin does, and treats as a finding (abort) anything the ABI promises not to do:
// a crash or sanitizer report (found by the sanitizers), REGROUP_INTERNAL (an exception the
// library caught: a bug by its own definition), a failure without an error object, an error
// whose status differs from the returned one, or an empty message. Round trips the ABI documents
// (export -> import, snapshot -> restore) must succeed and give back the same document.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "regroup.h"

namespace fuzz {

[[noreturn]] inline void Die(const char* what, const std::string& detail) {
  std::fprintf(stderr, "\n==fuzz== contract violated: %s\n==fuzz==   %s\n", what, detail.c_str());
  std::fflush(stderr);
  std::abort();
}

// Checks one call's result against the ABI's contract and frees its error.
inline regroup_status Check(const char* call, regroup_status st, regroup_error* err) {
  if (st == REGROUP_OK) {
    if (err) Die(call, "returned REGROUP_OK with an error object");
    return st;
  }
  if (std::string_view(regroup_status_name(st)) == "REGROUP_UNKNOWN_STATUS")
    Die(call, "returned a status outside the table: " + std::to_string(static_cast<int>(st)));
  if (!err) Die(call, std::string("returned ") + regroup_status_name(st) + " without an error");
  const std::string message = regroup_error_message(err);
  const regroup_status err_status = regroup_error_status(err);
  regroup_error_free(err);
  if (st == REGROUP_INTERNAL) Die(call, "returned REGROUP_INTERNAL: " + message);
  if (err_status != st)
    Die(call, std::string("returned ") + regroup_status_name(st) + " but its error says " +
                  regroup_status_name(err_status));
  if (message.empty()) Die(call, std::string("returned ") + regroup_status_name(st) +
                                     " with an empty message");
  return st;
}

// FUZZ_CALL(expr): `expr` passes `&err`, declared here; returns its checked status.
#define FUZZ_CALL(expr)                          \
  ([&]() {                                       \
    regroup_error* err = nullptr;                \
    regroup_status st_ = (expr);                 \
    return ::fuzz::Check(#expr, st_, err);       \
  }())

// Takes a library-owned string.
inline std::string Take(char* text) {
  std::string out = text ? text : "";
  regroup_string_free(text);
  return out;
}

// An engine with small limits, so a fuzz input stays cheap.
class Engine {
 public:
  Engine() {
    regroup_engine_options options = REGROUP_ENGINE_OPTIONS_INIT;
    options.max_jobs = 32;
    options.history_length = 16;
    if (FUZZ_CALL(regroup_engine_new(&e_, &options, &err)) != REGROUP_OK || !e_)
      Die("regroup_engine_new", "could not create an engine");
  }
  ~Engine() { regroup_engine_free(e_); }
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  regroup_engine* get() const { return e_; }

  regroup_status Upsert(std::string_view job, int64_t now = 0) {
    return FUZZ_CALL(regroup_engine_upsert_job(e_, nullptr, job.data(), job.size(), now, &err));
  }
  // Upserts a job the harness knows to be valid.
  void MustUpsert(std::string_view job) {
    if (Upsert(job) != REGROUP_OK) Die("regroup_engine_upsert_job", "a seed job was refused");
  }
  regroup_status Apply(std::string_view events, int64_t now) {
    return FUZZ_CALL(
        regroup_engine_apply_events(e_, events.data(), events.size(), now, &err));
  }
  void Tick(int64_t now) {
    uint32_t changed = 0;
    if (FUZZ_CALL(regroup_engine_tick(e_, now, &changed, &err)) != REGROUP_OK)
      Die("regroup_engine_tick", "a tick failed");
  }
  std::string Snapshot() {
    char* out = nullptr;
    if (FUZZ_CALL(regroup_engine_snapshot(e_, &out, &err)) != REGROUP_OK || !out)
      Die("regroup_engine_snapshot", "a snapshot failed");
    return Take(out);
  }

 private:
  regroup_engine* e_ = nullptr;
};

// Exercises every per-job read of the ABI on `job` (which must exist), the fast paths on a few
// node names, and the export -> import round trip, which must give back the same state.
inline void ExerciseJob(Engine& engine, const std::string& job, uint32_t pods) {
  // Every call names a job by a NUL-terminated C string: a job whose id holds a NUL byte can
  // never be read, updated or removed by a C caller.
  if (job.find('\0') != std::string::npos)
    Die("the engine accepted a job id with a NUL byte",
        "no C caller can name job \"" + job.substr(0, job.find('\0')) + "\\0...\"");
  regroup_engine* e = engine.get();
  const char* id = job.c_str();
  regroup_decision d = REGROUP_DECISION_INIT;
  if (FUZZ_CALL(regroup_engine_decision(e, &d, id, &err)) != REGROUP_OK)
    Die("regroup_engine_decision", "failed on job " + job);
  char* out = nullptr;
  if (FUZZ_CALL(regroup_engine_decision_json(e, &out, id, &err)) != REGROUP_OK || !out)
    Die("regroup_engine_decision_json", "failed on job " + job);
  Take(out);
  out = nullptr;
  if (FUZZ_CALL(regroup_engine_history_json(e, &out, id, &err)) != REGROUP_OK || !out)
    Die("regroup_engine_history_json", "failed on job " + job);
  Take(out);

  const char* nodes[] = {"n0", "n1", "n2", "n3", "n4", "", nullptr};
  constexpr size_t kNodes = sizeof nodes / sizeof nodes[0];
  uint8_t allowed[kNodes];
  int32_t scores[kNodes];
  if (FUZZ_CALL(regroup_engine_filter_nodes(e, allowed, id, nodes, kNodes, &err)) != REGROUP_OK)
    Die("regroup_engine_filter_nodes", "failed on job " + job);
  for (uint32_t pod = 0; pod < pods && pod < 8; ++pod) {
    if (FUZZ_CALL(regroup_engine_score_nodes(e, scores, id, pod, nodes, kNodes, &err)) !=
        REGROUP_OK)
      Die("regroup_engine_score_nodes", "failed on job " + job);
    for (size_t i = 0; i < kNodes; ++i)
      if (scores[i] < 0 || scores[i] > 100)
        Die("regroup_engine_score_nodes", "a score outside 0..100: " + std::to_string(scores[i]));
  }
  (void)FUZZ_CALL(regroup_engine_score_nodes(e, scores, id, pods, nodes, kNodes, &err));

  out = nullptr;
  if (FUZZ_CALL(regroup_engine_export_job_state(e, &out, id, &err)) != REGROUP_OK || !out)
    Die("regroup_engine_export_job_state", "failed on job " + job);
  const std::string state = Take(out);
  if (FUZZ_CALL(regroup_engine_import_job_state(e, id, state.data(), state.size(), &err)) !=
      REGROUP_OK)
    Die("regroup_engine_import_job_state", "refused its own export of job " + job + ": " + state);
  out = nullptr;
  if (FUZZ_CALL(regroup_engine_export_job_state(e, &out, id, &err)) != REGROUP_OK || !out)
    Die("regroup_engine_export_job_state", "failed on job " + job);
  const std::string again = Take(out);
  if (again != state)
    Die("export -> import -> export", "changed the state of job " + job + ":\n" + state + "\n" +
                                          again);
}

// The snapshot -> restore round trip: a fresh engine restores the snapshot and gives it back.
inline void CheckSnapshotRoundTrip(Engine& engine) {
  const std::string snapshot = engine.Snapshot();
  Engine copy;
  if (FUZZ_CALL(regroup_engine_restore(copy.get(), snapshot.data(), snapshot.size(), &err)) !=
      REGROUP_OK)
    Die("regroup_engine_restore", "refused the engine's own snapshot: " + snapshot);
  const std::string again = copy.Snapshot();
  if (again != snapshot)
    Die("snapshot -> restore -> snapshot", "changed the snapshot:\n" + snapshot + "\n" + again);
}

// The two jobs of the engine-level targets (fuzz_events, fuzz_coordinator).
inline constexpr const char* kJobs[] = {
    // One replica per pod (tp 2, 2 processes per pod): dp 4.
    R"({"id":"default/train","uid":"t1","labels":{"fault-scheduling":"force"},)"
    R"("annotations":{"recover-strategy":"retry,recover-in-place,recover,elastic-training,dump",)"
    R"("wait-reschedule-timeout":"30","regroup.io/tensor-parallel":"2",)"
    R"("regroup.io/global-batch-size":"64","regroup.io/micro-batch-size":"4"},)"
    R"("pods":4,"processes_per_pod":2})",
    // Two pods per replica (tp 4): dp 2; job restarts allowed; a manager pod.
    R"({"id":"default/other","uid":"o1","labels":{"fault-scheduling":"grace",)"
    R"("fault-retry-times":"2","pod-rescheduling":"on"},)"
    R"("annotations":{"recover-strategy":"recover,elastic-training",)"
    R"("wait-reschedule-timeout":"30","regroup.io/tensor-parallel":"4",)"
    R"("regroup.io/prefer-elastic":"true"},"env":{"MINDIO_WAIT_MINDX_TIME":"60"},)"
    R"("pods":4,"processes_per_pod":2,"volcano":{"min_available":3,"manager_pods":1}})",
};
inline constexpr const char* kIds[] = {"default/train", "default/other"};

}  // namespace fuzz
