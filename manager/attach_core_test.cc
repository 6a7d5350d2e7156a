// SPDX-License-Identifier: Apache-2.0
// The manager's side of Coordinator.Attach, driven directly (no threads, no gRPC): the epoch
// granted and kept, the directives taken as seen, and the facts kept in order while detached.
// tests/coordinator_test.cc runs the same logic through RemoteDecisions against the real
// coordinator service.
#include "manager/attach_core.h"

#include <gtest/gtest.h>

#include <vector>

namespace regroup::manager {
namespace {

v1::CoordinatorDirective Answer(uint64_t epoch, uint64_t id,
                                v1::Directive::Kind kind = v1::Directive::KIND_CONTINUE,
                                const std::string& ticket = "ticket") {
  v1::CoordinatorDirective m;
  m.mutable_header()->set_epoch(epoch);
  m.mutable_directive()->set_id(id);
  m.mutable_directive()->set_kind(kind);
  m.set_epoch_ticket(ticket);
  m.mutable_job()->set_pods(4);
  return m;
}

v1::ManagerReport Progress(int64_t step) {
  v1::ManagerReport r;
  r.mutable_progress()->set_committed_step(step);
  return r;
}

v1::ManagerReport FaultReport(uint32_t rank) {
  v1::ManagerReport r;
  r.mutable_fault()->add_ranks(rank);
  return r;
}

TEST(AttachCore, TheFirstHelloAsksForAnEpochAndEveryLaterOneReattachesAsTheOneGranted) {
  AttachCore core("default/job", 16);
  EXPECT_EQ(core.Hello(0).hello().epoch(), 0u);
  EXPECT_EQ(core.Hello(0).header().job_id(), "default/job");
  EXPECT_EQ(core.OnAnswer(Answer(41, 7, v1::Directive::KIND_CONTINUE, "t41")), "");
  EXPECT_TRUE(core.attached());
  EXPECT_EQ(core.epoch(), 41u);
  EXPECT_EQ(core.job_keys().pods(), 4u);
  core.Detached();
  EXPECT_FALSE(core.attached());
  const v1::ManagerReport hello = core.Hello(0);
  EXPECT_EQ(hello.hello().epoch(), 41u);
  EXPECT_EQ(hello.hello().ticket(), "t41");
  EXPECT_EQ(hello.header().epoch(), 41u);
  // Attached as another epoch (a coordinator that granted a newer one meanwhile): no attach.
  EXPECT_EQ(core.OnAnswer(Answer(42, 9)),
            "the coordinator attached this manager as epoch 42, not the epoch 41 it was granted");
  EXPECT_FALSE(core.attached());
  EXPECT_EQ(core.epoch(), 41u) << "the epoch granted is kept";
  EXPECT_EQ(core.OnAnswer(Answer(41, 9)), "");
  EXPECT_EQ(core.attaches(), 2u);
}

TEST(AttachCore, ARefusalOrAnEmptyAnswerIsNoAttach) {
  AttachCore core("default/job", 16);
  v1::CoordinatorDirective refusal;
  refusal.mutable_refusal()->set_reason("manager epoch 5 is fenced: epoch 6 is attached");
  EXPECT_EQ(core.OnAnswer(refusal), "refused: manager epoch 5 is fenced: epoch 6 is attached");
  EXPECT_EQ(core.OnAnswer(v1::CoordinatorDirective()),
            "the coordinator answered the hello with neither a directive nor a refusal");
  EXPECT_EQ(core.OnAnswer(Answer(0, 1)),
            "the coordinator attached this manager as epoch 0, not the epoch 0 it was granted");
  EXPECT_FALSE(core.attached());
  EXPECT_EQ(core.attaches(), 0u);
}

TEST(AttachCore, TheDirectiveHeldAtTheFirstAttachWasAnEarlierIncarnationsAndIsTakenAsSeen) {
  AttachCore core("default/job", 16);
  ASSERT_EQ(core.OnAnswer(Answer(3, 12, v1::Directive::KIND_SCALE_IN)), "");
  EXPECT_FALSE(core.Poll().has_value());
  core.OnMessage(Answer(3, 12, v1::Directive::KIND_SCALE_IN));
  EXPECT_FALSE(core.Poll().has_value()) << "the same id again is nothing new";
  core.OnMessage(Answer(3, 13, v1::Directive::KIND_RETRY));
  const auto d = core.Poll();
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->id, 13u);
  EXPECT_EQ(d->kind, REGROUP_DIRECTIVE_RETRY);
  EXPECT_FALSE(core.Poll().has_value()) << "returned once";
  // Two directives before a poll: only the newest is run.
  core.OnMessage(Answer(3, 14, v1::Directive::KIND_WAIT));
  core.OnMessage(Answer(3, 15, v1::Directive::KIND_RESUME));
  ASSERT_EQ(core.Poll()->id, 15u);
}

TEST(AttachCore, AfterAReattachANewerDirectiveIsRunAndIdsThatWentBackAreTakenAsSeen) {
  AttachCore core("default/job", 16);
  ASSERT_EQ(core.OnAnswer(Answer(3, 12)), "");
  core.Detached();
  // Issued while detached: the answer to the reattach carries it, and it is run.
  ASSERT_EQ(core.OnAnswer(Answer(3, 14, v1::Directive::KIND_SCALE_OUT)), "");
  ASSERT_EQ(core.Poll()->kind, REGROUP_DIRECTIVE_SCALE_OUT);
  core.Detached();
  // The coordinator's engine lost the job's state (its ids start again): not run, and the ids
  // that follow count from there.
  ASSERT_EQ(core.OnAnswer(Answer(3, 2, v1::Directive::KIND_SCALE_IN)), "");
  EXPECT_FALSE(core.Poll().has_value());
  core.OnMessage(Answer(3, 3, v1::Directive::KIND_RETRY));
  EXPECT_EQ(core.Poll()->id, 3u);
}

// Simulation seed 7481 with a coordinator: the engine decided the job's exit for a manager that
// crashed before it carried it out; its successor took the exit as seen, and the job never
// ended. The end of the job is run by whichever incarnation finds it.
TEST(AttachCore, AnExitOrADumpHeldAtTheFirstAttachIsRun) {
  for (auto kind : {v1::Directive::KIND_EXIT, v1::Directive::KIND_DUMP}) {
    AttachCore core("default/job", 16);
    ASSERT_EQ(core.OnAnswer(Answer(3, 12, kind)), "");
    const auto d = core.Poll();
    ASSERT_TRUE(d.has_value()) << v1::Directive::Kind_Name(kind);
    EXPECT_EQ(d->id, 12u);
    EXPECT_FALSE(core.Poll().has_value()) << "returned once";
  }
}

TEST(AttachCore, ADirectiveOfAKindThisBuildDoesNotKnowIsRefusedNotRunAsAnother) {
  AttachCore core("default/job", 16);
  ASSERT_EQ(core.OnAnswer(Answer(3, 1)), "");
  core.OnMessage(Answer(3, 2, static_cast<v1::Directive::Kind>(42)));
  EXPECT_FALSE(core.Poll().has_value());
  core.OnMessage(Answer(3, 3, v1::Directive::KIND_DUMP));
  EXPECT_EQ(core.Poll()->kind, REGROUP_DIRECTIVE_DUMP);
}

TEST(AttachCore, ARefusalOfAFactIsTheLastErrorAndChangesNothingElse) {
  AttachCore core("default/job", 16);
  ASSERT_EQ(core.OnAnswer(Answer(3, 1)), "");
  v1::CoordinatorDirective refusal;
  refusal.mutable_refusal()->set_reason("rank 9 is not in job default/job");
  core.OnMessage(refusal);
  EXPECT_EQ(core.last_error(), "the coordinator refused: rank 9 is not in job default/job");
  EXPECT_TRUE(core.attached());
  EXPECT_TRUE(core.Failed("the stream ended (UNAVAILABLE)"));
  EXPECT_FALSE(core.Failed("the stream ended (UNAVAILABLE)")) << "the same failure is no news";
}

v1::CoordinatorDirective Refusal(uint64_t epoch, const std::string& reason) {
  v1::CoordinatorDirective m;
  m.mutable_header()->set_epoch(epoch);
  m.mutable_refusal()->set_epoch(epoch);
  m.mutable_refusal()->set_reason(reason);
  return m;
}

// A refusal naming a newer epoch than the one granted: a newer manager attached (this stream
// was replaced), or the coordinator serves one (a reattach refused as older). Fenced for good.
TEST(AttachCore, ARefusalNamingANewerEpochFencesThisManagerForGood) {
  AttachCore core("default/job", 16);
  EXPECT_EQ(core.OnAnswer(Refusal(9, "no job default/job in the engine")),
            "refused: no job default/job in the engine");
  EXPECT_FALSE(core.fenced_by()) << "a manager granted no epoch yet is fenced by nobody";
  ASSERT_EQ(core.OnAnswer(Answer(41, 1)), "");
  core.OnMessage(Refusal(41, "rank 9 is not in job default/job"));
  EXPECT_FALSE(core.fenced_by()) << "a refused fact fences nothing";
  core.OnMessage(Refusal(42, "fenced: manager epoch 42 of job default/job attached on a new "
                             "stream and replaces this one (epoch 41)"));
  ASSERT_TRUE(core.fenced_by());
  EXPECT_EQ(*core.fenced_by(),
            "the coordinator serves manager epoch 42 of job default/job, newer than this one's "
            "(epoch 41): fenced: manager epoch 42 of job default/job attached on a new stream "
            "and replaces this one (epoch 41)");
  AttachCore reattached("default/job", 16);
  ASSERT_EQ(reattached.OnAnswer(Answer(41, 1)), "");
  reattached.Detached();
  EXPECT_NE(reattached.OnAnswer(Refusal(43, "fenced: manager epoch 41 of job default/job is older "
                                            "than epoch 43")),
            "");
  EXPECT_TRUE(reattached.fenced_by());
}

TEST(AttachCore, FactsAreWrittenInOrderEachOnceAndTheLatestProgressReplacesAWaitingOne) {
  AttachCore core("default/job", 16);
  core.SetGeneration(4);
  core.Enqueue(FaultReport(1));
  core.Enqueue(Progress(10));
  core.Enqueue(Progress(11));  // replaces step 10, waiting behind the fault
  ASSERT_EQ(core.queued(), 2u);
  const v1::ManagerReport* next = core.NextToWrite();
  ASSERT_NE(next, nullptr);
  EXPECT_TRUE(next->has_fault());
  EXPECT_EQ(next->header().generation(), 4u);
  EXPECT_EQ(core.NextToWrite(), nullptr) << "one is being written";
  core.WriteFailed();  // the stream broke: it stays first, to be written after the reattach
  next = core.NextToWrite();
  ASSERT_TRUE(next && next->has_fault());
  core.Written();
  next = core.NextToWrite();
  ASSERT_TRUE(next && next->has_progress());
  EXPECT_EQ(next->progress().committed_step(), 11);
  // A progress reported while one is being written never replaces that one.
  core.Enqueue(Progress(12));
  EXPECT_EQ(core.queued(), 2u);
  core.Written();
  EXPECT_EQ(core.NextToWrite()->progress().committed_step(), 12);
  core.Written();
  EXPECT_EQ(core.queued(), 0u);
  EXPECT_EQ(core.NextToWrite(), nullptr);
}

TEST(AttachCore, BeyondTheBoundTheOldestFactNotBeingWrittenIsDropped) {
  AttachCore core("default/job", 3);
  core.Enqueue(FaultReport(0));
  ASSERT_NE(core.NextToWrite(), nullptr);  // fault 0 is being written
  EXPECT_FALSE(core.Enqueue(FaultReport(1)));
  EXPECT_FALSE(core.Enqueue(FaultReport(2)));
  EXPECT_TRUE(core.Enqueue(FaultReport(3)));  // drops fault 1, not fault 0
  EXPECT_EQ(core.dropped(), 1u);
  EXPECT_EQ(core.queued(), 3u);
  core.Written();
  EXPECT_EQ(core.NextToWrite()->fault().ranks(0), 2u);
}

// The answer of a coordinator that acknowledges facts (epoch 41, directive 7).
v1::CoordinatorDirective AckingAnswer() {
  v1::CoordinatorDirective m = Answer(41, 7);
  m.set_acks_facts(true);
  return m;
}

// A fact written down a stream that broke before the coordinator read it (a cut longer than the
// keepalive) is sent again after the next attach, until acknowledged; one acknowledged is not.
TEST(AttachCore, AFactWrittenAndNotAcknowledgedIsSentAgainAfterTheNextAttach) {
  AttachCore core("default/job", 16);
  v1::CoordinatorDirective answer = AckingAnswer();
  ASSERT_EQ(core.OnAnswer(answer), "");
  core.Enqueue(FaultReport(1));
  core.Enqueue(FaultReport(2));
  core.Enqueue(FaultReport(3));
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    const v1::ManagerReport* next = core.NextToWrite();
    ASSERT_NE(next, nullptr);
    EXPECT_EQ(next->seq(), seq) << "facts are numbered in order from 1";
    core.Written();
  }
  EXPECT_EQ(core.unacked(), 3u);
  v1::CoordinatorDirective ack;
  ack.set_acks_facts(true);
  ack.set_applied_seq(1);
  core.OnMessage(ack);
  EXPECT_EQ(core.unacked(), 2u) << "fault 1 was applied";
  core.Detached();  // the stream broke: faults 2 and 3 may have been lost with it
  EXPECT_EQ(core.queued(), 2u);
  answer.set_applied_seq(2);  // the coordinator had read fault 2 before the break
  ASSERT_EQ(core.OnAnswer(answer), "");
  const v1::ManagerReport* next = core.NextToWrite();
  ASSERT_NE(next, nullptr);
  EXPECT_EQ(next->seq(), 3u) << "only what no acknowledgment covers is sent again";
  EXPECT_EQ(next->fault().ranks(0), 3u);
  core.Written();
  EXPECT_EQ(core.NextToWrite(), nullptr);
}

// RemoteDecisions' reader may see the stream end while its writer is writing a fact: the facts
// written before it and not acknowledged go again first, in their order (sent after it, the
// coordinator would take them for applied: it applies a number at most once, in order).
TEST(AttachCore, FactsAreSentAgainInTheirOrderWhenTheStreamEndsDuringAWrite) {
  AttachCore core("default/job", 16);
  v1::CoordinatorDirective answer = AckingAnswer();
  ASSERT_EQ(core.OnAnswer(answer), "");
  core.Enqueue(FaultReport(1));
  core.Enqueue(FaultReport(2));
  ASSERT_NE(core.NextToWrite(), nullptr);
  core.Written();                           // fault 1: written, not acknowledged
  ASSERT_NE(core.NextToWrite(), nullptr);   // fault 2: being written...
  core.Detached();                          // ...when the reader sees the end
  core.WriteFailed();
  ASSERT_EQ(core.OnAnswer(answer), "");
  std::vector<uint64_t> order;
  while (const v1::ManagerReport* next = core.NextToWrite()) {
    order.push_back(next->seq());
    core.Written();
  }
  EXPECT_EQ(order, (std::vector<uint64_t>{1, 2}));
}

// A coordinator older than acknowledgments: each fact is sent once, as before.
TEST(AttachCore, ToACoordinatorThatAcknowledgesNothingEachFactIsSentOnce) {
  AttachCore core("default/job", 16);
  ASSERT_EQ(core.OnAnswer(Answer(41, 7)), "");
  core.Enqueue(FaultReport(1));
  ASSERT_NE(core.NextToWrite(), nullptr);
  core.Written();
  EXPECT_EQ(core.unacked(), 0u);
  core.Detached();
  EXPECT_EQ(core.queued(), 0u);
}

v1::CoordinatorDirective Lease(int64_t sent_ms, int64_t lease_ms, int64_t wait_ms = 0) {
  v1::CoordinatorDirective m;
  m.mutable_header()->set_epoch(41);
  m.mutable_lease()->set_sent_ms(sent_ms);
  m.mutable_lease()->set_lease_ms(lease_ms);
  m.mutable_lease()->set_wait_ms(wait_ms);
  return m;
}

// A manager cut off from the coordinator never hears that it was replaced: it commits only
// within its lease, counted from when it asked, by its own clock.
TEST(AttachCore, ThisManagerCommitsOnlyWithinALeaseCountedFromWhenItAsked) {
  AttachCore core("default/job", 16);
  EXPECT_FALSE(core.LeaseHeld(0)) << "no lease before the first grant";
  EXPECT_FALSE(core.RenewLease(0)) << "nothing is asked while detached";
  const v1::ManagerReport hello = core.Hello(1000);
  EXPECT_EQ(hello.lease().sent_ms(), 1000);
  v1::CoordinatorDirective answer = Answer(41, 7);
  *answer.mutable_lease() = Lease(1000, 10000).lease();
  ASSERT_EQ(core.OnAnswer(answer), "");
  EXPECT_TRUE(core.LeaseHeld(10999));
  EXPECT_FALSE(core.LeaseHeld(11000)) << "counted from the hello, not from the answer";
  // Asked again every quarter of a lease while attached.
  EXPECT_EQ(core.LeaseRenewalIn(1500), 2000);
  EXPECT_FALSE(core.RenewLease(3499));
  ASSERT_TRUE(core.RenewLease(3500));
  ASSERT_EQ(core.queued(), 1u);
  EXPECT_EQ(core.NextToWrite()->lease().sent_ms(), 3500);
  EXPECT_EQ(core.NextToWrite(), nullptr) << "one is being written";
  core.Written();
  core.OnMessage(Lease(3500, 10000));
  EXPECT_TRUE(core.LeaseHeld(13499));
  EXPECT_FALSE(core.LeaseHeld(13500));
  // A request still waiting to be written is replaced by a newer one (it is worth as much).
  ASSERT_TRUE(core.RenewLease(6000));
  ASSERT_TRUE(core.RenewLease(8500));
  EXPECT_EQ(core.queued(), 1u);
  EXPECT_EQ(core.NextToWrite()->lease().sent_ms(), 8500);
  core.Written();
  // No lease yet (an older manager's runs), and a grant for a request never sent: nothing.
  core.OnMessage(Lease(8500, 0, 4000));
  core.OnMessage(Lease(90000, 10000));
  EXPECT_FALSE(core.LeaseHeld(13500));
  // Fenced, it holds none, whatever it was granted.
  core.OnMessage(Lease(8500, 10000));
  EXPECT_TRUE(core.LeaseHeld(18499));
  v1::CoordinatorDirective refusal;
  refusal.mutable_refusal()->set_epoch(42);
  refusal.mutable_refusal()->set_reason("fenced: manager epoch 42 attached");
  core.OnMessage(refusal);
  EXPECT_FALSE(core.LeaseHeld(9000));
  EXPECT_FALSE(core.RenewLease(20000));
}

// A coordinator older than leases answers the hello without one: the manager commits as before.
TEST(AttachCore, ACoordinatorThatGrantsNoLeasesLeavesCommitsAsBefore) {
  AttachCore core("default/job", 16);
  (void)core.Hello(1000);
  ASSERT_EQ(core.OnAnswer(Answer(41, 7)), "");
  EXPECT_TRUE(core.LeaseHeld(1000000));
  EXPECT_FALSE(core.RenewLease(1000000)) << "nothing to ask it for";
}

}  // namespace
}  // namespace regroup::manager
