// SPDX-License-Identifier: Apache-2.0
// For tests: the embedded engine's decisions, behind a class a test derives from to change one
// part (a lease it takes away, a tick it holds).
#pragma once

#include <optional>
#include <string>

#include "manager/job_control.h"

namespace regroup::manager {

class EngineDecisions : public Decisions {
 public:
  explicit EngineDecisions(const JobSpec& spec) : engine_(spec) {}
  void PodRunning(int64_t pod, const std::string& uid, const std::string& node,
                  int64_t now) override {
    engine_.PodRunning(pod, uid, node, now);
  }
  void Fault(const v1::FaultFacts& fault, int64_t now) override { engine_.Fault(fault, now); }
  void FaultsSettled(uint64_t generation, int64_t now) override {
    engine_.FaultsSettled(generation, now);
  }
  void ReplacementRegistered(int64_t pod, const std::string& uid, int64_t now) override {
    engine_.ReplacementRegistered(pod, uid, now);
  }
  void ReportProgress(uint64_t epoch, uint64_t generation, int64_t committed_step,
                      uint32_t live_ranks, int64_t now) override {
    engine_.ReportProgress(epoch, generation, committed_step, live_ranks, now);
  }
  void Tick(int64_t now) override { engine_.Tick(now); }
  std::optional<Directive> Poll() override { return engine_.Poll(); }

 private:
  EmbeddedDecisions engine_;
};

}  // namespace regroup::manager
