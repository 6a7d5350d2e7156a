// SPDX-License-Identifier: Apache-2.0
// The coordinator as the manager's decision maker (docs/design.md, "Who decides what"): the job
// control's facts go up one stream (Coordinator.Attach) to the coordinator beside the
// scheduler's engine, and the engine's directives come down it.
//
// A thread keeps the stream: it attaches (hello with the job), sends the facts in the order they
// were reported, and reconnects after any failure with a backoff of 100 ms doubling to 2 s, on a
// fresh channel once none attached for 15 s. Facts reported while detached are queued and sent,
// in order, after the
// next attach; a fact being written when the stream breaks may be lost, never sent twice (a
// fault counted twice could look like a poison step). A second thread reads the directives.
//
// The coordinator grants this manager's epoch (docs/design.md: epochs are granted by the
// authority, never taken from a flag): the first hello asks for one, and every later hello
// reattaches as the epoch granted, with its ticket. The job control must be built with that
// epoch (epoch()), so regroup-manager waits for the first attach before it serves its agents.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "manager/attach_core.h"
#include "manager/job_control.h"

namespace grpc {
class Channel;
class ClientContext;
}

namespace regroup::manager {

struct RemoteDecisionsOptions {
  std::string target;       // the coordinator, HOST:PORT (named in the log)
  // To the target, from MakeChannel: made by the caller, which reports a bad TLS file before
  // the manager starts instead of in this class's thread.
  std::shared_ptr<grpc::Channel> channel;
  // A fresh channel to the target, made when no attach succeeded for `fresh_channel_after`
  // (null: `channel` is kept). A new channel resolves the name and connects from scratch: a
  // client-side state that went bad (a stuck resolver, a subchannel in backoff) does not
  // outlive it.
  std::function<std::shared_ptr<grpc::Channel>()> make_channel;
  std::chrono::milliseconds fresh_channel_after{15000};
  // The channel is TLS: a connection the coordinator closes as it is made is named as a refused
  // handshake (DescribeCallFailure's over_tls), the coordinator's client CA refusing this one.
  bool tls = false;
  std::string credential;   // the job's token at the coordinator (regroupctl token)
  std::string job_id;
  std::chrono::milliseconds initial_backoff{100};
  std::chrono::milliseconds max_backoff{2000};
  size_t max_queued = 65536;  // facts kept while detached; the oldest are dropped beyond
};

// The coordinator's copy of the job's keys (RemoteDecisions::job_keys), taken into `spec`.
struct TakenKeys {
  bool taken = false;                    // false: the coordinator sent none; `spec` is unchanged
  std::vector<std::string> differences;  // what it replaced, one line each ("label x=1 (was 2)")
};
TakenKeys TakeJobKeys(const v1::JobKeys& keys, JobSpec& spec);

class RemoteDecisions final : public Decisions {
 public:
  // Starts attaching at once; never blocks.
  explicit RemoteDecisions(RemoteDecisionsOptions options);
  // Ends the stream and joins the threads (within the time a cancelled call takes to end).
  ~RemoteDecisions() override;
  RemoteDecisions(const RemoteDecisions&) = delete;
  RemoteDecisions& operator=(const RemoteDecisions&) = delete;

  // The scheduler reports pods to the engine itself; a replacement's new uid goes up with
  // ReplacementRegistered.
  void PodRunning(int64_t pod, const std::string& uid, const std::string& node,
                  int64_t now) override;
  void Fault(const v1::FaultFacts& fault, int64_t now) override;
  void FaultsSettled(uint64_t generation, int64_t now) override;
  void ReplacementRegistered(int64_t pod, const std::string& uid, int64_t now) override;
  void ReportProgress(uint64_t epoch, uint64_t generation, int64_t committed_step,
                      uint32_t live_ranks, int64_t now) override;
  // The engine ticks beside the scheduler: nothing to do here.
  void Tick(int64_t now) override;
  // The newest directive received and not yet returned. The directive the coordinator holds
  // when this manager first attaches was issued to an earlier incarnation: it is taken as seen.
  std::optional<Directive> Poll() override;
  std::optional<Directive> Standing() const override;
  // True while attached.
  bool Available() const override;
  // Once the coordinator fenced this manager (it serves a newer one): it attaches no more.
  std::optional<std::string> FencedBy() const override;
  bool ReplacesPods() const override { return true; }  // the scheduler recreates them
  // "" while the coordinator's lease holds (AttachCore::LeaseHeld), on a steady clock.
  std::string WhyNoCommit() const override;

  // Waits until attached (true) or until `timeout` passes (false).
  bool WaitAvailable(std::chrono::milliseconds timeout) const;
  // The epoch the coordinator granted this manager at its first attach; 0 until then.
  uint64_t epoch() const;
  // The job's keys as the coordinator's engine holds them (its labels, annotations, rank 0's
  // environment and sizes), from the answer to the first hello; empty until then.
  v1::JobKeys job_keys() const;
  // Why the last attempt to attach failed, or the last refusal of a fact; "" if none.
  std::string last_error() const;
  // Facts not sent yet.
  size_t queued() const;
  // Times this manager attached.
  uint64_t attaches() const;

 private:
  void Run();
  // A fresh channel when none attached for options_.fresh_channel_after; true if it made one.
  bool FreshChannel(int64_t& unattached_since_ms);
  void Enqueue(v1::ManagerReport report);
  void Fail(const std::string& what);  // holds mu_
  bool Sleep(std::chrono::milliseconds d);  // false when stopping

  const RemoteDecisionsOptions options_;
  std::shared_ptr<grpc::Channel> channel_;  // the attaching thread's own
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  AttachCore core_;                // the protocol; under mu_
  bool stopping_ = false;
  bool broken_ = false;            // the attached stream ended: the writer stops
  grpc::ClientContext* context_ = nullptr;  // the live call, cancelled on stop
  std::thread thread_;
};

}  // namespace regroup::manager
