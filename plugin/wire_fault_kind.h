// The engine's name of a wire fault kind (regroup.v1.FaultKind), shared by the coordinator in
// libregroup (protobuf lite) and the manager (full protobuf): header-only, so each includes the
// runtime.pb.h of its own protocol library.

#ifndef REGROUP_PLUGIN_WIRE_FAULT_KIND_H_
#define REGROUP_PLUGIN_WIRE_FAULT_KIND_H_

#include <string_view>

#include "regroup/v1/runtime.pb.h"

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
    default: return "";
  }
}

}  // namespace regroup

#endif  // REGROUP_PLUGIN_WIRE_FAULT_KIND_H_
