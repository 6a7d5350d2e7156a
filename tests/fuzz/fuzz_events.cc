// SPDX-License-Identifier: Apache-2.0
// fuzz_events: event documents (JSON, one per line) through regroup_engine_apply_events.
//
// The engine holds two valid jobs whose pods run on n0..n3 and m0..m3. Line i of the input is
// applied at t = 1000 * (i + 1) and followed by a tick 250 ms later, so a sequence of lines can
// walk a job through faults, waits, scale-ins and scale-outs. Then the clock runs past every
// deadline, and every job must survive every read of the ABI and the round trips.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_common.h"

namespace {

constexpr const char* kStart =
    R"([{"type":"node","node":"n0","health":"healthy"},)"
    R"({"type":"pod","job":"default/train","index":0,"uid":"p0","phase":"running","node":"n0"},)"
    R"({"type":"pod","job":"default/train","index":1,"uid":"p1","phase":"running","node":"n1"},)"
    R"({"type":"pod","job":"default/train","index":2,"uid":"p2","phase":"running","node":"n2"},)"
    R"({"type":"pod","job":"default/train","index":3,"uid":"p3","phase":"running","node":"n3"},)"
    R"({"type":"pod","job":"default/other","index":0,"uid":"o0","phase":"running","node":"m0"},)"
    R"({"type":"pod","job":"default/other","index":1,"uid":"o1","phase":"running","node":"m1"},)"
    R"({"type":"pod","job":"default/other","index":2,"uid":"o2","phase":"running","node":"m2"},)"
    R"({"type":"pod","job":"default/other","index":3,"uid":"o3","phase":"running","node":"m3"}])";

constexpr size_t kMaxLines = 64;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  fuzz::Engine engine;
  for (const char* job : fuzz::kJobs) engine.MustUpsert(job);
  if (engine.Apply(kStart, 0) != REGROUP_OK) fuzz::Die("apply_events", "the start was refused");

  // The whole input as one document first: a single event or an array.
  (void)engine.Apply(input, 500);
  engine.Tick(750);

  int64_t now = 1000;
  size_t start = 0, lines = 0;
  while (start <= input.size() && lines < kMaxLines) {
    size_t end = input.find('\n', start);
    if (end == std::string_view::npos) end = input.size();
    const std::string_view line = input.substr(start, end - start);
    start = end + 1;
    ++lines;
    if (line.empty()) continue;
    (void)engine.Apply(line, now);
    engine.Tick(now + 250);
    now += 1000;
  }
  for (int64_t later : {now + 31000, now + 62000, now + 700000, now + 4000000}) engine.Tick(later);

  for (const char* id : fuzz::kIds) fuzz::ExerciseJob(engine, id, 4);
  fuzz::CheckSnapshotRoundTrip(engine);

  // The typed fast paths take C strings that are not JSON: the input's first bytes, raw, as a
  // node name, a reason and a pod uid (no round trip here: such names need not be UTF-8).
  const std::string raw(input.substr(0, std::min<size_t>(input.size(), 64)).data(),
                        std::min<size_t>(input.size(), 64));
  const std::string name = raw.c_str();  // up to the first NUL
  fuzz::Engine typed;
  typed.MustUpsert(fuzz::kJobs[0]);
  const regroup_node_health health =
      static_cast<regroup_node_health>(raw.empty() ? 1 : static_cast<uint8_t>(raw[0]) % 4);
  (void)FUZZ_CALL(regroup_engine_set_pod_state(typed.get(), fuzz::kIds[0], 0, name.c_str(),
                                               REGROUP_POD_RUNNING, name.c_str(), 0, &err));
  (void)FUZZ_CALL(regroup_engine_set_node_health(typed.get(), name.c_str(), health, name.c_str(),
                                                 1000, &err));
  (void)FUZZ_CALL(regroup_engine_set_node_health(typed.get(), name.c_str(), REGROUP_NODE_FAULTY,
                                                 nullptr, 1000, &err));
  typed.Tick(2000);
  fuzz::ExerciseJob(typed, fuzz::kIds[0], 4);
  (void)typed.Snapshot();
  return 0;
}
