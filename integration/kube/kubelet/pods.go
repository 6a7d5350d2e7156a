// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/third_party/forked/golang/expansion"
)

const (
	minBackoff = time.Second      // first wait before restarting a container
	maxBackoff = 10 * time.Second // the wait doubles up to this
	// killWait bounds the wait for processes to die after SIGKILL.
	killWait = 5 * time.Second
	// defaultGrace is a pod's termination grace period when it sets none.
	defaultGrace = 30 * time.Second
	// serviceAccountDir is where in-cluster clients look for the service account's token.
	serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"
)

// podWorker runs one pod (one UID) from start to end on its own goroutine.
type podWorker struct {
	k      *Kubelet
	uid    types.UID
	static bool   // a --static-pod: runs from its manifest, reports on its mirror pod
	dir    string // the pod directory
	ref    klog.ObjectRef
	spec   v1.PodSpec // immutable in what this kubelet reads
	policy v1.RestartPolicy
	wake   chan struct{}

	mu        sync.Mutex
	pod       *v1.Pod // the latest version (from the API; the manifest for a static pod)
	removed   bool    // the pod left the API while running: kill at once
	hostsOn   bool    // the hosts file exists and is kept up to date
	hostsText string  // what the hosts file holds

	// Owned by the worker's goroutine.
	initCtrs, ctrs []*container
	nextInit       int    // init containers before this one have succeeded
	initFailed     bool   // an init container failed and will not be restarted
	prepared       bool   // the volumes are in place
	configError    string // why the volumes are not in place yet (retried)
	fatal          string // a spec error: the pod fails
	startTime      metav1.Time
	conditions     map[v1.PodConditionType]v1.PodCondition
	reported       *v1.PodStatus // the status last written to the API
	terminating    bool
	termStart      time.Time
	tokenRefresh   time.Time
	cleanedUp      bool
}

// container is the state of one container of the pod across its restarts.
type container struct {
	spec        v1.Container
	init        bool
	proc        *process // nil when not running
	env         []string // the environment of the current run (for exec probes)
	state       v1.ContainerState
	last        v1.ContainerState
	restarts    int32
	ran         bool // started at least once: the next start is a restart
	containerID string
	probe       *atomic.Bool // the current run's readiness probe result
	probeStop   context.CancelFunc
	backoff     time.Duration
	restartAt   time.Time
}

func newPodWorker(k *Kubelet, pod *v1.Pod, static bool) *podWorker {
	w := &podWorker{
		k: k, uid: pod.UID, static: static, dir: k.podDir(pod), pod: pod,
		ref: klog.KObj(pod), spec: pod.Spec, policy: pod.Spec.RestartPolicy,
		wake:       make(chan struct{}, 1),
		startTime:  metav1.Now(),
		conditions: map[v1.PodConditionType]v1.PodCondition{},
	}
	for _, c := range pod.Spec.InitContainers {
		w.initCtrs = append(w.initCtrs, &container{spec: c, init: true})
	}
	for _, c := range pod.Spec.Containers {
		w.ctrs = append(w.ctrs, &container{spec: c})
	}
	if !static {
		w.adopt(pod.Status)
	}
	return w
}

// adopt takes over the status a previous life of this kubelet reported (the node was killed and
// restarted): restart counts, start time, condition times; containers that had run count as
// exited, with a running one's exit unknown (code 137, as the kubelet reports a vanished
// container), and follow the restart policy from there.
func (w *podWorker) adopt(st v1.PodStatus) {
	if st.StartTime != nil {
		w.startTime = *st.StartTime
	}
	for _, c := range st.Conditions {
		w.conditions[c.Type] = c
	}
	for _, group := range []struct {
		ctrs     []*container
		statuses []v1.ContainerStatus
	}{{w.initCtrs, st.InitContainerStatuses}, {w.ctrs, st.ContainerStatuses}} {
		for _, c := range group.ctrs {
			for _, prev := range group.statuses {
				if prev.Name != c.spec.Name {
					continue
				}
				c.restarts, c.last = prev.RestartCount, prev.LastTerminationState
				term := prev.State.Terminated
				if prev.State.Running != nil {
					term = &v1.ContainerStateTerminated{ExitCode: 137, Reason: "ContainerStatusUnknown",
						Message:   "The container could not be located when the kubelet restarted",
						StartedAt: prev.State.Running.StartedAt, FinishedAt: metav1.Now(), ContainerID: prev.ContainerID}
				}
				if term == nil {
					term = c.last.Terminated // it was waiting to be restarted
				}
				if term != nil {
					c.ran, c.containerID = true, prev.ContainerID
					w.exited(c, term)
				}
			}
		}
	}
	for w.nextInit < len(w.initCtrs) && exitedOK(w.initCtrs[w.nextInit]) {
		w.nextInit++
	}
	if n := len(w.initCtrs); w.nextInit < n && w.initCtrs[w.nextInit].state.Terminated != nil {
		w.initFailed = true
	}
}

func exitedOK(c *container) bool {
	return c.state.Terminated != nil && c.state.Terminated.ExitCode == 0
}

// update hands the worker the pod's latest version.
func (w *podWorker) update(pod *v1.Pod) {
	w.mu.Lock()
	w.pod = pod
	w.mu.Unlock()
	w.poke()
}

// remove tells the worker its pod is gone from the API (a forced deletion): kill everything now.
func (w *podWorker) remove() {
	w.mu.Lock()
	w.removed = true
	w.mu.Unlock()
	w.poke()
}

func (w *podWorker) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *podWorker) run(ctx context.Context) {
	ticker := time.NewTicker(w.k.cfg.Sync)
	defer ticker.Stop()
	for {
		if ctx.Err() != nil {
			w.stop()
			return
		}
		if w.step(ctx) {
			return
		}
		select {
		case <-ctx.Done():
		case <-w.wake:
		case <-ticker.C:
		}
	}
}

// step moves the pod forward as far as it can now; it returns true when the pod is done here.
func (w *podWorker) step(ctx context.Context) bool {
	w.mu.Lock()
	pod, removed := w.pod, w.removed
	w.mu.Unlock()
	w.reap()
	switch {
	case removed:
		klog.InfoS("Pod removed from the API; killing its processes", "pod", klog.KObj(pod), "uid", w.uid)
		w.killAll()
		w.cleanup()
		return true
	case pod.DeletionTimestamp != nil && !w.static:
		return w.terminate(ctx, pod)
	}
	if w.fatal == "" && !w.prepared {
		w.prepare(ctx, pod)
	}
	if w.fatal == "" && w.prepared {
		w.refreshTokens(ctx, pod)
		w.advance(ctx, pod)
	}
	if w.fatal != "" {
		w.killAll()
	}
	st, reported := w.report(ctx)
	if isTerminal(st.Phase) && reported {
		klog.InfoS("Pod finished", "pod", klog.KObj(pod), "uid", w.uid, "phase", st.Phase)
		w.cleanup()
		return true
	}
	return false
}

// prepare checks what can be checked of the spec once, writes the hosts file and the volumes.
func (w *podWorker) prepare(ctx context.Context, pod *v1.Pod) {
	for _, c := range pod.Spec.InitContainers {
		if c.RestartPolicy != nil {
			w.fail(fmt.Sprintf("init container %q has a restartPolicy (a sidecar), which regroup-kubelet does not support", c.Name))
			return
		}
	}
	if err := os.MkdirAll(w.dir, 0o755); err != nil {
		w.configError = fmt.Sprintf("creating the pod directory: %v", err)
		return
	}
	w.mu.Lock()
	w.hostsOn = true
	w.mu.Unlock()
	if all, err := w.k.pods.List(labels.Everything()); err == nil {
		if services, err := w.k.services.List(labels.Everything()); err == nil {
			w.refreshHosts(all, services)
		}
	}
	refresh, err := w.k.materializeVolumes(ctx, pod, w.dir)
	var se *specError
	switch {
	case errors.As(err, &se):
		w.fail(err.Error())
	case err != nil:
		if msg := err.Error(); msg != w.configError {
			klog.ErrorS(err, "The pod's volumes are not ready; retrying", "pod", klog.KObj(pod))
			w.configError = msg
		}
	default:
		w.configError, w.prepared, w.tokenRefresh = "", true, refresh
	}
}

// refreshTokens rewrites the volumes when a service account token in them is due for renewal.
func (w *podWorker) refreshTokens(ctx context.Context, pod *v1.Pod) {
	if w.tokenRefresh.IsZero() || time.Now().Before(w.tokenRefresh) {
		return
	}
	refresh, err := w.k.materializeVolumes(ctx, pod, w.dir)
	if err != nil {
		klog.ErrorS(err, "Renewing the pod's service account token failed; retrying", "pod", klog.KObj(pod))
		refresh = time.Now().Add(10 * time.Second)
	}
	w.tokenRefresh = refresh
}

// advance runs the init containers one by one, then every container, restarting per policy.
func (w *podWorker) advance(ctx context.Context, pod *v1.Pod) {
	now := time.Now()
	for w.nextInit < len(w.initCtrs) {
		c := w.initCtrs[w.nextInit]
		switch {
		case c.proc != nil, now.Before(c.restartAt):
			return
		case exitedOK(c):
			w.nextInit++
			continue
		case c.state.Terminated != nil:
			w.initFailed = true // failed, and the policy says no restart
			return
		}
		w.start(ctx, pod, c)
		return
	}
	for _, c := range w.ctrs {
		if c.proc == nil && c.state.Terminated == nil && !now.Before(c.restartAt) {
			if w.start(ctx, pod, c); w.fatal != "" {
				return
			}
		}
	}
}

// start starts (or restarts) a container; what keeps it from starting goes into its state.
func (w *podWorker) start(ctx context.Context, pod *v1.Pod, c *container) {
	img, err := w.k.image(c.spec.Image)
	if err != nil {
		c.state = waiting("ErrImagePull", err.Error())
		return
	}
	env, vars, err := w.k.containerEnv(ctx, pod, &c.spec, img, newObjectCache(w.k, pod.Namespace))
	var argv []string
	var mounts []mount
	if err == nil {
		argv, err = expandCommand(&c.spec, img, c.spec.Image, vars)
	}
	if err == nil {
		mounts, err = w.mounts(pod, &c.spec, vars)
	}
	var se *specError
	if errors.As(err, &se) {
		w.fail(err.Error())
		return
	}
	if err != nil {
		if c.state.Waiting == nil || c.state.Waiting.Message != err.Error() {
			klog.ErrorS(err, "Container cannot start yet; retrying", "pod", klog.KObj(pod), "container", c.spec.Name)
		}
		c.state = waiting("CreateContainerConfigError", err.Error())
		return
	}
	// The working directory: the image entry's (where the image's files are on this machine),
	// else the container's, else the pod directory.
	dir := img.WorkingDir
	if dir == "" {
		dir = c.spec.WorkingDir
	}
	if dir == "" {
		dir = w.dir
	}
	isolated := os.Geteuid() == 0
	if !isolated {
		w.withoutMounts(c, mounts, env)
	}
	spec := &initSpec{Argv: argv, Env: env.strings(), Dir: dir, Mounts: mounts, Isolated: isolated, Hostname: podHostname(pod)}
	if c.ran {
		c.restarts++
	}
	c.ran = true
	c.env = spec.Env
	now := metav1.Now()
	proc, err := startProcess(spec, filepath.Join(w.dir, c.spec.Name+".init.json"), w.logPath(c), w.poke)
	if err != nil {
		// As a runtime's StartError: the container ran, and failed at once.
		klog.ErrorS(err, "Container failed to start", "pod", klog.KObj(pod), "container", c.spec.Name)
		w.exited(c, &v1.ContainerStateTerminated{ExitCode: 128, Reason: "StartError", Message: err.Error(), StartedAt: now, FinishedAt: now})
		return
	}
	c.proc = proc
	c.containerID = fmt.Sprintf("process://%d", proc.pid)
	c.state = v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: metav1.NewTime(proc.startedAt)}}
	klog.InfoS("Container started", "pod", klog.KObj(pod), "container", c.spec.Name, "pid", proc.pid, "restarts", c.restarts)
	if !c.init {
		w.startProbe(c)
	}
}

// withoutMounts is the fallback of a kubelet that is not root and so cannot give a container a
// mount namespace: the volumes stay in the pod directory, and the container is told where the
// service account's volume is through REGROUP_SERVICEACCOUNT_DIR (python/regroup/kube.py reads it).
func (w *podWorker) withoutMounts(c *container, mounts []mount, env *envList) {
	var skipped []string
	for _, m := range mounts {
		if m.Target == "/etc/hosts" {
			continue
		}
		skipped = append(skipped, m.Target)
		if _, set := env.values["REGROUP_SERVICEACCOUNT_DIR"]; m.Target == serviceAccountDir && !set {
			env.set("REGROUP_SERVICEACCOUNT_DIR", m.Source)
		}
	}
	if len(skipped) > 0 && !c.ran {
		klog.InfoS("Not root: the container runs without a mount namespace; its volumes are not mounted", "pod", w.ref, "container", c.spec.Name, "mountPaths", skipped)
	}
}

func (w *podWorker) logPath(c *container) string { return filepath.Join(w.dir, c.spec.Name+".log") }

func waiting(reason, message string) v1.ContainerState {
	return v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: reason, Message: message}}
}

// mounts is the container's bind mounts: its volume mounts (or subPaths of them) and, unless it
// mounts its own, the pod's hosts file on /etc/hosts; parents before children.
func (w *podWorker) mounts(pod *v1.Pod, c *v1.Container, vars map[string]string) ([]mount, error) {
	var out []mount
	hosts := true
	for _, vm := range c.VolumeMounts {
		src, vol, ok := w.k.volumeSource(pod, w.dir, vm.Name)
		if !ok {
			return nil, specErrorf("container %q mounts volume %q, which the pod does not define", c.Name, vm.Name)
		}
		if !filepath.IsAbs(vm.MountPath) {
			return nil, specErrorf("container %q: mountPath %q is not absolute", c.Name, vm.MountPath)
		}
		sub := vm.SubPath
		if vm.SubPathExpr != "" {
			sub = expansion.Expand(vm.SubPathExpr, expansion.MappingFuncFor(vars))
		}
		if sub != "" {
			if err := checkRelative(sub); err != nil {
				return nil, specErrorf("container %q: subPath %q %v", c.Name, sub, err)
			}
			src = filepath.Join(src, sub)
			if _, err := os.Stat(src); os.IsNotExist(err) {
				// The kubelet creates a missing subPath as a directory.
				if err := os.MkdirAll(src, 0o755); err != nil {
					return nil, fmt.Errorf("creating subPath %s: %w", src, err)
				}
			}
		}
		// As in Kubernetes, these volumes are always mounted read-only.
		ro := vm.ReadOnly || vol.Secret != nil || vol.ConfigMap != nil || vol.DownwardAPI != nil || vol.Projected != nil
		target := filepath.Clean(vm.MountPath)
		out = append(out, mount{Source: src, Target: target, ReadOnly: ro})
		hosts = hosts && target != "/etc/hosts"
	}
	if hosts {
		out = append(out, mount{Source: w.hostsPath(), Target: "/etc/hosts"})
	}
	sort.SliceStable(out, func(i, j int) bool { return strings.Count(out[i].Target, "/") < strings.Count(out[j].Target, "/") })
	return out, nil
}

func (w *podWorker) hostsPath() string { return filepath.Join(w.dir, "etc-hosts") }

// reap records the exits of processes that have ended.
func (w *podWorker) reap() {
	for _, c := range w.all() {
		if c.proc == nil || !c.proc.exited() {
			continue
		}
		p := c.proc
		reason := "Completed"
		if p.exitCode != 0 {
			reason = "Error"
		}
		klog.InfoS("Container exited", "pod", w.ref, "container", c.spec.Name, "exitCode", p.exitCode)
		w.exited(c, &v1.ContainerStateTerminated{ExitCode: p.exitCode, Reason: reason,
			StartedAt: metav1.NewTime(p.startedAt), FinishedAt: metav1.NewTime(p.finishedAt), ContainerID: c.containerID})
	}
}

// exited records a container's end and, if its restart policy says so, when it restarts.
func (w *podWorker) exited(c *container, term *v1.ContainerStateTerminated) {
	c.proc = nil
	if c.probeStop != nil {
		c.probeStop()
		c.probeStop = nil
	}
	if w.terminating || !w.shouldRestart(c, term.ExitCode) {
		c.state = v1.ContainerState{Terminated: term}
		return
	}
	// Back off 1 s, doubling to 10 s; a container that ran a while starts over at 1 s.
	if c.backoff == 0 || term.FinishedAt.Sub(term.StartedAt.Time) >= 2*maxBackoff {
		c.backoff = minBackoff
	} else {
		c.backoff = min(2*c.backoff, maxBackoff)
	}
	c.restartAt = time.Now().Add(c.backoff)
	time.AfterFunc(c.backoff, w.poke)
	c.last = v1.ContainerState{Terminated: term}
	c.state = waiting("CrashLoopBackOff", fmt.Sprintf("back-off %v restarting failed container=%s pod=%s_%s(%s)",
		c.backoff, c.spec.Name, w.ref.Name, w.ref.Namespace, w.uid))
}

// shouldRestart applies the pod's restartPolicy; init containers restart only on failure.
func (w *podWorker) shouldRestart(c *container, code int32) bool {
	switch w.policy {
	case v1.RestartPolicyNever:
		return false
	case v1.RestartPolicyOnFailure:
		return code != 0
	}
	return !c.init || code != 0 // Always, the default
}

// fail marks the pod failed for a reason in its spec.
func (w *podWorker) fail(msg string) {
	if w.fatal == "" {
		klog.ErrorS(nil, "Pod cannot run", "pod", w.ref, "reason", msg)
		w.fatal = msg
	}
}

// terminate carries out a graceful deletion: SIGTERM, SIGKILL after the grace period, then
// deleting the pod object with grace period 0 (the kubelet's last word in a graceful deletion).
func (w *podWorker) terminate(ctx context.Context, pod *v1.Pod) bool {
	if !w.terminating {
		w.terminating, w.termStart = true, time.Now()
		klog.InfoS("Pod deleted; stopping its containers", "pod", klog.KObj(pod), "grace", gracePeriod(pod, true))
		for _, c := range w.all() {
			if c.proc != nil {
				c.proc.signal(syscall.SIGTERM)
			}
		}
		time.AfterFunc(gracePeriod(pod, true), w.poke)
	}
	// The grace period is read each time: a second deletion may shorten it.
	if killAt := w.termStart.Add(gracePeriod(pod, true)); w.running() && time.Now().Before(killAt) {
		return false
	}
	w.killAll()
	w.cleanup()
	return w.k.finishDeletion(ctx, pod)
}

// stop is the kubelet's own shutdown: the pod's processes end (SIGTERM, then SIGKILL after its
// terminationGracePeriodSeconds) and nothing is reported.
func (w *podWorker) stop() {
	w.mu.Lock()
	grace := gracePeriod(w.pod, false)
	w.mu.Unlock()
	waitAll(w.signalAll(syscall.SIGTERM), time.Now().Add(grace))
	w.killAll()
	w.cleanup()
}

// killAll SIGKILLs every running container and waits (bounded) for them to die.
func (w *podWorker) killAll() {
	waitAll(w.signalAll(syscall.SIGKILL), time.Now().Add(killWait))
	w.reap()
}

// signalAll sends sig to every running container; it returns their processes.
func (w *podWorker) signalAll(sig syscall.Signal) []*process {
	var procs []*process
	for _, c := range w.all() {
		if c.proc != nil {
			c.proc.signal(sig)
			procs = append(procs, c.proc)
		}
	}
	return procs
}

// cleanup removes the mount points containers had to create that nothing uses any more; the
// pod's logs and volumes stay.
func (w *podWorker) cleanup() {
	if w.cleanedUp {
		return
	}
	w.cleanedUp = true
	for _, c := range w.all() {
		if c.probeStop != nil {
			c.probeStop()
		}
	}
	w.mu.Lock()
	w.hostsOn = false
	w.mu.Unlock()
	removeCreatedMountPoints()
}

func (w *podWorker) running() bool {
	for _, c := range w.all() {
		if c.proc != nil {
			return true
		}
	}
	return false
}

func (w *podWorker) all() []*container {
	return append(append([]*container{}, w.initCtrs...), w.ctrs...)
}

// gracePeriod is the pod's deletionGracePeriodSeconds when deleting, else its
// terminationGracePeriodSeconds, else 30 s.
func gracePeriod(pod *v1.Pod, deleting bool) time.Duration {
	switch {
	case deleting && pod.DeletionGracePeriodSeconds != nil:
		return time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
	case pod.Spec.TerminationGracePeriodSeconds != nil:
		return time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	return defaultGrace
}

// refreshHosts rewrites the pod's hosts file if its content changed.
func (w *podWorker) refreshHosts(pods []*v1.Pod, services []*v1.Service) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.hostsOn {
		return
	}
	text := hostsFile(w.pod, w.k.cfg.NodeIP, pods, services)
	if text == w.hostsText {
		return
	}
	if err := writeHostsFile(w.hostsPath(), text); err != nil {
		klog.ErrorS(err, "Writing the pod's hosts file failed; retrying", "pod", w.ref)
		return
	}
	w.hostsText = text
}

// image is how the image runs here, from the --images file.
func (k *Kubelet) image(ref string) (Image, error) {
	if img, ok := k.cfg.Images[ref]; ok {
		return img, nil
	}
	if img, ok := k.cfg.Images["*"]; ok {
		return img, nil
	}
	if k.cfg.ImagesFile == "" {
		return Image{}, fmt.Errorf("image %q cannot run here: regroup-kubelet was given no --images file", ref)
	}
	return Image{}, fmt.Errorf("image %q has no entry (and there is no \"*\" entry) in the --images file %s", ref, k.cfg.ImagesFile)
}
