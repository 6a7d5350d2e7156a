// SPDX-License-Identifier: Apache-2.0
// Load on regroup-manager from simulated agents in this separate process.
//
//   manager_load --manager-bin build/regroup-manager --agents 256 [--nproc 8] [--seconds 10]
//   manager_load --manager-bin build/regroup-manager --sizes 256,1024,2048,8192
//
// Starts a manager for a job of N pods x nproc ranks, connects N simulated agents (one gRPC
// stream each, on gRPC's callback API: a few threads drive them all; one beat per agent every
// heartbeat interval the manager's Welcome names (100 ms, stretched for a job of more than 2,000
// pods), carrying the ranks whose report changed, as agent_core.cc sends them, or every rank
// with --full-beats, as older agents did), and measures: the rendezvous
// (all agents registered -> every agent has its generation), the manager's CPU and memory in
// steady state, a step vote's round trip, the time for an abort and for the next generation to
// reach every agent after a process exits and is restarted in place, the time to detect a killed
// agent and to re-form without it, and the time to detect a frozen one (the liveness timeout:
// --liveness-misses heartbeats, 50 by default, i.e. 5 s).
//
// The simulated agents speak today's protocol as agent/agent_core.cc does: Register carries every
// rank's state (alive, said hello: PAUSED), a heartbeat follows the Welcome at once and then one
// every heartbeat interval, with the manager's epoch in every header; a StartGeneration puts the
// assigned ranks in the generation, an AbortGeneration pauses them, a commit advances their
// committed step; a RestartProcesses starts a fresh process (generation 0, STARTING) that says
// hello (PAUSED), reported at once. The manager forms a generation only from ranks that said
// hello, so an agent that skipped any of this would never be part of one.
//
// Prints one line of key=value figures (`result=ok` when every phase completed) and exits 0;
// a phase that does not complete within --timeout is named (`result=failed:<phase>`, exit 1).
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <deque>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/credential.h"
#include "regroup/v1/wire.grpc.pb.h"

namespace {

namespace v1 = regroup::v1;
using Clock = std::chrono::steady_clock;

constexpr char kJob[] = "bench/load";

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// One trainer process as its agent reports it (agent_core.cc's AgentCore::Report).
struct Rank {
  bool alive = true;
  int32_t pid = 0;
  int64_t step = 0;
  v1::Phase phase = v1::PHASE_PAUSED;  // said hello, waiting for a generation
  uint64_t generation = 0;
  int64_t committed_step = -1;
  int64_t heard_commit_step = -1;
};

struct Agent;

// One agent's stream on gRPC's callback API: no thread of its own, reads and writes completed by
// gRPC's few callback threads, so one process drives thousands. Writes queue while one is in
// flight (the API allows one at a time).
class Session final : public grpc::ClientBidiReactor<v1::AgentMessage, v1::ManagerMessage> {
 public:
  Session(Agent& agent, std::function<void(Agent&, const v1::ManagerMessage&)> on_message)
      : agent_(agent), on_message_(std::move(on_message)) {}

  void Begin(v1::Manager::Stub* stub, grpc::ClientContext* context, v1::AgentMessage first) {
    stub->async()->Session(context, this);
    // Writes start from outside reactions too (the beaters, the main thread): the hold keeps
    // OnDone from running while one may still start; released once the read side ends.
    AddHold();
    {
      std::lock_guard lock(mu_);
      writing_ = true;
      out_ = std::move(first);
      StartWrite(&out_);
    }
    StartRead(&in_);
    StartCall();
  }

  // False when the call is over. A beat is dropped while 4 messages wait: the generator is
  // behind, and a burst of stale beats would only add to it.
  bool Write(v1::AgentMessage m, bool beat) {
    std::lock_guard lock(mu_);
    if (closing_) return false;
    if (writing_) {
      if (beat && queue_.size() >= 4) return true;
      queue_.push_back(std::move(m));
      return true;
    }
    writing_ = true;
    out_ = std::move(m);
    StartWrite(&out_);
    return true;
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard lock(mu_);
    if (!ok || queue_.empty() || closing_) {
      writing_ = false;
      queue_.clear();
      return;
    }
    out_ = std::move(queue_.front());
    queue_.pop_front();
    StartWrite(&out_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the call is over: no write starts from now on, and OnDone may follow
      {
        std::lock_guard lock(mu_);
        closing_ = true;
      }
      RemoveHold();
      return;
    }
    on_message_(agent_, in_);
    StartRead(&in_);
  }

  void OnDone(const grpc::Status& status) override;

 private:
  Agent& agent_;
  std::function<void(Agent&, const v1::ManagerMessage&)> on_message_;
  v1::ManagerMessage in_;
  std::mutex mu_;  // below
  v1::AgentMessage out_;
  std::deque<v1::AgentMessage> queue_;
  bool writing_ = false;
  bool closing_ = false;

  friend struct Agent;
};

struct Agent {
  int node = 0;
  std::string uid;
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<Session> session;
  std::atomic<bool> beating{true};

  std::mutex mu;  // everything below
  std::condition_variable cv;
  uint64_t epoch = 0, generation = 0;
  bool welcomed = false;
  std::vector<Rank> ranks;
  std::vector<bool> changed;  // ranks whose report changed since the last beat
  std::vector<uint32_t> assigned;  // local ranks in the current generation
  // When messages of each kind last arrived, and how many.
  Clock::time_point last_start{}, last_abort{}, last_outcome{}, hello_at{};
  uint64_t starts = 0, aborts = 0, outcomes = 0, restarts = 0, refusals = 0, stops = 0;
  std::string last_refusal;
  std::string ended;  // how the stream ended, once it did
  bool done = false;

  void MarkAll() { changed.assign(ranks.size(), true); }
};

void Session::OnDone(const grpc::Status& status) {
  {
    std::lock_guard lock(agent_.mu);
    agent_.ended =
        "code " + std::to_string(status.error_code()) + ": " + status.error_message();
    agent_.done = true;
  }
  agent_.cv.notify_all();
}

std::atomic<int32_t> next_pid{100000};

class Load {
 public:
  Load(int nproc, std::string credential, bool full_beats)
      : nproc_(nproc), credential_(std::move(credential)), full_beats_(full_beats) {}

  // The heartbeat interval the manager's Welcome names (one for every agent of the job).
  std::atomic<int> beat_interval_ms{100};

  // Stamps the header (under a.mu) and writes. False when the stream is over.
  bool Write(Agent& a, v1::AgentMessage m, bool beat = false) {
    Stamp(a, m);
    return a.session && a.session->Write(std::move(m), beat);
  }

  void Connect(Agent& a, int node, v1::Manager::Stub* stub) {
    a.node = node;
    a.uid = "sim-" + std::to_string(node);
    a.ranks.assign(static_cast<size_t>(nproc_), Rank());
    a.MarkAll();
    for (auto& r : a.ranks) r.pid = next_pid++;
    a.context = std::make_unique<grpc::ClientContext>();
    regroup::AttachCredential(*a.context, credential_);
    a.session = std::make_unique<Session>(
        a, [this](Agent& agent, const v1::ManagerMessage& m) { OnMessage(agent, m); });
    v1::AgentMessage m;
    auto* r = m.mutable_register_();
    r->set_pod_uid(a.uid);
    r->set_pod_name(a.uid);
    r->set_node_rank(node);
    r->set_node_name("node-" + std::to_string(node));
    r->set_host("127.0.0.1");
    r->set_nproc(static_cast<uint32_t>(nproc_));
    r->set_free_port(20000 + static_cast<uint32_t>(node % 40000));
    {
      std::lock_guard lock(a.mu);
      for (int l = 0; l < nproc_; ++l) Report(a, l, r->add_ranks());
    }
    Stamp(a, m);
    a.session->Begin(stub, a.context.get(), std::move(m));
  }

  // A beat as agent_core.cc sends it: the ranks whose report changed since the last beat (their
  // trainers beat on time), or every rank with --full-beats (an agent before that rule). Holds
  // nothing; takes a.mu.
  v1::AgentMessage Beat(Agent& a) {
    v1::AgentMessage m;
    auto* hb = m.mutable_heartbeat();
    hb->set_free_port(20000 + static_cast<uint32_t>(a.node % 40000));
    hb->add_free_ports(hb->free_port());
    std::lock_guard lock(a.mu);
    for (int l = 0; l < nproc_; ++l)
      if (full_beats_ || a.changed[static_cast<size_t>(l)]) Report(a, l, hb->add_ranks());
    a.changed.assign(a.ranks.size(), false);
    return m;
  }

  bool Welcomed(Agent& a) {
    std::lock_guard lock(a.mu);
    return a.welcomed;
  }

  std::vector<std::unique_ptr<Agent>> agents;

 private:
  void Stamp(Agent& a, v1::AgentMessage& m) {
    std::lock_guard lock(a.mu);
    auto* h = m.mutable_header();
    h->set_job_id(kJob);
    h->set_sender(a.uid);
    h->set_epoch(a.epoch);
    h->set_generation(a.generation);
  }

  void Report(const Agent& a, int l, v1::LocalRank* out) const {
    const Rank& k = a.ranks[static_cast<size_t>(l)];
    out->set_local_rank(static_cast<uint32_t>(l));
    out->set_pid(k.pid);
    out->set_alive(k.alive);
    out->set_step(k.step);
    out->set_phase(k.phase);
    out->set_beat_age_ms(20);  // the trainers heartbeat the agent too
    out->set_generation(k.generation);
    out->set_committed_step(k.committed_step);
    out->set_heard_commit_step(k.heard_commit_step);
  }

  // On a gRPC callback thread: must not block.
  void OnMessage(Agent& a, const v1::ManagerMessage& m) {
    const auto now = Clock::now();
    bool beat_now = false;
    {
      std::lock_guard lock(a.mu);
      if (m.header().epoch() > a.epoch) a.epoch = m.header().epoch();
      switch (m.body_case()) {
        case v1::ManagerMessage::kWelcome:
          if (m.welcome().heartbeat_interval_ms() > 0)
            beat_interval_ms = static_cast<int>(m.welcome().heartbeat_interval_ms());
          a.epoch = std::max(a.epoch, m.welcome().epoch());
          a.generation = std::max(a.generation, m.welcome().generation());
          a.welcomed = true;
          a.MarkAll();      // the first beat of a session says every rank
          beat_now = true;  // as the agent: report the ranks at once
          break;
        case v1::ManagerMessage::kStart: {
          const auto& plan = m.start().plan();
          a.generation = std::max(a.generation, plan.generation());
          a.assigned.clear();
          for (const auto& r : plan.ranks()) {
            if (r.local_rank() >= a.ranks.size()) continue;
            a.assigned.push_back(r.local_rank());
            Rank& k = a.ranks[r.local_rank()];
            k.generation = plan.generation();
            k.committed_step = std::max(k.committed_step, plan.committed_step());
            k.step = plan.committed_step() + 1;
            k.phase = v1::PHASE_COMPUTING;
            a.changed[r.local_rank()] = true;
          }
          a.last_start = now;
          ++a.starts;
          break;
        }
        case v1::ManagerMessage::kAbort:
          for (size_t l = 0; l < a.ranks.size(); ++l)
            if (a.ranks[l].alive) {
              a.ranks[l].phase = v1::PHASE_PAUSED;
              a.changed[l] = true;
            }
          a.last_abort = now;
          ++a.aborts;
          break;
        case v1::ManagerMessage::kOutcome:
          if (m.outcome().commit())
            for (uint32_t l : a.assigned) {
              Rank& k = a.ranks[l];
              k.committed_step = std::max(k.committed_step, m.outcome().step());
              k.heard_commit_step = std::max(k.heard_commit_step, m.outcome().step());
              k.step = m.outcome().step() + 1;
              k.phase = v1::PHASE_COMPUTING;
              a.changed[l] = true;
            }
          a.last_outcome = now;
          ++a.outcomes;
          break;
        case v1::ManagerMessage::kRestart:
          // A fresh process per named rank; it says hello at once (PAUSED, generation 0).
          for (uint32_t l : m.restart().local_ranks()) {
            if (l >= a.ranks.size()) continue;
            Rank& k = a.ranks[l];
            k = Rank();
            k.pid = next_pid++;
            a.changed[l] = true;
          }
          a.hello_at = now;
          ++a.restarts;
          beat_now = true;  // the hello, reported at once
          break;
        case v1::ManagerMessage::kRefusal:
          a.last_refusal = m.refusal().reason();
          ++a.refusals;
          break;
        case v1::ManagerMessage::kStop:
          ++a.stops;
          break;
        default:
          break;
      }
    }
    a.cv.notify_all();
    if (beat_now && a.beating) Write(a, Beat(a));
  }

  int nproc_;
  std::string credential_;
  bool full_beats_;
};

// Waits until `pred(agent)` holds for every agent in `which` (bounded).
template <typename Pred>
bool WaitAll(const std::vector<Agent*>& which, Pred pred, Clock::time_point deadline) {
  for (Agent* a : which) {
    std::unique_lock lock(a->mu);
    if (!a->cv.wait_until(lock, deadline, [&] { return pred(*a); })) return false;
  }
  return true;
}

template <typename Pred>
size_t Count(const std::vector<Agent*>& which, Pred pred) {
  size_t n = 0;
  for (Agent* a : which) {
    std::lock_guard lock(a->mu);
    n += pred(*a) ? 1 : 0;
  }
  return n;
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
  double rss_mb = 0, hwm_mb = 0;
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
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) s.rss_mb = std::stod(line.substr(6)) / 1024.0;
    if (line.rfind("VmHWM:", 0) == 0) s.hwm_mb = std::stod(line.substr(6)) / 1024.0;
  }
  return s;
}

double SelfCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

std::string Tail(const std::string& path, size_t bytes) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  return text.size() > bytes ? text.substr(text.size() - bytes) : text;
}

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string one;
  in >> one;
  return one.empty() ? "?" : one;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Load on regroup-manager from simulated agents"};
  std::string manager_bin = "build/regroup-manager";
  int agents_n = 256, nproc = 8, seconds = 10, timeout_s = 60, liveness_misses = 50;
  app.add_option("--manager-bin", manager_bin)->capture_default_str();
  app.add_option("--agents", agents_n, "simulated agents (pods), at least 4")
      ->capture_default_str()
      ->check(CLI::Range(4, 100000));
  app.add_option("--nproc", nproc, "ranks per agent")->capture_default_str()->check(CLI::Range(1, 64));
  app.add_option("--seconds", seconds, "steady-state measurement")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  app.add_option("--timeout", timeout_s, "the longest any one phase may take, seconds")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  app.add_option("--liveness-misses", liveness_misses,
                 "heartbeats (100 ms apart, stretched past 2,000 agents) missed before a pod is lost; the job default is 5, but "
                 "one process playing thousands of agents on a shared machine falls behind by more")
      ->capture_default_str()
      ->check(CLI::Range(2, 100));
  bool full_beats = false;
  app.add_flag("--full-beats", full_beats,
               "every beat reports every rank, as agents before the beat summary did (the manager "
               "accepts both)");
  std::vector<int> sizes;
  app.add_option("--sizes", sizes,
                 "run once per size (agents), one figure line each, with the other options; "
                 "e.g. --sizes 256,1024,2048,8192")
      ->delimiter(',')
      ->check(CLI::Range(4, 100000));
  CLI11_PARSE(app, argc, argv);
  if (!sizes.empty()) {
    // Each size in a process of its own (this binary with --agents N), so that no run's
    // threads, channels or memory weigh on the next; their lines are printed as they come.
    int worst = 0;
    for (int n : sizes) {
      std::vector<std::string> args;
      for (int i = 0; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--sizes" || arg == "--agents") {
          ++i;
          continue;
        }
        if (arg.rfind("--sizes=", 0) == 0 || arg.rfind("--agents=", 0) == 0) continue;
        args.push_back(arg);
      }
      args.push_back("--agents");
      args.push_back(std::to_string(n));
      const pid_t child = fork();
      if (child == 0) {
        std::vector<char*> cargv;
        for (auto& a : args) cargv.push_back(a.data());
        cargv.push_back(nullptr);
        execv("/proc/self/exe", cargv.data());
        std::perror("manager_load: exec");
        _exit(127);
      }
      int status = 0;
      waitpid(child, &status, 0);
      const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
      worst = std::max(worst, rc);
    }
    return worst;
  }
  const std::string misses = "regroup.io/liveness-misses=" + std::to_string(liveness_misses);
  std::signal(SIGPIPE, SIG_IGN);
  if (access(manager_bin.c_str(), X_OK) != 0) {
    std::fprintf(stderr,
                 "manager_load: %s is not an executable; build it with scripts/setup (or pass "
                 "--manager-bin)\n",
                 manager_bin.c_str());
    return 2;
  }

  char dir_template[] = "/tmp/regroup-load-XXXXXX";
  if (!mkdtemp(dir_template)) {
    std::perror("manager_load: mkdtemp");
    return 2;
  }
  const std::string dir = dir_template;
  const std::string port_file = dir + "/port", log_file = dir + "/manager.log",
                    credential_file = dir + "/credential", record_file = dir + "/record.json";
  // Every RPC carries the job's credential, as in production.
  std::string credential;
  {
    std::random_device rd;
    std::ostringstream token;
    for (int i = 0; i < 4; ++i) token << std::hex << rd();
    credential = token.str();
    std::ofstream out(credential_file);
    out << credential << "\n";
  }
  chmod(credential_file.c_str(), 0600);
  auto cleanup_files = [&] {
    for (const auto& f : {port_file, log_file, credential_file, record_file})
      std::remove(f.c_str());
    rmdir(dir.c_str());
  };

  const pid_t parent = getpid();
  const pid_t manager = fork();
  if (manager == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives the load generator
    if (getppid() != parent) _exit(1);
    if (FILE* log = std::fopen(log_file.c_str(), "w")) {
      dup2(fileno(log), STDOUT_FILENO);
      dup2(fileno(log), STDERR_FILENO);
    }
    const std::string nodes = std::to_string(agents_n), np = std::to_string(nproc);
    execl(manager_bin.c_str(), manager_bin.c_str(), "--job-id", kJob, "--nodes", nodes.c_str(),
          "--nproc-per-node", np.c_str(), "--listen", "127.0.0.1:0", "--port-file",
          port_file.c_str(), "--credential-file", credential_file.c_str(), "--record",
          record_file.c_str(), "--join-window-s", "600",
          "--label", "fault-scheduling=force", "--annotation",
          "recover-strategy=recover-in-place,elastic-training", "--annotation",
          "regroup.io/report-window-ms=0", "--annotation", "regroup.io/prefer-elastic=true",
          "--annotation", "regroup.io/heartbeat-interval-ms=100", "--annotation",
          misses.c_str(), "--annotation", "regroup.io/hang-timeout-min-s=3600",
          "--annotation", "regroup.io/collective-timeout-s=7200", nullptr);
    std::perror("manager_load: exec");
    _exit(127);
  }
  auto stop_manager = [&] {
    kill(manager, SIGTERM);
    for (int i = 0; i < 100; ++i) {
      if (waitpid(manager, nullptr, WNOHANG) == manager) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    kill(manager, SIGKILL);
    waitpid(manager, nullptr, 0);
  };
  std::string port;
  for (int i = 0; i < 600 && port.empty(); ++i) {  // up to 30 s
    std::ifstream in(port_file);
    std::getline(in, port);
    if (!port.empty()) break;
    if (waitpid(manager, nullptr, WNOHANG) == manager) {
      std::fprintf(stderr, "manager_load: the manager exited at start:\n%s\n",
                   Tail(log_file, 4000).c_str());
      cleanup_files();
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (port.empty()) {
    std::fprintf(stderr, "manager_load: the manager did not listen within 30 s:\n%s\n",
                 Tail(log_file, 4000).c_str());
    stop_manager();
    cleanup_files();
    return 1;
  }
  const std::string target = "127.0.0.1:" + port;
  const auto phase_limit = std::chrono::seconds(timeout_s);
  const double load_before = SelfCpuSeconds();
  const std::string loadavg_start = LoadAverage();

  Load load(nproc, credential, full_beats);
  // A few channels shared by many streams (HTTP/2 multiplexes them): one process cannot open a
  // connection per simulated pod without the connections themselves becoming the load.
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<v1::Manager::Stub>> stubs;
  for (int c = 0; c < std::clamp(agents_n / 256, 8, 32); ++c) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt("regroup.channel", c);
    args.SetMaxReceiveMessageSize(64 << 20);
    channels.push_back(grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
    stubs.push_back(v1::Manager::NewStub(channels.back()));
  }
  std::vector<Agent*> all;
  for (int n = 0; n < agents_n; ++n) {
    load.agents.push_back(std::make_unique<Agent>());
    all.push_back(load.agents.back().get());
  }

  // A heartbeat per agent every interval the Welcome named (once welcomed), from a few threads,
  // each agent in one of 10 slots of the interval so they arrive spread out as real agents' do.
  // The longest gap between two heartbeats of one agent is reported: above the liveness timeout
  // the manager rightly declares that pod lost, and the load generator, not the manager, fell
  // behind.
  std::atomic<bool> stop{false};
  std::atomic<int64_t> max_gap_us{0};
  const int beaters = std::clamp(agents_n / 256, 1, 4);
  std::vector<std::thread> beater;
  for (int t = 0; t < beaters; ++t)
    beater.emplace_back([&, t] {
      std::vector<Clock::time_point> last(load.agents.size());
      auto period = Clock::now();
      while (!stop) {
        const int interval = load.beat_interval_ms;
        for (int slot = 0; slot < 10 && !stop; ++slot) {
          std::this_thread::sleep_until(period + std::chrono::microseconds(100 * interval * slot));
          for (size_t i = static_cast<size_t>(t); i < load.agents.size();
               i += static_cast<size_t>(beaters)) {
            if ((i / static_cast<size_t>(beaters)) % 10 != static_cast<size_t>(slot)) continue;
            Agent& a = *load.agents[i];
            if (!a.beating || !load.Welcomed(a)) continue;
            load.Write(a, load.Beat(a), /*beat=*/true);
            const auto now = Clock::now();
            if (last[i] != Clock::time_point{}) {
              const int64_t gap =
                  std::chrono::duration_cast<std::chrono::microseconds>(now - last[i]).count();
              int64_t seen = max_gap_us;
              while (gap > seen && !max_gap_us.compare_exchange_weak(seen, gap)) {
              }
            }
            last[i] = now;
          }
        }
        period += std::chrono::milliseconds(interval);
        if (period < Clock::now()) period = Clock::now();  // behind: do not burst
      }
    });

  std::string failed;  // the first phase that did not complete
  std::vector<double> vote_rtt, abort_ms, next_gen_ms, reform_ms, reform_after_abort_ms;
  double rendezvous_ms = 0, cpu = 0, killed_detect = 0, frozen_detect = 0;
  ProcStats steady;
  auto fail = [&](const std::string& phase, const std::vector<Agent*>& which, auto pred) {
    failed = phase;
    std::fprintf(stderr, "manager_load: %s: %zu of %zu agents not there after %d s\n",
                 phase.c_str(), which.size() - Count(which, pred), which.size(), timeout_s);
    int shown = 0;
    for (Agent* a : which) {
      std::lock_guard lock(a->mu);
      if (pred(*a) || shown++ >= 5) continue;
      std::fprintf(stderr,
                   "  agent %d: generation %llu, starts %llu, aborts %llu, restarts %llu, refusals "
                   "%llu, stops %llu, stream %s\n",
                   a->node, static_cast<unsigned long long>(a->generation),
                   static_cast<unsigned long long>(a->starts),
                   static_cast<unsigned long long>(a->aborts),
                   static_cast<unsigned long long>(a->restarts),
                   static_cast<unsigned long long>(a->refusals),
                   static_cast<unsigned long long>(a->stops),
                   a->ended.empty() ? "open" : a->ended.c_str());
    }
  };

  const auto t0 = Clock::now();
  for (int n = 0; n < agents_n; ++n) {
    // The beater writes to an agent only once welcomed, which needs the stream first.
    load.Connect(*load.agents[static_cast<size_t>(n)], n,
                 stubs[static_cast<size_t>(n) % stubs.size()].get());
  }
  auto formed_pred = [](Agent& a) { return a.starts >= 1; };
  if (!WaitAll(all, formed_pred, Clock::now() + phase_limit)) fail("rendezvous", all, formed_pred);
  rendezvous_ms = Ms(Clock::now() - t0);

  if (failed.empty()) {
    // Steady state: heartbeats only, after a second to settle.
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const ProcStats before = Stats(manager);
    std::this_thread::sleep_for(std::chrono::seconds(seconds));
    steady = Stats(manager);
    cpu = (steady.cpu_seconds - before.cpu_seconds) / seconds * 100.0;
  }

  // Step votes: every agent votes for the step in flight; round trip from the last vote sent
  // to each outcome.
  for (int round = 0; round < 5 && failed.empty(); ++round) {
    std::vector<Agent*> training;
    std::vector<v1::AgentMessage> votes;
    for (auto* a : all) {
      std::lock_guard lock(a->mu);
      if (a->assigned.empty()) continue;
      v1::AgentMessage m;
      auto* v = m.mutable_votes();
      v->set_generation(a->generation);
      v->set_step(a->ranks[a->assigned[0]].committed_step + 1);
      v->set_ok(true);
      for (uint32_t l : a->assigned) {
        v->add_local_ranks(l);
        a->ranks[l].phase = v1::PHASE_VOTED;
        a->changed[l] = true;
      }
      training.push_back(a);
      votes.push_back(std::move(m));
    }
    std::vector<uint64_t> had(training.size());
    for (size_t i = 0; i < training.size(); ++i) {
      std::lock_guard lock(training[i]->mu);
      had[i] = training[i]->outcomes;
    }
    for (size_t i = 0; i < training.size(); ++i) load.Write(*training[i], votes[i]);
    const auto sent = Clock::now();
    const auto deadline = sent + phase_limit;
    for (size_t i = 0; i < training.size() && failed.empty(); ++i) {
      std::unique_lock lock(training[i]->mu);
      if (!training[i]->cv.wait_until(lock, deadline, [&] { return training[i]->outcomes > had[i]; })) {
        failed = "vote";
        std::fprintf(stderr, "manager_load: vote round %d: agent %d had no outcome after %d s\n",
                     round, training[i]->node, timeout_s);
      } else {
        vote_rtt.push_back(Ms(training[i]->last_outcome - sent));
      }
    }
  }

  // A process exits: the abort at every agent; the manager restarts it in place; its hello ->
  // the next generation at every agent.
  Agent& victim = *load.agents[1];
  uint64_t gen_before = 0;
  if (failed.empty()) {
    v1::AgentMessage exit_msg;
    {
      std::lock_guard lock(victim.mu);
      gen_before = victim.generation;
      victim.ranks[0].alive = false;
      victim.changed[0] = true;
      exit_msg.mutable_process_exit()->set_local_rank(0);
      exit_msg.mutable_process_exit()->set_exit_code(1);
      exit_msg.mutable_process_exit()->set_step(victim.ranks[0].step);
    }
    const auto fault_at = Clock::now();
    load.Write(victim, exit_msg);
    auto aborted = [](Agent& a) { return a.aborts >= 1; };
    if (!WaitAll(all, aborted, fault_at + phase_limit)) fail("abort", all, aborted);
    else
      for (auto* a : all) abort_ms.push_back(Ms(a->last_abort - fault_at));
  }
  if (failed.empty()) {
    std::unique_lock lock(victim.mu);
    if (!victim.cv.wait_for(lock, phase_limit, [&] { return victim.restarts >= 1; })) {
      failed = "restart";
      std::fprintf(stderr, "manager_load: no RestartProcesses for the exited rank after %d s\n",
                   timeout_s);
    }
  }
  if (failed.empty()) {
    Clock::time_point hello_at;
    {
      std::lock_guard lock(victim.mu);
      hello_at = victim.hello_at;
    }
    auto next = [&](Agent& a) { return a.generation > gen_before; };
    if (!WaitAll(all, next, hello_at + phase_limit)) fail("restart_in_place", all, next);
    else
      for (auto* a : all) next_gen_ms.push_back(Ms(a->last_start - hello_at));
  }

  // A killed agent (its stream breaks): the abort at every survivor, and the generation formed
  // without it.
  Agent& killed = *load.agents[2];
  std::vector<Agent*> others;
  for (auto* a : all)
    if (a != &killed) others.push_back(a);
  if (failed.empty()) {
    uint64_t gen = 0;
    {
      std::lock_guard lock(killed.mu);
      gen = killed.generation;
    }
    const auto kill_at = Clock::now();
    killed.beating = false;
    killed.context->TryCancel();
    auto aborted = [](Agent& a) { return a.aborts >= 2; };
    auto next = [&](Agent& a) { return a.generation > gen; };
    if (!WaitAll(others, aborted, kill_at + phase_limit)) {
      fail("killed_agent_abort", others, aborted);
    } else if (!WaitAll(others, next, kill_at + phase_limit)) {
      fail("killed_agent_reform", others, next);
    } else {
      for (auto* a : others) {
        killed_detect = std::max(killed_detect, Ms(a->last_abort - kill_at));
        reform_ms.push_back(Ms(a->last_start - kill_at));
        reform_after_abort_ms.push_back(Ms(a->last_start - a->last_abort));
      }
    }
  }

  // A frozen agent (connected, heartbeats stop): declared lost after the liveness timeout.
  Agent& frozen = *load.agents[3];
  if (failed.empty()) {
    std::vector<Agent*> rest;
    for (auto* a : others)
      if (a != &frozen) rest.push_back(a);
    const auto freeze_at = Clock::now();
    frozen.beating = false;
    auto aborted = [](Agent& a) { return a.aborts >= 3; };
    if (!WaitAll(rest, aborted, freeze_at + phase_limit)) fail("frozen_agent", rest, aborted);
    else
      for (auto* a : rest) frozen_detect = std::max(frozen_detect, Ms(a->last_abort - freeze_at));
  }

  stop = true;
  for (auto& b : beater) b.join();
  const ProcStats end = Stats(manager);
  const double load_cpu = SelfCpuSeconds() - load_before;
  const double total_s = Ms(Clock::now() - t0) / 1000.0;
  uint64_t refusals = 0;
  std::string refusal;
  for (auto* a : all) {
    if (a == &frozen) continue;  // refused once it was declared lost, rightly
    std::lock_guard lock(a->mu);
    refusals += a->refusals;
    if (refusal.empty()) refusal = a->last_refusal;
  }
  for (auto* a : all) a->context->TryCancel();
  // Every call ends (bounded: a cancelled call completes at once).
  for (auto* a : all) {
    std::unique_lock lock(a->mu);
    a->cv.wait_for(lock, std::chrono::seconds(10), [&] { return a->done; });
  }
  stop_manager();
  if (!failed.empty() || refusals > 0)
    std::fprintf(stderr, "manager_load: %llu messages refused (last: %s); the manager's log ends:\n%s\n",
                 static_cast<unsigned long long>(refusals), refusal.c_str(),
                 Tail(log_file, 3000).c_str());
  if (!failed.empty() && std::getenv("REGROUP_LOAD_KEEP_LOG")) {
    std::fprintf(stderr, "manager_load: the manager's whole log is kept in %s\n", log_file.c_str());
  } else {
    cleanup_files();
  }

  const auto vote = Of(vote_rtt), abort_p = Of(abort_ms), gen = Of(next_gen_ms),
             reform = Of(reform_ms), reformed = Of(reform_after_abort_ms);
  std::printf(
      "agents=%d ranks=%d formed=%s rendezvous_ms=%.0f manager_cpu_pct=%.1f manager_rss_mb=%.1f "
      "manager_hwm_mb=%.1f vote_rtt_ms_p50=%.2f vote_rtt_ms_p99=%.2f abort_ms_p50=%.2f "
      "abort_ms_p99=%.2f next_generation_ms_p50=%.2f next_generation_ms_p99=%.2f "
      "killed_agent_abort_ms=%.1f reform_ms_p50=%.2f reform_ms_p99=%.2f "
      "reform_after_abort_ms_p99=%.2f frozen_agent_detect_ms=%.1f beat_gap_ms_max=%.1f refusals=%llu load_cpu_pct=%.1f "
      "beat_interval_ms=%d liveness_ms=%d beats=%s loadavg_1m=%s result=%s\n",
      agents_n, agents_n * nproc, rendezvous_ms > 0 && failed != "rendezvous" ? "yes" : "no",
      rendezvous_ms, cpu, steady.rss_mb, end.hwm_mb, vote.p50, vote.p99, abort_p.p50, abort_p.p99,
      gen.p50, gen.p99, killed_detect, reform.p50, reform.p99, reformed.p99, frozen_detect,
      static_cast<double>(max_gap_us.load()) / 1000.0,
      static_cast<unsigned long long>(refusals), total_s > 0 ? load_cpu / total_s * 100.0 : 0.0,
      load.beat_interval_ms.load(), liveness_misses * load.beat_interval_ms.load(),
      full_beats ? "full" : "summary", loadavg_start.c_str(), failed.empty() ? "ok" : ("failed:" + failed).c_str());
  return failed.empty() ? 0 : 1;
}
