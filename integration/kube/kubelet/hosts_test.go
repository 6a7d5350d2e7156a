// SPDX-License-Identifier: Apache-2.0

package main

import (
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// hostPod is a pod at ip, started at minute start, ready or not.
func hostPod(ns, name, ip string, start int, ready bool, labels map[string]string) *v1.Pod {
	status := v1.ConditionFalse
	if ready {
		status = v1.ConditionTrue
	}
	t := metav1.NewTime(time.Date(2026, 1, 1, 0, start, 0, 0, time.UTC))
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Status: v1.PodStatus{Phase: v1.PodRunning, PodIP: ip, StartTime: &t,
			Conditions: []v1.PodCondition{{Type: v1.PodReady, Status: status}}},
	}
}

func service(ns, name string, headless bool, selector map[string]string) *v1.Service {
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: v1.ServiceSpec{Selector: selector, ClusterIP: "10.96.0.10"}}
	if headless {
		svc.Spec.ClusterIP = v1.ClusterIPNone
	}
	return svc
}

// hostsLines is the hosts file as "ip names" lines, without the comment.
func hostsLines(text string) []string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(text), "\n") {
		if !strings.HasPrefix(l, "#") {
			out = append(out, strings.ReplaceAll(l, "\t", " "))
		}
	}
	return out
}

func expectLines(t *testing.T, text string, want ...string) {
	t.Helper()
	got := hostsLines(text)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("hosts file:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestHostsMapsAServiceToItsOldestReadyPod(t *testing.T) {
	app := map[string]string{"app": "manager"}
	self := hostPod("train", "client", "10.0.0.9", 0, true, nil)
	pods := []*v1.Pod{
		hostPod("train", "m-young", "10.0.0.2", 5, true, app),
		hostPod("train", "m-old-unready", "10.0.0.3", 1, false, app),
		hostPod("train", "m-old", "10.0.0.4", 2, true, app),
		hostPod("other", "m-elsewhere", "10.0.0.5", 0, true, app), // another namespace: not selected
	}
	services := []*v1.Service{service("train", "manager", false, app), service("train", "no-selector", false, nil),
		service("train", "nobody-ready", false, map[string]string{"app": "none"})}
	expectLines(t, hostsFile(self, "10.0.0.9", pods, services),
		"127.0.0.1 localhost",
		"::1 localhost ip6-localhost ip6-loopback",
		"10.0.0.9 client",
		"10.0.0.4 manager.train.svc.cluster.local manager.train.svc manager.train manager",
	)
	// From another namespace the short name does not resolve.
	other := hostPod("default", "x", "10.0.0.8", 0, true, nil)
	if text := hostsFile(other, "10.0.0.8", pods, services); !strings.Contains(text, "10.0.0.4\tmanager.train.svc.cluster.local manager.train.svc manager.train\n") {
		t.Errorf("from namespace default:\n%s", text)
	}
}

func TestHostsListsAHeadlessServicesPodsByHostname(t *testing.T) {
	job := map[string]string{"volcano.sh/job-name": "mlp"}
	worker := func(name, host, ip string, ready bool) *v1.Pod {
		p := hostPod("train", name, ip, 0, ready, job)
		p.Spec.Hostname, p.Spec.Subdomain = host, "mlp"
		return p
	}
	self := worker("mlp-worker-0", "mlp-worker-0", "10.0.0.1", true)
	pods := []*v1.Pod{self, worker("mlp-worker-1", "mlp-worker-1", "10.0.0.2", false),
		hostPod("train", "no-hostname", "10.0.0.3", 0, true, job)}
	svc := service("train", "mlp", true, job)

	// Without publishNotReadyAddresses only ready pods are listed.
	expectLines(t, hostsFile(self, "10.0.0.1", pods, []*v1.Service{svc}),
		"127.0.0.1 localhost",
		"::1 localhost ip6-localhost ip6-loopback",
		"10.0.0.1 mlp-worker-0.mlp.train.svc.cluster.local mlp-worker-0.mlp.train.svc mlp-worker-0.mlp mlp-worker-0",
		"10.0.0.1 mlp.train.svc.cluster.local mlp.train.svc mlp.train mlp",
		"10.0.0.1 mlp-worker-0.mlp.train.svc.cluster.local mlp-worker-0.mlp.train.svc mlp-worker-0.mlp",
	)
	// Volcano's svc plugin sets publishNotReadyAddresses: every pod with an IP is listed.
	svc.Spec.PublishNotReadyAddresses = true
	text := hostsFile(self, "10.0.0.1", pods, []*v1.Service{svc})
	if !strings.Contains(text, "10.0.0.2\tmlp-worker-1.mlp.train.svc.cluster.local mlp-worker-1.mlp.train.svc mlp-worker-1.mlp\n") {
		t.Errorf("the not-ready pod is missing:\n%s", text)
	}
	if strings.Contains(text, "10.0.0.3") {
		t.Errorf("a pod without hostname/subdomain is listed:\n%s", text)
	}
	// From another namespace, no <hostname>.<svc> short form.
	other := hostPod("default", "x", "10.0.0.8", 0, true, nil)
	if text := hostsFile(other, "10.0.0.8", pods, []*v1.Service{svc}); strings.Contains(text, " mlp-worker-1.mlp\n") {
		t.Errorf("short form listed in another namespace:\n%s", text)
	}
}

func TestHostsSkipsTerminatingAndFinishedPods(t *testing.T) {
	app := map[string]string{"app": "a"}
	deleting := hostPod("ns", "deleting", "10.0.0.2", 0, true, app)
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	done := hostPod("ns", "done", "10.0.0.3", 0, true, app)
	done.Status.Phase = v1.PodSucceeded
	text := hostsFile(hostPod("ns", "self", "10.0.0.1", 0, true, nil), "10.0.0.1", []*v1.Pod{deleting, done}, []*v1.Service{service("ns", "a", false, app)})
	if strings.Contains(text, "10.0.0.2") || strings.Contains(text, "10.0.0.3") {
		t.Errorf("terminating or finished pods listed:\n%s", text)
	}
}
