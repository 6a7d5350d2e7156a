// SPDX-License-Identifier: Apache-2.0
// Deterministic simulation of Regroup's control protocol, in the spirit of FoundationDB's
// simulator and TigerBeetle's VOPR.
//
// One seeded scheduler drives the real manager job control (manager/job_control.h, with the
// engine embedded as in standalone mode) and every agent's own code (agent/agent_core.h: the
// session with the manager, epochs, resumes, readmission, votes, stopping), each pod its host,
// with simulated trainers speaking the trainer protocol (a hello, heartbeats, a vote per step,
// following start, outcome, abort, pause and stop), a simulated network of ordered streams, and
// a simulated clock. Nothing reads the wall clock or a socket, so a seed replays exactly.
//
// Faults drawn from the seed: a trainer crash, an agent killed (its pod replaced), an agent
// paused (SIGSTOP) or a link cut for a while, one connection reset, a slow link, a manager crash
// and restart, a manager paused (0.1 to 12 s), a trainer paused (0.2 s to 40 s: past the hang
// timeout, its rank is frozen), a second manager started beside the running one (new sessions
// reach either; the older runs on for 1 to 30 s; the durable record they share and the majority
// rule must keep one of them committing); on a menu only, a second manager started without a
// record (unrecorded_manager: its command line is refused). After every event the invariants below are checked;
// the first one broken ends the run with its seed, its time and the last events of the trace.
//
// With Options::coordinator the coordinator decides, as under Volcano: the scheduler's engine and
// the coordinator's attachment logic (plugin/attachments.h) run beside the managers, which attach
// over links of their own (manager/attach_core.h), are granted their epochs there and commit only
// under its lease; the scheduler reports pods to its engine, ticks it every second, saves the
// job's state (through the coordinator) when its directive or a pod uid changed, and evicts what
// the engine gives up. More faults: the coordinator crashes (the scheduler restarts: a new engine
// from the saved state, a coordinator that knows no lease), is paused (SIGSTOP of the scheduler,
// 0.1 to 25 s: what reaches it waits, its engine does not tick, its next session reports the
// pods as it finds them then, past the keepalive every link ends), or one manager is cut off from
// it; a second manager's elder is cut off from it half the time, so only its lease stops its
// commits.
//
// Invariants (docs/design.md, "Generations, fencing and the step commit"):
//  - membership: one membership per generation: a global rank of (epoch, generation) is held by
//    one pod, and a node rank by one pod uid;
//  - fencing: once an incarnation decided a commit, no older one decides another (two running
//    side by side included);
//  - commits never go backwards: no trainer is told to resume before a step it heard committed
//    (standbys included, across manager restarts);
//  - a plan that names the generation that committed its step names the one that did (across
//    manager restarts too: the ranks report it);
//  - a pod the manager declared lost is told so and stops, or is readmitted, within a bound
//    (5 s once it and the manager run and reach each other; its agent's stop grace, 45 s, once
//    it stops);
//  - a replacement is never refused for a pod that is lost, or gone with its end read by the
//    manager;
//  - liveness: after the last fault, with capacity back, the job finishes, or stops for a reason
//    its configuration allows, within a bound; it never hangs;
//  - bounds: what the manager queues, and its event log, stay bounded.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace regroup::sim {

struct Options {
  uint64_t seed = 1;
  int faults = -1;                 // how many faults; -1: drawn from the seed (0 to 6)
  int64_t fault_window_ms = 60000;   // faults happen within this much simulated time
  int64_t quiet_bound_ms = 400000;   // after it, the job must end within this much
  std::vector<std::string> menu;   // fault kinds to draw from; empty: all (see FaultKinds)
  bool trace = false;              // print every event as it happens
  // The coordinator decides, as under Volcano: the scheduler's engine and the coordinator's
  // attachment logic (plugin/attachments.h) run beside the managers, which attach over links of
  // their own (AttachCore), are granted their epochs there and commit only under its lease; the
  // scheduler reports the pods to its engine. No durable record: the coordinator fences. Its
  // faults join the menu (CoordinatorFaultKinds).
  bool coordinator = false;
  // The launcher of an unrecorded_manager fault passes --no-record (the job accepts the risk of
  // a second manager training beside the first): the manager starts, fenced by nothing.
  bool accept_no_record = false;
};

struct Result {
  bool ok = true;
  std::string violation;            // the invariant broken, with its facts
  int64_t at_ms = 0;                // simulated time of the violation (or of the end)
  std::string setup;                // the job and the faults drawn from the seed
  std::string outcome;              // how the job ended
  uint64_t commits = 0;             // commit outcomes delivered, summed over pods
  uint64_t events = 0;              // events the scheduler ran
  uint64_t aborts = 0;              // generations the manager aborted
  uint64_t superseded = 0;          // incarnations that learned a newer one formed a generation
  // Generations that committed a step although, at some position of a replica, none of their
  // ranks held the state they resumed from: the real trainers' census (python/regroup/sync.py)
  // would have failed them (a StateSyncError, then the ladder). A measure of what the simulated
  // trainers do not model (docs/membership.md, "Not yet true"), not an invariant.
  uint64_t census_gaps = 0;
  // Generations the manager did not form because, by the ranks' reports, none of their ranks
  // would hold the state at some position (a state_lost fault: the job goes to the checkpoint).
  // Each is a checkpoint the job pays for; where the simulated ranks did hold it, a needless one.
  uint64_t state_lost = 0;
  // Pods declared lost on the store host's word that their ranks had not reached a forming
  // generation's store, with their streams broken (TrainerFault.missing_ranks).
  uint64_t lost_by_the_stores_word = 0;
  // Manager starts regroup-manager's command line refused (an unrecorded_manager fault: a
  // standalone manager without --record or --no-record).
  uint64_t refused_starts = 0;
  std::vector<std::string> trace;   // the last events before a violation
};

// The fault kinds a run draws from.
const std::vector<std::string>& FaultKinds();
// Kinds a --menu may name that no default menu draws (so that every seed found before they were
// added keeps its course): kill_agent_at_plan, a pod's node dies as the next plan that gives it
// ranks reaches it (before its ranks reach the generation's store); unrecorded_manager, a second
// manager started standalone as a launcher that gives no --record starts one. regroup-manager's
// own command line (manager/options.h) decides whether it runs: refused, unless
// Options::accept_no_record passes --no-record; then it runs beside the first with no record, and
// nothing fences either.
const std::vector<std::string>& MenuOnlyFaultKinds();
// With a coordinator: those, a crash of the coordinator (the scheduler restarts; its engine comes
// back from the state it last saved), a cut between one manager and the coordinator, and a pause
// of the scheduler (last: a menu without it draws as before it was added).
const std::vector<std::string>& CoordinatorFaultKinds();

// Runs one seed to the end: the job finished or stopped, or an invariant broke.
Result Run(const Options& options);

// The command that replays `options`' run, printing every event.
std::string ReplayLine(const Options& options);

}  // namespace regroup::sim
