// SPDX-License-Identifier: Apache-2.0

package volcano

import (
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/regroup-dev/regroup/go/regroup"
)

// nodeHealthRules say how the plugin reads a node's health: its Ready condition, a fault taint
// and a fault label (arguments regroup.faultTaint and regroup.faultLabel).
type nodeHealthRules struct {
	taint      string // a taint key that marks the node faulty ("" for none)
	labelKey   string // a label that marks the node faulty when it has labelValue ("" for none)
	labelValue string
}

// parseFaultLabel reads "key=value" (or "key", meaning any value).
func parseFaultLabel(s string) (key, value string, err error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return "", "", nil
	}
	key, value, _ = strings.Cut(s, "=")
	if key == "" {
		return "", "", fmt.Errorf("%s=%q: want a label as key=value (or key for any value)", argFaultLabel, s)
	}
	return key, value, nil
}

// health reads a node's health. A node without a Ready condition counts as healthy, as Volcano
// counts it (the scheduler's test nodes have none).
func (r nodeHealthRules) health(node *v1.Node) (regroup.NodeHealth, string) {
	if node == nil {
		return regroup.NodeUnknown, "the node object is missing"
	}
	if r.taint != "" {
		for _, t := range node.Spec.Taints {
			if t.Key == r.taint {
				return regroup.NodeFaulty, "fault taint " + t.Key
			}
		}
	}
	if r.labelKey != "" {
		if v, ok := node.Labels[r.labelKey]; ok && (r.labelValue == "" || v == r.labelValue) {
			return regroup.NodeFaulty, "fault label " + r.labelKey + "=" + v
		}
	}
	for _, c := range node.Status.Conditions {
		if c.Type != v1.NodeReady {
			continue
		}
		switch c.Status {
		case v1.ConditionFalse:
			return regroup.NodeFaulty, "NotReady" + reasonSuffix(c.Reason)
		case v1.ConditionUnknown:
			return regroup.NodeUnknown, "Ready condition Unknown" + reasonSuffix(c.Reason)
		}
	}
	return regroup.NodeHealthy, ""
}

func reasonSuffix(reason string) string {
	if reason == "" {
		return ""
	}
	return ": " + reason
}
