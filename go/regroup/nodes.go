// SPDX-License-Identifier: Apache-2.0

package regroup

/*
#cgo noescape regroup_engine_filter_nodes
#cgo nocallback regroup_engine_filter_nodes
#cgo noescape regroup_engine_score_nodes
#cgo nocallback regroup_engine_score_nodes

#include <stdlib.h>
#include "regroup.h"
*/
import "C"

import (
	"bytes"
	"runtime"
	"strings"
	"sync"
	"unsafe"
)

// cNodeArray is a C array of C strings built in one allocation: the pointers first, then the
// NUL-terminated names they point to. The library only reads it during the call.
type cNodeArray struct {
	block unsafe.Pointer
	ptrs  **C.char
}

// newCNodeArray copies names into one C allocation; a name with a NUL byte is refused.
func newCNodeArray(op string, names []string) (cNodeArray, error) {
	if len(names) == 0 {
		return cNodeArray{}, nil
	}
	const ptrSize = unsafe.Sizeof(uintptr(0))
	head := uintptr(len(names)) * ptrSize
	size := head
	for _, name := range names {
		size += uintptr(len(name)) + 1
	}
	block := C.malloc(C.size_t(size))
	if block == nil {
		return cNodeArray{}, newError(op, StatusResourceExhausted,
			"cannot allocate %d bytes for %d node names", size, len(names))
	}
	// The pointers are written as uintptr: this is C memory, which the garbage collector neither
	// scans nor needs write barriers for.
	ptrs := unsafe.Slice((*uintptr)(block), len(names))
	text := unsafe.Slice((*byte)(unsafe.Add(block, head)), size-head)
	at := 0
	for i, name := range names {
		ptrs[i] = uintptr(block) + head + uintptr(at)
		at += copy(text[at:], name)
		text[at] = 0
		at++
	}
	// One terminator per name, or some name holds a NUL byte (C would cut it there and name
	// another node): one vectorised count instead of a search per name.
	if bytes.Count(text, nul) != len(names) {
		C.free(block)
		for i, name := range names {
			if strings.IndexByte(name, 0) >= 0 {
				return cNodeArray{}, newError(op, StatusInvalidArgument,
					"node %d, %q, contains a NUL byte", i, name)
			}
		}
		return cNodeArray{}, newError(op, StatusInternal, "the C copy of %d node names is corrupt", len(names))
	}
	return cNodeArray{block: block, ptrs: (**C.char)(block)}, nil
}

var nul = []byte{0}

func (a cNodeArray) free() {
	if a.block != nil {
		C.free(a.block)
	}
}

// FilterNodes is the scheduler's predicate for a job, over many nodes in one call: ok[i] is true
// when the job's pods may run on nodes[i], false when the engine knows the node as faulty or of
// unknown health, or the job avoids it. Nodes the engine has never heard of are allowed. The names
// are copied into C memory once per call; to filter many jobs against the same nodes, build a
// NodeList once and use FilterNodeList.
func (e *Engine) FilterNodes(job string, nodes []string) (ok []bool, err error) {
	const op = "Engine.FilterNodes"
	arr, err := newCNodeArray(op, nodes)
	if err != nil {
		return nil, err
	}
	defer arr.free()
	return e.filter(op, job, arr.ptrs, len(nodes))
}

// ScoreNodes is the scheduler's node order for pod podIndex of a job, over many nodes in one
// call: scores[i] from 0 to 100 for placing the pod on nodes[i]: 100 for the pod's previous node,
// 50 for a node that hosts a pod of the same replica, 0 otherwise and for nodes to avoid.
func (e *Engine) ScoreNodes(job string, podIndex uint32, nodes []string) (scores []int32, err error) {
	const op = "Engine.ScoreNodes"
	arr, err := newCNodeArray(op, nodes)
	if err != nil {
		return nil, err
	}
	defer arr.free()
	return e.score(op, job, podIndex, arr.ptrs, len(nodes))
}

// FilterNodeList is FilterNodes over a NodeList.
func (e *Engine) FilterNodeList(job string, nodes *NodeList) (ok []bool, err error) {
	const op = "Engine.FilterNodeList"
	ptrs, n, err := nodes.acquire(op)
	if err != nil {
		return nil, err
	}
	defer nodes.mu.RUnlock()
	return e.filter(op, job, ptrs, n)
}

// ScoreNodeList is ScoreNodes over a NodeList.
func (e *Engine) ScoreNodeList(job string, podIndex uint32, nodes *NodeList) (scores []int32, err error) {
	const op = "Engine.ScoreNodeList"
	ptrs, n, err := nodes.acquire(op)
	if err != nil {
		return nil, err
	}
	defer nodes.mu.RUnlock()
	return e.score(op, job, podIndex, ptrs, n)
}

func (e *Engine) filter(op, job string, ptrs **C.char, n int) ([]bool, error) {
	var args cArgs
	cjob, err := args.str(op, "job id", job)
	if err != nil {
		return nil, err
	}
	// The library writes 0 or 1 per node straight into Go memory (no Go pointers in it).
	raw := make([]uint8, n, n+1) // capacity +1: a valid pointer for no nodes
	h, err := e.acquire(op)
	if err != nil {
		return nil, err
	}
	defer e.mu.RUnlock()
	var cerr *C.regroup_error
	status := C.regroup_engine_filter_nodes(h, (*C.uint8_t)(unsafe.SliceData(raw)), cjob, ptrs,
		C.size_t(n), &cerr)
	if err := takeError(op, status, cerr); err != nil {
		return nil, err
	}
	ok := make([]bool, n)
	for i := range ok {
		ok[i] = raw[i] != 0
	}
	return ok, nil
}

func (e *Engine) score(op, job string, podIndex uint32, ptrs **C.char, n int) ([]int32, error) {
	var args cArgs
	cjob, err := args.str(op, "job id", job)
	if err != nil {
		return nil, err
	}
	scores := make([]int32, n, n+1) // capacity +1: a valid pointer for no nodes
	h, err := e.acquire(op)
	if err != nil {
		return nil, err
	}
	defer e.mu.RUnlock()
	var cerr *C.regroup_error
	status := C.regroup_engine_score_nodes(h, (*C.int32_t)(unsafe.SliceData(scores)), cjob,
		C.uint32_t(podIndex), ptrs, C.size_t(n), &cerr)
	if err := takeError(op, status, cerr); err != nil {
		return nil, err
	}
	return scores, nil
}

// NodeList is a list of node names copied once into C memory, so that a scheduling session can
// filter or score many jobs against the same nodes without copying the names for every call. It
// is safe for concurrent use and may serve several engines. Close it when done; a finalizer
// frees a forgotten one only as a safety net.
type NodeList struct {
	mu     sync.RWMutex // read-held by every call, write-held by Close
	arr    cNodeArray
	n      int
	closed bool
}

// NewNodeList copies the names; a name with a NUL byte is refused.
func NewNodeList(nodes []string) (*NodeList, error) {
	arr, err := newCNodeArray("NewNodeList", nodes)
	if err != nil {
		return nil, err
	}
	l := &NodeList{arr: arr, n: len(nodes)}
	runtime.SetFinalizer(l, (*NodeList).Close)
	return l, nil
}

// Len returns the number of nodes in the list (0 once closed).
func (l *NodeList) Len() int {
	if l == nil {
		return 0
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.n
}

// Close frees the list; later calls with it return ErrClosed. Closing again does nothing.
func (l *NodeList) Close() error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.arr.free()
	l.arr, l.n = cNodeArray{}, 0
	l.closed = true
	runtime.SetFinalizer(l, nil)
	return nil
}

// acquire read-locks the list for one call; the caller defers l.mu.RUnlock() when err is nil.
func (l *NodeList) acquire(op string) (**C.char, int, error) {
	if l == nil {
		return nil, 0, newError(op, StatusInvalidArgument, "the node list is nil; create one with regroup.NewNodeList")
	}
	l.mu.RLock()
	if l.closed {
		l.mu.RUnlock()
		return nil, 0, closedError(op, "node list", "NewNodeList")
	}
	return l.arr.ptrs, l.n, nil
}
