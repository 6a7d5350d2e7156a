// SPDX-License-Identifier: Apache-2.0

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

	"github.com/regroup-dev/regroup/go/regroup"
)

// Which jobs are Regroup's, and how a Volcano Job maps onto the engine's job spec (the MindCluster
// keys, the manager's task, the processes per pod, the env read), are the library's rules
// (regroup.JobHasKeys, regroup.ReadVolcanoJob): this file builds the Volcano Job a session shows
// and places its pods; it keeps no copy of those rules.

// Volcano's pod annotations (volcano.sh/apis batch/v1alpha1) that place a pod in its job.
const (
	taskSpecKey  = "volcano.sh/task-spec"  // the task (role) name
	taskIndexKey = "volcano.sh/task-index" // the pod's index within its task
	jobNameKey   = "volcano.sh/job-name"   // the Volcano Job's name
)

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

// sameEngineAnnotations reports whether engineAnnotations(in) would equal have, without building it.
func sameEngineAnnotations(have, in map[string]string) bool {
	n := 0
	for k, v := range in {
		if strings.HasPrefix(k, stateAnnotationPrefix) {
			continue
		}
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
		n++
	}
	return n == len(have)
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

// jobView is a Volcano job as the plugin maps it onto the engine: the library's reading of the
// job, its training pods by index (node rank) and its manager pods.
type jobView struct {
	id       string
	read     *regroup.VolcanoJob     // the library's reading; nil when err is set
	err      error                   // the job could not be read: not a job the engine can take
	pods     map[int][]*api.TaskInfo // index -> the pods of that index (an old one ending, its replacement)
	index    map[api.TaskID]int      // training pod -> index
	managers map[api.TaskID]bool
	skipped  []string // pods the plugin could not place in the job, with why
}

// jobShape is what the plugin remembers of a job's Volcano Job between sessions: the tasks it has
// seen and the library's reading of the document it last built. The library is asked again only
// when the document changes.
type jobShape struct {
	uid         string
	labels      map[string]string
	annotations map[string]string // without the plugin's own state
	minMember   int32
	tasks       map[string]*taskShape // by task (role) name
	order       []string              // the tasks in the document's order
	read        *regroup.VolcanoJob
	err         error
}

// taskShape is one task of the job as seen so far. A task never shrinks and keeps the template of
// the last pod seen, so a pod that is briefly missing (deleted, not yet created again) changes
// neither the job's size nor the other tasks' node ranks.
type taskShape struct {
	replicas   int
	podUID     string          // the pod whose containers are the template
	containers json.RawMessage // that pod's containers, as the Volcano Job holds them
}

// The subset of a Volcano Job (batch.volcano.sh/v1alpha1) the library reads (abi/regroup.h,
// regroup_volcano_job_read).
type volcanoJobDoc struct {
	APIVersion string          `json:"apiVersion"`
	Kind       string          `json:"kind"`
	Metadata   volcanoJobMeta  `json:"metadata"`
	Spec       volcanoJobSpecs `json:"spec"`
}

type volcanoJobMeta struct {
	Name        string            `json:"name"`
	Namespace   string            `json:"namespace"`
	UID         string            `json:"uid,omitempty"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

type volcanoJobSpecs struct {
	MinAvailable int32            `json:"minAvailable"`
	Tasks        []volcanoJobTask `json:"tasks"`
}

type volcanoJobTask struct {
	Name     string `json:"name"`
	Replicas int    `json:"replicas"`
	Template struct {
		Spec struct {
			Containers json.RawMessage `json:"containers"`
		} `json:"spec"`
	} `json:"template"`
}

type containerDoc struct {
	Name      string                       `json:"name,omitempty"`
	Command   []string                     `json:"command,omitempty"`
	Args      []string                     `json:"args,omitempty"`
	Env       []envDoc                     `json:"env,omitempty"`
	Resources map[string]map[string]string `json:"resources,omitempty"` // limits, requests
}

type envDoc struct {
	Name  string  `json:"name"`
	Value *string `json:"value,omitempty"` // none for a value from a Secret or a field
}

// containersDoc writes a pod's containers as its Volcano Job's template holds them.
func containersDoc(pod *v1.Pod) json.RawMessage {
	out := make([]containerDoc, 0, len(pod.Spec.Containers))
	for _, c := range pod.Spec.Containers {
		d := containerDoc{Name: c.Name, Command: c.Command, Args: c.Args, Resources: map[string]map[string]string{}}
		for _, e := range c.Env {
			env := envDoc{Name: e.Name}
			if e.ValueFrom == nil {
				env.Value = &e.Value
			}
			d.Env = append(d.Env, env)
		}
		for kind, list := range map[string]v1.ResourceList{"limits": c.Resources.Limits, "requests": c.Resources.Requests} {
			if len(list) == 0 {
				continue
			}
			q := map[string]string{}
			for name, v := range list {
				q[string(name)] = v.String()
			}
			d.Resources[kind] = q
		}
		out = append(out, d)
	}
	b, err := json.Marshal(out)
	if err != nil {
		return json.RawMessage("[]")
	}
	return b
}

// roleOrder orders tasks for the node rank: a task named "master" first (MindCluster's rank 0),
// then the others by name.
func roleOrder(roles []string) {
	sort.Slice(roles, func(i, j int) bool {
		mi, mj := strings.EqualFold(roles[i], "master"), strings.EqualFold(roles[j], "master")
		if mi != mj {
			return mi
		}
		return roles[i] < roles[j]
	})
}

// viewJob maps a session job onto the engine. shape is what the plugin remembers of the job (it
// is updated); the library reads the job again only when the Volcano Job it shows has changed.
func viewJob(job *api.JobInfo, shape *jobShape) *jobView {
	pg := job.PodGroup
	v := &jobView{
		id:       engineJobID(job),
		pods:     map[int][]*api.TaskInfo{},
		index:    map[api.TaskID]int{},
		managers: map[api.TaskID]bool{},
	}
	uid := engineJobUID(job)
	if shape.uid != uid {
		// A job deleted and created again under the same name: a new job.
		*shape = jobShape{uid: uid}
	}

	// The pods by task, each with its index when it has one.
	type placed struct {
		task  *api.TaskInfo
		index int
	}
	type role struct {
		placed  []placed
		size    int      // the highest index seen plus one
		unplace []string // why pods could not be placed
		rep     *api.TaskInfo
		repAt   int
	}
	roles := map[string]*role{}
	for _, task := range job.Tasks {
		name := taskRole(task)
		r := roles[name]
		if r == nil {
			r = &role{repAt: -1}
			roles[name] = r
		}
		i, err := podIndexInTask(task)
		if err != nil {
			r.unplace = append(r.unplace, err.Error())
			if task.Pod != nil && r.repAt < 0 && (r.rep == nil || task.Name < r.rep.Name) {
				r.rep = task
			}
			continue
		}
		r.placed = append(r.placed, placed{task, i})
		if i+1 > r.size {
			r.size = i + 1
		}
		if task.Pod != nil && (r.repAt < 0 || i < r.repAt || (i == r.repAt && current([]*api.TaskInfo{r.rep, task}) == task)) {
			r.rep, r.repAt = task, i
		}
	}

	if len(roles) == 0 && len(shape.tasks) == 0 {
		// No pod yet: the job controller creates them once the PodGroup is enqueued. Nothing to
		// read, and nothing wrong.
		return v
	}

	// The tasks, as remembered and as seen now.
	if shape.tasks == nil {
		shape.tasks = map[string]*taskShape{}
	}
	changed := shape.read == nil && shape.err == nil
	for name, r := range roles {
		t := shape.tasks[name]
		if t == nil {
			t = &taskShape{}
			shape.tasks[name] = t
			changed = true
		}
		replicas := r.size
		if len(r.placed) == 0 {
			// A task whose pods carry no index (a manager's, named by hand): its pods by name.
			names := map[string]bool{}
			for _, task := range job.Tasks {
				if taskRole(task) == name {
					names[task.Name] = true
				}
			}
			replicas = len(names)
		}
		if replicas > t.replicas {
			t.replicas, changed = replicas, true
		}
		if r.rep != nil && string(r.rep.Pod.UID) != t.podUID {
			t.podUID, t.containers, changed = string(r.rep.Pod.UID), containersDoc(r.rep.Pod), true
		}
	}
	if len(shape.order) != len(shape.tasks) {
		shape.order = shape.order[:0]
		for name := range shape.tasks {
			shape.order = append(shape.order, name)
		}
		roleOrder(shape.order)
	}
	if !maps.Equal(shape.labels, pg.Labels) {
		shape.labels, changed = copyMap(pg.Labels), true
	}
	if !sameEngineAnnotations(shape.annotations, pg.Annotations) {
		shape.annotations, changed = engineAnnotations(pg.Annotations), true
	}
	if shape.minMember != pg.Spec.MinMember {
		shape.minMember, changed = pg.Spec.MinMember, true
	}
	if changed {
		shape.read, shape.err = readVolcanoJob(v.id, shape)
	}
	v.read, v.err = shape.read, shape.err
	if v.err != nil {
		return v
	}

	// The pods: a manager task's are the manager's; the training tasks' are placed by node rank,
	// task after task.
	manager := map[string]bool{}
	for _, i := range v.read.ManagerTasks {
		if i >= 0 && i < len(shape.order) {
			manager[shape.order[i]] = true
		}
	}
	offset := 0
	for _, name := range shape.order {
		r := roles[name]
		if manager[name] {
			if r != nil {
				for _, task := range job.Tasks {
					if taskRole(task) == name {
						v.managers[task.UID] = true
					}
				}
			}
			continue
		}
		if r != nil {
			for _, p := range r.placed {
				idx := offset + p.index
				v.pods[idx] = append(v.pods[idx], p.task)
				v.index[p.task.UID] = idx
			}
			v.skipped = append(v.skipped, r.unplace...)
		}
		offset += shape.tasks[name].replicas
	}
	return v
}

// readVolcanoJob asks the library to read the Volcano Job the shape describes.
func readVolcanoJob(id string, shape *jobShape) (*regroup.VolcanoJob, error) {
	namespace, name, _ := strings.Cut(id, "/")
	doc := volcanoJobDoc{
		APIVersion: "batch.volcano.sh/v1alpha1",
		Kind:       "Job",
		Metadata: volcanoJobMeta{Name: name, Namespace: namespace, UID: shape.uid,
			Labels: shape.labels, Annotations: shape.annotations},
		Spec: volcanoJobSpecs{MinAvailable: shape.minMember},
	}
	for _, n := range shape.order {
		t := volcanoJobTask{Name: n, Replicas: shape.tasks[n].replicas}
		t.Template.Spec.Containers = shape.tasks[n].containers
		if t.Template.Spec.Containers == nil {
			t.Template.Spec.Containers = json.RawMessage("[]")
		}
		doc.Spec.Tasks = append(doc.Spec.Tasks, t)
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("writing the Volcano Job of %s: %w", id, err)
	}
	return regroup.ReadVolcanoJob(b)
}
