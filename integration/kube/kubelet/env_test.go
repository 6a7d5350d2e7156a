// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

func envPod() *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "worker-0", Namespace: "train", UID: "uid-1",
			Labels:      map[string]string{"app": "mlp", "rank": "0"},
			Annotations: map[string]string{"regroup.io/role": "worker"}},
		Spec: v1.PodSpec{NodeName: testNode, ServiceAccountName: "trainer", Hostname: "w0",
			Containers: []v1.Container{{Name: "main", Image: "busybox", Resources: v1.ResourceRequirements{
				Limits:   v1.ResourceList{v1.ResourceCPU: resource.MustParse("1500m"), v1.ResourceMemory: resource.MustParse("3Gi")},
				Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("250m")},
			}}}},
	}
}

// resolveEnv runs containerEnv for the pod's first container with env set to env.
func resolveEnv(t *testing.T, pod *v1.Pod, env []v1.EnvVar, from []v1.EnvFromSource, objs ...runtime.Object) (map[string]string, map[string]string, error) {
	t.Helper()
	k := NewKubelet(fake.NewClientset(objs...), testConfig(t))
	c := &pod.Spec.Containers[0]
	c.Env, c.EnvFrom = env, from
	img := Image{Env: map[string]string{"PATH": "/opt/bin:/bin", "IMAGE_ONLY": "img", "OVERRIDDEN": "img"}}
	list, vars, err := k.containerEnv(context.Background(), pod, c, img, newObjectCache(k, pod.Namespace))
	if err != nil {
		return nil, nil, err
	}
	return list.values, vars, nil
}

func TestEnvValuesExpandVariablesAsKubernetesDoes(t *testing.T) {
	env, _, err := resolveEnv(t, envPod(), []v1.EnvVar{
		{Name: "A", Value: "alpha"},
		{Name: "B", Value: "$(A)-beta"},
		{Name: "ESCAPED", Value: "$$(A) and $$$$"},
		{Name: "UNKNOWN", Value: "$(NOPE) $(IMAGE_ONLY)"},
		{Name: "SERVICE", Value: "https://$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)"},
		{Name: "LATER", Value: "$(C)"},
		{Name: "C", Value: "gamma"},
		{Name: "OVERRIDDEN", Value: "container"},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"B": "alpha-beta", "ESCAPED": "$(A) and $$", "UNKNOWN": "$(NOPE) $(IMAGE_ONLY)",
		"SERVICE": "https://10.0.0.1:6443", "LATER": "$(C)", "OVERRIDDEN": "container",
		"IMAGE_ONLY": "img", "PATH": "/opt/bin:/bin", "HOSTNAME": "w0", "KUBERNETES_SERVICE_HOST": "10.0.0.1",
	}
	for name, v := range want {
		if env[name] != v {
			t.Errorf("%s = %q, want %q", name, env[name], v)
		}
	}
}

func TestEnvFieldRefsCoverEveryDownwardAPIPath(t *testing.T) {
	paths := map[string]string{
		"metadata.name":                           "worker-0",
		"metadata.namespace":                      "train",
		"metadata.uid":                            "uid-1",
		"metadata.labels['rank']":                 "0",
		"metadata.annotations['regroup.io/role']": "worker",
		"spec.nodeName":                           testNode,
		"spec.serviceAccountName":                 "trainer",
		"status.podIP":                            "127.0.0.1",
		"status.podIPs":                           "127.0.0.1",
		"status.hostIP":                           "127.0.0.1",
		"status.hostIPs":                          "127.0.0.1",
	}
	var vars []v1.EnvVar
	names := map[string]string{}
	for path := range paths {
		name := strings.NewReplacer(".", "_", "[", "_", "]", "", "'", "", "/", "_").Replace(path)
		names[path] = name
		vars = append(vars, v1.EnvVar{Name: name, ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: path}}})
	}
	env, _, err := resolveEnv(t, envPod(), vars, nil)
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range paths {
		if got := env[names[path]]; got != want {
			t.Errorf("fieldRef %s = %q, want %q", path, got, want)
		}
	}
	_, _, err = resolveEnv(t, envPod(), []v1.EnvVar{{Name: "X", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "spec.priority"}}}}, nil)
	var se *specError
	if !errors.As(err, &se) {
		t.Errorf("an unsupported fieldRef gave %v, want a spec error", err)
	}
}

func TestEnvSecretAndConfigMapKeyRefs(t *testing.T) {
	secret := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "creds", Namespace: "train"}, Data: map[string][]byte{"token": []byte("s3cret")}}
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings", Namespace: "train"}, Data: map[string]string{"lr": "0.1"}}
	secretRef := func(name, key string, optional bool) *v1.EnvVarSource {
		return &v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: name}, Key: key, Optional: ptr.To(optional)}}
	}
	cmRef := func(name, key string, optional bool) *v1.EnvVarSource {
		return &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: name}, Key: key, Optional: ptr.To(optional)}}
	}
	env, _, err := resolveEnv(t, envPod(), []v1.EnvVar{
		{Name: "TOKEN", ValueFrom: secretRef("creds", "token", false)},
		{Name: "LR", ValueFrom: cmRef("settings", "lr", false)},
		{Name: "OPT_KEY", ValueFrom: secretRef("creds", "absent", true)},
		{Name: "OPT_OBJ", ValueFrom: cmRef("nothing", "k", true)},
	}, nil, secret, cm)
	if err != nil {
		t.Fatal(err)
	}
	if env["TOKEN"] != "s3cret" || env["LR"] != "0.1" {
		t.Errorf("TOKEN %q LR %q", env["TOKEN"], env["LR"])
	}
	if _, ok := env["OPT_KEY"]; ok {
		t.Errorf("an optional missing key set OPT_KEY")
	}
	if _, ok := env["OPT_OBJ"]; ok {
		t.Errorf("an optional missing configmap set OPT_OBJ")
	}
	for _, tc := range []struct {
		src  *v1.EnvVarSource
		want string
	}{
		{secretRef("creds", "absent", false), `secret train/creds has no key "absent"`},
		{secretRef("missing", "k", false), `secret "missing" not found`},
		{cmRef("missing", "k", false), `configmap "missing" not found`},
	} {
		_, _, err := resolveEnv(t, envPod(), []v1.EnvVar{{Name: "X", ValueFrom: tc.src}}, nil, secret, cm)
		var se *specError
		if err == nil || !strings.Contains(err.Error(), tc.want) || errors.As(err, &se) {
			t.Errorf("got %v, want a retryable error containing %q", err, tc.want)
		}
	}
}

func TestEnvResourceFieldRefsUseTheDivisorAndRoundUp(t *testing.T) {
	ref := func(name, res, divisor string) v1.EnvVar {
		sel := &v1.ResourceFieldSelector{Resource: res}
		if divisor != "" {
			sel.Divisor = resource.MustParse(divisor)
		}
		return v1.EnvVar{Name: name, ValueFrom: &v1.EnvVarSource{ResourceFieldRef: sel}}
	}
	env, _, err := resolveEnv(t, envPod(), []v1.EnvVar{
		ref("CPU_LIMIT", "limits.cpu", ""),         // 1.5 cores, rounded up to 2
		ref("CPU_LIMIT_M", "limits.cpu", "1m"),     // 1500
		ref("CPU_REQUEST", "requests.cpu", "100m"), // 250m / 100m = 2.5 -> 3
		ref("MEM_LIMIT_MI", "limits.memory", "1Mi"),
		ref("MEM_REQUEST", "requests.memory", ""),                 // unset: 0
		ref("EPHEMERAL_LIMIT", "limits.ephemeral-storage", "1Gi"), // unset limit: node allocatable (none here)
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"CPU_LIMIT": "2", "CPU_LIMIT_M": "1500", "CPU_REQUEST": "3", "MEM_LIMIT_MI": "3072", "MEM_REQUEST": "0", "EPHEMERAL_LIMIT": "0"}
	for name, v := range want {
		if env[name] != v {
			t.Errorf("%s = %q, want %q", name, env[name], v)
		}
	}
	pod := envPod()
	pod.Spec.Containers[0].Resources.Limits = nil
	env, _, err = resolveEnv(t, pod, []v1.EnvVar{ref("MEM", "limits.memory", "1Gi")}, nil)
	if err != nil || env["MEM"] != "8" {
		t.Errorf("an unset memory limit gave %q (%v), want the node's allocatable 8 (Gi)", env["MEM"], err)
	}
}

func TestEnvFromAddsPrefixedKeysAndEnvOverridesThem(t *testing.T) {
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings", Namespace: "train"}, Data: map[string]string{"lr": "0.1", "steps": "10"}}
	secret := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "creds", Namespace: "train"}, Data: map[string][]byte{"token": []byte("t")}}
	env, vars, err := resolveEnv(t, envPod(), []v1.EnvVar{{Name: "CFG_steps", Value: "20"}, {Name: "ECHO", Value: "$(CFG_lr)"}},
		[]v1.EnvFromSource{
			{Prefix: "CFG_", ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "settings"}}},
			{SecretRef: &v1.SecretEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "creds"}}},
			{ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "absent"}, Optional: ptr.To(true)}},
		}, cm, secret)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"CFG_lr": "0.1", "CFG_steps": "20", "token": "t", "ECHO": "0.1"}
	for name, v := range want {
		if env[name] != v || vars[name] != v {
			t.Errorf("%s = %q (vars %q), want %q", name, env[name], vars[name], v)
		}
	}
	if _, ok := vars["IMAGE_ONLY"]; ok {
		t.Errorf("the image's env leaked into $(VAR) expansion")
	}
}

func TestCommandAndArgsExpandAndFallBackToTheEntrypoint(t *testing.T) {
	vars := map[string]string{"STEPS": "10"}
	c := &v1.Container{Name: "main", Command: []string{"python", "train.py"}, Args: []string{"--steps=$(STEPS)", "$$(STEPS)", "$(MISSING)"}}
	argv, err := expandCommand(c, Image{}, "img", vars)
	if want := []string{"python", "train.py", "--steps=10", "$(STEPS)", "$(MISSING)"}; err != nil || !reflect.DeepEqual(argv, want) {
		t.Errorf("argv %q (%v), want %q", argv, err, want)
	}
	c = &v1.Container{Name: "main", Args: []string{"--x"}}
	argv, err = expandCommand(c, Image{Entrypoint: []string{"regroup-agent"}}, "img", vars)
	if want := []string{"regroup-agent", "--x"}; err != nil || !reflect.DeepEqual(argv, want) {
		t.Errorf("argv %q (%v), want %q", argv, err, want)
	}
	var se *specError
	if _, err := expandCommand(&v1.Container{Name: "main"}, Image{}, "img", vars); !errors.As(err, &se) {
		t.Errorf("no command and no entrypoint gave %v, want a spec error", err)
	}
}
