// SPDX-License-Identifier: Apache-2.0
// Engine benchmarks through the C ABI (Google Benchmark).
//   One decision for one job; a scheduling session for 1,000 jobs on 10,000 nodes: apply the
//   session's events (node health, pod states), decide every job, run the per-node hooks.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "regroup.h"

namespace {

std::string JobJson(int j, int pods) {
  return R"({"id":"ns/job-)" + std::to_string(j) + R"(","uid":"u)" + std::to_string(j) +
         R"(","labels":{"fault-scheduling":"force"},"annotations":{"recover-strategy":)"
         R"("recover,elastic-training","wait-reschedule-timeout":"30",)"
         R"("regroup.io/recovery-window-s":"60"},"pods":)" +
         std::to_string(pods) + R"(,"processes_per_pod":8})";
}

struct Cluster {
  regroup_engine* engine = nullptr;
  std::vector<std::string> nodes;
  std::vector<const char*> node_ptrs;
  std::vector<std::string> jobs;
  std::vector<std::string> uids;

  Cluster(int num_jobs, int num_nodes, int pods) {
    regroup_engine_new(&engine, nullptr, nullptr);
    for (int n = 0; n < num_nodes; ++n) nodes.push_back("node-" + std::to_string(n));
    for (const auto& n : nodes) node_ptrs.push_back(n.c_str());
    for (int j = 0; j < num_jobs; ++j) {
      const std::string spec = JobJson(j, pods);
      regroup_engine_upsert_job(engine, nullptr, spec.c_str(), spec.size(), 0, nullptr);
      jobs.push_back("ns/job-" + std::to_string(j));
      for (int p = 0; p < pods; ++p) uids.push_back("j" + std::to_string(j) + "p" + std::to_string(p));
    }
  }
  ~Cluster() { regroup_engine_free(engine); }

  // One session: every node's health and pod's state (as a scheduler sees them), a tick, every
  // job's decision, and the predicate over all nodes for the jobs that want pods.
  // Returns how many jobs wanted pods (ran the predicate over every node).
  int Session(int64_t now, int faulty_every) {
    for (size_t n = 0; n < nodes.size(); ++n) {
      const bool faulty = faulty_every > 0 && n % static_cast<size_t>(faulty_every) == 0 && now > 0;
      regroup_engine_set_node_health(engine, node_ptrs[n],
                                     faulty ? REGROUP_NODE_FAULTY : REGROUP_NODE_HEALTHY,
                                     faulty ? "NotReady" : nullptr, now, nullptr);
    }
    const size_t pods = uids.size() / jobs.size();
    for (size_t j = 0; j < jobs.size(); ++j)
      for (size_t p = 0; p < pods; ++p)
        regroup_engine_set_pod_state(engine, jobs[j].c_str(), static_cast<uint32_t>(p),
                                     uids[j * pods + p].c_str(), REGROUP_POD_RUNNING,
                                     node_ptrs[(j * pods + p) % nodes.size()], now, nullptr);
    regroup_engine_tick(engine, now, nullptr, nullptr);
    std::vector<uint8_t> allowed(nodes.size());
    int wanting = 0;
    for (const auto& job : jobs) {
      regroup_decision d = REGROUP_DECISION_INIT;
      regroup_engine_decision(engine, &d, job.c_str(), nullptr);
      if (!d.wants_pods) continue;
      ++wanting;
      regroup_engine_filter_nodes(engine, allowed.data(), job.c_str(), node_ptrs.data(),
                                  node_ptrs.size(), nullptr);
    }
    return wanting;
  }
};

// One fault and its decision: a pod fails, the report window closes (a WAIT decision), its
// replacement registers and the job resumes (a RESUME decision). Two decisions per iteration.
void BM_Decision(benchmark::State& state) {
  Cluster c(1, 8, 8);
  int64_t now = 0;
  int incarnation = 0;
  std::string uid = c.uids[3];
  for (auto _ : state) {
    regroup_engine_set_pod_state(c.engine, "ns/job-0", 3, uid.c_str(), REGROUP_POD_FAILED, "",
                                 now, nullptr);
    now += 200;
    regroup_engine_tick(c.engine, now, nullptr, nullptr);
    regroup_decision d = REGROUP_DECISION_INIT;
    regroup_engine_decision(c.engine, &d, "ns/job-0", nullptr);
    if (d.kind != REGROUP_DIRECTIVE_WAIT) state.SkipWithError("expected a WAIT decision");
    uid = "r" + std::to_string(++incarnation);
    const std::string reg = R"({"type":"replacement_registered","job":"ns/job-0","index":3,"uid":")" +
                            uid + R"("})";
    regroup_engine_set_pod_state(c.engine, "ns/job-0", 3, uid.c_str(), REGROUP_POD_RUNNING,
                                 "node-9", now, nullptr);
    regroup_engine_apply_events(c.engine, reg.c_str(), reg.size(), now, nullptr);
    now += 100;
    regroup_engine_tick(c.engine, now, nullptr, nullptr);
    regroup_engine_decision(c.engine, &d, "ns/job-0", nullptr);
    if (d.kind != REGROUP_DIRECTIVE_RESUME) state.SkipWithError("expected a RESUME decision");
    now += 100000;  // past the recovery window's budget concerns
  }
  state.SetItemsProcessed(state.iterations() * 2);
}
BENCHMARK(BM_Decision);

// Args: jobs, nodes, one faulty node in every N. Every job whose pod sat on a faulty node wants a
// replacement, so the predicate runs over all nodes for it: N=1000 (0.1% faulty, 8 jobs wanting
// pods) is a normal session; N=100 (1%, 80 jobs) a fault storm.
void BM_Session(benchmark::State& state) {
  const int jobs = static_cast<int>(state.range(0));
  const int nodes = static_cast<int>(state.range(1));
  const int faulty_every = static_cast<int>(state.range(2));
  Cluster c(jobs, nodes, 8);
  int64_t now = 0;
  c.Session(now, 0);
  int wanting = 0;
  for (auto _ : state) {
    now += 1000;
    wanting = c.Session(now, faulty_every);
  }
  state.counters["jobs_wanting_pods"] = wanting;
}
BENCHMARK(BM_Session)
    ->ArgNames({"jobs", "nodes", "faulty_every"})
    ->Args({1000, 10000, 1000})
    ->Args({1000, 10000, 100})
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
