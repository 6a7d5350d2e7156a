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
         R"("recover,elastic-training","wait-reschedule-timeout":"30"},"pods":)" +
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
  void Session(int64_t now, int faulty_every) {
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
    for (const auto& job : jobs) {
      regroup_decision d = REGROUP_DECISION_INIT;
      regroup_engine_decision(engine, &d, job.c_str(), nullptr);
      if (d.wants_pods)
        regroup_engine_filter_nodes(engine, allowed.data(), job.c_str(), node_ptrs.data(),
                                    node_ptrs.size(), nullptr);
    }
  }
};

void BM_Decision(benchmark::State& state) {
  Cluster c(1, 8, 8);
  int64_t now = 0;
  bool faulty = false;
  for (auto _ : state) {
    now += 1000;
    faulty = !faulty;
    regroup_engine_set_node_health(c.engine, "node-3", faulty ? REGROUP_NODE_FAULTY : REGROUP_NODE_HEALTHY,
                                   "x", now, nullptr);
    regroup_engine_tick(c.engine, now, nullptr, nullptr);
    regroup_decision d = REGROUP_DECISION_INIT;
    regroup_engine_decision(c.engine, &d, "ns/job-0", nullptr);
    benchmark::DoNotOptimize(d);
  }
}
BENCHMARK(BM_Decision);

void BM_Session(benchmark::State& state) {
  const int jobs = static_cast<int>(state.range(0));
  const int nodes = static_cast<int>(state.range(1));
  Cluster c(jobs, nodes, 8);
  int64_t now = 0;
  c.Session(now, 0);
  for (auto _ : state) {
    now += 1000;
    c.Session(now, 100);  // 1% of nodes faulty
  }
  state.counters["jobs"] = jobs;
  state.counters["nodes"] = nodes;
}
BENCHMARK(BM_Session)->Args({1000, 10000})->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
