// SPDX-License-Identifier: Apache-2.0
// The one mapping between the wire's enums (regroup.v1) and the engine's: fault kinds and
// directive kinds. Shared by the coordinator in libregroup (protobuf lite) and the manager (full
// protobuf): header-only, so each includes the wire.pb.h of its own protocol library.

#ifndef REGROUP_COMMON_WIRE_H_
#define REGROUP_COMMON_WIRE_H_

#include <optional>
#include <string_view>

#include "abi/regroup.h"
#include "regroup/v1/wire.pb.h"

namespace regroup {

// "" for FAULT_KIND_UNSPECIFIED and for a kind this build does not know.
inline std::string_view EngineFaultKind(int kind) {
  switch (kind) {
    case v1::FAULT_KIND_PROCESS_EXIT: return "process_exit";
    case v1::FAULT_KIND_HANG: return "hang";
    case v1::FAULT_KIND_COLLECTIVE_ERROR: return "collective_error";
    case v1::FAULT_KIND_DEVICE_ERROR: return "device_error";
    case v1::FAULT_KIND_POD_LOST: return "pod_lost";
    // Replicas disagree on their parameters: the step is done again, as after a failed
    // collective.
    case v1::FAULT_KIND_CHECKSUM_MISMATCH: return "collective_error";
    case v1::FAULT_KIND_STATE_LOST: return "state_lost";
    default: return "";
  }
}

// Directive kinds have the same numbers in the C ABI and on the wire; each is checked here, so a
// kind added to one and not the other fails the build.
#define REGROUP_SAME_DIRECTIVE_KIND(name)                                       \
  static_assert(static_cast<int>(REGROUP_DIRECTIVE_##name) ==                    \
                    static_cast<int>(v1::Directive::KIND_##name),                \
                "regroup_directive_kind and regroup.v1.Directive.Kind differ on " #name)
REGROUP_SAME_DIRECTIVE_KIND(CONTINUE);
REGROUP_SAME_DIRECTIVE_KIND(RETRY);
REGROUP_SAME_DIRECTIVE_KIND(RESTART_IN_PLACE);
REGROUP_SAME_DIRECTIVE_KIND(WAIT);
REGROUP_SAME_DIRECTIVE_KIND(RESUME);
REGROUP_SAME_DIRECTIVE_KIND(SCALE_IN);
REGROUP_SAME_DIRECTIVE_KIND(SCALE_OUT);
REGROUP_SAME_DIRECTIVE_KIND(DUMP);
REGROUP_SAME_DIRECTIVE_KIND(EXIT);
REGROUP_SAME_DIRECTIVE_KIND(RESTART_JOB);
#undef REGROUP_SAME_DIRECTIVE_KIND

// The wire's kind of an engine directive kind; nullopt for a value outside the enum.
inline std::optional<v1::Directive::Kind> DirectiveKindToWire(regroup_directive_kind kind) {
  switch (kind) {
    case REGROUP_DIRECTIVE_CONTINUE:
    case REGROUP_DIRECTIVE_RETRY:
    case REGROUP_DIRECTIVE_RESTART_IN_PLACE:
    case REGROUP_DIRECTIVE_WAIT:
    case REGROUP_DIRECTIVE_RESUME:
    case REGROUP_DIRECTIVE_SCALE_IN:
    case REGROUP_DIRECTIVE_SCALE_OUT:
    case REGROUP_DIRECTIVE_DUMP:
    case REGROUP_DIRECTIVE_EXIT:
    case REGROUP_DIRECTIVE_RESTART_JOB: return static_cast<v1::Directive::Kind>(kind);
  }
  return std::nullopt;
}

// The engine's kind of a wire directive kind; nullopt for a kind this build does not know (a
// newer coordinator's): the caller refuses the directive, never runs it as another kind.
inline std::optional<regroup_directive_kind> DirectiveKindFromWire(int kind) {
  switch (kind) {
    case v1::Directive::KIND_CONTINUE:
    case v1::Directive::KIND_RETRY:
    case v1::Directive::KIND_RESTART_IN_PLACE:
    case v1::Directive::KIND_WAIT:
    case v1::Directive::KIND_RESUME:
    case v1::Directive::KIND_SCALE_IN:
    case v1::Directive::KIND_SCALE_OUT:
    case v1::Directive::KIND_DUMP:
    case v1::Directive::KIND_EXIT:
    case v1::Directive::KIND_RESTART_JOB: return static_cast<regroup_directive_kind>(kind);
    default: return std::nullopt;
  }
}

}  // namespace regroup

#endif  // REGROUP_COMMON_WIRE_H_
