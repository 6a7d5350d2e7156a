// Load on regroup-manager from simulated agents in this separate process.
//
//   manager_load --manager-bin build/regroup-manager --agents 256 [--nproc 8] [--seconds 10]
//
// Starts a manager for a job of N pods x nproc ranks, connects N simulated agents (one gRPC
// stream each, heartbeats for all their ranks at 10 per second), and measures: the rendezvous
// (all agents registered -> every agent has its generation), the manager's CPU and memory in
// steady state, a step vote's round trip, the time for an abort and for the next generation to
// reach every agent after a process exits, and the time to detect a killed and a frozen agent.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/credential.h"
#include "regroup/v1/runtime.grpc.pb.h"

namespace {

namespace v1 = regroup::v1;
using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

struct Agent {
  int node = 0;
  std::string uid;
  std::unique_ptr<v1::Manager::Stub> stub;
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<grpc::ClientReaderWriter<v1::AgentMessage, v1::ManagerMessage>> stream;
  std::thread reader;
  std::mutex write_mu;
  std::atomic<bool> beating{true};
  std::atomic<uint64_t> epoch{0}, generation{0};
  std::vector<uint32_t> local_ranks;  // assigned in the current generation
  std::mutex mu;
  // When messages of each kind last arrived.
  Clock::time_point last_start{}, last_abort{}, last_outcome{}, last_restart{};
  std::condition_variable cv;
  uint64_t starts = 0, aborts = 0, outcomes = 0, restarts = 0;
};

class Load {
 public:
  Load(std::string target, int nproc) : target_(std::move(target)), nproc_(nproc) {}

  v1::Header Header(const Agent& a) const {
    v1::Header h;
    h.set_job_id("bench/load");
    h.set_sender(a.uid);
    h.set_epoch(a.epoch);
    h.set_generation(a.generation);
    return h;
  }

  void Write(Agent& a, v1::AgentMessage m) {
    *m.mutable_header() = Header(a);
    std::lock_guard lock(a.write_mu);
    if (a.stream) a.stream->Write(m);
  }

  void Connect(Agent& a, int node, std::shared_ptr<grpc::Channel> channel) {
    a.node = node;
    a.uid = "sim-" + std::to_string(node);
    a.stub = v1::Manager::NewStub(channel);
    a.context = std::make_unique<grpc::ClientContext>();
    a.stream = a.stub->Session(a.context.get());
    v1::AgentMessage m;
    auto* r = m.mutable_register_();
    r->set_pod_uid(a.uid);
    r->set_node_rank(node);
    r->set_nproc(static_cast<uint32_t>(nproc_));
    r->set_host("127.0.0.1");
    r->set_free_port(20000 + static_cast<uint32_t>(node));
    Write(a, m);
    a.reader = std::thread([this, &a] { Read(a); });
  }

  void Read(Agent& a) {
    v1::ManagerMessage m;
    while (a.stream->Read(&m)) {
      const auto now = Clock::now();
      std::lock_guard lock(a.mu);
      if (m.header().epoch() > a.epoch) a.epoch = m.header().epoch();
      switch (m.body_case()) {
        case v1::ManagerMessage::kStart:
          a.generation = m.start().plan().generation();
          a.local_ranks.clear();
          for (const auto& r : m.start().plan().ranks()) a.local_ranks.push_back(r.local_rank());
          a.last_start = now;
          ++a.starts;
          break;
        case v1::ManagerMessage::kAbort:
          a.last_abort = now;
          ++a.aborts;
          break;
        case v1::ManagerMessage::kOutcome:
          a.last_outcome = now;
          ++a.outcomes;
          break;
        case v1::ManagerMessage::kRestart:
          a.last_restart = now;
          ++a.restarts;
          break;
        default:
          break;
      }
      a.cv.notify_all();
    }
  }

  v1::AgentMessage Beat(const Agent& a, int64_t step, int fresh_local = -1) {
    v1::AgentMessage m;
    auto* hb = m.mutable_heartbeat();
    hb->set_free_port(20000 + static_cast<uint32_t>(a.node));
    for (int l = 0; l < nproc_; ++l) {
      auto* r = hb->add_ranks();
      r->set_local_rank(static_cast<uint32_t>(l));
      r->set_pid(10000 + l);
      r->set_alive(true);
      r->set_step(step);
      r->set_phase(v1::PHASE_COMPUTING);
      r->set_generation(l == fresh_local ? 0 : a.generation.load());
      r->set_committed_step(l == fresh_local ? -1 : step - 1);
      r->set_heard_commit_step(l == fresh_local ? -1 : step - 1);
    }
    return m;
  }

  std::vector<std::unique_ptr<Agent>> agents;
  std::atomic<int64_t> step{0};
  std::atomic<int> fresh_node{-1};

 private:
  std::string target_;
  int nproc_;
};

// Waits until `pred(agent)` holds for every agent in `which` (bounded).
template <typename Pred>
bool WaitAll(const std::vector<Agent*>& which, Pred pred, std::chrono::seconds limit) {
  const auto deadline = Clock::now() + limit;
  for (Agent* a : which) {
    std::unique_lock lock(a->mu);
    if (!a->cv.wait_until(lock, deadline, [&] { return pred(*a); })) return false;
  }
  return true;
}

struct Percentiles {
  double p50 = 0, p99 = 0, max = 0;
};
Percentiles Of(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v[std::min(v.size() - 1, v.size() * 99 / 100)], v.back()};
}

struct ProcStats {
  double cpu_seconds = 0;
  double rss_mb = 0;
};
ProcStats Stats(pid_t pid) {
  ProcStats s;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), {});
  const auto close = text.rfind(')');
  if (close != std::string::npos) {
    std::istringstream rest(text.substr(close + 2));
    std::string field;
    std::vector<std::string> f;
    while (rest >> field) f.push_back(field);
    if (f.size() > 13)
      s.cpu_seconds = (std::stod(f[11]) + std::stod(f[12])) / static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmRSS:", 0) == 0) s.rss_mb = std::stod(line.substr(6)) / 1024.0;
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Load on regroup-manager from simulated agents"};
  std::string manager_bin = "build/regroup-manager";
  int agents_n = 256, nproc = 8, seconds = 10;
  app.add_option("--manager-bin", manager_bin)->capture_default_str();
  app.add_option("--agents", agents_n)->capture_default_str();
  app.add_option("--nproc", nproc)->capture_default_str();
  app.add_option("--seconds", seconds, "steady-state measurement")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  std::signal(SIGPIPE, SIG_IGN);

  char dir_template[] = "/tmp/regroup-load-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  const std::string port_file = dir + "/port";
  const pid_t manager = fork();
  if (manager == 0) {
    const std::string nodes = std::to_string(agents_n), np = std::to_string(nproc);
    execl(manager_bin.c_str(), manager_bin.c_str(), "--job-id", "bench/load", "--nodes",
          nodes.c_str(), "--nproc-per-node", np.c_str(), "--listen", "127.0.0.1:0",
          "--port-file", port_file.c_str(), "--join-window-s", "600", "--label",
          "fault-scheduling=force", "--annotation",
          "recover-strategy=recover-in-place,elastic-training", "--annotation",
          "regroup.io/report-window-ms=0", "--annotation", "regroup.io/prefer-elastic=true",
          "--annotation", "regroup.io/hang-timeout-min-s=3600",
          "--annotation", "regroup.io/collective-timeout-s=7200", nullptr);
    _exit(127);
  }
  std::string port;
  for (int i = 0; i < 200 && port.empty(); ++i) {
    std::ifstream in(port_file);
    std::getline(in, port);
    if (port.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (port.empty()) {
    std::fprintf(stderr, "the manager did not start\n");
    kill(manager, SIGKILL);
    return 1;
  }
  const std::string target = "127.0.0.1:" + port;
  Load load(target, nproc);
  // A few channels shared by many streams, as many pods would share nothing but this is one
  // process: HTTP/2 multiplexes the streams.
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int c = 0; c < 8; ++c) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt("regroup.channel", c);
    channels.push_back(grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
  }
  std::vector<Agent*> all;
  const auto t0 = Clock::now();
  for (int n = 0; n < agents_n; ++n) {
    load.agents.push_back(std::make_unique<Agent>());
    load.Connect(*load.agents.back(), n, channels[static_cast<size_t>(n) % channels.size()]);
    all.push_back(load.agents.back().get());
  }
  const bool formed = WaitAll(all, [](Agent& a) { return a.starts >= 1; }, std::chrono::seconds(120));
  const double rendezvous_ms = Ms(Clock::now() - t0);

  // Heartbeats at 10 per second per agent, from one thread.
  std::atomic<bool> stop{false};
  std::thread beater([&] {
    auto next = Clock::now();
    while (!stop) {
      for (auto& a : load.agents)
        if (a->beating) load.Write(*a, load.Beat(*a, load.step, a->node == load.fresh_node ? 0 : -1));
      next += std::chrono::milliseconds(100);
      std::this_thread::sleep_until(next);
    }
  });

  const ProcStats before = Stats(manager);
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  const ProcStats after = Stats(manager);
  const double cpu = (after.cpu_seconds - before.cpu_seconds) / seconds * 100.0;

  // A step vote: every agent votes for step 0; round trip from the last vote to each outcome.
  std::vector<double> vote_rtt;
  for (int round = 0; round < 5; ++round) {
    const int64_t s = load.step;
    Clock::time_point sent;
    for (auto& a : load.agents) {
      v1::AgentMessage m;
      m.mutable_votes()->set_generation(a->generation);
      m.mutable_votes()->set_step(s);
      m.mutable_votes()->set_ok(true);
      for (uint32_t l : a->local_ranks) m.mutable_votes()->add_local_ranks(l);
      load.Write(*a, m);
    }
    sent = Clock::now();
    const uint64_t want = static_cast<uint64_t>(round + 1);
    WaitAll(all, [&](Agent& a) { return a.outcomes >= want; }, std::chrono::seconds(30));
    for (auto* a : all) vote_rtt.push_back(Ms(a->last_outcome - sent));
    load.step = s + 1;
  }

  // A process exits: abort at every agent, then restart in place and the next generation.
  Agent& victim = *load.agents[1 % agents_n];
  const uint64_t gen_before = victim.generation;
  v1::AgentMessage exit_msg;
  exit_msg.mutable_process_exit()->set_local_rank(0);
  exit_msg.mutable_process_exit()->set_exit_code(1);
  const auto fault_at = Clock::now();
  load.Write(victim, exit_msg);
  WaitAll(all, [](Agent& a) { return a.aborts >= 1; }, std::chrono::seconds(30));
  std::vector<double> abort_ms, next_gen_ms;
  for (auto* a : all) abort_ms.push_back(Ms(a->last_abort - fault_at));
  {
    std::unique_lock lock(victim.mu);
    victim.cv.wait_for(lock, std::chrono::seconds(30), [&] { return victim.restarts >= 1; });
  }
  const auto restart_at = Clock::now();
  load.fresh_node = victim.node;  // the restarted process says hello (fresh)
  WaitAll(all, [&](Agent& a) { return a.generation > gen_before; }, std::chrono::seconds(30));
  for (auto* a : all) next_gen_ms.push_back(Ms(a->last_start - restart_at));
  load.fresh_node = -1;

  // A killed agent (its stream breaks) and a frozen one (heartbeats stop).
  Agent& killed = *load.agents[2 % agents_n];
  const auto kill_at = Clock::now();
  killed.context->TryCancel();
  std::vector<Agent*> others;
  for (auto* a : all)
    if (a != &killed) others.push_back(a);
  WaitAll(others, [](Agent& a) { return a.aborts >= 2; }, std::chrono::seconds(30));
  double killed_detect = 0;
  for (auto* a : others) killed_detect = std::max(killed_detect, Ms(a->last_abort - kill_at));
  WaitAll(others, [&](Agent& a) { return a.starts >= 3; }, std::chrono::seconds(30));

  Agent& frozen = *load.agents[3 % agents_n];
  const auto freeze_at = Clock::now();
  frozen.beating = false;
  std::vector<Agent*> rest;
  for (auto* a : others)
    if (a != &frozen) rest.push_back(a);
  WaitAll(rest, [](Agent& a) { return a.aborts >= 3; }, std::chrono::seconds(30));
  double frozen_detect = 0;
  for (auto* a : rest) frozen_detect = std::max(frozen_detect, Ms(a->last_abort - freeze_at));

  stop = true;
  beater.join();
  const ProcStats end = Stats(manager);
  for (auto& a : load.agents) a->context->TryCancel();
  for (auto& a : load.agents) a->reader.join();
  kill(manager, SIGTERM);
  waitpid(manager, nullptr, 0);
  std::remove(port_file.c_str());
  rmdir(dir.c_str());

  const auto vote = Of(vote_rtt), abort_p = Of(abort_ms), gen = Of(next_gen_ms);
  std::printf(
      "agents=%d ranks=%d formed=%s rendezvous_ms=%.0f manager_cpu_pct=%.1f manager_rss_mb=%.1f "
      "vote_rtt_ms_p50=%.2f vote_rtt_ms_p99=%.2f abort_ms_p50=%.2f abort_ms_p99=%.2f "
      "next_generation_ms_p50=%.2f next_generation_ms_p99=%.2f killed_agent_detect_ms=%.1f "
      "frozen_agent_detect_ms=%.1f\n",
      agents_n, agents_n * nproc, formed ? "yes" : "no", rendezvous_ms, cpu, end.rss_mb, vote.p50,
      vote.p99, abort_p.p50, abort_p.p99, gen.p50, gen.p99, killed_detect, frozen_detect);
  return formed ? 0 : 1;
}
