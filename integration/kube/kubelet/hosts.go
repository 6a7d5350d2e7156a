// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"os"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// clusterDomain is the DNS domain of the names in hosts files.
const clusterDomain = "cluster.local"

// hostsFile renders a pod's /etc/hosts, the stand-in for cluster DNS (this cluster has neither
// kube-proxy nor a DNS server). Besides localhost and the pod's own names it maps:
//   - every Service with a selector to the IP of the oldest ready pod it selects, in place of its
//     ClusterIP (so it works where the Service's port is the pod's port);
//   - for a headless Service, each selected pod with spec.hostname whose spec.subdomain is the
//     Service to that pod's IP (not-ready pods too when publishNotReadyAddresses is set).
//
// Short names (<svc>, <hostname>.<svc>) are listed only in pods of the Service's namespace, as
// the resolver's search path would only complete them there. glibc rereads /etc/hosts on every
// lookup, so rewriting the file moves a name.
func hostsFile(pod *v1.Pod, podIP string, pods []*v1.Pod, services []*v1.Service) string {
	var b strings.Builder
	line := func(ip string, names ...string) { fmt.Fprintf(&b, "%s\t%s\n", ip, strings.Join(names, " ")) }
	b.WriteString("# Kubernetes-managed hosts file (regroup-kubelet).\n")
	line("127.0.0.1", "localhost")
	line("::1", "localhost", "ip6-localhost", "ip6-loopback")
	host := podHostname(pod)
	if sub := pod.Spec.Subdomain; sub != "" {
		fq := host + "." + sub + "." + pod.Namespace + ".svc"
		line(podIP, fq+"."+clusterDomain, fq, host+"."+sub, host)
	} else {
		line(podIP, host)
	}
	for _, alias := range pod.Spec.HostAliases {
		line(alias.IP, alias.Hostnames...)
	}

	services = append([]*v1.Service(nil), services...)
	sort.Slice(services, func(i, j int) bool {
		if services[i].Namespace != services[j].Namespace {
			return services[i].Namespace < services[j].Namespace
		}
		return services[i].Name < services[j].Name
	})
	for _, svc := range services {
		if len(svc.Spec.Selector) == 0 || svc.Spec.Type == v1.ServiceTypeExternalName {
			continue
		}
		selector := labels.SelectorFromSet(svc.Spec.Selector)
		var selected []*v1.Pod
		for _, p := range pods {
			if p.Namespace == svc.Namespace && p.Status.PodIP != "" && !isTerminal(p.Status.Phase) && selector.Matches(labels.Set(p.Labels)) {
				selected = append(selected, p)
			}
		}
		sort.Slice(selected, func(i, j int) bool { return olderPod(selected[i], selected[j]) })
		sameNS := svc.Namespace == pod.Namespace
		fq := svc.Name + "." + svc.Namespace + ".svc"
		for _, p := range selected {
			if podReady(p) {
				names := []string{fq + "." + clusterDomain, fq, svc.Name + "." + svc.Namespace}
				if sameNS {
					names = append(names, svc.Name)
				}
				line(p.Status.PodIP, names...)
				break
			}
		}
		if svc.Spec.ClusterIP != v1.ClusterIPNone {
			continue
		}
		sort.SliceStable(selected, func(i, j int) bool { return selected[i].Spec.Hostname < selected[j].Spec.Hostname })
		for _, p := range selected {
			if p.Spec.Hostname == "" || p.Spec.Subdomain != svc.Name || !(podReady(p) || svc.Spec.PublishNotReadyAddresses) {
				continue
			}
			pfq := p.Spec.Hostname + "." + fq
			names := []string{pfq + "." + clusterDomain, pfq}
			if sameNS {
				names = append(names, p.Spec.Hostname+"."+svc.Name)
			}
			line(p.Status.PodIP, names...)
		}
	}
	return b.String()
}

// podReady is what makes a pod a ready endpoint: its Ready condition, and not being deleted.
func podReady(p *v1.Pod) bool {
	if p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

// olderPod orders pods by start time, then name.
func olderPod(a, b *v1.Pod) bool {
	ta, tb := a.Status.StartTime, b.Status.StartTime
	switch {
	case ta != nil && tb != nil && !ta.Equal(tb):
		return ta.Before(tb)
	case ta != nil && tb == nil:
		return true
	case ta == nil && tb != nil:
		return false
	}
	return a.Name < b.Name
}

// writeHostsFile replaces the file's content in place: it is bind-mounted by inode into the
// containers, so it must never be renamed over.
func writeHostsFile(path, content string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(content)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
