// SPDX-License-Identifier: Apache-2.0

package volcano

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	vcclient "volcano.sh/apis/pkg/client/clientset/versioned"
	"volcano.sh/volcano/pkg/scheduler/api"
	"volcano.sh/volcano/pkg/scheduler/framework"

	"github.com/regroup-dev/regroup/go/regroup"
)

// The PodGroup annotations the plugin owns. Their prefix is not Regroup's key prefix
// ("regroup.io/"), so the engine never reads them as a job's configuration.
const (
	stateAnnotationPrefix = "scheduler.regroup.io/"
	// StateAnnotation holds the engine's state of the job (regroup_engine_export_job_state):
	// phase, directive and its deadline, pods; a restarted scheduler restores it.
	StateAnnotation = stateAnnotationPrefix + "state"
	// PhaseAnnotation holds the job's phase, for people (kubectl get podgroup -o yaml).
	PhaseAnnotation = stateAnnotationPrefix + "phase"
)

// stateWriteTimeout bounds one write of a job's state to its PodGroup.
const stateWriteTimeout = 10 * time.Second

// The plugin's effects on the cluster go through four small interfaces, so that tests observe
// them and the scheduler's own harness (which has no API server) can run the plugin.

// StateStore writes a job's annotations to its PodGroup.
type StateStore interface {
	SaveState(ssn *framework.Session, pg *api.PodGroup, annotations map[string]string) error
}

// EventSink records an event on a job's PodGroup.
type EventSink interface {
	Event(ssn *framework.Session, pg *api.PodGroup, eventType, reason, message string)
}

// Evictor removes a pod from a faulty node.
type Evictor interface {
	Evict(ssn *framework.Session, task *api.TaskInfo, mode regroup.EvictionMode, reason string) error
}

// TokenWriter writes a job's coordinator token into the job's namespace, as the Secret the
// job's manager reads it from, owned by the job so that it goes with it.
type TokenWriter interface {
	WriteToken(ssn *framework.Session, pg *api.PodGroup, secret, token string) error
}

// JobPatcher lowers a Volcano Job's minAvailable, noting the submitted value on the Job.
type JobPatcher interface {
	LowerMinAvailable(ssn *framework.Session, namespace, name string, to, submitted int32) error
}

// SubmittedMinAvailableAnnotation, on a Volcano Job whose minAvailable the plugin lowered, holds
// the value it was submitted with.
const SubmittedMinAvailableAnnotation = stateAnnotationPrefix + "submitted-min-available"

// VolcanoJobPatcher patches the Job through the scheduler's Volcano client (a JSON merge patch:
// spec.minAvailable and the annotation, no resourceVersion). Volcano's admission allows
// minAvailable to change on a running Job; its job controller carries it into the PodGroup.
type VolcanoJobPatcher struct{}

// LowerMinAvailable implements JobPatcher.
func (VolcanoJobPatcher) LowerMinAvailable(ssn *framework.Session, namespace, name string, to, submitted int32) error {
	client := ssn.VCClient()
	if client == nil {
		return fmt.Errorf("no Volcano client to patch Job %s/%s", namespace, name)
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"annotations": map[string]string{
			SubmittedMinAvailableAnnotation: fmt.Sprint(submitted)}},
		"spec": map[string]any{"minAvailable": to},
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), stateWriteTimeout)
	defer cancel()
	if _, err := client.BatchV1alpha1().Jobs(namespace).Patch(ctx, name, types.MergePatchType, patch,
		metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("lowering the minAvailable of Job %s/%s to %d: %w", namespace, name, to, err)
	}
	return nil
}

// PodGroupStateStore writes the annotations with a JSON merge patch through the scheduler's
// Volcano client: only the plugin's keys change, and no resourceVersion is needed.
type PodGroupStateStore struct{}

// SaveState implements StateStore.
func (PodGroupStateStore) SaveState(ssn *framework.Session, pg *api.PodGroup, annotations map[string]string) error {
	return patchPodGroupAnnotations(ssn.VCClient(), pg.Namespace, pg.Name, annotations)
}

func patchPodGroupAnnotations(client vcclient.Interface, namespace, name string, annotations map[string]string) error {
	if client == nil {
		return fmt.Errorf("no Volcano client to write PodGroup %s/%s", namespace, name)
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), stateWriteTimeout)
	defer cancel()
	_, err = client.SchedulingV1beta1().PodGroups(namespace).Patch(ctx, name, types.MergePatchType, patch,
		metav1.PatchOptions{})
	if err != nil {
		return fmt.Errorf("writing the Regroup state to PodGroup %s/%s: %w", namespace, name, err)
	}
	return nil
}

// SessionEvents records events through the scheduler's event recorder.
type SessionEvents struct{}

// Event implements EventSink.
func (SessionEvents) Event(ssn *framework.Session, pg *api.PodGroup, eventType, reason, message string) {
	ssn.RecordPodGroupEvent(pg, eventType, reason, message)
}

// SessionEvictor evicts through the scheduler (ssn.Evict: the pod is deleted with its own grace
// period, and the session and cache see it releasing). For fault-scheduling=force it then deletes
// the pod with a grace period of 0, as MindCluster does, so that a pod on a dead node does not
// wait out its grace period. A failed pod is deleted at once.
type SessionEvictor struct{}

// Evict implements Evictor. A failed pod holds nothing to release: it is only deleted.
func (SessionEvictor) Evict(ssn *framework.Session, task *api.TaskInfo, mode regroup.EvictionMode, reason string) error {
	if task.Status == api.Failed && task.Pod != nil {
		forceDeleteInBackground(ssn.KubeClient(), task.Pod)
		return nil
	}
	if err := ssn.Evict(task, reason); err != nil {
		return err
	}
	if mode == regroup.EvictForce && task.Pod != nil {
		forceDeleteInBackground(ssn.KubeClient(), task.Pod)
	}
	return nil
}

// forceDeleteInBackground deletes the pod off the session's goroutine (an API call), logging a
// failure.
func forceDeleteInBackground(client kubernetes.Interface, pod *v1.Pod) {
	go func() {
		if err := forceDelete(client, pod); err != nil {
			klog.Errorf("regroup: %v", err)
		}
	}()
}

// forceDelete deletes a pod with a grace period of 0, only the incarnation given (by uid).
func forceDelete(client kubernetes.Interface, pod *v1.Pod) error {
	if client == nil {
		return fmt.Errorf("no Kubernetes client to delete pod %s/%s", pod.Namespace, pod.Name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), stateWriteTimeout)
	defer cancel()
	zero := int64(0)
	uid := pod.UID
	err := client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero,
		Preconditions:      &metav1.Preconditions{UID: &uid},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("force-deleting pod %s/%s (fault-scheduling=force): %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// TokenSecretKey is the key of the token in a job's token Secret; TokenSecretLabel marks the
// Secrets the plugin writes.
const (
	TokenSecretKey   = "token"
	TokenSecretLabel = stateAnnotationPrefix + "coordinator-token"
)

// TokenSecretName is the Secret that holds job id's coordinator token: NAME-regroup-coordinator-
// token in the job's namespace, the name `regroupctl convert` and the examples mount.
func TokenSecretName(id string) string {
	return id[strings.LastIndexByte(id, '/')+1:] + "-regroup-coordinator-token"
}

// SecretTokenWriter writes the Secret through the scheduler's client: created owned by the
// Volcano Job (the PodGroup when no Job owns it), so that Kubernetes deletes it with the job;
// patched when it exists (a hand-made one, or one of the job's earlier uid: a job created again
// under its name has a new token). It never reads a Secret: the scheduler needs only `create`
// and `patch` on Secrets, not `get`.
type SecretTokenWriter struct{}

// WriteToken implements TokenWriter.
func (SecretTokenWriter) WriteToken(ssn *framework.Session, pg *api.PodGroup, secret, token string) error {
	return writeTokenSecret(ssn.KubeClient(), pg, secret, token)
}

func writeTokenSecret(client kubernetes.Interface, pg *api.PodGroup, secret, token string) error {
	if client == nil {
		return fmt.Errorf("no Kubernetes client to write Secret %s/%s", pg.Namespace, secret)
	}
	owner := metav1.OwnerReference{APIVersion: "scheduling.volcano.sh/v1beta1", Kind: "PodGroup",
		Name: pg.Name, UID: pg.UID}
	for _, o := range pg.OwnerReferences {
		if o.Kind == "Job" && strings.HasPrefix(o.APIVersion, "batch.volcano.sh/") {
			owner = metav1.OwnerReference{APIVersion: o.APIVersion, Kind: o.Kind, Name: o.Name, UID: o.UID}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), stateWriteTimeout)
	defer cancel()
	secrets := client.CoreV1().Secrets(pg.Namespace)
	labels := map[string]string{TokenSecretLabel: "true"}
	_, err := secrets.Create(ctx, &v1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: secret, Namespace: pg.Namespace, Labels: labels,
			OwnerReferences: []metav1.OwnerReference{owner}},
		Type: v1.SecretTypeOpaque,
		Data: map[string][]byte{TokenSecretKey: []byte(token)},
	}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		patch, merr := json.Marshal(map[string]any{
			"metadata": map[string]any{"labels": labels, "ownerReferences": []metav1.OwnerReference{owner}},
			"data":     map[string][]byte{TokenSecretKey: []byte(token)},
		})
		if merr != nil {
			return merr
		}
		_, err = secrets.Patch(ctx, secret, types.MergePatchType, patch, metav1.PatchOptions{})
	}
	if err != nil {
		return fmt.Errorf("writing Secret %s/%s: %w", pg.Namespace, secret, err)
	}
	return nil
}
