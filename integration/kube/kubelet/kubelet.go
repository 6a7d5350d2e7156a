// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// apiTimeout bounds every single API call.
const apiTimeout = 10 * time.Second

// Kubelet runs the pods bound to one node.
type Kubelet struct {
	client kubernetes.Interface
	cfg    Config

	pods     corelisters.PodLister     // every pod in the cluster (this node's and, for hosts files, the others)
	services corelisters.ServiceLister // every Service, for hosts files

	mu       sync.Mutex
	runCtx   context.Context // cancelled when the kubelet stops: workers stop their processes
	stopping bool
	workers  map[types.UID]*podWorker
	finished map[types.UID]bool // pods run to the end here: never started again
	deleted  map[types.UID]bool // pods whose final deletion this kubelet has sent
	wg       sync.WaitGroup     // running workers

	wake        chan struct{} // pokes the sync loop (a pod or service changed)
	mirrorError map[string]string
}

// NewKubelet returns a kubelet for cfg; Run starts it.
func NewKubelet(client kubernetes.Interface, cfg Config) *Kubelet {
	if cfg.Images == nil {
		cfg.Images = map[string]Image{}
	}
	return &Kubelet{
		client:      client,
		cfg:         cfg,
		workers:     map[types.UID]*podWorker{},
		finished:    map[types.UID]bool{},
		deleted:     map[types.UID]bool{},
		wake:        make(chan struct{}, 1),
		mirrorError: map[string]string{},
	}
}

// Run registers the node, runs its pods until ctx is cancelled, then stops every pod's processes
// (SIGTERM, SIGKILL after the pod's grace period) and returns.
func (k *Kubelet) Run(ctx context.Context) error {
	klog.InfoS("regroup-kubelet starting", "node", k.cfg.NodeName, "ip", k.cfg.NodeIP, "root", k.cfg.Root)
	for {
		err := k.registerNode(ctx)
		if err == nil {
			break
		}
		klog.ErrorS(err, "Registering the node failed; retrying", "node", k.cfg.NodeName)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(k.cfg.Heartbeat):
		}
	}

	factory := informers.NewSharedInformerFactory(k.client, 0)
	podInformer := factory.Core().V1().Pods()
	svcInformer := factory.Core().V1().Services()
	k.pods, k.services = podInformer.Lister(), svcInformer.Lister()
	k.mu.Lock()
	k.runCtx = ctx
	k.mu.Unlock()
	if _, err := podInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { k.podChanged(obj.(*v1.Pod)) },
		UpdateFunc: func(_, obj any) { k.podChanged(obj.(*v1.Pod)) },
		DeleteFunc: k.podDeleted,
	}); err != nil {
		return fmt.Errorf("watching pods: %w", err)
	}
	if _, err := svcInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { k.poke() },
		UpdateFunc: func(any, any) { k.poke() },
		DeleteFunc: func(any) { k.poke() },
	}); err != nil {
		return fmt.Errorf("watching services: %w", err)
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok && ctx.Err() == nil {
			return fmt.Errorf("the informer for %v never synced", typ)
		}
	}
	for _, pod := range k.cfg.StaticPods {
		k.startWorker(pod, true)
	}

	var bg sync.WaitGroup
	bg.Add(1)
	go func() { defer bg.Done(); k.heartbeatLoop(ctx) }()
	ticker := time.NewTicker(k.cfg.Sync)
	defer ticker.Stop()
	for ctx.Err() == nil {
		k.sync(ctx)
		select {
		case <-ctx.Done():
		case <-ticker.C:
		case <-k.wake:
		}
	}

	k.mu.Lock()
	k.stopping = true
	k.mu.Unlock()
	klog.InfoS("Stopping every pod's processes", "node", k.cfg.NodeName)
	k.wg.Wait() // each worker's wait is bounded by its pod's grace period
	bg.Wait()
	return nil
}

// poke makes the sync loop run soon (hosts files, deletions, mirror pods).
func (k *Kubelet) poke() {
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

func (k *Kubelet) podChanged(pod *v1.Pod) {
	k.poke()
	if pod.Spec.NodeName != k.cfg.NodeName || isMirrorPod(pod) {
		return
	}
	k.mu.Lock()
	w := k.workers[pod.UID]
	k.mu.Unlock()
	switch {
	case w != nil:
		w.update(pod)
	case pod.DeletionTimestamp != nil, isTerminal(pod.Status.Phase):
		// Not ours to run: a deletion is finished by the sync loop, a terminal pod stays as is.
	default:
		k.startWorker(pod, false)
	}
}

func (k *Kubelet) podDeleted(obj any) {
	k.poke()
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	pod, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	k.mu.Lock()
	w := k.workers[pod.UID]
	k.mu.Unlock()
	if w != nil && !w.static {
		w.remove()
	}
}

// startWorker runs pod unless it runs already, has run here before, or the kubelet is stopping.
func (k *Kubelet) startWorker(pod *v1.Pod, static bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stopping || k.workers[pod.UID] != nil || k.finished[pod.UID] {
		return
	}
	w := newPodWorker(k, pod, static)
	k.workers[pod.UID] = w
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		w.run(k.runCtx)
		k.mu.Lock()
		delete(k.workers, pod.UID)
		k.finished[pod.UID] = true
		k.mu.Unlock()
		k.poke()
	}()
}

func (k *Kubelet) runningWorkers() []*podWorker {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]*podWorker, 0, len(k.workers))
	for _, w := range k.workers {
		out = append(out, w)
	}
	return out
}

// sync does the node-wide work: hosts files, deletions of pods not running here, mirror pods.
func (k *Kubelet) sync(ctx context.Context) {
	all, err := k.pods.List(labels.Everything())
	if err != nil {
		klog.ErrorS(err, "Listing pods from the informer cache failed")
		return
	}
	services, err := k.services.List(labels.Everything())
	if err != nil {
		klog.ErrorS(err, "Listing services from the informer cache failed")
		return
	}
	for _, w := range k.runningWorkers() {
		w.refreshHosts(all, services)
	}
	for _, pod := range all {
		if pod.Spec.NodeName != k.cfg.NodeName || pod.DeletionTimestamp == nil {
			continue
		}
		k.mu.Lock()
		running, done := k.workers[pod.UID] != nil, k.deleted[pod.UID]
		k.mu.Unlock()
		if !running && !done {
			// Nothing of this pod runs here (it ended, or ran in a previous life of this kubelet, or
			// is a mirror pod): finish its graceful deletion as a real kubelet does.
			k.finishDeletion(ctx, pod)
		}
	}
	for _, pod := range k.cfg.StaticPods {
		k.ensureMirrorPod(ctx, pod)
	}
}

// finishDeletion deletes a terminating pod with grace period 0, for its UID only; errors are
// logged and retried on the next sync.
func (k *Kubelet) finishDeletion(ctx context.Context, pod *v1.Pod) bool {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	err := k.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: new(int64),
		Preconditions:      &metav1.Preconditions{UID: &pod.UID},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		klog.ErrorS(err, "Deleting a terminated pod failed; retrying", "pod", klog.KObj(pod), "uid", pod.UID)
		return false
	}
	klog.InfoS("Pod deleted", "pod", klog.KObj(pod), "uid", pod.UID)
	k.mu.Lock()
	k.deleted[pod.UID] = true
	k.mu.Unlock()
	return true
}

func isTerminal(phase v1.PodPhase) bool {
	return phase == v1.PodSucceeded || phase == v1.PodFailed
}
