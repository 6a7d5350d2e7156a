// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

// report writes the pod's status to the API when it changed since the last write, retrying a
// conflict on a fresh read. It returns the status and whether the API has it.
func (w *podWorker) report(ctx context.Context) (v1.PodStatus, bool) {
	base := w.statusTarget()
	if base == nil {
		// A static pod whose mirror pod does not exist (yet): nothing to report to.
		return w.status(v1.PodStatus{}), true
	}
	st := w.status(base.Status)
	if w.reported != nil && apiequality.Semantic.DeepEqual(*w.reported, st) {
		return st, true
	}
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	pods := w.k.client.CoreV1().Pods(base.Namespace)
	for attempt := 1; ; attempt++ {
		pod := base.DeepCopy()
		pod.Status = st
		_, err := pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{})
		if err == nil {
			if w.reported == nil || w.reported.Phase != st.Phase {
				klog.InfoS("Pod status", "pod", w.ref, "phase", st.Phase)
			}
			w.reported = &st
			return st, true
		}
		if !apierrors.IsConflict(err) || attempt == 4 {
			if !apierrors.IsNotFound(err) {
				klog.ErrorS(err, "Updating the pod's status failed; retrying", "pod", w.ref)
			}
			return st, false
		}
		fresh, err := pods.Get(ctx, base.Name, metav1.GetOptions{})
		if err != nil {
			klog.ErrorS(err, "Reading the pod after a status conflict failed; retrying", "pod", w.ref)
			return st, false
		}
		if !w.isStatusTarget(fresh) {
			return st, false
		}
		base, st = fresh, w.status(fresh.Status)
	}
}

// statusTarget is the API object the pod's status goes to: the pod itself, or a static pod's
// mirror pod; nil if there is none.
func (w *podWorker) statusTarget() *v1.Pod {
	w.mu.Lock()
	pod := w.pod
	w.mu.Unlock()
	if !w.static {
		return pod
	}
	mirror, err := w.k.pods.Pods(pod.Namespace).Get(pod.Name)
	if err != nil || !w.isStatusTarget(mirror) {
		return nil
	}
	return mirror
}

func (w *podWorker) isStatusTarget(p *v1.Pod) bool {
	if w.static {
		return isMirrorPod(p) && p.Annotations[v1.MirrorPodAnnotationKey] == string(w.uid)
	}
	return p.UID == w.uid
}

// status is the pod's status as this kubelet sees it, over base: what other components own in
// it (other conditions, nominatedNodeName, qosClass, ...) is kept.
func (w *podWorker) status(base v1.PodStatus) v1.PodStatus {
	st := *base.DeepCopy()
	ip := w.k.cfg.NodeIP
	st.Phase = w.phase()
	st.HostIP, st.PodIP = ip, ip
	st.HostIPs, st.PodIPs = []v1.HostIP{{IP: ip}}, []v1.PodIP{{IP: ip}}
	st.StartTime = &w.startTime
	st.Reason, st.Message = "", ""
	if w.fatal != "" {
		st.Reason, st.Message = "PodSpecError", w.fatal
	}
	st.InitContainerStatuses = w.containerStatuses(w.initCtrs)
	st.ContainerStatuses = w.containerStatuses(w.ctrs)

	var uninitialized, unready []string
	for _, c := range w.initCtrs[min(w.nextInit, len(w.initCtrs)):] {
		uninitialized = append(uninitialized, c.spec.Name)
	}
	for _, c := range w.ctrs {
		if !w.ready(c) {
			unready = append(unready, c.spec.Name)
		}
	}
	gatesOpen := true
	for _, gate := range w.spec.ReadinessGates {
		gatesOpen = gatesOpen && hasCondition(base.Conditions, gate.ConditionType, v1.ConditionTrue)
	}
	initReason, initMsg := "ContainersNotInitialized", fmt.Sprintf("containers with incomplete status: [%s]", strings.Join(uninitialized, " "))
	readyReason, readyMsg := "ContainersNotReady", fmt.Sprintf("containers with unready status: [%s]", strings.Join(unready, " "))
	if isTerminal(st.Phase) {
		readyReason, readyMsg = "PodCompleted", ""
	}
	podReason, podMsg := readyReason, readyMsg
	if len(unready) == 0 && !gatesOpen {
		podReason, podMsg = "ReadinessGatesNotReady", "the status of pod readiness gates is not true"
	}
	owned := []v1.PodCondition{
		w.condition(v1.PodInitialized, len(uninitialized) == 0, initReason, initMsg),
		w.condition(v1.ContainersReady, len(unready) == 0, readyReason, readyMsg),
		w.condition(v1.PodReady, len(unready) == 0 && gatesOpen, podReason, podMsg),
	}
	if !hasCondition(base.Conditions, v1.PodScheduled, "") {
		owned = append([]v1.PodCondition{w.condition(v1.PodScheduled, true, "", "")}, owned...)
	}
	for _, c := range owned {
		replaced := false
		for i := range st.Conditions {
			if st.Conditions[i].Type == c.Type {
				st.Conditions[i], replaced = c, true
			}
		}
		if !replaced {
			st.Conditions = append(st.Conditions, c)
		}
	}
	return st
}

// condition is a pod condition that keeps its transition time while its status holds.
func (w *podWorker) condition(typ v1.PodConditionType, ok bool, reason, message string) v1.PodCondition {
	status := v1.ConditionFalse
	if ok {
		status, reason, message = v1.ConditionTrue, "", ""
	}
	c := v1.PodCondition{Type: typ, Status: status, Reason: reason, Message: message, LastTransitionTime: metav1.Now()}
	if prev, seen := w.conditions[typ]; seen && prev.Status == status {
		c.LastTransitionTime = prev.LastTransitionTime
	}
	w.conditions[typ] = c
	return c
}

func hasCondition(conds []v1.PodCondition, typ v1.PodConditionType, status v1.ConditionStatus) bool {
	for _, c := range conds {
		if c.Type == typ && (status == "" || c.Status == status) {
			return true
		}
	}
	return false
}

// ready: running, and past its readiness probe if it has one.
func (w *podWorker) ready(c *container) bool {
	return c.proc != nil && !c.init && (c.spec.ReadinessProbe == nil || c.probe != nil && c.probe.Load())
}

func (w *podWorker) containerStatuses(ctrs []*container) []v1.ContainerStatus {
	out := make([]v1.ContainerStatus, 0, len(ctrs))
	for _, c := range ctrs {
		s := v1.ContainerStatus{
			Name:                 c.spec.Name,
			Image:                c.spec.Image,
			ContainerID:          c.containerID,
			State:                c.state,
			LastTerminationState: c.last,
			RestartCount:         c.restarts,
			Ready:                w.ready(c),
			Started:              ptr.To(c.proc != nil),
		}
		if c.ran {
			s.ImageID = "regroup-process://" + c.spec.Image
		}
		switch {
		case w.fatal != "" && s.State.Terminated == nil:
			s.State = v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 128,
				Reason: "ContainerCannotRun", Message: w.fatal, StartedAt: w.startTime, FinishedAt: w.startTime}}
		case s.State.Running == nil && s.State.Terminated == nil && s.State.Waiting == nil:
			s.State = w.notStarted(c)
		}
		out = append(out, s)
	}
	return out
}

// notStarted is the waiting state of a container that was never tried.
func (w *podWorker) notStarted(c *container) v1.ContainerState {
	switch {
	case w.configError != "":
		return waiting("CreateContainerConfigError", w.configError)
	case c.init || w.nextInit < len(w.initCtrs):
		return waiting("PodInitializing", "")
	}
	return waiting("ContainerCreating", "")
}

// phase follows the kubelet's getPhase, with this kubelet's knowledge of what will restart:
// Pending until initialized and every container has been started, Running while any runs or
// will restart, then Succeeded if every container exited 0, else Failed.
func (w *podWorker) phase() v1.PodPhase {
	if w.fatal != "" || w.initFailed {
		return v1.PodFailed
	}
	if w.nextInit < len(w.initCtrs) {
		return v1.PodPending
	}
	var waiting, active, succeeded int
	for _, c := range w.ctrs {
		switch {
		case c.proc != nil, c.last.Terminated != nil && c.state.Terminated == nil:
			active++ // running, or waiting to restart
		case c.state.Terminated != nil:
			if c.state.Terminated.ExitCode == 0 {
				succeeded++
			}
		default:
			waiting++
		}
	}
	switch {
	case waiting > 0:
		return v1.PodPending
	case active > 0:
		return v1.PodRunning
	case succeeded == len(w.ctrs):
		return v1.PodSucceeded
	}
	return v1.PodFailed
}
