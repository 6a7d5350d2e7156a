// SPDX-License-Identifier: Apache-2.0
// The manager's side of Coordinator.Attach without threads, locks or gRPC, as AgentCore is the
// agent's: what a hello says, what the coordinator's answer to it means, the facts kept in order
// while detached, and the directives received. RemoteDecisions (remote_decisions.h) runs it on
// its threads over a gRPC stream, under its lock; tests drive it directly.
//
// Epochs are granted by the coordinator: the first hello asks for one (epoch 0), and every later
// hello reattaches as the epoch granted, with its ticket. An answer that attaches as another
// epoch is no attach. The directive the coordinator holds at the first attach was issued to an
// earlier incarnation: it is taken as seen, as is the one after a reattach whose ids went back
// (the coordinator's engine lost the job's state), unless it ends the job (an exit or a dump):
// that ends this incarnation too.
//
// A refusal naming an epoch above the one granted (the stream replaced by a newer manager's
// attach, or a reattach refused as older) fences this manager for good: it attaches no more,
// and its job control commits nothing more and stops its pods (Decisions::FencedBy).
//
// A fenced manager that is cut off from the coordinator does not hear that it is fenced: it
// commits only while it holds a lease (LeaseHeld), asked for on the hello and every quarter of
// a lease after it, and counted from when it asked, by its own clock. The coordinator grants a
// newer epoch no lease before the older one's has run out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>

#include "manager/job_control.h"

namespace regroup::manager {

class AttachCore {
 public:
  AttachCore(std::string job_id, size_t max_queued)
      : job_id_(std::move(job_id)), max_queued_(std::max<size_t>(max_queued, 2)) {}

  // A fact, after those reported before it. The latest progress replaces one waiting behind
  // another (never the one being written); beyond the bound the oldest not being written is
  // dropped. Returns true when this fact dropped one.
  bool Enqueue(v1::ManagerReport report);
  // The generation the next facts' headers name.
  void SetGeneration(uint64_t generation) { generation_ = generation; }

  // The facts' wire form (Decisions' calls, as the coordinator reads them).
  static v1::ManagerReport FaultReport(const v1::FaultFacts& fault);
  static v1::ManagerReport ReplacementReport(int64_t pod, const std::string& uid);
  static v1::ManagerReport SettledReport(uint64_t generation);
  static v1::ManagerReport ProgressReport(uint64_t generation, int64_t committed_step,
                                          uint32_t live_ranks);

  // The hello that opens a stream, sent at `now_ms`: epoch 0 asks for an epoch; later, the one
  // granted and its ticket. It asks for a lease too.
  v1::ManagerReport Hello(int64_t now_ms);
  // The coordinator's answer to the hello: "" when this manager is attached now, else why not
  // (a refusal, an epoch other than the one granted, an answer that is neither).
  std::string OnAnswer(const v1::CoordinatorDirective& first);
  // A later message of the attached stream: a directive, or a refusal of a fact.
  void OnMessage(const v1::CoordinatorDirective& message);
  // The stream ended (or is being ended): not attached until the next answer attaches.
  void Detached();
  // Why the last attempt failed; true when that is news (worth a line in the log).
  bool Failed(const std::string& why);

  // The writer's side: the next fact to write, marked as being written (nothing when none is
  // queued, or one is being written); then Written (it leaves the queue) or WriteFailed (it
  // stays first). A fact written is kept until the coordinator acknowledges it (applied_seq):
  // one that a broken stream lost on its way (a cut longer than the keepalive) is sent again
  // after the next attach, and the coordinator applies each number once. (To a coordinator
  // that acknowledges nothing, each fact is sent once, as before.)
  const v1::ManagerReport* NextToWrite();
  void Written();
  void WriteFailed();
  bool HasFactToWrite() const { return !writing_ && !queue_.empty(); }
  // Facts written and not yet acknowledged.
  size_t unacked() const { return unacked_.size(); }

  // The newest directive received and not yet returned.
  std::optional<Directive> Poll();
  // The newest directive received, taken as seen or not (Decisions::Standing).
  const std::optional<Directive>& Standing() const { return standing_; }

  // Queues a request for the lease when attached and a quarter of a lease has passed since the
  // last one (a second before the first grant); true when it queued one.
  bool RenewLease(int64_t now_ms);
  // How long until the next request is due (the writer wakes for it).
  int64_t LeaseRenewalIn(int64_t now_ms) const;
  // Whether this manager may commit a step at `now_ms`: a lease granted runs until then, and it
  // is not fenced.
  // (A coordinator that grants no leases, older than them, answers the hello without one: this
  // manager then commits as before leases, fenced only by a refusal.)
  bool LeaseHeld(int64_t now_ms) const {
    return !fenced_by_ && (leaseless_ || now_ms < lease_until_ms_);
  }
  int64_t lease_until_ms() const { return lease_until_ms_; }
  // "" while LeaseHeld, else why not, naming the coordinator `target` (Decisions::WhyNoCommit).
  std::string WhyNoCommit(int64_t now_ms, const std::string& target) const;

  bool attached() const { return attached_; }
  // Why the coordinator fenced this manager, or nothing.
  const std::optional<std::string>& fenced_by() const { return fenced_by_; }
  uint64_t epoch() const { return epoch_; }
  const v1::JobKeys& job_keys() const { return job_keys_; }
  const std::string& last_error() const { return last_error_; }
  size_t queued() const { return queue_.size(); }
  size_t dropped() const { return dropped_; }
  uint64_t attaches() const { return attaches_; }

 private:
  v1::Header MakeHeader() const;
  void OnDirective(const v1::CoordinatorDirective& message, bool first);
  // A refusal naming a newer epoch than the one granted fences this manager.
  void NoteRefusal(const v1::Refusal& refusal);
  void NoteLease(const v1::LeaseGrant& grant);
  // Puts what was written and not acknowledged first in line again (nothing is being written).
  void Requeue();
  // The coordinator applied every fact up to `applied`: they are kept no longer.
  void NoteAcks(const v1::CoordinatorDirective& message);
  int64_t RenewalPeriodMs() const;

  const std::string job_id_;
  const size_t max_queued_;
  std::deque<v1::ManagerReport> queue_;
  std::deque<v1::ManagerReport> unacked_;  // written, not yet acknowledged (in order)
  uint64_t next_seq_ = 0;                  // the last fact number given
  bool acking_ = false;                    // the coordinator acknowledges facts
  bool writing_ = false;           // the queue's front is being written
  bool requeue_after_write_ = false;  // detached during a write: re-queue once it ends
  bool attached_ = false;
  bool ever_attached_ = false;
  uint64_t attaches_ = 0;
  uint64_t generation_ = 0;        // the last generation reported, for headers
  uint64_t epoch_ = 0;             // granted at the first attach
  std::string ticket_;             // its ticket, sent with every later hello
  v1::JobKeys job_keys_;           // from the answer to the first hello
  uint64_t newest_id_ = 0;         // the highest directive id received
  std::optional<Directive> unseen_;  // received, not yet returned by Poll
  std::optional<Directive> standing_;  // the newest received, taken as seen or not
  std::string last_error_;
  size_t dropped_ = 0;
  std::optional<std::string> fenced_by_;
  int64_t lease_ms_ = 0;                 // the length of the last lease granted (0: none yet)
  int64_t lease_until_ms_ = 0;           // this manager's clock
  int64_t lease_asked_ms_ = -1;          // when the last request was queued (-1: never)
  bool leaseless_ = false;               // the coordinator answered the hello without a lease
  int64_t retry_in_ms_ = 1000;           // before a first grant: when to ask again
};

}  // namespace regroup::manager
