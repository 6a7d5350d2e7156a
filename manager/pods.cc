// SPDX-License-Identifier: Apache-2.0
#include "manager/pods.h"

#include <algorithm>

#include "manager/job_record.h"
#include "plugin/engine.h"

namespace regroup::manager {

namespace {

// Steps beyond this are refused: no job runs 10^15 steps, and arithmetic on them stays safe.
constexpr int64_t kMaxStep = 1'000'000'000'000'000;

// Store ports: how many of an agent's reported free ports are kept (an agent reports 4), and how
// many of the latest stores' ports are never given out again.
constexpr size_t kMaxFreePorts = 16;
constexpr size_t kRecentStorePorts = 64;

bool Started(const v1::LocalRank& r) {
  return r.phase() != v1::PHASE_STARTING && r.phase() != v1::PHASE_UNSPECIFIED;
}

}  // namespace

Status CheckRanks(const google::protobuf::RepeatedPtrField<v1::LocalRank>& ranks, uint32_t nproc) {
  for (const auto& r : ranks) {
    if (r.local_rank() >= nproc)
      return InvalidArgument("local rank " + std::to_string(r.local_rank()) +
                             " is out of range: the pod runs " + std::to_string(nproc));
    for (int64_t step : {r.step(), r.committed_step(), r.heard_commit_step()})
      if (step < -1 || step > kMaxStep)
        return InvalidArgument("local rank " + std::to_string(r.local_rank()) + " reports step " +
                               std::to_string(step) + ", outside -1 to " +
                               std::to_string(kMaxStep));
  }
  return Status::Ok();
}

std::string Stretched(int64_t bound, int64_t liveness) {
  if (bound <= liveness) return "";
  return "; its timeout was " + std::to_string(bound) +
         " ms, stretched from the liveness timeout for beats that lately came late";
}

int64_t Pods::PodOf(uint64_t stream) const {
  auto it = stream_pod_.find(stream);
  return it == stream_pod_.end() ? -1 : it->second;
}

int64_t Pods::FreeIndex() const {
  for (size_t n = 0; n < agents_.size(); ++n)
    if (!agents_[n].connected &&
        (agents_[n].pod_uid.empty() || agents_[n].state == AgentState::kLost))
      return static_cast<int64_t>(n);
  return -1;
}

void Pods::Admit(int64_t pod, uint64_t stream, const v1::Register& reg, AgentState state,
                 int64_t now) {
  Agent& a = agents_[static_cast<size_t>(pod)];
  if (a.connected) stream_pod_.erase(a.stream);  // the same pod on a new stream
  // A pod readmitted (a new incarnation of its uid) keeps the processes it had: one declared
  // hung is still that process.
  if (PodOfUid(a.pod_uid) != PodOfUid(reg.pod_uid())) a.hung.clear();
  // A new pod starts with the configured timeout; a session resumed keeps what its beats taught.
  if (a.pod_uid != reg.pod_uid() || a.nproc != reg.nproc()) {
    a.silence.Reset();
    a.rank_silence.assign(reg.nproc(), SilenceBound());
  }
  a.stream = stream;
  a.connected = true;
  a.pod_uid = reg.pod_uid();
  a.pod_name = reg.pod_name();
  a.node_name = reg.node_name();
  a.host = reg.host();
  a.nproc = reg.nproc();
  NoteFreePorts(a, reg);
  a.last_seen_ms = now;
  a.last_generation_agents = reg.last_generation_agents();
  a.restarting.clear();
  a.ranks.assign(a.nproc, v1::LocalRank());
  a.step_since_ms.assign(a.nproc, now);
  for (uint32_t l = 0; l < a.nproc; ++l) {
    a.ranks[l].set_local_rank(l);
    a.ranks[l].set_alive(true);
    a.ranks[l].set_committed_step(-1);
    a.ranks[l].set_heard_commit_step(-1);
  }
  a.failed.clear();
  a.finished.clear();
  for (const auto& r : reg.ranks()) {
    if (r.local_rank() >= a.nproc) continue;
    a.ranks[r.local_rank()] = r;
    // A process that died before this manager heard of it (a manager restart in between).
    if (!r.alive() && r.phase() != v1::PHASE_DONE && r.pid() > 0) a.failed.insert(r.local_rank());
    if (!r.alive() && r.phase() == v1::PHASE_DONE) a.finished.insert(r.local_rank());
  }
  for (auto it = a.hung.begin(); it != a.hung.end();)
    it = a.ranks[it->first].alive() && !BeatsAgain(a, it->first, now) ? std::next(it)
                                                                       : a.hung.erase(it);
  a.state = state;
  stream_pod_[stream] = pod;
}

bool Pods::Ready(int64_t pod) const {
  const Agent& a = agents_[static_cast<size_t>(pod)];
  if (!a.usable() || !a.restarting.empty()) return false;
  for (const auto& r : a.ranks)
    if (!r.alive() || !Started(r)) return false;
  return a.ranks.size() == a.nproc;
}

bool Pods::RankReady(int64_t pod, uint32_t local) const {
  const Agent& a = agents_[static_cast<size_t>(pod)];
  if (!a.usable() || a.restarting.count(local) || a.ranks.size() != a.nproc) return false;
  return a.ranks[local].alive() && Started(a.ranks[local]);
}

void Pods::Heard(int64_t pod, int64_t now) {
  Agent& a = agents_[static_cast<size_t>(pod)];
  a.silence.Ended(now - a.last_seen_ms, now);
  a.last_seen_ms = now;
}

void Pods::Heartbeat(int64_t pod, const v1::Heartbeat& hb, int64_t now) {
  Agent& a = agents_[static_cast<size_t>(pod)];
  if (hb.free_port() || hb.free_ports_size() > 0) NoteFreePorts(a, hb);
  for (const auto& r : hb.ranks()) {
    if (r.local_rank() >= a.nproc) continue;
    v1::LocalRank& mine = a.ranks[r.local_rank()];
    if (r.step() != mine.step()) a.step_since_ms[r.local_rank()] = now;
    // A trainer's silence ended when its beat age went down: as long as the age last reported.
    // Not while it started (importing torch, seconds, is not a late beat).
    SilenceBound& silence = a.rank_silence[r.local_rank()];
    if (r.pid() != mine.pid())
      silence.Reset();  // another process
    else if (Started(mine) && r.beat_age_ms() < mine.beat_age_ms())
      silence.Ended(mine.beat_age_ms(), now);
    const bool was_restarting = a.restarting.count(r.local_rank()) > 0;
    mine = r;
    // A frozen process that beats again (another one, or the same resumed) is not hung.
    if (a.hung.count(r.local_rank()) && BeatsAgain(a, r.local_rank(), now))
      a.hung.erase(r.local_rank());
    // A process restarted in place is back once it is alive and has said hello (fresh).
    if (was_restarting && r.alive() && r.pid() > 0 && r.generation() == 0 && Started(r))
      a.restarting.erase(r.local_rank());
  }
}

std::optional<int64_t> Pods::Disconnect(uint64_t stream) {
  auto it = stream_pod_.find(stream);
  if (it == stream_pod_.end()) return std::nullopt;
  const int64_t pod = it->second;
  stream_pod_.erase(it);
  Agent& a = agents_[static_cast<size_t>(pod)];
  if (a.stream != stream) return std::nullopt;
  a.connected = false;
  return pod;
}

void Pods::Exited(int64_t pod, uint32_t local, bool clean) {
  Agent& a = agents_[static_cast<size_t>(pod)];
  (clean ? a.finished : a.failed).insert(local);
}

void Pods::Restarting(int64_t pod, const std::vector<uint32_t>& locals) {
  Agent& a = agents_[static_cast<size_t>(pod)];
  for (uint32_t l : locals) {
    a.restarting.insert(l);
    a.failed.erase(l);
    a.hung.erase(l);
    a.finished.erase(l);
  }
}

void Pods::NoteRestartsSeen(int64_t now) {
  for (Agent& a : agents_) {
    if (a.restarting.empty()) a.restart_ms = -1;
    else if (a.restart_ms < 0) a.restart_ms = now;
  }
}

void Pods::StepClockFrom(int64_t pod, int64_t now) {
  for (auto& since : agents_[static_cast<size_t>(pod)].step_since_ms) since = now;
}

void Pods::StepClockFrom(int64_t pod, uint32_t local, int64_t now) {
  agents_[static_cast<size_t>(pod)].step_since_ms[local] = now;
}

void Pods::ForgiveStall(int64_t stall) {
  for (Agent& a : agents_) {
    a.last_seen_ms += stall;
    for (int64_t& since : a.step_since_ms) since += stall;
  }
}

bool Pods::BeatsAgain(const Agent& a, uint32_t local, int64_t now) const {
  const v1::LocalRank& r = a.ranks[local];
  return r.pid() != a.hung.at(local) || static_cast<int64_t>(r.beat_age_ms()) <=
                                            a.rank_silence[local].TimeoutMs(liveness_ms_, now);
}

std::optional<Pods::Finding> Pods::FirstSilent(int64_t now) const {
  for (size_t n = 0; n < agents_.size(); ++n) {
    const Agent& a = agents_[n];
    const bool waiting = a.state == AgentState::kStandby || a.state == AgentState::kRegistered;
    if (a.state != AgentState::kActive && !(waiting && a.connected)) continue;
    const int64_t bound = a.silence.TimeoutMs(liveness_ms_, now);
    if (now - a.last_seen_ms <= bound) continue;
    return Finding{static_cast<int64_t>(n), -1,
                   (a.connected ? "no heartbeat from pod " + a.pod_uid + " for "
                                : "the stream of pod " + a.pod_uid +
                                      " broke and its session was not resumed within ") +
                       std::to_string(now - a.last_seen_ms) + " ms" +
                       Stretched(bound, liveness_ms_),
                   a.last_seen_ms};
  }
  return std::nullopt;
}

// A stalled generation is blamed on a rank that never entered it first (it is still in an older
// generation, or never took the start): the ranks waiting for it in the rendezvous or a
// collective are its victims, and restarting one of them would stall the next generation too.
Pods::Finding Pods::Outside(const RankLayout& layout, size_t g, uint64_t generation,
                            int64_t hang, int64_t now) const {
  const RankPlace& p = layout.places()[g];
  const Agent& a = agents_[static_cast<size_t>(p.pod)];
  const v1::LocalRank& lr = a.ranks[p.local_rank];
  return Finding{static_cast<int64_t>(g), lr.step(),
                 "rank " + std::to_string(g) + " never entered generation " +
                     std::to_string(generation) + " (it is in generation " +
                     std::to_string(lr.generation()) + ", at step " + std::to_string(lr.step()) +
                     " for " + std::to_string(now - a.step_since_ms[p.local_rank]) +
                     " ms) and holds it up (hang timeout " + std::to_string(hang) + " ms)",
                 a.step_since_ms[p.local_rank]};
}

// One walk of the generation's ranks (every tick: 65,536 of them at 8,192 pods of 8), in order
// of blame: a rank outside the generation first, then a frozen one, then one paused or stuck.
std::optional<Pods::Finding> Pods::FirstHang(const RankLayout& layout, uint64_t generation,
                                             int64_t hang, bool commit_held, int64_t now) {
  std::optional<size_t> frozen, paused, stuck;  // the first rank over the hang timeout of each kind
  for (size_t g = 0; g < layout.size(); ++g) {
    const RankPlace& p = layout.places()[g];
    const Agent& a = agents_[static_cast<size_t>(p.pod)];
    const v1::LocalRank& lr = a.ranks[p.local_rank];
    if (!lr.alive() || lr.phase() == v1::PHASE_DONE) continue;
    const int64_t at_step = now - a.step_since_ms[p.local_rank];
    if (lr.generation() < generation && at_step > hang)
      return Outside(layout, g, generation, hang, now);
    if (frozen) continue;  // only a rank outside the generation is blamed before it
    if (lr.beat_age_ms() > RankBeat(a, p.local_rank, hang, now).allowed_ms) {
      frozen = g;
      continue;
    }
    // A rank waiting for a generation (PAUSED: its agent paused it, or it missed its start) has
    // left this one: past the hang timeout it is the rank that holds the generation up, before
    // any rank waiting for it.
    if (!commit_held && at_step > hang) {
      std::optional<size_t>& first = lr.phase() == v1::PHASE_PAUSED ? paused : stuck;
      if (!first) first = g;
    }
  }
  if (frozen) {
    const RankPlace& p = layout.places()[*frozen];
    Agent& a = agents_[static_cast<size_t>(p.pod)];
    const v1::LocalRank& lr = a.ranks[p.local_rank];
    a.hung[p.local_rank] = lr.pid();  // frozen: a failed process until it beats again
    const RankBeatBound b = RankBeat(a, p.local_rank, hang, now);
    return Finding{static_cast<int64_t>(*frozen), lr.step(),
                   "rank " + std::to_string(*frozen) + " sent no heartbeat for " +
                       std::to_string(lr.beat_age_ms()) + " ms (" +
                       (b.ran ? "running, past the hang timeout"
                              : "frozen process" +
                                    (Started(lr) ? Stretched(b.liveness_ms, liveness_ms_) : "")) +
                       ")",
                   now - static_cast<int64_t>(lr.beat_age_ms())};
  }
  if (!paused && !stuck) return std::nullopt;
  const size_t g = paused ? *paused : *stuck;
  const RankPlace& p = layout.places()[g];
  const Agent& a = agents_[static_cast<size_t>(p.pod)];
  const v1::LocalRank& lr = a.ranks[p.local_rank];
  return Finding{static_cast<int64_t>(g), lr.step(),
                 "rank " + std::to_string(g) + " has been at step " + std::to_string(lr.step()) +
                     (paused ? ", paused (out of the generation)," : "") + " for " +
                     std::to_string(now - a.step_since_ms[p.local_rank]) + " ms (hang timeout " +
                     std::to_string(hang) + " ms)",
                 a.step_since_ms[p.local_rank]};
}

// How long rank `local` of `a` may go without a beat: its liveness bound, or the hang timeout
// for a process still starting (importing, loading: it has not said hello yet) or one that ran
// lately (its CPU time grew within the bound, as its agent read it: not frozen, only late,
// starved on an overloaded machine or its heartbeat thread waiting for the interpreter's lock).
// A stopped or deadlocked process runs nothing: its bound stays the liveness one.
Pods::RankBeatBound Pods::RankBeat(const Agent& a, uint32_t local, int64_t hang,
                                   int64_t now) const {
  const v1::LocalRank& lr = a.ranks[local];
  const int64_t bound = a.rank_silence[local].TimeoutMs(liveness_ms_, now);
  const bool ran = lr.has_cpu_idle_ms() && lr.cpu_idle_ms() <= bound;
  return {!Started(lr) || ran ? hang : bound, bound, ran};
}

bool Pods::Forget(const std::string& uid) {
  if (uid.empty() || !lost_uids_.insert(uid).second) return false;
  lost_.push_back(uid);
  if (lost_.size() > JobRecord::kMaxLost) {
    lost_uids_.erase(lost_.front());
    replace_uids_.erase(lost_.front());
    lost_.erase(lost_.begin());
  }
  return true;
}

template <typename Message>
void Pods::NoteFreePorts(Agent& a, const Message& report) {
  a.free_ports.clear();
  auto note = [&](uint32_t port) {
    if (port != 0 && port <= 65535 && !RecentStore(a.host, port) &&
        a.free_ports.size() < kMaxFreePorts &&
        std::find(a.free_ports.begin(), a.free_ports.end(), port) == a.free_ports.end())
      a.free_ports.push_back(port);
  };
  for (uint32_t port : report.free_ports()) note(port);
  if (report.free_ports_size() == 0) note(report.free_port());  // an agent before free_ports
}

bool Pods::RecentStore(const std::string& host, uint32_t port) const {
  return std::find(store_ports_.begin(), store_ports_.end(), std::make_pair(host, port)) !=
         store_ports_.end();
}

uint32_t Pods::TakeStorePort(int64_t pod, uint64_t generation) {
  Agent& host = agents_[static_cast<size_t>(pod)];
  uint32_t port = 0;
  if (!host.free_ports.empty()) {
    port = host.free_ports.front();
    host.free_ports.erase(host.free_ports.begin());
  } else {
    // None reported free since the last store took one: a port of the torchrun convention's
    // range (29500), by generation, that no recent store holds.
    port = 29500 + static_cast<uint32_t>(generation % 1000);
    while (RecentStore(host.host, port)) port = 29500 + (port - 29500 + 1) % 1000;
  }
  store_ports_.emplace_back(host.host, port);
  while (store_ports_.size() > kRecentStorePorts) store_ports_.pop_front();
  return port;
}

}  // namespace regroup::manager
