// SPDX-License-Identifier: Apache-2.0

// Package regroup is the Go binding of libregroup, Regroup's decision engine, through its C ABI
// (abi/regroup.h). The Volcano scheduler plugin uses it to tell the engine what it sees (nodes,
// pods, faults) and to read back what each job should do (directives for the job's manager,
// evictions, nodes to avoid, gang sizes, node predicates and scores).
//
// # Building
//
// The package links against the shared library with -lregroup and reads the header from
// ../../abi. Where the library lives is given by the environment, not by the package:
//
//	cmake -S . -B build -G Ninja && cmake --build build --target regroup
//	export CGO_LDFLAGS=-L$PWD/build       # where the linker finds libregroup.so
//	export LD_LIBRARY_PATH=$PWD/build     # where the program finds it at run time
//	cd go && go test ./...
//
// go/test.sh does the same for a given BUILD_DIR (default /work/main/build); `go/test.sh bench`
// also runs the benchmarks.
//
// # Compatibility
//
// The first [New] (and [ValidateJob], [LibraryVersion]) checks the library's ABI version against
// the header this package was compiled with: the major must be equal and the library's minor at
// least the header's. A library that fails the check is refused with a *[Error] of status
// [StatusVersionMismatch] naming both versions; nothing else is called on it.
//
// # Usage
//
//	eng, err := regroup.New(regroup.Options{})
//	if err != nil { ... }
//	defer eng.Close()
//	report, err := eng.UpsertJob(jobJSON, nowMs)      // report: the validation report (JSON)
//	err = eng.SetNodeHealth("n3", regroup.NodeFaulty, "NotReady", nowMs)
//	err = eng.SetPodState("default/demo", 3, "p3", regroup.PodRunning, "n3", nowMs)
//	changed, err := eng.Tick(nowMs)
//	d, err := eng.Decision("default/demo")            // typed fast path
//	full, err := eng.DecisionDetail("default/demo")   // replica lists, evictions, reason
//	ok, err := eng.FilterNodes("default/demo", nodeNames)
//
// A scheduler plugin asks the library which jobs are Regroup's ([JobHasKeys]) and reads a Volcano
// Job into the job spec ([ReadVolcanoJob], the reader of regroupctl and regroup-manager --job), so
// it keeps no copy of those rules.
//
// A scheduling session that filters or scores many jobs against the same nodes copies the names
// to C once with [NewNodeList] and calls [Engine.FilterNodeList] and [Engine.ScoreNodeList].
//
// Time is never read by the engine: every call that can decide takes nowMs, the caller's clock
// in milliseconds (any epoch, one epoch per engine), so decisions are reproducible.
//
// # Errors
//
// Every fallible call returns an error; a failure of the library is a *[Error] carrying the
// library's [Status] and message. Test for a status with [StatusOf] or errors.Is against the
// sentinels ([ErrNotFound], [ErrInvalidArgument], ...). A job whose configuration is invalid
// gives [StatusValidationFailed], and [Engine.UpsertJob] and [ValidateJob] still return the
// report naming every problem.
//
// # Concurrency and lifetime
//
// An [Engine] is safe for concurrent use by many goroutines (the library serialises the calls on
// one engine). Close it explicitly; a finalizer frees a forgotten one only as a safety net. After
// Close every call returns [ErrClosed] instead of touching freed memory, and Close again is a
// no-op.
//
// # Memory
//
// Results that the library allocates are copied into Go memory at once and freed with
// regroup_string_free; nothing returned by this package points into C memory. Arguments go the
// other way without a C allocation where cgo's pointer rules allow it: JSON documents are passed
// in place, and short strings (job ids, node names, uids) are copied NUL-terminated into a buffer
// on the caller's stack; the C functions are declared noescape and nocallback, as the library keeps
// no pointer past a call and never calls back. Node lists are built in one C allocation per call
// (or once per NodeList).
//
// # Benchmarks
//
// bench_test.go measures one scheduling session (1,000 jobs of 8 pods on 10,000 nodes: every
// node's health, every pod's state, a tick, every job's decision, the node predicate for the jobs
// that want pods) and one job's tick and decision: `go/test.sh bench`.
package regroup
