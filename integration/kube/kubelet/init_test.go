// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestContainerSeesItsVolumesHostsFileAndHostnameInItsOwnNamespaces(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipped: bind mounts onto host paths such as /dev/shm need root (the kubelet runs as root in the test cluster)")
	}
	t.Parallel()
	mnt := filepath.Join(t.TempDir(), "not/yet") // mount points the init must create, then the kubelet remove
	shmFile := fmt.Sprintf("/dev/shm/regroup-kubelet-test-%d", time.Now().UnixNano())
	script := fmt.Sprintf(`cat %[1]s/cfg/lr; echo
touch %[1]s/cfg/x 2>/dev/null && echo cfg-writable || echo cfg-readonly
touch %[2]s && echo shm-ok
echo hi > %[1]s/work/f
grep -q mounted-pod /etc/hosts && echo hosts-ok
echo "hostname $(hostname)"
pwd`, mnt, shmFile)
	pod := shPod("mounted-pod", v1.RestartPolicyNever, script)
	c := &pod.Spec.Containers[0]
	c.WorkingDir = mnt + "/wd"
	c.VolumeMounts = []v1.VolumeMount{
		{Name: "cfg", MountPath: mnt + "/cfg"},
		{Name: "shm", MountPath: "/dev/shm"},
		{Name: "work", MountPath: mnt + "/work", SubPath: "sub"},
	}
	pod.Spec.Volumes = []v1.Volume{
		{Name: "cfg", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "settings"}}}},
		{Name: "shm", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{Medium: v1.StorageMediumMemory}}},
		{Name: "work", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
	}
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings", Namespace: "default"}, Data: map[string]string{"lr": "0.1"}}
	tk := startKubelet(t, testConfig(t), pod, cm)
	got := tk.waitPod(t, "mounted-pod", 10*time.Second, phaseIs(v1.PodSucceeded))

	want := fmt.Sprintf("0.1\ncfg-readonly\nshm-ok\nhosts-ok\nhostname mounted-pod\n%s/wd\n", mnt)
	if out := tk.log(t, got, "c0"); out != want {
		t.Errorf("the container printed %q, want %q", out, want)
	}
	if data, err := os.ReadFile(filepath.Join(tk.podDir(got), "volumes/work/sub/f")); err != nil || string(data) != "hi\n" {
		t.Errorf("the subPath write did not land in the volume: %q %v", data, err)
	}
	if _, err := os.Stat(shmFile); !os.IsNotExist(err) {
		os.Remove(shmFile)
		t.Errorf("the container's /dev/shm is the host's")
	}
	waitFor(t, 5*time.Second, "the created mount points to be removed", func() bool {
		_, err := os.Stat(filepath.Dir(mnt))
		return os.IsNotExist(err)
	})
}

func TestLookPathUsesTheContainersPath(t *testing.T) {
	if p, err := lookPath("sh", "/nonexistent:/bin"); err != nil || p != "/bin/sh" {
		t.Errorf("lookPath(sh) = %q, %v", p, err)
	}
	if _, err := lookPath("sh", "/nonexistent"); err == nil {
		t.Errorf("found sh on a PATH without it")
	}
	if p, _ := lookPath("./run.sh", ""); p != "./run.sh" {
		t.Errorf("a path with a slash is used as is, got %q", p)
	}
}
