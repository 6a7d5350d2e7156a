// SPDX-License-Identifier: Apache-2.0
// Facts that arrive on the wire (regroup.v1) as the engine's typed facts, for the coordinator
// (protobuf lite) and the manager's embedded engine (full protobuf): header-only, so each
// includes the wire.pb.h of its own protocol library.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>

#include "common/wire.h"
#include "plugin/engine.h"

namespace regroup {

// The fault a FaultFacts message reports, at `now`; nullopt when its kind is unspecified or not
// known to this build (the caller's error names the job). The step is -1 when not known.
template <typename FaultFacts>
std::optional<PendingFault> FaultFromWire(const FaultFacts& facts, int64_t now) {
  const std::optional<FaultKind> kind = ParseFaultKind(EngineFaultKind(facts.kind()));
  if (!kind) return std::nullopt;
  PendingFault fault;
  fault.kind = *kind;
  fault.pods.assign(facts.pods().begin(), facts.pods().end());
  fault.ranks.assign(facts.ranks().begin(), facts.ranks().end());
  fault.local_ranks.assign(facts.local_ranks().begin(), facts.local_ranks().end());
  fault.step = std::max<int64_t>(-1, facts.step());  // any negative step: not known
  fault.at_ms = now;
  fault.detail = facts.detail();
  return fault;
}

}  // namespace regroup
