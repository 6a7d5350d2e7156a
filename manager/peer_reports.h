// SPDX-License-Identifier: Apache-2.0
// The survivors' word on a lost pod: which pods' trainers reported, the moment it failed, a
// collective with which pod of the running generation (TrainerFault.early, naming the peer's
// host). A lone broken stream or silence gets its grace (silence_bound.h); these reports are
// what settles a node loss sooner (JobControl::SettleLostPeers, docs/design.md "Timeouts"):
//  - a pod whose stream broke, named by one report (or by an unnamed one), is lost at once: its
//    agent's stream and its trainers' connections dropped together;
//  - a pod whose stream is up but that has been silent for two heartbeat intervals, named by
//    ranks of at least kQuorum other pods, is lost at once;
//  - a pod whose stream broke and that has been silent for two heartbeat intervals (a stream's
//    blip reconnects within one), some of whose ranks the host of the forming generation's store
//    names as not arrived (TrainerFault.missing_ranks), is lost at once: it died before it reached
//    the store, so no survivor has a connection to it whose failure would say so.
// A report is kept for a window (the liveness timeout; a missing rank's for kMissingWindowMs,
// since the store's host repeats it while the rank is missing) and only for the generation it
// was made in. Integers only, so that the simulation replays it exactly.
#pragma once

#include <cstdint>
#include <map>
#include <set>

namespace regroup::manager {

class PeerReports {
 public:
  // How many distinct other pods must name a pod whose stream is up.
  static constexpr size_t kQuorum = 2;
  // How long the store host's word that a pod's ranks have not arrived stands: twice its period
  // (TrainerFault.missing_ranks, python/regroup/group.py's MISSING_REPORT_S).
  static constexpr int64_t kMissingWindowMs = 1000;

  // Ranks of pod `reporter` reported a failed collective of `generation` naming pod `peer`
  // (-1: none named, or a host this manager cannot tell apart).
  void Add(uint64_t generation, int64_t reporter, int64_t peer, int64_t now) {
    For(generation);
    if (peer < 0)
      unnamed_ms_ = now;
    else if (peer != reporter)
      by_peer_[peer][reporter] = now;
  }

  // The host of `generation`'s store, forming it, named ranks of pod `peer` as not arrived.
  void AddMissing(uint64_t generation, int64_t peer, int64_t now) {
    For(generation);
    missing_ms_[peer] = now;
  }

  // The pods named as not arrived at `generation`'s store within kMissingWindowMs before `now`.
  std::set<int64_t> Missing(uint64_t generation, int64_t now) const {
    std::set<int64_t> out;
    if (generation != generation_) return out;
    for (const auto& [peer, at] : missing_ms_)
      if (now - at <= kMissingWindowMs) out.insert(peer);
    return out;
  }

  // The pods that named `peer` within `window_ms` before `now`, in `generation`.
  std::set<int64_t> Reporters(uint64_t generation, int64_t peer, int64_t window_ms,
                              int64_t now) const {
    std::set<int64_t> out;
    if (generation != generation_) return out;
    const auto it = by_peer_.find(peer);
    if (it == by_peer_.end()) return out;
    for (const auto& [reporter, at] : it->second)
      if (now - at <= window_ms) out.insert(reporter);
    return out;
  }

  // Whether a report that named no pod came within `window_ms` before `now`, in `generation`.
  bool Unnamed(uint64_t generation, int64_t window_ms, int64_t now) const {
    return generation == generation_ && unnamed_ms_ >= 0 && now - unnamed_ms_ <= window_ms;
  }

  // The pods named in `generation` (some reports may be past their window).
  std::set<int64_t> Named(uint64_t generation) const {
    std::set<int64_t> out;
    if (generation != generation_) return out;
    for (const auto& entry : by_peer_) out.insert(entry.first);
    return out;
  }

 private:
  void For(uint64_t generation) {
    if (generation == generation_) return;
    by_peer_.clear();
    missing_ms_.clear();
    unnamed_ms_ = -1;
    generation_ = generation;
  }

  uint64_t generation_ = 0;
  std::map<int64_t, std::map<int64_t, int64_t>> by_peer_;  // peer -> reporter -> when
  std::map<int64_t, int64_t> missing_ms_;                  // peer -> when last named missing
  int64_t unnamed_ms_ = -1;
};

}  // namespace regroup::manager
