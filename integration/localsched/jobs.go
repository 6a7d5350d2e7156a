// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	batchv1alpha1 "volcano.sh/apis/pkg/apis/batch/v1alpha1"
	busv1alpha1 "volcano.sh/apis/pkg/apis/bus/v1alpha1"
	"volcano.sh/apis/pkg/apis/scheduling"
	schedulingscheme "volcano.sh/apis/pkg/apis/scheduling/scheme"
	schedulingv1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"
)

// Volcano's pod annotations and labels (volcano.sh/apis batch/v1alpha1).
const (
	taskSpecKey  = batchv1alpha1.TaskSpecKey // "volcano.sh/task-spec"
	taskIndexKey = batchv1alpha1.TaskIndex   // "volcano.sh/task-index"
	jobNameKey   = batchv1alpha1.JobNameKey  // "volcano.sh/job-name"
)

// defaultMaxRetry is Volcano's default spec.maxRetry.
const defaultMaxRetry = 3

// deletionGrace: a pod marked for deletion whose end the harness never reports is deleted after
// this long (what a kubelet's grace period would give it).
const deletionGrace = 30 * time.Second

// controlledJob is a submitted Volcano Job and what the controller remembers of it.
type controlledJob struct {
	job       *batchv1alpha1.Job
	pgName    string
	failures  int             // pods created again after they failed
	completed bool            // a pod succeeded: nothing is created again
	warned    map[string]bool // warnings given once
}

// submit reads a Volcano Job and creates its PodGroup; the pods follow in the next reconcile.
func (l *Loop) submit(file string) error {
	if file == "" {
		return fmt.Errorf("\"file\" is missing")
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	job := &batchv1alpha1.Job{}
	if err := yaml.Unmarshal(b, job); err != nil {
		return fmt.Errorf("%s is not a Volcano Job: %v", file, err)
	}
	if job.Kind != "" && job.Kind != "Job" {
		return fmt.Errorf("%s: kind %q; want a Volcano Job (batch.volcano.sh/v1alpha1, kind Job)", file, job.Kind)
	}
	if job.Name == "" {
		return fmt.Errorf("%s: metadata.name is missing", file)
	}
	if job.Namespace == "" {
		job.Namespace = "default"
	}
	if len(job.Spec.Tasks) == 0 {
		return fmt.Errorf("%s: spec.tasks is empty", file)
	}
	total := int32(0)
	names := map[string]bool{}
	for i, t := range job.Spec.Tasks {
		if t.Name == "" {
			return fmt.Errorf("%s: spec.tasks[%d].name is missing", file, i)
		}
		if names[t.Name] {
			return fmt.Errorf("%s: two tasks are named %q", file, t.Name)
		}
		names[t.Name] = true
		if t.Replicas < 0 {
			return fmt.Errorf("%s: task %s has replicas %d", file, t.Name, t.Replicas)
		}
		if len(t.Template.Spec.Containers) == 0 {
			return fmt.Errorf("%s: task %s has no container", file, t.Name)
		}
		total += t.Replicas
	}
	if job.Spec.MinAvailable < 0 || job.Spec.MinAvailable > total {
		return fmt.Errorf("%s: spec.minAvailable %d; want 0 to %d (the pods of all tasks)", file, job.Spec.MinAvailable, total)
	}
	if job.Spec.MinAvailable == 0 {
		job.Spec.MinAvailable = total
	}
	for _, cj := range l.jobs {
		if cj.job.Namespace == job.Namespace && cj.job.Name == job.Name {
			return fmt.Errorf("job %s/%s was already submitted", job.Namespace, job.Name)
		}
	}
	if job.Spec.Queue == "" {
		job.Spec.Queue = "default"
	}
	if err := l.ensureQueue(job.Spec.Queue); err != nil {
		return err
	}
	if job.Spec.SchedulerName == "" {
		job.Spec.SchedulerName = schedulerName
	}
	if job.Spec.SchedulerName != schedulerName {
		l.warn("job %s/%s asks for scheduler %q; this loop is %q, so its pods stay pending",
			job.Namespace, job.Name, job.Spec.SchedulerName, schedulerName)
	}
	// The API server's bookkeeping.
	job.UID = uuid.NewUUID()
	job.CreationTimestamp = metav1.Now()
	job.ResourceVersion = "1"

	cj := &controlledJob{job: job, pgName: fmt.Sprintf("%s-%s", job.Name, job.UID), warned: map[string]bool{}}
	yes := true
	pg := &schedulingv1beta1.PodGroup{
		ObjectMeta: metav1.ObjectMeta{
			Name: cj.pgName, Namespace: job.Namespace, UID: uuid.NewUUID(),
			CreationTimestamp: metav1.Now(), ResourceVersion: "1",
			Labels: copyMap(job.Labels), Annotations: copyMap(job.Annotations),
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch.volcano.sh/v1alpha1", Kind: "Job",
				Name: job.Name, UID: job.UID, Controller: &yes, BlockOwnerDeletion: &yes}},
		},
		Spec: schedulingv1beta1.PodGroupSpec{
			MinMember:         job.Spec.MinAvailable,
			MinTaskMember:     minTaskMember(job),
			Queue:             job.Spec.Queue,
			PriorityClassName: job.Spec.PriorityClassName,
			MinResources:      minResources(job),
		},
		Status: schedulingv1beta1.PodGroupStatus{Phase: schedulingv1beta1.PodGroupPending},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := l.vc.SchedulingV1beta1().PodGroups(job.Namespace).Create(ctx, pg, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating PodGroup %s/%s: %v", job.Namespace, cj.pgName, err)
	}
	l.jobs = append(l.jobs, cj)
	klog.Infof("localsched: job %s/%s submitted: PodGroup %s, minMember %d", job.Namespace, job.Name, cj.pgName, job.Spec.MinAvailable)
	l.reconcileJob(cj)
	return nil
}

func (l *Loop) ensureQueue(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	q := &schedulingv1beta1.Queue{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: uuid.NewUUID(), CreationTimestamp: metav1.Now(), ResourceVersion: "1"},
		Spec:       schedulingv1beta1.QueueSpec{Weight: 1},
		Status:     schedulingv1beta1.QueueStatus{State: schedulingv1beta1.QueueStateOpen},
	}
	_, err := l.vc.SchedulingV1beta1().Queues().Create(ctx, q, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating queue %s: %v", name, err)
	}
	return nil
}

func minTaskMember(job *batchv1alpha1.Job) map[string]int32 {
	out := map[string]int32{}
	for _, t := range job.Spec.Tasks {
		if t.MinAvailable != nil {
			out[t.Name] = *t.MinAvailable
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// minResources sums the requests of the first minAvailable pods, in task order (as Volcano's job
// controller does).
func minResources(job *batchv1alpha1.Job) *v1.ResourceList {
	left := job.Spec.MinAvailable
	sum := v1.ResourceList{}
	for _, t := range job.Spec.Tasks {
		for i := int32(0); i < t.Replicas && left > 0; i++ {
			left--
			for _, c := range t.Template.Spec.Containers {
				for name, q := range c.Resources.Requests {
					cur := sum[name]
					cur.Add(q)
					sum[name] = cur
				}
			}
		}
	}
	return &sum
}

// reconcileJobs runs the job controller over every job.
func (l *Loop) reconcileJobs() {
	for _, cj := range l.jobs {
		l.reconcileJob(cj)
	}
}

// reconcileJob: every pod of every task exists; a Failed pod is deleted (and created again at the
// next reconcile) while the job's policies say to restart it; a pod being deleted past its grace
// period is deleted.
func (l *Loop) reconcileJob(cj *controlledJob) {
	job := cj.job
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	list, err := l.kube.CoreV1().Pods(job.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		klog.Errorf("localsched: listing pods: %v", err)
		return
	}
	pods := map[string]*v1.Pod{}
	for i := range list.Items {
		p := &list.Items[i]
		if p.Annotations[jobNameKey] == job.Name {
			pods[p.Name] = p
		}
	}
	for _, p := range pods {
		if p.Status.Phase == v1.PodSucceeded && !cj.completed {
			cj.completed = true
			klog.Infof("localsched: job %s/%s: pod %s succeeded; the job is completing and no pod is created again",
				job.Namespace, job.Name, p.Name)
		}
	}
	names := make([]string, 0, len(pods))
	for n := range pods {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		p := pods[n]
		switch {
		case p.DeletionTimestamp != nil:
			if time.Since(p.DeletionTimestamp.Time) > deletionGrace {
				l.warn("pod %s/%s was not reported ended %s after its deletion began; deleting it", p.Namespace, p.Name, deletionGrace)
				l.deletePod(p.Namespace, p.Name, string(p.UID))
			}
		case p.Status.Phase == v1.PodFailed:
			l.podFailed(cj, p)
		}
	}
	if cj.completed {
		return
	}
	for ti := range job.Spec.Tasks {
		task := &job.Spec.Tasks[ti]
		for i := int32(0); i < task.Replicas; i++ {
			name := fmt.Sprintf("%s-%s-%d", job.Name, task.Name, i)
			if _, ok := pods[name]; ok {
				continue
			}
			if err := l.createPod(cj, task, int(i)); err != nil {
				l.warn("creating pod %s/%s: %v", job.Namespace, name, err)
			}
		}
	}
}

// podFailed applies the job's policy for a failed pod: by default (and for RestartPod,
// RestartTask, RestartJob) the pod is created again, up to spec.maxRetry times in all.
func (l *Loop) podFailed(cj *controlledJob, p *v1.Pod) {
	job := cj.job
	key := "failed|" + string(p.UID)
	if cj.completed {
		if !cj.warned[key] {
			cj.warned[key] = true
			l.warn("pod %s/%s failed after the job began completing; it is not created again", p.Namespace, p.Name)
		}
		return
	}
	code := exitCode(p)
	action := policyAction(job, p.Annotations[taskSpecKey], busv1alpha1.PodFailedEvent, code)
	switch action {
	case "", busv1alpha1.RestartPodAction, busv1alpha1.RestartTaskAction, busv1alpha1.RestartJobAction:
	default:
		if !cj.warned[key] {
			cj.warned[key] = true
			l.warn("pod %s/%s failed (exit code %d); the job's policy says %s, so it is not created again",
				p.Namespace, p.Name, code, action)
			cj.completed = true
		}
		return
	}
	maxRetry := int(job.Spec.MaxRetry)
	if maxRetry <= 0 {
		maxRetry = defaultMaxRetry
	}
	if cj.failures >= maxRetry {
		if !cj.warned[key] {
			cj.warned[key] = true
			l.warn("pod %s/%s failed (exit code %d); the job used its %d retries (spec.maxRetry), so it is not created again",
				p.Namespace, p.Name, code, maxRetry)
		}
		return
	}
	cj.failures++
	klog.Infof("localsched: pod %s/%s failed (exit code %d); deleting it to create it again (%d of %d retries)",
		p.Namespace, p.Name, code, cj.failures, maxRetry)
	l.deletePod(p.Namespace, p.Name, string(p.UID))
}

// policyAction finds the action of the task's, else the job's, policies for an event (or an exit
// code); "" when none matches.
func policyAction(job *batchv1alpha1.Job, task string, event busv1alpha1.Event, code int32) busv1alpha1.Action {
	match := func(ps []batchv1alpha1.LifecyclePolicy) busv1alpha1.Action {
		for _, p := range ps {
			if p.ExitCode != nil {
				if event == busv1alpha1.PodFailedEvent && *p.ExitCode == code {
					return p.Action
				}
				continue
			}
			events := append([]busv1alpha1.Event{p.Event}, p.Events...)
			for _, e := range events {
				if e == event || e == busv1alpha1.AnyEvent {
					return p.Action
				}
			}
		}
		return ""
	}
	for _, t := range job.Spec.Tasks {
		if t.Name == task {
			if a := match(t.Policies); a != "" {
				return a
			}
		}
	}
	return match(job.Spec.Policies)
}

func exitCode(p *v1.Pod) int32 {
	for _, s := range p.Status.ContainerStatuses {
		if s.State.Terminated != nil && s.State.Terminated.ExitCode != 0 {
			return s.State.Terminated.ExitCode
		}
	}
	return 0
}

// createPod creates pod index of a task, with a fresh uid, as Volcano's job controller does.
func (l *Loop) createPod(cj *controlledJob, task *batchv1alpha1.TaskSpec, index int) error {
	job := cj.job
	name := fmt.Sprintf("%s-%s-%d", job.Name, task.Name, index)
	tmpl := task.Template.DeepCopy()
	yes := true
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: job.Namespace, UID: uuid.NewUUID(),
			CreationTimestamp: metav1.Now(), ResourceVersion: "1",
			Labels:      copyMap(tmpl.Labels),
			Annotations: copyMap(tmpl.Annotations),
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch.volcano.sh/v1alpha1", Kind: "Job",
				Name: job.Name, UID: job.UID, Controller: &yes, BlockOwnerDeletion: &yes}},
		},
		Spec: tmpl.Spec,
	}
	for k, v := range map[string]string{
		taskSpecKey: task.Name, taskIndexKey: strconv.Itoa(index), jobNameKey: job.Name,
		batchv1alpha1.JobNamespaceKey: job.Namespace, batchv1alpha1.QueueNameKey: job.Spec.Queue,
		batchv1alpha1.JobVersion: "0",
	} {
		pod.Labels[k] = v
		pod.Annotations[k] = v
	}
	pod.Annotations[schedulingv1beta1.KubeGroupNameAnnotationKey] = cj.pgName
	pod.Annotations[schedulingv1beta1.VolcanoGroupNameAnnotationKey] = cj.pgName
	if pod.Spec.SchedulerName == "" {
		pod.Spec.SchedulerName = job.Spec.SchedulerName
	}
	if pod.Spec.RestartPolicy == "" {
		pod.Spec.RestartPolicy = v1.RestartPolicyAlways
	}
	for ci := range pod.Spec.Containers {
		c := &pod.Spec.Containers[ci]
		c.Env = append(c.Env,
			v1.EnvVar{Name: "VC_TASK_INDEX", Value: strconv.Itoa(index)},
			v1.EnvVar{Name: "VK_TASK_INDEX", Value: strconv.Itoa(index)})
	}
	pod.Status = v1.PodStatus{Phase: v1.PodPending}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l.podMu.Lock()
	defer l.podMu.Unlock()
	if _, err := l.kube.CoreV1().Pods(job.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return err
	}
	l.created[pod.Namespace+"/"+pod.Name] = true
	klog.Infof("localsched: pod %s/%s created (uid %s)", pod.Namespace, pod.Name, pod.UID)
	return nil
}

func copyMap(in map[string]string) map[string]string {
	out := make(map[string]string, len(in))
	for k, v := range in {
		out[k] = v
	}
	return out
}

// convertStatus copies the status of the scheduler's PodGroup onto a stored one.
func convertStatus(in *scheduling.PodGroup, out *schedulingv1beta1.PodGroup) error {
	tmp := &schedulingv1beta1.PodGroup{}
	if err := schedulingscheme.Scheme.Convert(in, tmp, nil); err != nil {
		return fmt.Errorf("converting PodGroup %s/%s: %v", in.Namespace, in.Name, err)
	}
	out.Status = tmp.Status
	return nil
}

func convertBack(in *schedulingv1beta1.PodGroup, out *scheduling.PodGroup) error {
	if err := schedulingscheme.Scheme.Convert(in, out, nil); err != nil {
		return fmt.Errorf("converting PodGroup %s/%s: %v", in.Namespace, in.Name, err)
	}
	return nil
}
