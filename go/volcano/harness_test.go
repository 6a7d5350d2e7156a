// SPDX-License-Identifier: Apache-2.0

package volcano

// The harness: Volcano's in-process scheduler (pkg/scheduler/uthelper: a real scheduler cache and
// session, fake binder and evictor, no API server) run with the tiers of
// deploy/helm/regroup/files/volcano-scheduler.conf, one scheduling session per step. Between steps the test
// plays the kubelet and the job controller (a pod evicted is gone, its replacement is created).
// Results are read from the session itself (tasks committed to a node, tasks released), so no
// check waits on a timer.

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"volcano.sh/apis/pkg/apis/scheduling"
	schedulingv1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"
	"volcano.sh/volcano/pkg/scheduler"
	_ "volcano.sh/volcano/pkg/scheduler/actions" // registers the actions the configuration names
	"volcano.sh/volcano/pkg/scheduler/actions/allocate"
	"volcano.sh/volcano/pkg/scheduler/actions/backfill"
	"volcano.sh/volcano/pkg/scheduler/actions/enqueue"
	"volcano.sh/volcano/pkg/scheduler/actions/preempt"
	"volcano.sh/volcano/pkg/scheduler/api"
	"volcano.sh/volcano/pkg/scheduler/conf"
	"volcano.sh/volcano/pkg/scheduler/framework"
	"volcano.sh/volcano/pkg/scheduler/plugins/binpack"
	"volcano.sh/volcano/pkg/scheduler/plugins/conformance"
	"volcano.sh/volcano/pkg/scheduler/plugins/drf"
	"volcano.sh/volcano/pkg/scheduler/plugins/gang"
	"volcano.sh/volcano/pkg/scheduler/plugins/nodeorder"
	"volcano.sh/volcano/pkg/scheduler/plugins/overcommit"
	"volcano.sh/volcano/pkg/scheduler/plugins/predicates"
	"volcano.sh/volcano/pkg/scheduler/plugins/priority"
	"volcano.sh/volcano/pkg/scheduler/plugins/proportion"
	"volcano.sh/volcano/pkg/scheduler/uthelper"
	"volcano.sh/volcano/pkg/scheduler/util"

	"github.com/regroup-dev/regroup/go/regroup"
)

// t0 is the tests' start time in Unix milliseconds (the engine's clock is the coordinator's).
const t0 int64 = 1_780_000_000_000

const ns = "default"

// clock is the plugin's injected clock.
type clock struct {
	mu sync.Mutex
	ms int64
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.UnixMilli(c.ms)
}

func (c *clock) set(ms int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ms = ms
}

// recorder observes the plugin's effects: saved states, events, evictions (which it then hands
// to the scheduler's own evictor).
type recorder struct {
	mu        sync.Mutex
	states    map[string]map[string]string // PodGroup "ns/name" -> annotations written
	saves     int
	events    []recordedEvent
	evictions []recordedEviction
	effects   []string // "save <PodGroup>" and "evict <pod>", in the order they happened
	saveErr   error    // when set, SaveState fails with it
	lowered   []string // "<Job> <from> -> <to>", each minAvailable lowering asked for
	lowerErr  error    // when set, LowerMinAvailable fails with it
	tokens    []string // "<namespace>/<Secret> <token>", each token written
	tokenErr  error    // when set, WriteToken fails with it
}

type recordedEvent struct{ pg, kind, reason, message string }
type recordedEviction struct {
	pod  string
	mode regroup.EvictionMode
}

func newRecorder() *recorder { return &recorder{states: map[string]map[string]string{}} }

func (r *recorder) SaveState(_ *framework.Session, pg *api.PodGroup, annotations map[string]string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	key := pg.Namespace + "/" + pg.Name
	if r.saveErr != nil {
		return r.saveErr
	}
	r.effects = append(r.effects, "save "+key)
	if r.states[key] == nil {
		r.states[key] = map[string]string{}
	}
	for k, v := range annotations {
		r.states[key][k] = v
	}
	r.saves++
	return nil
}

func (r *recorder) Event(_ *framework.Session, pg *api.PodGroup, kind, reason, message string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, recordedEvent{pg.Namespace + "/" + pg.Name, kind, reason, message})
}

func (r *recorder) Evict(ssn *framework.Session, task *api.TaskInfo, mode regroup.EvictionMode, reason string) error {
	r.mu.Lock()
	r.evictions = append(r.evictions, recordedEviction{task.Namespace + "/" + task.Name, mode})
	r.effects = append(r.effects, "evict "+task.Namespace+"/"+task.Name)
	r.mu.Unlock()
	if task.Status == api.Failed {
		return nil // deleted, as SessionEvictor does: nothing for the session to release
	}
	return ssn.Evict(task, reason)
}

func (r *recorder) LowerMinAvailable(_ *framework.Session, namespace, name string, to, submitted int32) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lowered = append(r.lowered, fmt.Sprintf("%s/%s %d -> %d", namespace, name, submitted, to))
	return r.lowerErr
}

func (r *recorder) WriteToken(_ *framework.Session, pg *api.PodGroup, secret, token string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.tokenErr != nil {
		return r.tokenErr
	}
	r.tokens = append(r.tokens, pg.Namespace+"/"+secret+" "+token)
	return nil
}

func (r *recorder) eventsWithReason(reason string) []recordedEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []recordedEvent
	for _, e := range r.events {
		if e.reason == reason {
			out = append(out, e)
		}
	}
	return out
}

func (r *recorder) takeEvictions() []recordedEviction {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.evictions
	r.evictions = nil
	return out
}

// confPath is the shipped scheduler configuration.
var confPath = filepath.Join("..", "..", "deploy", "helm", "regroup", "files", "volcano-scheduler.conf")

// loadTiers reads the shipped configuration; args replace the regroup plugin's arguments (the
// tests run no coordinator unless they ask for one). withRegroup false drops the plugin, for the
// comparison "as without the plugin".
func loadTiers(t testing.TB, withRegroup bool, args framework.Arguments) []conf.Tier {
	t.Helper()
	text, err := os.ReadFile(confPath)
	if err != nil {
		t.Fatalf("reading %s: %v", confPath, err)
	}
	_, tiers, _, _, err := scheduler.UnmarshalSchedulerConf(string(text))
	if err != nil {
		t.Fatalf("%s: %v", confPath, err)
	}
	found := false
	var out []conf.Tier
	for _, tier := range tiers {
		var plugins []conf.PluginOption
		for _, p := range tier.Plugins {
			if p.Name == PluginName {
				found = true
				if !withRegroup {
					continue
				}
				p.Arguments = args
			}
			plugins = append(plugins, p)
		}
		out = append(out, conf.Tier{Plugins: plugins})
	}
	if !found {
		t.Fatalf("%s has no %q plugin", confPath, PluginName)
	}
	return out
}

// testArgs: no coordinator, the fault label of the shipped configuration.
func testArgs() framework.Arguments {
	return framework.Arguments{
		argCoordinatorListen: "off",
		argFaultLabel:        "regroup.io/health=faulty",
		argFaultTaint:        "regroup.io/faulty",
	}
}

func builders(opts Options) map[string]framework.PluginBuilder {
	return map[string]framework.PluginBuilder{
		priority.PluginName:    priority.New,
		gang.PluginName:        gang.New,
		conformance.PluginName: conformance.New,
		overcommit.PluginName:  overcommit.New,
		drf.PluginName:         drf.New,
		predicates.PluginName:  predicates.New,
		proportion.PluginName:  proportion.New,
		nodeorder.PluginName:   nodeorder.New,
		binpack.PluginName:     binpack.New,
		PluginName:             Builder(opts),
	}
}

func defaultActions() []framework.Action {
	return []framework.Action{enqueue.New(), allocate.New(), backfill.New()}
}

func preemptActions() []framework.Action {
	return []framework.Action{enqueue.New(), allocate.New(), preempt.New(), backfill.New()}
}

// world is the cluster between sessions: what the API server would hold.
type world struct {
	t        *testing.T
	clock    *clock
	rec      *recorder
	nodes    map[string]*v1.Node
	pods     map[string]*v1.Pod // by name
	pgs      map[string]*schedulingv1beta1.PodGroup
	classes  []*schedulingv1.PriorityClass
	args     framework.Arguments
	noPlugin bool
	tweak    func([]conf.Tier) // changes the shipped tiers for one test
	cms      ConfigMapSource   // MindCluster's fault ConfigMaps (nil: the session's empty client)
	uid      int
}

func newWorld(t *testing.T) *world {
	t.Helper()
	ResetShared()
	t.Cleanup(ResetShared)
	return &world{
		t:     t,
		clock: &clock{ms: t0},
		rec:   newRecorder(),
		nodes: map[string]*v1.Node{},
		pods:  map[string]*v1.Pod{},
		pgs:   map[string]*schedulingv1beta1.PodGroup{},
		args:  testArgs(),
	}
}

func (w *world) options() Options {
	return Options{Now: w.clock.Now, States: w.rec, Events: w.rec, Evictor: w.rec, Jobs: w.rec, Tokens: w.rec,
		ConfigMaps: w.cms}
}

// addNode adds a node of cpu cores (and room for 110 pods).
func (w *world) addNode(name string, cpu int) *v1.Node {
	n := util.BuildNode(name, api.BuildResourceList(strconv.Itoa(cpu), strconv.Itoa(cpu*4)+"Gi",
		api.ScalarResource{Name: "pods", Value: "110"}), map[string]string{})
	n.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}}
	w.nodes[name] = n
	return n
}

// setReady sets a node's Ready condition, with the taint the node lifecycle controller adds.
func (w *world) setReady(name string, status v1.ConditionStatus) {
	n := w.nodes[name]
	n.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: status, Reason: "KubeletStopped"}}
	n.Spec.Taints = nil
	switch status {
	case v1.ConditionFalse:
		n.Spec.Taints = []v1.Taint{{Key: v1.TaintNodeNotReady, Effect: v1.TaintEffectNoSchedule}}
	case v1.ConditionUnknown:
		n.Spec.Taints = []v1.Taint{{Key: v1.TaintNodeUnreachable, Effect: v1.TaintEffectNoSchedule}}
	}
}

// jobKeys are the labels and annotations of an elastic Regroup job: recover for up to 60 s, then
// elastic training down to 2 replicas (one pod each).
func elasticKeys() (labels, annotations map[string]string) {
	return map[string]string{"fault-scheduling": "force", "pod-rescheduling": "on"},
		map[string]string{
			"recover-strategy":             "recover,elastic-training",
			"wait-reschedule-timeout":      "60",
			"regroup.io/min-data-parallel": "2",
		}
}

// addJob adds a Volcano Job's PodGroup and its worker pods (cpu cores each), placed on the nodes
// given (pending where ""), as the job controller creates them.
func (w *world) addJob(name string, minMember int32, labels, annotations map[string]string, cpu int, nodes ...string) {
	pg := util.BuildPodGroup(name+"-pg", ns, "default", minMember, nil, schedulingv1beta1.PodGroupRunning)
	pg.Labels = labels
	pg.Annotations = annotations
	pg.UID = types.UID("pg-" + name)
	pg.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch.volcano.sh/v1alpha1", Kind: "Job",
		Name: name, UID: types.UID("job-" + name)}}
	pg.CreationTimestamp = metav1.NewTime(time.UnixMilli(t0).Add(time.Duration(len(w.pgs)) * time.Second))
	running := 0
	for _, n := range nodes {
		if n != "" {
			running++
		}
	}
	if running < int(minMember) {
		pg.Status.Phase = schedulingv1beta1.PodGroupInqueue
	}
	w.pgs[name] = pg
	for i, node := range nodes {
		w.addPod(name, "worker", i, cpu, node)
	}
}

// addPod creates pod <job>-<task>-<index> with a fresh uid.
func (w *world) addPod(job, task string, index, cpu int, node string) *v1.Pod {
	phase := v1.PodPending
	if node != "" {
		phase = v1.PodRunning
	}
	name := job + "-" + task + "-" + strconv.Itoa(index)
	p := util.BuildPod(ns, name, node, phase, api.BuildResourceList(strconv.Itoa(cpu), strconv.Itoa(cpu)+"Gi"),
		job+"-pg", map[string]string{}, map[string]string{})
	w.uid++
	p.UID = types.UID(name + "-uid" + strconv.Itoa(w.uid))
	p.Annotations[taskSpecKey] = task
	p.Annotations[taskIndexKey] = strconv.Itoa(index)
	p.Annotations[jobNameKey] = job
	p.Spec.SchedulerName = "volcano"
	p.CreationTimestamp = metav1.NewTime(time.UnixMilli(w.clock.ms))
	w.pods[name] = p
	return p
}

// replace plays the job controller after an eviction: the pod is gone and a pending pod of the
// same name, with a new uid, replaces it.
func (w *world) replace(pod string) {
	old := w.pods[pod]
	if old == nil {
		w.t.Fatalf("no pod %s to replace", pod)
	}
	job := old.Annotations[jobNameKey]
	task := old.Annotations[taskSpecKey]
	index, _ := strconv.Atoi(old.Annotations[taskIndexKey])
	cpu := int(old.Spec.Containers[0].Resources.Requests.Cpu().Value())
	delete(w.pods, pod)
	w.addPod(job, task, index, cpu, "")
}

// session is one scheduling session's outcome.
type session struct {
	ssn      *framework.Session
	bound    map[string]string // "ns/pod" -> node, the pods this session placed
	released []string          // "ns/pod" evicted in this session
	phases   map[string]scheduling.PodGroupPhase
}

// run opens a session at the clock's time with the world's objects, runs the actions, and
// applies what the scheduler did to the world (bound pods run on their node, released pods
// stay until the test replaces them).
func (w *world) run(actions []framework.Action) session {
	w.t.Helper()
	tc := uthelper.TestCommonStruct{
		Name:     w.t.Name(),
		Plugins:  builders(w.options()),
		Queues:   []*schedulingv1beta1.Queue{util.BuildQueue("default", 1, nil)},
		PriClass: w.classes,
	}
	for _, name := range sortedKeys(w.nodes) {
		tc.Nodes = append(tc.Nodes, w.nodes[name].DeepCopy())
	}
	for _, name := range sortedKeys(w.pods) {
		tc.Pods = append(tc.Pods, w.pods[name].DeepCopy())
	}
	for _, name := range sortedKeys(w.pgs) {
		tc.PodGroups = append(tc.PodGroups, w.pgs[name].DeepCopy())
	}
	tiers := loadTiers(w.t, !w.noPlugin, w.args)
	if w.tweak != nil {
		w.tweak(tiers)
	}
	ssn := tc.RegisterSession(tiers, nil)
	tc.Run(actions)
	out := session{ssn: ssn, bound: map[string]string{}, phases: map[string]scheduling.PodGroupPhase{}}
	framework.NewJobUpdater(ssn).UpdateAll()
	for _, job := range ssn.Jobs {
		out.phases[job.Name] = job.PodGroup.Status.Phase
		for _, task := range job.Tasks {
			key := task.Namespace + "/" + task.Name
			switch task.Status {
			case api.Binding, api.Bound, api.Allocated:
				if w.pods[task.Name] != nil && w.pods[task.Name].Spec.NodeName == "" {
					out.bound[key] = task.NodeName
				}
			case api.Releasing:
				if w.pods[task.Name] != nil && w.pods[task.Name].DeletionTimestamp == nil {
					out.released = append(out.released, key)
				}
			}
		}
	}
	sort.Strings(out.released)
	tc.Close()
	// The kubelet: bound pods run.
	for key, node := range out.bound {
		p := w.pods[key[len(ns)+1:]]
		p.Spec.NodeName = node
		p.Status.Phase = v1.PodRunning
	}
	// Released pods are terminating until the job controller replaces them.
	for _, key := range out.released {
		p := w.pods[key[len(ns)+1:]]
		now := metav1.NewTime(time.UnixMilli(w.clock.ms))
		p.DeletionTimestamp = &now
	}
	// The PodGroup's status as the scheduler wrote it.
	for name, pg := range w.pgs {
		if ph, ok := out.phases[pg.Name]; ok {
			w.pgs[name].Status.Phase = schedulingv1beta1.PodGroupPhase(ph)
		}
	}
	return out
}

// applySavedState plays the API server: the annotations the plugin wrote are on the PodGroup.
func (w *world) applySavedState() {
	w.rec.mu.Lock()
	defer w.rec.mu.Unlock()
	for _, pg := range w.pgs {
		for k, v := range w.rec.states[pg.Namespace+"/"+pg.Name] {
			if pg.Annotations == nil {
				pg.Annotations = map[string]string{}
			}
			pg.Annotations[k] = v
		}
	}
}

func (w *world) decision(job string) regroup.Decision {
	w.t.Helper()
	rt, err := Shared()
	if err != nil {
		w.t.Fatal(err)
	}
	d, err := rt.Engine().Decision(ns + "/" + job)
	if err != nil {
		w.t.Fatalf("decision of %s: %v", job, err)
	}
	return d
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func priorityClass(name string, value int32) *schedulingv1.PriorityClass {
	return &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: value}
}
