// SPDX-License-Identifier: Apache-2.0

package volcano

import (
	"context"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	schedulingv1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"
	vcfake "volcano.sh/apis/pkg/client/clientset/versioned/fake"
)

func TestPatchPodGroupAnnotationsKeepsTheOthers(t *testing.T) {
	pg := &schedulingv1beta1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: "train-pg", Namespace: ns,
		Annotations: map[string]string{"recover-strategy": "recover"}}}
	client := vcfake.NewSimpleClientset(pg)
	if err := patchPodGroupAnnotations(client, ns, "train-pg", map[string]string{StateAnnotation: `{"v":1}`}); err != nil {
		t.Fatal(err)
	}
	got, err := client.SchedulingV1beta1().PodGroups(ns).Get(context.Background(), "train-pg", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"recover-strategy": "recover", StateAnnotation: `{"v":1}`}
	if len(got.Annotations) != 2 || got.Annotations[StateAnnotation] != want[StateAnnotation] ||
		got.Annotations["recover-strategy"] != "recover" {
		t.Errorf("annotations %v; want %v", got.Annotations, want)
	}
	err = patchPodGroupAnnotations(client, ns, "missing", map[string]string{StateAnnotation: "{}"})
	if err == nil || err.Error() == "" {
		t.Errorf("patching a missing PodGroup: %v; want an error naming it", err)
	}
}

func TestForceDeleteUsesAZeroGracePeriod(t *testing.T) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "train-worker-2", Namespace: ns, UID: "u2"}}
	client := kubefake.NewSimpleClientset(pod)
	if err := forceDelete(client, pod); err != nil {
		t.Fatal(err)
	}
	var grace *int64
	for _, a := range client.Actions() {
		if d, ok := a.(k8stesting.DeleteAction); ok {
			grace = d.GetDeleteOptions().GracePeriodSeconds
		}
	}
	if grace == nil || *grace != 0 {
		t.Errorf("delete grace period %v; want 0", grace)
	}
	if _, err := client.CoreV1().Pods(ns).Get(context.Background(), pod.Name, metav1.GetOptions{}); err == nil {
		t.Error("the pod still exists")
	}
	// Gone already: not an error.
	if err := forceDelete(client, pod); err != nil {
		t.Errorf("deleting a pod already gone: %v", err)
	}
}
