// SPDX-License-Identifier: Apache-2.0

package volcano

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/regroup-dev/regroup/go/regroup"
)

// Runtime is what outlives a scheduling session. Volcano builds a new plugin instance for every
// session, so the engine, the coordinator and what the plugin last told the engine live here,
// in one process-wide instance (Shared); tests reset it with ResetShared.
type Runtime struct {
	// mu is held for a whole OnSessionOpen and OnSessionClose. Volcano runs one session at a
	// time; the lock makes that an invariant rather than an assumption.
	mu     sync.Mutex
	engine *regroup.Engine

	coordinator  *regroup.Coordinator
	coordAddr    string    // the address it listens on
	coordLastTry time.Time // the last failed start, to retry at most every coordinatorRetry
	coordErr     error
	clusterKey   string // the coordinator's credential, from which each job's token is derived

	nodes map[string]nodeState  // the health last reported per node
	jobs  map[string]*jobRecord // by engine job id ("namespace/name")

	mcLogged map[string]string // MindCluster ConfigMap (or namespace) -> the problem last logged
}

// nodeState is a node's health as last reported to the engine.
type nodeState struct {
	health regroup.NodeHealth
	reason string
}

// coordinatorRetry is how long the runtime waits before trying again to start a coordinator that
// could not listen.
const coordinatorRetry = 30 * time.Second

// NewRuntime creates a runtime with a fresh engine. Close it when done.
func NewRuntime() (*Runtime, error) {
	e, err := regroup.New(regroup.Options{})
	if err != nil {
		return nil, err
	}
	return &Runtime{
		engine: e,
		nodes:  map[string]nodeState{},
		jobs:   map[string]*jobRecord{},
	}, nil
}

// Engine returns the runtime's engine.
func (r *Runtime) Engine() *regroup.Engine { return r.engine }

// CoordinatorPort returns the port of the runtime's coordinator, 0 when none is running.
func (r *Runtime) CoordinatorPort() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.coordinator.Port()
}

// Close stops the coordinator and frees the engine.
func (r *Runtime) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.coordinator != nil {
		r.coordinator.Close()
		r.coordinator = nil
	}
	return r.engine.Close()
}

// ensureCoordinator starts the coordinator once. Volcano opens sessions only in the elected
// leader, so the first session of a leader starts it; a standby scheduler never listens. A start
// that fails (the port is taken) is logged and tried again after coordinatorRetry. Called with
// r.mu held.
func (r *Runtime) ensureCoordinator(cfg coordinatorConfig, now time.Time) {
	if cfg.listen == "" || r.coordinator != nil {
		return
	}
	if r.coordErr != nil && now.Sub(r.coordLastTry) < coordinatorRetry {
		return
	}
	opts := regroup.CoordinatorOptions{Listen: cfg.listen, TLSCertFile: cfg.tlsCert, TLSKeyFile: cfg.tlsKey,
		TLSClientCAFile: cfg.tlsClientCA, LeaseMs: int64(cfg.leaseMs)}
	switch {
	case cfg.tlsClientCA != "" && (cfg.tlsCert == "" || cfg.tlsKey == ""):
		// Managers' certificates are checked only over TLS: a client CA alone checks nobody.
		r.coordErr = fmt.Errorf("%s %s needs %s and %s: the managers' certificates are checked "+
			"only over TLS", argTLSClientCAFile, cfg.tlsClientCA, argTLSCertFile, argTLSKeyFile)
		r.coordLastTry = now
		klog.Errorf("regroup: not starting the coordinator: %v", r.coordErr)
		return
	case cfg.credentialFile == "" && !cfg.insecure:
		// A coordinator without the token would accept anyone as any job's manager.
		r.coordErr = fmt.Errorf("no credential: set %s to the file holding the managers' token, "+
			"or %s: true to accept every manager (testing only)", argCredentialFile, argInsecure)
		r.coordLastTry = now
		klog.Errorf("regroup: not starting the coordinator: %v", r.coordErr)
		return
	case cfg.credentialFile == "":
		opts.Insecure = true
	default:
		b, err := os.ReadFile(cfg.credentialFile)
		if err != nil {
			r.coordErr, r.coordLastTry = err, now
			klog.Errorf("regroup: not starting the coordinator: reading the credential file %s (%s): %v",
				cfg.credentialFile, argCredentialFile, err)
			return
		}
		opts.Credential = strings.TrimSpace(string(b))
		if opts.Credential == "" {
			// An empty token would start the coordinator open to anyone: refuse, as the manager does.
			r.coordErr = fmt.Errorf("the credential file %s is empty: it must hold the cluster key",
				cfg.credentialFile)
			r.coordLastTry = now
			klog.Errorf("regroup: not starting the coordinator: %v (%s)", r.coordErr, argCredentialFile)
			return
		}
	}
	c, err := regroup.StartCoordinator(r.engine, opts)
	if err != nil {
		r.coordErr, r.coordLastTry = err, now
		klog.Errorf("regroup: the coordinator could not start on %s (%s); managers cannot attach "+
			"until it does; trying again in %s: %v", cfg.listen, argCoordinatorListen, coordinatorRetry, err)
		return
	}
	r.coordinator, r.coordAddr, r.coordErr, r.clusterKey = c, cfg.listen, nil, opts.Credential
	klog.Infof("regroup: coordinator listening on %s (port %d)", cfg.listen, c.Port())
	if opts.TLSClientCAFile != "" {
		klog.Infof("regroup: the coordinator requires every manager's certificate signed by %s (%s)",
			opts.TLSClientCAFile, argTLSClientCAFile)
	}
	if opts.Insecure {
		klog.Warningf("regroup: the coordinator runs without a credential (%s: true): any client "+
			"reaching %s can act as any job's manager", argInsecure, cfg.listen)
	}
}

// publish sends the managers their new directives, if a coordinator runs.
func (r *Runtime) publish() {
	if r.coordinator == nil {
		return
	}
	if err := r.coordinator.Publish(); err != nil {
		klog.Errorf("regroup: publishing directives to the managers: %v", err)
	}
}

// shared is the process-wide runtime.
var shared struct {
	sync.Mutex
	rt  *Runtime
	err error
}

// Shared returns the process-wide runtime, creating it on first use. An error (the library cannot
// be loaded, or its ABI does not match) is returned again on every call until ResetShared.
func Shared() (*Runtime, error) {
	shared.Lock()
	defer shared.Unlock()
	if shared.rt == nil && shared.err == nil {
		shared.rt, shared.err = NewRuntime()
		if shared.err != nil {
			shared.err = fmt.Errorf("regroup: the engine could not be created: %w", shared.err)
		}
	}
	return shared.rt, shared.err
}

// ResetShared closes the process-wide runtime (its coordinator and engine); the next Shared
// creates a fresh one. For tests, and to simulate a scheduler restart.
func ResetShared() {
	shared.Lock()
	defer shared.Unlock()
	if shared.rt != nil {
		shared.rt.Close()
	}
	shared.rt, shared.err = nil, nil
}
