// SPDX-License-Identifier: Apache-2.0

package regroup

/*
#cgo noescape regroup_engine_new
#cgo nocallback regroup_engine_new
#cgo nocallback regroup_engine_free
#cgo noescape regroup_engine_upsert_job
#cgo nocallback regroup_engine_upsert_job
#cgo noescape regroup_engine_remove_job
#cgo nocallback regroup_engine_remove_job
#cgo noescape regroup_engine_apply_events
#cgo nocallback regroup_engine_apply_events
#cgo noescape regroup_engine_set_node_health
#cgo nocallback regroup_engine_set_node_health
#cgo noescape regroup_engine_set_pod_state
#cgo nocallback regroup_engine_set_pod_state
#cgo noescape regroup_engine_tick
#cgo nocallback regroup_engine_tick
#cgo noescape regroup_engine_decision
#cgo nocallback regroup_engine_decision
#cgo noescape regroup_engine_decision_json
#cgo nocallback regroup_engine_decision_json
#cgo noescape regroup_engine_history_json
#cgo nocallback regroup_engine_history_json
#cgo noescape regroup_engine_export_job_state
#cgo nocallback regroup_engine_export_job_state
#cgo noescape regroup_engine_import_job_state
#cgo nocallback regroup_engine_import_job_state
#cgo noescape regroup_engine_snapshot
#cgo nocallback regroup_engine_snapshot
#cgo noescape regroup_engine_restore
#cgo nocallback regroup_engine_restore

#include <stdlib.h>
#include "regroup.h"
*/
import "C"

import (
	"encoding/json"
	"fmt"
	"runtime"
	"sync"
)

// Options configure an engine. Zero means the library's default for every field.
type Options struct {
	MaxJobs       uint32 // jobs the engine accepts; default 100000
	MaxInputBytes uint32 // largest JSON document accepted; default 4 MiB
	HistoryLength uint32 // decisions kept per job for the timeline; default 64
}

// Engine is a decision engine of the library: jobs, nodes, their faults and the decisions. It is
// safe for concurrent use. Close it when done.
type Engine struct {
	mu           sync.RWMutex // read-held by every call, write-held by Close
	h            *C.regroup_engine
	coordinators *coordinatorSet // the coordinators serving this engine, closed before it
}

// New creates an engine. It first checks the library's ABI version (see the package doc) and
// returns an error of status StatusVersionMismatch for a library it cannot use.
func New(opts Options) (*Engine, error) {
	if err := abiCheck(); err != nil {
		return nil, err
	}
	copts := C.regroup_engine_options{
		version:         C.REGROUP_ENGINE_OPTIONS_VERSION,
		max_jobs:        C.uint32_t(opts.MaxJobs),
		max_input_bytes: C.uint32_t(opts.MaxInputBytes),
		history_length:  C.uint32_t(opts.HistoryLength),
	}
	var h *C.regroup_engine
	var cerr *C.regroup_error
	if err := takeError("New", C.regroup_engine_new(&h, &copts, &cerr), cerr); err != nil {
		return nil, err
	}
	e := &Engine{h: h, coordinators: &coordinatorSet{}}
	runtime.SetFinalizer(e, (*Engine).Close)
	return e, nil
}

// Close frees the engine, after closing the coordinators still serving it. Calls running on
// other goroutines finish first; later calls return ErrClosed. Closing again, or closing a nil
// engine, does nothing.
func (e *Engine) Close() error {
	if e == nil {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.h != nil {
		e.coordinators.closeAll()
		C.regroup_engine_free(e.h)
		e.h = nil
		runtime.SetFinalizer(e, nil)
	}
	return nil
}

// acquire read-locks the engine for one call and returns its handle; the caller defers
// e.mu.RUnlock() when err is nil.
func (e *Engine) acquire(op string) (*C.regroup_engine, error) {
	if e == nil {
		return nil, newError(op, StatusInvalidArgument, "the engine is nil; create one with regroup.New")
	}
	e.mu.RLock()
	if e.h == nil {
		e.mu.RUnlock()
		return nil, closedError(op, "engine", "New")
	}
	return e.h, nil
}

// UpsertJob adds a job or updates its spec (JSON). It returns the validation report, also when
// the job is invalid (status StatusValidationFailed); the engine then keeps what it had. Updating
// a running job keeps its state and applies the new configuration from the next decision on.
func (e *Engine) UpsertJob(jobJSON []byte, nowMs int64) (report []byte, err error) {
	const op = "Engine.UpsertJob"
	h, err := e.acquire(op)
	if err != nil {
		return nil, err
	}
	defer e.mu.RUnlock()
	text, n := cText(jobJSON)
	var out *C.char
	var cerr *C.regroup_error
	status := C.regroup_engine_upsert_job(h, &out, text, n, C.int64_t(nowMs), &cerr)
	return takeString(out), takeError(op, status, cerr)
}

// RemoveJob removes a job and its state; StatusNotFound if the engine does not know it.
func (e *Engine) RemoveJob(job string) error {
	const op = "Engine.RemoveJob"
	var args cArgs
	cjob, err := args.str(op, "job id", job)
	if err != nil {
		return err
	}
	h, err := e.acquire(op)
	if err != nil {
		return err
	}
	defer e.mu.RUnlock()
	var cerr *C.regroup_error
	return takeError(op, C.regroup_engine_remove_job(h, cjob, &cerr), cerr)
}

// ApplyEvents applies one event or a JSON array of events (fields "type": "node", "pod",
// "fault", "replacement_registered", "manager_progress"). The events of an array are applied in
// order; the first bad one stops the call with an error naming its index, and the events before
// it stay applied.
func (e *Engine) ApplyEvents(eventsJSON []byte, nowMs int64) error {
	const op = "Engine.ApplyEvents"
	h, err := e.acquire(op)
	if err != nil {
		return err
	}
	defer e.mu.RUnlock()
	text, n := cText(eventsJSON)
	var cerr *C.regroup_error
	return takeError(op, C.regroup_engine_apply_events(h, text, n, C.int64_t(nowMs), &cerr), cerr)
}

// SetNodeHealth sets one node's health; reason may be "". Setting the health a node already has
// is cheap and changes nothing.
func (e *Engine) SetNodeHealth(node string, health NodeHealth, reason string, nowMs int64) error {
	const op = "Engine.SetNodeHealth"
	var args cArgs
	cnode, err := args.str(op, "node name", node)
	if err != nil {
		return err
	}
	creason, err := args.str(op, "reason", reason)
	if err != nil {
		return err
	}
	h, err := e.acquire(op)
	if err != nil {
		return err
	}
	defer e.mu.RUnlock()
	var cerr *C.regroup_error
	status := C.regroup_engine_set_node_health(h, cnode, C.regroup_node_health(health), creason,
		C.int64_t(nowMs), &cerr)
	return takeError(op, status, cerr)
}

// SetPodState reports pod podIndex (its node rank) of a job: its uid, phase and node ("" when not
// bound). A uid the engine has not seen for that index is a replacement pod. Setting the state a
// pod already has is cheap and changes nothing.
func (e *Engine) SetPodState(job string, podIndex uint32, uid string, phase PodPhase, node string,
	nowMs int64) error {
	const op = "Engine.SetPodState"
	var args cArgs
	cjob, err := args.str(op, "job id", job)
	if err != nil {
		return err
	}
	cuid, err := args.str(op, "pod uid", uid)
	if err != nil {
		return err
	}
	cnode, err := args.str(op, "node name", node)
	if err != nil {
		return err
	}
	h, err := e.acquire(op)
	if err != nil {
		return err
	}
	defer e.mu.RUnlock()
	var cerr *C.regroup_error
	status := C.regroup_engine_set_pod_state(h, cjob, C.uint32_t(podIndex), cuid,
		C.regroup_pod_phase(phase), cnode, C.int64_t(nowMs), &cerr)
	return takeError(op, status, cerr)
}

// Tick advances every job to nowMs: closes report windows, decides, expires deadlines, starts
// scale-outs. It returns how many jobs got a new directive.
func (e *Engine) Tick(nowMs int64) (changed uint32, err error) {
	const op = "Engine.Tick"
	h, err := e.acquire(op)
	if err != nil {
		return 0, err
	}
	defer e.mu.RUnlock()
	var cchanged C.uint32_t
	var cerr *C.regroup_error
	if err := takeError(op, C.regroup_engine_tick(h, C.int64_t(nowMs), &cchanged, &cerr), cerr); err != nil {
		return 0, err
	}
	return uint32(cchanged), nil
}

// Decision returns a job's current decision, typed: the fast path of a scheduling session.
func (e *Engine) Decision(job string) (Decision, error) {
	const op = "Engine.Decision"
	var args cArgs
	cjob, err := args.str(op, "job id", job)
	if err != nil {
		return Decision{}, err
	}
	h, err := e.acquire(op)
	if err != nil {
		return Decision{}, err
	}
	defer e.mu.RUnlock()
	d := C.regroup_decision{version: C.REGROUP_DECISION_VERSION, deadline_ms: -1}
	var cerr *C.regroup_error
	if err := takeError(op, C.regroup_engine_decision(h, &d, cjob, &cerr), cerr); err != nil {
		return Decision{}, err
	}
	return Decision{
		Phase:       Phase(d.phase),
		Kind:        DirectiveKind(d.kind),
		DirectiveID: uint64(d.directive_id),
		DeadlineMs:  int64(d.deadline_ms),
		DP:          uint32(d.dp),
		OriginalDP:  uint32(d.original_dp),
		GangMin:     uint32(d.gang_min),
		WantsPods:   d.wants_pods != 0,
		Evictions:   uint32(d.evictions),
	}, nil
}

// The calls that write a job's JSON document.
type jobDocument int

const (
	decisionDocument jobDocument = iota
	historyDocument
	stateDocument
)

// jobDocument runs one of the calls that write a job's JSON document.
func (e *Engine) jobDocument(op, job string, doc jobDocument) ([]byte, error) {
	var args cArgs
	cjob, err := args.str(op, "job id", job)
	if err != nil {
		return nil, err
	}
	h, err := e.acquire(op)
	if err != nil {
		return nil, err
	}
	defer e.mu.RUnlock()
	var out *C.char
	var cerr *C.regroup_error
	var status C.regroup_status
	switch doc {
	case decisionDocument:
		status = C.regroup_engine_decision_json(h, &out, cjob, &cerr)
	case historyDocument:
		status = C.regroup_engine_history_json(h, &out, cjob, &cerr)
	case stateDocument:
		status = C.regroup_engine_export_job_state(h, &out, cjob, &cerr)
	}
	text := takeString(out)
	if err := takeError(op, status, cerr); err != nil {
		return nil, err
	}
	return text, nil
}

// DecisionJSON returns a job's decision as the library writes it (JSON): phase, directive
// (kind, id, dp, kept and removed replicas, standby pods, restart ranks, micro-batches,
// deadline, reason) and the scheduler's part (evictions, nodes to avoid, gang minimum, wants
// pods). DecisionDetail decodes it.
func (e *Engine) DecisionJSON(job string) ([]byte, error) {
	return e.jobDocument("Engine.DecisionJSON", job, decisionDocument)
}

// DecisionDetail returns a job's decision with everything the JSON document has.
func (e *Engine) DecisionDetail(job string) (*DecisionDetail, error) {
	text, err := e.DecisionJSON(job)
	if err != nil {
		return nil, err
	}
	var d DecisionDetail
	if err := json.Unmarshal(text, &d); err != nil {
		return nil, fmt.Errorf("regroup: Engine.DecisionDetail: decoding the decision of job %s: %w", job, err)
	}
	return &d, nil
}

// HistoryJSON returns a job's timeline (JSON): its last decisions, oldest first.
func (e *Engine) HistoryJSON(job string) ([]byte, error) {
	return e.jobDocument("Engine.HistoryJSON", job, historyDocument)
}

// History returns a job's timeline, decoded.
func (e *Engine) History(job string) ([]HistoryEntry, error) {
	text, err := e.HistoryJSON(job)
	if err != nil {
		return nil, err
	}
	var h []HistoryEntry
	if err := json.Unmarshal(text, &h); err != nil {
		return nil, fmt.Errorf("regroup: Engine.History: decoding the timeline of job %s: %w", job, err)
	}
	return h, nil
}

// ExportJobState returns a job's compact state (JSON), to store in its PodGroup's annotations.
func (e *Engine) ExportJobState(job string) ([]byte, error) {
	return e.jobDocument("Engine.ExportJobState", job, stateDocument)
}

// ImportJobState restores a job's state exported by ExportJobState, for example after a
// scheduler restart. The job must have been upserted first. A state of another job (id or uid
// differ) is refused with StatusFailedPrecondition.
func (e *Engine) ImportJobState(job string, state []byte) error {
	const op = "Engine.ImportJobState"
	var args cArgs
	cjob, err := args.str(op, "job id", job)
	if err != nil {
		return err
	}
	h, err := e.acquire(op)
	if err != nil {
		return err
	}
	defer e.mu.RUnlock()
	text, n := cText(state)
	var cerr *C.regroup_error
	return takeError(op, C.regroup_engine_import_job_state(h, cjob, text, n, &cerr), cerr)
}

// Snapshot returns the whole engine (jobs with their specs and states, nodes) as JSON.
func (e *Engine) Snapshot() ([]byte, error) {
	const op = "Engine.Snapshot"
	h, err := e.acquire(op)
	if err != nil {
		return nil, err
	}
	defer e.mu.RUnlock()
	var out *C.char
	var cerr *C.regroup_error
	status := C.regroup_engine_snapshot(h, &out, &cerr)
	text := takeString(out)
	if err := takeError(op, status, cerr); err != nil {
		return nil, err
	}
	return text, nil
}

// Restore replaces the engine's whole content by a snapshot. On any error the engine is
// unchanged.
func (e *Engine) Restore(snapshot []byte) error {
	const op = "Engine.Restore"
	h, err := e.acquire(op)
	if err != nil {
		return err
	}
	defer e.mu.RUnlock()
	text, n := cText(snapshot)
	var cerr *C.regroup_error
	return takeError(op, C.regroup_engine_restore(h, text, n, &cerr), cerr)
}
