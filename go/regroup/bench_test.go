// SPDX-License-Identifier: Apache-2.0

package regroup

import (
	"fmt"
	"testing"
	"time"
)

// The cluster of BenchmarkSession: 1,000 jobs of 8 pods (8 processes each) on 10,000 nodes, one
// node in every faultyEvery faulty (1000: a normal session, 8 jobs want pods; 100: a fault storm,
// 80 jobs want pods). Job j's pod p runs on node 8j+p, so nodes 8,000 and up host no pod.
const (
	benchJobs  = 1000
	benchPods  = 8
	benchNodes = 10000
)

type benchCluster struct {
	faultyEvery int
	e           *Engine
	jobs        []string
	uids        [][]string // [job][pod]
	nodes       []string
}

func (c *benchCluster) podNode(j, p int) string { return c.nodes[j*benchPods+p] }

func (c *benchCluster) nodeFaulty(n int) bool { return n%c.faultyEvery == 42 }

func newBenchCluster(b *testing.B, faultyEvery int) *benchCluster {
	b.Helper()
	c := &benchCluster{faultyEvery: faultyEvery, e: newEngine(b, Options{})}
	for n := range benchNodes {
		c.nodes = append(c.nodes, fmt.Sprintf("node-%05d", n))
		health := NodeHealthy
		if c.nodeFaulty(n) {
			health = NodeFaulty
		}
		if err := c.e.SetNodeHealth(c.nodes[n], health, "", 0); err != nil {
			b.Fatal(err)
		}
	}
	for j := range benchJobs {
		id := fmt.Sprintf("team-%d/job-%04d", j%10, j)
		spec := fmt.Sprintf(`{"id":%q,"uid":"uid-%04d","labels":{"fault-scheduling":"force"},`+
			`"annotations":{"recover-strategy":"recover,elastic-training","wait-reschedule-timeout":"30"},`+
			`"pods":%d,"processes_per_pod":8}`, id, j, benchPods)
		if _, err := c.e.UpsertJob([]byte(spec), 0); err != nil {
			b.Fatal(err)
		}
		c.jobs = append(c.jobs, id)
		uids := make([]string, benchPods)
		for p := range benchPods {
			uids[p] = fmt.Sprintf("j%04d-pod-%d", j, p)
		}
		c.uids = append(c.uids, uids)
	}
	return c
}

// sessionTimes is where one session spends its time.
type sessionTimes struct {
	nodes, pods, tick, decisions, filter time.Duration
	wanting                              int // jobs that want pods (filtered)
}

// session runs one scheduling session at nowMs, as the Volcano plugin does: every node's health,
// every job's pods, a tick, every job's decision, and the node predicate for the jobs that want
// pods. One free node's health flips each session so that some health really changes.
// With useList the node names are copied to C once per session (a NodeList) instead of once per
// filtered job.
func (c *benchCluster) session(b *testing.B, nowMs int64, t *sessionTimes, useList bool) {
	start := time.Now()
	flip := benchJobs*benchPods + int(nowMs/1000)%(benchNodes-benchJobs*benchPods)
	for n, node := range c.nodes {
		health := NodeHealthy
		if c.nodeFaulty(n) || (n == flip && nowMs/1000%2 == 0) {
			health = NodeFaulty
		}
		if err := c.e.SetNodeHealth(node, health, "", nowMs); err != nil {
			b.Fatal(err)
		}
	}
	mark := time.Now()
	t.nodes += mark.Sub(start)
	start = mark

	for j, job := range c.jobs {
		for p := range benchPods {
			err := c.e.SetPodState(job, uint32(p), c.uids[j][p], PodRunning, c.podNode(j, p), nowMs)
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	mark = time.Now()
	t.pods += mark.Sub(start)
	start = mark

	if _, err := c.e.Tick(nowMs); err != nil {
		b.Fatal(err)
	}
	mark = time.Now()
	t.tick += mark.Sub(start)
	start = mark

	wanting := make([]string, 0, 128)
	for _, job := range c.jobs {
		d, err := c.e.Decision(job)
		if err != nil {
			b.Fatal(err)
		}
		if d.WantsPods {
			wanting = append(wanting, job)
		}
	}
	mark = time.Now()
	t.decisions += mark.Sub(start)
	start = mark

	var list *NodeList
	if useList {
		var err error
		if list, err = NewNodeList(c.nodes); err != nil {
			b.Fatal(err)
		}
		defer list.Close()
	}
	for _, job := range wanting {
		var ok []bool
		var err error
		if useList {
			ok, err = c.e.FilterNodeList(job, list)
		} else {
			ok, err = c.e.FilterNodes(job, c.nodes)
		}
		if err != nil {
			b.Fatal(err)
		}
		if ok[42] {
			b.Fatalf("job %s may run on faulty node %s", job, c.nodes[42])
		}
	}
	t.filter += time.Since(start)
	t.wanting += len(wanting)
}

// BenchmarkSession is one scheduling session for 1,000 jobs (8 pods of 8 processes each) on
// 10,000 nodes, through cgo, in a normal session and in a fault storm. ns/op is one session.
func BenchmarkSession(b *testing.B) { benchmarkSessions(b, false) }

// BenchmarkSessionNodeList is BenchmarkSession with the node names copied to C once per session.
func BenchmarkSessionNodeList(b *testing.B) { benchmarkSessions(b, true) }

func benchmarkSessions(b *testing.B, useList bool) {
	b.Run("faulty=0.1%", func(b *testing.B) { benchmarkSession(b, useList, 1000) })
	b.Run("faulty=1%", func(b *testing.B) { benchmarkSession(b, useList, 100) })
}

func benchmarkSession(b *testing.B, useList bool, faultyEvery int) {
	c := newBenchCluster(b, faultyEvery)
	// Warm-up: the faults are seen (1 s), decided (2 s: wait 30 s for replacements) and the
	// waits expire (40 s: scale in), so the measured sessions find the jobs in a steady state.
	var warm sessionTimes
	for _, now := range []int64{1000, 2000, 40000} {
		c.session(b, now, &warm, useList)
	}
	now := int64(41000)
	if warm.wanting == 0 {
		b.Fatal("no job wants pods: the benchmark would not filter nodes")
	}
	var t sessionTimes
	sessions := 0
	for b.Loop() {
		c.session(b, now, &t, useList)
		now += 1000
		sessions++
	}
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(sessions) / 1e6 }
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(sessions)/1e6, "ms/session")
	b.ReportMetric(per(t.nodes), "ms-nodes/session")
	b.ReportMetric(per(t.pods), "ms-pods/session")
	b.ReportMetric(per(t.tick), "ms-tick/session")
	b.ReportMetric(per(t.decisions), "ms-decisions/session")
	b.ReportMetric(per(t.filter), "ms-filter/session")
	b.ReportMetric(float64(t.wanting)/float64(sessions), "filtered-jobs/session")
}

// BenchmarkDecision is one job's tick and typed decision.
func BenchmarkDecision(b *testing.B) {
	e := newEngine(b, Options{})
	startDemo(b, e, "2")
	now := int64(0)
	for b.Loop() {
		now += 100
		if _, err := e.Tick(now); err != nil {
			b.Fatal(err)
		}
		if _, err := e.Decision(demoJob); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecisionDetail is one job's decision as JSON, decoded.
func BenchmarkDecisionDetail(b *testing.B) {
	e := newEngine(b, Options{})
	startDemo(b, e, "2")
	failNode3(b, e)
	for b.Loop() {
		if _, err := e.DecisionDetail(demoJob); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFilterNodes is the predicate of one job over 10,000 nodes.
func BenchmarkFilterNodes(b *testing.B) {
	c := newBenchCluster(b, 100)
	for b.Loop() {
		if _, err := c.e.FilterNodes(c.jobs[0], c.nodes); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFilterNodeList is the predicate of one job over a NodeList of 10,000 nodes: the
// library's own share of FilterNodes.
func BenchmarkFilterNodeList(b *testing.B) {
	c := newBenchCluster(b, 100)
	list, err := NewNodeList(c.nodes)
	if err != nil {
		b.Fatal(err)
	}
	defer list.Close()
	for b.Loop() {
		if _, err := c.e.FilterNodeList(c.jobs[0], list); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSetPodState is one unchanged pod report, the bulk of a session's calls.
func BenchmarkSetPodState(b *testing.B) {
	e := newEngine(b, Options{})
	startDemo(b, e, "2")
	for b.Loop() {
		if err := e.SetPodState(demoJob, 2, "p2", PodRunning, "n2", 0); err != nil {
			b.Fatal(err)
		}
	}
}
