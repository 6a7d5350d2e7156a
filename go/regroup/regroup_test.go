// SPDX-License-Identifier: Apache-2.0

package regroup

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
)

const demoJob = "default/demo"

// demoJobJSON is the example job: 4 pods of 2 processes, recover then elastic-training, 30 s
// wait. tensorParallel "" leaves the default (1): each process is a replica, dp 8. With "2" each
// pod holds one replica, dp 4.
func demoJobJSON(uid, tensorParallel string) []byte {
	annotations := map[string]string{
		"recover-strategy":        "recover,elastic-training",
		"wait-reschedule-timeout": "30",
	}
	if tensorParallel != "" {
		annotations["regroup.io/tensor-parallel"] = tensorParallel
	}
	b, err := json.Marshal(map[string]any{
		"id":                demoJob,
		"uid":               uid,
		"labels":            map[string]string{"fault-scheduling": "force"},
		"annotations":       annotations,
		"pods":              4,
		"processes_per_pod": 2,
	})
	if err != nil {
		panic(err)
	}
	return b
}

func newEngine(t testing.TB, opts Options) *Engine {
	t.Helper()
	e, err := New(opts)
	if err != nil {
		t.Fatalf("New(%+v): %v", opts, err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// startDemo upserts the demo job and reports its 4 pods running on n0..n3 (uids p0..p3).
func startDemo(t testing.TB, e *Engine, tensorParallel string) {
	t.Helper()
	if _, err := e.UpsertJob(demoJobJSON("u1", tensorParallel), 0); err != nil {
		t.Fatalf("UpsertJob: %v", err)
	}
	for i := range uint32(4) {
		node := fmt.Sprintf("n%d", i)
		if err := e.SetNodeHealth(node, NodeHealthy, "", 0); err != nil {
			t.Fatalf("SetNodeHealth(%s): %v", node, err)
		}
		if err := e.SetPodState(demoJob, i, fmt.Sprintf("p%d", i), PodRunning, node, 0); err != nil {
			t.Fatalf("SetPodState(%d): %v", i, err)
		}
	}
}

// failNode3 marks n3 faulty at t=1000 and ticks at 1300, after the report window.
func failNode3(t testing.TB, e *Engine) {
	t.Helper()
	if err := e.SetNodeHealth("n3", NodeFaulty, "NotReady", 1000); err != nil {
		t.Fatalf("SetNodeHealth(n3, faulty): %v", err)
	}
	if changed, err := e.Tick(1300); err != nil || changed != 1 {
		t.Fatalf("Tick(1300) = %d, %v; want 1 job changed", changed, err)
	}
}

func wantStatus(t testing.TB, err error, want Status) {
	t.Helper()
	if got := StatusOf(err); got != want {
		t.Fatalf("status of %v = %v; want %v", err, got, want)
	}
	if want == StatusOK {
		return
	}
	var e *Error
	if !errors.As(err, &e) || e.Message == "" {
		t.Fatalf("error %v is not an *Error with a message", err)
	}
}

func mustDecision(t testing.TB, e *Engine, job string) Decision {
	t.Helper()
	d, err := e.Decision(job)
	if err != nil {
		t.Fatalf("Decision(%s): %v", job, err)
	}
	return d
}

func mustDetail(t testing.TB, e *Engine, job string) *DecisionDetail {
	t.Helper()
	d, err := e.DecisionDetail(job)
	if err != nil {
		t.Fatalf("DecisionDetail(%s): %v", job, err)
	}
	return d
}

func TestLibraryABIVersionMatchesHeader(t *testing.T) {
	if got := LibraryABIVersion(); got>>16 != HeaderABIVersion>>16 || got&0xffff < HeaderABIVersion&0xffff {
		t.Fatalf("LibraryABIVersion() = %#x; header has %#x", got, HeaderABIVersion)
	}
	v, err := LibraryVersion()
	if err != nil || v == "" {
		t.Fatalf("LibraryVersion() = %q, %v", v, err)
	}
}

func TestCheckABIVersion(t *testing.T) {
	const v = 1 << 16 // 1.0
	tests := []struct {
		name             string
		library, header  uint32
		ok               bool
		wantInTheMessage []string
	}{
		{"same version", v, v, true, nil},
		{"newer minor", v | 3, v, true, nil},
		{"older minor", v | 1, v | 2, false, []string{"1.1", "1.2"}},
		{"newer major", 2 << 16, v, false, []string{"2.0", "1.0"}},
		{"older major", 0<<16 | 9, v, false, []string{"0.9", "1.0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkABIVersion(tt.library, tt.header)
			if tt.ok {
				if err != nil {
					t.Fatalf("checkABIVersion(%#x, %#x) = %v; want nil", tt.library, tt.header, err)
				}
				return
			}
			wantStatus(t, err, StatusVersionMismatch)
			for _, s := range tt.wantInTheMessage {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not name version %s", err, s)
				}
			}
		})
	}
}

func TestStatusNamesComeFromTheLibrary(t *testing.T) {
	tests := []struct {
		status Status
		name   string
	}{
		{StatusOK, "REGROUP_OK"},
		{StatusInvalidArgument, "REGROUP_INVALID_ARGUMENT"},
		{StatusNotFound, "REGROUP_NOT_FOUND"},
		{StatusValidationFailed, "REGROUP_VALIDATION_FAILED"},
		{StatusFailedPrecondition, "REGROUP_FAILED_PRECONDITION"},
		{StatusVersionMismatch, "REGROUP_VERSION_MISMATCH"},
		{StatusResourceExhausted, "REGROUP_RESOURCE_EXHAUSTED"},
		{StatusInternal, "REGROUP_INTERNAL"},
		{Status(99), "REGROUP_UNKNOWN_STATUS"},
		{Status(-1), "REGROUP_UNKNOWN_STATUS"},
	}
	for _, tt := range tests {
		if got := tt.status.String(); got != tt.name {
			t.Errorf("Status(%d).String() = %q; want %q", int(tt.status), got, tt.name)
		}
		if tt.status.Message() == "" {
			t.Errorf("Status(%d).Message() is empty", int(tt.status))
		}
	}
}

func TestEnumNames(t *testing.T) {
	tests := []struct {
		value fmt.Stringer
		name  string
	}{
		{NodeHealthy, "healthy"}, {NodeFaulty, "faulty"}, {NodeUnknown, "unknown"},
		{NodeHealth(3), "NodeHealth(3)"},
		{PodPending, "pending"}, {PodBound, "bound"}, {PodRunning, "running"},
		{PodFailed, "failed"}, {PodDeleted, "deleted"}, {PodPhase(-1), "PodPhase(-1)"},
		{PhaseRunning, "running"}, {PhaseWaiting, "waiting"}, {PhaseScaledIn, "scaled_in"},
		{PhaseScalingOut, "scaling_out"}, {PhaseFailed, "failed"}, {Phase(10), "Phase(10)"},
		{DirectiveContinue, "continue"}, {DirectiveRestartInPlace, "restart_in_place"},
		{DirectiveWait, "wait"}, {DirectiveScaleIn, "scale_in"}, {DirectiveScaleOut, "scale_out"},
		{DirectiveRestartJob, "restart_job"}, {DirectiveKind(10), "DirectiveKind(10)"},
	}
	for _, tt := range tests {
		if got := tt.value.String(); got != tt.name {
			t.Errorf("%T(%v).String() = %q; want %q", tt.value, tt.value, got, tt.name)
		}
	}
	var k DirectiveKind
	if err := k.UnmarshalText([]byte("scale_out")); err != nil || k != DirectiveScaleOut {
		t.Errorf("UnmarshalText(scale_out) = %v, %v", k, err)
	}
	if err := k.UnmarshalText([]byte("jump")); err == nil {
		t.Errorf("UnmarshalText(jump) accepted an unknown kind")
	}
}

func TestValidateJob(t *testing.T) {
	tests := []struct {
		name       string
		job        []byte
		wantStatus Status
		wantReport bool
		wantOK     bool
	}{
		{"valid job", demoJobJSON("u1", ""), StatusOK, true, true},
		{"invalid key value", demoJobJSON("u1", "3"), StatusValidationFailed, true, false},
		{"malformed JSON", []byte(`{"id":`), StatusInvalidArgument, false, false},
		{"not an object", []byte(`[1,2]`), StatusInvalidArgument, false, false},
		{"missing pods", []byte(`{"id":"a"}`), StatusInvalidArgument, false, false},
		{"empty", []byte{}, StatusInvalidArgument, false, false},
		{"nil", nil, StatusInvalidArgument, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			report, err := ValidateJob(tt.job)
			wantStatus(t, err, tt.wantStatus)
			if (report != nil) != tt.wantReport {
				t.Fatalf("report = %q; want a report: %v", report, tt.wantReport)
			}
			if !tt.wantReport {
				return
			}
			r, err := ParseValidationReport(report)
			if err != nil {
				t.Fatal(err)
			}
			if r.OK != tt.wantOK {
				t.Errorf("report ok = %v; want %v (%s)", r.OK, tt.wantOK, report)
			}
			if !tt.wantOK && len(r.Problems) == 0 {
				t.Errorf("a failed report names no problem: %s", report)
			}
			if _, found := r.Config["wait-reschedule-timeout"]; !found {
				t.Errorf("report has no resolved config: %s", report)
			}
		})
	}
}

// TestFaultyNodeWaitThenScaleInThenScaleOut walks the example job through a node loss: wait for
// a replacement until the deadline, scale in without the lost replicas, scale out when the
// replacement registers.
func TestFaultyNodeWaitThenScaleInThenScaleOut(t *testing.T) {
	tests := []struct {
		name           string
		tensorParallel string
		dp, shrunkDP   uint32
		keep, removed  []int64
		gangAfter      uint32
	}{
		{"one replica per process", "", 8, 6, []int64{0, 1, 2, 3, 4, 5}, []int64{6, 7}, 3},
		{"one replica per pod", "2", 4, 3, []int64{0, 1, 2}, []int64{3}, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEngine(t, Options{})
			startDemo(t, e, tt.tensorParallel)
			if d := mustDecision(t, e, demoJob); d.Kind != DirectiveContinue || d.Phase != PhaseRunning ||
				d.DP != tt.dp || d.OriginalDP != tt.dp || d.WantsPods || d.DeadlineMs != -1 {
				t.Fatalf("before the fault: %+v", d)
			}

			// n3 fails at 1000; the decision is taken at 1300: wait 30 s for a replacement.
			failNode3(t, e)
			d := mustDecision(t, e, demoJob)
			want := Decision{Phase: PhaseWaiting, Kind: DirectiveWait, DirectiveID: 1,
				DeadlineMs: 1300 + 30000, DP: tt.dp, OriginalDP: tt.dp, GangMin: 4, WantsPods: true,
				Evictions: 1}
			if d != want {
				t.Fatalf("after the fault: %+v; want %+v", d, want)
			}
			detail := mustDetail(t, e, demoJob)
			if detail.Job != demoJob || detail.Phase != PhaseWaiting ||
				detail.Directive.Strategy != "recover" || detail.Directive.DeadlineMs != 31300 ||
				detail.Directive.AtMs != 1300 {
				t.Errorf("wait detail: %+v", detail)
			}
			wantEvict := []Eviction{{Pod: 3, UID: "p3", Node: "n3", Mode: EvictForce}}
			if !reflect.DeepEqual(detail.Scheduler.Evict, wantEvict) {
				t.Errorf("evictions = %+v; want %+v", detail.Scheduler.Evict, wantEvict)
			}
			wantAvoid := []AvoidedNode{{Node: "n3", UntilMs: 1000 + 600000}}
			if !reflect.DeepEqual(detail.Scheduler.AvoidNodes, wantAvoid) {
				t.Errorf("avoided nodes = %+v; want %+v", detail.Scheduler.AvoidNodes, wantAvoid)
			}

			// Nothing changes before the deadline.
			if changed, err := e.Tick(31299); err != nil || changed != 0 {
				t.Fatalf("Tick(31299) = %d, %v; want no change", changed, err)
			}
			// At the deadline: scale in without the lost replicas.
			if changed, err := e.Tick(31300); err != nil || changed != 1 {
				t.Fatalf("Tick(31300) = %d, %v; want 1 job changed", changed, err)
			}
			d = mustDecision(t, e, demoJob)
			if d.Kind != DirectiveScaleIn || d.Phase != PhaseScaledIn || d.DP != tt.shrunkDP ||
				d.OriginalDP != tt.dp || d.DeadlineMs != -1 || d.DirectiveID != 2 ||
				d.GangMin != tt.gangAfter {
				t.Fatalf("after the deadline: %+v", d)
			}
			detail = mustDetail(t, e, demoJob)
			if detail.DP != int64(tt.shrunkDP) || detail.Directive.DP != int64(tt.shrunkDP) ||
				!reflect.DeepEqual(detail.Directive.RemoveReplicas, tt.removed) ||
				!reflect.DeepEqual(detail.Directive.KeepReplicas, tt.keep) ||
				detail.Directive.Strategy != "elastic-training" || detail.Directive.Reason == "" {
				t.Errorf("scale-in detail: %+v", detail.Directive)
			}

			// A replacement pod comes up on n4 and registers: scale out to the full size.
			if err := e.SetPodState(demoJob, 3, "p3b", PodRunning, "n4", 32000); err != nil {
				t.Fatal(err)
			}
			event := []byte(`{"type":"replacement_registered","job":"default/demo","index":3,"uid":"p3b"}`)
			if err := e.ApplyEvents(event, 32000); err != nil {
				t.Fatal(err)
			}
			if changed, err := e.Tick(32000); err != nil || changed != 1 {
				t.Fatalf("Tick(32000) = %d, %v; want 1 job changed", changed, err)
			}
			d = mustDecision(t, e, demoJob)
			if d.Kind != DirectiveScaleOut || d.Phase != PhaseScalingOut || d.DP != tt.dp ||
				d.WantsPods || d.DirectiveID != 3 {
				t.Fatalf("after the replacement: %+v", d)
			}

			history, err := e.History(demoJob)
			if err != nil {
				t.Fatal(err)
			}
			var kinds []DirectiveKind
			var phases []Phase
			for _, h := range history {
				kinds = append(kinds, h.Directive.Kind)
				phases = append(phases, h.Phase)
			}
			if want := []DirectiveKind{DirectiveWait, DirectiveScaleIn, DirectiveScaleOut}; !reflect.DeepEqual(kinds, want) {
				t.Errorf("history kinds = %v; want %v", kinds, want)
			}
			if want := []Phase{PhaseWaiting, PhaseScaledIn, PhaseScalingOut}; !reflect.DeepEqual(phases, want) {
				t.Errorf("history phases = %v; want %v", phases, want)
			}
			raw, err := e.HistoryJSON(demoJob)
			if err != nil || !json.Valid(raw) {
				t.Fatalf("HistoryJSON = %s, %v", raw, err)
			}
		})
	}
}

func TestFilterNodesRefusesTheFaultyNode(t *testing.T) {
	e := newEngine(t, Options{})
	startDemo(t, e, "2")
	failNode3(t, e)
	nodes := []string{"n0", "n1", "n2", "n3", "never-seen"}
	ok, err := e.FilterNodes(demoJob, nodes)
	if err != nil {
		t.Fatal(err)
	}
	if want := []bool{true, true, true, false, true}; !reflect.DeepEqual(ok, want) {
		t.Fatalf("FilterNodes(%v) = %v; want %v", nodes, ok, want)
	}
	// Healthy again, n3 is still avoided by this job.
	if err := e.SetNodeHealth("n3", NodeHealthy, "", 2000); err != nil {
		t.Fatal(err)
	}
	if ok, err := e.FilterNodes(demoJob, []string{"n3"}); err != nil || ok[0] {
		t.Fatalf("FilterNodes(n3) after recovery = %v, %v; want avoided", ok, err)
	}
	// No nodes: an empty answer, and the job is still checked.
	if ok, err := e.FilterNodes(demoJob, nil); err != nil || len(ok) != 0 {
		t.Fatalf("FilterNodes(nil) = %v, %v", ok, err)
	}
	_, err = e.FilterNodes("default/other", nil)
	wantStatus(t, err, StatusNotFound)
}

func TestNodeListGivesTheSameAnswers(t *testing.T) {
	e := newEngine(t, Options{})
	startDemo(t, e, "2")
	failNode3(t, e)
	nodes := []string{"n0", "n1", "n2", "n3", "n4", ""}
	list, err := NewNodeList(nodes)
	if err != nil {
		t.Fatal(err)
	}
	defer list.Close()
	if list.Len() != len(nodes) {
		t.Fatalf("Len() = %d; want %d", list.Len(), len(nodes))
	}
	want, err := e.FilterNodes(demoJob, nodes)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := e.FilterNodeList(demoJob, list); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("FilterNodeList = %v, %v; FilterNodes = %v", got, err, want)
	}
	for pod := range uint32(4) {
		want, err := e.ScoreNodes(demoJob, pod, nodes)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := e.ScoreNodeList(demoJob, pod, list); err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("ScoreNodeList(pod %d) = %v, %v; ScoreNodes = %v", pod, got, err, want)
		}
	}

	empty, err := NewNodeList(nil)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := e.FilterNodeList(demoJob, empty); err != nil || len(ok) != 0 {
		t.Fatalf("FilterNodeList(empty) = %v, %v", ok, err)
	}
	_, err = NewNodeList([]string{"n0", "n\x001"})
	wantStatus(t, err, StatusInvalidArgument)
	_, err = e.FilterNodeList(demoJob, nil)
	wantStatus(t, err, StatusInvalidArgument)
	_, err = e.ScoreNodeList("default/other", 0, list)
	wantStatus(t, err, StatusNotFound)

	if err := list.Close(); err != nil {
		t.Fatal(err)
	}
	if err := list.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := e.FilterNodeList(demoJob, list); !errors.Is(err, ErrClosed) {
		t.Fatalf("FilterNodeList with a closed list = %v; want ErrClosed", err)
	}
	if _, err := e.ScoreNodeList(demoJob, 0, list); !errors.Is(err, ErrClosed) {
		t.Fatalf("ScoreNodeList with a closed list = %v; want ErrClosed", err)
	}
	if list.Len() != 0 {
		t.Fatalf("Len() of a closed list = %d", list.Len())
	}
}

func TestScoreNodes(t *testing.T) {
	// tensor-parallel 4 over 2 processes per pod: replica r is pods 2r and 2r+1.
	job := bytes.Replace(demoJobJSON("u1", "4"), []byte(`"recover,elastic-training"`),
		[]byte(`"recover"`), 1)
	tests := []struct {
		name   string
		setup  func(e *Engine) error
		pod    uint32
		nodes  []string
		scores []int32
	}{
		{"a peer of the same replica scores 50", nil, 0,
			[]string{"n0", "n1", "n2", "n3"}, []int32{0, 50, 0, 0}},
		{"a deleted pod's previous node scores 100", func(e *Engine) error {
			return e.SetPodState(demoJob, 2, "p2", PodDeleted, "n2", 500)
		}, 2, []string{"n0", "n1", "n2", "n3"}, []int32{0, 0, 100, 50}},
		{"a faulty node scores 0", func(e *Engine) error {
			return e.SetNodeHealth("n3", NodeFaulty, "", 500)
		}, 2, []string{"n2", "n3"}, []int32{0, 0}},
		{"no nodes", nil, 1, nil, []int32{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEngine(t, Options{})
			if _, err := e.UpsertJob(job, 0); err != nil {
				t.Fatal(err)
			}
			for i := range uint32(4) {
				if err := e.SetPodState(demoJob, i, fmt.Sprintf("p%d", i), PodRunning, fmt.Sprintf("n%d", i), 0); err != nil {
					t.Fatal(err)
				}
			}
			if tt.setup != nil {
				if err := tt.setup(e); err != nil {
					t.Fatal(err)
				}
			}
			scores, err := e.ScoreNodes(demoJob, tt.pod, tt.nodes)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(scores, tt.scores) {
				t.Fatalf("ScoreNodes(pod %d, %v) = %v; want %v", tt.pod, tt.nodes, scores, tt.scores)
			}
		})
	}
}

func TestExportImportJobStateRoundTrip(t *testing.T) {
	e := newEngine(t, Options{})
	startDemo(t, e, "2")
	failNode3(t, e)
	state, err := e.ExportJobState(demoJob)
	if err != nil || !json.Valid(state) {
		t.Fatalf("ExportJobState = %s, %v", state, err)
	}
	before, err := e.DecisionJSON(demoJob)
	if err != nil {
		t.Fatal(err)
	}

	// A restarted scheduler: a new engine learns the job again and imports its state.
	f := newEngine(t, Options{})
	if _, err := f.UpsertJob(demoJobJSON("u1", "2"), 5000); err != nil {
		t.Fatal(err)
	}
	if err := f.ImportJobState(demoJob, state); err != nil {
		t.Fatalf("ImportJobState: %v", err)
	}
	// The state names pods by their uids' fingerprints; the scheduler's first session reports
	// the pods it sees, and the lost pod is evicted by its uid again.
	if err := f.SetPodState(demoJob, 3, "p3", PodRunning, "n3", 5000); err != nil {
		t.Fatal(err)
	}
	after, err := f.DecisionJSON(demoJob)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Fatalf("decision after import:\n%s\nwant\n%s", after, before)
	}
	again, err := f.ExportJobState(demoJob)
	if err != nil || !bytes.Equal(again, state) {
		t.Fatalf("state after import:\n%s\nwant\n%s (%v)", again, state, err)
	}
	// The deadline kept its time: the imported job scales in at the same moment.
	if _, err := f.Tick(31300); err != nil {
		t.Fatal(err)
	}
	if d := mustDecision(t, f, demoJob); d.Kind != DirectiveScaleIn || d.DP != 3 {
		t.Fatalf("imported job at the deadline: %+v", d)
	}

	tests := []struct {
		name  string
		job   string
		state []byte
		want  Status
	}{
		{"another job's state", demoJob, bytes.Replace(state, []byte(`"u1"`), []byte(`"u2"`), 1), StatusFailedPrecondition},
		{"malformed state", demoJob, []byte(`{"version":`), StatusInvalidArgument},
		{"state of a newer version", demoJob, bytes.Replace(state, []byte(`"version":2`), []byte(`"version":3`), 1), StatusVersionMismatch},
		{"empty state", demoJob, nil, StatusInvalidArgument},
		{"unknown job", "default/other", state, StatusNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantStatus(t, f.ImportJobState(tt.job, tt.state), tt.want)
		})
	}
}

func TestSnapshotRestoreRoundTrip(t *testing.T) {
	e := newEngine(t, Options{})
	startDemo(t, e, "2")
	failNode3(t, e)
	snapshot, err := e.Snapshot()
	if err != nil || !json.Valid(snapshot) {
		t.Fatalf("Snapshot = %s, %v", snapshot, err)
	}

	f := newEngine(t, Options{})
	if err := f.Restore(snapshot); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	again, err := f.Snapshot()
	if err != nil || !bytes.Equal(again, snapshot) {
		t.Fatalf("snapshot after restore:\n%s\nwant\n%s (%v)", again, snapshot, err)
	}
	// A snapshot names pods by their uids' fingerprints: the scheduler reports the pods it sees
	// (to the original engine this changes nothing), and the lost pod is evicted by uid again.
	for _, eng := range []*Engine{e, f} {
		if err := eng.SetPodState(demoJob, 3, "p3", PodRunning, "n3", 31300); err != nil {
			t.Fatal(err)
		}
		if _, err := eng.Tick(31300); err != nil {
			t.Fatal(err)
		}
	}
	de, df := mustDetail(t, e, demoJob), mustDetail(t, f, demoJob)
	if !reflect.DeepEqual(de, df) || df.Directive.Kind != DirectiveScaleIn {
		t.Fatalf("restored engine decided %+v; the original %+v", df, de)
	}
	if ok, err := f.FilterNodes(demoJob, []string{"n3"}); err != nil || ok[0] {
		t.Fatalf("restored engine allows n3: %v, %v", ok, err)
	}

	// A bad snapshot leaves the engine as it was.
	tests := []struct {
		name     string
		snapshot []byte
		want     Status
	}{
		{"malformed", []byte(`{"version":1,"jobs":[`), StatusInvalidArgument},
		{"newer version", []byte(`{"version":2}`), StatusVersionMismatch},
		{"bad job", []byte(`{"version":1,"jobs":[{"spec":{}}]}`), StatusInvalidArgument},
		{"empty", nil, StatusInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before, err := f.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			wantStatus(t, f.Restore(tt.snapshot), tt.want)
			after, err := f.Snapshot()
			if err != nil || !bytes.Equal(before, after) {
				t.Fatalf("the engine changed after a refused restore (%v)", err)
			}
		})
	}
}

func TestUpsertJobReportsValidation(t *testing.T) {
	e := newEngine(t, Options{})
	report, err := e.UpsertJob(demoJobJSON("u1", "2"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := ParseValidationReport(report); err != nil || !r.OK {
		t.Fatalf("report %s, %v", report, err)
	}
	// An invalid update is refused with its report; the job keeps its configuration.
	report, err = e.UpsertJob(demoJobJSON("u1", "3"), 10)
	wantStatus(t, err, StatusValidationFailed)
	if !errors.Is(err, ErrValidationFailed) {
		t.Errorf("errors.Is(%v, ErrValidationFailed) is false", err)
	}
	r, perr := ParseValidationReport(report)
	if perr != nil || r.OK || len(r.Problems) == 0 {
		t.Fatalf("report of an invalid job: %s (%v)", report, perr)
	}
	if d := mustDecision(t, e, demoJob); d.OriginalDP != 4 {
		t.Fatalf("the refused update changed the job: %+v", d)
	}
	if err := e.RemoveJob(demoJob); err != nil {
		t.Fatal(err)
	}
	_, err = e.Decision(demoJob)
	wantStatus(t, err, StatusNotFound)
}

func TestOptionsLimitTheEngine(t *testing.T) {
	e := newEngine(t, Options{MaxJobs: 1, MaxInputBytes: 4096, HistoryLength: 1})
	startDemo(t, e, "2")
	other := bytes.Replace(demoJobJSON("u9", "2"), []byte(demoJob), []byte("default/other"), 1)
	_, err := e.UpsertJob(other, 0)
	wantStatus(t, err, StatusResourceExhausted)
	_, err = e.UpsertJob(bytes.Repeat([]byte(" "), 5000), 0)
	wantStatus(t, err, StatusResourceExhausted)

	failNode3(t, e)
	if _, err := e.Tick(31300); err != nil {
		t.Fatal(err)
	}
	history, err := e.History(demoJob)
	if err != nil || len(history) != 1 || history[0].Directive.Kind != DirectiveScaleIn {
		t.Fatalf("history of length 1 = %+v, %v", history, err)
	}
}

func TestBadInputsGiveTypedErrors(t *testing.T) {
	e := newEngine(t, Options{})
	startDemo(t, e, "2")
	const other = "default/other"
	tests := []struct {
		name string
		call func() error
		want Status
	}{
		{"upsert malformed JSON", func() error { _, err := e.UpsertJob([]byte(`{"id":"x",`), 0); return err }, StatusInvalidArgument},
		{"upsert wrong type", func() error { _, err := e.UpsertJob([]byte(`{"id":"x","pods":"four"}`), 0); return err }, StatusInvalidArgument},
		{"upsert empty", func() error { _, err := e.UpsertJob([]byte{}, 0); return err }, StatusInvalidArgument},
		{"upsert nil", func() error { _, err := e.UpsertJob(nil, 0); return err }, StatusInvalidArgument},
		{"remove unknown job", func() error { return e.RemoveJob(other) }, StatusNotFound},
		{"remove empty id", func() error { return e.RemoveJob("") }, StatusNotFound},
		{"events malformed", func() error { return e.ApplyEvents([]byte(`[{"type":`), 0) }, StatusInvalidArgument},
		{"events empty", func() error { return e.ApplyEvents(nil, 0) }, StatusInvalidArgument},
		{"event of unknown type", func() error { return e.ApplyEvents([]byte(`{"type":"meteor"}`), 0) }, StatusInvalidArgument},
		{"event of unknown job", func() error {
			return e.ApplyEvents([]byte(`[{"type":"node","node":"n9","health":"healthy"},{"type":"pod","job":"default/other","index":0,"uid":"x","phase":"running"}]`), 0)
		}, StatusNotFound},
		{"event with a bad pod index", func() error {
			return e.ApplyEvents([]byte(`{"type":"pod","job":"default/demo","index":7,"uid":"x","phase":"running"}`), 0)
		}, StatusInvalidArgument},
		{"zombie replacement", func() error {
			return e.ApplyEvents([]byte(`{"type":"replacement_registered","job":"default/demo","index":1,"uid":"other"}`), 0)
		}, StatusFailedPrecondition},
		{"node health of an empty node", func() error { return e.SetNodeHealth("", NodeFaulty, "", 0) }, StatusInvalidArgument},
		{"node health out of range", func() error { return e.SetNodeHealth("n0", NodeHealth(7), "", 0) }, StatusInvalidArgument},
		{"node name with NUL", func() error { return e.SetNodeHealth("n0\x00n1", NodeFaulty, "", 0) }, StatusInvalidArgument},
		{"pod of unknown job", func() error { return e.SetPodState(other, 0, "x", PodRunning, "n0", 0) }, StatusNotFound},
		{"pod index out of range", func() error { return e.SetPodState(demoJob, 4, "x", PodRunning, "n0", 0) }, StatusInvalidArgument},
		{"pod without uid", func() error { return e.SetPodState(demoJob, 0, "", PodRunning, "n0", 0) }, StatusInvalidArgument},
		{"pod phase out of range", func() error { return e.SetPodState(demoJob, 0, "p0", PodPhase(9), "n0", 0) }, StatusInvalidArgument},
		{"job id with NUL", func() error { return e.SetPodState(demoJob+"\x00x", 0, "p0", PodRunning, "n0", 0) }, StatusInvalidArgument},
		{"decision of unknown job", func() error { _, err := e.Decision(other); return err }, StatusNotFound},
		{"decision JSON of unknown job", func() error { _, err := e.DecisionJSON(other); return err }, StatusNotFound},
		{"decision detail of unknown job", func() error { _, err := e.DecisionDetail(other); return err }, StatusNotFound},
		{"history of unknown job", func() error { _, err := e.HistoryJSON(other); return err }, StatusNotFound},
		{"export unknown job", func() error { _, err := e.ExportJobState(other); return err }, StatusNotFound},
		{"filter unknown job", func() error { _, err := e.FilterNodes(other, []string{"n0"}); return err }, StatusNotFound},
		{"filter a node with NUL", func() error { _, err := e.FilterNodes(demoJob, []string{"n0", "n\x001"}); return err }, StatusInvalidArgument},
		{"score unknown job", func() error { _, err := e.ScoreNodes(other, 0, []string{"n0"}); return err }, StatusNotFound},
		{"score pod out of range", func() error { _, err := e.ScoreNodes(demoJob, 99, []string{"n0"}); return err }, StatusInvalidArgument},
		{"restore malformed", func() error { return e.Restore([]byte("nope")) }, StatusInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			wantStatus(t, err, tt.want)
			if !strings.HasPrefix(err.Error(), "regroup: Engine.") || !strings.Contains(err.Error(), tt.want.String()) {
				t.Errorf("error %q does not name the call and the status", err)
			}
		})
	}
	// None of that hurt the job.
	if d := mustDecision(t, e, demoJob); d.Kind != DirectiveContinue || d.DP != 4 {
		t.Fatalf("after the bad inputs: %+v", d)
	}
}

func TestClosedEngine(t *testing.T) {
	e, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	startDemo(t, e, "")
	list, err := NewNodeList([]string{"n0"})
	if err != nil {
		t.Fatal(err)
	}
	defer list.Close()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	calls := map[string]func() error{
		"UpsertJob":      func() error { _, err := e.UpsertJob(demoJobJSON("u1", ""), 0); return err },
		"RemoveJob":      func() error { return e.RemoveJob(demoJob) },
		"ApplyEvents":    func() error { return e.ApplyEvents([]byte(`[]`), 0) },
		"SetNodeHealth":  func() error { return e.SetNodeHealth("n0", NodeHealthy, "", 0) },
		"SetPodState":    func() error { return e.SetPodState(demoJob, 0, "p0", PodRunning, "n0", 0) },
		"Tick":           func() error { _, err := e.Tick(0); return err },
		"Decision":       func() error { _, err := e.Decision(demoJob); return err },
		"DecisionJSON":   func() error { _, err := e.DecisionJSON(demoJob); return err },
		"DecisionDetail": func() error { _, err := e.DecisionDetail(demoJob); return err },
		"HistoryJSON":    func() error { _, err := e.HistoryJSON(demoJob); return err },
		"History":        func() error { _, err := e.History(demoJob); return err },
		"FilterNodes":    func() error { _, err := e.FilterNodes(demoJob, []string{"n0"}); return err },
		"ScoreNodes":     func() error { _, err := e.ScoreNodes(demoJob, 0, []string{"n0"}); return err },
		"FilterNodeList": func() error { _, err := e.FilterNodeList(demoJob, list); return err },
		"ScoreNodeList":  func() error { _, err := e.ScoreNodeList(demoJob, 0, list); return err },
		"ExportJobState": func() error { _, err := e.ExportJobState(demoJob); return err },
		"ImportJobState": func() error { return e.ImportJobState(demoJob, []byte(`{}`)) },
		"Snapshot":       func() error { _, err := e.Snapshot(); return err },
		"Restore":        func() error { return e.Restore([]byte(`{"version":1}`)) },
	}
	for name, call := range calls {
		err := call()
		if !errors.Is(err, ErrClosed) || StatusOf(err) != StatusFailedPrecondition ||
			!strings.Contains(err.Error(), "engine is closed") {
			t.Errorf("%s after Close = %v; want ErrClosed", name, err)
		}
	}
	var nilEngine *Engine
	if err := nilEngine.Close(); err != nil {
		t.Errorf("Close of a nil engine: %v", err)
	}
	_, err = nilEngine.Tick(0)
	wantStatus(t, err, StatusInvalidArgument)
}

func TestConcurrentUse(t *testing.T) {
	e := newEngine(t, Options{})
	shared, err := NewNodeList([]string{"n0", "n1", "n2", "n3"})
	if err != nil {
		t.Fatal(err)
	}
	defer shared.Close()
	const workers = 8
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- func() error {
				job := fmt.Sprintf("default/job-%d", w)
				spec := bytes.Replace(demoJobJSON(fmt.Sprintf("u%d", w), "2"), []byte(demoJob), []byte(job), 1)
				if _, err := e.UpsertJob(spec, 0); err != nil {
					return err
				}
				nodes := make([]string, 4)
				for i := range uint32(4) {
					nodes[i] = fmt.Sprintf("w%d-n%d", w, i)
					if err := e.SetPodState(job, i, fmt.Sprintf("w%d-p%d", w, i), PodRunning, nodes[i], 0); err != nil {
						return err
					}
				}
				for now := int64(0); now < 50*100; now += 100 {
					if err := e.SetNodeHealth(nodes[0], NodeHealthy, "", now); err != nil {
						return err
					}
					if _, err := e.Tick(now); err != nil {
						return err
					}
					if _, err := e.Decision(job); err != nil {
						return err
					}
					if _, err := e.FilterNodes(job, nodes); err != nil {
						return err
					}
					if _, err := e.ScoreNodeList(job, 1, shared); err != nil {
						return err
					}
					if _, err := e.DecisionDetail(job); err != nil {
						return err
					}
				}
				if err := e.SetNodeHealth(nodes[3], NodeFaulty, "", 10000); err != nil {
					return err
				}
				if _, err := e.Tick(10300); err != nil {
					return err
				}
				d, err := e.Decision(job)
				if err != nil {
					return err
				}
				if d.Kind != DirectiveWait {
					return fmt.Errorf("job %s after its node failed: %+v", job, d)
				}
				_, err = e.Snapshot()
				return err
			}()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// TestCloseWhileInUse closes an engine while other goroutines call it: they finish their call or
// get ErrClosed, never a crash.
func TestCloseWhileInUse(t *testing.T) {
	e, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	startDemo(t, e, "2")
	const workers = 4
	started := make(chan struct{}, workers)
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				if i == 10 {
					started <- struct{}{}
				}
				if _, err := e.FilterNodes(demoJob, []string{"n0", "n1"}); err != nil {
					errs[w] = err
					return
				}
				if _, err := e.Tick(int64(i)); err != nil {
					errs[w] = err
					return
				}
			}
		}()
	}
	for range workers {
		<-started
	}
	e.Close()
	wg.Wait()
	for w, err := range errs {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("worker %d stopped with %v; want ErrClosed", w, err)
		}
	}
}
