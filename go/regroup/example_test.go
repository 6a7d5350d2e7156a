// SPDX-License-Identifier: Apache-2.0

package regroup_test

import (
	"fmt"
	"log"

	"github.com/regroup-dev/regroup/go/regroup"
)

// A node of a job fails: the job waits for a replacement, then scales in at the deadline.
func Example() {
	eng, err := regroup.New(regroup.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer eng.Close()

	job := []byte(`{"id":"default/demo","uid":"u1","labels":{"fault-scheduling":"force"},
		"annotations":{"recover-strategy":"recover,elastic-training","wait-reschedule-timeout":"30",
		"regroup.io/tensor-parallel":"2"},"pods":4,"processes_per_pod":2}`)
	if _, err := eng.UpsertJob(job, 0); err != nil {
		log.Fatal(err)
	}
	for i := range uint32(4) {
		node := fmt.Sprintf("n%d", i)
		if err := eng.SetPodState("default/demo", i, fmt.Sprintf("p%d", i), regroup.PodRunning, node, 0); err != nil {
			log.Fatal(err)
		}
	}
	if err := eng.SetNodeHealth("n3", regroup.NodeFaulty, "NotReady", 1000); err != nil {
		log.Fatal(err)
	}
	for _, now := range []int64{1300, 31300} {
		if _, err := eng.Tick(now); err != nil {
			log.Fatal(err)
		}
		d, err := eng.DecisionDetail("default/demo")
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%d: %s (%s) dp=%d removed=%v evict=%v\n", now, d.Directive.Kind,
			d.Directive.Strategy, d.DP, d.Directive.RemoveReplicas, d.Scheduler.Evict)
	}
	ok, err := eng.FilterNodes("default/demo", []string{"n2", "n3", "n4"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("n2, n3, n4 allowed:", ok)

	_, err = eng.Decision("default/other")
	fmt.Println(regroup.StatusOf(err))
	// Output:
	// 1300: wait (recover) dp=4 removed=[] evict=[{3 p3 n3 force}]
	// 31300: scale_in (elastic-training) dp=3 removed=[3] evict=[{3 p3 n3 force}]
	// n2, n3, n4 allowed: [true false true]
	// REGROUP_NOT_FOUND
}
