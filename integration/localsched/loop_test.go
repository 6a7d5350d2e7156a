// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// harness runs a Loop over pipes, as integration/volcano_loop.py does over stdin/stdout.
type harness struct {
	t      *testing.T
	in     *io.PipeWriter
	events chan map[string]any
	done   chan struct{}
	seen   []map[string]any
}

// deployedConf is the scheduler configuration that ships (deploy/volcano), when this checkout has
// it: what ships is what is tested.
const deployedConf = "../../deploy/helm/regroup/files/volcano-scheduler.conf"

// schedulerConfs are the configurations each scheduling test runs with.
func schedulerConfs(t *testing.T) map[string]string {
	confs := map[string]string{"built-in": defaultSchedulerConf}
	if b, err := os.ReadFile(deployedConf); err == nil {
		confs["deploy"] = string(b)
	} else {
		t.Logf("no %s (%v): only the built-in configuration is tested", deployedConf, err)
	}
	return confs
}

func startLoop(t *testing.T, conf string) *harness {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	token := filepath.Join(t.TempDir(), "coordinator-credential")
	if err := os.WriteFile(token, []byte("localsched-test-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := NewLoop(Config{SchedulerConf: conf, CoordinatorListen: "127.0.0.1:0",
		CredentialFile: token, Period: 100 * time.Millisecond, Out: outW})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, in: inW, events: make(chan map[string]any, 1000), done: make(chan struct{})}
	go func() {
		defer close(h.done)
		l.Run(inR)
		l.Close()
		outW.Close()
	}()
	go func() {
		s := bufio.NewScanner(outR)
		for s.Scan() {
			var ev map[string]any
			if err := json.Unmarshal(s.Bytes(), &ev); err != nil {
				t.Errorf("not JSON on stdout: %q", s.Text())
				continue
			}
			h.events <- ev
		}
		close(h.events)
	}()
	t.Cleanup(func() {
		h.send(map[string]any{"op": "quit"})
		select {
		case <-h.done:
		case <-time.After(10 * time.Second):
			t.Error("the loop did not stop within 10 s")
		}
		inW.Close()
		for range h.events {
		}
	})
	return h
}

func (h *harness) send(cmd map[string]any) {
	b, _ := json.Marshal(cmd)
	done := make(chan struct{})
	go func() {
		_, _ = h.in.Write(append(b, '\n'))
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		h.t.Fatalf("sending %s blocked", b)
	}
}

// wait returns the first event (not yet returned) for which match is true.
func (h *harness) wait(what string, timeout time.Duration, match func(map[string]any) bool) map[string]any {
	h.t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case ev, ok := <-h.events:
			if !ok {
				h.t.Fatalf("the loop ended while waiting for %s; events: %v", what, h.seen)
			}
			h.seen = append(h.seen, ev)
			if ev["event"] == "error" {
				h.t.Logf("error event: %v", ev["message"])
			}
			if match(ev) {
				return ev
			}
		case <-deadline:
			h.t.Fatalf("no %s within %s; events: %v", what, timeout, h.seen)
		}
	}
}

func kind(k string) func(map[string]any) bool {
	return func(ev map[string]any) bool { return ev["event"] == k }
}

const jobYAML = `apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata:
  name: mlp
  namespace: default
  labels:
    fault-scheduling: force
    pod-rescheduling: "on"
  annotations:
    recover-strategy: recover,elastic-training,exit
    regroup.io/tensor-parallel: "1"
%s
spec:
  schedulerName: volcano
  minAvailable: 2
  policies:
  - event: PodEvicted
    action: RestartTask
  tasks:
  - name: manager
    replicas: 1
    template:
      spec:
        containers:
        - name: manager
          command: [regroup-manager, --port=9601]
          resources: {requests: {cpu: "1", memory: 512Mi}}
  - name: worker
    replicas: 2
    template:
      spec:
        containers:
        - name: trainer
          command: [regroup-agent, --nproc-per-node=2, --nnodes=2, train.py]
          resources: {requests: {cpu: "1", memory: 1Gi}}
`

func writeJob(t *testing.T, extraAnnotations string) string {
	f := filepath.Join(t.TempDir(), "job.yaml")
	if err := os.WriteFile(f, []byte(fmt.Sprintf(jobYAML, extraAnnotations)), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestBindEvictRebind(t *testing.T) {
	for name, conf := range schedulerConfs(t) {
		t.Run(name, func(t *testing.T) { testBindEvictRebind(t, conf) })
	}
}

func testBindEvictRebind(t *testing.T, conf string) {
	h := startLoop(t, conf)
	ready := h.wait("ready", 20*time.Second, kind("ready"))
	if c, _ := ready["coordinator"].(string); !strings.HasPrefix(c, "127.0.0.1:") || strings.HasSuffix(c, ":0") {
		t.Fatalf("ready names coordinator %q", ready["coordinator"])
	}
	for i := 0; i < 3; i++ {
		h.send(map[string]any{"op": "add_node", "name": fmt.Sprintf("node-%d", i), "cpu": "8", "memory": "32Gi", "pods": 1})
	}
	h.send(map[string]any{"op": "submit", "file": writeJob(t, "")})

	binds := map[string]map[string]any{}
	nodes := map[string]bool{}
	for len(binds) < 3 {
		ev := h.wait("3 binds", 30*time.Second, kind("bind"))
		binds[ev["pod"].(string)] = ev
		nodes[ev["node"].(string)] = true
	}
	for _, p := range []string{"default/mlp-manager-0", "default/mlp-worker-0", "default/mlp-worker-1"} {
		if binds[p] == nil {
			t.Fatalf("no bind of %s: %v", p, binds)
		}
	}
	if len(nodes) != 3 {
		t.Fatalf("binds on %d nodes, want 3 (one pod per node): %v", len(nodes), binds)
	}
	if binds["default/mlp-worker-1"]["task"] != "worker" || binds["default/mlp-worker-1"]["index"] != float64(1) {
		t.Fatalf("bind event of worker 1: %v", binds["default/mlp-worker-1"])
	}
	for p, ev := range binds {
		h.send(map[string]any{"op": "pod_phase", "pod": p, "uid": ev["uid"], "phase": "Running"})
	}
	// A spare node, then worker 1's node fails.
	h.send(map[string]any{"op": "add_node", "name": "node-3", "cpu": "8", "memory": "32Gi", "pods": 1})
	time.Sleep(500 * time.Millisecond)
	victim := binds["default/mlp-worker-1"]
	h.send(map[string]any{"op": "node_ready", "name": victim["node"], "ready": false, "reason": "KubeletDown"})
	ev := h.wait("the eviction of worker 1", 30*time.Second, kind("evict"))
	if ev["pod"] != "default/mlp-worker-1" || ev["uid"] != victim["uid"] {
		t.Fatalf("evicted %v, want worker 1 (uid %v)", ev, victim["uid"])
	}
	h.send(map[string]any{"op": "pod_phase", "pod": "default/mlp-worker-1", "uid": victim["uid"], "phase": "Failed", "exit_code": 137})
	re := h.wait("the replacement's bind", 30*time.Second, kind("bind"))
	if re["pod"] != "default/mlp-worker-1" || re["uid"] == victim["uid"] || re["node"] != "node-3" {
		t.Fatalf("replacement bind %v; want mlp-worker-1 with a new uid on node-3 (the failed pod was %v)", re, victim)
	}
}

func TestInvalidJob(t *testing.T) {
	for name, conf := range schedulerConfs(t) {
		t.Run(name, func(t *testing.T) { testInvalidJob(t, conf) })
	}
}

func testInvalidJob(t *testing.T, conf string) {
	h := startLoop(t, conf)
	h.wait("ready", 20*time.Second, kind("ready"))
	for i := 0; i < 3; i++ {
		h.send(map[string]any{"op": "add_node", "name": fmt.Sprintf("node-%d", i)})
	}
	h.send(map[string]any{"op": "submit", "file": writeJob(t, "    regroup.io/min-data-parallel: zero")})
	ev := h.wait("job_invalid", 20*time.Second, func(ev map[string]any) bool {
		if ev["event"] == "bind" {
			t.Fatalf("a pod of the invalid job was bound: %v", ev)
		}
		return ev["event"] == "job_invalid"
	})
	if ev["job"] != "default/mlp" || !strings.Contains(fmt.Sprint(ev["message"]), "regroup.io/min-data-parallel") {
		t.Fatalf("job_invalid %v; want job default/mlp and a message naming the key", ev)
	}
	// Nothing is bound in the sessions that follow.
	deadline := time.After(2 * time.Second)
	for {
		select {
		case ev := <-h.events:
			if ev["event"] == "bind" {
				t.Fatalf("a pod of the invalid job was bound: %v", ev)
			}
		case <-deadline:
			return
		}
	}
}

// A MindCluster job (worker pods only, each requesting NPUs) binds only to nodes that advertise
// them, one pod per node that has room; when MindCluster's device plugin then reports an NPU of a
// pod's node at a separate level (its ConfigMap, as the component publishes it), the plugin
// evicts that pod, naming the fault.
func TestAcceleratorNodesAndADevicePluginFault(t *testing.T) {
	h := startLoop(t, defaultSchedulerConf)
	h.wait("ready", 20*time.Second, kind("ready"))
	h.send(map[string]any{"op": "add_node", "name": "cpu-only"})
	for i := 0; i < 2; i++ {
		h.send(map[string]any{"op": "add_node", "name": fmt.Sprintf("npu-%d", i),
			"resources": map[string]string{"huawei.com/Ascend910": "8"}})
	}
	job := strings.Replace(strings.Replace(strings.Replace(jobYAML, "%s\n", "", 1), "minAvailable: 2", "minAvailable: 1", 1),
		`resources: {requests: {cpu: "1", memory: 1Gi}}`,
		`resources: {requests: {cpu: "1", memory: 1Gi, huawei.com/Ascend910: 8}, limits: {huawei.com/Ascend910: 8}}`, 1)
	job = job[:strings.Index(job, "  - name: manager")] + job[strings.Index(job, "  - name: worker"):]
	f := filepath.Join(t.TempDir(), "job.yaml")
	if err := os.WriteFile(f, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	h.send(map[string]any{"op": "submit", "file": f})
	binds := map[string]map[string]any{}
	for len(binds) < 2 {
		ev := h.wait("2 binds", 30*time.Second, kind("bind"))
		binds[ev["node"].(string)] = ev
	}
	if binds["npu-0"] == nil || binds["npu-1"] == nil {
		t.Fatalf("the NPU pods were bound to %v; want npu-0 and npu-1", binds)
	}
	for _, ev := range binds {
		h.send(map[string]any{"op": "pod_phase", "pod": ev["pod"], "uid": ev["uid"], "phase": "Running"})
	}
	faults := `[{"fault_type":"CardUnhealthy","npu_name":"Ascend910-3","fault_level":"SeparateNPU",` +
		`"fault_handling":"SeparateNPU","large_model_fault_level":"SeparateNPU","fault_code":"80E18402"}]`
	info, _ := json.Marshal(map[string]any{"DeviceInfo": map[string]any{"DeviceList": map[string]string{
		"huawei.com/Ascend910": "Ascend910-0,Ascend910-1,Ascend910-2", "huawei.com/Ascend910-Unhealthy": "Ascend910-3",
		"huawei.com/Ascend910-Fault": faults}, "UpdateTime": 1}, "CheckCode": "x"})
	h.send(map[string]any{"op": "configmap", "namespace": "kube-system", "name": "mindx-dl-deviceinfo-npu-1",
		"data": map[string]string{"DeviceInfoCfg": string(info)}})
	ev := h.wait("the eviction of the pod on npu-1", 30*time.Second, kind("evict"))
	if ev["uid"] != binds["npu-1"]["uid"] || !strings.Contains(fmt.Sprint(ev["reason"]), "Ascend910-3 fault 80E18402 level SeparateNPU") {
		t.Fatalf("evicted %v; want the pod on npu-1 (%v), for its NPU's SeparateNPU fault", ev, binds["npu-1"])
	}
}

func TestBadCommands(t *testing.T) {
	h := startLoop(t, defaultSchedulerConf)
	h.wait("ready", 20*time.Second, kind("ready"))
	for _, bad := range []string{`not json`, `{"op":"fly"}`, `{"op":"add_node"}`, `{"op":"add_node","name":"n","cpu":"lots"}`,
		`{"op":"node_ready","name":"nope","ready":false}`, `{"op":"submit","file":"/nonexistent.yaml"}`,
		`{"op":"pod_phase","pod":"default/x","phase":"Running"}`, `{"op":"pod_phase","pod":"default/x","phase":"Sleeping"}`,
		`{"op":"configmap","name":"x"}`} {
		_, _ = h.in.Write([]byte(bad + "\n"))
		h.wait("an error for "+bad, 10*time.Second, kind("error"))
	}
}
