// SPDX-License-Identifier: Apache-2.0

package volcano

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"volcano.sh/apis/pkg/apis/scheduling"
	"volcano.sh/volcano/pkg/scheduler/api"

	"github.com/regroup-dev/regroup/go/regroup"
)

// The plugin's own state annotation is not a key that makes a job Regroup's (the library's rule).
func TestThePluginsStateIsNotARegroupKey(t *testing.T) {
	for _, a := range []string{StateAnnotation, PhaseAnnotation} {
		if ours, err := regroup.JobHasKeys(nil, map[string]string{a: "{}"}); ours || err != nil {
			t.Errorf("JobHasKeys(annotation %s) = %v, %v; want false", a, ours, err)
		}
	}
}

func podGroupOf(name string, owner string) *api.PodGroup {
	pg := &api.PodGroup{Version: api.PodGroupVersionV1Beta1}
	pg.Name, pg.Namespace, pg.UID = name, ns, types.UID("pg-uid")
	if owner != "" {
		pg.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch.volcano.sh/v1alpha1", Kind: "Job",
			Name: owner, UID: "job-uid"}}
	}
	pg.Spec.MinMember = 2
	pg.Status.Phase = scheduling.PodGroupRunning
	return pg
}

func taskOf(name, role, index string, container v1.Container) *api.TaskInfo {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID(name + "-uid"),
		Annotations: map[string]string{}}, Spec: v1.PodSpec{Containers: []v1.Container{container}}}
	if role != "" {
		pod.Annotations[taskSpecKey] = role
	}
	if index != "" {
		pod.Annotations[taskIndexKey] = index
	}
	t := &api.TaskInfo{UID: api.TaskID(pod.UID), Name: name, Namespace: ns, Pod: pod, TaskRole: role}
	t.Status = api.Running
	return t
}

func jobOf(pg *api.PodGroup, tasks ...*api.TaskInfo) *api.JobInfo {
	job := &api.JobInfo{UID: api.JobID(ns + "/" + pg.Name), Name: pg.Name, Namespace: ns, PodGroup: pg,
		Tasks: map[api.TaskID]*api.TaskInfo{}}
	for _, t := range tasks {
		job.Tasks[t.UID] = t
	}
	return job
}

// specOf decodes the job spec the library read.
func specOf(t *testing.T, v *jobView) map[string]any {
	t.Helper()
	if v.err != nil {
		t.Fatalf("the job was not read: %v", v.err)
	}
	var spec map[string]any
	if err := json.Unmarshal(v.read.Spec, &spec); err != nil {
		t.Fatalf("the spec is not JSON: %v", err)
	}
	return spec
}

func TestViewJobPlacesPodsByRoleAndIndex(t *testing.T) {
	gpu := v1.Container{Resources: v1.ResourceRequirements{Limits: v1.ResourceList{"nvidia.com/gpu": resource.MustParse("8")}},
		Env: []v1.EnvVar{{Name: "MINDIO_WAIT_MINDX_TIME", Value: "40"}, {Name: "HOME", Value: "/root"},
			{Name: "TOKEN", ValueFrom: &v1.EnvVarSource{}}}}
	plain := v1.Container{}
	manager := v1.Container{Command: []string{"regroup-manager", "--port=9601"}}
	job := jobOf(podGroupOf("llama-abc", "llama"),
		taskOf("llama-worker-1", "worker", "1", plain),
		taskOf("llama-master-0", "master", "0", gpu),
		taskOf("llama-worker-0", "worker", "0", plain),
		taskOf("llama-ctl-0", "ctl", "0", manager), // a manager by its command line
	)
	v := viewJob(job, &jobShape{})
	spec := specOf(t, v)
	if v.id != "default/llama" || spec["id"] != "default/llama" || spec["uid"] != "job-uid" {
		t.Errorf("id %q, spec %s; want default/llama, uid job-uid (the Volcano Job's)", v.id, v.read.Spec)
	}
	want := map[api.TaskID]int{"llama-master-0-uid": 0, "llama-worker-0-uid": 1, "llama-worker-1-uid": 2}
	if !reflect.DeepEqual(v.index, want) {
		t.Errorf("indexes %v; want %v (master first)", v.index, want)
	}
	if !reflect.DeepEqual(v.managers, map[api.TaskID]bool{"llama-ctl-0-uid": true}) {
		t.Errorf("managers %v; want llama-ctl-0", v.managers)
	}
	volcano := spec["volcano"].(map[string]any)
	if v.read.Pods != 3 || v.read.ManagerPods != 1 || volcano["min_available"] != float64(2) {
		t.Errorf("read %+v, spec %s; want 3 pods, 1 manager, minAvailable 2", v.read, v.read.Spec)
	}
	env := spec["env"].(map[string]any)
	if spec["processes_per_pod"] != float64(8) || len(env) != 1 || env["MINDIO_WAIT_MINDX_TIME"] != "40" {
		t.Errorf("spec %s; want 8 processes per pod and the rank-0 pod's MINDIO_WAIT_MINDX_TIME alone", v.read.Spec)
	}
}

func TestViewJobSkipsPodsItCannotPlaceAndNeverPanics(t *testing.T) {
	nilPod := &api.TaskInfo{UID: "nil-pod", Name: "ghost", Namespace: ns}
	job := jobOf(podGroupOf("odd", ""),
		taskOf("odd-master-x", "master", "x", v1.Container{}),
		taskOf("odd-master-neg", "master", "-1", v1.Container{}),
		taskOf("odd-master-huge", "master", "99999999999", v1.Container{}),
		taskOf("odd-noindex", "", "", v1.Container{}),
		taskOf("odd-worker-3", "", "", v1.Container{Args: []string{"--nproc-per-node", "auto"}}),
		nilPod,
	)
	job.PodGroup.Labels, job.PodGroup.Annotations = nil, nil
	v := viewJob(job, &jobShape{})
	specOf(t, v)
	if v.id != "default/odd" {
		t.Errorf("id %q; want default/odd (the PodGroup's own name)", v.id)
	}
	if len(v.skipped) != 5 {
		t.Fatalf("skipped %d pods: %v; want 5", len(v.skipped), v.skipped)
	}
	for _, want := range []string{`task-index="x"`, `task-index="-1"`, `task-index="99999999999"`,
		"odd-noindex has no volcano.sh/task-index annotation", "ghost has no pod object"} {
		found := false
		for _, s := range v.skipped {
			found = found || strings.Contains(s, want)
		}
		if !found {
			t.Errorf("no skip reason contains %q: %v", want, v.skipped)
		}
	}
	// The master task's pods carry no index it can use: it counts its pods (3), then odd-worker-3
	// is placed by its name; a flag without a number means 1 process per pod.
	if v.read.Pods != 7 || v.index["odd-worker-3-uid"] != 6 || !strings.Contains(string(v.read.Spec), `"processes_per_pod":1`) {
		t.Errorf("read %+v, indexes %v, spec %s; want 7 pods, odd-worker-3 at 6, 1 process per pod", v.read, v.index, v.read.Spec)
	}
}

func TestViewJobRefusesWhatTheLibraryRefuses(t *testing.T) {
	job := jobOf(podGroupOf("j", "j"), taskOf("j-worker-0", "worker", "0",
		v1.Container{Args: []string{"--nproc-per-node", "99999"}}))
	v := viewJob(job, &jobShape{})
	if v.err == nil || !strings.Contains(v.err.Error(), "99999 processes per pod") {
		t.Errorf("err %v; want the library's refusal of 99999 processes per pod", v.err)
	}
}

// Volcano's job controller creates a job's pods only once its PodGroup is enqueued: a session sees
// the PodGroup alone first. That is not an invalid job (on a real control plane every new job got a
// RegroupInvalid event "spec.tasks must be a non-empty list" before its pods existed).
func TestViewJobOfAPodGroupWithoutPodsIsNotAnError(t *testing.T) {
	v := viewJob(jobOf(podGroupOf("j", "j")), &jobShape{})
	if v.err != nil || v.read != nil {
		t.Errorf("viewJob of a PodGroup without pods = read %v, err %v; want neither (nothing to read yet)", v.read, v.err)
	}
}

func TestViewJobNeverShrinksAJob(t *testing.T) {
	var shape jobShape
	worker := func(i int) *api.TaskInfo {
		return taskOf(fmt.Sprintf("j-worker-%d", i), "worker", fmt.Sprint(i), v1.Container{})
	}
	master := taskOf("j-master-0", "master", "0", v1.Container{})
	if v := viewJob(jobOf(podGroupOf("j", "j"), master, worker(0), worker(1), worker(2), worker(3)), &shape); v.read.Pods != 5 {
		t.Fatalf("pods %d; want 5", v.read.Pods)
	}
	// Worker 3 and the master were deleted and the job controller has not created them again:
	// the job keeps its size, and the workers their node ranks.
	v := viewJob(jobOf(podGroupOf("j", "j"), worker(0), worker(1), worker(2)), &shape)
	if v.read.Pods != 5 {
		t.Errorf("pods %d; want the 5 the engine already has", v.read.Pods)
	}
	want := map[api.TaskID]int{"j-worker-0-uid": 1, "j-worker-1-uid": 2, "j-worker-2-uid": 3}
	if !reflect.DeepEqual(v.index, want) {
		t.Errorf("indexes %v; want %v", v.index, want)
	}
	// The same job deleted and created again (a new uid) starts afresh.
	pg := podGroupOf("j", "")
	pg.UID = "pg-2"
	if v := viewJob(jobOf(pg, worker(0)), &shape); v.read.Pods != 1 {
		t.Errorf("pods %d; want 1 for a new job under the same name", v.read.Pods)
	}
}

func TestViewJobAsksTheLibraryOnlyWhenTheJobChanges(t *testing.T) {
	var shape jobShape
	pg := podGroupOf("j", "j")
	pg.Annotations = map[string]string{"recover-strategy": "recover"}
	tasks := []*api.TaskInfo{taskOf("j-worker-0", "worker", "0", v1.Container{}), taskOf("j-worker-1", "worker", "1", v1.Container{})}
	first := viewJob(jobOf(pg, tasks...), &shape).read
	pg.Annotations[StateAnnotation] = `{"v":1}` // the plugin's own state: not the job's
	if again := viewJob(jobOf(pg, tasks...), &shape).read; again != first {
		t.Errorf("the job was read again though it did not change")
	}
	pg.Annotations["regroup.io/prefer-elastic"] = "true"
	changed := viewJob(jobOf(pg, tasks...), &shape).read
	if changed == first || !strings.Contains(string(changed.Spec), "prefer-elastic") {
		t.Errorf("a new annotation was not read: %s", changed.Spec)
	}
}

func TestViewJobProcessesPerPod(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    v1.Container
		want int
	}{
		{"none", v1.Container{}, 1},
		{"a GPU request", v1.Container{Resources: v1.ResourceRequirements{Requests: v1.ResourceList{"nvidia.com/gpu": resource.MustParse("4")}}}, 4},
		{"an Ascend limit", v1.Container{Resources: v1.ResourceRequirements{Limits: v1.ResourceList{"huawei.com/Ascend910": resource.MustParse("8")}}}, 8},
		{"torchrun flag =", v1.Container{Command: []string{"regroup-agent", "--nproc-per-node=6", "train.py"}}, 6},
		{"torchrun flag, space", v1.Container{Args: []string{"--nproc_per_node", "2"}}, 2},
		{"a flag without a number", v1.Container{Args: []string{"--nproc-per-node=auto"}}, 1},
	} {
		v := viewJob(jobOf(podGroupOf("j", "j"), taskOf("j-worker-0", "worker", "0", tc.c)), &jobShape{})
		if got := specOf(t, v)["processes_per_pod"]; got != float64(tc.want) {
			t.Errorf("%s: %v; want %d", tc.name, got, tc.want)
		}
	}
}

func TestCurrentPrefersTheReplacement(t *testing.T) {
	old := taskOf("j-worker-0", "worker", "0", v1.Container{})
	old.Status = api.Releasing
	repl := taskOf("j-worker-0", "worker", "0", v1.Container{})
	repl.UID, repl.Pod.UID, repl.Status = "new", "new", api.Pending
	if got := current([]*api.TaskInfo{old, repl}); got != repl {
		t.Errorf("current picked %s; want the replacement", got.UID)
	}
	if got := current([]*api.TaskInfo{repl, old}); got != repl {
		t.Errorf("current picked %s; want the replacement", got.UID)
	}
}
