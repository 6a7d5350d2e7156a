// SPDX-License-Identifier: Apache-2.0

package regroup

/*
#cgo noescape regroup_coordinator_start
#cgo nocallback regroup_coordinator_start
#cgo nocallback regroup_coordinator_port
#cgo nocallback regroup_coordinator_publish
#cgo nocallback regroup_coordinator_free
#cgo noescape regroup_coordinator_export_job_state
#cgo nocallback regroup_coordinator_export_job_state
#cgo noescape regroup_coordinator_state_saved
#cgo nocallback regroup_coordinator_state_saved
#cgo noescape regroup_coordinator_save_wanted
#cgo nocallback regroup_coordinator_save_wanted

#include <stdlib.h>
#include "regroup.h"
*/
import "C"

import (
	"runtime"
	"sync"
)

// CoordinatorOptions configure a coordinator. An empty field means the library's default.
type CoordinatorOptions struct {
	Listen string // "HOST:PORT" to listen on; default "0.0.0.0:8899"; port 0: any free port
	// Credential is the cluster key: each manager sends its own job's token, derived from it
	// (regroupctl token), which lets it act as that job only. Required unless Insecure.
	Credential  string
	TLSCertFile string // serve TLS with this certificate (PEM) and TLSKeyFile; both or neither
	TLSKeyFile  string
	// TLSClientCAFile asks for mutual TLS: every manager must present a certificate this CA
	// bundle (PEM) signed, or its handshake fails. Needs TLSCertFile and TLSKeyFile. ABI 1.8.
	TLSClientCAFile string
	// Insecure serves without a credential, accepting only managers that send none (tests on a
	// trusted network). Never the default: the caller asks for it, and logs it at every start.
	Insecure bool
	// LeaseMs is the managers' lease: a manager commits a step only within this long of asking
	// the coordinator, so that one cut off from it stops committing before a newer manager of
	// its job is given a lease. 0: 10000 (10 s); at most 600000.
	LeaseMs int64
}

// Coordinator is the library's gRPC server (service regroup.v1.Coordinator) that connects the
// jobs' managers to an engine: managers report their facts (faults, replacements registered,
// progress), which the engine receives as events, and receive their job's directive. The
// coordinator grants each manager its epoch; only the newest manager (highest epoch) of a job is
// served. The engine applies the facts at the wall
// clock (milliseconds since the Unix epoch), so drive it with time.Now().UnixMilli().
//
// After each [Engine.Tick], call [Coordinator.Publish] so that every manager whose directive
// changed receives it. A Coordinator is safe for concurrent use. Close it before its engine;
// [Engine.Close] closes the coordinators still open on it.
type Coordinator struct {
	c      *coordinatorHandle
	engine *Engine // keeps the engine alive while the coordinator serves it
}

// coordinatorHandle is the C coordinator. The engine's coordinatorSet holds it (not the
// Coordinator), so a Coordinator nobody holds is finalized, and the engine is not part of a
// cycle with a finalizer.
type coordinatorHandle struct {
	mu   sync.RWMutex // read-held by Publish and Port, write-held by close
	h    *C.regroup_coordinator
	port int
	set  *coordinatorSet
}

// coordinatorSet holds an engine's open coordinators, which Engine.Close frees before the engine.
type coordinatorSet struct {
	mu   sync.Mutex
	open map[*coordinatorHandle]struct{}
}

func (s *coordinatorSet) add(c *coordinatorHandle) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open == nil {
		s.open = make(map[*coordinatorHandle]struct{})
	}
	s.open[c] = struct{}{}
}

func (s *coordinatorSet) remove(c *coordinatorHandle) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.open, c)
}

// closeAll frees every open coordinator (called with the engine's write lock held).
func (s *coordinatorSet) closeAll() {
	s.mu.Lock()
	open := s.open
	s.open = nil
	s.mu.Unlock()
	for c := range open {
		c.close()
	}
}

func (c *coordinatorHandle) close() {
	c.mu.Lock()
	if c.h != nil {
		C.regroup_coordinator_free(c.h)
		c.h = nil
	}
	c.mu.Unlock()
	c.set.remove(c)
}

// StartCoordinator starts a coordinator serving engine e. It fails with StatusInvalidArgument for
// an address it cannot listen on (the message names it), a TLS file it cannot read, a
// TLSClientCAFile without TLSCertFile and TLSKeyFile, or no Credential without Insecure.
func StartCoordinator(e *Engine, opts CoordinatorOptions) (*Coordinator, error) {
	const op = "StartCoordinator"
	cstrings, free, err := cStrings(op, true, cArg{"listen address", opts.Listen},
		cArg{"credential", opts.Credential}, cArg{"TLS certificate file", opts.TLSCertFile},
		cArg{"TLS key file", opts.TLSKeyFile}, cArg{"TLS client CA file", opts.TLSClientCAFile})
	if err != nil {
		return nil, err
	}
	defer free()
	h, err := e.acquire(op)
	if err != nil {
		return nil, err
	}
	defer e.mu.RUnlock()
	copts := C.regroup_coordinator_options{
		version:            C.REGROUP_COORDINATOR_OPTIONS_VERSION,
		listen:             cstrings[0],
		credential:         cstrings[1],
		tls_cert_file:      cstrings[2],
		tls_key_file:       cstrings[3],
		tls_client_ca_file: cstrings[4],
	}
	if opts.Insecure {
		copts.insecure = 1
	}
	copts.lease_ms = C.int64_t(opts.LeaseMs)
	var ch *C.regroup_coordinator
	var cerr *C.regroup_error
	if err := takeError(op, C.regroup_coordinator_start(&ch, h, &copts, &cerr), cerr); err != nil {
		return nil, err
	}
	inner := &coordinatorHandle{h: ch, port: int(C.regroup_coordinator_port(ch)), set: e.coordinators}
	e.coordinators.add(inner)
	c := &Coordinator{c: inner, engine: e}
	runtime.SetFinalizer(c, (*Coordinator).Close)
	return c, nil
}

// Port returns the port the coordinator listens on (the one chosen for port 0); 0 once closed.
func (c *Coordinator) Port() int {
	if c == nil {
		return 0
	}
	c.c.mu.RLock()
	defer c.c.mu.RUnlock()
	if c.c.h == nil {
		return 0
	}
	return c.c.port
}

// Publish sends every attached manager its job's current directive when the directive changed
// since it was last sent; a manager whose job the engine no longer has is told so. Call it after
// each Engine.Tick.
func (c *Coordinator) Publish() error {
	const op = "Coordinator.Publish"
	if c == nil {
		return newError(op, StatusInvalidArgument, "the coordinator is nil; start one with regroup.StartCoordinator")
	}
	c.c.mu.RLock()
	defer c.c.mu.RUnlock()
	if c.c.h == nil {
		return closedError(op, "coordinator", "StartCoordinator")
	}
	var cerr *C.regroup_error
	return takeError(op, C.regroup_coordinator_publish(c.c.h, &cerr), cerr)
}

// FactMark says which of a job's manager's facts an exported state holds (ExportJobState).
type FactMark struct {
	Epoch uint64 // the manager epoch whose facts are counted
	Seq   uint64 // the last of its facts the state holds
}

// ExportJobState returns a job's state, as Engine.ExportJobState does, and the mark of its
// manager's facts it holds, read together. Store the state where a restarted scheduler imports
// it from, then call StateSaved with the mark: from the first StateSaved on, the coordinator
// acknowledges to a manager only the facts a stored state holds, and the manager sends the
// others again to a restarted coordinator, whose engine came back without them.
func (c *Coordinator) ExportJobState(job string) ([]byte, FactMark, error) {
	const op = "Coordinator.ExportJobState"
	var mark FactMark
	if c == nil {
		return nil, mark, newError(op, StatusInvalidArgument, "the coordinator is nil; start one with regroup.StartCoordinator")
	}
	var args cArgs
	cjob, err := args.str(op, "job id", job)
	if err != nil {
		return nil, mark, err
	}
	c.c.mu.RLock()
	defer c.c.mu.RUnlock()
	if c.c.h == nil {
		return nil, mark, closedError(op, "coordinator", "StartCoordinator")
	}
	var out *C.char
	var epoch, seq C.uint64_t
	var cerr *C.regroup_error
	status := C.regroup_coordinator_export_job_state(c.c.h, cjob, &out, &epoch, &seq, &cerr)
	text := takeString(out)
	if err := takeError(op, status, cerr); err != nil {
		return nil, mark, err
	}
	return text, FactMark{Epoch: uint64(epoch), Seq: uint64(seq)}, nil
}

// StateSaved tells the coordinator that the state exported with mark is stored: the facts it
// holds are acknowledged to the job's manager.
func (c *Coordinator) StateSaved(job string, mark FactMark) error {
	const op = "Coordinator.StateSaved"
	if c == nil {
		return newError(op, StatusInvalidArgument, "the coordinator is nil; start one with regroup.StartCoordinator")
	}
	var args cArgs
	cjob, err := args.str(op, "job id", job)
	if err != nil {
		return err
	}
	c.c.mu.RLock()
	defer c.c.mu.RUnlock()
	if c.c.h == nil {
		return closedError(op, "coordinator", "StartCoordinator")
	}
	var cerr *C.regroup_error
	return takeError(op, C.regroup_coordinator_state_saved(c.c.h, cjob, C.uint64_t(mark.Epoch),
		C.uint64_t(mark.Seq), &cerr), cerr)
}

// SaveWanted says that the job's state names a lease holder no stored state names yet: a new
// manager's first lease waits until one does (after a restart the stored holder is leased at
// once). Export, store and StateSaved at the next session even if nothing else changed. False
// for a nil or closed coordinator, an unknown job, or before the first StateSaved.
func (c *Coordinator) SaveWanted(job string) bool {
	if c == nil {
		return false
	}
	var args cArgs
	cjob, err := args.str("Coordinator.SaveWanted", "job id", job)
	if err != nil {
		return false
	}
	c.c.mu.RLock()
	defer c.c.mu.RUnlock()
	if c.c.h == nil {
		return false
	}
	return C.regroup_coordinator_save_wanted(c.c.h, cjob) != 0
}

// Close stops the coordinator: its managers' streams end (they reconnect to the next one) and its
// port is released. A Publish running on another goroutine finishes first; later calls return
// ErrClosed. Closing again, or closing a nil coordinator, does nothing.
func (c *Coordinator) Close() error {
	if c == nil {
		return nil
	}
	c.c.close()
	runtime.SetFinalizer(c, nil)
	return nil
}
