// SPDX-License-Identifier: Apache-2.0

package volcano

import (
	"bytes"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"volcano.sh/volcano/pkg/scheduler/api"
	"volcano.sh/volcano/pkg/scheduler/framework"
	"volcano.sh/volcano/pkg/scheduler/plugins/util"

	"github.com/regroup-dev/regroup/go/regroup"
)

// PluginName is the plugin's name in the scheduler configuration.
const PluginName = "regroup"

// Plugin arguments (volcano-scheduler.conf, under the plugin's `arguments`).
const (
	// argFaultTaint: a taint key that marks a node faulty. Default "regroup.io/faulty"; "" for none.
	argFaultTaint = "regroup.faultTaint"
	// argFaultLabel: a label ("key=value", or "key" for any value) that marks a node faulty.
	argFaultLabel = "regroup.faultLabel"
	// argCoordinatorListen: where the coordinator listens for managers. Default "0.0.0.0:8899";
	// "" or "off" runs no coordinator.
	argCoordinatorListen = "regroup.coordinatorListen"
	// argCredentialFile: a file holding the cluster key (a mounted Secret), from which each
	// job's token, the one its manager must send, is derived. Required: without it the
	// coordinator does not start, unless argInsecure is true.
	argCredentialFile = "regroup.credentialFile"
	// argInsecure: true runs the coordinator without a credential, accepting every manager
	// (tests on a trusted network), with a warning in the log at every start. Default false.
	argInsecure = "regroup.insecure"
	// argTLSCertFile and argTLSKeyFile: serve the coordinator over TLS.
	argTLSCertFile = "regroup.tlsCertFile"
	argTLSKeyFile  = "regroup.tlsKeyFile"
	// argTLSClientCAFile: mutual TLS, every manager must present a certificate this CA bundle
	// signed (the ca.crt of the coordinator's cert-manager Secret); needs argTLSCertFile and
	// argTLSKeyFile. Default none: managers present no certificate.
	argTLSClientCAFile = "regroup.tlsClientCaFile"
	// argLeaseMs: the managers' lease, in ms (1 to 600000). A manager commits a step only within
	// this long of asking the coordinator, and a newer manager of a job gets no lease before the
	// older one's ran out (docs/membership.md). Default 0: the library's, 10000.
	argLeaseMs = "regroup.leaseMs"
	// argNodeOrderWeight multiplies the engine's node scores (0 to 100). Default 10.
	argNodeOrderWeight = "regroup.nodeOrderWeight"
	// argMindClusterFaults: read the node and NPU faults MindCluster's Ascend Device Plugin and
	// NodeD publish (ConfigMaps kube-system/mindx-dl-deviceinfo-<node> and
	// mindx-dl/mindx-dl-nodeinfo-<node>; docs/mindcluster-faults.md). Default true; without
	// those components there is nothing to read and nothing changes.
	argMindClusterFaults = "regroup.mindclusterFaults"
)

const (
	defaultFaultTaint        = "regroup.io/faulty"
	defaultCoordinatorListen = "0.0.0.0:8899"
	defaultNodeOrderWeight   = 10
)

// Event reasons on a job's PodGroup.
const (
	ReasonInvalid  = "RegroupInvalid"  // the job's configuration fails validation
	ReasonFallback = "RegroupFallback" // a MindCluster key's bad value was replaced, as MindCluster does
	ReasonRestore  = "RegroupRestore"  // the saved state could not be restored
	ReasonEvict    = "RegroupEvict"    // a pod is evicted from a faulty node
	ReasonToken    = "RegroupToken"    // the job's coordinator token could not be written
	// ReasonMinAvailable: an every-pod minAvailable is lowered to the elastic minimum (or could not be)
	ReasonMinAvailable = "RegroupMinAvailable"
)

// Options are what a scheduler build (or a test) may replace. Zero fields take the defaults.
type Options struct {
	// Now is the plugin's clock; default time.Now. The engine is driven in Unix milliseconds, the
	// clock of the coordinator's facts.
	Now func() time.Time
	// Runtime returns the engine and coordinator that outlive sessions; default Shared.
	Runtime func() (*Runtime, error)
	States  StateStore  // default PodGroupStateStore
	Events  EventSink   // default SessionEvents
	Evictor Evictor     // default SessionEvictor
	Jobs    JobPatcher  // default VolcanoJobPatcher
	Tokens  TokenWriter // default SecretTokenWriter
	// ConfigMaps gives the ConfigMaps MindCluster's components publish; default: informers on the
	// session's client, shared by all sessions.
	ConfigMaps ConfigMapSource
}

// New builds the plugin with the default options: what the scheduler registers.
func New(arguments framework.Arguments) framework.Plugin {
	return newPlugin(arguments, Options{})
}

// Builder returns a plugin builder with the given options (a test's clock and recorders).
func Builder(opts Options) framework.PluginBuilder {
	return func(arguments framework.Arguments) framework.Plugin { return newPlugin(arguments, opts) }
}

type coordinatorConfig struct {
	listen, credentialFile, tlsCert, tlsKey, tlsClientCA string
	insecure                                             bool
	leaseMs                                              int
}

type config struct {
	nodes       nodeHealthRules
	coordinator coordinatorConfig
	weight      float64
	mindcluster bool // read MindCluster's fault ConfigMaps
}

// parseArguments reads the plugin's arguments; a bad one is logged and its default kept.
func parseArguments(args framework.Arguments) config {
	c := config{
		nodes:       nodeHealthRules{taint: defaultFaultTaint},
		coordinator: coordinatorConfig{listen: defaultCoordinatorListen},
		weight:      defaultNodeOrderWeight,
		mindcluster: true,
	}
	args.GetString(&c.nodes.taint, argFaultTaint)
	args.GetBool(&c.mindcluster, argMindClusterFaults)
	label := ""
	args.GetString(&label, argFaultLabel)
	if k, v, err := parseFaultLabel(label); err != nil {
		klog.Errorf("regroup: %v; no fault label is read", err)
	} else {
		c.nodes.labelKey, c.nodes.labelValue = k, v
	}
	args.GetString(&c.coordinator.listen, argCoordinatorListen)
	if c.coordinator.listen == "off" {
		c.coordinator.listen = ""
	}
	args.GetString(&c.coordinator.credentialFile, argCredentialFile)
	args.GetBool(&c.coordinator.insecure, argInsecure)
	args.GetString(&c.coordinator.tlsCert, argTLSCertFile)
	args.GetString(&c.coordinator.tlsKey, argTLSKeyFile)
	args.GetString(&c.coordinator.tlsClientCA, argTLSClientCAFile)
	lease := 0
	args.GetInt(&lease, argLeaseMs)
	if lease < 0 || lease > 600000 {
		klog.Errorf("regroup: %s=%d is out of range (1 to 600000 ms, 0 for the default); using the default",
			argLeaseMs, lease)
	} else {
		c.coordinator.leaseMs = lease
	}
	w := c.weight
	args.GetFloat64(&w, argNodeOrderWeight)
	if w < 0 {
		klog.Errorf("regroup: %s=%v must not be negative; using %v", argNodeOrderWeight, w, c.weight)
	} else {
		c.weight = w
	}
	return c
}

// jobRecord is what the runtime remembers of a job between sessions.
type jobRecord struct {
	spec    []byte   // the spec last upserted
	shape   jobShape // the job's Volcano Job as seen so far, and the library's reading of it
	valid   bool
	invalid string // the engine's message when not valid
	pods    int    // training pods the engine has for the job
	pg      string // the PodGroup ("namespace/name")

	seen           map[string]podSeen // by pod uid: what the engine was last told
	lastNode       map[int]string     // pod index -> the node its last incarnation was bound to
	evicted        map[string]int64   // pod uid -> when the plugin evicted it (ms)
	savedState     string             // the state last written to the PodGroup
	savedDirective uint64
	uidsChanged    bool // a pod incarnation appeared or went since the state was saved

	loweredFrom int32 // the minAvailable last asked to be lowered (0: none)
	loweredAt   int64 // when (ms)

	tokenUID      string // the job uid whose coordinator token was written ("" : none yet)
	tokenFailedAt int64  // when writing it last failed (ms), to try again after tokenRetryMs
}

type podSeen struct {
	index int
	phase int
	node  string
}

// sessionJob is what the hooks of one session read for a Regroup job. It is written in
// OnSessionOpen and only read afterwards (predicates run on many goroutines).
type sessionJob struct {
	id       string
	valid    bool
	invalid  string
	decision regroup.Decision
	full     int32                           // training pods + managers
	elastic  int32                           // the elastic minimum (pods, managers included); 0: none
	avoid    map[string]bool                 // nodes this job avoids
	managers map[api.TaskID]bool             // manager pods
	scores   map[api.TaskID]map[string]int32 // pending training pod -> node -> engine score
}

// need is the number of pods the job must hold to be ready: the engine's gang minimum, which
// is the whole job at full size and the current generation's pods (plus the manager) when
// scaled in.
func (sj *sessionJob) need() int32 { return int32(sj.decision.GangMin) }

type plugin struct {
	cfg  config
	opts Options

	ssn       *framework.Session
	rt        *Runtime
	nowMs     int64
	rtErr     error
	unhealthy map[string]string // node -> why it is faulty or unknown
	avoidNew  map[string]string // node -> why no new pod of a Regroup job goes there (pre-separated)
	jobs      map[api.JobID]*sessionJob
}

func newPlugin(arguments framework.Arguments, opts Options) *plugin {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Runtime == nil {
		opts.Runtime = Shared
	}
	if opts.States == nil {
		opts.States = PodGroupStateStore{}
	}
	if opts.Events == nil {
		opts.Events = SessionEvents{}
	}
	if opts.Evictor == nil {
		opts.Evictor = SessionEvictor{}
	}
	if opts.Jobs == nil {
		opts.Jobs = VolcanoJobPatcher{}
	}
	if opts.Tokens == nil {
		opts.Tokens = SecretTokenWriter{}
	}
	if opts.ConfigMaps == nil {
		opts.ConfigMaps = defaultConfigMaps
	}
	return &plugin{cfg: parseArguments(arguments), opts: opts}
}

// Name implements framework.Plugin.
func (p *plugin) Name() string { return PluginName }

// OnSessionOpen implements framework.Plugin: it tells the engine what the session shows, ticks
// it, carries out its evictions, saves changed states, and registers the hooks.
func (p *plugin) OnSessionOpen(ssn *framework.Session) {
	now := p.opts.Now()
	p.nowMs = now.UnixMilli()
	p.ssn = ssn
	p.jobs = map[api.JobID]*sessionJob{}
	p.unhealthy = map[string]string{}
	p.avoidNew = map[string]string{}

	rt, err := p.opts.Runtime()
	if err != nil {
		// Without the engine a Regroup job cannot be run as its keys say: refuse it rather than
		// schedule it as a plain gang job.
		p.rtErr = err
		klog.Errorf("regroup: %v; jobs with Regroup or MindCluster keys are not scheduled", err)
		ssn.AddJobValidFn(p.Name(), p.validate)
		return
	}
	p.rt = rt
	rt.mu.Lock()
	defer rt.mu.Unlock()

	rt.ensureCoordinator(p.cfg.coordinator, now)
	// Pods first, so that a node found faulty in this session (or after a restart) takes the
	// pods the engine now knows are on it.
	p.syncJobs(ssn)
	p.syncNodes(ssn)
	if _, err := rt.engine.Tick(p.nowMs); err != nil {
		klog.Errorf("regroup: engine tick: %v", err)
	}
	rt.publish()
	p.applyDecisions(ssn)

	ssn.AddJobValidFn(p.Name(), p.validate)
	ssn.AddJobReadyFn(p.Name(), p.jobReady)
	ssn.AddJobPipelinedFn(p.Name(), p.jobPipelined)
	ssn.AddJobStarvingFns(p.Name(), p.jobStarving)
	ssn.AddPredicateFn(p.Name(), p.predicate)
	ssn.AddNodeOrderFn(p.Name(), p.nodeOrder)
	ssn.AddPreemptableFn(p.Name(), p.evictable)
	ssn.AddReclaimableFn(p.Name(), p.evictable)
}

// OnSessionClose implements framework.Plugin.
func (p *plugin) OnSessionClose(ssn *framework.Session) {
	p.jobs = nil
	p.unhealthy = nil
	p.avoidNew = nil
	p.ssn = nil
}

// syncNodes reports the nodes whose health changed. A node the engine never heard of counts as
// healthy, so healthy nodes are reported only after they were not.
func (p *plugin) syncNodes(ssn *framework.Session) {
	rt := p.rt
	var mc map[string]mcNode
	if p.cfg.mindcluster {
		mc = p.readMindCluster(ssn)
	}
	known := 0 // nodes of the session the runtime knew: when all it knew, none has left
	for name, n := range ssn.Nodes {
		h, reason := p.cfg.nodes.health(n.Node)
		if f, ok := mc[name]; ok && h != regroup.NodeFaulty {
			switch f.action {
			case mcFaulty:
				h, reason = regroup.NodeFaulty, f.reason
			case mcAvoidNew:
				p.avoidNew[name] = f.reason
			}
		}
		if h != regroup.NodeHealthy {
			p.unhealthy[name] = reason
		}
		now := nodeState{h, reason}
		prev, ok := rt.nodes[name]
		if ok {
			known++
		}
		if (!ok && h == regroup.NodeHealthy) || (ok && prev == now) {
			if !ok {
				rt.nodes[name] = now
			}
			continue
		}
		if err := rt.engine.SetNodeHealth(name, h, reason, p.nowMs); err != nil {
			klog.Errorf("regroup: node %s: %v", name, err)
			continue
		}
		rt.nodes[name] = now
	}
	if known == len(rt.nodes) {
		return
	}
	for name, prev := range rt.nodes {
		if _, ok := ssn.Nodes[name]; ok || prev.health == regroup.NodeUnknown {
			continue
		}
		gone := nodeState{regroup.NodeUnknown, "the node left the cluster"}
		if err := rt.engine.SetNodeHealth(name, gone.health, gone.reason, p.nowMs); err != nil {
			klog.Errorf("regroup: node %s: %v", name, err)
			continue
		}
		rt.nodes[name] = gone
	}
}

// syncJobs upserts the session's Regroup jobs, restores their state after a restart, reports
// their pods, and forgets the jobs that are gone.
func (p *plugin) syncJobs(ssn *framework.Session) {
	rt := p.rt
	seen := map[string]bool{}
	ids := make([]api.JobID, 0, len(ssn.Jobs))
	for id, job := range ssn.Jobs {
		if job.PodGroup == nil {
			continue
		}
		ours, err := regroup.JobHasKeys(job.PodGroup.Labels, job.PodGroup.Annotations)
		if err != nil {
			klog.Errorf("regroup: PodGroup %s/%s: %v; it is left to the other plugins", job.Namespace, job.Name, err)
			continue
		}
		if ours {
			ids = append(ids, id)
		}
	}
	// A stable order, so that two PodGroups claiming one job resolve the same way every session.
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		job := ssn.Jobs[id]
		engineID := engineJobID(job)
		if seen[engineID] {
			klog.Warningf("regroup: PodGroup %s/%s names job %s, which another PodGroup already "+
				"names in this session; it is left to the other plugins", job.Namespace, job.Name, engineID)
			continue
		}
		seen[engineID] = true
		p.jobs[id] = p.syncJob(ssn, job, engineID)
	}
	for id := range rt.jobs {
		if seen[id] {
			continue
		}
		if err := rt.engine.RemoveJob(id); err != nil && regroup.StatusOf(err) != regroup.StatusNotFound {
			klog.Errorf("regroup: removing job %s: %v", id, err)
		}
		delete(rt.jobs, id)
	}
}

func (p *plugin) syncJob(ssn *framework.Session, job *api.JobInfo, id string) *sessionJob {
	rt := p.rt
	rec := rt.jobs[id]
	first := rec == nil
	if first {
		rec = &jobRecord{seen: map[string]podSeen{}, evicted: map[string]int64{}, lastNode: map[int]string{}}
		rt.jobs[id] = rec
	}
	v := viewJob(job, &rec.shape)
	sj := &sessionJob{
		id:       id,
		managers: v.managers,
		avoid:    map[string]bool{},
		scores:   map[api.TaskID]map[string]int32{},
	}
	if v.err != nil {
		// The library cannot read the job (an absurd accelerator count, say): not a job the
		// engine can take. Said once per change of the job.
		msg := validationMessage(v.err, nil)
		if rec.valid || rec.invalid != msg {
			klog.Warningf("regroup: job %s cannot be read: %s", id, msg)
			p.opts.Events.Event(ssn, job.PodGroup, v1.EventTypeWarning, ReasonInvalid, msg)
		}
		rec.valid, rec.invalid, rec.spec = false, msg, nil
		sj.invalid = msg
		return sj
	}
	for _, why := range v.skipped {
		klog.V(3).Infof("regroup: job %s: %s; the pod is not reported to the engine", id, why)
	}
	if v.read != nil {
		sj.full = int32(v.read.Pods + v.read.ManagerPods)
		sj.elastic = int32(v.read.ElasticMinAvailable)
	}
	if v.read == nil || v.read.Pods == 0 {
		// The job controller has not created the training pods yet (a session can see the
		// PodGroup, or only its manager pod, first): there is nothing to size or validate, and
		// the job is not invalid. It waits for a session that sees its pods.
		sj.invalid = fmt.Sprintf("job %s has no training pods yet: waiting for the job controller "+
			"to create them", id)
		klog.V(3).Infof("regroup: %s", sj.invalid)
		return sj
	}
	if !bytes.Equal(v.read.Spec, rec.spec) {
		p.upsert(ssn, job, rec, v, v.read.Spec, first)
	}
	sj.valid, sj.invalid = rec.valid, rec.invalid
	if !rec.valid {
		return sj
	}
	p.reportPods(job, rec, v)
	p.mintToken(ssn, job, rec, id)
	return sj
}

// tokenRetryMs is how long the plugin waits to write a job's token again after a failure.
const tokenRetryMs = 30000

// mintToken writes the job's coordinator token (derived from the cluster key the coordinator
// holds) into the job's namespace once per job uid, so that nobody mints it by hand. Nothing
// without a cluster key (no coordinator, or an insecure one).
func (p *plugin) mintToken(ssn *framework.Session, job *api.JobInfo, rec *jobRecord, id string) {
	key, uid := p.rt.clusterKey, engineJobUID(job)
	if key == "" || uid == "" || rec.tokenUID == uid ||
		(rec.tokenFailedAt != 0 && p.nowMs-rec.tokenFailedAt < tokenRetryMs) {
		return
	}
	secret := TokenSecretName(id)
	token, err := regroup.JobToken(key, id, uid)
	if err == nil {
		err = p.opts.Tokens.WriteToken(ssn, job.PodGroup, secret, token)
	}
	if err != nil {
		rec.tokenFailedAt = p.nowMs
		msg := fmt.Sprintf("the job's coordinator token could not be written to Secret %s/%s "+
			"(its manager cannot attach until it is; trying again in %d s): %v",
			job.Namespace, secret, tokenRetryMs/1000, err)
		klog.Warningf("regroup: job %s: %s", id, msg)
		p.opts.Events.Event(ssn, job.PodGroup, v1.EventTypeWarning, ReasonToken, msg)
		return
	}
	rec.tokenUID, rec.tokenFailedAt = uid, 0
	klog.Infof("regroup: job %s: its coordinator token is in Secret %s/%s", id, job.Namespace, secret)
}

// upsert gives the engine a new or changed spec and says what the validator found.
func (p *plugin) upsert(ssn *framework.Session, job *api.JobInfo, rec *jobRecord, v *jobView, spec []byte, first bool) {
	rt := p.rt
	report, err := rt.engine.UpsertJob(spec, p.nowMs)
	rec.spec = spec
	if parsed, perr := regroup.ParseValidationReport(report); perr == nil {
		for _, pr := range parsed.Problems {
			if pr.Severity == "warning" {
				p.opts.Events.Event(ssn, job.PodGroup, v1.EventTypeWarning, ReasonFallback, pr.Message)
			}
		}
	}
	if err != nil {
		rec.valid = false
		rec.invalid = validationMessage(err, report)
		klog.Warningf("regroup: job %s fails validation: %s", v.id, rec.invalid)
		p.opts.Events.Event(ssn, job.PodGroup, v1.EventTypeWarning, ReasonInvalid, rec.invalid)
		return
	}
	rec.valid, rec.invalid = true, ""
	if rec.pods != 0 && rec.pods != v.read.Pods {
		// A new shape is a new job to the engine: its pods are reported afresh.
		rec.seen, rec.lastNode = map[string]podSeen{}, map[int]string{}
	}
	rec.pods = v.read.Pods
	rec.pg = job.Namespace + "/" + job.Name
	if !first {
		return
	}
	// First sight in this process: a scheduler that restarted finds the job's state in its
	// PodGroup, deadlines included.
	state := job.PodGroup.Annotations[StateAnnotation]
	if state == "" {
		return
	}
	if err := rt.engine.ImportJobState(v.id, []byte(state)); err != nil {
		msg := fmt.Sprintf("the Regroup state saved in annotation %s could not be restored, so the "+
			"job starts from what the scheduler sees now: %v", StateAnnotation, err)
		klog.Warningf("regroup: job %s: %s", v.id, msg)
		p.opts.Events.Event(ssn, job.PodGroup, v1.EventTypeWarning, ReasonRestore, msg)
		return
	}
	rec.savedState = state
	if d, err := rt.engine.Decision(v.id); err == nil {
		rec.savedDirective = d.DirectiveID
	}
	klog.Infof("regroup: job %s: state restored from PodGroup %s", v.id, rec.pg)
}

// validationMessage is the engine's message: every error of the report, else the call's error.
func validationMessage(err error, report []byte) string {
	if parsed, perr := regroup.ParseValidationReport(report); perr == nil {
		msg := ""
		for _, pr := range parsed.Problems {
			if pr.Severity != "error" {
				continue
			}
			if msg != "" {
				msg += "; "
			}
			msg += pr.Message
		}
		if msg != "" {
			return msg
		}
	}
	var e *regroup.Error
	if errors.As(err, &e) && e.Message != "" {
		return e.Message
	}
	return err.Error()
}

// reportPods tells the engine each training pod's state that changed since the last session: an
// incarnation that ends first, then the one that replaces it; a pod that vanished is deleted.
func (p *plugin) reportPods(job *api.JobInfo, rec *jobRecord, v *jobView) {
	rt := p.rt
	present := map[string]bool{}
	indexes := make([]int, 0, len(v.pods))
	for i := range v.pods {
		indexes = append(indexes, i)
	}
	sort.Ints(indexes)
	for _, i := range indexes {
		tasks := append([]*api.TaskInfo(nil), v.pods[i]...)
		sort.SliceStable(tasks, func(a, b int) bool { return ending(tasks[a]) && !ending(tasks[b]) })
		for _, t := range tasks {
			uid := string(t.UID)
			if t.Pod != nil {
				uid = string(t.Pod.UID)
			}
			present[uid] = true
			phase, ok := podPhase(t)
			if !ok {
				continue
			}
			now := podSeen{index: i, phase: phase, node: t.NodeName}
			prev, known := rec.seen[uid]
			if known && prev == now {
				continue
			}
			if err := rt.engine.SetPodState(v.id, uint32(i), uid, regroup.PodPhase(phase), t.NodeName, p.nowMs); err != nil {
				klog.V(2).Infof("regroup: job %s pod %d (%s): %v", v.id, i, t.Name, err)
			}
			if !known {
				rec.uidsChanged = true
			}
			rec.seen[uid] = now
			if t.NodeName != "" {
				rec.lastNode[i] = t.NodeName
			}
		}
	}
	for uid, s := range rec.seen {
		if present[uid] {
			continue
		}
		if s.phase != phaseDeleted && s.phase != phaseFailed {
			if err := rt.engine.SetPodState(v.id, uint32(s.index), uid, regroup.PodDeleted, "", p.nowMs); err != nil {
				klog.V(2).Infof("regroup: job %s pod %d (uid %s) is gone: %v", v.id, s.index, uid, err)
			}
		}
		delete(rec.seen, uid)
		delete(rec.evicted, uid)
		rec.uidsChanged = true
	}
}

// applyDecisions reads each Regroup job's decision, saves changed states to the PodGroups, evicts
// what the engine says and prepares the hooks' answers. The state is saved before any eviction:
// a scheduler that restarts after evicting must find the decision that evicted (its deadline,
// the pods it fenced), so a job whose state cannot be saved is not evicted from in this session.
func (p *plugin) applyDecisions(ssn *framework.Session) {
	rt := p.rt
	for jid, sj := range p.jobs {
		if !sj.valid {
			continue
		}
		job := ssn.Jobs[jid]
		rec := rt.jobs[sj.id]
		d, err := rt.engine.Decision(sj.id)
		if err != nil {
			klog.Errorf("regroup: decision of job %s: %v", sj.id, err)
			sj.valid, sj.invalid = false, err.Error()
			continue
		}
		sj.decision = d
		// Before evicting, the saved state must be the one that names the pods as lost, even
		// when no directive followed yet (the report window).
		saved := p.saveState(ssn, job, rec, sj, d.Evictions > 0)
		pending := len(job.TaskStatusIndex[api.Pending]) > 0
		if d.Evictions > 0 || pending {
			detail, err := rt.engine.DecisionDetail(sj.id)
			if err != nil {
				klog.Errorf("regroup: decision of job %s: %v", sj.id, err)
			} else {
				for _, a := range detail.Scheduler.AvoidNodes {
					if a.UntilMs > p.nowMs {
						sj.avoid[a.Node] = true
					}
				}
				if saved {
					p.evict(ssn, job, rec, sj, detail.Scheduler.Evict)
				} else if len(detail.Scheduler.Evict) > 0 {
					klog.Warningf("regroup: job %s: %d pods are not evicted in this session: its "+
						"state could not be saved first (a later session tries again)",
						sj.id, len(detail.Scheduler.Evict))
				}
			}
		}
		if pending {
			p.score(job, rec, sj)
		}
		p.lowerMinAvailable(ssn, job, rec, sj)
	}
}

// minAvailableRetryMs: a lowering the job controller has not carried into the PodGroup yet is not
// asked for again for this long.
const minAvailableRetryMs = 30_000

// lowerMinAvailable: a job submitted as MindCluster has it, minAvailable every pod, starts whole
// (gang needs every pod, as it does for MindCluster). Once it runs, its Volcano Job's minAvailable
// is lowered to the elastic minimum, so that gang keeps the job Running when it scales in and
// binds a replacement as soon as one fits; Volcano's job controller carries the Job's
// minAvailable into the PodGroup's minMember (which the plugin cannot lower itself: the job
// controller would set it back).
func (p *plugin) lowerMinAvailable(ssn *framework.Session, job *api.JobInfo, rec *jobRecord, sj *sessionJob) {
	from := job.PodGroup.Spec.MinMember
	if sj.elastic <= 0 || from <= sj.elastic || from != sj.full {
		return
	}
	started := len(job.TaskStatusIndex[api.Running]) >= int(sj.full) || sj.decision.Phase != regroup.PhaseRunning
	if !started || (rec.loweredFrom == from && p.nowMs-rec.loweredAt < minAvailableRetryMs) {
		return
	}
	rec.loweredFrom, rec.loweredAt = from, p.nowMs
	namespace, name, _ := strings.Cut(sj.id, "/")
	if err := p.opts.Jobs.LowerMinAvailable(ssn, namespace, name, sj.elastic, from); err != nil {
		msg := fmt.Sprintf("minAvailable %d (every pod) could not be lowered to %d, the job's elastic "+
			"minimum, so it would stop when it scales in; tried again in %d s: %v",
			from, sj.elastic, minAvailableRetryMs/1000, err)
		klog.Errorf("regroup: job %s: %s", sj.id, msg)
		p.opts.Events.Event(ssn, job.PodGroup, v1.EventTypeWarning, ReasonMinAvailable, msg)
		return
	}
	msg := fmt.Sprintf("minAvailable lowered from %d (every pod) to %d, the job's elastic minimum, "+
		"now that the job runs, so that it keeps running when it scales in (the Job's annotation %s "+
		"keeps %d)", from, sj.elastic, SubmittedMinAvailableAnnotation, from)
	klog.Infof("regroup: job %s: %s", sj.id, msg)
	p.opts.Events.Event(ssn, job.PodGroup, v1.EventTypeNormal, ReasonMinAvailable, msg)
}

// evictionRetryMs: a pod the plugin evicted is not evicted again for this long (the eviction runs
// asynchronously; the pod shows as releasing in the next sessions).
const evictionRetryMs = 30_000

func (p *plugin) evict(ssn *framework.Session, job *api.JobInfo, rec *jobRecord, sj *sessionJob, evictions []regroup.Eviction) {
	for _, e := range evictions {
		var task *api.TaskInfo
		for _, t := range job.Tasks {
			if t.Pod != nil && string(t.Pod.UID) == e.UID {
				task = t
				break
			}
		}
		// A failed pod is deleted too: Volcano's job controller creates again only a pod that is
		// gone, never one that failed (restartPolicy Never: its agent exited with an error).
		failed := task != nil && task.Status == api.Failed
		if task == nil || (ending(task) && !failed) {
			continue
		}
		if at, ok := rec.evicted[e.UID]; ok && p.nowMs-at < evictionRetryMs {
			continue
		}
		why := p.unhealthy[e.Node]
		if why == "" {
			why = "lost"
		}
		reason := fmt.Sprintf("Regroup: pod %d of job %s is on node %s (%s); evicted as fault-scheduling=%s says",
			e.Pod, sj.id, e.Node, why, e.Mode)
		if failed {
			reason = fmt.Sprintf("Regroup: pod %d of job %s failed on node %s; deleted, so that the job "+
				"controller creates it again", e.Pod, sj.id, e.Node)
		}
		if err := p.opts.Evictor.Evict(ssn, task, e.Mode, reason); err != nil {
			klog.Errorf("regroup: evicting pod %s/%s: %v", task.Namespace, task.Name, err)
			continue
		}
		rec.evicted[e.UID] = p.nowMs
		klog.Infof("%s", reason)
		p.opts.Events.Event(ssn, job.PodGroup, v1.EventTypeNormal, ReasonEvict, reason)
	}
}

// score asks the engine, for each pending training pod, how it rates the nodes the job's pods ran
// or run on (every other node scores 0): the previous node, then a node of the same replica.
func (p *plugin) score(job *api.JobInfo, rec *jobRecord, sj *sessionJob) {
	nodeSet := map[string]bool{}
	for _, s := range rec.seen {
		if s.node != "" {
			nodeSet[s.node] = true
		}
	}
	for _, n := range rec.lastNode {
		nodeSet[n] = true
	}
	if len(nodeSet) == 0 {
		return
	}
	nodes := make([]string, 0, len(nodeSet))
	for n := range nodeSet {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	for _, t := range job.TaskStatusIndex[api.Pending] {
		if t.Pod == nil || sj.managers[t.UID] {
			continue
		}
		s, ok := rec.seen[string(t.Pod.UID)]
		if !ok {
			continue
		}
		scores, err := p.rt.engine.ScoreNodes(sj.id, uint32(s.index), nodes)
		if err != nil {
			klog.V(2).Infof("regroup: scoring nodes for job %s pod %d: %v", sj.id, s.index, err)
			continue
		}
		m := map[string]int32{}
		for i, sc := range scores {
			if sc > 0 {
				m[nodes[i]] = sc
			}
		}
		if len(m) > 0 {
			sj.scores[t.UID] = m
		}
	}
}

// saveState writes the job's state to its PodGroup when the directive or the pod incarnations
// changed, so that a restarted scheduler keeps deadlines and knows replacements from originals.
// With check, the state is exported and compared even then. It says whether the PodGroup holds
// the state now (written, or unchanged).
func (p *plugin) saveState(ssn *framework.Session, job *api.JobInfo, rec *jobRecord, sj *sessionJob, check bool) bool {
	// A manager's first lease waits for a stored state that names it the holder (SaveWanted).
	if !check && sj.decision.DirectiveID == rec.savedDirective && !rec.uidsChanged && rec.savedState != "" &&
		(p.rt.coordinator == nil || !p.rt.coordinator.SaveWanted(sj.id)) {
		return true
	}
	// With a coordinator, the state comes with the mark of the manager's facts it holds: once it
	// is stored, the coordinator acknowledges them (a restarted scheduler imports it, and the
	// manager sends what it lacks again).
	var state []byte
	var mark regroup.FactMark
	var err error
	if p.rt.coordinator != nil {
		state, mark, err = p.rt.coordinator.ExportJobState(sj.id)
	} else {
		state, err = p.rt.engine.ExportJobState(sj.id)
	}
	if err != nil {
		klog.Errorf("regroup: exporting the state of job %s: %v", sj.id, err)
		return false
	}
	saved := func() {
		if p.rt.coordinator != nil {
			if err := p.rt.coordinator.StateSaved(sj.id, mark); err != nil {
				klog.Errorf("regroup: job %s: %v", sj.id, err)
			}
		}
	}
	if string(state) == rec.savedState {
		rec.savedDirective, rec.uidsChanged = sj.decision.DirectiveID, false
		saved()
		return true
	}
	annotations := map[string]string{StateAnnotation: string(state), PhaseAnnotation: sj.decision.Phase.String()}
	if err := p.opts.States.SaveState(ssn, job.PodGroup, annotations); err != nil {
		klog.Errorf("regroup: job %s: %v", sj.id, err)
		return false
	}
	// The session's copy too, so that the scheduler's own PodGroup update carries it.
	if job.PodGroup.Annotations == nil {
		job.PodGroup.Annotations = map[string]string{}
	}
	for k, v := range annotations {
		job.PodGroup.Annotations[k] = v
	}
	rec.savedState, rec.savedDirective, rec.uidsChanged = string(state), sj.decision.DirectiveID, false
	saved()
	return true
}

// --- hooks ---------------------------------------------------------------------------------------

func (p *plugin) validate(obj interface{}) *api.ValidateResult {
	job, ok := obj.(*api.JobInfo)
	if !ok || job.PodGroup == nil {
		return nil
	}
	if p.rtErr != nil {
		// Whether the job is Regroup's is the library's rule. When the library cannot answer
		// (its ABI does not match), the job is refused: running a Regroup job as a plain gang job
		// would ignore its keys.
		if ours, err := regroup.JobHasKeys(job.PodGroup.Labels, job.PodGroup.Annotations); ours || err != nil {
			return &api.ValidateResult{Pass: false, Reason: ReasonInvalid, Message: p.rtErr.Error()}
		}
		return nil
	}
	sj := p.jobs[job.UID]
	if sj == nil || sj.valid {
		return nil
	}
	return &api.ValidateResult{Pass: false, Reason: ReasonInvalid, Message: sj.invalid}
}

func (p *plugin) jobReady(obj interface{}) bool {
	job, ok := obj.(*api.JobInfo)
	if !ok {
		return true
	}
	sj := p.jobs[job.UID]
	if sj == nil || !sj.valid {
		return true
	}
	return job.ReadyTaskNum() >= sj.need()
}

func (p *plugin) jobPipelined(obj interface{}) int {
	job, ok := obj.(*api.JobInfo)
	if !ok {
		return util.Abstain
	}
	sj := p.jobs[job.UID]
	if sj == nil || !sj.valid {
		return util.Abstain
	}
	if job.ReadyTaskNum()+job.WaitingTaskNum() >= sj.need() {
		return util.Permit
	}
	return util.Reject
}

// jobStarving: a Regroup job that wants pods (a replacement, or a scale-out back to full size)
// is starving until it holds them all; otherwise until it holds its gang minimum. A job without
// Regroup keys is starving as gang says (so that this plugin may stand in for gang's starving).
func (p *plugin) jobStarving(obj interface{}) bool {
	job, ok := obj.(*api.JobInfo)
	if !ok {
		return false
	}
	sj := p.jobs[job.UID]
	if sj == nil {
		return job.IsStarving()
	}
	if !sj.valid || terminal(sj.decision.Phase) {
		return false
	}
	need := sj.need()
	if sj.decision.WantsPods {
		need = sj.full
	}
	return job.ReadyTaskNum()+job.WaitingTaskNum() < need
}

func terminal(ph regroup.Phase) bool {
	return ph == regroup.PhaseExiting || ph == regroup.PhaseDumping || ph == regroup.PhaseFailed
}

func (p *plugin) predicate(task *api.TaskInfo, node *api.NodeInfo) error {
	sj := p.jobs[task.Job]
	if sj == nil || !sj.valid {
		return nil
	}
	if why, bad := p.unhealthy[node.Name]; bad {
		return api.NewFitErrWithStatus(task, node, &api.Status{Code: api.UnschedulableAndUnresolvable, Plugin: PluginName,
			Reason: fmt.Sprintf("node %s is not healthy (%s); Regroup keeps job %s off it", node.Name, why, sj.id)})
	}
	if why, pre := p.avoidNew[node.Name]; pre {
		return api.NewFitErrWithStatus(task, node, &api.Status{Code: api.UnschedulableAndUnresolvable, Plugin: PluginName,
			Reason: fmt.Sprintf("node %s is pre-separated (%s); Regroup places no new pod of job %s there", node.Name, why, sj.id)})
	}
	if sj.avoid[node.Name] {
		return api.NewFitErrWithStatus(task, node, &api.Status{Code: api.UnschedulableAndUnresolvable, Plugin: PluginName,
			Reason: fmt.Sprintf("job %s avoids node %s for a while: a pod of it was lost there", sj.id, node.Name)})
	}
	return nil
}

func (p *plugin) nodeOrder(task *api.TaskInfo, node *api.NodeInfo) (float64, error) {
	sj := p.jobs[task.Job]
	if sj == nil {
		return 0, nil
	}
	return float64(sj.scores[task.UID][node.Name]) * p.cfg.weight, nil
}

// evictable keeps every Regroup job at its gang minimum: a victim is allowed while the job
// holds more ready pods than it needs, never its manager. Pods of other jobs are left to the
// other plugins.
func (p *plugin) evictable(preemptor *api.TaskInfo, preemptees []*api.TaskInfo) ([]*api.TaskInfo, int) {
	return p.filterVictims(preemptees), util.Permit
}

func (p *plugin) filterVictims(candidates []*api.TaskInfo) []*api.TaskInfo {
	var victims []*api.TaskInfo
	held := map[api.JobID]int32{}
	for _, t := range candidates {
		sj := p.jobs[t.Job]
		if sj == nil {
			victims = append(victims, t)
			continue
		}
		if !sj.valid || sj.managers[t.UID] {
			continue
		}
		n, ok := held[t.Job]
		if !ok {
			job := p.ssn.Jobs[t.Job]
			if job == nil {
				continue
			}
			n = job.ReadyTaskNum()
		}
		if n > sj.need() {
			held[t.Job] = n - 1
			victims = append(victims, t)
		} else {
			held[t.Job] = n
		}
	}
	return victims
}
