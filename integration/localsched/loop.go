// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/kubernetes"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"

	schedulingv1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"
	nodeshardv1alpha1 "volcano.sh/apis/pkg/apis/shard/v1alpha1"
	vcfake "volcano.sh/apis/pkg/client/clientset/versioned/fake"
	"volcano.sh/volcano/pkg/scheduler"
	_ "volcano.sh/volcano/pkg/scheduler/actions" // registers the actions
	"volcano.sh/volcano/pkg/scheduler/api"
	"volcano.sh/volcano/pkg/scheduler/cache"
	"volcano.sh/volcano/pkg/scheduler/conf"
	"volcano.sh/volcano/pkg/scheduler/framework"
	vcmetrics "volcano.sh/volcano/pkg/scheduler/metrics"
	_ "volcano.sh/volcano/pkg/scheduler/plugins" // registers the built-in plugins

	regroupvolcano "github.com/regroup-dev/regroup/go/volcano"
)

// schedulerName is the cache's name: pods whose spec.schedulerName differs are not scheduled.
const schedulerName = "volcano"

// defaultSchedulerConf is used when no --scheduler-conf is given (volcano_loop.py gives
// deploy/helm/regroup/files/volcano-scheduler.conf): Volcano's default configuration with preempt, and
// regroup in the first tier beside gang. The coordinator's address and credential come from the
// flags, whatever the configuration says.
const defaultSchedulerConf = `
actions: "enqueue, allocate, preempt, backfill"
tiers:
- plugins:
  - name: priority
  - name: gang
  - name: conformance
  - name: regroup
- plugins:
  - name: overcommit
  - name: drf
  - name: predicates
  - name: proportion
  - name: nodeorder
`

// The Volcano fake clientset (generated before client-go v0.35) does not declare that it lacks
// watch-list semantics, so with WatchListClient on (client-go v0.35's default) its informers wait
// forever for the initial-events bookmark and the cache never syncs.
func init() {
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(map[string]bool{"WatchListClient": false}); err != nil {
		klog.Warningf("localsched: turning WatchListClient off: %v", err)
	}
}

var metricsOnce sync.Once

// Config configures a Loop.
type Config struct {
	SchedulerConf     string
	CoordinatorListen string // "off" or "" for none
	CredentialFile    string
	Period            time.Duration
	SessionEvents     bool
	Out               io.Writer
}

// Loop is the scheduler over fake clientsets, the API server's bookkeeping and the job controller.
type Loop struct {
	cfg   Config
	out   *output
	sc    *cache.SchedulerCache
	kube  *kubefake.Clientset
	vc    *vcfake.Clientset
	acts  []framework.Action
	tiers []conf.Tier
	cfgs  []conf.Configuration
	stop  chan struct{}

	podMu sync.Mutex // serialises read-modify-write of pods (binder, evictor, commands)

	// Touched only by the loop goroutine.
	jobs      []*controlledJob
	created   map[string]bool // "namespace/name" of every pod the job controller created
	sessions  int
	readySent bool
	lastClear time.Time
}

// NewLoop builds the cache and the scheduler configuration and starts the cache.
func NewLoop(cfg Config) (*Loop, error) {
	if cfg.Period <= 0 {
		cfg.Period = 200 * time.Millisecond
	}
	l := &Loop{cfg: cfg, out: &output{w: cfg.Out}, stop: make(chan struct{}), created: map[string]bool{}}

	metricsOnce.Do(vcmetrics.InitKubeSchedulerRelatedMetrics) // what cmd/scheduler does; kube's plugins need it
	framework.RegisterPluginBuilder(regroupvolcano.PluginName, regroupvolcano.New)
	acts, tiers, cfgs, _, err := scheduler.UnmarshalSchedulerConf(cfg.SchedulerConf)
	if err != nil {
		return nil, fmt.Errorf("the scheduler configuration: %w", err)
	}
	found := false
	for ti := range tiers {
		for pi := range tiers[ti].Plugins {
			p := &tiers[ti].Plugins[pi]
			if p.Name != regroupvolcano.PluginName {
				continue
			}
			found = true
			if p.Arguments == nil {
				p.Arguments = framework.Arguments{}
			}
			listen := cfg.CoordinatorListen
			if listen == "" {
				listen = "off"
			}
			p.Arguments["regroup.coordinatorListen"] = listen
			// The deployed configuration names mounted Secrets (the token, the TLS certificate);
			// here the flag decides, and the coordinator serves plaintext on loopback.
			for _, arg := range []string{"regroup.credentialFile", "regroup.tlsCertFile", "regroup.tlsKeyFile"} {
				delete(p.Arguments, arg)
			}
			if cfg.CredentialFile != "" {
				p.Arguments["regroup.credentialFile"] = cfg.CredentialFile
			}
		}
	}
	if !found {
		return nil, fmt.Errorf("the scheduler configuration enables no %q plugin", regroupvolcano.PluginName)
	}
	l.acts, l.tiers, l.cfgs = acts, tiers, cfgs

	l.sc = cache.NewCustomMockSchedulerCache(schedulerName, &binder{l}, &evictor{l}, &statusUpdater{l}, nil,
		&recorder{l})
	l.kube = l.sc.Client().(*kubefake.Clientset)
	l.vc = l.sc.VCClient().(*vcfake.Clientset)

	// The API server's defaults: the default queue.
	if err := l.ensureQueue("default"); err != nil {
		return nil, err
	}
	l.sc.Run(l.stop)
	return l, nil
}

// Close stops the cache's workers and the plugin's coordinator.
func (l *Loop) Close() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	regroupvolcano.ResetShared()
}

// Run reads commands from in and schedules every period until "quit" or the end of in.
func (l *Loop) Run(in io.Reader) {
	cmds := make(chan []byte, 64)
	go func() {
		defer close(cmds)
		r := bufio.NewReaderSize(in, 1<<16)
		for {
			line, err := r.ReadBytes('\n')
			if len(strings.TrimSpace(string(line))) > 0 {
				cmds <- line
			}
			if err != nil {
				return
			}
		}
	}()
	ticker := time.NewTicker(l.cfg.Period)
	defer ticker.Stop()
	l.tick()
	for {
		select {
		case line, ok := <-cmds:
			if !ok {
				klog.Infof("localsched: end of input; stopping")
				return
			}
			if l.command(line) {
				return
			}
		case <-ticker.C:
			l.tick()
		}
	}
}

// tick is one period: the job controller, one scheduling session, bookkeeping.
func (l *Loop) tick() {
	l.reconcileJobs()
	l.runSession()
	l.sessions++
	if l.cfg.SessionEvents {
		l.out.emit(map[string]any{"event": "session", "n": l.sessions})
	}
	if !l.readySent {
		l.checkReady()
	}
	if time.Since(l.lastClear) > 10*time.Second {
		l.kube.ClearActions()
		l.vc.ClearActions()
		l.lastClear = time.Now()
	}
}

// runSession mirrors Volcano's Scheduler.runOnce. A panic in a plugin or action is reported and
// the loop goes on.
func (l *Loop) runSession() {
	defer func() {
		if r := recover(); r != nil {
			msg := fmt.Sprintf("a scheduling session panicked: %v", r)
			if l.out.once("panic|" + msg) {
				l.out.emit(map[string]any{"event": "warning", "message": msg})
				klog.Errorf("localsched: %s\n%s", msg, debug.Stack())
			}
		}
	}()
	conf.EnabledActionMap = map[string]bool{}
	for _, a := range l.acts {
		conf.EnabledActionMap[a.Name()] = true
	}
	ssn := framework.OpenSession(l.sc, l.tiers, l.cfgs)
	defer framework.CloseSession(ssn)
	for _, a := range l.acts {
		a.Execute(ssn)
	}
}

// checkReady reports the coordinator's address once it listens.
func (l *Loop) checkReady() {
	listen := l.cfg.CoordinatorListen
	if listen == "" || listen == "off" {
		l.readySent = true
		l.out.emit(map[string]any{"event": "ready", "coordinator": ""})
		return
	}
	rt, err := regroupvolcano.Shared()
	if err != nil {
		l.readySent = true
		l.out.emit(map[string]any{"event": "error", "message": "the plugin's engine: " + err.Error()})
		return
	}
	port := rt.CoordinatorPort()
	if port <= 0 {
		return
	}
	host, _, err := net.SplitHostPort(listen)
	if err != nil || host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	l.readySent = true
	l.out.emit(map[string]any{"event": "ready", "coordinator": net.JoinHostPort(host, strconv.Itoa(port))})
}

// --- commands -----------------------------------------------------------------------------------

type command struct {
	Op     string          `json:"op"`
	Name   string          `json:"name"`
	CPU    string          `json:"cpu"`
	Memory string          `json:"memory"`
	Pods   json.RawMessage `json:"pods"`
	Labels map[string]string
	// Extended resources of a node beside cpu, memory and pods, by name ("huawei.com/Ascend910": "8")
	Resources map[string]string `json:"resources"`
	// configmap: the ConfigMap's namespace and data (a component publishing what it sees)
	Namespace string            `json:"namespace"`
	Data      map[string]string `json:"data"`
	Ready     *bool             `json:"ready"`
	Reason    string            `json:"reason"`
	File      string            `json:"file"`
	Pod       string            `json:"pod"`
	UID       string            `json:"uid"`
	Phase     string            `json:"phase"`
	ExitCode  *int32            `json:"exit_code"`
}

// command applies one line; true means quit. A bad command is answered with an error event.
func (l *Loop) command(line []byte) (quit bool) {
	defer func() {
		if r := recover(); r != nil {
			l.fail("command %s panicked: %v", strings.TrimSpace(string(line)), r)
		}
	}()
	var c command
	if err := json.Unmarshal(line, &c); err != nil {
		l.fail("not a JSON command (%v): %s", err, truncate(string(line), 200))
		return false
	}
	var err error
	switch c.Op {
	case "quit":
		return true
	case "add_node":
		err = l.addNode(c)
	case "node_ready":
		err = l.nodeReady(c)
	case "submit":
		err = l.submit(c.File)
	case "pod_phase":
		err = l.podPhase(c)
	case "configmap":
		err = l.configMap(c)
	case "":
		err = fmt.Errorf("the command has no \"op\"")
	default:
		err = fmt.Errorf("unknown op %q (want add_node, node_ready, submit, pod_phase, configmap or quit)", c.Op)
	}
	if err != nil {
		l.fail("%s: %v", c.Op, err)
	}
	return false
}

func (l *Loop) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	klog.Warningf("localsched: %s", msg)
	l.out.emit(map[string]any{"event": "error", "message": msg})
}

func (l *Loop) warn(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	klog.Warningf("localsched: %s", msg)
	l.out.emit(map[string]any{"event": "warning", "message": msg})
}

func (l *Loop) addNode(c command) error {
	if c.Name == "" {
		return fmt.Errorf("\"name\" is missing")
	}
	cpu, mem, pods := "8", "32Gi", "110"
	if c.CPU != "" {
		cpu = c.CPU
	}
	if c.Memory != "" {
		mem = c.Memory
	}
	if len(c.Pods) > 0 {
		var n int64
		var s string
		if json.Unmarshal(c.Pods, &n) == nil {
			pods = strconv.FormatInt(n, 10)
		} else if json.Unmarshal(c.Pods, &s) == nil {
			pods = s
		} else {
			return fmt.Errorf("\"pods\" must be a number, not %s", string(c.Pods))
		}
	}
	quantities := map[v1.ResourceName]string{v1.ResourceCPU: cpu, v1.ResourceMemory: mem, v1.ResourcePods: pods}
	for name, v := range c.Resources {
		quantities[v1.ResourceName(name)] = v
	}
	list := v1.ResourceList{}
	for name, v := range quantities {
		q, err := resource.ParseQuantity(v)
		if err != nil {
			return fmt.Errorf("%s=%q is not a quantity: %v", name, v, err)
		}
		if q.Sign() <= 0 {
			return fmt.Errorf("%s=%q must be positive", name, v)
		}
		list[name] = q
	}
	labels := map[string]string{"kubernetes.io/hostname": c.Name, "kubernetes.io/os": "linux"}
	for k, v := range c.Labels {
		labels[k] = v
	}
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: c.Name, UID: uuid.NewUUID(), Labels: labels,
			CreationTimestamp: metav1.Now(), ResourceVersion: "1"},
		Status: v1.NodeStatus{
			Capacity: list, Allocatable: list.DeepCopy(),
			Conditions: []v1.NodeCondition{readyCondition(true, "KubeletReady", "kubelet is posting ready status")},
			Phase:      v1.NodeRunning,
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := l.kube.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("node %s already exists", c.Name)
		}
		return err
	}
	// Node adds reach the cache through a worker queue: wait (bounded) so that the next session
	// sees the node.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		l.sc.Mutex.Lock()
		_, ok := l.sc.Nodes[c.Name]
		l.sc.Mutex.Unlock()
		if ok {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	l.warn("node %s was created but the scheduler cache has not seen it after 5 s", c.Name)
	return nil
}

func readyCondition(ready bool, reason, message string) v1.NodeCondition {
	status := v1.ConditionTrue
	if !ready {
		status = v1.ConditionFalse
	}
	now := metav1.Now()
	return v1.NodeCondition{Type: v1.NodeReady, Status: status, Reason: reason, Message: message,
		LastHeartbeatTime: now, LastTransitionTime: now}
}

// notReadyTaint is what the node lifecycle controller puts on a NotReady node; Volcano ignores
// node conditions and relies on it (predicates: TaintToleration).
const notReadyTaint = "node.kubernetes.io/not-ready"

// configMap creates or replaces a ConfigMap, as a cluster component publishes one (MindCluster's
// device plugin and NodeD report faults in theirs).
func (l *Loop) configMap(c command) error {
	if c.Name == "" || c.Namespace == "" {
		return fmt.Errorf("\"name\" and \"namespace\" are needed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cms := l.kube.CoreV1().ConfigMaps(c.Namespace)
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: c.Name, Namespace: c.Namespace}, Data: c.Data}
	_, err := cms.Update(ctx, cm, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		_, err = cms.Create(ctx, cm, metav1.CreateOptions{})
	}
	return err
}

func (l *Loop) nodeReady(c command) error {
	if c.Name == "" {
		return fmt.Errorf("\"name\" is missing")
	}
	if c.Ready == nil {
		return fmt.Errorf("\"ready\" (true or false) is missing")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	node, err := l.kube.CoreV1().Nodes().Get(ctx, c.Name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("no node %s", c.Name)
		}
		return err
	}
	node = node.DeepCopy()
	reason := c.Reason
	if reason == "" {
		reason = map[bool]string{true: "KubeletReady", false: "NodeNotReady"}[*c.Ready]
	}
	conds := []v1.NodeCondition{}
	for _, cond := range node.Status.Conditions {
		if cond.Type != v1.NodeReady {
			conds = append(conds, cond)
		}
	}
	node.Status.Conditions = append(conds, readyCondition(*c.Ready, reason, reason))
	taints := []v1.Taint{}
	for _, t := range node.Spec.Taints {
		if t.Key != notReadyTaint {
			taints = append(taints, t)
		}
	}
	if !*c.Ready {
		now := metav1.Now()
		taints = append(taints, v1.Taint{Key: notReadyTaint, Effect: v1.TaintEffectNoSchedule, TimeAdded: &now})
	}
	node.Spec.Taints = taints
	bumpVersion(&node.ObjectMeta)
	_, err = l.kube.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{})
	return err
}

func (l *Loop) podPhase(c command) error {
	ns, name, err := splitKey(c.Pod)
	if err != nil {
		return err
	}
	var phase v1.PodPhase
	switch strings.ToLower(c.Phase) {
	case "running":
		phase = v1.PodRunning
	case "succeeded":
		phase = v1.PodSucceeded
	case "failed":
		phase = v1.PodFailed
	default:
		return fmt.Errorf("pod %s: phase %q (want Running, Succeeded or Failed)", c.Pod, c.Phase)
	}
	var deleteIt bool
	err = l.mutatePod(ns, name, c.UID, func(p *v1.Pod) error {
		if p.Spec.NodeName == "" {
			return fmt.Errorf("pod %s is not bound to a node", c.Pod)
		}
		if p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
			return fmt.Errorf("pod %s already ended (%s)", c.Pod, p.Status.Phase)
		}
		now := metav1.Now()
		p.Status.Phase = phase
		if p.Status.StartTime == nil {
			p.Status.StartTime = &now
		}
		var cs []v1.ContainerStatus
		for _, ctr := range p.Spec.Containers {
			st := v1.ContainerStatus{Name: ctr.Name, Image: ctr.Image}
			switch phase {
			case v1.PodRunning:
				st.Ready, st.State.Running = true, &v1.ContainerStateRunning{StartedAt: now}
			default:
				code := int32(0)
				if c.ExitCode != nil {
					code = *c.ExitCode
				} else if phase == v1.PodFailed {
					code = 1
				}
				st.State.Terminated = &v1.ContainerStateTerminated{ExitCode: code, FinishedAt: now,
					Reason: map[bool]string{true: "Completed", false: "Error"}[phase == v1.PodSucceeded]}
			}
			cs = append(cs, st)
		}
		p.Status.ContainerStatuses = cs
		p.Status.Conditions = []v1.PodCondition{
			{Type: v1.PodScheduled, Status: v1.ConditionTrue, LastTransitionTime: now},
			{Type: v1.PodReady, Status: map[bool]v1.ConditionStatus{true: v1.ConditionTrue, false: v1.ConditionFalse}[phase == v1.PodRunning], LastTransitionTime: now},
		}
		// A pod being deleted is gone once its processes ended.
		deleteIt = p.DeletionTimestamp != nil && phase != v1.PodRunning
		return nil
	})
	if err != nil {
		if gone, ok := err.(errGone); ok && l.created[c.Pod] {
			// The scheduler deleted the pod (a forced eviction) or replaced it before the kubelet's
			// report: nothing to record.
			klog.Infof("localsched: pod_phase %s for %s ignored: %v", c.Phase, c.Pod, gone)
			return nil
		}
		return err
	}
	if deleteIt {
		l.deletePod(ns, name, c.UID)
	}
	return nil
}

// --- pods ---------------------------------------------------------------------------------------

// mutatePod reads a pod, applies fn and writes it, under podMu. uid, when given, must match.
func (l *Loop) mutatePod(ns, name, uid string, fn func(*v1.Pod) error) error {
	l.podMu.Lock()
	defer l.podMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pod, err := l.kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return errGone(fmt.Sprintf("no pod %s/%s", ns, name))
		}
		return err
	}
	if uid != "" && string(pod.UID) != uid {
		return errGone(fmt.Sprintf("pod %s/%s is now uid %s, not %s (a stale report)", ns, name, pod.UID, uid))
	}
	pod = pod.DeepCopy()
	if err := fn(pod); err != nil {
		return err
	}
	bumpVersion(&pod.ObjectMeta)
	_, err = l.kube.CoreV1().Pods(ns).Update(ctx, pod, metav1.UpdateOptions{})
	return err
}

// errGone: the pod (or the incarnation named) no longer exists.
type errGone string

func (e errGone) Error() string { return string(e) }

// deletePod deletes a pod (the incarnation uid when given).
func (l *Loop) deletePod(ns, name, uid string) {
	l.podMu.Lock()
	defer l.podMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if uid != "" {
		pod, err := l.kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil || string(pod.UID) != uid {
			return
		}
	}
	if err := l.kube.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		klog.Errorf("localsched: deleting pod %s/%s: %v", ns, name, err)
	}
}

func bumpVersion(m *metav1.ObjectMeta) {
	n, _ := strconv.ParseInt(m.ResourceVersion, 10, 64)
	m.ResourceVersion = strconv.FormatInt(n+1, 10)
}

func splitKey(key string) (string, string, error) {
	ns, name, ok := strings.Cut(key, "/")
	if !ok {
		ns, name = "default", key
	}
	if ns == "" || name == "" {
		return "", "", fmt.Errorf("pod %q: want namespace/name", key)
	}
	return ns, name, nil
}

func truncate(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// --- the scheduler's effects --------------------------------------------------------------------

// binder is the kubelet's side of a bind: spec.nodeName is set and the harness is told, which
// starts the pod's process and reports it Running.
type binder struct{ l *Loop }

func (b *binder) Bind(_ kubernetes.Interface, tasks []*api.TaskInfo) map[api.TaskID]string {
	failed := map[api.TaskID]string{}
	for _, t := range tasks {
		if t.Pod == nil {
			failed[t.UID] = "no pod"
			continue
		}
		var bound *v1.Pod
		err := b.l.mutatePod(t.Namespace, t.Name, string(t.Pod.UID), func(p *v1.Pod) error {
			if p.Spec.NodeName != "" {
				return fmt.Errorf("already bound to %s", p.Spec.NodeName)
			}
			if p.DeletionTimestamp != nil {
				return fmt.Errorf("being deleted")
			}
			p.Spec.NodeName = t.NodeName
			p.Status.Conditions = append(p.Status.Conditions,
				v1.PodCondition{Type: v1.PodScheduled, Status: v1.ConditionTrue, LastTransitionTime: metav1.Now()})
			bound = p
			return nil
		})
		if err != nil {
			failed[t.UID] = err.Error()
			klog.Warningf("localsched: binding %s/%s to %s: %v", t.Namespace, t.Name, t.NodeName, err)
			continue
		}
		index, _ := strconv.Atoi(bound.Annotations[taskIndexKey])
		// The job's uid (its pods' controller), from which the job's token at the coordinator
		// is derived.
		jobUID := ""
		for _, o := range bound.OwnerReferences {
			if o.Controller != nil && *o.Controller {
				jobUID = string(o.UID)
			}
		}
		b.l.out.emit(map[string]any{"event": "bind", "pod": t.Namespace + "/" + t.Name, "uid": string(bound.UID),
			"node": t.NodeName, "task": bound.Annotations[taskSpecKey], "index": index,
			"job": bound.Namespace + "/" + bound.Annotations[jobNameKey], "job_uid": jobUID})
	}
	return failed
}

// evictor tells the harness (which kills the pod's processes and reports it Failed) and marks
// the pod for deletion; it is deleted once it ended, or after its grace period.
type evictor struct{ l *Loop }

func (e *evictor) Evict(pod *v1.Pod, reason string) error {
	e.l.out.emit(map[string]any{"event": "evict", "pod": pod.Namespace + "/" + pod.Name, "uid": string(pod.UID),
		"node": pod.Spec.NodeName, "reason": reason})
	err := e.l.mutatePod(pod.Namespace, pod.Name, string(pod.UID), func(p *v1.Pod) error {
		if p.DeletionTimestamp == nil {
			now := metav1.Now()
			grace := int64(30)
			p.DeletionTimestamp, p.DeletionGracePeriodSeconds = &now, &grace
		}
		return nil
	})
	if _, gone := err.(errGone); err != nil && !gone {
		return err
	}
	// A pod that already ended is gone at once.
	if p, gerr := e.l.kube.CoreV1().Pods(pod.Namespace).Get(context.Background(), pod.Name, metav1.GetOptions{}); gerr == nil &&
		p.UID == pod.UID && (p.Status.Phase == v1.PodFailed || p.Status.Phase == v1.PodSucceeded) {
		e.l.deletePod(pod.Namespace, pod.Name, string(pod.UID))
	}
	return nil
}

// statusUpdater writes PodGroup status the way the API server's status subresource does (the
// object's other fields, such as the plugin's annotations, stay as they are); pod status belongs
// to the kubelet (the harness), so the scheduler's pod condition updates are not written.
type statusUpdater struct{ l *Loop }

func (s *statusUpdater) UpdatePodStatus(pod *v1.Pod) (*v1.Pod, error) { return pod, nil }

func (s *statusUpdater) UpdatePodGroup(pg *api.PodGroup) (*api.PodGroup, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	client := s.l.vc.SchedulingV1beta1().PodGroups(pg.Namespace)
	cur, err := client.Get(ctx, pg.Name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	cur = cur.DeepCopy()
	if err := convertStatus(&pg.PodGroup, cur); err != nil {
		return nil, err
	}
	if cur.Annotations == nil {
		cur.Annotations = map[string]string{}
	}
	for k, v := range pg.Annotations {
		cur.Annotations[k] = v
	}
	bumpVersion(&cur.ObjectMeta)
	updated, err := client.Update(ctx, cur, metav1.UpdateOptions{})
	if err != nil {
		return nil, err
	}
	s.l.noteConditions(updated)
	out := &api.PodGroup{Version: api.PodGroupVersionV1Beta1}
	if err := convertBack(updated, &out.PodGroup); err != nil {
		return nil, err
	}
	return out, nil
}

func (s *statusUpdater) UpdateQueueStatus(q *api.QueueInfo) error { return nil }

func (s *statusUpdater) UpdateNodeShardStatus(ns *nodeshardv1alpha1.NodeShard) (*nodeshardv1alpha1.NodeShard, error) {
	return ns, nil
}

// noteConditions logs a PodGroup's Unschedulable conditions (stderr).
func (l *Loop) noteConditions(pg *schedulingv1beta1.PodGroup) {
	for _, c := range pg.Status.Conditions {
		if c.Type == schedulingv1beta1.PodGroupUnschedulableType && c.Status == v1.ConditionTrue {
			klog.V(3).Infof("localsched: PodGroup %s/%s unschedulable: %s: %s", pg.Namespace, pg.Name, c.Reason, c.Message)
		}
	}
}

// recorder receives the scheduler's events: the plugin's (reasons Regroup*) go to the harness,
// RegroupInvalid as job_invalid; the rest are logged. It never blocks.
type recorder struct{ l *Loop }

func (r *recorder) Event(obj runtime.Object, eventtype, reason, message string) {
	r.l.event(obj, eventtype, reason, message)
}

func (r *recorder) Eventf(obj runtime.Object, eventtype, reason, format string, args ...interface{}) {
	r.l.event(obj, eventtype, reason, fmt.Sprintf(format, args...))
}

func (r *recorder) AnnotatedEventf(obj runtime.Object, _ map[string]string, eventtype, reason, format string, args ...interface{}) {
	r.l.event(obj, eventtype, reason, fmt.Sprintf(format, args...))
}

func (l *Loop) event(obj runtime.Object, eventtype, reason, message string) {
	key, job := objectKey(obj)
	if !strings.HasPrefix(reason, "Regroup") {
		klog.V(4).Infof("localsched: event %s %s %s: %s", eventtype, reason, key, message)
		return
	}
	if !l.out.once("plugin_event|" + key + "|" + reason + "|" + message) {
		return
	}
	klog.Infof("localsched: plugin event %s %s %s: %s", eventtype, reason, key, message)
	l.out.emit(map[string]any{"event": "plugin_event", "type": eventtype, "reason": reason, "object": key,
		"job": job, "message": message})
	if reason == regroupvolcano.ReasonInvalid {
		l.out.emit(map[string]any{"event": "job_invalid", "job": job, "podgroup": key, "message": message})
	}
}

// objectKey names an event's object, and the Volcano Job it belongs to.
func objectKey(obj runtime.Object) (key, job string) {
	switch o := obj.(type) {
	case *schedulingv1beta1.PodGroup:
		job = o.Namespace + "/" + o.Name
		for _, ref := range o.OwnerReferences {
			if ref.Kind == "Job" {
				job = o.Namespace + "/" + ref.Name
			}
		}
		return "podgroup/" + o.Namespace + "/" + o.Name, job
	case *v1.Pod:
		return "pod/" + o.Namespace + "/" + o.Name, o.Namespace + "/" + o.Annotations[jobNameKey]
	case metav1.Object:
		return o.GetNamespace() + "/" + o.GetName(), ""
	}
	return fmt.Sprintf("%T", obj), ""
}

// output writes JSON lines, one at a time.
type output struct {
	mu   sync.Mutex
	w    io.Writer
	seen map[string]bool
}

func (o *output) emit(v map[string]any) {
	b, err := json.Marshal(v)
	if err != nil {
		b, _ = json.Marshal(map[string]any{"event": "error", "message": err.Error()})
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.w != nil {
		_, _ = o.w.Write(append(b, '\n'))
	}
}

// once reports whether key is new.
func (o *output) once(key string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.seen == nil {
		o.seen = map[string]bool{}
	}
	if o.seen[key] {
		return false
	}
	o.seen[key] = true
	return true
}
