// SPDX-License-Identifier: Apache-2.0
// `regroupctl simulate`: a job and a fault script run through the engine with a simulated clock.
//
// The simulation plays the parts around the engine with simple, stated rules: the scheduler
// (evicts what the engine says, places a replacement on the first healthy free node the job
// does not avoid), the kubelet and agents (a replacement registers a fixed delay after it is
// placed) and the manager (applies a directive after a short delay; training commits one step
// per step time while the generation is whole). Every decision is the engine's own.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/fault_script.h"
#include "plugin/engine.h"
#include "plugin/job_spec.h"

namespace regroup::cli {

struct SimulateOptions {
  int64_t step_ms = 1000;            // one training step
  int64_t register_delay_ms = 5000;  // a placed replacement's agent registers after this
  int64_t apply_delay_ms = 500;      // the manager forms a generation after this
  int64_t tick_ms = 100;             // the engine is ticked this often
  int64_t until_ms = -1;             // end; -1: 60 s after the last event and quiet
};

struct SimulateSummary {
  Phase final_phase = REGROUP_PHASE_RUNNING;
  int64_t final_dp = 0;
  int64_t original_dp = 0;
  int64_t committed_step = 0;
  int64_t ms_full = 0;       // training at full size
  int64_t ms_scaled_in = 0;  // training on fewer replicas
  int64_t ms_idle = 0;       // not training (fault, wait, generation forming)
  int64_t end_ms = 0;
  nlohmann::json history;    // the engine's decisions
};

// Runs the simulation, writing the timeline to `out`. Errors name a script line the job cannot
// take (a rank or pod it does not have).
StatusOr<SimulateSummary> Simulate(const JobSpec& spec, const std::vector<ScriptEvent>& script,
                                   const SimulateOptions& options, std::ostream& out);

}  // namespace regroup::cli
