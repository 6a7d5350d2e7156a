// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// readStaticPod reads a Pod manifest (YAML or JSON) and makes it this node's static pod as the
// kubelet does: named <name>-<node>, in namespace default unless it says, bound to the node,
// with a UID hashed from the manifest, the node and the file, which is also its config hash.
func readStaticPod(path, nodeName string) (*v1.Pod, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pod := &v1.Pod{}
	if err := yaml.Unmarshal(data, pod); err != nil {
		return nil, fmt.Errorf("not a Pod manifest: %v", err)
	}
	if pod.Kind != "" && pod.Kind != "Pod" {
		return nil, fmt.Errorf("the manifest is a %s, not a Pod", pod.Kind)
	}
	if pod.Name == "" || len(pod.Spec.Containers) == 0 {
		return nil, fmt.Errorf("a static pod needs metadata.name and at least one container")
	}
	abs, _ := filepath.Abs(path)
	sum := sha256.Sum256(append(data, []byte("\x00host:"+nodeName+"\x00file:"+abs)...))
	hash := hex.EncodeToString(sum[:16])
	pod.Name = pod.Name + "-" + nodeName
	if pod.Namespace == "" {
		pod.Namespace = metav1.NamespaceDefault
	}
	pod.UID = types.UID(hash)
	pod.Spec.NodeName = nodeName
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations["kubernetes.io/config.hash"] = hash
	pod.Annotations["kubernetes.io/config.source"] = "file"
	pod.Status = v1.PodStatus{}
	return pod, nil
}

func isMirrorPod(pod *v1.Pod) bool {
	_, ok := pod.Annotations[v1.MirrorPodAnnotationKey]
	return ok
}

// ensureMirrorPod makes the static pod visible in the API as its mirror pod: a copy annotated
// kubernetes.io/config.mirror=<hash>, owned by the Node. The static pod runs whether or not this
// works; failures are logged (once each) and retried on the next sync.
func (k *Kubelet) ensureMirrorPod(ctx context.Context, static *v1.Pod) {
	hash := string(static.UID)
	key := static.Namespace + "/" + static.Name
	existing, err := k.pods.Pods(static.Namespace).Get(static.Name)
	switch {
	case err == nil && existing.DeletionTimestamp != nil:
		return // the sync loop finishes its deletion; then it is created again
	case err == nil && isMirrorPod(existing) && existing.Annotations[v1.MirrorPodAnnotationKey] == hash:
		return
	case err == nil && isMirrorPod(existing):
		// A mirror of an older manifest: replace it.
		k.logMirror(key, fmt.Errorf("replacing the mirror pod of an older manifest"))
		k.finishDeletion(ctx, existing)
		return
	case err == nil:
		k.logMirror(key, fmt.Errorf("pod %s exists and is not a mirror pod; the static pod runs without one", key))
		return
	case !apierrors.IsNotFound(err):
		k.logMirror(key, err)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	mirror := static.DeepCopy()
	mirror.UID, mirror.ResourceVersion = "", ""
	mirror.Annotations[v1.MirrorPodAnnotationKey] = hash
	if node, err := k.client.CoreV1().Nodes().Get(ctx, k.cfg.NodeName, metav1.GetOptions{}); err == nil {
		mirror.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID, Controller: ptr.To(true)}}
	}
	if _, err := k.client.CoreV1().Pods(mirror.Namespace).Create(ctx, mirror, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		k.logMirror(key, fmt.Errorf("creating the mirror pod: %w", err))
		return
	}
	k.logMirror(key, nil)
}

// logMirror logs a mirror pod problem when it differs from the last one logged for that pod.
func (k *Kubelet) logMirror(key string, err error) {
	if msg := errorString(err); msg != k.mirrorError[key] {
		k.mirrorError[key] = msg
		if err != nil {
			klog.ErrorS(err, "Mirror pod problem; the static pod keeps running", "pod", key)
		} else {
			klog.InfoS("Mirror pod created", "pod", key)
		}
	}
}
