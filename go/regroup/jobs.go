// SPDX-License-Identifier: Apache-2.0

package regroup

/*
#cgo noescape regroup_job_has_keys
#cgo nocallback regroup_job_has_keys
#cgo noescape regroup_volcano_job_read
#cgo nocallback regroup_volcano_job_read

#include <stdlib.h>
#include "regroup.h"
*/
import "C"

import (
	"encoding/json"
	"strings"
	"unsafe"
)

// JobHasKeys reports whether a job's labels and annotations make it Regroup's: a MindCluster
// label or annotation of the library's configuration table (`regroupctl keys`), or any label or
// annotation whose name starts with "regroup.io/". Only the names count. A job without one is
// left to the scheduler's other plugins. The rule is the library's (regroup_job_has_keys).
func JobHasKeys(labels, annotations map[string]string) (bool, error) {
	const op = "JobHasKeys"
	if err := abiCheck(); err != nil {
		return false, err
	}
	n := len(labels) + len(annotations)
	var has C.uint8_t
	var cerr *C.regroup_error
	if n == 0 {
		status := C.regroup_job_has_keys(&has, nil, 0, nil, 0, &cerr)
		return has != 0, takeError(op, status, cerr)
	}
	// The names in one C allocation: the pointers (labels' then annotations'), then the
	// NUL-terminated names.
	const ptrSize = unsafe.Sizeof(uintptr(0))
	size := uintptr(n) * ptrSize
	for k := range labels {
		size += uintptr(len(k)) + 1
	}
	for k := range annotations {
		size += uintptr(len(k)) + 1
	}
	block := C.malloc(C.size_t(size))
	if block == nil {
		return false, newError(op, StatusResourceExhausted, "out of memory for %d key names", n)
	}
	defer C.free(block)
	ptrs := unsafe.Slice((**C.char)(block), n)
	text := unsafe.Slice((*byte)(unsafe.Add(block, uintptr(n)*ptrSize)), size-uintptr(n)*ptrSize)
	i, at := 0, 0
	add := func(what, k string) error {
		if strings.IndexByte(k, 0) >= 0 {
			return newError(op, StatusInvalidArgument, "the %s name %q contains a NUL byte", what, k)
		}
		ptrs[i] = (*C.char)(unsafe.Pointer(&text[at]))
		at += copy(text[at:], k)
		text[at] = 0
		at++
		i++
		return nil
	}
	for k := range labels {
		if err := add("label", k); err != nil {
			return false, err
		}
	}
	for k := range annotations {
		if err := add("annotation", k); err != nil {
			return false, err
		}
	}
	annotationKeys := (**C.char)(unsafe.Add(block, uintptr(len(labels))*ptrSize))
	status := C.regroup_job_has_keys(&has, (**C.char)(block), C.size_t(len(labels)),
		annotationKeys, C.size_t(len(annotations)), &cerr)
	return has != 0, takeError(op, status, cerr)
}

// VolcanoJob is a Volcano Job as the library reads it (regroup_volcano_job_read): the engine's
// job spec, and what the reader decided about the job's tasks.
type VolcanoJob struct {
	// Spec is the engine's job spec (JSON), for Engine.UpsertJob and ValidateJob. When Pods is
	// 0 the engine refuses it.
	Spec []byte
	// Pods is the number of training pods: the replicas of the tasks that are not the manager's.
	// 0 when the job has none yet (its training pods are not created).
	Pods int
	// ManagerPods is the number of the manager's pods.
	ManagerPods int
	// ManagerTasks holds the indexes, in spec.tasks, of the tasks that run the job's manager (a
	// task named "manager", or one that runs regroup-manager).
	ManagerTasks []int
	// ElasticMinAvailable is the fewest pods (the manager's included) the job runs on once
	// scaled in as far as it may: the minAvailable a scheduler lowers a MindCluster-style
	// every-pod minAvailable to once the job runs. 0 when the job never scales in, or its keys are
	// invalid.
	ElasticMinAvailable int
}

// ReadVolcanoJob reads a Volcano Job (batch.volcano.sh/v1alpha1, kind Job; YAML or JSON) as
// `regroupctl validate` and `regroup-manager --job` read it: the job's id ("namespace/name"),
// uid, labels and annotations, the training pods, the processes per pod, the rank-0 pod's env,
// minAvailable and the policies, and which tasks run the manager. abi/regroup.h lists the fields
// read. A document that is not a Volcano Job gives an error of status StatusInvalidArgument
// naming the field; one over 4 MiB StatusResourceExhausted.
func ReadVolcanoJob(job []byte) (*VolcanoJob, error) {
	const op = "ReadVolcanoJob"
	if err := abiCheck(); err != nil {
		return nil, err
	}
	text, n := cText(job)
	var out *C.char
	var cerr *C.regroup_error
	status := C.regroup_volcano_job_read(&out, text, n, &cerr)
	result := takeString(out)
	if err := takeError(op, status, cerr); err != nil {
		return nil, err
	}
	var r struct {
		Job                 json.RawMessage `json:"job"`
		ManagerTasks        []int           `json:"manager_tasks"`
		ElasticMinAvailable int             `json:"elastic_min_available"`
	}
	var spec struct {
		Pods    int `json:"pods"`
		Volcano struct {
			ManagerPods int `json:"manager_pods"`
		} `json:"volcano"`
	}
	if err := json.Unmarshal(result, &r); err != nil {
		return nil, newError(op, StatusInternal, "the library's result is not what it documents: %v", err)
	}
	if err := json.Unmarshal(r.Job, &spec); err != nil {
		return nil, newError(op, StatusInternal, "the library's job spec is not what it documents: %v", err)
	}
	return &VolcanoJob{Spec: []byte(r.Job), Pods: spec.Pods, ManagerPods: spec.Volcano.ManagerPods,
		ManagerTasks: r.ManagerTasks, ElasticMinAvailable: r.ElasticMinAvailable}, nil
}

// JobToken returns the coordinator token of job jobID (NAMESPACE/NAME) whose Volcano Job has
// the uid jobUID, derived from the cluster key: what the job's manager presents to the
// coordinator, as `regroupctl token` prints it (regroup_job_token). The scheduler plugin writes
// it into the job's namespace when the job appears. An empty key, a job id that is not
// NAMESPACE/NAME or a uid that is not 1 to 128 printable ASCII characters is an error naming it.
func JobToken(clusterKey, jobID, jobUID string) (string, error) {
	const op = "JobToken"
	if err := abiCheck(); err != nil {
		return "", err
	}
	args, free, err := cStrings(op, false, cArg{"cluster key", clusterKey}, cArg{"job id", jobID},
		cArg{"job uid", jobUID})
	if err != nil {
		return "", err
	}
	defer free()
	var out *C.char
	var cerr *C.regroup_error
	status := C.regroup_job_token(&out, args[0], args[1], args[2], &cerr)
	if err := takeError(op, status, cerr); err != nil {
		return "", err
	}
	return string(takeString(out)), nil
}
