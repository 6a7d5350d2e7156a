// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

// materialize writes pod's volumes with a kubelet on a fake API server holding objs.
func materialize(t *testing.T, pod *v1.Pod, objs ...runtime.Object) (string, time.Time, error) {
	t.Helper()
	k := NewKubelet(fake.NewClientset(objs...), testConfig(t))
	dir := k.podDir(pod)
	refresh, err := k.materializeVolumes(context.Background(), pod, dir)
	return filepath.Join(dir, "volumes"), refresh, err
}

func podWithVolumes(vols ...v1.Volume) *v1.Pod {
	pod := envPod()
	pod.Spec.Volumes = vols
	return pod
}

// expectFile checks a volume file's content and mode.
func expectFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Errorf("%v", err)
		return
	}
	fi, _ := os.Stat(path)
	if string(data) != content || fi.Mode().Perm() != mode {
		t.Errorf("%s: %q mode %v, want %q mode %v", path, data, fi.Mode().Perm(), content, mode)
	}
}

var testSecret = &v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "creds", Namespace: "train"},
	Data: map[string][]byte{"user": []byte("alice"), "pass": []byte("pw")}}

var testConfigMap = &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings", Namespace: "train"},
	Data: map[string]string{"lr": "0.1"}, BinaryData: map[string][]byte{"blob": {0, 1, 2}}}

func TestSecretVolumeWritesItemsWithTheirModes(t *testing.T) {
	pod := podWithVolumes(
		v1.Volume{Name: "all", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "creds", DefaultMode: ptr.To[int32](0o400)}}},
		v1.Volume{Name: "some", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "creds",
			Items: []v1.KeyToPath{{Key: "user", Path: "dir/name"}, {Key: "pass", Path: "pw", Mode: ptr.To[int32](0o600)}}}}},
	)
	vols, _, err := materialize(t, pod, testSecret)
	if err != nil {
		t.Fatal(err)
	}
	expectFile(t, filepath.Join(vols, "all/user"), "alice", 0o400)
	expectFile(t, filepath.Join(vols, "all/pass"), "pw", 0o400)
	expectFile(t, filepath.Join(vols, "some/dir/name"), "alice", 0o644)
	expectFile(t, filepath.Join(vols, "some/pw"), "pw", 0o600)
	if _, err := os.Stat(filepath.Join(vols, "some/user")); !os.IsNotExist(err) {
		t.Errorf("a key not among the items was written")
	}
}

func TestMissingSecretIsRetryableUnlessOptional(t *testing.T) {
	missing := v1.Volume{Name: "s", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "later"}}}
	_, _, err := materialize(t, podWithVolumes(missing))
	var se *specError
	if err == nil || errors.As(err, &se) || !strings.Contains(err.Error(), `secret "later" not found`) {
		t.Errorf("got %v, want a retryable error naming the secret", err)
	}
	missing.Secret.Optional = ptr.To(true)
	vols, _, err := materialize(t, podWithVolumes(missing))
	if fi, serr := os.Stat(filepath.Join(vols, "s")); err != nil || serr != nil || !fi.IsDir() {
		t.Errorf("an optional missing secret: %v / %v, want an empty directory", err, serr)
	}
	itemMissing := v1.Volume{Name: "s", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "creds",
		Items: []v1.KeyToPath{{Key: "nope", Path: "nope"}}}}}
	if _, _, err := materialize(t, podWithVolumes(itemMissing), testSecret); err == nil || !strings.Contains(err.Error(), `has no key "nope"`) {
		t.Errorf("a missing item key gave %v", err)
	}
}

func TestConfigMapVolumeIncludesBinaryData(t *testing.T) {
	pod := podWithVolumes(v1.Volume{Name: "cfg", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{
		LocalObjectReference: v1.LocalObjectReference{Name: "settings"}}}})
	vols, _, err := materialize(t, pod, testConfigMap)
	if err != nil {
		t.Fatal(err)
	}
	expectFile(t, filepath.Join(vols, "cfg/lr"), "0.1", 0o644)
	expectFile(t, filepath.Join(vols, "cfg/blob"), "\x00\x01\x02", 0o644)
}

func TestDownwardAPIVolumeWritesFieldsAndResources(t *testing.T) {
	pod := podWithVolumes(v1.Volume{Name: "info", VolumeSource: v1.VolumeSource{DownwardAPI: &v1.DownwardAPIVolumeSource{
		Items: []v1.DownwardAPIVolumeFile{
			{Path: "labels", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.labels"}},
			{Path: "name", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}, Mode: ptr.To[int32](0o600)},
			{Path: "cpu", ResourceFieldRef: &v1.ResourceFieldSelector{ContainerName: "main", Resource: "limits.cpu"}},
		}}}})
	vols, _, err := materialize(t, pod)
	if err != nil {
		t.Fatal(err)
	}
	expectFile(t, filepath.Join(vols, "info/labels"), "app=\"mlp\"\nrank=\"0\"", 0o644)
	expectFile(t, filepath.Join(vols, "info/name"), "worker-0", 0o600)
	expectFile(t, filepath.Join(vols, "info/cpu"), "2", 0o644)
}

// The volume the ServiceAccount admission plugin adds to every pod.
func TestProjectedServiceAccountVolumeGetsABoundToken(t *testing.T) {
	pod := podWithVolumes(v1.Volume{Name: "kube-api-access-x", VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{
		DefaultMode: ptr.To[int32](0o644),
		Sources: []v1.VolumeProjection{
			{ServiceAccountToken: &v1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](3607)}},
			{ServiceAccountToken: &v1.ServiceAccountTokenProjection{Path: "vault-token", Audience: "vault", ExpirationSeconds: ptr.To[int64](600)}},
			{ConfigMap: &v1.ConfigMapProjection{LocalObjectReference: v1.LocalObjectReference{Name: "kube-root-ca.crt"},
				Items: []v1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
			{DownwardAPI: &v1.DownwardAPIProjection{Items: []v1.DownwardAPIVolumeFile{
				{Path: "namespace", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}}}},
		}}}})
	ca := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kube-root-ca.crt", Namespace: "train"}, Data: map[string]string{"ca.crt": "PEM"}}
	client := fake.NewClientset(ca)
	var requests []*authenticationv1.TokenRequest
	client.PrependReactor("create", "serviceaccounts", func(a k8stesting.Action) (bool, runtime.Object, error) {
		create := a.(k8stesting.CreateAction)
		if create.GetSubresource() != "token" {
			return false, nil, nil
		}
		req := create.GetObject().(*authenticationv1.TokenRequest)
		requests = append(requests, req)
		out := req.DeepCopy()
		out.Status.Token = "token-for-" + strings.Join(req.Spec.Audiences, ",") + "-" + create.(k8stesting.CreateActionImpl).Name
		return true, out, nil
	})
	k := NewKubelet(client, testConfig(t))
	start := time.Now()
	refresh, err := k.materializeVolumes(context.Background(), pod, k.podDir(pod))
	if err != nil {
		t.Fatal(err)
	}
	vol := filepath.Join(k.podDir(pod), "volumes/kube-api-access-x")
	expectFile(t, filepath.Join(vol, "token"), "token-for--trainer", 0o644)
	expectFile(t, filepath.Join(vol, "vault-token"), "token-for-vault-trainer", 0o644)
	expectFile(t, filepath.Join(vol, "ca.crt"), "PEM", 0o644)
	expectFile(t, filepath.Join(vol, "namespace"), "train", 0o644)
	if len(requests) != 2 {
		t.Fatalf("%d token requests, want 2", len(requests))
	}
	for _, req := range requests {
		ref := req.Spec.BoundObjectRef
		if ref == nil || ref.Kind != "Pod" || ref.Name != "worker-0" || ref.UID != "uid-1" {
			t.Errorf("token bound to %+v, want the pod", ref)
		}
	}
	if len(requests[0].Spec.Audiences) != 0 || *requests[0].Spec.ExpirationSeconds != 3607 {
		t.Errorf("first request %+v: want the API server's default audience and 3607 s", requests[0].Spec)
	}
	// Renewed at 80% of the shortest lifetime (600 s).
	if d := refresh.Sub(start); d < 470*time.Second || d > 490*time.Second {
		t.Errorf("token refresh in %v, want 480 s", d)
	}
}

func TestUnsupportedVolumeKindIsASpecErrorNamingIt(t *testing.T) {
	pod := podWithVolumes(v1.Volume{Name: "data", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}}})
	_, _, err := materialize(t, pod)
	var se *specError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), `volume "data" is a persistentVolumeClaim volume`) {
		t.Errorf("got %v, want a spec error naming the kind", err)
	}
}

func TestEmptyDirAndHostPathVolumes(t *testing.T) {
	host := filepath.Join(t.TempDir(), "made/by/kubelet")
	pod := podWithVolumes(
		v1.Volume{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{Medium: v1.StorageMediumMemory}}},
		v1.Volume{Name: "host", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: host, Type: ptr.To(v1.HostPathDirectoryOrCreate)}}},
	)
	vols, _, err := materialize(t, pod)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(vols, "scratch")); err != nil || fi.Mode().Perm() != 0o777 {
		t.Errorf("emptyDir: %v %v", fi, err)
	}
	if fi, err := os.Stat(host); err != nil || !fi.IsDir() {
		t.Errorf("hostPath DirectoryOrCreate: %v", err)
	}
	pod = podWithVolumes(v1.Volume{Name: "host", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: host + "/absent", Type: ptr.To(v1.HostPathDirectory)}}})
	if _, _, err := materialize(t, pod); err == nil {
		t.Errorf("a missing hostPath Directory was accepted")
	}
}
