// SPDX-License-Identifier: Apache-2.0
// The job's pods as the manager knows them, by pod index (the agent's node rank): registration
// and sessions, what their agents last reported, their liveness, the pod uids fenced for good,
// and the ports their hosts reported free for a generation's store. The job control reads them
// and changes them only through this class.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"
#include "manager/rank_layout.h"
#include "manager/silence_bound.h"
#include "regroup/v1/wire.pb.h"

namespace regroup::manager {

namespace v1 = ::regroup::v1;

enum class AgentState { kRegistered, kActive, kStandby, kLost, kLeaving, kDone };

// One pod's agent, as last heard.
struct Agent {
  uint64_t stream = 0;
  bool connected = false;
  std::string pod_uid;
  std::string pod_name;
  std::string node_name;  // the Kubernetes node
  std::string host;
  uint32_t nproc = 0;
  std::vector<uint32_t> free_ports;       // free on `host` as last reported, none given out
  AgentState state = AgentState::kRegistered;
  // Connected, and neither lost, leaving nor done: it can be told to run processes.
  bool usable() const {
    return connected && state != AgentState::kLost && state != AgentState::kLeaving &&
           state != AgentState::kDone;
  }
  int64_t last_seen_ms = 0;
  SilenceBound silence;                   // how long its silence may last (its beats' past)
  std::vector<v1::LocalRank> ranks;       // as last reported, by local rank
  std::vector<SilenceBound> rank_silence; // each trainer's, from the beat ages reported
  std::vector<int64_t> step_since_ms;     // when each local rank's step last changed
  std::set<uint32_t> restarting;          // local ranks restarted in place, not back yet
  int64_t restart_ms = -1;                // since when `restarting` is seen before a generation
  std::set<uint32_t> failed;              // local ranks that exited with an error, not restarted
  // Local ranks declared hung (a HANG fault), by the pid of the process that hung, until it is
  // restarted: a frozen process is a failed one that has not exited (it may never).
  std::map<uint32_t, int32_t> hung;
  std::set<uint32_t> finished;            // local ranks that finished training (exit 0)
  uint32_t last_generation_agents = 0;
  uint64_t aborted_through = 0;           // the latest generation whose abort it was sent
};

// A rank's state as an agent reports it: steps within [-1, kMaxStep] and a local rank the pod
// has. The error names what is wrong.
Status CheckRanks(const google::protobuf::RepeatedPtrField<v1::LocalRank>& ranks, uint32_t nproc);

// Said of a silence bound longer than the liveness timeout (silence_bound.h).
std::string Stretched(int64_t bound, int64_t liveness);

class Pods {
 public:
  // A pod or a rank found silent or stuck, and why.
  struct Finding {
    int64_t index = -1;  // the pod (FirstSilent) or the global rank (FirstHang)
    int64_t step = -1;
    std::string why;
    int64_t since_ms = -1;  // the last sign of health the manager had (-1: not known)
  };

  Pods(int64_t count, int64_t liveness_ms) : agents_(static_cast<size_t>(count)),
                                             liveness_ms_(liveness_ms) {}

  size_t size() const { return agents_.size(); }
  const Agent& operator[](int64_t pod) const { return agents_[static_cast<size_t>(pod)]; }
  const std::vector<Agent>& all() const { return agents_; }

  // --- Registration and sessions ---
  // The pod a registered stream belongs to, or -1.
  int64_t PodOf(uint64_t stream) const;
  // The first pod index free for a pod that names none (never registered, or lost), or -1.
  int64_t FreeIndex() const;
  // Takes in a registration on `stream` as pod `pod`, in `state`: what its agent reports
  // replaces what was known; a session resumed keeps what its beats taught.
  void Admit(int64_t pod, uint64_t stream, const v1::Register& reg, AgentState state,
             int64_t now);
  // A message of the pod arrived now: its silence ended.
  void Heard(int64_t pod, int64_t now);
  void Heartbeat(int64_t pod, const v1::Heartbeat& hb, int64_t now);
  // The stream ended: the pod it belonged to, if it was that pod's current stream.
  std::optional<int64_t> Disconnect(uint64_t stream);

  // Every process of the pod is alive, has said hello to its agent (a generation formed before
  // would leave the survivors waiting in its rendezvous) and is not restarting.
  bool Ready(int64_t pod) const;
  // The same of one process.
  bool RankReady(int64_t pod, uint32_t local) const;

  // --- What the job control changes ---
  void SetState(int64_t pod, AgentState state) { agents_[static_cast<size_t>(pod)].state = state; }
  // A process is reported dead.
  void Died(int64_t pod, uint32_t local) {
    agents_[static_cast<size_t>(pod)].ranks[local].set_alive(false);
  }
  // A process exited: `clean` (exit 0) finished training, else it failed.
  void Exited(int64_t pod, uint32_t local, bool clean);
  // The local ranks restarted in place: restarting until they are back, no longer failed, hung
  // nor finished.
  void Restarting(int64_t pod, const std::vector<uint32_t>& locals);
  // Since when each pod's `restarting` is seen (before a generation forms).
  void NoteRestartsSeen(int64_t now);
  // The pod's ranks are at their step since `now` (a new generation, a wait that was the
  // manager's); one local rank, or all of them.
  void StepClockFrom(int64_t pod, int64_t now);
  void StepClockFrom(int64_t pod, uint32_t local, int64_t now);
  void AbortedThrough(int64_t pod, uint64_t generation) {
    agents_[static_cast<size_t>(pod)].aborted_through = generation;
  }
  // The manager ran nothing for `stall` ms: that time is not counted against any pod.
  void ForgiveStall(int64_t stall);

  // --- Liveness ---
  // Whether the process of `local` marked hung beats again (its beat age within its bound), or
  // is another process.
  bool BeatsAgain(const Agent& a, uint32_t local, int64_t now) const;
  // The first pod silent past its bound: active ones, and connected standbys and registered
  // pods (a broken stream of theirs is a fault at once).
  std::optional<Finding> FirstSilent(int64_t now) const;
  // The first rank of the running generation `layout` (number `generation`) that holds it up
  // past the hang timeout: one that never entered it, a frozen one (marked hung), one that left
  // it (paused), or one stuck at its step. `commit_held`: the step voted for waits for the lease
  // (a wait that is the manager's, not the ranks').
  std::optional<Finding> FirstHang(const RankLayout& layout, uint64_t generation, int64_t hang_ms,
                                   bool commit_held, int64_t now);

  // --- Pod uids fenced for good ---
  bool IsFenced(const std::string& uid) const { return lost_uids_.count(uid) > 0; }
  bool MustBeReplaced(const std::string& uid) const { return replace_uids_.count(uid) > 0; }
  // A pod uid that must never take part again; false when it already was (or is empty). The
  // oldest are forgotten past JobRecord::kMaxLost.
  bool Forget(const std::string& uid);
  void MustReplace(const std::string& uid) { replace_uids_.insert(uid); }
  // The uids forgotten, oldest first (the durable record's `lost`).
  const std::vector<std::string>& lost() const { return lost_; }

  // --- Store ports ---
  // The store port of the next generation (number `generation`), hosted by pod `host`.
  uint32_t TakeStorePort(int64_t host, uint64_t generation);

 private:
  template <typename Message>
  void NoteFreePorts(Agent& agent, const Message& report);
  bool RecentStore(const std::string& host, uint32_t port) const;
  Finding Outside(const RankLayout& layout, size_t rank, uint64_t generation, int64_t hang_ms,
                  int64_t now) const;
  struct RankBeatBound {
    int64_t allowed_ms;   // how long the rank may go without a beat
    int64_t liveness_ms;  // its liveness bound (stretched for beats that lately came late)
    bool ran;             // its process ran lately: late, not frozen
  };
  RankBeatBound RankBeat(const Agent& agent, uint32_t local, int64_t hang_ms, int64_t now) const;

  std::vector<Agent> agents_;               // by pod index
  int64_t liveness_ms_;
  std::unordered_map<uint64_t, int64_t> stream_pod_;  // stream -> pod index (every message)
  std::set<std::string> lost_uids_;         // pods that were lost: zombies if they return
  std::set<std::string> replace_uids_;      // of those, the ones that must be replaced
  std::vector<std::string> lost_;           // lost_uids_, oldest first
  // (host, port) of the latest generations' stores: never given again while one may be up (its
  // ranks hold it until they leave), nor taken from a report that predates its bind.
  std::deque<std::pair<std::string, uint32_t>> store_ports_;
};

}  // namespace regroup::manager
