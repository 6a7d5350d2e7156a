// SPDX-License-Identifier: Apache-2.0

package volcano

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/regroup-dev/regroup/go/regroup"
)

func TestNodeHealth(t *testing.T) {
	rules := nodeHealthRules{taint: "regroup.io/faulty", labelKey: "regroup.io/health", labelValue: "faulty"}
	ready := func(s v1.ConditionStatus) []v1.NodeCondition {
		return []v1.NodeCondition{{Type: v1.NodeReady, Status: s, Reason: "R"}}
	}
	for _, tc := range []struct {
		name   string
		node   *v1.Node
		want   regroup.NodeHealth
		reason string
	}{
		{"no object", nil, regroup.NodeUnknown, "the node object is missing"},
		{"no conditions", &v1.Node{}, regroup.NodeHealthy, ""},
		{"ready", &v1.Node{Status: v1.NodeStatus{Conditions: ready(v1.ConditionTrue)}}, regroup.NodeHealthy, ""},
		{"not ready", &v1.Node{Status: v1.NodeStatus{Conditions: ready(v1.ConditionFalse)}}, regroup.NodeFaulty, "NotReady: R"},
		{"unknown", &v1.Node{Status: v1.NodeStatus{Conditions: ready(v1.ConditionUnknown)}}, regroup.NodeUnknown, "Ready condition Unknown: R"},
		{"fault taint", &v1.Node{Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: "regroup.io/faulty", Effect: v1.TaintEffectPreferNoSchedule}}}},
			regroup.NodeFaulty, "fault taint regroup.io/faulty"},
		{"fault label", &v1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"regroup.io/health": "faulty"}}},
			regroup.NodeFaulty, "fault label regroup.io/health=faulty"},
		{"label, other value", &v1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"regroup.io/health": "ok"}}},
			regroup.NodeHealthy, ""},
	} {
		h, reason := rules.health(tc.node)
		if h != tc.want || reason != tc.reason {
			t.Errorf("%s: %v %q; want %v %q", tc.name, h, reason, tc.want, tc.reason)
		}
	}
}

func TestParseFaultLabel(t *testing.T) {
	for _, tc := range []struct {
		in, key, value string
		ok             bool
	}{
		{"", "", "", true},
		{"a=b", "a", "b", true},
		{"a", "a", "", true},
		{"=b", "", "", false},
	} {
		k, v, err := parseFaultLabel(tc.in)
		if (err == nil) != tc.ok || k != tc.key || v != tc.value {
			t.Errorf("parseFaultLabel(%q) = %q, %q, %v", tc.in, k, v, err)
		}
	}
}
