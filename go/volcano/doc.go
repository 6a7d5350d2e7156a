// SPDX-License-Identifier: Apache-2.0

// Package volcano is Regroup's Volcano scheduler plugin, registered as "regroup": it drives the
// decision engine of libregroup (through the cgo binding, package regroup) from Volcano's
// scheduling sessions and applies its decisions to the cluster.
//
// # A session
//
// Volcano builds a new plugin for every session; the engine, the coordinator and what the plugin
// last told the engine outlive it in a process-wide [Runtime] ([Shared], shared.go; tests call
// [ResetShared]). In OnSessionOpen the plugin
//
//   - upserts every job whose PodGroup carries Regroup or MindCluster keys (the library says which:
//     regroup.JobHasKeys), restoring the job's state from the PodGroup annotation
//     [StateAnnotation] the first time this process sees it. The job spec is the library's reading
//     (regroup.ReadVolcanoJob, the reader of regroupctl and regroup-manager --job) of the Volcano
//     Job the session shows: the PodGroup's labels, annotations and minMember, and one task per
//     role with the replicas seen and a pod's containers as its template. The library is asked
//     again only when that Volcano Job changes;
//   - reports the pods of those jobs and the node health that changed (a Ready condition False or
//     Unknown, the fault taint, the fault label, a fault at a "separate" level that MindCluster's
//     Ascend Device Plugin or NodeD publishes: mindcluster.go, docs/mindcluster-faults.md), then
//     ticks the engine at the plugin's clock (Unix milliseconds, the coordinator's clock) and
//     publishes new directives to the managers;
//   - evicts what the engine says (fault-scheduling force: at once, grace period 0; grace: the
//     pod's grace period; off: never) and writes changed states back to the PodGroups.
//
// Then it registers: job validation (the engine's message for a bad Regroup key; a MindCluster
// fallback is a warning event), job readiness and pipelining against the engine's gang minimum
// (the whole job at full size, the current generation when scaled in), starving (a job that
// wants pods starves until it has them all), a predicate that keeps a job's pods off unhealthy
// and avoided nodes, and its new pods off the nodes MindCluster pre-separates
// (UnschedulableAndUnresolvable: preemption cannot make a faulty node healthy), node order (a
// pod's previous node, then a node of its replica), and preemption and reclaim guards that never
// take a job below its gang minimum nor its manager.
//
// A job without Regroup or MindCluster keys gets no answer from any hook that would change its
// scheduling: the plugin abstains, or answers as gang does (starving).
//
// # Conventions
//
// A job's minAvailable is its elastic minimum, or every pod as MindCluster has it (the engine
// refuses a value in between): Volcano ANDs JobReady across plugins, so gang with a full-size
// minMember would stop a scaled-in job, and Volcano's job controller resets minMember to the
// Job's minAvailable. So once an every-pod job runs, the plugin lowers the Job's minAvailable to
// the elastic minimum (JobPatcher), and the job controller carries it into the PodGroup.
//
// The engine's job id is "namespace/name" of the Volcano Job (from the PodGroup's owner), as
// regroupctl and regroup-manager name it. A pod's index (node rank) is its task index, tasks in
// the order "master" first, then by name; the library says which tasks run the manager (counted
// apart). A task never shrinks: a pod deleted and not yet created again changes neither the job's
// size nor another pod's node rank.
//
// The scheduler build is cmd/regroup-scheduler; deploy/README.md shows how to install it.
package volcano
