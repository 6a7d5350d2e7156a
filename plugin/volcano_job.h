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
// first training task's first container); spec.minAvailable and the job's and tasks' policies.
// Errors name the field and what it must be; nothing a YAML document holds can crash it.
StatusOr<JobSpec> JobSpecFromVolcanoYaml(std::string_view yaml);

// The checks every YAML document a user gives regroupctl passes before it is parsed: at most
// 4 MiB, no absurd nesting (yaml-cpp recurses per level), valid UTF-8. The error says which.
Status CheckYamlText(std::string_view yaml);

// Whether a container resource counts as an accelerator, one process per device: its name
// holds "gpu", "npu" or "Ascend" (nvidia.com/gpu, huawei.com/Ascend910, ...).
bool IsAcceleratorResource(std::string_view name);

}  // namespace regroup
