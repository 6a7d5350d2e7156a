// SPDX-License-Identifier: Apache-2.0
// Reading a Volcano Job (batch.volcano.sh/v1alpha1, kind Job) into the engine's job spec.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "plugin/job_spec.h"
#include "common/status.h"

namespace regroup {

// Builds a job spec from a Volcano Job YAML document: metadata labels and annotations; the
// training tasks' replicas as pods (a task named "manager", or running regroup-manager, is the
// job's manager and not a training pod); processes per pod from the workers' accelerator
// request, else `--nproc-per-node` in their command, else 1; the env of the rank-0 pod (the
// first training task's first container; only the variables the configuration table reads,
// MINDIO_WAIT_MINDX_TIME); spec.minAvailable and the job's and tasks' policies.
// Errors name the field and what it must be; nothing a YAML document holds can crash it.
StatusOr<JobSpec> JobSpecFromVolcanoYaml(std::string_view yaml);

// What ReadVolcanoJob found: the job spec, and which tasks of spec.tasks (by index) run the
// job's manager rather than training pods.
struct VolcanoJobReading {
  JobSpec spec;
  std::vector<size_t> manager_tasks;
};

struct VolcanoReadOptions {
  // A job whose tasks are all the manager's, or have no replicas, is read with `pods` 0 rather
  // than refused: a scheduler sees a job before its training pods are created. Such a spec is
  // not a valid job spec (ParseJobSpec wants pods from 1).
  bool allow_no_training_pods = false;
};

// JobSpecFromVolcanoYaml with the manager tasks named; the document may be YAML or JSON (the C
// ABI's regroup_volcano_job_read).
StatusOr<VolcanoJobReading> ReadVolcanoJob(std::string_view text, VolcanoReadOptions options = {});

// The checks every YAML document a user gives regroupctl passes before it is parsed: at most
// 4 MiB, no absurd nesting (yaml-cpp recurses per level), valid UTF-8. The error says which.
Status CheckYamlText(std::string_view yaml);

// Whether a job key of this source makes the job Regroup's: a key of the configuration table
// read from that source (MindCluster's labels and annotations, Regroup's annotations), or any
// label or annotation with Regroup's prefix (a misplaced or unknown one, which validation then
// reports). No env variable alone makes a job Regroup's. A scheduler asks this of every job it
// sees (regroup_job_has_keys) before it reads one.
bool MakesJobRegroups(KeySource source, std::string_view name);

// Whether a container resource counts as an accelerator, one process per device: its name
// holds "gpu", "npu" or "Ascend" (nvidia.com/gpu, huawei.com/Ascend910, ...).
bool IsAcceleratorResource(std::string_view name);

}  // namespace regroup
