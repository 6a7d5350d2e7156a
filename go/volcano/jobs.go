package volcano

import (
	"encoding/json"
	"fmt"
	"maps"
	"sort"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"

	"volcano.sh/volcano/pkg/scheduler/api"
)

// The keys that make a job Regroup's: MindCluster's labels and annotations (the configuration
// table of plugin/config.cc) and every key with Regroup's prefix. A job without any of them is
// left entirely to the other plugins.
var mindClusterLabels = []string{"fault-scheduling", "process-recover-enable", "pod-rescheduling",
	"fault-retry-times"}
var mindClusterAnnotations = []string{"recover-strategy", "wait-reschedule-timeout"}

const regroupKeyPrefix = "regroup.io/"

// Volcano's pod annotations (volcano.sh/apis batch/v1alpha1) that place a pod in its job.
const (
	taskSpecKey  = "volcano.sh/task-spec"  // the task (role) name
	taskIndexKey = "volcano.sh/task-index" // the pod's index within its task
	jobNameKey   = "volcano.sh/job-name"   // the Volcano Job's name
)

// managerTaskName is the task that runs regroup-manager (as plugin/volcano_job.cc decides).
const managerTaskName = "manager"

// mindioWaitEnv is the env variable of the rank-0 pod that the engine reads.
const mindioWaitEnv = "MINDIO_WAIT_MINDX_TIME"

// hasRegroupKeys reports whether a PodGroup carries Regroup or MindCluster keys.
func hasRegroupKeys(labels, annotations map[string]string) bool {
	for _, k := range mindClusterLabels {
		if _, ok := labels[k]; ok {
			return true
		}
	}
	for _, k := range mindClusterAnnotations {
		if _, ok := annotations[k]; ok {
			return true
		}
	}
	for k := range annotations {
		if strings.HasPrefix(k, regroupKeyPrefix) {
			return true
		}
	}
	for k := range labels {
		if strings.HasPrefix(k, regroupKeyPrefix) {
			return true
		}
	}
	return false
}

// jobSpec is the engine's job spec (README.md, "The engine's JSON").
type jobSpec struct {
	ID              string            `json:"id"`
	UID             string            `json:"uid,omitempty"`
	Labels          map[string]string `json:"labels"`
	Annotations     map[string]string `json:"annotations"`
	Env             map[string]string `json:"env"`
	Pods            int               `json:"pods"`
	ProcessesPerPod int               `json:"processes_per_pod"`
	Volcano         volcanoFacts      `json:"volcano"`
}

type volcanoFacts struct {
	MinAvailable int32 `json:"min_available"`
	ManagerPods  int   `json:"manager_pods"`
}

// jobView is a Volcano job as the plugin maps it onto the engine: its id, its training pods by
// index (node rank) and its manager pods.
type jobView struct {
	id       string
	spec     jobSpec
	pods     map[int][]*api.TaskInfo // index -> the pods of that index (an old one ending, its replacement)
	index    map[api.TaskID]int      // training pod -> index
	managers map[api.TaskID]bool
	skipped  []string // pods the plugin could not place in the job, with why
}

// engineJobID names a job as regroupctl and regroup-manager do: "namespace/name" of the Volcano
// Job, read from the PodGroup's owner (or its pods); a PodGroup of no Volcano Job is named itself.
func engineJobID(job *api.JobInfo) string {
	if job.PodGroup != nil {
		for _, o := range job.PodGroup.OwnerReferences {
			if o.Kind == "Job" && strings.HasPrefix(o.APIVersion, "batch.volcano.sh/") && o.Name != "" {
				return job.Namespace + "/" + o.Name
			}
		}
	}
	for _, t := range job.Tasks {
		if t.Pod != nil && t.Pod.Annotations[jobNameKey] != "" {
			return job.Namespace + "/" + t.Pod.Annotations[jobNameKey]
		}
	}
	return job.Namespace + "/" + job.Name
}

// engineJobUID is the uid of the Volcano Job (or of the PodGroup): a job deleted and created again
// under the same name is a new job to the engine.
func engineJobUID(job *api.JobInfo) string {
	if job.PodGroup == nil {
		return ""
	}
	for _, o := range job.PodGroup.OwnerReferences {
		if o.Kind == "Job" && strings.HasPrefix(o.APIVersion, "batch.volcano.sh/") {
			return string(o.UID)
		}
	}
	return string(job.PodGroup.UID)
}

// isManagerPod reports whether a pod runs the job's manager: the task named "manager", or a
// container whose command line runs regroup-manager.
func isManagerPod(task *api.TaskInfo) bool {
	if task.Pod == nil {
		return false
	}
	if taskRole(task) == managerTaskName {
		return true
	}
	for _, c := range task.Pod.Spec.Containers {
		for _, list := range [2][]string{c.Command, c.Args} {
			for _, word := range list {
				if strings.Contains(word, "regroup-manager") {
					return true
				}
			}
		}
	}
	return false
}

func taskRole(task *api.TaskInfo) string {
	if task.Pod != nil {
		if r := task.Pod.Annotations[taskSpecKey]; r != "" {
			return r
		}
	}
	return task.TaskRole
}

// podIndexInTask reads a pod's index within its task: Volcano's task-index annotation, else the
// number that ends the pod's name (Volcano names pods <job>-<task>-<index>).
func podIndexInTask(task *api.TaskInfo) (int, error) {
	if task.Pod == nil {
		return 0, fmt.Errorf("pod %s/%s has no pod object", task.Namespace, task.Name)
	}
	if s, ok := task.Pod.Annotations[taskIndexKey]; ok {
		i, err := strconv.Atoi(s)
		if err != nil || i < 0 || i >= maxPodsPerJob {
			return 0, fmt.Errorf("pod %s/%s has annotation %s=%q; want an integer from 0 to %d",
				task.Namespace, task.Name, taskIndexKey, s, maxPodsPerJob-1)
		}
		return i, nil
	}
	name := task.Name
	if at := strings.LastIndexByte(name, '-'); at >= 0 {
		if i, err := strconv.Atoi(name[at+1:]); err == nil && i >= 0 && i < maxPodsPerJob {
			return i, nil
		}
	}
	return 0, fmt.Errorf("pod %s/%s has no %s annotation and its name does not end in an index",
		task.Namespace, task.Name, taskIndexKey)
}

// maxPodsPerJob is the engine's limit (plugin/job_spec.h kMaxPods).
const maxPodsPerJob = 100000

// roleOrder orders training tasks for the node rank: a task named "master" first (MindCluster's
// rank 0), then the others by name.
func roleOrder(roles []string) {
	sort.Slice(roles, func(i, j int) bool {
		mi, mj := strings.EqualFold(roles[i], "master"), strings.EqualFold(roles[j], "master")
		if mi != mj {
			return mi
		}
		return roles[i] < roles[j]
	})
}

// viewJob maps a session job onto the engine. previousPods is the pod count the engine already
// has for the job (0 for none): a job's size never shrinks while a pod is briefly missing (deleted
// and not yet recreated by the job controller).
func viewJob(job *api.JobInfo, previousPods int) *jobView {
	pg := job.PodGroup
	v := &jobView{
		id:       engineJobID(job),
		pods:     map[int][]*api.TaskInfo{},
		index:    map[api.TaskID]int{},
		managers: map[api.TaskID]bool{},
	}
	v.spec = jobSpec{
		ID:          v.id,
		UID:         engineJobUID(job),
		Labels:      copyMap(pg.Labels),
		Annotations: engineAnnotations(pg.Annotations),
		Env:         map[string]string{},
		Volcano:     volcanoFacts{MinAvailable: pg.Spec.MinMember},
	}

	// Training pods by role, in a stable order.
	type placed struct {
		task  *api.TaskInfo
		index int
	}
	byRole := map[string][]placed{}
	size := map[string]int{}
	managerNames := map[string]bool{}
	for _, task := range job.Tasks {
		if isManagerPod(task) {
			v.managers[task.UID] = true
			managerNames[task.Name] = true
			continue
		}
		i, err := podIndexInTask(task)
		if err != nil {
			v.skipped = append(v.skipped, err.Error())
			continue
		}
		role := taskRole(task)
		byRole[role] = append(byRole[role], placed{task, i})
		if i+1 > size[role] {
			size[role] = i + 1
		}
	}
	roles := make([]string, 0, len(byRole))
	for r := range byRole {
		roles = append(roles, r)
	}
	roleOrder(roles)
	offset := 0
	for _, r := range roles {
		for _, p := range byRole[r] {
			idx := offset + p.index
			v.pods[idx] = append(v.pods[idx], p.task)
			v.index[p.task.UID] = idx
		}
		offset += size[r]
	}
	v.spec.Pods = offset
	if previousPods > v.spec.Pods {
		v.spec.Pods = previousPods
	}
	v.spec.Volcano.ManagerPods = len(managerNames)

	// Processes per pod and the env, from the rank-0 pod (or the first training pod there is).
	if first := v.rankZero(); first != nil && first.Pod != nil && len(first.Pod.Spec.Containers) > 0 {
		c := first.Pod.Spec.Containers[0]
		v.spec.ProcessesPerPod = processesPerPod(c)
		for _, e := range c.Env {
			if e.Name == mindioWaitEnv && e.ValueFrom == nil {
				v.spec.Env[e.Name] = e.Value
			}
		}
	}
	if v.spec.ProcessesPerPod < 1 {
		v.spec.ProcessesPerPod = 1
	}
	return v
}

// rankZero returns the pod of the lowest index (0 when it exists).
func (v *jobView) rankZero() *api.TaskInfo {
	best := -1
	for i := range v.pods {
		if best < 0 || i < best {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	return current(v.pods[best])
}

// current picks, among the pods of one index, the one that is not ending: the replacement over
// the pod it replaces.
func current(tasks []*api.TaskInfo) *api.TaskInfo {
	var pick *api.TaskInfo
	for _, t := range tasks {
		if pick == nil || (ending(pick) && !ending(t)) ||
			(ending(pick) == ending(t) && t.Pod != nil && pick.Pod != nil &&
				pick.Pod.CreationTimestamp.Before(&t.Pod.CreationTimestamp)) {
			pick = t
		}
	}
	return pick
}

func ending(t *api.TaskInfo) bool {
	return t.Status == api.Releasing || t.Status == api.Failed || t.Status == api.Succeeded ||
		(t.Pod != nil && t.Pod.DeletionTimestamp != nil)
}

// processesPerPod reads the ranks a pod runs: an accelerator request, else torchrun's
// --nproc-per-node, else 1 (as plugin/volcano_job.cc reads a Volcano Job).
func processesPerPod(c v1.Container) int {
	for _, list := range []v1.ResourceList{c.Resources.Limits, c.Resources.Requests} {
		for name, q := range list {
			n := string(name)
			if strings.Contains(n, "gpu") || strings.Contains(n, "npu") || strings.Contains(n, "Ascend") {
				if v, ok := q.AsInt64(); ok && v > 0 && v <= 1024 {
					return int(v)
				}
			}
		}
	}
	cmd := strings.Join(append(append([]string{}, c.Command...), c.Args...), " ")
	for _, flag := range []string{"--nproc-per-node", "--nproc_per_node"} {
		at := strings.Index(cmd, flag)
		if at < 0 {
			continue
		}
		rest := strings.TrimLeft(cmd[at+len(flag):], "= ")
		end := 0
		for end < len(rest) && rest[end] >= '0' && rest[end] <= '9' {
			end++
		}
		if v, err := strconv.Atoi(rest[:end]); err == nil && v > 0 && v <= 1024 {
			return v
		}
	}
	return 1
}

// engineAnnotations is a PodGroup's annotations without the plugin's own state (its prefix is
// not Regroup's, but keep the engine's input to the job's keys).
func engineAnnotations(in map[string]string) map[string]string {
	out := make(map[string]string, len(in))
	for k, v := range in {
		if strings.HasPrefix(k, stateAnnotationPrefix) {
			continue
		}
		out[k] = v
	}
	return out
}

func copyMap(in map[string]string) map[string]string {
	out := make(map[string]string, len(in))
	for k, v := range in {
		out[k] = v
	}
	return out
}

// podPhase maps a task's status onto the engine's pod phase; ok is false for a status the engine
// is not told about (a finished pod).
func podPhase(t *api.TaskInfo) (phase int, ok bool) {
	if t.Pod != nil && t.Pod.DeletionTimestamp != nil {
		return phaseDeleted, true
	}
	switch t.Status {
	case api.Pending, api.Allocated, api.Pipelined:
		return phasePending, true
	case api.Binding, api.Bound:
		return phaseBound, true
	case api.Running:
		return phaseRunning, true
	case api.Failed:
		return phaseFailed, true
	case api.Releasing:
		return phaseDeleted, true
	}
	return 0, false
}

// The engine's pod phases (regroup.PodPhase), as ints so that the table above reads plainly.
const (
	phasePending = iota
	phaseBound
	phaseRunning
	phaseFailed
	phaseDeleted
)

// equal reports whether two specs are the same, without encoding them.
func (s *jobSpec) equal(o *jobSpec) bool {
	return s.ID == o.ID && s.UID == o.UID && s.Pods == o.Pods && s.ProcessesPerPod == o.ProcessesPerPod &&
		s.Volcano == o.Volcano && maps.Equal(s.Labels, o.Labels) && maps.Equal(s.Annotations, o.Annotations) &&
		maps.Equal(s.Env, o.Env)
}

// encode writes the spec as the engine reads it. The encoding is deterministic (encoding/json
// sorts map keys), so comparing bytes tells whether the spec changed.
func (s *jobSpec) encode() ([]byte, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("encoding the job spec of %s: %w", s.ID, err)
	}
	return b, nil
}
