// SPDX-License-Identifier: Apache-2.0
#include "cli/simulate.h"

#include <cstdio>
#include <map>
#include <ostream>

namespace regroup::cli {
namespace {

std::string Clock(int64_t ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%8.1fs", static_cast<double>(ms) / 1000.0);
  return buf;
}

std::string Time(int64_t ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1fs", static_cast<double>(ms) / 1000.0);
  return buf;
}

bool FormsGeneration(DirectiveKind k) {
  return k == REGROUP_DIRECTIVE_RETRY || k == REGROUP_DIRECTIVE_RESTART_IN_PLACE ||
         k == REGROUP_DIRECTIVE_RESUME || k == REGROUP_DIRECTIVE_SCALE_IN ||
         k == REGROUP_DIRECTIVE_SCALE_OUT;
}

bool Ends(DirectiveKind k) {
  return k == REGROUP_DIRECTIVE_DUMP || k == REGROUP_DIRECTIVE_EXIT;
}

class World {
 public:
  World(Engine& engine, Job& job, const SimulateOptions& o, std::ostream& out)
      : engine_(engine), job_(job), o_(o), out_(out) {}

  Status Start() {
    const int64_t pods = job_.spec().pods;
    for (int64_t i = 0; i < pods; ++i) {
      const std::string node = "node-" + std::to_string(i);
      healthy_[node] = true;
      occupant_[node] = i;
      uid_.push_back(Uid(i));
      REGROUP_RETURN_IF_ERROR(engine_.SetNodeHealth(node, REGROUP_NODE_HEALTHY, "", 0));
      REGROUP_RETURN_IF_ERROR(
          engine_.SetPodState(job_.spec().id, i, uid_.back(), REGROUP_POD_RUNNING, node, 0));
    }
    return Status::Ok();
  }

  Status Apply(const ScriptEvent& e, int64_t now) {
    using K = ScriptEvent::Kind;
    Line(now, "! " + DescribeScriptEvent(e));
    const std::string& id = job_.spec().id;
    switch (e.kind) {
      case K::kNodeFails:
        if (!healthy_.count(e.node))
          return InvalidArgument("fault script line " + std::to_string(e.line) + ": node " +
                                 e.node + " is not in the cluster (nodes are node-0.. and those "
                                          "that joined)");
        healthy_[e.node] = false;
        if (occupant_.count(e.node)) blocked_ = blocked_ || Active(occupant_[e.node]);
        return engine_.SetNodeHealth(e.node, REGROUP_NODE_FAULTY,
                                     e.detail.empty() ? "NotReady" : e.detail, now);
      case K::kNodeRecovers:
      case K::kNodeJoins:
        healthy_[e.node] = true;
        return engine_.SetNodeHealth(e.node, REGROUP_NODE_HEALTHY, "", now);
      case K::kPodFails: {
        if (e.id >= job_.spec().pods)
          return InvalidArgument("fault script line " + std::to_string(e.line) + ": the job has no pod " +
                                 std::to_string(e.id));
        blocked_ = blocked_ || Active(e.id);
        Free(e.id);
        return engine_.SetPodState(id, e.id, uid_[static_cast<size_t>(e.id)], REGROUP_POD_FAILED,
                                   "", now);
      }
      default: {
        static const std::map<K, std::string> kinds = {
            {K::kRankExits, "process_exit"},
            {K::kRankHangs, "hang"},
            {K::kRankCollectiveError, "collective_error"},
            {K::kRankDeviceError, "device_error"}};
        blocked_ = true;
        nlohmann::json fault = {{"type", "fault"},     {"job", id},
                                {"kind", kinds.at(e.kind)}, {"ranks", {e.id}},
                                {"step", step_},       {"detail", e.detail}};
        Status st = engine_.ApplyEvents(fault, now);
        if (!st.ok())
          return InvalidArgument("fault script line " + std::to_string(e.line) + ": " + st.message());
        return Status::Ok();
      }
    }
  }

  // The scheduler, kubelets and agents.
  Status Schedule(int64_t now) {
    const std::string& id = job_.spec().id;
    for (const auto& ev : job_.Evictions()) {
      Line(now, "  scheduler: evict pod " + std::to_string(ev.pod) + " from " +
                    (ev.node.empty() ? "its node" : ev.node) + " (" +
                    (ev.force ? "force" : "grace") + ")");
      Free(ev.pod);
      REGROUP_RETURN_IF_ERROR(engine_.SetPodState(id, ev.pod, ev.uid, REGROUP_POD_DELETED, "", now));
    }
    if (!job_.WantsPods()) return Status::Ok();
    for (size_t p = 0; p < job_.slots().size(); ++p) {
      const PodSlot& slot = job_.slots()[p];
      if (slot.status != PodSlot::Status::kLost || slot.replacement_seen ||
          registering_.count(static_cast<int64_t>(p)))
        continue;
      if (slot.uid == slot.lost_uid && slot.phase != REGROUP_POD_DELETED &&
          slot.phase != REGROUP_POD_FAILED)
        continue;  // the old pod is still there
      for (const auto& [node, ok] : healthy_) {
        if (!ok || occupant_.count(node) || !engine_.NodeAllowed(&job_, node)) continue;
        const std::string uid = Uid(static_cast<int64_t>(p));
        uid_[p] = uid;
        occupant_[node] = static_cast<int64_t>(p);
        registering_[static_cast<int64_t>(p)] = now + o_.register_delay_ms;
        Line(now, "  scheduler: replacement for pod " + std::to_string(p) + " bound to " + node);
        REGROUP_RETURN_IF_ERROR(engine_.SetPodState(id, static_cast<int64_t>(p), uid,
                                                    REGROUP_POD_RUNNING, node, now));
        break;
      }
    }
    for (auto it = registering_.begin(); it != registering_.end();) {
      if (it->second > now) {
        ++it;
        continue;
      }
      Line(now, "  agent of pod " + std::to_string(it->first) + " registered with the manager");
      nlohmann::json reg = {{"type", "replacement_registered"},
                            {"job", id},
                            {"index", it->first},
                            {"uid", uid_[static_cast<size_t>(it->first)]}};
      REGROUP_RETURN_IF_ERROR(engine_.ApplyEvents(reg, now));
      it = registering_.erase(it);
    }
    return Status::Ok();
  }

  // The manager and the trainers.
  void Train(int64_t now) {
    const Directive& d = job_.directive();
    if (d.id != seen_directive_) {
      seen_directive_ = d.id;
      Line(now, "-> " + std::string(DirectiveKindName(d.kind)) +
                    (d.strategy.empty() ? "" : " [" + d.strategy + "]") + " phase=" +
                    std::string(PhaseName(job_.phase())) + " dp=" + std::to_string(job_.current_dp()) +
                    (d.deadline_ms >= 0 ? " until " + Time(d.deadline_ms) : "") + ": " + d.reason);
      if (FormsGeneration(d.kind)) apply_at_ = now + o_.apply_delay_ms;
      if (d.kind == REGROUP_DIRECTIVE_RESTART_JOB) RestartAll(now);
      if (d.kind == REGROUP_DIRECTIVE_WAIT) blocked_ = true;
    }
    if (apply_at_ >= 0 && now >= apply_at_) {
      apply_at_ = -1;
      ++generation_;
      blocked_ = false;
      next_step_at_ = now + o_.step_ms;
      Line(now, "  manager: generation " + std::to_string(generation_) + " formed, world size " +
                    std::to_string(job_.current_dp() * job_.layout().replica_ranks()));
      Report(now);
    }
    const bool training = !blocked_ && apply_at_ < 0 && !Ends(d.kind);
    if (training && now >= next_step_at_) {
      ++step_;
      next_step_at_ = now + o_.step_ms;
      Report(now);
    }
    if (training)
      (job_.current_dp() < job_.original_dp() ? ms_scaled_in_ : ms_full_) += o_.tick_ms;
    else
      ms_idle_ += o_.tick_ms;
  }

  void Line(int64_t now, const std::string& text) { out_ << Clock(now) << "  " << text << "\n"; }
  bool Quiet() const { return registering_.empty() && apply_at_ < 0; }
  int64_t step() const { return step_; }
  int64_t ms_full() const { return ms_full_; }
  int64_t ms_scaled_in() const { return ms_scaled_in_; }
  int64_t ms_idle() const { return ms_idle_; }

 private:
  std::string Uid(int64_t pod) {
    return "pod-" + std::to_string(pod) + "-" + std::to_string(incarnation_[pod]++);
  }
  bool Active(int64_t pod) const {
    return job_.slots()[static_cast<size_t>(pod)].status == PodSlot::Status::kActive;
  }
  void Free(int64_t pod) {
    for (auto it = occupant_.begin(); it != occupant_.end();)
      it = it->second == pod ? occupant_.erase(it) : std::next(it);
  }
  // Rescheduling: the pods the decision gave up are recreated (all, or the faulty ones with
  // pod-rescheduling), and every process restarts from the newest checkpoint.
  void RestartAll(int64_t now) {
    for (size_t p = 0; p < job_.slots().size(); ++p)
      if (job_.slots()[p].status == PodSlot::Status::kLost) Free(static_cast<int64_t>(p));
    for (auto it = registering_.begin(); it != registering_.end();)
      it = job_.slots()[static_cast<size_t>(it->first)].status == PodSlot::Status::kLost
               ? registering_.erase(it)
               : std::next(it);
    const int64_t interval = job_.config().checkpoint_interval;
    const int64_t from = interval > 0 ? step_ / interval * interval : 0;
    Line(now, "  trainers: every process restarts from " +
                  (interval > 0 ? "the newest checkpoint, step " + std::to_string(from)
                                : std::string("the start (no regroup.io/checkpoint-interval)")) +
                  "; " + std::to_string(step_ - from) + " steps are done again");
    step_ = from;
    blocked_ = true;
  }
  void Report(int64_t now) {
    ManagerProgress m{1, generation_, step_, job_.current_dp() * job_.layout().replica_ranks()};
    nlohmann::json status = {{"type", "manager_progress"}, {"job", job_.spec().id},
                             {"epoch", m.epoch},           {"generation", m.generation},
                             {"committed_step", m.committed_step}, {"live_ranks", m.live_ranks}};
    (void)engine_.ApplyEvents(status, now);
  }

  Engine& engine_;
  Job& job_;
  const SimulateOptions& o_;
  std::ostream& out_;
  std::map<std::string, bool> healthy_;
  std::map<std::string, int64_t> occupant_;  // node -> pod index
  std::vector<std::string> uid_;
  std::map<int64_t, int> incarnation_;
  std::map<int64_t, int64_t> registering_;   // pod -> when its agent registers
  uint64_t seen_directive_ = 0;
  int64_t apply_at_ = -1;
  int64_t generation_ = 1;
  int64_t step_ = 0;
  int64_t next_step_at_ = 0;
  bool blocked_ = false;
  int64_t ms_full_ = 0, ms_scaled_in_ = 0, ms_idle_ = 0;
};

}  // namespace

StatusOr<SimulateSummary> Simulate(const JobSpec& spec, const std::vector<ScriptEvent>& script,
                                   const SimulateOptions& options, std::ostream& out) {
  if (options.tick_ms <= 0 || options.step_ms <= 0)
    return InvalidArgument("the tick and the step time must be positive");
  Engine engine;
  ResolvedConfig report;
  REGROUP_RETURN_IF_ERROR(engine.UpsertJob(spec, &report, 0));
  Job& job = *engine.FindJob(spec.id);
  const JobConfig& c = job.config();
  std::string strategies = KeyValueText(*FindKey("recover-strategy"), c.strategies);
  out << Clock(0) << "  job " << spec.id << ": " << spec.pods << " pods x "
      << spec.processes_per_pod << " processes, tp=" << c.tensor_parallel
      << " pp=" << c.pipeline_parallel << " -> dp=" << job.original_dp()
      << "; strategies " << strategies << "; recovery " << (c.recovery_on() ? "on" : "off") << "\n";
  for (const auto& p : report.problems) out << "          warning: " << p.message << "\n";

  World world(engine, job, options, out);
  REGROUP_RETURN_IF_ERROR(world.Start());
  const int64_t last_event = script.empty() ? 0 : script.back().at_ms;
  size_t next = 0;
  int64_t now = 0;
  for (;; now += options.tick_ms) {
    while (next < script.size() && script[next].at_ms <= now)
      REGROUP_RETURN_IF_ERROR(world.Apply(script[next++], now));
    REGROUP_RETURN_IF_ERROR(world.Schedule(now));
    engine.Tick(now);
    world.Train(now);
    const Phase phase = job.phase();
    if (phase == REGROUP_PHASE_DUMPING || phase == REGROUP_PHASE_EXITING) break;
    if (options.until_ms >= 0) {
      if (now >= options.until_ms) break;
    } else if (next == script.size() && now >= last_event + 60000 && world.Quiet() &&
               (phase == REGROUP_PHASE_RUNNING || phase == REGROUP_PHASE_SCALED_IN)) {
      break;
    } else if (now > last_event + 3600 * 1000) {
      break;  // a bound for scripts that never settle
    }
  }
  SimulateSummary s;
  s.final_phase = job.phase();
  s.final_dp = job.current_dp();
  s.original_dp = job.original_dp();
  s.committed_step = world.step();
  s.ms_full = world.ms_full();
  s.ms_scaled_in = world.ms_scaled_in();
  s.ms_idle = world.ms_idle();
  s.end_ms = now;
  s.history = job.HistoryJson();
  out << Clock(now) << "  end: phase " << PhaseName(s.final_phase) << ", dp " << s.final_dp
      << " of " << s.original_dp << ", " << s.committed_step << " steps committed; training "
      << s.ms_full / 1000.0 << " s at full size, " << s.ms_scaled_in / 1000.0
      << " s scaled in, idle " << s.ms_idle / 1000.0 << " s\n";
  return s;
}

}  // namespace regroup::cli
