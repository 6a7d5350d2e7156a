// SPDX-License-Identifier: Apache-2.0

// Command localsched runs Volcano's scheduler framework continuously over fake clientsets, with
// the Regroup plugin registered, for the local integration cluster (integration/volcano_loop.py).
//
// It plays the API server's bookkeeping (uids, timestamps, the default queue) and the Volcano job
// controller (PodGroup and pods of a Volcano Job; a failed or evicted pod is created again). It
// runs no process: the harness is the kubelet. The two talk in JSON lines:
//
//	stdin:  {"op":"add_node","name":"node-0","cpu":"8","memory":"32Gi","pods":110,"resources":{"huawei.com/Ascend910":"8"}}
//	        {"op":"node_ready","name":"node-1","ready":false,"reason":"..."}
//	        {"op":"submit","file":"/path/job.yaml"}
//	        {"op":"pod_phase","pod":"default/mlp-worker-1","uid":"...","phase":"Running","exit_code":0}
//	        {"op":"configmap","namespace":"kube-system","name":"mindx-dl-deviceinfo-node-1","data":{...}}
//	        {"op":"quit"}
//	stdout: {"event":"ready","coordinator":"10.0.0.1:41234"}
//	        {"event":"bind","pod":"default/mlp-worker-1","uid":"...","node":"node-2","task":"worker","index":1,"job":"default/mlp","job_uid":"..."}
//	        {"event":"evict","pod":...,"uid":...,"reason":...}
//	        {"event":"job_invalid","job":"default/mlp","message":"..."}
//	        {"event":"plugin_event", ...}, {"event":"warning","message":...}, {"event":"error","message":...}
//
// Logs go to stderr.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"k8s.io/klog/v2"
)

func main() {
	var (
		listen     = flag.String("coordinator-listen", "127.0.0.1:0", "where the plugin's coordinator listens (host:port; port 0 picks one); \"off\" for none")
		credential = flag.String("credential-file", "", "the coordinator's credential file (the plugin's regroup.credentialFile)")
		confFile   = flag.String("scheduler-conf", "", "a volcano-scheduler.conf (default: the built-in one, regroup beside gang)")
		period     = flag.Duration("period", 200*time.Millisecond, "the scheduling period")
		sessions   = flag.Bool("session-events", false, "print a {\"event\":\"session\"} line after every session")
	)
	klog.InitFlags(nil) // -v sets the log's verbosity (stderr); default 1
	_ = flag.Set("v", "1")
	flag.Parse()

	if *listen != "off" && *credential == "" {
		// The plugin starts no coordinator without a credential: the loop would wait for it forever.
		fmt.Fprintln(os.Stderr, "localsched: -credential-file is required while the coordinator listens (-coordinator-listen off for none)")
		os.Exit(2)
	}
	conf := defaultSchedulerConf
	if *confFile != "" {
		b, err := os.ReadFile(*confFile)
		if err != nil {
			fmt.Fprintf(os.Stderr, "localsched: %v\n", err)
			os.Exit(2)
		}
		conf = string(b)
	}
	l, err := NewLoop(Config{
		SchedulerConf:     conf,
		CoordinatorListen: *listen,
		CredentialFile:    *credential,
		Period:            *period,
		SessionEvents:     *sessions,
		Out:               os.Stdout,
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "localsched: %v\n", err)
		os.Exit(2)
	}
	l.Run(os.Stdin)
	l.Close()
	klog.Flush()
}
