// SPDX-License-Identifier: Apache-2.0

package regroup

import (
	"encoding/json"
	"fmt"
)

// The names below are the engine's own (plugin/engine.cc): the JSON it writes uses them, and
// String and UnmarshalText read and write them.

// NodeHealth is a node's health (regroup_node_health).
type NodeHealth int

// Node healths.
const (
	NodeHealthy NodeHealth = iota
	NodeFaulty
	NodeUnknown
)

var nodeHealthNames = []string{"healthy", "faulty", "unknown"}

func (h NodeHealth) String() string { return enumName(nodeHealthNames, int(h), "NodeHealth") }

// MarshalText writes the health's name.
func (h NodeHealth) MarshalText() ([]byte, error) {
	return enumMarshal(nodeHealthNames, int(h), "NodeHealth")
}

// UnmarshalText reads a health's name.
func (h *NodeHealth) UnmarshalText(text []byte) error {
	return enumUnmarshal(nodeHealthNames, text, "node health", (*int)(h))
}

// PodPhase is a pod's phase as the scheduler sees it (regroup_pod_phase).
type PodPhase int

// Pod phases.
const (
	PodPending PodPhase = iota
	PodBound
	PodRunning
	PodFailed
	PodDeleted
)

var podPhaseNames = []string{"pending", "bound", "running", "failed", "deleted"}

func (p PodPhase) String() string { return enumName(podPhaseNames, int(p), "PodPhase") }

// MarshalText writes the phase's name.
func (p PodPhase) MarshalText() ([]byte, error) {
	return enumMarshal(podPhaseNames, int(p), "PodPhase")
}

// UnmarshalText reads a phase's name.
func (p *PodPhase) UnmarshalText(text []byte) error {
	return enumUnmarshal(podPhaseNames, text, "pod phase", (*int)(p))
}

// Phase is a job's phase (regroup_phase).
type Phase int

// Job phases.
const (
	PhaseRunning    Phase = iota // training at full size
	PhaseRecovering              // retry or in-place restart in progress
	PhaseWaiting                 // waiting for replacements until the directive's deadline
	PhaseScaledIn                // training on fewer replicas
	PhaseScalingOut              // a larger generation is being formed
	PhasePaused                  // process-recover-enable=pause: faults held
	PhaseDumping                 // survivors write a checkpoint, then exit
	PhaseExiting                 // the job stops with a reason
	PhaseRestarting              // the job is being rescheduled (every pod, or the faulty ones)
	PhaseFailed                  // the job's configuration was refused
)

var phaseNames = []string{"running", "recovering", "waiting", "scaled_in", "scaling_out",
	"paused", "dumping", "exiting", "restarting", "failed"}

func (p Phase) String() string { return enumName(phaseNames, int(p), "Phase") }

// MarshalText writes the phase's name.
func (p Phase) MarshalText() ([]byte, error) { return enumMarshal(phaseNames, int(p), "Phase") }

// UnmarshalText reads a phase's name.
func (p *Phase) UnmarshalText(text []byte) error {
	return enumUnmarshal(phaseNames, text, "job phase", (*int)(p))
}

// DirectiveKind is what a job's manager is told to do (regroup_directive_kind).
type DirectiveKind int

// Directive kinds.
const (
	DirectiveContinue       DirectiveKind = iota // nothing to do
	DirectiveRetry                               // abort the step everywhere and do it again
	DirectiveRestartInPlace                      // restart these ranks' processes on their pods
	DirectiveWait                                // survivors wait for replacements until the deadline
	DirectiveResume                              // replacements arrived: form the generation at dp
	DirectiveScaleIn                             // continue at dp without the removed replicas
	DirectiveScaleOut                            // grow to dp at the next step boundary
	DirectiveDump                                // survivors checkpoint and exit
	DirectiveExit                                // stop the job
	DirectiveRestartJob                          // reschedule: every process restarts from the newest checkpoint
)

var directiveKindNames = []string{"continue", "retry", "restart_in_place", "wait", "resume",
	"scale_in", "scale_out", "dump", "exit", "restart_job"}

func (k DirectiveKind) String() string {
	return enumName(directiveKindNames, int(k), "DirectiveKind")
}

// MarshalText writes the kind's name.
func (k DirectiveKind) MarshalText() ([]byte, error) {
	return enumMarshal(directiveKindNames, int(k), "DirectiveKind")
}

// UnmarshalText reads a kind's name.
func (k *DirectiveKind) UnmarshalText(text []byte) error {
	return enumUnmarshal(directiveKindNames, text, "directive kind", (*int)(k))
}

func enumName(names []string, v int, typ string) string {
	if v >= 0 && v < len(names) {
		return names[v]
	}
	return fmt.Sprintf("%s(%d)", typ, v)
}

func enumMarshal(names []string, v int, typ string) ([]byte, error) {
	if v >= 0 && v < len(names) {
		return []byte(names[v]), nil
	}
	return nil, fmt.Errorf("regroup: %s(%d) has no name", typ, v)
}

func enumUnmarshal(names []string, text []byte, what string, out *int) error {
	for i, name := range names {
		if name == string(text) {
			*out = i
			return nil
		}
	}
	return fmt.Errorf("regroup: %q is not a %s this package knows", text, what)
}

// Decision is a job's current decision, typed (regroup_decision): the fast path a scheduling
// session reads for every job. DecisionDetail has the replica lists and the reason.
type Decision struct {
	Phase       Phase
	Kind        DirectiveKind
	DirectiveID uint64 // grows by one with every new directive of the job
	DeadlineMs  int64  // DirectiveWait: until when; otherwise -1
	DP          uint32 // data-parallel degree of the directive (current if none)
	OriginalDP  uint32 // the job's full data-parallel degree
	GangMin     uint32 // the job's gang minimum (pods) now
	WantsPods   bool   // the job wants replacement pods scheduled
	Evictions   uint32 // pods the scheduler should evict now
}

// DecisionDetail is a job's decision as regroup_engine_decision_json writes it.
type DecisionDetail struct {
	Job        string    `json:"job"`
	Phase      Phase     `json:"phase"`
	DP         int64     `json:"dp"`
	OriginalDP int64     `json:"original_dp"`
	Directive  Directive `json:"directive"`
	Scheduler  Scheduler `json:"scheduler"`
}

// Directive is what the job's manager is told to do.
type Directive struct {
	ID             uint64        `json:"id"`
	Kind           DirectiveKind `json:"kind"`
	AtMs           int64         `json:"at_ms"`
	DeadlineMs     int64         `json:"deadline_ms"` // -1 when the directive has none
	Strategy       string        `json:"strategy"`    // the ladder step carried out; "" for continue
	DP             int64         `json:"dp"`
	KeepReplicas   []int64       `json:"keep_replicas"`
	RemoveReplicas []int64       `json:"remove_replicas"`
	StandbyPods    []int64       `json:"standby_pods"`
	RestartRanks   []int64       `json:"restart_ranks"`
	Microbatches   []int64       `json:"microbatches"` // per kept replica; empty without a batch
	CommittedStep  int64         `json:"committed_step"`
	Reason         string        `json:"reason"`
}

// UnmarshalJSON reads a directive; an absent deadline_ms or committed_step reads as -1.
func (d *Directive) UnmarshalJSON(b []byte) error {
	type plain Directive // without this method
	p := plain{DeadlineMs: -1, CommittedStep: -1}
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	*d = Directive(p)
	return nil
}

// EvictionMode says how the scheduler removes a pod.
type EvictionMode string

// Eviction modes (the job's fault-scheduling label).
const (
	EvictForce EvictionMode = "force" // at once
	EvictGrace EvictionMode = "grace" // with the pod's grace period
)

// Eviction is a pod the scheduler should evict now.
type Eviction struct {
	Pod  int64        `json:"pod"`
	UID  string       `json:"uid"`
	Node string       `json:"node"`
	Mode EvictionMode `json:"mode"`
}

// AvoidedNode is a node the job's pods avoid until UntilMs.
type AvoidedNode struct {
	Node    string `json:"node"`
	UntilMs int64  `json:"until_ms"`
}

// Scheduler is the scheduler's part of a decision.
type Scheduler struct {
	Evict      []Eviction    `json:"evict"`
	AvoidNodes []AvoidedNode `json:"avoid_nodes"`
	GangMin    uint32        `json:"gang_min"`
	WantsPods  bool          `json:"wants_pods"`
}

// HistoryEntry is one decision of a job's timeline: the directive and the phase it set.
type HistoryEntry struct {
	Phase     Phase
	Directive Directive
}

// UnmarshalJSON reads an entry of regroup_engine_history_json: a directive object with a
// "phase" field.
func (h *HistoryEntry) UnmarshalJSON(b []byte) error {
	var phase struct {
		Phase Phase `json:"phase"`
	}
	if err := json.Unmarshal(b, &phase); err != nil {
		return err
	}
	var d Directive
	if err := json.Unmarshal(b, &d); err != nil {
		return err
	}
	h.Phase, h.Directive = phase.Phase, d
	return nil
}

// MarshalJSON writes the entry as the library does: the directive with a "phase" field.
func (h HistoryEntry) MarshalJSON() ([]byte, error) {
	type plain Directive
	return json.Marshal(struct {
		plain
		Phase Phase `json:"phase"`
	}{plain(h.Directive), h.Phase})
}

// ValidationReport is the report of ValidateJob and Engine.UpsertJob, decoded.
type ValidationReport struct {
	OK       bool                       `json:"ok"`
	Problems []Problem                  `json:"problems"`
	Config   map[string]json.RawMessage `json:"config"` // every key's resolved value
}

// Problem is one problem the validator found in a job's configuration.
type Problem struct {
	Severity string `json:"severity"` // "warning" or "error"
	Key      string `json:"key"`
	Value    string `json:"value"`
	Message  string `json:"message"`
}

// ParseValidationReport decodes a validation report.
func ParseValidationReport(report []byte) (*ValidationReport, error) {
	var r ValidationReport
	if err := json.Unmarshal(report, &r); err != nil {
		return nil, fmt.Errorf("regroup: decoding a validation report: %w", err)
	}
	return &r, nil
}
