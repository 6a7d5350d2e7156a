// SPDX-License-Identifier: Apache-2.0

package volcano

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"

	"volcano.sh/apis/pkg/apis/scheduling"
	schedulingv1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"
	"volcano.sh/volcano/pkg/scheduler/api"
	"volcano.sh/volcano/pkg/scheduler/conf"
	"volcano.sh/volcano/pkg/scheduler/framework"
	"volcano.sh/volcano/pkg/scheduler/uthelper"
	"volcano.sh/volcano/pkg/scheduler/util"

	"github.com/regroup-dev/regroup/go/regroup"
)

// runningElasticJob: job "train" of 4 one-rank pods (dp=4, elastic minimum 2) on n1..n4.
func runningElasticJob(t *testing.T, extraNodes ...string) *world {
	w := newWorld(t)
	for _, n := range []string{"n1", "n2", "n3", "n4"} {
		w.addNode(n, 8)
	}
	for _, n := range extraNodes {
		w.addNode(n, 8)
	}
	labels, annotations := elasticKeys()
	w.addJob("train", 2, labels, annotations, 8, "n1", "n2", "n3", "n4")
	s := w.run(defaultActions())
	if len(s.bound) != 0 || len(s.released) != 0 {
		t.Fatalf("a running job with healthy nodes: bound %v, released %v; want nothing", s.bound, s.released)
	}
	if d := w.decision("train"); d.Phase != regroup.PhaseRunning || d.DP != 4 {
		t.Fatalf("decision %+v; want running at dp=4", d)
	}
	return w
}

func TestFaultyNodePodsAreEvictedAsFaultSchedulingSays(t *testing.T) {
	for _, tc := range []struct {
		mode    string
		evicted []recordedEviction
	}{
		{"force", []recordedEviction{{"default/train-worker-2", regroup.EvictForce}}},
		{"grace", []recordedEviction{{"default/train-worker-2", regroup.EvictGrace}}},
		{"off", nil},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			w := newWorld(t)
			for _, n := range []string{"n1", "n2", "n3", "n4", "n5"} {
				w.addNode(n, 8)
			}
			labels, annotations := elasticKeys()
			labels["fault-scheduling"] = tc.mode
			w.addJob("train", 2, labels, annotations, 8, "n1", "n2", "n3", "n4")
			w.run(defaultActions())

			w.clock.set(t0 + 1000)
			w.setReady("n3", v1.ConditionFalse)
			s := w.run(defaultActions())
			if got := w.rec.takeEvictions(); !reflect.DeepEqual(got, tc.evicted) {
				t.Errorf("evictions %v; want %v", got, tc.evicted)
			}
			wantReleased := []string(nil)
			if tc.evicted != nil {
				wantReleased = []string{"default/train-worker-2"}
			}
			if !reflect.DeepEqual(s.released, wantReleased) {
				t.Errorf("released in the session %v; want %v", s.released, wantReleased)
			}
			// Evicted once: the next session does not evict the releasing pod again.
			w.clock.set(t0 + 2000)
			w.run(defaultActions())
			if got := w.rec.takeEvictions(); len(got) != 0 {
				t.Errorf("evicted again: %v", got)
			}
		})
	}
}

// Found on the real control plane (scenario 6): a training pod that failed (restartPolicy Never)
// stays failed, and Volcano's job controller creates again only a pod that is gone. The plugin
// deletes it; the job controller's new pod is bound.
func TestAFailedPodIsDeletedAndItsReplacementBound(t *testing.T) {
	w := runningElasticJob(t, "n5")
	w.clock.set(t0 + 1000)
	w.pods["train-worker-2"].Status.Phase = v1.PodFailed
	w.run(defaultActions())
	if got, want := w.rec.takeEvictions(), []recordedEviction{{"default/train-worker-2", regroup.EvictForce}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("evictions %v; want %v", got, want)
	}
	if ev := w.rec.eventsWithReason(ReasonEvict); len(ev) != 1 ||
		!strings.Contains(ev[0].message, "failed on node n3; deleted, so that the job controller creates it again") {
		t.Errorf("events %v; want the deletion said", ev)
	}
	w.replace("train-worker-2")
	w.clock.set(t0 + 2000)
	s := w.run(defaultActions())
	if len(s.bound) != 1 || s.bound["default/train-worker-2"] == "" {
		t.Errorf("bound %v; want the replacement of train-worker-2", s.bound)
	}
}

func TestTheStateIsSavedBeforeAnyEviction(t *testing.T) {
	w := runningElasticJob(t, "n5")
	w.rec.mu.Lock()
	w.rec.effects = nil
	w.rec.mu.Unlock()
	w.clock.set(t0 + 1000)
	w.setReady("n3", v1.ConditionFalse)
	w.run(defaultActions())
	w.rec.mu.Lock()
	effects := append([]string(nil), w.rec.effects...)
	w.rec.mu.Unlock()
	pg := ""
	for key := range w.rec.states {
		pg = key
	}
	if want := []string{"save " + pg, "evict default/train-worker-2"}; !reflect.DeepEqual(effects, want) {
		t.Fatalf("effects %v; want %v: a restarted scheduler must find the decision that evicted", effects, want)
	}
}

func TestNoEvictionInASessionWhoseSaveFailed(t *testing.T) {
	w := runningElasticJob(t, "n5")
	w.rec.mu.Lock()
	w.rec.saveErr = errors.New("the annotation is too large")
	w.rec.mu.Unlock()
	w.clock.set(t0 + 1000)
	w.setReady("n3", v1.ConditionFalse)
	s := w.run(defaultActions())
	if got := w.rec.takeEvictions(); len(got) != 0 || len(s.released) != 0 {
		t.Fatalf("evicted %v (released %v) although the state was not saved", got, s.released)
	}
	// The next session saves, then evicts.
	w.rec.mu.Lock()
	w.rec.saveErr = nil
	w.rec.mu.Unlock()
	w.clock.set(t0 + 2000)
	w.run(defaultActions())
	want := []recordedEviction{{"default/train-worker-2", regroup.EvictForce}}
	if got := w.rec.takeEvictions(); !reflect.DeepEqual(got, want) {
		t.Fatalf("evictions once the save works %v; want %v", got, want)
	}
}

func TestReplacementBindsToAHealthyNodeNeverTheFaultyOne(t *testing.T) {
	w := runningElasticJob(t, "n5")
	// n3 is labelled faulty: schedulable to Kubernetes, faulty to Regroup.
	w.clock.set(t0 + 1000)
	w.nodes["n3"].Labels["regroup.io/health"] = "faulty"
	s := w.run(defaultActions())
	if !reflect.DeepEqual(s.released, []string{"default/train-worker-2"}) {
		t.Fatalf("released %v; want train-worker-2 (on the faulty node)", s.released)
	}
	w.clock.set(t0 + 2000)
	w.replace("train-worker-2")
	s = w.run(defaultActions())
	// n3 is free, and the pod's previous node, which node order prefers; the predicate keeps it off.
	if want := map[string]string{"default/train-worker-2": "n5"}; !reflect.DeepEqual(s.bound, want) {
		t.Errorf("bound %v; want %v", s.bound, want)
	}
	if d := w.decision("train"); d.Phase != regroup.PhaseWaiting {
		t.Errorf("phase %v; want waiting for the replacement to register", d.Phase)
	}
}

func TestDeletedPodsReplacementReturnsToItsPreviousNode(t *testing.T) {
	// The control of the test above: with n3 healthy, node order sends the replacement back to
	// the pod's previous node, out of two free nodes.
	w := runningElasticJob(t, "n5")
	w.clock.set(t0 + 1000)
	w.replace("train-worker-2") // deleted (not failed): its node is not avoided
	s := w.run(defaultActions())
	if want := map[string]string{"default/train-worker-2": "n3"}; !reflect.DeepEqual(s.bound, want) {
		t.Errorf("bound %v; want %v (the previous node)", s.bound, want)
	}
}

// lostPodWithoutCapacity: n3 fails, its pod is evicted and replaced, and no node can take the
// replacement. It returns the world at the session that decided to wait, and the deadline.
func lostPodWithoutCapacity(t *testing.T) (*world, int64) {
	w := runningElasticJob(t)
	w.addNode("small", 2)
	w.clock.set(t0 + 1000)
	w.setReady("n3", v1.ConditionFalse)
	w.run(defaultActions())
	w.clock.set(t0 + 2000)
	w.replace("train-worker-2")
	s := w.run(defaultActions())
	if len(s.bound) != 0 {
		t.Fatalf("bound %v with no capacity", s.bound)
	}
	d := w.decision("train")
	if d.Phase != regroup.PhaseWaiting || d.Kind != regroup.DirectiveWait {
		t.Fatalf("decision %+v; want waiting for the replacement", d)
	}
	if want := t0 + 2000 + 60_000; d.DeadlineMs != want {
		t.Fatalf("deadline %d; want now + wait-reschedule-timeout = %d", d.DeadlineMs, want)
	}
	return w, d.DeadlineMs
}

func TestWaitRescheduleTimeoutExpiresOnTheInjectedClock(t *testing.T) {
	w, deadline := lostPodWithoutCapacity(t)
	w.clock.set(deadline - 1)
	w.run(defaultActions())
	if d := w.decision("train"); d.Phase != regroup.PhaseWaiting {
		t.Fatalf("1 ms before the deadline: phase %v; want waiting", d.Phase)
	}
	w.clock.set(deadline)
	w.run(defaultActions())
	d := w.decision("train")
	if d.Phase != regroup.PhaseScaledIn || d.Kind != regroup.DirectiveScaleIn || d.DP != 3 {
		t.Fatalf("at the deadline: %+v; want scale_in to dp=3", d)
	}
}

func TestNoCapacityJobStaysReadySmallerAndScalesOutWhenCapacityReturns(t *testing.T) {
	w, deadline := lostPodWithoutCapacity(t)
	w.clock.set(deadline)
	w.run(defaultActions())
	if d := w.decision("train"); d.Phase != regroup.PhaseScaledIn || d.GangMin != 3 {
		t.Fatalf("decision %+v; want scaled in, gang minimum 3", w.decision("train"))
	}

	// Another job arrives; the scaled-in job's pending replacement blocks neither it nor the job.
	w.clock.set(deadline + 1000)
	w.addJob("other", 1, nil, nil, 2, "")
	s := w.run(defaultActions())
	if want := map[string]string{"default/other-worker-0": "small"}; !reflect.DeepEqual(s.bound, want) {
		t.Errorf("bound %v; want %v", s.bound, want)
	}
	if s.phases["train-pg"] != scheduling.PodGroupRunning {
		t.Errorf("train's PodGroup is %q with a pending replacement; want Running", s.phases["train-pg"])
	}
	if d := w.decision("train"); d.Phase != regroup.PhaseScaledIn || !d.WantsPods {
		t.Errorf("decision %+v; want scaled in, wanting pods", d)
	}

	// Capacity returns: the replacement is bound (the manager scales out once it registers).
	w.clock.set(deadline + 5000)
	w.addNode("n6", 8)
	s = w.run(defaultActions())
	if want := map[string]string{"default/train-worker-2": "n6"}; !reflect.DeepEqual(s.bound, want) {
		t.Errorf("bound %v; want %v", s.bound, want)
	}
}

func TestFullSizeMinMemberWouldStallAScaledInJob(t *testing.T) {
	// Why an every-pod minAvailable is lowered to the elastic minimum once the job runs: with gang
	// alone and minMember at full size, a job that lost a pod and has no capacity for it is marked
	// Pending (Volcano then skips it in allocate until enqueue admits it again), while the same
	// job with its elastic minAvailable stays Running (the test above). Volcano's job controller
	// resets minMember to the Job's minAvailable on every sync, so it is the Job's that is lowered.
	w := newWorld(t)
	w.noPlugin = true
	for _, n := range []string{"n1", "n2", "n3"} {
		w.addNode(n, 8)
	}
	w.addJob("plain", 4, nil, nil, 8, "n1", "n2", "n3", "")
	w.pgs["plain"].Status.Phase = "Running" // it ran at full size before it lost the pod
	s := w.run(defaultActions())
	if s.phases["plain-pg"] != scheduling.PodGroupPending {
		t.Errorf("PodGroup phase %q; want Pending", s.phases["plain-pg"])
	}
}

func TestMinAvailableBetweenTheElasticMinimumAndEveryPodFailsValidation(t *testing.T) {
	w := newWorld(t)
	for _, n := range []string{"n1", "n2", "n3", "n4"} {
		w.addNode(n, 8)
	}
	labels, annotations := elasticKeys()
	w.addJob("train", 3, labels, annotations, 8, "", "", "", "")
	s := w.run(defaultActions())
	if len(s.bound) != 0 {
		t.Errorf("bound %v; want nothing for an invalid job", s.bound)
	}
	ev := w.rec.eventsWithReason(ReasonInvalid)
	want := "minAvailable 3 is above the job's elastic minimum of 2 pods"
	if len(ev) != 1 || !strings.Contains(ev[0].message, want) {
		t.Errorf("events %v; want one %s event containing %q", ev, ReasonInvalid, want)
	}
}

// A job submitted as MindCluster has it (minAvailable: every pod) starts whole; once it runs, its
// Job's minAvailable is lowered to the elastic minimum, once, and the job then scales in and takes
// a replacement back like a job submitted with the elastic minimum.
func TestAnEveryPodMinAvailableIsLoweredToTheElasticMinimumOnceTheJobRuns(t *testing.T) {
	w := newWorld(t)
	for _, n := range []string{"n1", "n2", "n3", "n4"} {
		w.addNode(n, 8)
	}
	labels, annotations := elasticKeys()
	w.addJob("train", 4, labels, annotations, 8, "", "", "", "")
	w.rec.lowerErr = errors.New("the API server is away")
	s := w.run(defaultActions())
	if len(s.bound) != 4 || len(w.rec.lowered) != 0 {
		t.Fatalf("bound %v, lowered %v; want the whole job bound and nothing lowered before it runs", s.bound, w.rec.lowered)
	}
	w.clock.set(t0 + 1000)
	w.run(defaultActions()) // it runs: lowered, but the patch fails
	if want := []string{"default/train 4 -> 2"}; !reflect.DeepEqual(w.rec.lowered, want) {
		t.Fatalf("lowered %v; want %v", w.rec.lowered, want)
	}
	if ev := w.rec.eventsWithReason(ReasonMinAvailable); len(ev) != 1 || ev[0].kind != v1.EventTypeWarning ||
		!strings.Contains(ev[0].message, "could not be lowered to 2") {
		t.Errorf("events %v; want one warning that it could not be lowered", ev)
	}
	w.rec.lowerErr = nil
	w.clock.set(t0 + 2000)
	w.run(defaultActions())
	if len(w.rec.lowered) != 1 {
		t.Errorf("lowered %v; want no new try within %d ms", w.rec.lowered, minAvailableRetryMs)
	}
	w.clock.set(t0 + 1000 + minAvailableRetryMs)
	w.run(defaultActions())
	if len(w.rec.lowered) != 2 {
		t.Fatalf("lowered %v; want a second try after %d ms", w.rec.lowered, minAvailableRetryMs)
	}
	if ev := w.rec.eventsWithReason(ReasonMinAvailable); len(ev) != 2 || ev[1].kind != v1.EventTypeNormal ||
		!strings.Contains(ev[1].message, "minAvailable lowered from 4 (every pod) to 2") {
		t.Errorf("events %v; want the lowering said", ev)
	}
	// The job controller carries the Job's minAvailable into the PodGroup: nothing more to lower.
	w.pgs["train"].Spec.MinMember = 2
	w.clock.set(t0 + 2000 + 2*minAvailableRetryMs)
	w.run(defaultActions())
	if len(w.rec.lowered) != 2 {
		t.Errorf("lowered %v; want nothing more once minMember is the elastic minimum", w.rec.lowered)
	}
	// A node lost: the job scales in at the deadline and stays Running, as with the elastic
	// minimum from the start.
	w.setReady("n3", v1.ConditionFalse)
	w.run(defaultActions())
	for _, e := range w.rec.takeEvictions() {
		w.replace(e.pod[len(ns)+1:])
	}
	w.clock.set(t0 + 3000 + 2*minAvailableRetryMs)
	w.run(defaultActions())
	d := w.decision("train")
	if d.Phase != regroup.PhaseWaiting {
		t.Fatalf("decision %+v; want waiting for a replacement", d)
	}
	w.clock.set(d.DeadlineMs + 1000)
	s = w.run(defaultActions())
	if d := w.decision("train"); d.Phase != regroup.PhaseScaledIn || s.phases["train-pg"] != scheduling.PodGroupRunning {
		t.Errorf("decision %+v, PodGroup %q; want scaled in, Running", d, s.phases["train-pg"])
	}
}

func TestBadRegroupKeyFailsValidationWithTheEnginesMessage(t *testing.T) {
	w := newWorld(t)
	for _, n := range []string{"n1", "n2", "n3", "n4"} {
		w.addNode(n, 8)
	}
	labels, annotations := elasticKeys()
	annotations["regroup.io/min-data-parallel"] = "zero"
	w.addJob("train", 1, labels, annotations, 8, "", "", "", "")
	s := w.run(defaultActions())
	if len(s.bound) != 0 {
		t.Errorf("bound %v; want nothing", s.bound)
	}
	// The engine's own message, as regroupctl validate prints it, for the spec the plugin built.
	rt, err := Shared()
	if err != nil {
		t.Fatal(err)
	}
	report, err := regroup.ValidateJob(rt.jobs["default/train"].spec)
	if regroup.StatusOf(err) != regroup.StatusValidationFailed {
		t.Fatalf("ValidateJob: %v; want a validation failure", err)
	}
	parsed, err := regroup.ParseValidationReport(report)
	if err != nil {
		t.Fatal(err)
	}
	var want string
	for _, p := range parsed.Problems {
		if p.Severity == "error" {
			want = p.Message
		}
	}
	if !strings.Contains(want, `regroup.io/min-data-parallel="zero" is invalid`) {
		t.Fatalf("the engine's message %q does not name the key", want)
	}
	ev := w.rec.eventsWithReason(ReasonInvalid)
	if len(ev) != 1 || ev[0].message != want || ev[0].pg != "default/train-pg" {
		t.Errorf("events %+v; want one %s event on default/train-pg saying %q", ev, ReasonInvalid, want)
	}
	// The next session does not repeat the event (the spec did not change) and still binds nothing.
	w.clock.set(t0 + 1000)
	if s := w.run(defaultActions()); len(s.bound) != 0 {
		t.Errorf("second session bound %v", s.bound)
	}
	if ev := w.rec.eventsWithReason(ReasonInvalid); len(ev) != 1 {
		t.Errorf("%d %s events after two sessions; want 1", len(ev), ReasonInvalid)
	}
}

// A session can see a job's PodGroup (and its manager pod) before the job controller has created
// the training pods. Before, the plugin sized the job at 0 pods and failed its validation
// ("pods is 0"), which the localsched suite hit about once in ten runs.
func TestAJobWhoseTrainingPodsAreNotCreatedYetIsNotInvalid(t *testing.T) {
	w := newWorld(t)
	for _, n := range []string{"n1", "n2", "n3"} {
		w.addNode(n, 8)
	}
	labels, annotations := elasticKeys()
	w.addJob("train", 2, labels, annotations, 8) // the PodGroup alone
	w.addPod("train", "manager", 0, 1, "")
	w.run(defaultActions())
	if ev := w.rec.eventsWithReason(ReasonInvalid); len(ev) != 0 {
		t.Fatalf("events %+v; want none: a job whose pods are not created yet is not invalid", ev)
	}
	for i := 0; i < 2; i++ {
		w.addPod("train", "worker", i, 8, "")
	}
	w.clock.set(t0 + 1000)
	if s := w.run(defaultActions()); len(s.bound) != 3 {
		t.Errorf("bound %v; want the manager and both workers once the pods exist", s.bound)
	}
	if ev := w.rec.eventsWithReason(ReasonInvalid); len(ev) != 0 {
		t.Errorf("events %+v; want none", ev)
	}
}

func TestBadMindClusterValueIsScheduledWithAWarning(t *testing.T) {
	w := newWorld(t)
	for _, n := range []string{"n1", "n2", "n3", "n4"} {
		w.addNode(n, 8)
	}
	labels, annotations := elasticKeys()
	annotations["wait-reschedule-timeout"] = "500"
	w.addJob("train", 2, labels, annotations, 8, "", "", "", "")
	s := w.run(defaultActions())
	if len(s.bound) != 4 {
		t.Errorf("bound %v; want all 4 pods", s.bound)
	}
	want := `annotation wait-reschedule-timeout="500" is not allowed (an integer from 30 to 270); using "270" as MindCluster does`
	ev := w.rec.eventsWithReason(ReasonFallback)
	if len(ev) != 1 || ev[0].message != want || ev[0].kind != v1.EventTypeWarning {
		t.Errorf("events %+v; want one Warning %s: %q", ev, ReasonFallback, want)
	}
}

func TestANewJobStartsOnlyAtFullSize(t *testing.T) {
	// gang alone would start the job on 3 of its 4 pods (minAvailable is the elastic 2); the
	// engine's gang minimum for a job that has not lost anything is the whole job.
	w := newWorld(t)
	for _, n := range []string{"n1", "n2", "n3"} {
		w.addNode(n, 8)
	}
	labels, annotations := elasticKeys()
	w.addJob("train", 2, labels, annotations, 8, "", "", "", "")
	if s := w.run(defaultActions()); len(s.bound) != 0 {
		t.Errorf("bound %v on 3 nodes; want nothing until all 4 fit", s.bound)
	}
	w.clock.set(t0 + 1000)
	w.addNode("n4", 8)
	if s := w.run(defaultActions()); len(s.bound) != 4 {
		t.Errorf("bound %v on 4 nodes; want all 4 pods", s.bound)
	}
}

func TestSchedulerRestartMidWaitKeepsTheDeadline(t *testing.T) {
	w, deadline := lostPodWithoutCapacity(t)
	w.applySavedState()
	if w.pgs["train"].Annotations[StateAnnotation] == "" {
		t.Fatalf("no %s annotation was written", StateAnnotation)
	}
	if got := w.pgs["train"].Annotations[PhaseAnnotation]; got != "waiting" {
		t.Errorf("%s = %q; want waiting", PhaseAnnotation, got)
	}

	// The scheduler restarts 30 s later: a new process, a new engine.
	ResetShared()
	w.clock.set(deadline - 30_000)
	w.run(defaultActions())
	d := w.decision("train")
	if d.Phase != regroup.PhaseWaiting || d.DeadlineMs != deadline {
		t.Fatalf("after the restart: %+v; want still waiting until %d", d, deadline)
	}
	w.clock.set(deadline)
	w.run(defaultActions())
	if d := w.decision("train"); d.Phase != regroup.PhaseScaledIn || d.DP != 3 {
		t.Fatalf("at the saved deadline: %+v; want scaled in to dp=3", d)
	}
}

func TestSchedulerRestartWithoutTheStateWouldLoseTheWait(t *testing.T) {
	// The control of the test above: the same restart without the annotations does not know the
	// replacement is one, so nothing waits and nothing would scale in.
	w, deadline := lostPodWithoutCapacity(t)
	ResetShared()
	w.clock.set(deadline - 30_000)
	w.run(defaultActions())
	if d := w.decision("train"); d.Phase == regroup.PhaseWaiting && d.DeadlineMs == deadline {
		t.Fatalf("without the saved state the engine still waits until %d; the restart test proves nothing", deadline)
	}
}

func TestPreemptionNeverTakesARegroupJobBelowItsMinimum(t *testing.T) {
	for _, tc := range []struct {
		name    string
		regroup bool
		evicted int
	}{
		// gang alone lets a higher-priority job take a pod of a job above its minAvailable...
		{"without keys", false, 1},
		// ...and the engine's gang minimum of a job at full size is the whole job.
		{"with keys", true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			w.classes = append(w.classes, priorityClass("high", 1000), priorityClass("low", 1))
			for _, n := range []string{"n1", "n2", "n3", "n4"} {
				w.addNode(n, 8)
			}
			var labels, annotations map[string]string
			if tc.regroup {
				labels, annotations = elasticKeys()
			}
			w.addJob("train", 2, labels, annotations, 8, "n1", "n2", "n3", "n4")
			w.pgs["train"].Spec.PriorityClassName = "low"
			for _, p := range w.pods {
				p.Spec.PriorityClassName = "low"
				low := int32(1)
				p.Spec.Priority = &low
			}
			w.addJob("urgent", 1, nil, nil, 8, "")
			w.pgs["urgent"].Spec.PriorityClassName = "high"
			high := int32(1000)
			w.pods["urgent-worker-0"].Spec.Priority = &high
			w.pods["urgent-worker-0"].Spec.PriorityClassName = "high"
			w.run(preemptActions())
			if ev := w.rec.takeEvictions(); len(ev) != 0 {
				t.Fatalf("the plugin evicted %v", ev)
			}
			released := 0
			for _, p := range w.pods {
				if p.DeletionTimestamp != nil && strings.HasPrefix(p.Name, "train-") {
					released++
				}
			}
			if released != tc.evicted {
				t.Errorf("%d pods of train preempted; want %d", released, tc.evicted)
			}
		})
	}
}

func TestJobWithoutKeysIsScheduledExactlyAsWithoutThePlugin(t *testing.T) {
	// Two jobs without Regroup keys, one only partly placeable, on nodes of which one is NotReady
	// and one carries Regroup's fault label: the plugin must change nothing for them.
	build := func(t *testing.T, withPlugin bool) session {
		w := newWorld(t)
		w.noPlugin = !withPlugin
		w.addNode("a", 8)
		w.addNode("b", 8)
		w.nodes["b"].Labels["regroup.io/health"] = "faulty"
		w.addNode("c", 4)
		w.setReady("c", v1.ConditionFalse)
		w.addJob("gang2", 2, map[string]string{"team": "x"}, map[string]string{"note": "plain"}, 8, "", "")
		w.addJob("big", 3, nil, nil, 8, "", "", "")
		return w.run(defaultActions())
	}
	with := build(t, true)
	without := build(t, false)
	if len(without.bound) != 2 {
		t.Fatalf("without the plugin: bound %v; the scenario expects gang2 on a and b", without.bound)
	}
	if !reflect.DeepEqual(nodeMultiset(with.bound), nodeMultiset(without.bound)) ||
		!reflect.DeepEqual(podSet(with.bound), podSet(without.bound)) {
		t.Errorf("with the plugin bound %v; without it %v", with.bound, without.bound)
	}
	if !reflect.DeepEqual(with.phases, without.phases) || !reflect.DeepEqual(with.released, without.released) {
		t.Errorf("with the plugin: phases %v released %v; without: %v %v",
			with.phases, with.released, without.phases, without.released)
	}
}

func nodeMultiset(bound map[string]string) []string {
	var out []string
	for _, n := range bound {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func podSet(bound map[string]string) []string {
	return sortedKeys(bound)
}

// tokenFile writes a coordinator credential file and returns its path.
func tokenFile(t *testing.T, token string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestCoordinatorStartsOnceAndServes(t *testing.T) {
	w := runningElasticJob(t)
	w.args[argCoordinatorListen] = "127.0.0.1:0"
	w.args[argCredentialFile] = tokenFile(t, "cluster-token\n")
	w.clock.set(t0 + 1000)
	w.run(defaultActions())
	rt, err := Shared()
	if err != nil {
		t.Fatal(err)
	}
	port := rt.CoordinatorPort()
	if port == 0 {
		t.Fatal("no coordinator after a session with regroup.coordinatorListen set")
	}
	conn, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), 5*time.Second)
	if err != nil {
		t.Fatalf("the coordinator does not accept connections on port %d: %v", port, err)
	}
	conn.Close()
	w.clock.set(t0 + 2000)
	w.run(defaultActions())
	if got := rt.CoordinatorPort(); got != port {
		t.Errorf("coordinator port %d after a second session; want the same %d (started once)", got, port)
	}
	ResetShared()
	if got := rt.CoordinatorPort(); got != 0 {
		t.Errorf("port %d after ResetShared; want 0", got)
	}
}

// coordinatorPortAfterASession runs one session with the plugin's arguments `args` and returns
// the port its coordinator listens on, 0 for none; the shared runtime is reset when the test ends.
func coordinatorPortAfterASession(t *testing.T, args map[string]any) int {
	t.Helper()
	w := runningElasticJob(t)
	w.args[argCoordinatorListen] = "127.0.0.1:0"
	for k, v := range args {
		w.args[k] = v
	}
	w.clock.set(t0 + 1000)
	w.run(defaultActions())
	rt, err := Shared()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ResetShared)
	return rt.CoordinatorPort()
}

// A credential file that holds no token never starts an open coordinator.
func TestAnEmptyCredentialFileStartsNoCoordinator(t *testing.T) {
	if port := coordinatorPortAfterASession(t, map[string]any{argCredentialFile: tokenFile(t, " \n")}); port != 0 {
		t.Fatalf("a coordinator listens on port %d with an empty credential file; want none", port)
	}
}

// No credential file starts no coordinator: open mode is asked for with regroup.insecure.
func TestWithoutACredentialOnlyInsecureStartsACoordinator(t *testing.T) {
	for _, insecure := range []bool{false, true} {
		t.Run("insecure="+strconv.FormatBool(insecure), func(t *testing.T) {
			port := coordinatorPortAfterASession(t, map[string]any{argInsecure: insecure})
			if (port != 0) != insecure {
				t.Fatalf("coordinator port %d without a credential, %s: %v; want one only when true",
					port, argInsecure, insecure)
			}
		})
	}
}

// Mutual TLS (issue 40): the client CA reaches the coordinator's options; alone, without the
// coordinator's own certificate and key, it starts no coordinator and the error names it.
func TestAClientCAWithoutACertificateStartsNoCoordinator(t *testing.T) {
	cfg := parseArguments(framework.Arguments{argTLSClientCAFile: "/etc/regroup/tls/ca.crt"})
	if cfg.coordinator.tlsClientCA != "/etc/regroup/tls/ca.crt" {
		t.Errorf("%s read as %q", argTLSClientCAFile, cfg.coordinator.tlsClientCA)
	}
	port := coordinatorPortAfterASession(t, map[string]any{argCredentialFile: tokenFile(t, "key\n"),
		argTLSClientCAFile: "/etc/regroup/tls/ca.crt"})
	if port != 0 {
		t.Fatalf("a coordinator listens on port %d with a client CA and no certificate; want none", port)
	}
	rt, err := Shared()
	if err != nil {
		t.Fatal(err)
	}
	rt.mu.Lock()
	got := rt.coordErr
	rt.mu.Unlock()
	if got == nil || !strings.Contains(got.Error(), argTLSClientCAFile+" /etc/regroup/tls/ca.crt needs "+argTLSCertFile) {
		t.Errorf("the coordinator's error %v does not name %s", got, argTLSClientCAFile)
	}
}

func TestScaledInJobWinsItsReplacementBackByPreemption(t *testing.T) {
	for _, tc := range []struct {
		name       string
		gangStarve bool
		want       []string
	}{
		// The shipped configuration: regroup decides starving, the low-priority pod is preempted.
		{"shipped configuration", false, []string{"default/filler-worker-?"}},
		// With gang's starving on, gang calls the scaled-in job (at its minAvailable) not
		// starving, and Volcano ANDs the answers: nothing is preempted for it.
		{"gang starving on", true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, deadline := lostPodWithoutCapacity(t)
			w.clock.set(deadline)
			w.run(defaultActions())
			if d := w.decision("train"); d.Phase != regroup.PhaseScaledIn {
				t.Fatalf("phase %v; want scaled_in", d.Phase)
			}
			w.classes = append(w.classes, priorityClass("high", 1000), priorityClass("low", 1))
			w.pgs["train"].Spec.PriorityClassName = "high"
			high, low := int32(1000), int32(1)
			for name, p := range w.pods {
				if strings.HasPrefix(name, "train-") {
					p.Spec.PriorityClassName, p.Spec.Priority = "high", &high
				}
			}
			// A low-priority job of two pods (gang lets one go: its minAvailable is 1) holds the
			// capacity that came back.
			w.addNode("n5", 8)
			w.addNode("n6", 8)
			w.addJob("filler", 1, nil, nil, 8, "n5", "n6")
			w.pgs["filler"].Spec.PriorityClassName = "low"
			for _, name := range []string{"filler-worker-0", "filler-worker-1"} {
				w.pods[name].Spec.PriorityClassName, w.pods[name].Spec.Priority = "low", &low
			}
			w.tweak = func(tiers []conf.Tier) {
				for i := range tiers {
					for j := range tiers[i].Plugins {
						if tiers[i].Plugins[j].Name == "gang" {
							on := tc.gangStarve
							tiers[i].Plugins[j].EnabledJobStarving = &on
						}
					}
				}
			}
			w.clock.set(deadline + 1000)
			s := w.run(preemptActions())
			got := s.released
			if len(got) == 1 && strings.HasPrefix(got[0], "default/filler-worker-") {
				got = []string{"default/filler-worker-?"} // either of the two
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("preempted %v; want %v", s.released, tc.want)
			}
		})
	}
}

func TestWithoutTheEngineRegroupJobsWaitAndOthersRun(t *testing.T) {
	w := newWorld(t)
	for _, n := range []string{"n1", "n2", "n3"} {
		w.addNode(n, 8)
	}
	labels, annotations := elasticKeys()
	w.addJob("train", 2, labels, annotations, 8, "", "")
	w.addJob("plain", 1, nil, nil, 8, "")
	opts := w.options()
	opts.Runtime = func() (*Runtime, error) {
		return nil, errors.New("regroup: the engine could not be created: libregroup has ABI version 2.0")
	}
	tc := uthelper.TestCommonStruct{
		Name:    t.Name(),
		Plugins: builders(opts),
		Queues:  []*schedulingv1beta1.Queue{util.BuildQueue("default", 1, nil)},
	}
	for _, name := range sortedKeys(w.nodes) {
		tc.Nodes = append(tc.Nodes, w.nodes[name])
	}
	for _, name := range sortedKeys(w.pods) {
		tc.Pods = append(tc.Pods, w.pods[name])
	}
	for _, name := range sortedKeys(w.pgs) {
		tc.PodGroups = append(tc.PodGroups, w.pgs[name])
	}
	ssn := tc.RegisterSession(loadTiers(t, true, w.args), nil)
	defer tc.Close()
	if vr := ssn.JobValid(ssn.Jobs["default/train-pg"]); vr == nil || vr.Pass || !strings.Contains(vr.Message, "ABI version 2.0") {
		t.Errorf("train: validation %+v; want a failure naming the engine's error", vr)
	}
	tc.Run(defaultActions())
	bound := map[string]bool{}
	for _, job := range ssn.Jobs {
		for _, task := range job.Tasks {
			if task.Status == api.Binding {
				bound[task.Name] = true
			}
		}
	}
	if want := map[string]bool{"plain-worker-0": true}; !reflect.DeepEqual(bound, want) {
		t.Errorf("bound %v; want %v", bound, want)
	}
}

func TestPredicateRefusesUnhealthyAndAvoidedNodesOnlyForRegroupJobs(t *testing.T) {
	p := newPlugin(testArgs(), Options{})
	p.unhealthy = map[string]string{"bad": "NotReady: KubeletStopped"}
	p.avoidNew = map[string]string{"pre": "MindCluster NodeD: level PreSeparateFault"}
	p.jobs = map[api.JobID]*sessionJob{
		"default/train-pg": {id: "default/train", valid: true, avoid: map[string]bool{"avoided": true}},
	}
	task := func(job api.JobID) *api.TaskInfo {
		return &api.TaskInfo{UID: "t", Name: "p", Namespace: ns, Job: job}
	}
	node := func(name string) *api.NodeInfo { return &api.NodeInfo{Name: name} }
	for _, tc := range []struct {
		job, node string
		want      string // "" for allowed
	}{
		{"default/train-pg", "good", ""},
		{"default/train-pg", "bad", "node bad is not healthy (NotReady: KubeletStopped); Regroup keeps job default/train off it"},
		{"default/train-pg", "avoided", "job default/train avoids node avoided for a while: a pod of it was lost there"},
		{"default/train-pg", "pre", "node pre is pre-separated (MindCluster NodeD: level PreSeparateFault); Regroup places no new pod of job default/train there"},
		{"default/plain-pg", "bad", ""},
		{"default/plain-pg", "avoided", ""},
		{"default/plain-pg", "pre", ""},
	} {
		err := p.predicate(task(api.JobID(tc.job)), node(tc.node))
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s on %s: %v; want allowed", tc.job, tc.node, err)
			}
			continue
		}
		var fe *api.FitError
		if !errors.As(err, &fe) || len(fe.Status) != 1 || fe.Status[0].Code != api.UnschedulableAndUnresolvable ||
			fe.Status[0].Reason != tc.want {
			t.Errorf("%s on %s: %#v; want an UnschedulableAndUnresolvable fit error %q", tc.job, tc.node, err, tc.want)
		}
	}
}

// The managers' lease is an argument of the plugin's, handed to the coordinator; one out of
// range keeps the library's default.
func TestTheLeaseArgumentIsReadAndBounded(t *testing.T) {
	for _, c := range []struct {
		value any
		want  int
	}{{nil, 0}, {2500, 2500}, {600000, 600000}, {-1, 0}, {600001, 0}} {
		args := framework.Arguments{}
		if c.value != nil {
			args[argLeaseMs] = c.value
		}
		if got := parseArguments(args).coordinator.leaseMs; got != c.want {
			t.Errorf("%s=%v: lease %d ms, want %d", argLeaseMs, c.value, got, c.want)
		}
	}
}

// Nobody mints a job's coordinator token by hand: the plugin writes it, derived from the cluster
// key, once for each uid of the job (a job created again under its name has a new token), and
// tries again after a failure, saying why on the job's PodGroup.
func TestAJobsCoordinatorTokenIsWrittenOncePerUidAndRetriedAfterAFailure(t *testing.T) {
	w := runningElasticJob(t)
	w.args[argCoordinatorListen] = "127.0.0.1:0"
	w.args[argCredentialFile] = tokenFile(t, "cluster-key\n")
	w.rec.tokenErr = errors.New("secrets is forbidden")
	for i := int64(1); i <= 3; i++ {
		w.clock.set(t0 + i*1000)
		w.run(defaultActions())
	}
	if len(w.rec.tokens) != 0 || len(w.rec.eventsWithReason(ReasonToken)) != 1 {
		t.Fatalf("a failed write: tokens %v, events %v; want none written and one event", w.rec.tokens,
			w.rec.eventsWithReason(ReasonToken))
	}
	if e := w.rec.eventsWithReason(ReasonToken)[0]; !strings.Contains(e.message, "train-regroup-coordinator-token") ||
		!strings.Contains(e.message, "secrets is forbidden") {
		t.Errorf("the event %q must name the Secret and the error", e.message)
	}
	w.rec.tokenErr = nil
	w.clock.set(t0 + 20000)
	w.run(defaultActions())
	if len(w.rec.tokens) != 0 {
		t.Fatalf("written again %v before the retry delay", w.rec.tokens)
	}
	want, err := regroup.JobToken("cluster-key", ns+"/train", "job-train")
	if err != nil {
		t.Fatal(err)
	}
	for i := int64(0); i < 3; i++ {
		w.clock.set(t0 + 40000 + i*1000)
		w.run(defaultActions())
	}
	if len(w.rec.tokens) != 1 || w.rec.tokens[0] != ns+"/train-regroup-coordinator-token "+want {
		t.Fatalf("tokens written %v; want once %q", w.rec.tokens, ns+"/train-regroup-coordinator-token "+want)
	}
}

// No cluster key, no token: a coordinator that is off or insecure mints nothing.
func TestNoTokenIsWrittenWithoutAClusterKey(t *testing.T) {
	w := runningElasticJob(t)
	w.args[argCoordinatorListen] = "127.0.0.1:0"
	w.args[argInsecure] = true
	w.clock.set(t0 + 1000)
	w.run(defaultActions())
	w.clock.set(t0 + 2000)
	w.run(defaultActions())
	if len(w.rec.tokens) != 0 {
		t.Fatalf("tokens written %v without a cluster key", w.rec.tokens)
	}
}

// The Secret: created owned by the Volcano Job (Kubernetes deletes it with the job), and
// patched when it exists (a hand-made one of an older uid), never read.
func TestTheTokenSecretIsOwnedByTheJobAndPatchedWhenItExists(t *testing.T) {
	client := kubefake.NewSimpleClientset(&v1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "old-regroup-coordinator-token", Namespace: ns},
		Data:       map[string][]byte{TokenSecretKey: []byte("made by hand"), "other": []byte("kept")}})
	pg := &api.PodGroup{PodGroup: scheduling.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: "train-pg", Namespace: ns,
		UID: "pg-uid", OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch.volcano.sh/v1alpha1",
			Kind: "Job", Name: "train", UID: "job-uid"}}}}}
	get := func(name string) *v1.Secret {
		s, err := client.CoreV1().Secrets(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	write := func(name, token string) { // and check that the writer reads nothing
		before := len(client.Actions())
		if err := writeTokenSecret(client, pg, name, token); err != nil {
			t.Fatal(err)
		}
		for _, a := range client.Actions()[before:] {
			if a.GetVerb() != "create" && a.GetVerb() != "patch" {
				t.Errorf("the writer did %s on %s; it needs only create and patch", a.GetVerb(), a.GetResource().Resource)
			}
		}
	}
	write("train-regroup-coordinator-token", "t1")
	s := get("train-regroup-coordinator-token")
	if string(s.Data[TokenSecretKey]) != "t1" || len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != "job-uid" ||
		s.OwnerReferences[0].Kind != "Job" || s.Labels[TokenSecretLabel] != "true" {
		t.Fatalf("Secret %+v; want the token, owned by the Volcano Job, labelled", s)
	}
	write("old-regroup-coordinator-token", "t2")
	if s := get("old-regroup-coordinator-token"); string(s.Data[TokenSecretKey]) != "t2" ||
		string(s.Data["other"]) != "kept" || len(s.OwnerReferences) != 1 {
		t.Errorf("Secret %+v after a patch; want token t2, its other keys kept, owned by the job", s)
	}
	if err := writeTokenSecret(nil, pg, "x", "t"); err == nil || !strings.Contains(err.Error(), "no Kubernetes client") {
		t.Errorf("no client: %v; want an error saying so", err)
	}
}
