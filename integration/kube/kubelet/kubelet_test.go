// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

// The tests run real processes: the test binary is also the container init.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == initArg {
		containerInit(os.Args[2:])
	}
	os.Exit(m.Run())
}

const testNode = "node-a"

type testKubelet struct {
	*Kubelet
	client *fake.Clientset
}

func testConfig(t *testing.T) Config {
	return Config{
		NodeName: testNode,
		NodeIP:   "127.0.0.1",
		Capacity: v1.ResourceList{
			v1.ResourceCPU:    resource.MustParse("4"),
			v1.ResourceMemory: resource.MustParse("8Gi"),
			v1.ResourcePods:   resource.MustParse("10"),
		},
		Root:       t.TempDir(),
		Images:     map[string]Image{"*": {Env: map[string]string{"PATH": "/usr/bin:/bin"}}},
		ImagesFile: "images.json",
		Heartbeat:  200 * time.Millisecond,
		Sync:       100 * time.Millisecond,
		APIHost:    "10.0.0.1",
		APIPort:    "6443",
	}
}

// startKubelet runs a kubelet on a fake API server holding objs (pods are created before the
// kubelet starts: the fake's watch can miss objects created while an informer starts).
func startKubelet(t *testing.T, cfg Config, objs ...runtime.Object) *testKubelet {
	t.Helper()
	client := fake.NewClientset(objs...)
	k := NewKubelet(client, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := k.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Errorf("the kubelet did not stop within 20 s")
		}
	})
	return &testKubelet{Kubelet: k, client: client}
}

// shPod is a pod on the test node whose containers c0, c1, ... run the given shell scripts.
func shPod(name string, policy v1.RestartPolicy, scripts ...string) *v1.Pod {
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Spec: v1.PodSpec{NodeName: testNode, RestartPolicy: policy,
			TerminationGracePeriodSeconds: ptr.To[int64](2)},
	}
	for i, s := range scripts {
		pod.Spec.Containers = append(pod.Spec.Containers, v1.Container{
			Name: fmt.Sprintf("c%d", i), Image: "busybox", Command: []string{"/bin/sh", "-c", s}})
	}
	return pod
}

func (tk *testKubelet) pod(t *testing.T, name string) *v1.Pod {
	t.Helper()
	pod, err := tk.client.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get pod %s: %v", name, err)
	}
	return pod
}

// waitPod polls the pod until ok says so, failing the test after timeout with the last state.
func (tk *testKubelet) waitPod(t *testing.T, name string, timeout time.Duration, ok func(*v1.Pod) bool) *v1.Pod {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		pod, err := tk.client.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
		if err == nil && ok(pod) {
			return pod
		}
		if time.Now().After(deadline) {
			if err != nil {
				t.Fatalf("pod %s: %v", name, err)
			}
			t.Fatalf("pod %s: condition not reached in %v; status: %+v", name, timeout, pod.Status)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func phaseIs(phase v1.PodPhase) func(*v1.Pod) bool {
	return func(p *v1.Pod) bool { return p.Status.Phase == phase }
}

func (tk *testKubelet) log(t *testing.T, pod *v1.Pod, container string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(tk.podDir(pod), container+".log"))
	if err != nil {
		t.Fatalf("reading %s's log: %v", container, err)
	}
	return string(data)
}

func waitFor(t *testing.T, timeout time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestPodWithRestartPolicyNeverReportsEachExitAndFails(t *testing.T) {
	t.Parallel()
	pod := shPod("never", v1.RestartPolicyNever, "echo hello; exit 0", "exit 3", "kill -9 $$$$") // $$ is Kubernetes' escape for $
	tk := startKubelet(t, testConfig(t), pod)
	got := tk.waitPod(t, "never", 10*time.Second, phaseIs(v1.PodFailed))

	want := []struct {
		code   int32
		reason string
	}{{0, "Completed"}, {3, "Error"}, {137, "Error"}}
	for i, s := range got.Status.ContainerStatuses {
		term := s.State.Terminated
		if term == nil || term.ExitCode != want[i].code || term.Reason != want[i].reason {
			t.Errorf("container %s: state %+v, want exit %d reason %s; log %q", s.Name, s.State, want[i].code, want[i].reason, tk.log(t, got, s.Name))
			continue
		}
		if !strings.HasPrefix(s.ContainerID, "process://") || s.ImageID != "regroup-process://busybox" || s.RestartCount != 0 {
			t.Errorf("container %s: containerID %q imageID %q restarts %d", s.Name, s.ContainerID, s.ImageID, s.RestartCount)
		}
	}
	if got.Status.PodIP != "127.0.0.1" || got.Status.HostIP != "127.0.0.1" || got.Status.StartTime == nil {
		t.Errorf("podIP %q hostIP %q startTime %v", got.Status.PodIP, got.Status.HostIP, got.Status.StartTime)
	}
	if out := tk.log(t, got, "c0"); out != "hello\n" {
		t.Errorf("c0's log is %q, want hello", out)
	}
}

func TestPodSucceedsAndIsNeverStartedAgain(t *testing.T) {
	t.Parallel()
	pod := shPod("ok", v1.RestartPolicyNever, `echo "$HOSTNAME $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT"`)
	tk := startKubelet(t, testConfig(t), pod)
	got := tk.waitPod(t, "ok", 10*time.Second, phaseIs(v1.PodSucceeded))
	if !hasCondition(got.Status.Conditions, v1.PodReady, v1.ConditionFalse) || !hasCondition(got.Status.Conditions, v1.PodInitialized, v1.ConditionTrue) {
		t.Errorf("conditions %+v: want Ready False, Initialized True", got.Status.Conditions)
	}
	// Another update of the finished pod must not start it again.
	got.Labels = map[string]string{"touched": "yes"}
	if _, err := tk.client.CoreV1().Pods("default").Update(context.Background(), got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if out := tk.log(t, got, "c0"); out != "ok 10.0.0.1:6443\n" {
		t.Errorf("log %q: want one run printing ok 10.0.0.1:6443", out)
	}
}

func TestOnFailureRestartsAFailedContainerWithBackoff(t *testing.T) {
	t.Parallel()
	mark := filepath.Join(t.TempDir(), "ran-once")
	pod := shPod("onfailure", v1.RestartPolicyOnFailure, fmt.Sprintf("if [ -e %s ]; then exit 0; fi; touch %s; exit 7", mark, mark))
	tk := startKubelet(t, testConfig(t), pod)
	got := tk.waitPod(t, "onfailure", 10*time.Second, phaseIs(v1.PodSucceeded))
	s := got.Status.ContainerStatuses[0]
	if s.RestartCount != 1 || s.LastTerminationState.Terminated == nil || s.LastTerminationState.Terminated.ExitCode != 7 {
		t.Errorf("status %+v: want restartCount 1 after an exit 7", s)
	}
	if s.State.Terminated == nil || s.State.Terminated.ExitCode != 0 {
		t.Errorf("state %+v: want terminated 0", s.State)
	}
	if gap := s.State.Terminated.StartedAt.Sub(s.LastTerminationState.Terminated.FinishedAt.Time); gap < 0 {
		t.Errorf("restarted before the first run finished (gap %v)", gap)
	}
}

func TestRunningPodBecomesReadyOnlyAfterItsReadinessProbePasses(t *testing.T) {
	t.Parallel()
	mark := filepath.Join(t.TempDir(), "ready")
	pod := shPod("probed", v1.RestartPolicyAlways, fmt.Sprintf("sleep 0.5; touch %s; exec sleep 30", mark))
	pod.Spec.Containers[0].ReadinessProbe = &v1.Probe{PeriodSeconds: 1,
		ProbeHandler: v1.ProbeHandler{Exec: &v1.ExecAction{Command: []string{"test", "-e", mark}}}}
	tk := startKubelet(t, testConfig(t), pod)
	running := tk.waitPod(t, "probed", 10*time.Second, phaseIs(v1.PodRunning))
	if s := running.Status.ContainerStatuses[0]; s.State.Running == nil || s.Ready {
		t.Errorf("just started: state %+v ready %v, want running and not ready", s.State, s.Ready)
	}
	tk.waitPod(t, "probed", 10*time.Second, func(p *v1.Pod) bool {
		return hasCondition(p.Status.Conditions, v1.PodReady, v1.ConditionTrue) &&
			hasCondition(p.Status.Conditions, v1.ContainersReady, v1.ConditionTrue) && p.Status.ContainerStatuses[0].Ready
	})
}

// markDeleted does what the API server does on a graceful delete: set deletionTimestamp.
func markDeleted(t *testing.T, tk *testKubelet, name string, grace int64) *v1.Pod {
	t.Helper()
	pod := tk.pod(t, name)
	pod.DeletionTimestamp = ptr.To(metav1.Now())
	pod.DeletionGracePeriodSeconds = ptr.To(grace)
	if _, err := tk.client.CoreV1().Pods("default").Update(context.Background(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return pod
}

// deletions records the pod deletions the kubelet sends.
func deletions(tk *testKubelet) chan metav1.DeleteOptions {
	ch := make(chan metav1.DeleteOptions, 10)
	tk.client.PrependReactor("delete", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		ch <- a.(k8stesting.DeleteActionImpl).DeleteOptions
		return false, nil, nil
	})
	return ch
}

func TestGracefulDeletionSendsSIGTERMThenDeletesThePodForItsUID(t *testing.T) {
	t.Parallel()
	pod := shPod("graceful", v1.RestartPolicyAlways, `trap 'echo got TERM; exit 0' TERM; echo started; while :; do sleep 0.05; done`)
	tk := startKubelet(t, testConfig(t), pod)
	deleted := deletions(tk)
	running := tk.waitPod(t, "graceful", 10*time.Second, phaseIs(v1.PodRunning))
	waitFor(t, 5*time.Second, "the trap to be set", func() bool { return strings.Contains(tk.log(t, running, "c0"), "started") })
	start := time.Now()
	markDeleted(t, tk, "graceful", 20)
	select {
	case opts := <-deleted:
		if opts.GracePeriodSeconds == nil || *opts.GracePeriodSeconds != 0 || opts.Preconditions == nil || *opts.Preconditions.UID != pod.UID {
			t.Errorf("delete options %+v: want grace period 0 and a precondition on UID %s", opts, pod.UID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the kubelet never deleted the pod")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("deletion took %v: the process should have ended on SIGTERM", took)
	}
	if out := tk.log(t, running, "c0"); !strings.Contains(out, "got TERM") {
		t.Errorf("log %q: the container never got SIGTERM", out)
	}
}

func TestDeletionSIGKILLsAContainerThatIgnoresSIGTERMAfterTheGracePeriod(t *testing.T) {
	t.Parallel()
	pod := shPod("stubborn", v1.RestartPolicyAlways, `trap '' TERM; echo started; while :; do sleep 0.05; done`)
	tk := startKubelet(t, testConfig(t), pod)
	deleted := deletions(tk)
	running := tk.waitPod(t, "stubborn", 10*time.Second, phaseIs(v1.PodRunning))
	waitFor(t, 5*time.Second, "the trap to be set", func() bool { return strings.Contains(tk.log(t, running, "c0"), "started") })
	pid := pidOf(t, running.Status.ContainerStatuses[0].ContainerID)
	start := time.Now()
	markDeleted(t, tk, "stubborn", 1)
	select {
	case <-deleted:
	case <-time.After(10 * time.Second):
		t.Fatal("the kubelet never deleted the pod")
	}
	if took := time.Since(start); took < 900*time.Millisecond {
		t.Errorf("deleted after %v, before the 1 s grace period", took)
	}
	if syscall.Kill(pid, 0) == nil {
		t.Errorf("process %d is still alive", pid)
	}
}

func TestForceDeletedPodIsKilledAtOnce(t *testing.T) {
	t.Parallel()
	pod := shPod("forced", v1.RestartPolicyAlways, `exec sleep 60`)
	tk := startKubelet(t, testConfig(t), pod)
	running := tk.waitPod(t, "forced", 10*time.Second, phaseIs(v1.PodRunning))
	pid := pidOf(t, running.Status.ContainerStatuses[0].ContainerID)
	if err := tk.client.CoreV1().Pods("default").Delete(context.Background(), "forced", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the process to die", func() bool { return syscall.Kill(pid, 0) != nil })
}

func pidOf(t *testing.T, containerID string) int {
	t.Helper()
	var pid int
	if _, err := fmt.Sscanf(containerID, "process://%d", &pid); err != nil {
		t.Fatalf("containerID %q: %v", containerID, err)
	}
	return pid
}

func TestUnknownImageWaitsWithErrImagePull(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.Images = map[string]Image{"regroup/regroup:0.1.0": {}}
	pod := shPod("noimage", v1.RestartPolicyNever, "exit 0")
	pod.Spec.Containers[0].Image = "example.com/unknown:1"
	tk := startKubelet(t, cfg, pod)
	got := tk.waitPod(t, "noimage", 10*time.Second, func(p *v1.Pod) bool { return len(p.Status.ContainerStatuses) == 1 })
	w := got.Status.ContainerStatuses[0].State.Waiting
	if w == nil || w.Reason != "ErrImagePull" || !strings.Contains(w.Message, "example.com/unknown:1") || !strings.Contains(w.Message, "images.json") {
		t.Errorf("state %+v: want waiting ErrImagePull naming the image and the --images file", got.Status.ContainerStatuses[0].State)
	}
	if got.Status.Phase != v1.PodPending {
		t.Errorf("phase %s, want Pending", got.Status.Phase)
	}
}

func TestMissingConfigMapKeepsTheContainerWaitingUntilItExists(t *testing.T) {
	t.Parallel()
	pod := shPod("needs-cm", v1.RestartPolicyNever, `echo "value=$FROM_CM"`)
	pod.Spec.Containers[0].Env = []v1.EnvVar{{Name: "FROM_CM", ValueFrom: &v1.EnvVarSource{
		ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "settings"}, Key: "k"}}}}
	tk := startKubelet(t, testConfig(t), pod)
	got := tk.waitPod(t, "needs-cm", 10*time.Second, func(p *v1.Pod) bool { return len(p.Status.ContainerStatuses) == 1 })
	w := got.Status.ContainerStatuses[0].State.Waiting
	if w == nil || w.Reason != "CreateContainerConfigError" || !strings.Contains(w.Message, `configmap "settings"`) {
		t.Fatalf("state %+v: want waiting CreateContainerConfigError naming the configmap", got.Status.ContainerStatuses[0].State)
	}
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings", Namespace: "default"}, Data: map[string]string{"k": "42"}}
	if _, err := tk.client.CoreV1().ConfigMaps("default").Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got = tk.waitPod(t, "needs-cm", 10*time.Second, phaseIs(v1.PodSucceeded))
	if out := tk.log(t, got, "c0"); out != "value=42\n" {
		t.Errorf("log %q, want value=42", out)
	}
}

func TestInitContainersRunInOrderBeforeTheContainers(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "order")
	pod := shPod("inits", v1.RestartPolicyNever, "cat "+file)
	for i := 1; i <= 2; i++ {
		pod.Spec.InitContainers = append(pod.Spec.InitContainers, v1.Container{Name: fmt.Sprintf("init%d", i), Image: "busybox",
			Command: []string{"/bin/sh", "-c", fmt.Sprintf("sleep 0.1; echo init%d >> %s", i, file)}})
	}
	tk := startKubelet(t, testConfig(t), pod)
	got := tk.waitPod(t, "inits", 10*time.Second, phaseIs(v1.PodSucceeded))
	if out := tk.log(t, got, "c0"); out != "init1\ninit2\n" {
		t.Errorf("c0 saw %q, want init1 then init2", out)
	}
	for _, s := range got.Status.InitContainerStatuses {
		if s.State.Terminated == nil || s.State.Terminated.ExitCode != 0 {
			t.Errorf("init container %s: %+v", s.Name, s.State)
		}
	}
}

func TestFailingInitContainerWithRestartNeverFailsThePod(t *testing.T) {
	t.Parallel()
	pod := shPod("badinit", v1.RestartPolicyNever, "echo should not run")
	pod.Spec.InitContainers = []v1.Container{{Name: "init", Image: "busybox", Command: []string{"/bin/sh", "-c", "exit 5"}}}
	tk := startKubelet(t, testConfig(t), pod)
	got := tk.waitPod(t, "badinit", 10*time.Second, phaseIs(v1.PodFailed))
	if s := got.Status.ContainerStatuses[0]; s.State.Waiting == nil || s.State.Waiting.Reason != "PodInitializing" {
		t.Errorf("container state %+v, want never started (waiting PodInitializing)", s.State)
	}
	if s := got.Status.InitContainerStatuses[0]; s.State.Terminated == nil || s.State.Terminated.ExitCode != 5 {
		t.Errorf("init container state %+v, want exit 5", s.State)
	}
}

func TestUnsupportedVolumeFailsThePodNotTheKubelet(t *testing.T) {
	t.Parallel()
	pod := shPod("nfs", v1.RestartPolicyNever, "exit 0")
	pod.Spec.Volumes = []v1.Volume{{Name: "data", VolumeSource: v1.VolumeSource{NFS: &v1.NFSVolumeSource{Server: "x", Path: "/"}}}}
	tk := startKubelet(t, testConfig(t), pod, shPod("fine", v1.RestartPolicyNever, "exit 0"))
	got := tk.waitPod(t, "nfs", 10*time.Second, phaseIs(v1.PodFailed))
	if !strings.Contains(got.Status.Message, `volume "data" is a nfs volume`) {
		t.Errorf("message %q: want it to name the volume and its kind", got.Status.Message)
	}
	tk.waitPod(t, "fine", 10*time.Second, phaseIs(v1.PodSucceeded))
}

func TestNodeIsRegisteredReadyAndItsLeaseRenewed(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.Labels = map[string]string{"accelerator": "ascend"}
	tk := startKubelet(t, cfg)
	ctx := context.Background()
	var lease *coordinationv1.Lease
	waitFor(t, 5*time.Second, "the lease", func() bool {
		var err error
		lease, err = tk.client.CoordinationV1().Leases(leaseNamespace).Get(ctx, testNode, metav1.GetOptions{})
		return err == nil
	})
	if *lease.Spec.HolderIdentity != testNode || *lease.Spec.LeaseDurationSeconds != 40 {
		t.Errorf("lease spec %+v", lease.Spec)
	}
	node, err := tk.client.CoreV1().Nodes().Get(ctx, testNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if node.Labels[v1.LabelHostname] != testNode || node.Labels[v1.LabelOSStable] != "linux" || node.Labels["accelerator"] != "ascend" {
		t.Errorf("labels %v", node.Labels)
	}
	if q := node.Status.Allocatable[v1.ResourcePods]; q.Value() != 10 || node.Status.NodeInfo.KubeletVersion != kubeletVersion {
		t.Errorf("allocatable %v nodeInfo %+v", node.Status.Allocatable, node.Status.NodeInfo)
	}
	if len(node.Status.Addresses) == 0 || node.Status.Addresses[0] != (v1.NodeAddress{Type: v1.NodeInternalIP, Address: "127.0.0.1"}) {
		t.Errorf("addresses %v", node.Status.Addresses)
	}
	beat := func() metav1.Time {
		n, err := tk.client.CoreV1().Nodes().Get(ctx, testNode, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range n.Status.Conditions {
			if c.Type == v1.NodeReady {
				if c.Status != v1.ConditionTrue || c.Reason != "KubeletReady" {
					t.Fatalf("Ready condition %+v", c)
				}
				return c.LastHeartbeatTime
			}
		}
		t.Fatal("no Ready condition")
		return metav1.Time{}
	}
	first, renew := beat(), lease.Spec.RenewTime.Time
	waitFor(t, 3*time.Second, "a newer heartbeat and lease", func() bool {
		l, err := tk.client.CoordinationV1().Leases(leaseNamespace).Get(ctx, testNode, metav1.GetOptions{})
		return err == nil && l.Spec.RenewTime.After(renew) && beat().After(first.Time)
	})
}

func TestStaticPodRunsAndGetsAMirrorPod(t *testing.T) {
	t.Parallel()
	manifest := filepath.Join(t.TempDir(), "static.yaml")
	if err := os.WriteFile(manifest, []byte(`apiVersion: v1
kind: Pod
metadata:
  name: agent
spec:
  containers:
  - name: main
    image: busybox
    command: ["/bin/sh", "-c", "exec sleep 30"]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	static, err := readStaticPod(manifest, testNode)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	cfg.StaticPods = []*v1.Pod{static}
	tk := startKubelet(t, cfg)
	mirror := tk.waitPod(t, "agent-"+testNode, 10*time.Second, phaseIs(v1.PodRunning))
	if mirror.Annotations[v1.MirrorPodAnnotationKey] != string(static.UID) || mirror.Spec.NodeName != testNode {
		t.Errorf("mirror annotations %v nodeName %q", mirror.Annotations, mirror.Spec.NodeName)
	}
	if len(mirror.OwnerReferences) != 1 || mirror.OwnerReferences[0].Kind != "Node" {
		t.Errorf("owner references %+v: want the Node", mirror.OwnerReferences)
	}
}

func TestParseFlagsNamesTheBadFlag(t *testing.T) {
	base := []string{"--kubeconfig", "k", "--node-name", "n1", "--node-ip", "10.0.0.2", "--root", t.TempDir()}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--node-name", "n1"}, "--kubeconfig is required"},
		{append(base[:4:4], "--node-ip", "ten"), "--node-ip"},
		{append(base, "--capacity", "cpu=lots"), "capacity"},
		{append(base, "--labels", "novalue"), "labels"},
		{append(base, "--images", "/nonexistent.json"), "--images /nonexistent.json"},
		{append(base, "--heartbeat", "0s"), "--heartbeat"},
	} {
		if _, _, err := parseFlags(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseFlags(%v) = %v, want an error mentioning %q", tc.args, err, tc.want)
		}
	}
	cfg, _, err := parseFlags(append(base, "--capacity", "cpu=8,memory=32Gi,pods=4,huawei.com/Ascend910=8", "--labels", "a=b"))
	if err != nil {
		t.Fatal(err)
	}
	if q := cfg.Capacity["huawei.com/Ascend910"]; q.Value() != 8 || cfg.Labels["a"] != "b" {
		t.Errorf("capacity %v labels %v", cfg.Capacity, cfg.Labels)
	}
}

func TestHostsFileIsRewrittenInPlaceWhenAServiceAppears(t *testing.T) {
	t.Parallel()
	pod := shPod("client", v1.RestartPolicyAlways, "exec sleep 30")
	backend := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "backend", Namespace: "default", UID: "uid-backend", Labels: map[string]string{"app": "backend"}},
		Spec:       v1.PodSpec{NodeName: "node-b"},
		Status: v1.PodStatus{Phase: v1.PodRunning, PodIP: "10.1.2.3", StartTime: ptr.To(metav1.Now()),
			Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}}},
	}
	tk := startKubelet(t, testConfig(t), pod, backend)
	running := tk.waitPod(t, "client", 10*time.Second, phaseIs(v1.PodRunning))
	path := filepath.Join(tk.podDir(running), "etc-hosts")
	before, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "backend", Namespace: "default"}, Spec: v1.ServiceSpec{Selector: map[string]string{"app": "backend"}}}
	if _, err := tk.client.CoreV1().Services("default").Create(context.Background(), svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the service in the hosts file", func() bool {
		data, _ := os.ReadFile(path)
		return strings.Contains(string(data), "10.1.2.3\tbackend.default.svc.cluster.local backend.default.svc backend.default backend\n")
	})
	after, err := os.Stat(path)
	if err != nil || !os.SameFile(before, after) {
		t.Errorf("the hosts file was replaced, not rewritten in place (a bind mount would keep the old one)")
	}
}

// A kubelet killed with its node and started again finds its pods' statuses from its last life.
func TestRestartedKubeletTakesOverItsPodsPerRestartPolicy(t *testing.T) {
	t.Parallel()
	lastLife := v1.PodStatus{Phase: v1.PodRunning, ContainerStatuses: []v1.ContainerStatus{{Name: "c0", RestartCount: 2,
		ContainerID: "process://1", State: v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: metav1.Now()}}}}}
	always := shPod("always", v1.RestartPolicyAlways, "exec sleep 30")
	never := shPod("never-again", v1.RestartPolicyNever, "exec sleep 30")
	always.Status, never.Status = lastLife, lastLife
	tk := startKubelet(t, testConfig(t), always, never)

	got := tk.waitPod(t, "never-again", 10*time.Second, phaseIs(v1.PodFailed))
	if term := got.Status.ContainerStatuses[0].State.Terminated; term == nil || term.Reason != "ContainerStatusUnknown" || term.ExitCode != 137 {
		t.Errorf("never-again: %+v, want terminated ContainerStatusUnknown 137", got.Status.ContainerStatuses[0].State)
	}
	got = tk.waitPod(t, "always", 10*time.Second, func(p *v1.Pod) bool {
		return p.Status.ContainerStatuses[0].State.Running != nil && p.Status.ContainerStatuses[0].RestartCount == 3
	})
	if last := got.Status.ContainerStatuses[0].LastTerminationState.Terminated; last == nil || last.Reason != "ContainerStatusUnknown" {
		t.Errorf("always: last state %+v, want the unknown exit of the last life", got.Status.ContainerStatuses[0].LastTerminationState)
	}
}
