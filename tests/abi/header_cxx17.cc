// SPDX-License-Identifier: Apache-2.0
// header_cxx17.cc: compiles abi/regroup.h and abi/regroup.hh as strict C++17 (-std=c++17
// -Wall -Wextra -pedantic -Werror, see CMakeLists.txt) and uses every macro of the header; run as
// a test, it also drives the C++ wrapper once through the shared library.
#include "regroup.hh"

#include <cstdio>
#include <cstring>
#include <string>

#include "regroup.h"  // a second include is harmless

namespace {

#define REGROUP_TEST_STATUS_ITEM(name, value, message) \
  static_assert(static_cast<int>(REGROUP_##name) == (value), "REGROUP_" #name);
REGROUP_STATUS_TABLE(REGROUP_TEST_STATUS_ITEM)
#undef REGROUP_TEST_STATUS_ITEM

static_assert(REGROUP_ABI_VERSION == ((REGROUP_ABI_VERSION_MAJOR << 16) | REGROUP_ABI_VERSION_MINOR),
              "REGROUP_ABI_VERSION");

int failures = 0;

void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "check failed: %s\n", what);
  ++failures;
}

constexpr const char kJob[] =
    R"({"id":"default/demo","uid":"u1","labels":{"fault-scheduling":"force"},)"
    R"("annotations":{"recover-strategy":"recover,elastic-training",)"
    R"("wait-reschedule-timeout":"30"},"pods":4,"processes_per_pod":2})";

}  // namespace

int main() {
  const regroup_engine_options options = REGROUP_ENGINE_OPTIONS_INIT;
  regroup_decision init = REGROUP_DECISION_INIT;
  const regroup_coordinator_options coordinator = REGROUP_COORDINATOR_OPTIONS_INIT;
  Check(coordinator.version == REGROUP_COORDINATOR_OPTIONS_VERSION && !coordinator.listen,
        "REGROUP_COORDINATOR_OPTIONS_INIT");
  Check(options.version == REGROUP_ENGINE_OPTIONS_VERSION, "REGROUP_ENGINE_OPTIONS_INIT");
  Check(init.version == REGROUP_DECISION_VERSION && init.deadline_ms == -1, "REGROUP_DECISION_INIT");
  Check(regroup_abi_version() >> 16 == REGROUP_ABI_VERSION_MAJOR, "the library's ABI major");

  auto validation = regroup::abi::ValidateJob(kJob);
  Check(validation.ok() && validation->status == REGROUP_OK, "ValidateJob(good job)");

  auto keys = regroup::abi::JobHasKeys({"fault-scheduling"}, {});
  Check(keys.ok() && *keys, "JobHasKeys(a MindCluster label)");
  auto read = regroup::abi::ReadVolcanoJob(
      R"({"kind":"Job","metadata":{"name":"t"},"spec":{"tasks":[{"replicas":2}]}})");
  Check(read.ok() && read->find("\"pods\":2") != std::string::npos, "ReadVolcanoJob");

  auto engine = regroup::abi::Engine::Create(&options);
  Check(engine.ok(), "Engine::Create");
  if (!engine) return 1;
  auto report = engine->UpsertJob(kJob, 0);
  Check(report.ok() && report->find("\"ok\":true") != std::string::npos, "UpsertJob");
  auto decision = engine->Decision("default/demo");
  Check(decision.ok() && decision->phase == REGROUP_PHASE_RUNNING, "Decision");
  auto missing = engine->DecisionJson("default/none");
  Check(!missing.ok() && missing.status() == REGROUP_NOT_FOUND && !missing.error().message.empty(),
        "DecisionJson(unknown job) is NOT_FOUND with a message");
  auto bad = engine->ApplyEvents("{", 0);
  Check(!bad.ok() && bad.status() == REGROUP_INVALID_ARGUMENT, "ApplyEvents(malformed)");

  if (failures) return 1;
  std::printf("regroup.h and regroup.hh compile as C++17\n");
  return 0;
}
