// SPDX-License-Identifier: Apache-2.0

package volcano

import (
	"reflect"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"volcano.sh/volcano/pkg/scheduler/framework"

	"github.com/regroup-dev/regroup/go/regroup"
)

// The payloads are MindCluster's own examples: the device plugin's DeviceInfoCfg of an Atlas A3
// node with a network fault on Ascend910-0 (PreSeparateNPU) and a chip fault on Ascend910-4
// (SeparateNPU), and NodeD's NodeInfo with a CPU SeparateFault, both from the "query and verify
// faults" page of MindCluster's documentation (docs/mindcluster-faults.md names the sources).
const (
	deviceInfoA3 = `{"DeviceInfo":{"DeviceList":{"huawei.com/Ascend910":"Ascend910-0,Ascend910-1,Ascend910-2,Ascend910-3,Ascend910-5,Ascend910-6,Ascend910-7","huawei.com/Ascend910-Fault":"[{\"fault_type\":\"CardNetworkUnhealthy\",\"npu_name\":\"Ascend910-0\",\"large_model_fault_level\":\"PreSeparateNPU\",\"fault_level\":\"PreSeparateNPU\",\"fault_handling\":\"PreSeparateNPU\",\"fault_code\":\"81078603\",\"fault_time_and_level_map\":{\"81078603\":{\"fault_time\":1744168468259,\"fault_level\":\"PreSeparateNPU\"}}},{\"fault_type\":\"CardUnhealthy\",\"npu_name\":\"Ascend910-4\",\"large_model_fault_level\":\"SeparateNPU\",\"fault_level\":\"SeparateNPU\",\"fault_handling\":\"SeparateNPU\",\"fault_code\":\"A8028801,A4028801,80E18402,80E18401\",\"fault_time_and_level_map\":{\"80E18401\":{\"fault_time\":1744167455784,\"fault_level\":\"NotHandleFault\"},\"80E18402\":{\"fault_time\":1744167455784,\"fault_level\":\"SeparateNPU\"},\"A4028801\":{\"fault_time\":1744167455784,\"fault_level\":\"NotHandleFault\"},\"A8028801\":{\"fault_time\":1744167455784,\"fault_level\":\"SeparateNPU\"}}}]","huawei.com/Ascend910-NetworkUnhealthy":"Ascend910-0","huawei.com/Ascend910-Recovering":"","huawei.com/Ascend910-Unhealthy":"Ascend910-4"},"UpdateTime":1744182144},"SuperPodID":-2,"ServerIndex":-2,"CheckCode":"a550811fdfafb5717555526816af2ca4ac6c3e102f5907574048578e0c8fcc73"}`
	// No fault at all (the manual-separation page's example, fault list "[]").
	deviceInfoHealthy = `{"DeviceInfo":{"DeviceList":{"huawei.com/Ascend910":"Ascend910-1,Ascend910-2,Ascend910-3,Ascend910-4,Ascend910-5,Ascend910-6,Ascend910-7","huawei.com/Ascend910-Fault":"[]","huawei.com/Ascend910-NetworkUnhealthy":"","huawei.com/Ascend910-Unhealthy":""},"UpdateTime":1718702470},"CheckCode":"4f00cf1"}`
	nodeInfoCPU       = `{"NodeInfo":{"FaultDevList":[{"DeviceType":"CPU","DeviceId":1,"FaultCode":["00000011"],"FaultLevel":"SeparateFault"}],"NodeStatus":"UnHealthy"},"CheckCode":"3a2934c3cb875f2256c770c75a6fdf24594fcf64481ac6cd0d0f74b8fea88855"}`
)

// deviceInfoWith is a device plugin ConfigMap whose fault list has one fault on npu at level,
// with the NPU listed unhealthy or not.
func deviceInfoWith(npu, code, level string, unhealthy bool) string {
	u := ""
	if unhealthy {
		u = npu
	}
	return `{"DeviceInfo":{"DeviceList":{"huawei.com/Ascend910-Fault":"[{\"fault_type\":\"CardUnhealthy\",\"npu_name\":\"` +
		npu + `\",\"large_model_fault_level\":\"` + level + `\",\"fault_level\":\"` + level + `\",\"fault_handling\":\"` +
		level + `\",\"fault_code\":\"` + code + `\"}]","huawei.com/Ascend910-Unhealthy":"` + u + `"},"UpdateTime":1},"CheckCode":"x"}`
}

func deviceCM(node, payload string) *v1.ConfigMap {
	return &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: mcDeviceInfoNamespace, Name: mcDeviceInfoPrefix + node},
		Data: map[string]string{mcDeviceInfoKey: payload}}
}

func nodeCM(node, payload string) *v1.ConfigMap {
	return &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: mcNodeInfoNamespace, Name: mcNodeInfoPrefix + node},
		Data: map[string]string{mcNodeInfoKey: payload}}
}

func TestMindClusterLevelsMapToTheLadder(t *testing.T) {
	for _, tc := range []struct {
		level     string
		unhealthy bool
		want      mcAction
		known     bool
	}{
		{"NotHandleFault", false, mcIgnore, true},
		{"SubHealthFault", false, mcIgnore, true},
		{"RestartRequest", true, mcIgnore, true},  // recovered in place (retry for UCE/HCCL codes)
		{"RestartBusiness", true, mcIgnore, true}, // HBM UCE 80E01801: retry
		{"FreeRestartNPU", false, mcIgnore, true},
		{"FreeRestartNPU", true, mcFaulty, true},
		{"RestartNPU", false, mcFaulty, true},
		{"SeparateNPU", false, mcFaulty, true},
		{"ManuallySeparateNPU", false, mcFaulty, true},
		{"PreSeparateNPU", false, mcAvoidNew, true},
		{"NotHandleFault", true, mcIgnore, true},
		{"PreSeparateFault", false, mcAvoidNew, true},
		{"SeparateFault", false, mcFaulty, true},
		{"Healthy", false, mcIgnore, true},
		{"PreSeparate", false, mcAvoidNew, true},
		{"UnHealthy", false, mcFaulty, true},
		{"SomethingNew", false, mcAvoidNew, false},
	} {
		got, known := mindclusterAction(tc.level, tc.unhealthy)
		if got != tc.want || known != tc.known {
			t.Errorf("%s (unhealthy %v): %v known %v; want %v known %v", tc.level, tc.unhealthy, got, known, tc.want, tc.known)
		}
	}
}

func TestDeviceInfoOfMindClustersExample(t *testing.T) {
	faults, err := readDeviceInfo(deviceCM("n1", deviceInfoA3))
	if err != nil {
		t.Fatal(err)
	}
	want := []mcFault{
		{component: mcDevicePlugin, device: "Ascend910-0", codes: "81078603", level: "PreSeparateNPU", action: mcAvoidNew},
		{component: mcDevicePlugin, device: "Ascend910-4", codes: "80E18402,A8028801", level: "SeparateNPU", action: mcFaulty},
	}
	if !reflect.DeepEqual(faults, want) {
		t.Fatalf("faults %+v; want %+v", faults, want)
	}
	n := summarize(faults)
	if n.action != mcFaulty || n.reason != "MindCluster device plugin: Ascend910-4 fault 80E18402,A8028801 level SeparateNPU" {
		t.Errorf("summary %+v", n)
	}

	faults, err = readDeviceInfo(deviceCM("n1", deviceInfoHealthy))
	if err != nil || len(faults) != 0 {
		t.Errorf("a healthy node: %+v, %v; want no fault", faults, err)
	}

	// ManuallySeparateNPU, its own data key.
	cm := deviceCM("n1", deviceInfoHealthy)
	cm.Data[mcManuallySeparateKey] = "Ascend910-6, Ascend910-2"
	faults, err = readDeviceInfo(cm)
	if err != nil {
		t.Fatal(err)
	}
	if n := summarize(faults); n.action != mcFaulty || !strings.Contains(n.reason, "Ascend910-2 level ManuallySeparateNPU; ") {
		t.Errorf("manually separated: %+v", n)
	}

	// FreeRestartNPU counts only on an NPU the device plugin lists unhealthy.
	for _, unhealthy := range []bool{false, true} {
		faults, err := readDeviceInfo(deviceCM("n1", deviceInfoWith("Ascend910-3", "8C084E00", "FreeRestartNPU", unhealthy)))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := summarize(faults).action, map[bool]mcAction{false: mcIgnore, true: mcFaulty}[unhealthy]; got != want {
			t.Errorf("FreeRestartNPU, unhealthy %v: %v; want %v", unhealthy, got, want)
		}
	}
}

func TestNodeInfoOfMindClustersExample(t *testing.T) {
	faults, err := readNodeInfo(nodeCM("n1", nodeInfoCPU))
	if err != nil {
		t.Fatal(err)
	}
	n := summarize(faults)
	if n.action != mcFaulty || n.reason != "MindCluster NodeD: CPU 1 fault 00000011 level SeparateFault" {
		t.Errorf("summary %+v", n)
	}
	// NodeD creates its ConfigMap empty first.
	empty := nodeCM("n1", "")
	delete(empty.Data, mcNodeInfoKey)
	if faults, err := readNodeInfo(empty); err != nil || len(faults) != 0 {
		t.Errorf("an empty NodeD ConfigMap: %+v, %v", faults, err)
	}
	// A pre-separated node.
	faults, err = readNodeInfo(nodeCM("n1", `{"NodeInfo":{"FaultDevList":[{"DeviceType":"Memory","DeviceId":0,`+
		`"FaultCode":["0000001A"],"FaultLevel":"PreSeparateFault"}],"NodeStatus":"PreSeparate"},"CheckCode":"c"}`))
	if err != nil || summarize(faults).action != mcAvoidNew {
		t.Errorf("pre-separate: %+v, %v", faults, err)
	}
	// NodeStatus alone.
	faults, err = readNodeInfo(nodeCM("n1", `{"NodeInfo":{"FaultDevList":[],"NodeStatus":"UnHealthy"}}`))
	if err != nil || summarize(faults).action != mcFaulty {
		t.Errorf("NodeStatus UnHealthy: %+v, %v", faults, err)
	}
}

func TestMalformedMindClusterConfigMapsAreRefusedWithTheReason(t *testing.T) {
	for _, tc := range []struct {
		name string
		cm   *v1.ConfigMap
		read func(*v1.ConfigMap) ([]mcFault, error)
		want string
	}{
		{"no key", &v1.ConfigMap{Data: map[string]string{"x": "y"}}, readDeviceInfo, "no data key DeviceInfoCfg"},
		{"not JSON", deviceCM("n1", "{"), readDeviceInfo, "data key DeviceInfoCfg is not the device plugin's JSON"},
		{"no DeviceInfo", deviceCM("n1", `{"CheckCode":"x"}`), readDeviceInfo, "has no DeviceInfo object"},
		{"fault list not a list", deviceCM("n1", `{"DeviceInfo":{"DeviceList":{"huawei.com/Ascend910-Fault":"{}"}}}`),
			readDeviceInfo, `DeviceList["huawei.com/Ascend910-Fault"] is not a JSON list of faults`},
		{"fault without level", deviceCM("n1", `{"DeviceInfo":{"DeviceList":{"huawei.com/Ascend910-Fault":`+
			`"[{\"npu_name\":\"Ascend910-1\",\"fault_code\":\"1\"}]"}}}`),
			readDeviceInfo, `DeviceList["huawei.com/Ascend910-Fault"][0] (Ascend910-1) has no fault_handling`},
		{"wrong type", deviceCM("n1", `{"DeviceInfo":{"DeviceList":{"huawei.com/Ascend910-Fault":7}}}`),
			readDeviceInfo, "is not the device plugin's JSON"},
		{"NodeD not JSON", nodeCM("n1", "[1"), readNodeInfo, "data key NodeInfo is not NodeD's JSON"},
		{"NodeD no NodeInfo", nodeCM("n1", `{}`), readNodeInfo, "has no NodeInfo object"},
		{"NodeD null device", nodeCM("n1", `{"NodeInfo":{"FaultDevList":[null]}}`), readNodeInfo, "FaultDevList[0] is null"},
		{"NodeD no level", nodeCM("n1", `{"NodeInfo":{"FaultDevList":[{"DeviceType":"CPU","DeviceId":2}]}}`),
			readNodeInfo, "FaultDevList[0] (CPU 2) has no FaultLevel"},
	} {
		faults, err := tc.read(tc.cm)
		if err == nil || !strings.Contains(err.Error(), tc.want) || faults != nil {
			t.Errorf("%s: %v, %v; want an error containing %q", tc.name, faults, err, tc.want)
		}
	}
}

// staticConfigMaps is a ConfigMapSource of fixed ConfigMaps.
type staticConfigMaps []*v1.ConfigMap

func (s staticConfigMaps) ConfigMaps(_ *framework.Session, namespace string) ([]*v1.ConfigMap, error) {
	var out []*v1.ConfigMap
	for _, cm := range s {
		if cm.Namespace == namespace {
			out = append(out, cm)
		}
	}
	return out, nil
}

// A device fault at a separate level makes the node faulty through the plugin's session, read
// from a fake clientset through the informers: the job's pod there is evicted (force), the
// engine gets the reason naming the component, NPU, code and level, and the replacement is kept
// off the node. The same cluster without the ConfigMap, or with the argument off, evicts nothing.
func TestSeparateNPUFaultMakesTheNodeFaultyThroughTheSession(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cms     []*v1.ConfigMap
		off     bool
		evicted []recordedEviction
		reason  string
	}{
		{"SeparateNPU", []*v1.ConfigMap{deviceCM("n3", deviceInfoA3)}, false,
			[]recordedEviction{{"default/train-worker-2", regroup.EvictForce}},
			"MindCluster device plugin: Ascend910-4 fault 80E18402,A8028801 level SeparateNPU"},
		{"NodeD SeparateFault", []*v1.ConfigMap{nodeCM("n3", nodeInfoCPU)}, false,
			[]recordedEviction{{"default/train-worker-2", regroup.EvictForce}},
			"MindCluster NodeD: CPU 1 fault 00000011 level SeparateFault"},
		{"HBM UCE is retried, not rescheduled", []*v1.ConfigMap{
			deviceCM("n3", deviceInfoWith("Ascend910-1", "80E01801", "RestartBusiness", true))}, false, nil, ""},
		{"malformed", []*v1.ConfigMap{deviceCM("n3", "{not json")}, false, nil, ""},
		{"argument off", []*v1.ConfigMap{deviceCM("n3", deviceInfoA3)}, true, nil, ""},
		{"another namespace", []*v1.ConfigMap{func() *v1.ConfigMap {
			cm := deviceCM("n3", deviceInfoA3)
			cm.Namespace = "default"
			return cm
		}()}, false, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := runningElasticJob(t, "n5")
			if tc.off {
				w.args[argMindClusterFaults] = false
			}
			objs := make([]k8sruntime.Object, 0, len(tc.cms))
			for _, cm := range tc.cms {
				objs = append(objs, cm)
			}
			src := &InformerConfigMaps{Client: fake.NewSimpleClientset(objs...)}
			t.Cleanup(src.Close)
			w.cms = src
			w.clock.set(t0 + 1000)
			s := w.run(defaultActions())
			if got := w.rec.takeEvictions(); !reflect.DeepEqual(got, tc.evicted) {
				t.Fatalf("evictions %v; want %v", got, tc.evicted)
			}
			rt, _ := Shared()
			st := rt.nodes["n3"]
			if tc.reason == "" {
				if st.health != regroup.NodeHealthy {
					t.Errorf("n3 is %v (%s); want healthy", st.health, st.reason)
				}
				return
			}
			if st.health != regroup.NodeFaulty || st.reason != tc.reason {
				t.Errorf("n3 reported %v %q; want faulty %q", st.health, st.reason, tc.reason)
			}
			if !reflect.DeepEqual(s.released, []string{"default/train-worker-2"}) {
				t.Errorf("released %v", s.released)
			}
			// The replacement goes to the spare node, never back to n3.
			w.replace("train-worker-2")
			w.clock.set(t0 + 2000)
			s = w.run(defaultActions())
			if got := s.bound["default/train-worker-2"]; got != "n5" {
				t.Errorf("replacement bound to %q; want n5 (bound %v)", got, s.bound)
			}
			// The ladder's decision (made after the report window) names the fault: recover.
			dd, err := rt.Engine().DecisionDetail(ns + "/train")
			if err != nil {
				t.Fatal(err)
			}
			if dd.Directive.Strategy != "recover" || !strings.Contains(dd.Directive.Reason, tc.reason) {
				t.Errorf("directive %s %q; want recover naming %q", dd.Directive.Strategy, dd.Directive.Reason, tc.reason)
			}
		})
	}
}

// A pre-separated node keeps its running pods but gets no new pod of a Regroup job.
func TestPreSeparateNPUKeepsRunningPodsAndNewOnesAway(t *testing.T) {
	w := runningElasticJob(t, "n5")
	w.cms = staticConfigMaps{deviceCM("n5", deviceInfoWith("Ascend910-0", "81078603", "PreSeparateNPU", false))}
	w.clock.set(t0 + 1000)
	w.setReady("n3", v1.ConditionFalse)
	w.run(defaultActions())
	if got := w.rec.takeEvictions(); !reflect.DeepEqual(got, []recordedEviction{{"default/train-worker-2", regroup.EvictForce}}) {
		t.Fatalf("evictions %v", got)
	}
	w.replace("train-worker-2")
	w.clock.set(t0 + 2000)
	s := w.run(defaultActions())
	if got, ok := s.bound["default/train-worker-2"]; ok {
		t.Errorf("the replacement was bound to %s; n5 is pre-separated and n3 is down", got)
	}
	rt, _ := Shared()
	if st := rt.nodes["n5"]; st.health != regroup.NodeHealthy {
		t.Errorf("n5 reported %v %q; a pre-separated node stays healthy for the pods it runs", st.health, st.reason)
	}
}

// A malformed ConfigMap is logged once, not every session, and again when what is wrong changes.
func TestMalformedConfigMapIsLoggedOncePerProblem(t *testing.T) {
	w := runningElasticJob(t)
	w.cms = staticConfigMaps{deviceCM("n2", "{")}
	w.run(defaultActions())
	rt, _ := Shared()
	key := mcDeviceInfoNamespace + "/" + mcDeviceInfoPrefix + "n2"
	first := rt.mcLogged[key]
	if !strings.Contains(first, "ConfigMap kube-system/mindx-dl-deviceinfo-n2 is malformed") {
		t.Fatalf("logged %q", first)
	}
	w.cms = staticConfigMaps{deviceCM("n2", deviceInfoHealthy)}
	w.run(defaultActions())
	if got, ok := rt.mcLogged[key]; ok {
		t.Errorf("still remembered as malformed after it was fixed: %q", got)
	}
}
