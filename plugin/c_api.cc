// SPDX-License-Identifier: Apache-2.0
// The C ABI over the engine. Every entry point catches everything: no C++ exception may cross
// into cgo, where it would take the scheduler down. Each engine has a shared mutex: calls that
// change the engine hold it exclusively, reads (decisions, the node predicate) share it.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <new>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "abi/regroup.h"
#include "common/job_token.h"
#include "common/version.h"
#include "plugin/coordinator.h"
#include "plugin/engine.h"
#include "plugin/json_util.h"
#include "plugin/volcano_job.h"

struct regroup_error {
  regroup_status status;
  std::string message;
};

struct regroup_engine {
  explicit regroup_engine(regroup::EngineOptions options) : engine(options) {}
  // Exclusive for calls that change the engine, shared for those that only read it, so a
  // scheduler's goroutines can filter and score nodes in parallel.
  std::shared_mutex mu;
  regroup::Engine engine;
};

namespace {

using regroup::Status;
using nlohmann::json;

regroup_status Fail(regroup_error** err, regroup_status status, std::string message) {
  if (err) *err = new (std::nothrow) regroup_error{status, std::move(message)};
  return status;
}

regroup_status Report(regroup_error** err, const Status& s) {
  if (s.ok()) return REGROUP_OK;
  return Fail(err, s.code(), s.message());
}

// Runs `body` with every exception turned into a status.
template <typename Body>
regroup_status Guard(regroup_error** err, Body&& body) {
  if (err) *err = nullptr;
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return Fail(err, REGROUP_RESOURCE_EXHAUSTED, "out of memory");
  } catch (const std::exception& e) {
    return Fail(err, REGROUP_INTERNAL, std::string("internal error: ") + e.what());
  } catch (...) {
    return Fail(err, REGROUP_INTERNAL, "internal error: unknown exception");
  }
}

// Copies a string for the caller (freed with regroup_string_free).
regroup_status Give(char** out, const std::string& text, regroup_error** err) {
  if (!out) return REGROUP_OK;
  char* copy = static_cast<char*>(std::malloc(text.size() + 1));
  if (!copy) return Fail(err, REGROUP_RESOURCE_EXHAUSTED, "out of memory");
  std::memcpy(copy, text.c_str(), text.size() + 1);
  *out = copy;
  return REGROUP_OK;
}

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

constexpr size_t kSnapshotScale = 64;  // a snapshot may be 64 times a single input

bool BadText(const char* text, size_t len) { return text == nullptr && len != 0; }

// `scale`: how many times the engine's input limit this input may be (snapshots are large).
regroup_status CheckInput(const regroup_engine* e, const char* text, size_t len,
                          regroup_error** err, size_t scale = 1) {
  if (!e) return Fail(err, REGROUP_INVALID_ARGUMENT, "the engine handle is NULL");
  if (BadText(text, len) || !text)
    return Fail(err, REGROUP_INVALID_ARGUMENT, "the JSON text is NULL");
  const size_t limit = size_t{e->engine.options().max_input_bytes} * scale;
  if (len > limit)
    return Fail(err, REGROUP_RESOURCE_EXHAUSTED,
                "the input is " + std::to_string(len) + " bytes, over the engine's limit of " +
                    std::to_string(limit));
  return REGROUP_OK;
}

regroup_status CheckJobId(const regroup_engine* e, const char* job_id, regroup_error** err) {
  if (!e) return Fail(err, REGROUP_INVALID_ARGUMENT, "the engine handle is NULL");
  if (!job_id) return Fail(err, REGROUP_INVALID_ARGUMENT, "the job id is NULL");
  return REGROUP_OK;
}

// Runs `body(job)` on a job of the engine, under the engine's lock; NOT_FOUND if unknown.
template <typename Job, typename Body>
regroup_status OnJob(regroup_engine* engine, const char* job_id, regroup_error** err,
                     Body&& body) {
  return Guard(err, [&]() -> regroup_status {
    if (auto st = CheckJobId(engine, job_id, err); st != REGROUP_OK) return st;
    Job* job = nullptr;
    std::unique_lock<std::shared_mutex> exclusive(engine->mu, std::defer_lock);
    std::shared_lock<std::shared_mutex> shared(engine->mu, std::defer_lock);
    if constexpr (std::is_const_v<Job>) shared.lock(); else exclusive.lock();
    job = engine->engine.FindJob(job_id);
    if (!job) return Fail(err, REGROUP_NOT_FOUND, std::string("no job ") + job_id + " in the engine");
    return body(*job);
  });
}

template <typename Render>
regroup_status JobJson(regroup_engine* engine, char** out, const char* job_id,
                       regroup_error** err, Render&& render) {
  if (out) *out = nullptr;
  if (!out) return Fail(err, REGROUP_INVALID_ARGUMENT, "the out pointer is NULL");
  std::string text;
  regroup_status st = OnJob<const regroup::Job>(engine, job_id, err, [&](const regroup::Job& job) {
    text = Dump(render(job));
    return REGROUP_OK;
  });
  return st == REGROUP_OK ? Give(out, text, err) : st;
}

#define REGROUP_STATUS_NAME_CASE_(name, value, message) \
  case REGROUP_##name:                                  \
    return "REGROUP_" #name;
#define REGROUP_STATUS_MESSAGE_CASE_(name, value, message) \
  case REGROUP_##name:                                     \
    return message;

}  // namespace

extern "C" {

uint32_t regroup_abi_version(void) { return REGROUP_ABI_VERSION; }

const char* regroup_version_string(void) { return REGROUP_VERSION_STRING; }

const char* regroup_status_name(regroup_status status) {
  switch (status) { REGROUP_STATUS_TABLE(REGROUP_STATUS_NAME_CASE_) }
  return "REGROUP_UNKNOWN_STATUS";
}

const char* regroup_status_message(regroup_status status) {
  switch (status) { REGROUP_STATUS_TABLE(REGROUP_STATUS_MESSAGE_CASE_) }
  return "unknown status";
}

regroup_status regroup_error_status(const regroup_error* error) {
  return error ? error->status : REGROUP_INVALID_ARGUMENT;
}

const char* regroup_error_message(const regroup_error* error) {
  return error ? error->message.c_str() : "";
}

void regroup_error_free(regroup_error* error) { delete error; }

void regroup_string_free(char* string) { std::free(string); }

regroup_status regroup_validate_job(char** out, const char* job_json, size_t len,
                                    regroup_error** err) {
  return Guard(err, [&]() -> regroup_status {
    if (out) *out = nullptr;
    if (!job_json) return Fail(err, REGROUP_INVALID_ARGUMENT, "the job JSON is NULL");
    if (len > (64u << 20)) return Fail(err, REGROUP_RESOURCE_EXHAUSTED, "the job JSON is too large");
    auto spec = regroup::ParseJobSpec(std::string_view(job_json, len));
    if (!spec.ok()) return Report(err, spec.status());
    regroup::ResolvedConfig resolved = spec->Resolve();
    regroup_status st = Give(out, Dump(regroup::ValidationReport(resolved)), err);
    if (st != REGROUP_OK) return st;
    if (!resolved.ok()) {
      std::string message = "job " + spec->id + " is invalid:";
      for (const auto& p : resolved.problems)
        if (p.severity == regroup::Problem::Severity::kError) message += " " + p.message + ";";
      message.pop_back();
      return Fail(err, REGROUP_VALIDATION_FAILED, message);
    }
    return REGROUP_OK;
  });
}

regroup_status regroup_job_has_keys(uint8_t* out, const char* const* label_keys, size_t label_count,
                                    const char* const* annotation_keys, size_t annotation_count,
                                    regroup_error** err) {
  return Guard(err, [&]() -> regroup_status {
    if (!out) return Fail(err, REGROUP_INVALID_ARGUMENT, "the out pointer is NULL");
    *out = 0;
    struct List {
      const char* what;
      const char* const* keys;
      size_t count;
      regroup::KeySource source;
    };
    const List lists[] = {{"label", label_keys, label_count, regroup::KeySource::kLabel},
                          {"annotation", annotation_keys, annotation_count,
                           regroup::KeySource::kAnnotation}};
    // Every name is checked before any answer, so a bad list is refused whatever it holds.
    for (const List& l : lists) {
      if (l.count && !l.keys)
        return Fail(err, REGROUP_INVALID_ARGUMENT,
                    std::string("the ") + l.what + " key list is NULL but its count is " +
                        std::to_string(l.count));
      for (size_t i = 0; i < l.count; ++i)
        if (!l.keys[i])
          return Fail(err, REGROUP_INVALID_ARGUMENT,
                      std::string(l.what) + " key " + std::to_string(i) + " is NULL");
    }
    for (const List& l : lists)
      for (size_t i = 0; i < l.count; ++i)
        if (regroup::MakesJobRegroups(l.source, l.keys[i])) {
          *out = 1;
          return REGROUP_OK;
        }
    return REGROUP_OK;
  });
}

regroup_status regroup_volcano_job_read(char** out, const char* job, size_t len,
                                        regroup_error** err) {
  return Guard(err, [&]() -> regroup_status {
    if (!out) return Fail(err, REGROUP_INVALID_ARGUMENT, "the out pointer is NULL");
    *out = nullptr;
    if (!job) return Fail(err, REGROUP_INVALID_ARGUMENT, "the Volcano Job text is NULL");
    constexpr size_t kMaxJobBytes = 4u << 20;
    if (len > kMaxJobBytes)
      return Fail(err, REGROUP_RESOURCE_EXHAUSTED,
                  "the Volcano Job is " + std::to_string(len) + " bytes, over the limit of " +
                      std::to_string(kMaxJobBytes));
    regroup::VolcanoReadOptions options;
    options.allow_no_training_pods = true;
    auto reading = regroup::ReadVolcanoJob(std::string_view(job, len), options);
    if (!reading.ok()) return Report(err, reading.status());
    json result = {{"job", regroup::JobSpecToJson(reading->spec)},
                   {"manager_tasks", reading->manager_tasks}};
    // The minAvailable a scheduler lowers an every-pod one to once the job runs (0: none).
    if (const auto resolved = reading->spec.Resolve(); resolved.ok() && reading->spec.volcano)
      result["elastic_min_available"] = regroup::ElasticMinAvailable(
          resolved.config, reading->spec.pods, reading->spec.volcano->manager_pods);
    return Give(out, Dump(result), err);
  });
}

regroup_status regroup_engine_new(regroup_engine** out, const regroup_engine_options* options,
                                  regroup_error** err) {
  return Guard(err, [&]() -> regroup_status {
    if (!out) return Fail(err, REGROUP_INVALID_ARGUMENT, "the out pointer is NULL");
    *out = nullptr;
    regroup::EngineOptions o;
    if (options) {
      if (options->version < 1 || options->version > REGROUP_ENGINE_OPTIONS_VERSION)
        return Fail(err, REGROUP_VERSION_MISMATCH,
                    "regroup_engine_options version " + std::to_string(options->version) +
                        " is not supported; use REGROUP_ENGINE_OPTIONS_INIT");
      if (options->max_jobs) o.max_jobs = options->max_jobs;
      if (options->max_input_bytes) o.max_input_bytes = options->max_input_bytes;
      if (options->history_length) o.history_length = options->history_length;
    }
    *out = new regroup_engine(o);
    return REGROUP_OK;
  });
}

void regroup_engine_free(regroup_engine* engine) { delete engine; }

regroup_status regroup_engine_upsert_job(regroup_engine* engine, char** out, const char* job_json,
                                         size_t len, int64_t now_ms, regroup_error** err) {
  return Guard(err, [&]() -> regroup_status {
    if (out) *out = nullptr;
    if (auto st = CheckInput(engine, job_json, len, err); st != REGROUP_OK) return st;
    auto spec = regroup::ParseJobSpec(std::string_view(job_json, len));
    if (!spec.ok()) return Report(err, spec.status());
    regroup::ResolvedConfig report;
    Status st;
    {
      std::unique_lock lock(engine->mu);
      st = engine->engine.UpsertJob(std::move(*spec), &report, now_ms);
    }
    if (out) {
      if (auto give = Give(out, Dump(regroup::ValidationReport(report)), err); give != REGROUP_OK)
        return give;
    }
    return Report(err, st);
  });
}

regroup_status regroup_engine_remove_job(regroup_engine* engine, const char* job_id,
                                         regroup_error** err) {
  return Guard(err, [&]() -> regroup_status {
    if (auto st = CheckJobId(engine, job_id, err); st != REGROUP_OK) return st;
    std::unique_lock lock(engine->mu);
    return Report(err, engine->engine.RemoveJob(job_id));
  });
}

regroup_status regroup_engine_apply_events(regroup_engine* engine, const char* events_json,
                                           size_t len, int64_t now_ms, regroup_error** err) {
  return Guard(err, [&]() -> regroup_status {
    if (auto st = CheckInput(engine, events_json, len, err); st != REGROUP_OK) return st;
    auto events = regroup::json_util::Parse(std::string_view(events_json, len), "the events");
    if (!events.ok()) return Report(err, events.status());
    std::unique_lock lock(engine->mu);
    return Report(err, engine->engine.ApplyEvents(*events, now_ms));
  });
}

regroup_status regroup_engine_set_node_health(regroup_engine* engine, const char* node,
                                              regroup_node_health health, const char* reason,
                                              int64_t now_ms, regroup_error** err) {
  return Guard(err, [&]() -> regroup_status {
    if (!engine) return Fail(err, REGROUP_INVALID_ARGUMENT, "the engine handle is NULL");
    if (!node) return Fail(err, REGROUP_INVALID_ARGUMENT, "the node name is NULL");
    std::unique_lock lock(engine->mu);
    return Report(err, engine->engine.SetNodeHealth(node, health, reason ? reason : "", now_ms));
  });
}

regroup_status regroup_engine_set_pod_state(regroup_engine* engine, const char* job_id,
                                            uint32_t pod_index, const char* pod_uid,
                                            regroup_pod_phase phase, const char* node,
                                            int64_t now_ms, regroup_error** err) {
  return Guard(err, [&]() -> regroup_status {
    if (auto st = CheckJobId(engine, job_id, err); st != REGROUP_OK) return st;
    if (!pod_uid) return Fail(err, REGROUP_INVALID_ARGUMENT, "the pod uid is NULL");
    std::unique_lock lock(engine->mu);
    return Report(err, engine->engine.SetPodState(job_id, pod_index, pod_uid, phase,
                                                  node ? node : "", now_ms));
  });
}

regroup_status regroup_engine_tick(regroup_engine* engine, int64_t now_ms, uint32_t* changed_out,
                                   regroup_error** err) {
  return Guard(err, [&]() -> regroup_status {
    if (!engine) return Fail(err, REGROUP_INVALID_ARGUMENT, "the engine handle is NULL");
    std::unique_lock lock(engine->mu);
    uint32_t changed = engine->engine.Tick(now_ms);
    if (changed_out) *changed_out = changed;
    return REGROUP_OK;
  });
}

regroup_status regroup_engine_decision(regroup_engine* engine, regroup_decision* out,
                                       const char* job_id, regroup_error** err) {
  if (!out) return Fail(err, REGROUP_INVALID_ARGUMENT, "the out pointer is NULL");
  if (out->version < 1 || out->version > REGROUP_DECISION_VERSION)
    return Fail(err, REGROUP_VERSION_MISMATCH,
                "regroup_decision version " + std::to_string(out->version) +
                    " is not supported; use REGROUP_DECISION_INIT");
  return OnJob<const regroup::Job>(engine, job_id, err, [&](const regroup::Job& job) {
    out->phase = job.phase();
    out->kind = job.directive().kind;
    out->directive_id = job.directive().id;
    out->deadline_ms = job.directive().deadline_ms;
    out->dp = static_cast<uint32_t>(job.current_dp());
    out->original_dp = static_cast<uint32_t>(job.original_dp());
    out->gang_min = job.GangMin();
    out->wants_pods = job.WantsPods() ? 1 : 0;
    out->evictions = static_cast<uint32_t>(job.Evictions().size());
    return REGROUP_OK;
  });
}

regroup_status regroup_engine_decision_json(regroup_engine* engine, char** out,
                                            const char* job_id, regroup_error** err) {
  return JobJson(engine, out, job_id, err, [](const regroup::Job& j) { return j.DecisionJson(); });
}

regroup_status regroup_engine_history_json(regroup_engine* engine, char** out, const char* job_id,
                                           regroup_error** err) {
  return JobJson(engine, out, job_id, err, [](const regroup::Job& j) { return j.HistoryJson(); });
}

regroup_status regroup_engine_export_job_state(regroup_engine* engine, char** out,
                                               const char* job_id, regroup_error** err) {
  return JobJson(engine, out, job_id, err, [](const regroup::Job& j) { return j.StateJson(); });
}

regroup_status regroup_engine_filter_nodes(regroup_engine* engine, uint8_t* out,
                                           const char* job_id, const char* const* nodes,
                                           size_t count, regroup_error** err) {
  if (count && (!out || !nodes))
    return Fail(err, REGROUP_INVALID_ARGUMENT, "the node list or the out array is NULL");
  return OnJob<const regroup::Job>(engine, job_id, err, [&](const regroup::Job& job) {
    engine->engine.FilterNodes(&job, nodes, count, out);
    return REGROUP_OK;
  });
}

regroup_status regroup_engine_score_nodes(regroup_engine* engine, int32_t* out, const char* job_id,
                                          uint32_t pod_index, const char* const* nodes,
                                          size_t count, regroup_error** err) {
  if (count && (!out || !nodes))
    return Fail(err, REGROUP_INVALID_ARGUMENT, "the node list or the out array is NULL");
  return OnJob<const regroup::Job>(engine, job_id, err, [&](const regroup::Job& job) {
    if (pod_index >= job.spec().pods)
      return Fail(err, REGROUP_INVALID_ARGUMENT,
                  "job " + std::string(job_id) + " has no pod " + std::to_string(pod_index));
    for (size_t i = 0; i < count; ++i)
      out[i] = nodes[i] && engine->engine.NodeAllowed(&job, nodes[i])
                   ? job.Score(pod_index, nodes[i])
                   : 0;
    return REGROUP_OK;
  });
}

regroup_status regroup_engine_import_job_state(regroup_engine* engine, const char* job_id,
                                               const char* state_json, size_t len,
                                               regroup_error** err) {
  if (auto st = CheckInput(engine, state_json, len, err); st != REGROUP_OK) return st;
  return OnJob<regroup::Job>(engine, job_id, err, [&](regroup::Job& job) {
    auto state = regroup::json_util::Parse(std::string_view(state_json, len), "the job state");
    if (!state.ok()) return Report(err, state.status());
    return Report(err, job.LoadState(*state));
  });
}

regroup_status regroup_engine_snapshot(regroup_engine* engine, char** out, regroup_error** err) {
  return Guard(err, [&]() -> regroup_status {
    if (out) *out = nullptr;
    if (!engine) return Fail(err, REGROUP_INVALID_ARGUMENT, "the engine handle is NULL");
    if (!out) return Fail(err, REGROUP_INVALID_ARGUMENT, "the out pointer is NULL");
    std::string text;
    {
      std::shared_lock lock(engine->mu);
      text = Dump(engine->engine.Snapshot());
    }
    return Give(out, text, err);
  });
}

regroup_status regroup_engine_restore(regroup_engine* engine, const char* snapshot_json, size_t len,
                                      regroup_error** err) {
  return Guard(err, [&]() -> regroup_status {
    if (auto st = CheckInput(engine, snapshot_json, len, err, kSnapshotScale); st != REGROUP_OK)
      return st;
    auto snapshot = regroup::json_util::Parse(std::string_view(snapshot_json, len), "the snapshot");
    if (!snapshot.ok()) return Report(err, snapshot.status());
    std::unique_lock lock(engine->mu);
    return Report(err, engine->engine.Restore(*snapshot));
  });
}

}  // extern "C"

// ---------------------------------------------------------------------------------------------
// The coordinator (since 1.1): a gRPC server over one engine, sharing the engine's lock.
// ---------------------------------------------------------------------------------------------

struct regroup_coordinator {
  std::unique_ptr<regroup::coordinator::Coordinator> coordinator;
};

extern "C" {

regroup_status regroup_coordinator_start(regroup_coordinator** out, regroup_engine* engine,
                                         const regroup_coordinator_options* options,
                                         regroup_error** err) {
  return Guard(err, [&]() -> regroup_status {
    if (!out) return Fail(err, REGROUP_INVALID_ARGUMENT, "the out pointer is NULL");
    *out = nullptr;
    if (!engine) return Fail(err, REGROUP_INVALID_ARGUMENT, "the engine handle is NULL");
    regroup::coordinator::CoordinatorOptions o;
    if (options) {
      if (options->version < 1 || options->version > REGROUP_COORDINATOR_OPTIONS_VERSION)
        return Fail(err, REGROUP_VERSION_MISMATCH,
                    "regroup_coordinator_options version " + std::to_string(options->version) +
                        " is not supported; use REGROUP_COORDINATOR_OPTIONS_INIT");
      if (options->listen && *options->listen) o.listen = options->listen;
      if (options->credential) o.credential = options->credential;
      if (options->tls_cert_file) o.tls_cert_file = options->tls_cert_file;
      if (options->tls_key_file) o.tls_key_file = options->tls_key_file;
      if (options->version >= 2) o.insecure = options->insecure != 0;
      if (options->version >= 3 && options->lease_ms != 0) o.lease_ms = options->lease_ms;
      if (options->version >= 4 && options->tls_client_ca_file)
        o.tls_client_ca_file = options->tls_client_ca_file;
    }
    auto started = regroup::coordinator::Coordinator::Start(engine->mu, engine->engine, o);
    if (!started.ok()) return Report(err, started.status());
    *out = new regroup_coordinator{std::move(*started)};
    return REGROUP_OK;
  });
}

int32_t regroup_coordinator_port(const regroup_coordinator* coordinator) {
  return coordinator ? coordinator->coordinator->port() : 0;
}

regroup_status regroup_coordinator_publish(regroup_coordinator* coordinator, regroup_error** err) {
  return Guard(err, [&]() -> regroup_status {
    if (!coordinator) return Fail(err, REGROUP_INVALID_ARGUMENT, "the coordinator handle is NULL");
    coordinator->coordinator->Publish();
    return REGROUP_OK;
  });
}

regroup_status regroup_coordinator_export_job_state(regroup_coordinator* coordinator,
                                                   const char* job_id, char** out,
                                                   uint64_t* fact_epoch, uint64_t* fact_seq,
                                                   regroup_error** err) {
  return Guard(err, [&]() -> regroup_status {
    if (out) *out = nullptr;
    if (!coordinator) return Fail(err, REGROUP_INVALID_ARGUMENT, "the coordinator handle is NULL");
    if (!job_id) return Fail(err, REGROUP_INVALID_ARGUMENT, "the job id is NULL");
    if (!out || !fact_epoch || !fact_seq)
      return Fail(err, REGROUP_INVALID_ARGUMENT, "an out pointer (state, fact_epoch, fact_seq) is NULL");
    auto exported = coordinator->coordinator->ExportJobState(job_id);
    if (!exported)
      return Fail(err, REGROUP_NOT_FOUND, "no job " + std::string(job_id) + " in the engine");
    *fact_epoch = exported->second.epoch;
    *fact_seq = exported->second.seq;
    return Give(out, Dump(exported->first), err);
  });
}

regroup_status regroup_coordinator_state_saved(regroup_coordinator* coordinator,
                                               const char* job_id, uint64_t fact_epoch,
                                               uint64_t fact_seq, regroup_error** err) {
  return Guard(err, [&]() -> regroup_status {
    if (!coordinator) return Fail(err, REGROUP_INVALID_ARGUMENT, "the coordinator handle is NULL");
    if (!job_id) return Fail(err, REGROUP_INVALID_ARGUMENT, "the job id is NULL");
    coordinator->coordinator->Saved(job_id, {fact_epoch, fact_seq});
    return REGROUP_OK;
  });
}

int regroup_coordinator_save_wanted(regroup_coordinator* coordinator, const char* job_id) {
  if (!coordinator || !job_id) return 0;
  try {
    return coordinator->coordinator->SaveWanted(job_id) ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

void regroup_coordinator_free(regroup_coordinator* coordinator) { delete coordinator; }

regroup_status regroup_job_token(char** out, const char* cluster_key, const char* job_id,
                                 const char* job_uid, regroup_error** err) {
  return Guard(err, [&]() -> regroup_status {
    if (!out) return Fail(err, REGROUP_INVALID_ARGUMENT, "the output pointer is NULL");
    *out = nullptr;
    if (!cluster_key || !*cluster_key)
      return Fail(err, REGROUP_INVALID_ARGUMENT, "the cluster key is NULL or empty");
    if (!job_id) return Fail(err, REGROUP_INVALID_ARGUMENT, "the job id is NULL");
    if (!job_uid) return Fail(err, REGROUP_INVALID_ARGUMENT, "the job uid is NULL");
    if (regroup::Status st = regroup::CheckJobTokenSubject(job_id, job_uid, "job_id", "job_uid");
        !st.ok())
      return Report(err, st);
    return Give(out, regroup::JobToken(cluster_key, job_id, job_uid), err);
  });
}

}  // extern "C"
