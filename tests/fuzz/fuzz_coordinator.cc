// SPDX-License-Identifier: Apache-2.0
// fuzz_coordinator: manager streams through the coordinator's logic (Attachments, the part of
// plugin/coordinator.cc that is not gRPC: hello, fencing, facts, refusals, directives) over a real
// engine holding the two jobs of fuzz_events (default/train: pods p0..p3; default/other: o0..o3).
//
// The input is a sequence of records. A control byte with 0x20 set ticks the engine one second
// later and publishes; with 0x10 set (and not 0x20) it ends stream (control & 3); otherwise a
// 2-byte little-endian length follows, then that many bytes of a serialized
// regroup.v1.ManagerReport sent on stream (control & 3). Bytes that do not parse are skipped.
// After every record the harness checks what the coordinator sends (a directive or a refusal,
// each surviving a wire round trip, since proto3 strings must be UTF-8; every close with an
// error status; a refusal with a reason) and that each job is served by one stream at most.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "fuzz_common.h"
#include "plugin/attachments.h"
#include "plugin/engine.h"
#include "plugin/job_spec.h"

namespace {

namespace v1 = ::regroup::v1;
using regroup::coordinator::Attachments;

constexpr const char* kUidPrefix[] = {"p", "o"};
constexpr size_t kMaxRecords = 128;
constexpr uint64_t kStreams = 4;

void Check(const std::vector<Attachments::Outgoing>& out) {
  for (const auto& o : out) {
    if (o.stream == 0 || o.stream > kStreams)
      fuzz::Die("Attachments", "a message for stream " + std::to_string(o.stream));
    if (!o.message.has_directive() && !o.message.has_refusal() && !o.message.has_lease())
      fuzz::Die("Attachments", "a message that is neither a directive, a refusal nor a lease");
    if (o.close && o.status.ok()) fuzz::Die("Attachments", "a stream closed with an OK status");
    if (o.message.has_refusal() && o.message.refusal().reason().empty())
      fuzz::Die("Attachments", "a refusal without a reason");
    std::string wire;
    v1::CoordinatorDirective back;
    if (!o.message.SerializeToString(&wire) || !back.ParseFromString(wire))
      fuzz::Die("Attachments", "a message that does not survive the wire (invalid UTF-8?)");
  }
}

void CheckServing(const Attachments& attachments) {
  for (const char* job : fuzz::kIds) {
    const uint64_t serving = attachments.stream_of(job);
    if (serving != 0 && !attachments.attached(serving))
      fuzz::Die("Attachments", std::string(job) + " is served by a stream that is not attached");
  }
  if (attachments.attached_count() > kStreams)
    fuzz::Die("Attachments", "more attached streams than streams");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  regroup::EngineOptions options;
  options.max_jobs = 8;
  options.history_length = 16;
  regroup::Engine engine(options);
  for (size_t j = 0; j < 2; ++j) {
    auto spec = regroup::ParseJobSpec(std::string_view(fuzz::kJobs[j]));
    if (!spec.ok()) fuzz::Die("ParseJobSpec", spec.status().message());
    if (!engine.UpsertJob(std::move(*spec), nullptr, 0).ok())
      fuzz::Die("UpsertJob", "a seed job was refused");
    for (int64_t i = 0; i < 4; ++i)
      if (!engine
               .SetPodState(fuzz::kIds[j], i, kUidPrefix[j] + std::to_string(i), REGROUP_POD_RUNNING,
                            std::string(j ? "m" : "n") + std::to_string(i), 0)
               .ok())
        fuzz::Die("SetPodState", "a seed pod was refused");
  }
  std::shared_mutex mu;
  Attachments attachments(mu, engine);

  int64_t now = 1000;
  size_t at = 0;
  for (size_t records = 0; at < size && records < kMaxRecords; ++records) {
    const uint8_t control = data[at++];
    const uint64_t stream = (control & 0x03) + 1;
    if (control & 0x20) {
      now += 1000;
      {
        std::unique_lock lock(mu);
        engine.Tick(now);
      }
      Check(attachments.Publish());
    } else if (control & 0x10) {
      attachments.OnClosed(stream);
      if (attachments.attached(stream)) fuzz::Die("OnClosed", "the stream is still attached");
    } else {
      if (at + 2 > size) break;
      const size_t len = std::min<size_t>(data[at] | (size_t{data[at + 1]} << 8), size - at - 2);
      const uint8_t* body = data + at + 2;
      at += 2 + len;
      v1::ManagerReport report;
      if (report.ParseFromArray(body, static_cast<int>(len)))
        Check(attachments.OnReport(stream, report, now));
    }
    CheckServing(attachments);
  }
  // Past every deadline; then every stream ends.
  for (int64_t later : {now + 31000, now + 700000}) {
    {
      std::unique_lock lock(mu);
      engine.Tick(later);
    }
    Check(attachments.Publish());
  }
  for (uint64_t s = 1; s <= kStreams; ++s) attachments.OnClosed(s);
  if (attachments.attached_count() != 0) fuzz::Die("OnClosed", "streams left attached");
  return 0;
}
