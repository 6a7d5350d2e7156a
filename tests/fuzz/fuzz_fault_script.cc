// SPDX-License-Identifier: Apache-2.0
// fuzz_fault_script: a fault script (text) through regroup::cli::ParseFaultScript, the reader
// of `regroupctl simulate`. A script it reads that ends within five simulated minutes is then
// simulated on a valid job, as `regroupctl simulate` does (the timeline goes nowhere), and the
// decision history is printed as `regroupctl simulate --json` prints it.
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <streambuf>
#include <string>
#include <string_view>

#include "cli/fault_script.h"
#include "cli/simulate.h"
#include "fuzz_common.h"
#include "plugin/job_spec.h"

namespace {

class NullBuffer : public std::streambuf {
 protected:
  int overflow(int c) override { return c; }
  std::streamsize xsputn(const char*, std::streamsize n) override { return n; }
};

constexpr const char* kJob =
    R"({"id":"default/sim","uid":"s1","labels":{"fault-scheduling":"force","fault-retry-times":"1"},)"
    R"("annotations":{"recover-strategy":"retry,recover-in-place,recover,elastic-training,dump",)"
    R"("wait-reschedule-timeout":"30","regroup.io/tensor-parallel":"2"},)"
    R"("pods":4,"processes_per_pod":2})";

constexpr int64_t kMaxSimulatedMs = 5 * 60 * 1000;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto script = regroup::cli::ParseFaultScript(text);
  if (!script.ok()) {
    if (script.status().message().empty())
      fuzz::Die("ParseFaultScript", "refused a script without a message");
    return 0;
  }
  for (const auto& e : *script) (void)regroup::cli::DescribeScriptEvent(e);
  if (script->size() > 64 || (!script->empty() && script->back().at_ms > kMaxSimulatedMs))
    return 0;

  static const regroup::JobSpec spec = [] {
    auto parsed = regroup::ParseJobSpec(std::string_view(kJob));
    if (!parsed.ok()) fuzz::Die("ParseJobSpec", parsed.status().message());
    return *parsed;
  }();
  NullBuffer null_buffer;
  std::ostream out(&null_buffer);
  regroup::cli::SimulateOptions options;
  options.tick_ms = 500;  // coarser than the CLI's 100 ms, so an input stays cheap
  auto summary = regroup::cli::Simulate(spec, *script, options, out);
  if (!summary.ok()) {
    if (summary.status().message().empty()) fuzz::Die("Simulate", "failed without a message");
    return 0;
  }
  // What `regroupctl simulate --json` prints (nlohmann's default, strict UTF-8 dump).
  const std::string history = summary->history.dump(2);
  return 0;
}
