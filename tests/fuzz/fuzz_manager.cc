// SPDX-License-Identifier: Apache-2.0
// fuzz_manager: agent streams through the manager's JobControl (manager/job_control.h), the
// part of regroup-manager that handles every agent message, with its embedded engine.
//
// The input is a sequence of records, like fuzz_coordinator's. A control byte with 0x20 set
// advances the clock by 100 ms and ticks; with 0x10 set (and not 0x20) stream (control & 3)
// disconnects; otherwise a 2-byte little-endian length follows, then that many bytes of a
// serialized regroup.v1.AgentMessage on stream (control & 3): its first accepted message must
// register. Bytes that do not parse are skipped. After every record the harness checks what the
// job control sends: only to node ranks the job has, every message with a body and this manager's
// epoch, every refusal with a reason, and a status report that always builds.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "fuzz_common.h"
#include "manager/job_control.h"

namespace {

namespace v1 = ::regroup::v1;
namespace rt = ::regroup::manager;

constexpr size_t kMaxRecords = 256;
constexpr uint64_t kEpoch = 7;

std::unique_ptr<rt::JobControl> NewJobControl() {
  regroup::JobSpec spec;
  spec.id = "default/fuzz";
  spec.uid = "f1";
  spec.pods = 4;
  spec.processes_per_pod = 2;
  spec.labels = {{"fault-scheduling", "force"}};
  spec.annotations = {{"recover-strategy", "retry,recover-in-place,recover,elastic-training,dump"},
                      {"wait-reschedule-timeout", "30"},
                      {"regroup.io/tensor-parallel", "2"},
                      {"regroup.io/global-batch-size", "64"},
                      {"regroup.io/micro-batch-size", "4"},
                      {"regroup.io/hang-timeout-min-s", "2"}};
  auto resolved = spec.Resolve();
  if (!resolved.ok()) fuzz::Die("NewJobControl", "the harness's job is invalid");
  rt::JobControlOptions options;
  options.epoch = kEpoch;
  options.join_window_ms = 1000;
  return std::make_unique<rt::JobControl>(spec, resolved.config, options,
                                          std::make_unique<rt::EmbeddedDecisions>(spec));
}

void Check(rt::JobControl& job) {
  for (const auto& o : job.TakeOutgoing()) {
    if (o.node_rank < 0 || o.node_rank >= 4)
      fuzz::Die("JobControl", "a message for node rank " + std::to_string(o.node_rank));
    if (o.message.body_case() == v1::ManagerMessage::BODY_NOT_SET)
      fuzz::Die("JobControl", "a message without a body");
    if (o.message.header().epoch() != kEpoch)
      fuzz::Die("JobControl", "a message with another epoch");
    if (o.message.has_start() && o.message.start().plan().world_size() == 0)
      fuzz::Die("JobControl", "a generation of no rank");
  }
  const auto status = job.StatusReport();
  if (status.nodes_size() != 4) fuzz::Die("JobControl", "a status without the job's 4 nodes");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto job = NewJobControl();
  std::map<uint64_t, bool> registered;
  int64_t now = 1000;
  size_t at = 0;
  for (size_t records = 0; at < size && records < kMaxRecords; ++records) {
    const uint8_t control = data[at++];
    const uint64_t stream = (control & 3) + 1;
    if (control & 0x20) {
      now += 100;
      job->Tick(now);
    } else if (control & 0x10) {
      job->Disconnected(stream, now);
      registered.erase(stream);
    } else {
      if (at + 2 > size) break;
      const size_t len = data[at] | (static_cast<size_t>(data[at + 1]) << 8);
      at += 2;
      if (at + len > size) break;
      v1::AgentMessage message;
      const bool parsed = message.ParseFromArray(data + at, static_cast<int>(len));
      at += len;
      if (!parsed) continue;
      if (!registered[stream] && message.has_register_()) {
        auto node = job->Register(stream, message.header(), message.register_(), now);
        if (node.ok()) {
          registered[stream] = true;
        } else if (node.status().message().empty()) {
          fuzz::Die("JobControl::Register", "a refusal without a reason");
        }
      } else {
        regroup::Status st = job->Handle(stream, message, now);
        if (!st.ok() && st.message().empty())
          fuzz::Die("JobControl::Handle", "a refusal without a reason");
        if (!st.ok() && job->MakeRefusal(st.message()).refusal().epoch() != kEpoch)
          fuzz::Die("JobControl::MakeRefusal", "a refusal without this manager's epoch");
      }
    }
    Check(*job);
  }
  return 0;
}
