// SPDX-License-Identifier: Apache-2.0

package volcano

// MindCluster's fault reports, read as its own components publish them (docs/mindcluster-faults.md
// says where each name, key and level was verified in MindCluster's sources):
//
//   - the Ascend Device Plugin writes ConfigMap kube-system/mindx-dl-deviceinfo-<node>: data key
//     DeviceInfoCfg holds {"DeviceInfo":{"DeviceList":{...},"UpdateTime":...},"CheckCode":...};
//     DeviceList's "huawei.com/<chip>-Fault" entry is a JSON list (as a string) of the node's NPU
//     faults with their handling level, "-Unhealthy" and "-NetworkUnhealthy" list NPU names; data
//     key ManuallySeparateNPU lists the NPUs it isolated after repeated faults;
//   - NodeD writes ConfigMap mindx-dl/mindx-dl-nodeinfo-<node>: data key NodeInfo holds
//     {"NodeInfo":{"FaultDevList":[{DeviceType, DeviceId, FaultCode, FaultLevel}],"NodeStatus":...},
//     "CheckCode":...}.
//
// Each session the plugin reads both kinds and maps every fault's level to what the recovery
// ladder does with it (mindclusterAction): a "separate" level makes the node faulty, as a
// NotReady node is (its pods are replaced: `recover`, then the rest of the ladder); a
// "pre-separate" level keeps new pods of Regroup jobs off the node and leaves the running ones;
// the restart levels (RestartRequest, RestartBusiness) leave the node healthy, since the process
// that hit them is recovered in place (`retry` for an HBM UCE or HCCL retry code,
// `recover-in-place` otherwise) from the manager's report of the failed step or process.

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"volcano.sh/volcano/pkg/scheduler/framework"
)

// Where MindCluster's components publish their fault reports.
const (
	mcDeviceInfoNamespace = "kube-system"          // Ascend Device Plugin
	mcDeviceInfoPrefix    = "mindx-dl-deviceinfo-" // + node name
	mcDeviceInfoKey       = "DeviceInfoCfg"
	mcManuallySeparateKey = "ManuallySeparateNPU"
	mcNodeInfoNamespace   = "mindx-dl"           // NodeD
	mcNodeInfoPrefix      = "mindx-dl-nodeinfo-" // + node name
	mcNodeInfoKey         = "NodeInfo"

	mcDevicePlugin = "MindCluster device plugin"
	mcNodeD        = "MindCluster NodeD"
)

// mcAction is what a MindCluster fault does to a node, in increasing severity.
type mcAction int

const (
	mcIgnore   mcAction = iota // no scheduling action (NotHandleFault, SubHealthFault, the restart levels)
	mcAvoidNew                 // running pods stay; new pods of Regroup jobs go elsewhere (pre-separate)
	mcFaulty                   // the node is faulty: its pods are replaced (separate)
)

// mindclusterAction maps a device plugin fault level (fault_handling, fault_level or
// large_model_fault_level) or a NodeD FaultLevel to its action. unhealthy says the device plugin
// also lists the NPU as unhealthy (FreeRestartNPU stops the NPU's work only then, as ClusterD
// counts it). known is false for a level MindCluster does not document; the caller treats it as
// pre-separate (keep new pods off, never evict on a guess).
func mindclusterAction(level string, unhealthy bool) (action mcAction, known bool) {
	switch level {
	case "NotHandleFault", "SubHealthFault", "NotHandle", "Healthy":
		return mcIgnore, true
	case "RestartRequest", "RestartBusiness":
		// L2/L3: the business is re-executed on the same NPU; ClusterD restarts the process in
		// place (or retries the step for UCE and HCCL retry codes). In Regroup the manager gets
		// the failed process or collective from its agents and climbs the ladder from there.
		return mcIgnore, true
	case "FreeRestartNPU":
		if unhealthy {
			return mcFaulty, true
		}
		return mcIgnore, true
	case "RestartNPU", "SeparateNPU", "ManuallySeparateNPU", "SeparateFault", "UnHealthy":
		return mcFaulty, true
	case "PreSeparateNPU", "PreSeparateFault", "PreSeparate":
		return mcAvoidNew, true
	}
	return mcAvoidNew, false
}

// mcFault is one fault a component reports.
type mcFault struct {
	component string // mcDevicePlugin or mcNodeD
	device    string // "Ascend910-4", "CPU 1"; "" for the node
	codes     string
	level     string
	action    mcAction
	unknown   bool // a level MindCluster does not document
}

func (f mcFault) String() string {
	s := f.component + ": "
	if f.device != "" {
		s += f.device + " "
	}
	if f.codes != "" {
		s += "fault " + f.codes + " "
	}
	s += "level " + f.level
	if f.unknown {
		s += " (not a documented MindCluster level: treated as pre-separate)"
	}
	return s
}

// deviceInfoCM is the device plugin's DeviceInfoCfg.
type deviceInfoCM struct {
	DeviceInfo *struct {
		DeviceList map[string]string `json:"DeviceList"`
		UpdateTime int64             `json:"UpdateTime"`
	} `json:"DeviceInfo"`
	CheckCode string `json:"CheckCode"`
}

// npuFault is one entry of DeviceList["huawei.com/<chip>-Fault"].
type npuFault struct {
	FaultType            string `json:"fault_type"`
	NPUName              string `json:"npu_name"`
	LargeModelFaultLevel string `json:"large_model_fault_level"`
	FaultLevel           string `json:"fault_level"`
	FaultHandling        string `json:"fault_handling"`
	FaultCode            string `json:"fault_code"`
	FaultTimeAndLevelMap map[string]struct {
		FaultTime  int64  `json:"fault_time"`
		FaultLevel string `json:"fault_level"`
	} `json:"fault_time_and_level_map"`
}

// level is the fault's handling level: MindCluster documents the three fields as equivalent and
// recommends fault_handling.
func (f npuFault) level() string {
	for _, l := range []string{f.FaultHandling, f.FaultLevel, f.LargeModelFaultLevel} {
		if l != "" {
			return l
		}
	}
	return ""
}

// codesAt names the fault's codes that are at its level (fault_time_and_level_map gives each
// code's own level), else all of them.
func (f npuFault) codesAt(level string) string {
	var at []string
	for code, tl := range f.FaultTimeAndLevelMap {
		if tl.FaultLevel == level {
			at = append(at, code)
		}
	}
	if len(at) == 0 {
		return f.FaultCode
	}
	sort.Strings(at)
	return strings.Join(at, ",")
}

// nodeInfoCM is NodeD's NodeInfo.
type nodeInfoCM struct {
	NodeInfo *struct {
		FaultDevList []*struct {
			DeviceType string   `json:"DeviceType"`
			DeviceId   int64    `json:"DeviceId"`
			FaultCode  []string `json:"FaultCode"`
			FaultLevel string   `json:"FaultLevel"`
		} `json:"FaultDevList"`
		NodeStatus string `json:"NodeStatus"`
	} `json:"NodeInfo"`
	CheckCode string `json:"CheckCode"`
}

func splitNames(s string) map[string]bool {
	out := map[string]bool{}
	for _, n := range strings.Split(s, ",") {
		if n = strings.TrimSpace(n); n != "" {
			out[n] = true
		}
	}
	return out
}

// readDeviceInfo reads a device plugin ConfigMap's faults. An error says what is wrong with it;
// the ConfigMap is then not used at all.
func readDeviceInfo(cm *v1.ConfigMap) ([]mcFault, error) {
	raw, ok := cm.Data[mcDeviceInfoKey]
	if !ok {
		return nil, fmt.Errorf("no data key %s", mcDeviceInfoKey)
	}
	var info deviceInfoCM
	if err := json.Unmarshal([]byte(raw), &info); err != nil {
		return nil, fmt.Errorf("data key %s is not the device plugin's JSON: %v", mcDeviceInfoKey, err)
	}
	if info.DeviceInfo == nil {
		return nil, fmt.Errorf("data key %s has no DeviceInfo object", mcDeviceInfoKey)
	}
	unhealthy := map[string]bool{}
	keys := make([]string, 0, len(info.DeviceInfo.DeviceList))
	for k, v := range info.DeviceInfo.DeviceList {
		keys = append(keys, k)
		if strings.HasSuffix(k, "-Unhealthy") {
			for n := range splitNames(v) {
				unhealthy[n] = true
			}
		}
	}
	sort.Strings(keys)
	var out []mcFault
	for _, k := range keys {
		if !strings.HasSuffix(k, "-Fault") {
			continue
		}
		v := strings.TrimSpace(info.DeviceInfo.DeviceList[k])
		if v == "" {
			continue
		}
		var faults []npuFault
		if err := json.Unmarshal([]byte(v), &faults); err != nil {
			return nil, fmt.Errorf("data key %s: DeviceList[%q] is not a JSON list of faults: %v", mcDeviceInfoKey, k, err)
		}
		for i, f := range faults {
			level := f.level()
			if level == "" {
				if f.FaultType == "NodeUnhealthy" {
					// A node fault: the device plugin leaves the level empty.
					out = append(out, mcFault{component: mcDevicePlugin, codes: f.FaultCode,
						level: "NodeUnhealthy", action: mcFaulty})
					continue
				}
				return nil, fmt.Errorf("data key %s: DeviceList[%q][%d] (%s) has no fault_handling, fault_level "+
					"or large_model_fault_level", mcDeviceInfoKey, k, i, f.NPUName)
			}
			action, known := mindclusterAction(level, unhealthy[f.NPUName])
			out = append(out, mcFault{component: mcDevicePlugin, device: f.NPUName, codes: f.codesAt(level),
				level: level, action: action, unknown: !known})
		}
	}
	names := splitNames(cm.Data[mcManuallySeparateKey])
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	for _, n := range sorted {
		out = append(out, mcFault{component: mcDevicePlugin, device: n, level: "ManuallySeparateNPU", action: mcFaulty})
	}
	return out, nil
}

// readNodeInfo reads a NodeD ConfigMap's faults. NodeD creates the ConfigMap empty first: no
// NodeInfo key is no fault.
func readNodeInfo(cm *v1.ConfigMap) ([]mcFault, error) {
	raw, ok := cm.Data[mcNodeInfoKey]
	if !ok || strings.TrimSpace(raw) == "" {
		return nil, nil
	}
	var info nodeInfoCM
	if err := json.Unmarshal([]byte(raw), &info); err != nil {
		return nil, fmt.Errorf("data key %s is not NodeD's JSON: %v", mcNodeInfoKey, err)
	}
	if info.NodeInfo == nil {
		return nil, fmt.Errorf("data key %s has no NodeInfo object", mcNodeInfoKey)
	}
	var out []mcFault
	for i, d := range info.NodeInfo.FaultDevList {
		if d == nil {
			return nil, fmt.Errorf("data key %s: FaultDevList[%d] is null", mcNodeInfoKey, i)
		}
		if d.FaultLevel == "" {
			return nil, fmt.Errorf("data key %s: FaultDevList[%d] (%s %d) has no FaultLevel", mcNodeInfoKey, i,
				d.DeviceType, d.DeviceId)
		}
		action, known := mindclusterAction(d.FaultLevel, false)
		out = append(out, mcFault{component: mcNodeD, device: d.DeviceType + " " + strconv.FormatInt(d.DeviceId, 10),
			codes: strings.Join(d.FaultCode, ","), level: d.FaultLevel, action: action, unknown: !known})
	}
	// NodeStatus is the worst level's node state; it says it alone when the list was trimmed.
	if s := info.NodeInfo.NodeStatus; s != "" {
		action, known := mindclusterAction(s, false)
		if action > worst(out) || !known {
			out = append(out, mcFault{component: mcNodeD, level: "NodeStatus " + s, action: action, unknown: !known})
		}
	}
	return out, nil
}

func worst(faults []mcFault) mcAction {
	w := mcIgnore
	for _, f := range faults {
		if f.action > w {
			w = f.action
		}
	}
	return w
}

// mcNode is what MindCluster's reports say about one node.
type mcNode struct {
	action mcAction
	reason string
}

// maxReasonFaults bounds the faults a node's reason names.
const maxReasonFaults = 3

// summarize gives the node's action and a reason naming the faults at that action.
func summarize(faults []mcFault) mcNode {
	w := worst(faults)
	if w == mcIgnore {
		return mcNode{}
	}
	var parts []string
	more := 0
	for _, f := range faults {
		if f.action != w {
			continue
		}
		if len(parts) < maxReasonFaults {
			parts = append(parts, f.String())
		} else {
			more++
		}
	}
	reason := strings.Join(parts, "; ")
	if more > 0 {
		reason += fmt.Sprintf("; and %d more", more)
	}
	return mcNode{action: w, reason: reason}
}

// ConfigMapSource gives the ConfigMaps of a namespace as the session should see them.
type ConfigMapSource interface {
	ConfigMaps(ssn *framework.Session, namespace string) ([]*v1.ConfigMap, error)
}

// InformerConfigMaps watches ConfigMaps through informers scoped to each namespace asked for,
// started on first use (a session waits up to SyncTimeout for the first list; one that is not
// synced yet reads nothing from that namespace and says so).
type InformerConfigMaps struct {
	// Client to watch with; nil: the session's KubeClient (informers restart when it changes).
	Client      kubernetes.Interface
	SyncTimeout time.Duration // default 5 s

	mu      sync.Mutex
	bound   kubernetes.Interface
	stop    chan struct{}
	listers map[string]*nsLister
}

type nsLister struct {
	lister corelisters.ConfigMapLister
	synced func() bool
}

// ConfigMaps implements ConfigMapSource.
func (s *InformerConfigMaps) ConfigMaps(ssn *framework.Session, namespace string) ([]*v1.ConfigMap, error) {
	client := s.Client
	if client == nil && ssn != nil {
		client = ssn.KubeClient()
	}
	if client == nil {
		return nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bound != client {
		s.closeLocked()
		s.bound, s.stop, s.listers = client, make(chan struct{}), map[string]*nsLister{}
	}
	l := s.listers[namespace]
	if l == nil {
		f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(namespace))
		inf := f.Core().V1().ConfigMaps()
		l = &nsLister{lister: inf.Lister(), synced: inf.Informer().HasSynced}
		s.listers[namespace] = l
		f.Start(s.stop)
		timeout := s.SyncTimeout
		if timeout <= 0 {
			timeout = 5 * time.Second
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		cache.WaitForCacheSync(ctx.Done(), l.synced)
		cancel()
	}
	if !l.synced() {
		return nil, fmt.Errorf("the ConfigMaps of namespace %s are not listed yet (can the scheduler's "+
			"service account list and watch configmaps there?)", namespace)
	}
	return l.lister.ConfigMaps(namespace).List(labels.Everything())
}

// Close stops the informers.
func (s *InformerConfigMaps) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closeLocked()
}

func (s *InformerConfigMaps) closeLocked() {
	if s.stop != nil {
		close(s.stop)
	}
	s.bound, s.stop, s.listers = nil, nil, nil
}

// defaultConfigMaps is the scheduler's source: it outlives sessions, as the informers must.
var defaultConfigMaps = &InformerConfigMaps{}

// readMindCluster reads both components' ConfigMaps and says, per node of the session, what
// their faults do. A ConfigMap that cannot be read is logged (once per change of what is wrong)
// and skipped; it never fails the session.
func (p *plugin) readMindCluster(ssn *framework.Session) map[string]mcNode {
	src := p.opts.ConfigMaps
	out := map[string]mcNode{}
	faults := map[string][]mcFault{}
	seen := map[string]bool{}
	for _, kind := range []struct {
		namespace, prefix string
		read              func(*v1.ConfigMap) ([]mcFault, error)
	}{
		{mcDeviceInfoNamespace, mcDeviceInfoPrefix, readDeviceInfo},
		{mcNodeInfoNamespace, mcNodeInfoPrefix, readNodeInfo},
	} {
		cms, err := src.ConfigMaps(ssn, kind.namespace)
		if err != nil {
			p.logMindCluster("namespace "+kind.namespace, fmt.Sprintf("regroup: MindCluster fault reports in "+
				"namespace %s are not read this session: %v", kind.namespace, err))
			continue
		}
		p.logMindCluster("namespace "+kind.namespace, "")
		for _, cm := range cms {
			if cm == nil || !strings.HasPrefix(cm.Name, kind.prefix) {
				continue
			}
			node := strings.TrimPrefix(cm.Name, kind.prefix)
			if _, ok := ssn.Nodes[node]; !ok {
				continue
			}
			key := cm.Namespace + "/" + cm.Name
			seen[key] = true
			fs, err := kind.read(cm)
			if err != nil {
				p.logMindCluster(key, fmt.Sprintf("regroup: ConfigMap %s is malformed and is ignored (node %s keeps "+
					"the health the other sources give): %v", key, node, err))
				continue
			}
			p.logMindCluster(key, "")
			for _, f := range fs {
				if f.unknown {
					klog.V(2).Infof("regroup: ConfigMap %s: %s", key, f)
				}
			}
			faults[node] = append(faults[node], fs...)
		}
	}
	for key := range p.rt.mcLogged {
		if !seen[key] && strings.Contains(key, "/") {
			delete(p.rt.mcLogged, key)
		}
	}
	for node, fs := range faults {
		if n := summarize(fs); n.action != mcIgnore {
			out[node] = n
		}
	}
	return out
}

// logMindCluster logs msg as an error when it differs from what was last logged for key; ""
// clears it.
func (p *plugin) logMindCluster(key, msg string) {
	if p.rt.mcLogged == nil {
		p.rt.mcLogged = map[string]string{}
	}
	if p.rt.mcLogged[key] == msg {
		return
	}
	if msg == "" {
		delete(p.rt.mcLogged, key)
		return
	}
	p.rt.mcLogged[key] = msg
	klog.Error(msg)
}
