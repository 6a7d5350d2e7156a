// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

const (
	kubeletVersion    = "v1.34.1-regroup"
	leaseNamespace    = "kube-node-lease"
	leaseDurationSecs = 40
)

// registerNode creates the Node, or takes over an existing one (a node restarted after a fault):
// its labels are merged, its status replaced. Taints are left to the node lifecycle controller.
func (k *Kubelet) registerNode(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	nodes := k.client.CoreV1().Nodes()
	node, err := nodes.Get(ctx, k.cfg.NodeName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		node = &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: k.cfg.NodeName, Labels: k.nodeLabels()}}
		node.Status = k.nodeStatus(nil)
		if node, err = nodes.Create(ctx, node, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating node %s: %w", k.cfg.NodeName, err)
		}
		klog.InfoS("Node registered", "node", k.cfg.NodeName)
	case err != nil:
		return fmt.Errorf("reading node %s: %w", k.cfg.NodeName, err)
	default:
		if node.Labels == nil {
			node.Labels = map[string]string{}
		}
		for key, v := range k.nodeLabels() {
			node.Labels[key] = v
		}
		if node, err = nodes.Update(ctx, node, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("updating node %s's labels: %w", k.cfg.NodeName, err)
		}
		klog.InfoS("Node taken over", "node", k.cfg.NodeName)
	}
	// The API server may drop the status given at creation; set it through the status subresource.
	node.Status = k.nodeStatus(&node.Status)
	if _, err := nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("updating node %s's status: %w", k.cfg.NodeName, err)
	}
	return nil
}

func (k *Kubelet) nodeLabels() map[string]string {
	out := map[string]string{
		v1.LabelHostname:   k.cfg.NodeName,
		v1.LabelOSStable:   "linux",
		v1.LabelArchStable: "amd64",
	}
	for key, v := range k.cfg.Labels {
		out[key] = v
	}
	return out
}

// nodeStatus is the status this kubelet reports: always ready, with a fresh heartbeat. The
// conditions keep their transition times from old when their status is unchanged.
func (k *Kubelet) nodeStatus(old *v1.NodeStatus) v1.NodeStatus {
	now := metav1.Now()
	condition := func(typ v1.NodeConditionType, status v1.ConditionStatus, reason, message string) v1.NodeCondition {
		c := v1.NodeCondition{Type: typ, Status: status, Reason: reason, Message: message,
			LastHeartbeatTime: now, LastTransitionTime: now}
		if old != nil {
			for _, o := range old.Conditions {
				if o.Type == typ && o.Status == status {
					c.LastTransitionTime = o.LastTransitionTime
				}
			}
		}
		return c
	}
	st := v1.NodeStatus{
		Capacity:    k.cfg.Capacity.DeepCopy(),
		Allocatable: k.cfg.Capacity.DeepCopy(),
		Phase:       v1.NodeRunning,
		Conditions: []v1.NodeCondition{
			condition(v1.NodeMemoryPressure, v1.ConditionFalse, "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
			condition(v1.NodeDiskPressure, v1.ConditionFalse, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
			condition(v1.NodePIDPressure, v1.ConditionFalse, "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
			condition(v1.NodeReady, v1.ConditionTrue, "KubeletReady", "regroup-kubelet is posting ready status"),
		},
		Addresses: []v1.NodeAddress{
			{Type: v1.NodeInternalIP, Address: k.cfg.NodeIP},
			{Type: v1.NodeHostName, Address: k.cfg.NodeName},
		},
		NodeInfo: v1.NodeSystemInfo{
			KubeletVersion:          kubeletVersion,
			OperatingSystem:         "linux",
			Architecture:            "amd64",
			ContainerRuntimeVersion: "regroup-process://" + kubeletVersion,
		},
	}
	if old != nil {
		st.Images, st.VolumesAttached, st.VolumesInUse = old.Images, old.VolumesAttached, old.VolumesInUse
	}
	return st
}

// heartbeatLoop renews the node's status and Lease every --heartbeat until ctx ends.
func (k *Kubelet) heartbeatLoop(ctx context.Context) {
	ticker := time.NewTicker(k.cfg.Heartbeat)
	defer ticker.Stop()
	for {
		k.renewLease(ctx)
		k.heartbeat(ctx)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

func (k *Kubelet) heartbeat(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	nodes := k.client.CoreV1().Nodes()
	node, err := nodes.Get(ctx, k.cfg.NodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		// Someone deleted the node object: register again.
		if err := k.registerNode(ctx); err != nil {
			klog.ErrorS(err, "Registering the deleted node again failed; retrying", "node", k.cfg.NodeName)
		}
		return
	}
	if err != nil {
		klog.ErrorS(err, "Reading the node for its heartbeat failed; retrying", "node", k.cfg.NodeName)
		return
	}
	node.Status = k.nodeStatus(&node.Status)
	if _, err := nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		klog.ErrorS(err, "Updating the node's status failed; retrying", "node", k.cfg.NodeName)
	}
}

// renewLease renews (or creates) the node's Lease in kube-node-lease, which the node lifecycle
// controller reads as the node's heartbeat.
func (k *Kubelet) renewLease(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	leases := k.client.CoordinationV1().Leases(leaseNamespace)
	now := metav1.NewMicroTime(time.Now())
	lease, err := leases.Get(ctx, k.cfg.NodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		lease = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: k.cfg.NodeName, Namespace: leaseNamespace}}
		if node, err := k.client.CoreV1().Nodes().Get(ctx, k.cfg.NodeName, metav1.GetOptions{}); err == nil {
			// As the real kubelet does, so the lease goes with the node.
			lease.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}}
		}
		lease.Spec = k.leaseSpec(now)
		if _, err := leases.Create(ctx, lease, metav1.CreateOptions{}); err != nil {
			klog.ErrorS(err, "Creating the node's lease failed; retrying", "node", k.cfg.NodeName)
		}
		return
	}
	if err != nil {
		klog.ErrorS(err, "Reading the node's lease failed; retrying", "node", k.cfg.NodeName)
		return
	}
	lease.Spec = k.leaseSpec(now)
	if _, err := leases.Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		klog.ErrorS(err, "Renewing the node's lease failed; retrying", "node", k.cfg.NodeName)
	}
}

func (k *Kubelet) leaseSpec(now metav1.MicroTime) coordinationv1.LeaseSpec {
	return coordinationv1.LeaseSpec{
		HolderIdentity:       ptr.To(k.cfg.NodeName),
		LeaseDurationSeconds: ptr.To[int32](leaseDurationSecs),
		RenewTime:            &now,
	}
}
