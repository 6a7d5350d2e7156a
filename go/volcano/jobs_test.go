package volcano

import (
	"reflect"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"volcano.sh/apis/pkg/apis/scheduling"
	"volcano.sh/volcano/pkg/scheduler/api"
)

func TestHasRegroupKeys(t *testing.T) {
	for _, tc := range []struct {
		name                string
		labels, annotations map[string]string
		want                bool
	}{
		{"none", nil, nil, false},
		{"unrelated", map[string]string{"team": "a"}, map[string]string{"note": "b"}, false},
		{"MindCluster label", map[string]string{"fault-scheduling": "force"}, nil, true},
		{"MindCluster annotation", nil, map[string]string{"recover-strategy": "recover"}, true},
		{"Regroup annotation", nil, map[string]string{"regroup.io/tensor-parallel": "2"}, true},
		{"Regroup label (refused by the engine, but the job is Regroup's)", map[string]string{"regroup.io/x": "1"}, nil, true},
		{"only the plugin's own state", nil, map[string]string{StateAnnotation: "{}"}, false},
	} {
		if got := hasRegroupKeys(tc.labels, tc.annotations); got != tc.want {
			t.Errorf("%s: hasRegroupKeys = %v; want %v", tc.name, got, tc.want)
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

func TestViewJobPlacesPodsByRoleAndIndex(t *testing.T) {
	gpu := v1.Container{Resources: v1.ResourceRequirements{Limits: v1.ResourceList{"nvidia.com/gpu": resource.MustParse("8")}},
		Env: []v1.EnvVar{{Name: mindioWaitEnv, Value: "40"}}}
	plain := v1.Container{}
	manager := v1.Container{Command: []string{"regroup-manager", "--port=9601"}}
	job := jobOf(podGroupOf("llama-abc", "llama"),
		taskOf("llama-worker-1", "worker", "1", plain),
		taskOf("llama-master-0", "master", "0", gpu),
		taskOf("llama-worker-0", "worker", "0", plain),
		taskOf("llama-ctl-0", "ctl", "0", manager), // a manager by its command line
	)
	v := viewJob(job, 0)
	if v.id != "default/llama" || v.spec.UID != "job-uid" {
		t.Errorf("id %q uid %q; want default/llama, job-uid (the Volcano Job's)", v.id, v.spec.UID)
	}
	want := map[api.TaskID]int{"llama-master-0-uid": 0, "llama-worker-0-uid": 1, "llama-worker-1-uid": 2}
	if !reflect.DeepEqual(v.index, want) {
		t.Errorf("indexes %v; want %v (master first)", v.index, want)
	}
	if v.spec.Pods != 3 || v.spec.Volcano.ManagerPods != 1 || v.spec.Volcano.MinAvailable != 2 {
		t.Errorf("pods %d managers %d minAvailable %d; want 3, 1, 2", v.spec.Pods, v.spec.Volcano.ManagerPods, v.spec.Volcano.MinAvailable)
	}
	if v.spec.ProcessesPerPod != 8 || v.spec.Env[mindioWaitEnv] != "40" {
		t.Errorf("processes per pod %d env %v; want 8 and the rank-0 pod's %s", v.spec.ProcessesPerPod, v.spec.Env, mindioWaitEnv)
	}
}

func TestViewJobSkipsPodsItCannotPlaceAndNeverPanics(t *testing.T) {
	nilPod := &api.TaskInfo{UID: "nil-pod", Name: "ghost", Namespace: ns}
	job := jobOf(podGroupOf("odd", ""),
		taskOf("odd-worker-x", "worker", "x", v1.Container{}),
		taskOf("odd-worker-neg", "worker", "-1", v1.Container{}),
		taskOf("odd-worker-huge", "worker", "99999999999", v1.Container{}),
		taskOf("odd-noindex", "", "", v1.Container{}),
		taskOf("odd-worker-3", "", "", v1.Container{Args: []string{"--nproc-per-node", "99999"}}),
		nilPod,
	)
	job.PodGroup.Labels, job.PodGroup.Annotations = nil, nil
	v := viewJob(job, 0)
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
	// odd-worker-3 is placed by its name; an absurd --nproc-per-node falls back to 1.
	if v.spec.Pods != 4 || v.spec.ProcessesPerPod != 1 {
		t.Errorf("pods %d, processes per pod %d; want 4 and 1", v.spec.Pods, v.spec.ProcessesPerPod)
	}
	if _, err := v.spec.encode(); err != nil {
		t.Errorf("encode: %v", err)
	}
}

func TestViewJobNeverShrinksAJob(t *testing.T) {
	// Pod 3 was deleted and the job controller has not created it again yet.
	job := jobOf(podGroupOf("j", "j"), taskOf("j-worker-0", "worker", "0", v1.Container{}),
		taskOf("j-worker-1", "worker", "1", v1.Container{}), taskOf("j-worker-2", "worker", "2", v1.Container{}))
	if v := viewJob(job, 4); v.spec.Pods != 4 {
		t.Errorf("pods %d; want the 4 the engine already has", v.spec.Pods)
	}
}

func TestProcessesPerPod(t *testing.T) {
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
		if got := processesPerPod(tc.c); got != tc.want {
			t.Errorf("%s: %d; want %d", tc.name, got, tc.want)
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
