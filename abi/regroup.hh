// regroup.hh: a header-only C++17 wrapper over the C ABI of regroup.h.
//
// It adds ownership (unique_ptr deleters) and a [[nodiscard]] Result type; every call goes
// through the same C functions a foreign caller uses, so tests written against it test the ABI.
#ifndef REGROUP_HH
#define REGROUP_HH

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "regroup.h"

namespace regroup::abi {

// An error copied out of a regroup_error.
struct Error {
  regroup_status status = REGROUP_OK;
  std::string message;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT
  Result(Error error) : v_(std::move(error)) {}  // NOLINT
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() { return std::get<0>(v_); }
  const T& value() const { return std::get<0>(v_); }
  T& operator*() { return value(); }
  T* operator->() { return &value(); }
  const Error& error() const { return std::get<1>(v_); }
  regroup_status status() const { return ok() ? REGROUP_OK : error().status; }

 private:
  std::variant<T, Error> v_;
};

struct Unit {};

namespace detail {
struct ErrorDeleter {
  void operator()(regroup_error* e) const { regroup_error_free(e); }
};
struct StringDeleter {
  void operator()(char* s) const { regroup_string_free(s); }
};
struct EngineDeleter {
  void operator()(regroup_engine* e) const { regroup_engine_free(e); }
};

inline Error TakeError(regroup_status status, regroup_error* raw) {
  std::unique_ptr<regroup_error, ErrorDeleter> err(raw);
  return {status, err ? regroup_error_message(err.get()) : regroup_status_message(status)};
}

// Calls a C function whose trailing argument is regroup_error**.
template <typename F>
Result<Unit> Call(F&& f) {
  regroup_error* err = nullptr;
  regroup_status st = f(&err);
  if (st != REGROUP_OK) return TakeError(st, err);
  return Unit{};
}

// Calls a C function that writes a library-owned string to `out`.
template <typename F>
Result<std::string> CallString(F&& f) {
  char* out = nullptr;
  regroup_error* err = nullptr;
  regroup_status st = f(&out, &err);
  std::unique_ptr<char, StringDeleter> text(out);
  if (st != REGROUP_OK) return TakeError(st, err);
  return std::string(text ? text.get() : "");
}
}  // namespace detail

// A validation report and its status: REGROUP_OK or REGROUP_VALIDATION_FAILED both carry it.
struct Validation {
  regroup_status status = REGROUP_OK;
  std::string report;  // JSON
  std::string message;
};

inline Result<Validation> ValidateJob(std::string_view job_json) {
  char* out = nullptr;
  regroup_error* err = nullptr;
  regroup_status st = regroup_validate_job(&out, job_json.data(), job_json.size(), &err);
  std::unique_ptr<char, detail::StringDeleter> report(out);
  std::unique_ptr<regroup_error, detail::ErrorDeleter> error(err);
  if (st != REGROUP_OK && st != REGROUP_VALIDATION_FAILED)
    return Error{st, error ? regroup_error_message(error.get()) : ""};
  return Validation{st, report ? report.get() : "", error ? regroup_error_message(error.get()) : ""};
}

// Whether a job's label and annotation names make it Regroup's (regroup_job_has_keys).
inline Result<bool> JobHasKeys(const std::vector<std::string>& label_keys,
                               const std::vector<std::string>& annotation_keys) {
  std::vector<const char*> labels, annotations;
  for (const auto& k : label_keys) labels.push_back(k.c_str());
  for (const auto& k : annotation_keys) annotations.push_back(k.c_str());
  uint8_t has = 0;
  regroup_error* err = nullptr;
  regroup_status st = regroup_job_has_keys(&has, labels.data(), labels.size(), annotations.data(),
                                           annotations.size(), &err);
  if (st != REGROUP_OK) return detail::TakeError(st, err);
  return has != 0;
}

// A Volcano Job (YAML or JSON) read into {"job": <job spec>, "manager_tasks": [...]}
// (regroup_volcano_job_read).
inline Result<std::string> ReadVolcanoJob(std::string_view job) {
  return detail::CallString([&](char** out, regroup_error** err) {
    return regroup_volcano_job_read(out, job.data(), job.size(), err);
  });
}

class Engine {
 public:
  static Result<Engine> Create(const regroup_engine_options* options = nullptr) {
    regroup_engine* raw = nullptr;
    regroup_error* err = nullptr;
    regroup_status st = regroup_engine_new(&raw, options, &err);
    if (st != REGROUP_OK) return detail::TakeError(st, err);
    return Engine(raw);
  }

  regroup_engine* get() const { return e_.get(); }

  // Returns the validation report; the status is REGROUP_VALIDATION_FAILED on errors.
  Result<std::string> UpsertJob(std::string_view job_json, int64_t now_ms) {
    return detail::CallString([&](char** out, regroup_error** err) {
      return regroup_engine_upsert_job(get(), out, job_json.data(), job_json.size(), now_ms, err);
    });
  }
  Result<Unit> RemoveJob(const std::string& id) {
    return detail::Call([&](regroup_error** err) {
      return regroup_engine_remove_job(get(), id.c_str(), err);
    });
  }
  Result<Unit> ApplyEvents(std::string_view events_json, int64_t now_ms) {
    return detail::Call([&](regroup_error** err) {
      return regroup_engine_apply_events(get(), events_json.data(), events_json.size(), now_ms,
                                         err);
    });
  }
  Result<Unit> SetNodeHealth(const std::string& node, regroup_node_health health,
                             const std::string& reason, int64_t now_ms) {
    return detail::Call([&](regroup_error** err) {
      return regroup_engine_set_node_health(get(), node.c_str(), health, reason.c_str(), now_ms,
                                            err);
    });
  }
  Result<Unit> SetPodState(const std::string& job, uint32_t index, const std::string& uid,
                           regroup_pod_phase phase, const std::string& node, int64_t now_ms) {
    return detail::Call([&](regroup_error** err) {
      return regroup_engine_set_pod_state(get(), job.c_str(), index, uid.c_str(), phase,
                                          node.c_str(), now_ms, err);
    });
  }
  Result<uint32_t> Tick(int64_t now_ms) {
    uint32_t changed = 0;
    auto r = detail::Call([&](regroup_error** err) {
      return regroup_engine_tick(get(), now_ms, &changed, err);
    });
    if (!r) return r.error();
    return changed;
  }
  Result<regroup_decision> Decision(const std::string& job) {
    regroup_decision d = REGROUP_DECISION_INIT;
    auto r = detail::Call([&](regroup_error** err) {
      return regroup_engine_decision(get(), &d, job.c_str(), err);
    });
    if (!r) return r.error();
    return d;
  }
  Result<std::string> DecisionJson(const std::string& job) {
    return detail::CallString([&](char** out, regroup_error** err) {
      return regroup_engine_decision_json(get(), out, job.c_str(), err);
    });
  }
  Result<std::string> HistoryJson(const std::string& job) {
    return detail::CallString([&](char** out, regroup_error** err) {
      return regroup_engine_history_json(get(), out, job.c_str(), err);
    });
  }
  Result<std::vector<uint8_t>> FilterNodes(const std::string& job,
                                           const std::vector<std::string>& nodes) {
    std::vector<const char*> names;
    for (const auto& n : nodes) names.push_back(n.c_str());
    std::vector<uint8_t> out(nodes.size());
    auto r = detail::Call([&](regroup_error** err) {
      return regroup_engine_filter_nodes(get(), out.data(), job.c_str(), names.data(),
                                         names.size(), err);
    });
    if (!r) return r.error();
    return out;
  }
  Result<std::vector<int32_t>> ScoreNodes(const std::string& job, uint32_t pod,
                                          const std::vector<std::string>& nodes) {
    std::vector<const char*> names;
    for (const auto& n : nodes) names.push_back(n.c_str());
    std::vector<int32_t> out(nodes.size());
    auto r = detail::Call([&](regroup_error** err) {
      return regroup_engine_score_nodes(get(), out.data(), job.c_str(), pod, names.data(),
                                        names.size(), err);
    });
    if (!r) return r.error();
    return out;
  }
  Result<std::string> ExportJobState(const std::string& job) {
    return detail::CallString([&](char** out, regroup_error** err) {
      return regroup_engine_export_job_state(get(), out, job.c_str(), err);
    });
  }
  Result<Unit> ImportJobState(const std::string& job, std::string_view state) {
    return detail::Call([&](regroup_error** err) {
      return regroup_engine_import_job_state(get(), job.c_str(), state.data(), state.size(), err);
    });
  }
  Result<std::string> Snapshot() {
    return detail::CallString([&](char** out, regroup_error** err) {
      return regroup_engine_snapshot(get(), out, err);
    });
  }
  Result<Unit> Restore(std::string_view snapshot) {
    return detail::Call([&](regroup_error** err) {
      return regroup_engine_restore(get(), snapshot.data(), snapshot.size(), err);
    });
  }

 private:
  explicit Engine(regroup_engine* raw) : e_(raw) {}
  std::unique_ptr<regroup_engine, detail::EngineDeleter> e_;
};

}  // namespace regroup::abi

#endif  // REGROUP_HH
