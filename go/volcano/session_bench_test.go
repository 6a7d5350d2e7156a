// SPDX-License-Identifier: Apache-2.0

package volcano

// The plugin's cost per scheduling session: 1,000 Regroup jobs of 8 pods on 10,000 nodes, one
// session (open, the shipped configuration's actions, close) through Volcano's framework and a
// real scheduler cache, with and without the plugin. bench/volcano/run runs it; the figures are in
// bench/volcano/README.md.

import (
	"strconv"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	schedulingv1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"
	"volcano.sh/volcano/pkg/scheduler/api"
	"volcano.sh/volcano/pkg/scheduler/cache"
	"volcano.sh/volcano/pkg/scheduler/conf"
	"volcano.sh/volcano/pkg/scheduler/framework"
	"volcano.sh/volcano/pkg/scheduler/uthelper"
	"volcano.sh/volcano/pkg/scheduler/util"
)

const (
	benchNodes       = 10_000
	benchJobs        = 1_000
	benchPodsPerJob  = 8
	benchPendingJobs = 10 // jobs with a replacement pod that fits nowhere: predicates every session
	benchFaultyNodes = 10
)

// benchSize is the cluster's size: in -short mode (bench/smoke, which checks only that the
// benchmark runs and reports) a tenth of it.
func benchSize() (nodes, jobs int) {
	if testing.Short() {
		return benchNodes / 10, benchJobs / 10
	}
	return benchNodes, benchJobs
}

// benchCluster builds a scheduler cache holding the cluster: every job running on its own 8
// nodes, benchPendingJobs of them with a pending replacement too large for any node, and
// benchFaultyNodes free nodes carrying the fault label.
func benchCluster(b *testing.B) (*cache.SchedulerCache, chan struct{}) {
	b.Helper()
	nodes, jobs := benchSize()
	sc := cache.NewCustomMockSchedulerCache("volcano", util.NewFakeBinder(jobs*benchPodsPerJob),
		util.NewFakeEvictor(jobs*benchPodsPerJob), &util.FakeStatusUpdater{}, nil, &record.FakeRecorder{})
	stop := make(chan struct{})
	sc.Run(stop)
	sc.WaitForCacheSync(stop)
	sc.AddQueueV1beta1(util.BuildQueue("default", 1, nil))
	for i := 0; i < nodes; i++ {
		n := util.BuildNode("node-"+strconv.Itoa(i), api.BuildResourceList("8", "32Gi",
			api.ScalarResource{Name: "pods", Value: "110"}), map[string]string{})
		if i >= nodes-benchFaultyNodes {
			n.Labels["regroup.io/health"] = "faulty"
		}
		sc.AddOrUpdateNode(n)
	}
	labels, annotations := elasticKeys()
	for j := 0; j < jobs; j++ {
		name := "job-" + strconv.Itoa(j)
		pg := util.BuildPodGroup(name+"-pg", ns, "default", 2, nil, schedulingv1beta1.PodGroupRunning)
		pg.Labels, pg.Annotations = copyMap(labels), copyMap(annotations)
		pg.UID = types.UID("pg-" + name)
		pg.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch.volcano.sh/v1alpha1", Kind: "Job",
			Name: name, UID: types.UID("job-" + name)}}
		sc.AddPodGroupV1beta1(pg)
		for i := 0; i < benchPodsPerJob; i++ {
			node := "node-" + strconv.Itoa(j*benchPodsPerJob+i)
			sc.AddPod(benchPod(name, i, node, "8", "-a"))
		}
		if j < benchPendingJobs {
			sc.AddPod(benchPod(name, 0, "", "100", "-b"))
		}
	}
	return sc, stop
}

func benchPod(job string, index int, node, cpu, incarnation string) *v1.Pod {
	phase := v1.PodRunning
	if node == "" {
		phase = v1.PodPending
	}
	name := job + "-worker-" + strconv.Itoa(index)
	p := util.BuildPod(ns, name, node, phase, api.BuildResourceList(cpu, "1Gi"), job+"-pg",
		map[string]string{}, map[string]string{})
	p.UID = types.UID(name + incarnation)
	p.Annotations[taskSpecKey] = "worker"
	p.Annotations[taskIndexKey] = strconv.Itoa(index)
	p.Annotations[jobNameKey] = job
	return p
}

func BenchmarkSession1000Jobs10000Nodes(b *testing.B) {
	ResetShared()
	b.Cleanup(ResetShared)
	sc, stop := benchCluster(b)
	defer close(stop)
	clk := &clock{ms: t0}
	rec := newRecorder()
	opts := Options{Now: clk.Now, States: rec, Events: rec, Evictor: rec}
	uthelper.RegisterPlugins(builders(opts))
	b.Cleanup(framework.CleanupPluginBuilders)
	actions := defaultActions()
	conf.EnabledActionMap = map[string]bool{}
	for _, a := range actions {
		conf.EnabledActionMap[a.Name()] = true
	}
	session := func(tiers []conf.Tier) {
		ssn := framework.OpenSession(sc, tiers, nil)
		for _, a := range actions {
			a.Initialize()
			a.Execute(ssn)
			a.UnInitialize()
		}
		framework.CloseSession(ssn)
	}
	for _, tc := range []struct {
		name    string
		regroup bool
	}{{"without-regroup", false}, {"with-regroup", true}} {
		tiers := loadTiersB(b, tc.regroup)
		session(tiers) // the first session upserts every job and reports every pod
		b.Run(tc.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				clk.set(clk.ms + 1000)
				session(tiers)
			}
		})
	}
	// The plugin's OnSessionOpen alone, on a session opened without it.
	tiers := loadTiersB(b, false)
	b.Run("regroup-OnSessionOpen", func(b *testing.B) {
		ssn := framework.OpenSession(sc, tiers, nil)
		defer framework.CloseSession(ssn)
		p := newPlugin(testArgs(), opts)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			clk.set(clk.ms + 1000)
			p.OnSessionOpen(ssn)
			p.OnSessionClose(ssn)
		}
	})
	rt, err := Shared()
	if err != nil {
		b.Fatal(err)
	}
	if _, jobs := benchSize(); len(rt.jobs) != jobs {
		b.Fatalf("the engine holds %d jobs; want %d", len(rt.jobs), jobs)
	}
	for id, r := range rt.jobs {
		if !r.valid {
			b.Fatalf("job %s is invalid: %s", id, r.invalid)
		}
	}
}

func loadTiersB(b *testing.B, withRegroup bool) []conf.Tier {
	return loadTiers(b, withRegroup, testArgs())
}
