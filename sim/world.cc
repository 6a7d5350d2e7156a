// SPDX-License-Identifier: Apache-2.0
#include "sim/world.h"

#include <algorithm>
#include <csignal>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <random>
#include <set>
#include <shared_mutex>
#include <sstream>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "agent/agent_core.h"
#include "manager/attach_core.h"
#include "manager/job_control.h"
#include "manager/options.h"
#include "plugin/attachments.h"

namespace regroup::sim {

namespace v1 = ::regroup::v1;
using manager::EmbeddedDecisions;
using manager::JobControl;
using manager::JobControlOptions;
using agent::Millis;

namespace {

constexpr int64_t kTickMs = 20;               // the manager's ticker (ServerOptions::tick)
constexpr int64_t kConnectMs = 5000;          // the manager's coordinator channel (MakeChannel)
constexpr int64_t kKeepaliveMs = 15000;       // a ping every 10 s, 5 s to answer (grpc_settings)
constexpr int64_t kTrainerBeatMs = 100;       // a trainer's heartbeat to its agent
constexpr int64_t kStoreReportMs = 500;       // the store host's word (group.py MISSING_REPORT_S)
constexpr int64_t kFenceBoundMs = 5000;       // a lost, reachable pod is told so by then
// A pod still running this long after the job stopped: its trainers get the agent's stop grace
// (--stop-grace-s, 30 s) to end on their own, then SIGTERM, and SIGKILL 5 s later.
constexpr int64_t kStoppedBoundMs = 45000;
constexpr size_t kTraceLines = 80;
constexpr int64_t kSessionMs = 1000;          // the scheduler's session: its engine ticks
constexpr int64_t kAttachBackoffMaxMs = 2000; // RemoteDecisionsOptions::max_backoff
constexpr size_t kMaxOutgoingPerFlush = 4096;

const char* kJobId = "sim/job";
const char* kEndedByManager = "the manager ended the session";

}  // namespace

const std::vector<std::string>& FaultKinds() {
  static const std::vector<std::string> kinds = {
      "crash_trainer", "kill_agent", "pause_agent", "cut_link",
      "reset_connection", "slow_link", "crash_manager", "pause_manager", "pause_trainer",
      "second_manager"};
  return kinds;
}

const std::vector<std::string>& MenuOnlyFaultKinds() {
  static const std::vector<std::string> kinds = {"unrecorded_manager", "kill_agent_at_plan"};
  return kinds;
}

std::string ReplayLine(const Options& o) {
  std::string line = "regroup-sim --seed " + std::to_string(o.seed);
  if (o.coordinator) line += " --coordinator";
  if (o.accept_no_record) line += " --accept-no-record";
  if (o.faults >= 0) line += " --faults " + std::to_string(o.faults);
  for (size_t i = 0; i < o.menu.size(); ++i) line += (i ? "," : " --menu ") + o.menu[i];
  return line + " --trace";
}

const std::vector<std::string>& CoordinatorFaultKinds() {
  static const std::vector<std::string> kinds = [] {
    std::vector<std::string> k = FaultKinds();
    k.push_back("crash_coordinator");
    k.push_back("cut_coordinator");
    k.push_back("pause_coordinator");
    return k;
  }();
  return kinds;
}

namespace {

class World;

// A simulated trainer process, speaking the trainer protocol to its agent: a hello once started,
// a heartbeat every 100 ms, a vote per step; it follows the agent's directives.
struct Trainer {
  bool alive = false;
  bool hello = false;  // said hello to its agent: connected
  int32_t pid = 0;
  v1::Phase phase = v1::PHASE_STARTING;
  bool assigned = false;
  uint64_t generation = 0;
  int64_t step = 0;
  int64_t committed = -1;
  int64_t heard = -1;  // the highest step it heard committed
  int64_t voted = -1;  // the step it voted for and has not heard the outcome of
  uint64_t epoch = 0;  // the epoch of the generation it last started
  // The generation (epoch, generation) it trains in and that no abort ended yet.
  std::pair<uint64_t, uint64_t> training_in{0, 0};
  uint64_t token = 0;  // bumped to cancel a scheduled step end
  int64_t paused_until = -1;  // SIGSTOP: its events wait until then
};

// A pod: the agent's own code (agent::AgentCore) and its trainers. The pod is the agent's host:
// its effects go to the simulated network and trainers. A replacement is a new Pod (a new uid)
// in the same slot.
struct Pod final : agent::AgentHost {
  explicit Pod(World* w) : world(w) {}
  World* world;
  int64_t slot = 0;
  std::string base_uid;  // the pod's own; the agent's uid is base_uid/<n> once it came back
  bool dead = false;
  int64_t paused_until = -1;    // SIGSTOP
  int64_t cut_until = -1;       // link cut
  int64_t slow_until = -1;
  int64_t slow_ms = 0;
  int64_t step_ms = 80;
  bool dies_at_plan = false;  // a kill_agent_at_plan fault is armed

  uint64_t stream = 0;   // the open session's stream (0: none, or still connecting)
  uint64_t session = 0;  // bumped by every OpenSession: a late event of an older one is dropped
  uint32_t port_cursor = 0;  // the free ports it reports: 4 new ones each time, as bind(0) gives
  std::vector<Trainer> ranks;
  agent::AgentOptions options;
  std::unique_ptr<agent::AgentCore> agent;
  int64_t timer_at = INT64_MAX;  // the agent's timers are due then (an event is scheduled)
  uint64_t timer_token = 0;

  const std::string& uid() const { return agent->uid(); }

  // agent::AgentHost, on the World (below).
  void OpenSession() override;
  void SendToManager(const v1::AgentMessage& message) override;
  void CancelSession() override;
  bool SendToTrainer(uint32_t r, const v1::AgentReply& reply) override;
  bool TrainerConnected(uint32_t r) const override {
    return r < ranks.size() && ranks[r].alive && ranks[r].hello;
  }
  StatusOr<int> StartProcess(uint32_t r) override;
  void Signal(int pid, int signal) override;
  std::vector<uint32_t> FreePorts() override;
  void Exit(int code, bool confirm, const std::string& sent_exits) override;
};

// One Manager.Session stream: two ordered pipes (TCP keeps order within a stream).
struct Packet {
  bool close = false;
  std::string detail;
  v1::ManagerMessage down;
  v1::AgentMessage up;
};

struct Pipe {
  std::deque<std::pair<int64_t, Packet>> queue;  // (earliest delivery, packet)
  bool pumping = false;
  int64_t last_at = 0;
};

struct Stream {
  uint64_t id = 0;
  Pod* pod = nullptr;
  uint64_t epoch = 0;   // the manager incarnation it reaches
  bool broken = false;  // reset or closed by both: nothing more is delivered
  bool agent_open = true;
  bool manager_open = true;
  int64_t node = -1;    // the manager's registered node rank for it
  Pipe down, up;
};

struct Manager {
  uint64_t epoch = 0;  // 0 until the coordinator granted one
  uint64_t mid = 0;    // the process: an incarnation before its epoch is known
  // With a coordinator: the manager's side of Attach (before `job`, which holds it), its link,
  // and whether the link's hello was answered.
  std::unique_ptr<manager::AttachCore> core;
  uint64_t link = 0;
  bool answered = false;
  int64_t backoff_ms = 100;
  int64_t coordinator_cut_until = -1;  // its link to the coordinator is cut until then
  std::unique_ptr<JobControl> job;
  std::map<int64_t, uint64_t> by_node;  // node rank -> stream
  uint64_t events_traced = 0;
  int64_t paused_until = -1;  // SIGSTOP: it reads and ticks again then
  bool recorded = true;       // standalone: it reads and writes the job's durable record
};

// The coordinator as a manager's decision maker (RemoteDecisions without its threads): facts go
// to the AttachCore's queue, which the world writes up the manager's link; directives and the
// lease come from it. The clock is the world's.
class Coordinated final : public manager::Decisions {
 public:
  Coordinated(manager::AttachCore& core, const int64_t& now) : core_(core), now_(now) {}
  void PodRunning(int64_t, const std::string&, const std::string&, int64_t) override {}
  void Fault(const v1::FaultFacts& fault, int64_t) override {
    core_.Enqueue(manager::AttachCore::FaultReport(fault));
  }
  void FaultsSettled(uint64_t generation, int64_t) override {
    core_.Enqueue(manager::AttachCore::SettledReport(generation));
  }
  void ReplacementRegistered(int64_t pod, const std::string& uid, int64_t) override {
    core_.Enqueue(manager::AttachCore::ReplacementReport(pod, uid));
  }
  void ReportProgress(uint64_t, uint64_t generation, int64_t committed_step, uint32_t live_ranks,
                      int64_t) override {
    core_.SetGeneration(generation);
    core_.Enqueue(manager::AttachCore::ProgressReport(generation, committed_step, live_ranks));
  }
  void Tick(int64_t) override {}
  std::optional<Directive> Poll() override { return core_.Poll(); }
  std::optional<Directive> Standing() const override { return core_.Standing(); }
  bool Available() const override { return core_.attached(); }
  std::optional<std::string> FencedBy() const override { return core_.fenced_by(); }
  bool ReplacesPods() const override { return true; }
  std::string WhyNoCommit() const override { return core_.WhyNoCommit(now_, "scheduler:9650"); }

 private:
  manager::AttachCore& core_;
  const int64_t& now_;
};

// The coordinator: the scheduler's engine and libregroup.so's attachment logic over it. A crash
// replaces it with a new one (the scheduler restarted).
struct Coordinator {
  uint64_t incarnation = 0;
  int64_t paused_until = -1;  // SIGSTOP of the scheduler: it reads, ticks and watches then
  // Pods that changed while it was paused, each in its last phase: its next session reports them.
  struct Sighting {
    int64_t slot;
    std::string uid;
    PodPhase phase;
  };
  std::vector<Sighting> unseen;
  std::shared_mutex engine_mu;  // Attachments takes it; one thread here
  Engine engine;
  std::unique_ptr<coordinator::Attachments> attachments;
};

// A manager's link to the coordinator (one Coordinator.Attach stream): ordered both ways.
struct Link {
  uint64_t mid = 0;
  uint64_t coordinator = 0;     // the coordinator incarnation it reaches
  bool broken = false;          // ended: nothing more is delivered
  int64_t up_at = 0, down_at = 0;  // the last delivery time each way (order)
  // What arrived while its reader could not read (a cut; a paused scheduler): read in order once
  // it can, before anything that arrives after it (a stream is ordered).
  std::deque<v1::ManagerReport> held_up;
  std::deque<std::pair<v1::CoordinatorDirective, std::string>> held_down;  // with its close
};

class World {
 public:
  explicit World(const Options& options) : options_(options), rng_(options.seed) {}

  Result Run();

 private:
  Result RunSeed();
  using Fn = std::function<void()>;
  struct Event {
    int64_t at;
    uint64_t seq;
    Fn fn;
    bool operator>(const Event& o) const { return at != o.at ? at > o.at : seq > o.seq; }
  };

  // Scheduling and randomness.
  void At(int64_t at, Fn fn) { queue_.push({std::max(at, now_), seq_++, std::move(fn)}); }
  void After(int64_t delay, Fn fn) { At(now_ + delay, std::move(fn)); }
  // An event of a pod's processes: dropped once the pod is dead, held while it is paused.
  void PodAfter(Pod* pod, int64_t delay, Fn fn);
  // An event of one trainer: as PodAfter, and held while that trainer is paused too.
  void TrainerAfter(Pod* pod, uint32_t local, int64_t delay, Fn fn);
  // Rank 0 of a generation hosts its store: while ranks of it have not arrived, it names them to
  // its agent every half second, from half a second on (python/regroup/group.py's _all_arrived).
  void StoreHostWatches(Pod* pod, uint32_t local, uint64_t epoch, uint64_t generation,
                        uint32_t world_size, int32_t pid);
  // An event of the manager incarnation `epoch`: dropped once it is gone, held while paused.
  void ManagerAfter(uint64_t epoch, int64_t delay, Fn fn);
  int64_t Uniform(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  bool Chance(double p) { return std::bernoulli_distribution(p)(rng_); }
  void Trace(const std::string& line);
  void Violate(const std::string& what);

  // Setup.
  bool DrawJob();
  void DrawFaults();
  void Inject(const std::string& kind);

  // Network.
  int64_t Latency(const Pod* pod);
  uint64_t OpenStream(Pod* pod);
  void SendDown(uint64_t stream, Packet packet);
  void SendUp(uint64_t stream, Packet packet);
  void Send(uint64_t stream, Packet packet, bool down);
  void Pump(uint64_t stream, bool down);
  void Reset(uint64_t stream, const std::string& why);

  // Manager glue (manager/service.cc, without gRPC).
  Manager* ManagerOf(uint64_t epoch) const;  // the running incarnation `epoch`, or null
  Manager* Newest() const;                   // the newest running incarnation, or null
  Manager* AnyManager();                     // a running incarnation drawn at random, or null
  void StartManager(bool recorded = true);
  void CrashManager(uint64_t epoch);
  void ManagerReceive(Stream& s, const v1::AgentMessage& message);
  void ManagerStreamDone(Stream& s);
  void ManagerClose(uint64_t stream);
  void Flush(Manager& m);
  void ManagerTick(uint64_t epoch);

  // The coordinator (Options::coordinator), the scheduler around it, and the managers' links.
  Manager* ByMid(uint64_t mid) const;  // a manager process, granted its epoch or not
  // An event of manager process `mid`: dropped once it is gone, held while it is paused.
  void MidAfter(uint64_t mid, int64_t delay, Fn fn);
  void StartCoordinator();
  void CrashCoordinator();
  void Session(uint64_t incarnation);
  void SchedulerSees(const Pod* pod, PodPhase phase);
  void SchedulerReports(int64_t slot, const std::string& uid, PodPhase phase);  // to its engine
  void SaveState();
  void Attach(uint64_t mid);
  void Promote(uint64_t mid);
  void FlushLink(Manager& m);
  void LinkUp(uint64_t link, v1::ManagerReport report);
  void LinkDown(uint64_t link, v1::CoordinatorDirective message, std::string close);
  void Deliver(std::vector<coordinator::Attachments::Outgoing> out);
  void CoordinatorHears(uint64_t link, const v1::ManagerReport& report);
  void ReadUp(uint64_t link);
  void ReadDown(uint64_t link);
  void ManagerHears(uint64_t link, const v1::CoordinatorDirective& message);
  void LinkEnds(uint64_t link, const std::string& why);  // both ends learn it
  void ManagerLinkEnded(uint64_t link, const std::string& why);
  void CutFromCoordinator(Manager& m, int64_t ms);
  // Something the scheduler's process does (its coordinator, engine or informer): at once, or
  // once its pause ends; dropped if that incarnation crashed meanwhile.
  void CoordinatorDoes(Fn fn);
  void PauseCoordinator(int64_t ms);

  // Agents: agent::AgentCore, the agent's own code, with the pod as its host.
 public:
  Pod* NewPod(int64_t slot);
  void OpenSession(Pod* pod);
  void SendToManager(Pod* pod, const v1::AgentMessage& message);
  void CancelSession(Pod* pod);
  bool SendToTrainer(Pod* pod, uint32_t local, const v1::AgentReply& reply);
  StatusOr<int> StartProcess(Pod* pod, uint32_t local);
  void Signal(Pod* pod, int pid, int signal);
  void PodExits(Pod* pod, bool replace, const std::string& why);

 private:
  // Runs one entry point of the pod's agent at the current time, then arms its timers.
  template <typename Entry>
  void Agent(Pod* pod, Entry&& entry);
  void ArmTimers(Pod* pod);
  void SessionEnded(Pod* pod, const std::string& detail, bool by_manager);
  void AgentReceive(Pod* pod, uint64_t stream, const Packet& packet);
  void Observe(Pod* pod, const v1::ManagerMessage& m);
  void CheckPlan(Pod* pod, const v1::GenerationPlan& plan, uint64_t epoch);

  // Trainers.
  void TrainerBeats(Pod* pod, uint32_t local, int32_t pid);
  void TrainerTells(Pod* pod, uint32_t local);
  void TrainerReceive(Pod* pod, uint32_t local, const v1::AgentReply& reply);
  void TrainerStarts(Pod* pod, uint32_t local, const v1::GenerationPlan& plan,
                     const v1::RankAssignment& assignment);
  void BeginStep(Pod* pod, uint32_t local);
  void StepDone(Pod* pod, uint32_t local, uint64_t token);
  void ProcessEnds(Pod* pod, uint32_t local, int32_t code, int32_t signal);

  // Invariants checked as time passes.
  void Watch();
  bool Over() const;

  Options options_;
  std::mt19937_64 rng_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> queue_;
  uint64_t seq_ = 0;
  int64_t now_ = 0;
  Result result_;
  std::deque<std::string> trace_;

  JobSpec spec_;
  JobConfig config_;
  int64_t total_steps_ = 0;
  int64_t last_fault_ms_ = 0;
  std::vector<std::string> faults_;

  // The running incarnations by epoch: one, or two while a second manager runs beside the
  // first (standalone: the durable record and the majority rule fence the older one).
  std::map<uint64_t, std::unique_ptr<Manager>> managers_;
  // With a coordinator: manager processes waiting for it to grant their epoch, by mid.
  std::map<uint64_t, std::unique_ptr<Manager>> starting_;
  uint64_t next_mid_ = 1;
  std::unique_ptr<Coordinator> coordinator_;  // null while it is down
  uint64_t coordinator_incarnations_ = 0;
  int coordinator_starts_due_ = 0;
  std::string saved_state_;          // the engine's job state, as the scheduler last saved it
  uint64_t saved_directive_ = 0;     // the directive id it was saved at
  bool uids_changed_ = false;        // a pod uid the state has not been saved with
  std::map<uint64_t, Link> links_;
  uint64_t next_link_ = 1;
  std::optional<manager::JobRecord> record_;  // on storage that outlives every incarnation
  uint64_t last_epoch_ = 0;
  std::map<uint64_t, Stream> streams_;
  uint64_t next_stream_ = 1;
  std::vector<std::unique_ptr<Pod>> pods_;  // every pod ever, in creation order
  std::vector<Pod*> slots_;                 // the newest pod of each node rank
  std::map<int64_t, int> replacements_due_;  // slot -> replacements scheduled, not yet started
  int32_t next_pid_ = 100;

  // What the invariants remember.
  std::map<std::tuple<uint64_t, uint64_t, uint32_t>, std::string> rank_holder_;  // (e, g, rank)
  std::map<std::tuple<uint64_t, uint64_t, int64_t>, std::string> node_holder_;   // (e, g, node)
  std::map<std::pair<std::string, uint32_t>, std::pair<uint64_t, uint64_t>> store_of_;  // -> (e, g)
  uint64_t highest_commit_epoch_ = 0;  // the newest incarnation that decided a commit
  // step -> the (e, g) that last committed it, as the manager decided it
  std::map<int64_t, std::pair<uint64_t, uint64_t>> committed_by_;
  // (e, g, step) -> the processes that voted for the step in that generation; (e, g) -> its size
  std::map<std::tuple<uint64_t, uint64_t, int64_t>, std::set<std::string>> votes_;
  std::map<std::pair<uint64_t, uint64_t>, uint32_t> world_of_;
  // What the real trainers' census would see of a generation: the step it resumes after, the
  // positions its ranks hold, and those where one of them holds that step's state.
  struct Census {
    int64_t step = -1;
    std::set<uint32_t> positions, held;
    bool committed = false;
  };
  std::map<std::pair<uint64_t, uint64_t>, Census> census_;
  // The global ranks that reached each generation's store (started it), for its host's word on
  // those that have not (StoreHostWatches).
  std::map<std::pair<uint64_t, uint64_t>, std::set<uint32_t>> arrived_;
  std::set<std::pair<uint64_t, std::string>> ever_lost_;  // (epoch, uid) an incarnation declared lost
  std::map<std::string, int64_t> limbo_since_;      // lost uid, alive, since
  std::map<std::string, int64_t> reachable_since_;  // not paused, link not cut, since
  bool job_stopped_ = false;
  int manager_starts_due_ = 0;  // restarts of a crashed manager scheduled, not yet started
  int64_t job_stopped_at_ = -1;
  std::string stop_reason_;
  bool finished_ = false;
};

// ---------------------------------------------------------------------------------------------
// Scheduling
// ---------------------------------------------------------------------------------------------

void World::PodAfter(Pod* pod, int64_t delay, Fn fn) {
  After(delay, [this, pod, fn = std::move(fn)]() mutable {
    if (pod->dead) return;
    if (pod->paused_until > now_) {
      const int64_t resume = pod->paused_until;
      PodAfter(pod, resume - now_, std::move(fn));
      return;
    }
    fn();
  });
}

void World::TrainerAfter(Pod* pod, uint32_t local, int64_t delay, Fn fn) {
  PodAfter(pod, delay, [this, pod, local, fn = std::move(fn)]() mutable {
    const int64_t until = pod->ranks[local].paused_until;
    if (until > now_) {
      TrainerAfter(pod, local, until - now_, std::move(fn));
      return;
    }
    fn();
  });
}

void World::ManagerAfter(uint64_t epoch, int64_t delay, Fn fn) {
  if (const Manager* m = ManagerOf(epoch)) MidAfter(m->mid, delay, std::move(fn));
}

void World::Trace(const std::string& line) {
  std::string stamped = std::to_string(now_) + " ms  " + line;
  if (options_.trace) fprintf(stderr, "%s\n", stamped.c_str());
  trace_.push_back(std::move(stamped));
  while (trace_.size() > kTraceLines) trace_.pop_front();
}

void World::Violate(const std::string& what) {
  if (!result_.ok) return;
  result_.ok = false;
  result_.violation = what;
  result_.at_ms = now_;
  Trace("VIOLATION: " + what);
}

// ---------------------------------------------------------------------------------------------
// The job and the faults, drawn from the seed
// ---------------------------------------------------------------------------------------------

bool World::DrawJob() {
  static const std::vector<std::string> kStrategies = {
      "recover-in-place,recover,elastic-training", "retry,recover-in-place,elastic-training",
      "recover,elastic-training", "elastic-training", "recover-in-place,elastic-training,dump"};
  spec_.id = kJobId;
  spec_.uid = "sim-job-uid";
  spec_.pods = std::vector<int64_t>{2, 3, 4, 6}[static_cast<size_t>(Uniform(0, 3))];
  spec_.processes_per_pod = Uniform(1, 2);
  spec_.labels = {{"fault-scheduling", "force"}};
  spec_.annotations = {
      {"recover-strategy", kStrategies[static_cast<size_t>(Uniform(0, 4))]},
      {"wait-reschedule-timeout", "30"}};
  if (Chance(0.5)) spec_.annotations["regroup.io/prefer-elastic"] = "true";
  if (Chance(0.3)) spec_.annotations["regroup.io/tensor-parallel"] = "2";
  auto resolved = spec_.Resolve();
  if (!resolved.ok()) {
    spec_.annotations.erase("regroup.io/tensor-parallel");
    resolved = spec_.Resolve();
  }
  if (!resolved.ok()) return false;
  config_ = resolved.config;
  total_steps_ = Uniform(300, 700);
  std::ostringstream out;
  out << spec_.pods << " pods x " << spec_.processes_per_pod << " ranks, strategies "
      << spec_.annotations["recover-strategy"]
      << (spec_.annotations.count("regroup.io/prefer-elastic") ? ", prefer-elastic" : "")
      << (spec_.annotations.count("regroup.io/tensor-parallel") ? ", tp 2" : "") << ", "
      << total_steps_ << " steps";
  result_.setup = out.str();
  return true;
}

void World::DrawFaults() {
  const std::vector<std::string>& menu =
      !options_.menu.empty() ? options_.menu
      : options_.coordinator ? CoordinatorFaultKinds()
                             : FaultKinds();
  const int count = options_.faults >= 0 ? options_.faults : static_cast<int>(Uniform(0, 6));
  std::vector<int64_t> times;
  for (int i = 0; i < count; ++i) times.push_back(Uniform(3000, options_.fault_window_ms));
  std::sort(times.begin(), times.end());
  std::string drawn;
  for (int64_t t : times) {
    const std::string kind = menu[static_cast<size_t>(Uniform(0, static_cast<int64_t>(menu.size()) - 1))];
    drawn += (drawn.empty() ? "" : ", ") + kind + "@" + std::to_string(t);
    At(t, [this, kind] { Inject(kind); });
    last_fault_ms_ = std::max(last_fault_ms_, t);
  }
  result_.setup += "; faults: " + (drawn.empty() ? std::string("none") : drawn);
}

void World::Inject(const std::string& kind) {
  if (Over()) return;
  if (kind == "pause_manager") {
    // SIGSTOP: it neither ticks nor reads; mostly short, sometimes past the liveness timeout
    // many times over (below the keepalive, which would end its streams).
    Manager* any = AnyManager();
    if (!any) return;
    Manager& m = *any;
    const int64_t ms = Chance(0.2) ? Uniform(3000, 12000) : Uniform(100, 3000);
    Trace("FAULT pause_manager (epoch " + std::to_string(m.epoch) + ") for " +
          std::to_string(ms) + " ms");
    m.paused_until = std::max(m.paused_until, now_ + ms);
    return;
  }
  if (kind == "crash_manager") {
    Manager* m = Newest();
    if (!m) return;
    Trace("FAULT crash_manager (epoch " + std::to_string(m->epoch) + ")");
    CrashManager(m->epoch);
    ++manager_starts_due_;
    After(Uniform(500, 3000), [this] {
      --manager_starts_due_;
      StartManager();
    });
    return;
  }
  if (kind == "unrecorded_manager") {
    // A second manager started as a launcher that gives no --record starts one (standalone, or
    // with the coordinator's address): regroup-manager's command line decides whether it runs.
    Manager* old = Newest();
    if (!old) return;
    std::vector<std::string> args = {"--job-id", kJobId, "--nodes", std::to_string(spec_.pods)};
    if (options_.coordinator) args.insert(args.end(), {"--coordinator", "sim-coordinator:8899"});
    if (options_.accept_no_record) args.push_back("--no-record");
    const auto line = manager::ParseCommandLine(args, EnvOf({}));
    if (!line.ok()) {
      ++result_.refused_starts;
      Trace("FAULT unrecorded_manager beside epoch " + std::to_string(old->epoch) +
            ": refused: " + line.status().message());
      return;
    }
    const uint64_t epoch = old->epoch;
    const int64_t ms = Uniform(1000, 30000);
    Trace("FAULT unrecorded_manager beside epoch " + std::to_string(epoch) + ", which ends in " +
          std::to_string(ms) + " ms");
    StartManager(/*recorded=*/!line->options.record_file.empty() || options_.coordinator);
    After(ms, [this, epoch] {
      if (!ManagerOf(epoch)) return;
      Trace("manager epoch " + std::to_string(epoch) + " ends (its pod is deleted)");
      CrashManager(epoch);
    });
    return;
  }
  if (kind == "second_manager") {
    // A second incarnation starts while the first still runs (its node was cut off and it was
    // rescheduled, or an operator started one): new sessions reach either, and the older runs
    // until its end, drawn here (its pod deleted at last).
    Manager* old = Newest();
    if (!old) return;
    const uint64_t epoch = old->epoch;
    const int64_t ms = Uniform(1000, 30000);
    Trace("FAULT second_manager beside epoch " + std::to_string(epoch) + ", which ends in " +
          std::to_string(ms) + " ms");
    // With a coordinator, half the time the older one's node is cut off from it (why a second
    // one was started): it never hears of the newer one, and only its lease running out stops
    // its commits.
    if (options_.coordinator && Chance(0.5)) CutFromCoordinator(*old, ms + 1);
    StartManager();
    After(ms, [this, epoch] {
      if (!ManagerOf(epoch)) return;
      Trace("manager epoch " + std::to_string(epoch) + " ends (its pod is deleted)");
      CrashManager(epoch);
    });
    return;
  }
  if (kind == "crash_coordinator") {
    if (!coordinator_) return;
    Trace("FAULT crash_coordinator (incarnation " + std::to_string(coordinator_->incarnation) +
          "): the scheduler restarts");
    CrashCoordinator();
    return;
  }
  if (kind == "pause_coordinator") {
    // SIGSTOP of the scheduler: nothing reaches its coordinator, its engine does not tick, its
    // informer sees nothing; mostly short, sometimes past the lease and the keepalive.
    if (!coordinator_) return;
    const int64_t ms = Chance(0.2) ? Uniform(3000, 25000) : Uniform(100, 3000);
    Trace("FAULT pause_coordinator (incarnation " + std::to_string(coordinator_->incarnation) +
          ") for " + std::to_string(ms) + " ms");
    PauseCoordinator(ms);
    return;
  }
  if (kind == "cut_coordinator") {
    // One manager and the coordinator cannot reach each other (a partition of its node).
    Manager* m = options_.coordinator ? AnyManager() : nullptr;
    if (!m) return;
    const int64_t ms = Uniform(500, 20000);
    Trace("FAULT cut_coordinator from epoch " + std::to_string(m->epoch) + " for " +
          std::to_string(ms) + " ms");
    CutFromCoordinator(*m, ms);
    return;
  }
  std::vector<Pod*> live;
  for (Pod* p : slots_)
    if (p && !p->dead && !p->agent->stopping() && !p->agent->leaving()) live.push_back(p);
  if (live.empty()) return;
  Pod* pod = live[static_cast<size_t>(Uniform(0, static_cast<int64_t>(live.size()) - 1))];
  const std::string who = " " + pod->uid();
  if (kind == "crash_trainer") {
    std::vector<uint32_t> alive;
    for (uint32_t l = 0; l < pod->ranks.size(); ++l)
      if (pod->ranks[l].alive) alive.push_back(l);
    if (alive.empty()) return;
    const uint32_t l = alive[static_cast<size_t>(Uniform(0, static_cast<int64_t>(alive.size()) - 1))];
    Trace("FAULT crash_trainer" + who + " local rank " + std::to_string(l));
    ProcessEnds(pod, l, 1, 0);
  } else if (kind == "pause_trainer") {
    // SIGSTOP of one trainer: it neither beats nor steps nor reads; sometimes past the hang
    // timeout (its rank is then frozen for the manager).
    std::vector<uint32_t> alive;
    for (uint32_t l = 0; l < pod->ranks.size(); ++l)
      if (pod->ranks[l].alive) alive.push_back(l);
    if (alive.empty()) return;
    const uint32_t l = alive[static_cast<size_t>(Uniform(0, static_cast<int64_t>(alive.size()) - 1))];
    const int64_t ms = Chance(0.2) ? Uniform(5000, 40000) : Uniform(200, 3000);
    Trace("FAULT pause_trainer" + who + " local rank " + std::to_string(l) + " for " +
          std::to_string(ms) + " ms");
    Trainer& t = pod->ranks[l];
    t.paused_until = std::max(t.paused_until, now_ + ms);
  } else if (kind == "kill_agent") {
    Trace("FAULT kill_agent" + who);
    PodExits(pod, /*replace=*/true, "killed");
  } else if (kind == "kill_agent_at_plan") {
    // The pod's node dies as the next plan that gives it ranks reaches it: before its trainers
    // reach the generation's store (AgentReceive).
    Trace("FAULT kill_agent_at_plan" + who + " (armed)");
    pod->dies_at_plan = true;
  } else if (kind == "pause_agent" || kind == "cut_link") {
    // A pause (SIGSTOP) or a cut link: nothing reaches the agent until it ends; one that
    // outlasts the keepalive ends the stream too.
    const bool pause = kind == "pause_agent";
    const int64_t ms = !pause ? Uniform(500, 20000)
                       : Chance(0.1) ? Uniform(3000, 20000) : Uniform(200, 3000);
    Trace("FAULT " + kind + who + " for " + std::to_string(ms) + " ms");
    int64_t& until = pause ? pod->paused_until : pod->cut_until;
    until = std::max(until, now_ + ms);
    if (ms >= kKeepaliveMs && pod->stream) {
      const uint64_t s = pod->stream;
      After(kKeepaliveMs, [this, s] { Reset(s, "keepalive: no answer to the server's ping"); });
    }
  } else if (kind == "reset_connection") {
    if (!pod->stream) return;
    Trace("FAULT reset_connection" + who);
    Reset(pod->stream, "connection reset");
  } else if (kind == "slow_link") {
    pod->slow_ms = Uniform(100, 400);
    pod->slow_until = now_ + Uniform(2000, 10000);
    Trace("FAULT slow_link" + who + ": " + std::to_string(pod->slow_ms) + " ms until " +
          std::to_string(pod->slow_until));
  }
}

// ---------------------------------------------------------------------------------------------
// Network
// ---------------------------------------------------------------------------------------------

int64_t World::Latency(const Pod* pod) {
  int64_t ms = Uniform(1, 3);
  if (Chance(0.02)) ms += Uniform(10, 60);
  if (pod->slow_until > now_) ms += pod->slow_ms;
  return ms;
}

uint64_t World::OpenStream(Pod* pod) {
  const uint64_t id = next_stream_++;
  Stream& s = streams_[id];
  s.id = id;
  s.pod = pod;
  // With two incarnations running, a new connection reaches either (a service in front of
  // both, or an address that moved).
  const Manager* m = AnyManager();
  s.epoch = m ? m->epoch : 0;
  return id;
}

void World::SendDown(uint64_t id, Packet packet) { Send(id, std::move(packet), true); }
void World::SendUp(uint64_t id, Packet packet) { Send(id, std::move(packet), false); }

void World::Send(uint64_t id, Packet packet, bool down) {
  Stream& s = streams_.at(id);
  bool& open = down ? s.manager_open : s.agent_open;
  if (s.broken || !open) return;
  if (packet.close) open = false;
  Pipe& p = down ? s.down : s.up;
  p.last_at = std::max(now_ + Latency(s.pod), p.last_at);
  p.queue.emplace_back(p.last_at, std::move(packet));
  if (!p.pumping) {
    p.pumping = true;
    At(p.queue.front().first, [this, id, down] { Pump(id, down); });
  }
}

// Delivers a pipe's packets in order: held while the link is cut (TCP retransmits) or, towards
// the agent, while it is paused.
void World::Pump(uint64_t id, bool down) {
  Stream& s = streams_.at(id);
  Pipe& p = down ? s.down : s.up;
  if (s.broken) {
    p.queue.clear();
    p.pumping = false;
    return;
  }
  Pod* pod = s.pod;
  int64_t held = pod->cut_until;
  if (down && !pod->dead) held = std::max(held, pod->paused_until);
  Manager* m = ManagerOf(s.epoch);
  if (!down && m) held = std::max(held, m->paused_until);
  if (held > now_) {
    At(held, [this, id, down] { Pump(id, down); });
    return;
  }
  Packet packet = std::move(p.queue.front().second);
  p.queue.pop_front();
  if (!p.queue.empty()) At(p.queue.front().first, [this, id, down] { Pump(id, down); });
  else p.pumping = false;
  if (down) {
    if (!pod->dead) AgentReceive(pod, id, packet);
  } else if (m) {
    if (packet.close) ManagerStreamDone(s);
    else ManagerReceive(s, packet.up);
  }
}

// Both ends learn that the stream broke; what was in flight is lost.
void World::Reset(uint64_t id, const std::string& why) {
  Stream& s = streams_.at(id);
  if (s.broken) return;
  s.broken = true;
  Trace("stream " + std::to_string(id) + " of " + s.pod->uid() + " broke: " + why);
  Pod* pod = s.pod;
  if (s.agent_open)
    PodAfter(pod, Latency(pod), [this, pod, id, why] {
      if (pod->stream == id) SessionEnded(pod, why, false);
    });
  const uint64_t epoch = s.epoch;
  if (s.manager_open)
    ManagerAfter(epoch, Latency(pod), [this, id] { ManagerStreamDone(streams_.at(id)); });
  s.agent_open = s.manager_open = false;
}

// ---------------------------------------------------------------------------------------------
// The manager
// ---------------------------------------------------------------------------------------------

void World::StartManager(bool recorded) {
  if (options_.coordinator) {
    // regroup-manager with a coordinator: it serves no agent before it is granted its epoch.
    auto m = std::make_unique<Manager>();
    m->mid = next_mid_++;
    m->core = std::make_unique<manager::AttachCore>(kJobId, 65536);
    const uint64_t mid = m->mid;
    starting_[mid] = std::move(m);
    Trace("manager process " + std::to_string(mid) + " starts and attaches to the coordinator");
    MidAfter(mid, Uniform(1, 50), [this, mid] { Attach(mid); });
    return;
  }
  JobControlOptions o;
  o.epoch = ++last_epoch_;  // standalone the clock in ms: above every earlier incarnation's
  o.join_window_ms = 10000;
  if (recorded) {
    o.record = record_;
    o.stored_record = [this]() -> const std::optional<manager::JobRecord>& { return record_; };
  }
  auto m = std::make_unique<Manager>();
  m->epoch = o.epoch;
  m->mid = next_mid_++;
  m->recorded = recorded;
  m->job = std::make_unique<JobControl>(spec_, config_, o,
                                        std::make_unique<EmbeddedDecisions>(spec_));
  managers_[o.epoch] = std::move(m);
  Trace("manager epoch " + std::to_string(o.epoch) + " starts" +
        (recorded ? "" : ", without a record (--no-record)"));
  const uint64_t epoch = o.epoch;
  ManagerAfter(epoch, kTickMs, [this, epoch] { ManagerTick(epoch); });
}

Manager* World::ManagerOf(uint64_t epoch) const {
  auto it = managers_.find(epoch);
  return it == managers_.end() ? nullptr : it->second.get();
}

Manager* World::Newest() const {
  return managers_.empty() ? nullptr : managers_.rbegin()->second.get();
}

Manager* World::AnyManager() {
  if (managers_.empty()) return nullptr;
  const int64_t i = Uniform(0, static_cast<int64_t>(managers_.size()) - 1);
  return std::next(managers_.begin(), i)->second.get();
}

void World::CrashManager(uint64_t epoch) {
  for (auto& [id, s] : streams_)
    if (!s.broken && s.epoch == epoch) {
      s.manager_open = false;  // nobody left to notice on this side
      Reset(id, "the manager crashed");
    }
  if (Manager* m = ManagerOf(epoch); m && m->link) LinkEnds(m->link, "the manager crashed");
  managers_.erase(epoch);
}

void World::ManagerTick(uint64_t epoch) {
  Manager* m = ManagerOf(epoch);
  if (!m) return;
  if (m->core) m->core->RenewLease(now_);
  m->job->Tick(now_);
  Flush(*m);
  ManagerAfter(epoch, kTickMs, [this, epoch] { ManagerTick(epoch); });
}

void World::ManagerReceive(Stream& s, const v1::AgentMessage& message) {
  Manager& m = *ManagerOf(s.epoch);
  JobControl& job = *m.job;
  if (s.node < 0) {
    Status st = message.has_register_()
                    ? Status::Ok()
                    : FailedPrecondition("the first message of a session must be Register");
    int64_t node = -1;
    if (st.ok()) {
      auto registered = job.Register(s.id, message.header(), message.register_(), now_);
      if (registered.ok()) node = *registered;
      else st = registered.status();
    }
    if (!st.ok()) {
      const bool fenced = message.has_register_() && job.IsFenced(message.register_().pod_uid());
      Trace("manager refuses " + s.pod->uid() + ": " + st.message() + (fenced ? " (fenced)" : ""));
      // A replacement is never refused for a pod that is lost or gone.
      const std::string held = "is held by pod ";
      if (auto at = st.message().find(held); at != std::string::npos) {
        const std::string holder = st.message().substr(at + held.size(),
                                                       st.message().find(';', at) - at - held.size());
        // Gone as far as this manager can know: declared lost, or dead with its end read (its
        // stream closed here). Until then the node rank is a live pod's (a stalled manager may
        // read the replacement's Register before the old stream's end), and the replacement
        // registers again.
        // (This incarnation's word only: another may have declared it lost before this one
        // welcomed it.)
        bool gone = ever_lost_.count({m.epoch, holder}) > 0;
        for (const auto& p : pods_) {
          if (p->uid() != holder || !p->dead) continue;
          bool open_here = false;
          for (const auto& [sid, st] : streams_)
            open_here |= st.pod == p.get() && st.epoch == m.epoch && st.manager_open;
          gone |= !open_here;
        }
        if (gone)
          Violate("replacement " + s.pod->uid() + " refused for node rank " +
                  std::to_string(s.pod->slot) + ", held by " + holder + ", which is lost or gone");
      }
      Packet p;
      p.down = job.MakeRefusal(st.message(), fenced,
                               fenced && job.MayReadmit(message.register_().pod_uid()));
      SendDown(s.id, p);
      ManagerClose(s.id);
      return;
    }
    if (auto old = m.by_node.find(node); old != m.by_node.end() && old->second != s.id)
      ManagerClose(old->second);
    s.node = node;
    m.by_node[node] = s.id;
  } else {
    Status st = job.Handle(s.id, message, now_);
    if (!st.ok()) {
      Packet p;
      p.down = job.MakeRefusal(st.message());
      SendDown(s.id, p);
    }
  }
  Flush(m);
}

// The manager ends a stream (after what it queued on it).
void World::ManagerClose(uint64_t id) {
  Stream& s = streams_.at(id);
  if (!s.manager_open) return;
  Packet close;
  close.close = true;
  close.detail = kEndedByManager;
  SendDown(id, close);
  ManagerStreamDone(s);
}

void World::ManagerStreamDone(Stream& s) {
  Manager* m = ManagerOf(s.epoch);
  if (!m) return;
  s.manager_open = false;
  if (s.node >= 0) {
    auto it = m->by_node.find(s.node);
    if (it != m->by_node.end() && it->second == s.id) m->by_node.erase(it);
  }
  m->job->Disconnected(s.id, now_);
  Flush(*m);
}

void World::Flush(Manager& m) {
  if (auto r = m.job->TakeRecord(); r && m.recorded) {
    std::string why;
    if (auto merged = manager::MergeJobRecord(record_, *r, &why)) record_ = std::move(*merged);
    else m.job->Superseded(why, now_);
  }
  auto out = m.job->TakeOutgoing();
  if (out.size() > kMaxOutgoingPerFlush)
    Violate("the manager queued " + std::to_string(out.size()) + " messages in one turn");
  for (auto& o : out) {
    // Who committed a step is the manager's decision, known when it is made: a pod may hear it
    // after the next generation's plan has named that generation (its link was slow).
    // A commit sent again naming no committer (generation 0: an older incarnation made it) is
    // no decision.
    if (o.message.has_outcome() && o.message.outcome().commit() &&
        o.message.outcome().generation() != 0) {
      const int64_t step = o.message.outcome().step();
      // Fencing: at most one incarnation commits steps; once a newer one decided a commit, no
      // older one decides another (two running side by side included).
      if (m.epoch < highest_commit_epoch_)
        Violate("epoch " + std::to_string(m.epoch) + " commits step " + std::to_string(step) +
                " after epoch " + std::to_string(highest_commit_epoch_) +
                " committed: a fenced incarnation commits");
      highest_commit_epoch_ = std::max(highest_commit_epoch_, m.epoch);
      committed_by_.insert_or_assign(
          step, std::make_pair(m.epoch, o.message.outcome().generation()));
      if (auto c = census_.find({m.epoch, o.message.outcome().generation()});
          c != census_.end() && !c->second.committed) {
        c->second.committed = true;
        if (c->second.step >= 0 && c->second.held != c->second.positions) {
          ++result_.census_gaps;
          Trace("census gap: generation (" + std::to_string(m.epoch) + ", " +
                std::to_string(o.message.outcome().generation()) + ") resumed after step " +
                std::to_string(c->second.step) + ", which none of its ranks held at some position");
        }
      }
    }
    auto it = m.by_node.find(o.node_rank);
    if (it == m.by_node.end()) continue;
    const uint64_t id = it->second;
    Packet p;
    p.down = std::move(o.message);
    SendDown(id, std::move(p));
    if (o.close) ManagerClose(id);
  }
  // The manager's own events, into the trace.
  const JobControl& job = *m.job;
  const uint64_t fresh = job.events_logged() - m.events_traced;
  for (size_t i = job.events().size() - std::min<uint64_t>(fresh, job.events().size());
       i < job.events().size(); ++i) {
    result_.aborts += job.events()[i].kind() == "abort";
    result_.superseded += job.events()[i].kind() == "superseded";
    result_.state_lost += job.events()[i].kind() == "fault" &&
                          job.events()[i].message().rfind("state_lost:", 0) == 0;
    result_.lost_by_the_stores_word +=
        job.events()[i].kind() == "fault" &&
        job.events()[i].message().rfind("pod_lost:", 0) == 0 &&
        job.events()[i].message().find("have not reached the store") != std::string::npos;
    // A rescheduling goes back to the newest checkpoint by design (MindCluster's job and pod
    // level restarts): what trainers heard committed before it binds no later plan.
    if (job.events()[i].kind() == "job_rescheduling" || job.events()[i].kind() == "pod_rescheduling")
      for (const auto& pod : pods_)
        for (Trainer& t : pod->ranks) t.heard = -1;
    Trace("manager " + std::to_string(m.epoch) + ": " + job.events()[i].kind() + ": " +
          job.events()[i].message());
  }
  m.events_traced = job.events_logged();
  // Lost pods, as this incarnation sees them.
  for (Pod* pod : slots_)
    if (pod && job.IsFenced(pod->uid())) ever_lost_.insert({m.epoch, pod->uid()});
  if (m.core) FlushLink(m);
}

// ---------------------------------------------------------------------------------------------
// The coordinator, the scheduler around it, and the managers' links to it
// ---------------------------------------------------------------------------------------------

Manager* World::ByMid(uint64_t mid) const {
  if (auto it = starting_.find(mid); it != starting_.end()) return it->second.get();
  for (const auto& [epoch, m] : managers_)
    if (m->mid == mid) return m.get();
  return nullptr;
}

void World::MidAfter(uint64_t mid, int64_t delay, Fn fn) {
  After(delay, [this, mid, fn = std::move(fn)]() mutable {
    Manager* m = ByMid(mid);
    if (!m) return;
    if (m->paused_until > now_) {
      MidAfter(mid, m->paused_until - now_, std::move(fn));
      return;
    }
    fn();
  });
}

// The scheduler (re)starts: a fresh engine with the job, its state as last saved on the PodGroup,
// and the pods it finds running; a fresh coordinator over it, which knows no lease granted before.
void World::StartCoordinator() {
  auto c = std::make_unique<Coordinator>();
  c->incarnation = ++coordinator_incarnations_;
  Status st = c->engine.UpsertJob(spec_, nullptr, now_);
  if (st.ok() && !saved_state_.empty())
    st = c->engine.FindJob(kJobId)->LoadState(nlohmann::json::parse(saved_state_));
  if (!st.ok()) Violate("the scheduler's engine cannot take the job back: " + st.message());
  c->attachments = std::make_unique<coordinator::Attachments>(
      c->engine_mu, c->engine, "", coordinator::kDefaultLeaseMs, [this] { return now_; });
  const uint64_t incarnation = c->incarnation;
  coordinator_ = std::move(c);
  Trace("coordinator incarnation " + std::to_string(incarnation) + " starts" +
        (saved_state_.empty() ? "" : " from the saved state"));
  for (const Pod* pod : slots_)
    if (pod && !pod->dead) SchedulerSees(pod, REGROUP_POD_RUNNING);
  After(kSessionMs, [this, incarnation] { Session(incarnation); });
}

void World::CrashCoordinator() {
  for (auto& [id, link] : links_)
    if (!link.broken && link.coordinator == coordinator_->incarnation)
      LinkEnds(id, "the coordinator crashed");
  coordinator_.reset();
  ++coordinator_starts_due_;
  After(Uniform(1000, 10000), [this] {
    --coordinator_starts_due_;
    StartCoordinator();
  });
}

// The scheduler's session: the engine ticks, changed directives go down the links, and the job's
// state is saved when its directive changed (as the plugin saves it to the PodGroup).
void World::Session(uint64_t incarnation) {
  if (!coordinator_ || coordinator_->incarnation != incarnation) return;
  if (coordinator_->paused_until > now_)
    return CoordinatorDoes([this, incarnation] { Session(incarnation); });
  coordinator_->engine.Tick(now_);
  Deliver(coordinator_->attachments->Publish());
  SaveState();
  // The pods the engine gave up are deleted; the job controller creates them again.
  if (const Job* job = coordinator_->engine.FindJob(kJobId))
    for (const Eviction& e : job->Evictions()) {
      Pod* pod = slots_[static_cast<size_t>(e.pod)];
      if (!pod || pod->dead || pod->base_uid != e.uid) continue;
      Trace("the scheduler evicts " + pod->uid() + ": the engine gave it up");
      PodExits(pod, /*replace=*/true, "evicted by the scheduler");
    }
  After(kSessionMs, [this, incarnation] { Session(incarnation); });
}

void World::SaveState() {
  if (!coordinator_) return;
  const Job* job = coordinator_->engine.FindJob(kJobId);
  if (!job || (job->directive().id == saved_directive_ && !uids_changed_ &&
               !coordinator_->attachments->SaveWanted(kJobId)))
    return;
  auto exported = coordinator_->attachments->ExportJobState(kJobId);
  if (!exported) return;
  saved_directive_ = job->directive().id;
  uids_changed_ = false;
  saved_state_ = exported->first.dump();
  coordinator_->attachments->Saved(kJobId, exported->second);  // stored: its facts are acknowledged
}

// What the scheduler sees of a pod (its Kubernetes uid is the agent's first one).
void World::SchedulerSees(const Pod* pod, PodPhase phase) {
  if (!coordinator_) return;
  if (coordinator_->paused_until <= now_) return SchedulerReports(pod->slot, pod->base_uid, phase);
  // Paused, it sees nothing; the session after reports what it finds then, as the plugin's
  // reportPods does: each pod in its last phase, per slot the incarnations that ended first.
  auto& unseen = coordinator_->unseen;
  const bool due = !unseen.empty();
  std::erase_if(unseen, [&](const Coordinator::Sighting& s) { return s.uid == pod->base_uid; });
  unseen.push_back({pod->slot, pod->base_uid, phase});
  if (due) return;
  CoordinatorDoes([this] {
    auto found = std::move(coordinator_->unseen);
    coordinator_->unseen.clear();
    std::stable_sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
      const bool a_ended = a.phase != REGROUP_POD_RUNNING, b_ended = b.phase != REGROUP_POD_RUNNING;
      return a.slot != b.slot ? a.slot < b.slot : a_ended && !b_ended;
    });
    for (const auto& s : found) SchedulerReports(s.slot, s.uid, s.phase);
  });
}

void World::SchedulerReports(int64_t slot, const std::string& uid, PodPhase phase) {
  Status st = coordinator_->engine.SetPodState(kJobId, slot, uid, phase,
                                               "node-" + std::to_string(slot), now_);
  if (!st.ok()) Violate("the scheduler's engine refuses pod " + uid + ": " + st.message());
  uids_changed_ |= phase == REGROUP_POD_RUNNING;  // a new uid: the plugin saves the state then
}

// The manager opens a link with its hello (an epoch asked for, or the one granted with its
// ticket). A coordinator that is down refuses the connection.
void World::Attach(uint64_t mid) {
  Manager* m = ByMid(mid);
  if (!m || m->link || m->core->fenced_by()) return;
  const uint64_t id = next_link_++;
  Link& link = links_[id];
  link.mid = mid;
  link.coordinator = coordinator_ ? coordinator_->incarnation : 0;
  m->link = id;
  m->answered = false;
  if (!coordinator_) {
    link.broken = true;
    MidAfter(mid, Uniform(1, 3), [this, id] { ManagerLinkEnded(id, "connection refused"); });
    return;
  }
  if (m->coordinator_cut_until > now_ || coordinator_->paused_until >= now_ + kConnectMs) {
    // The connection cannot be made (a paused scheduler's kernel accepts it, but nobody
    // answers the handshake); the attempt times out (MakeChannel's connect timeout).
    link.broken = true;
    MidAfter(mid, kConnectMs, [this, id] { ManagerLinkEnded(id, "connection timed out"); });
    return;
  }
  LinkUp(id, m->core->Hello(now_));
}

// Granted its epoch: the manager builds its job control with it and serves its agents.
void World::Promote(uint64_t mid) {
  auto it = starting_.find(mid);
  if (it == starting_.end()) return;
  std::unique_ptr<Manager> m = std::move(it->second);
  starting_.erase(it);
  m->epoch = m->core->epoch();
  JobControlOptions o;
  o.epoch = m->epoch;
  o.join_window_ms = 10000;
  m->job = std::make_unique<JobControl>(spec_, config_, o,
                                        std::make_unique<Coordinated>(*m->core, now_));
  const uint64_t epoch = m->epoch;
  if (managers_.count(epoch)) {
    Violate("the coordinator granted epoch " + std::to_string(epoch) + " twice");
    return;
  }
  managers_[epoch] = std::move(m);
  Trace("manager process " + std::to_string(mid) + " is granted epoch " + std::to_string(epoch));
  ManagerAfter(epoch, kTickMs, [this, epoch] { ManagerTick(epoch); });
}

// The facts the manager queued, up its link once attached (a write is buffered at once).
void World::FlushLink(Manager& m) {
  if (!m.link || !m.core->attached()) return;
  while (const v1::ManagerReport* r = m.core->NextToWrite()) {
    LinkUp(m.link, *r);
    m.core->Written();
  }
}

void World::LinkUp(uint64_t id, v1::ManagerReport report) {
  Link& link = links_.at(id);
  if (link.broken) return;
  link.up_at = std::max(now_ + Uniform(1, 3), link.up_at);
  At(link.up_at, [this, id, report = std::move(report)] { CoordinatorHears(id, report); });
}

void World::CoordinatorHears(uint64_t id, const v1::ManagerReport& report) {
  Link& link = links_.at(id);
  link.held_up.push_back(report);
  if (link.held_up.size() == 1) ReadUp(id);
}

// The coordinator reads what reached it, in order, while it can.
void World::ReadUp(uint64_t id) {
  Link& link = links_.at(id);
  while (!link.held_up.empty()) {
    if (link.broken || !coordinator_ || coordinator_->incarnation != link.coordinator) {
      link.held_up.clear();
      return;
    }
    const Manager* m = ByMid(link.mid);
    const int64_t until =
        std::max(m ? m->coordinator_cut_until : -1, coordinator_->paused_until);
    if (until > now_) {
      At(until, [this, id] { ReadUp(id); });
      return;
    }
    const v1::ManagerReport report = std::move(link.held_up.front());
    link.held_up.pop_front();
    Deliver(coordinator_->attachments->OnReport(id, report, now_, ""));
  }
}

void World::Deliver(std::vector<coordinator::Attachments::Outgoing> out) {
  for (auto& o : out) {
    auto it = links_.find(o.stream);
    if (it == links_.end() || it->second.broken) continue;
    std::string close;
    if (o.close) {
      close = o.status.message().empty() ? std::string("the coordinator ended the stream")
                                         : o.status.message();
      coordinator_->attachments->OnClosed(o.stream);
    }
    LinkDown(o.stream, std::move(o.message), std::move(close));
    if (o.close) it->second.broken = true;  // nothing more is read on this side
  }
}

// A message down a link, then its end when `close` says why.
void World::LinkDown(uint64_t id, v1::CoordinatorDirective message, std::string close) {
  Link& link = links_.at(id);
  link.down_at = std::max(now_ + Uniform(1, 3), link.down_at);
  const uint64_t mid = link.mid;
  std::function<void()> deliver = [this, id, mid, message = std::move(message),
                                   close = std::move(close)]() mutable {
    const Manager* m = ByMid(mid);
    if (!m || m->link != id) return;
    Link& link = links_.at(id);
    link.held_down.emplace_back(std::move(message), std::move(close));
    if (link.held_down.size() == 1) ReadDown(id);
  };
  const int64_t at = link.down_at;
  MidAfter(mid, at - now_, std::move(deliver));
}

// The manager reads what reached it, in order, while its link is not cut.
void World::ReadDown(uint64_t id) {
  Link& link = links_.at(id);
  while (!link.held_down.empty()) {
    const Manager* m = ByMid(link.mid);
    if (!m || m->link != id) {
      link.held_down.clear();
      return;
    }
    if (m->coordinator_cut_until > now_) {
      MidAfter(link.mid, m->coordinator_cut_until - now_, [this, id] { ReadDown(id); });
      return;
    }
    auto [message, close] = std::move(link.held_down.front());
    link.held_down.pop_front();
    ManagerHears(id, message);
    if (!close.empty()) ManagerLinkEnded(id, close);
  }
}

void World::ManagerHears(uint64_t id, const v1::CoordinatorDirective& message) {
  Manager* m = ByMid(links_.at(id).mid);
  if (!m || m->link != id) return;
  if (!m->answered) {
    m->answered = true;
    const std::string failure = m->core->OnAnswer(message);
    if (!failure.empty()) {
      Trace("manager process " + std::to_string(m->mid) + " not attached: " + failure);
      LinkEnds(id, failure);  // the manager cancels the call
      return;
    }
    m->backoff_ms = 100;
    Trace("manager process " + std::to_string(m->mid) + " attached as epoch " +
          std::to_string(m->core->epoch()));
    if (starting_.count(m->mid)) {
      Promote(m->mid);
      m = ByMid(links_.at(id).mid);
      if (!m) return;
    }
  } else {
    m->core->OnMessage(message);
  }
  if (m->job) Flush(*m);
  else FlushLink(*m);
}

// A link ends for both: the coordinator forgets the stream, the manager detaches and attaches
// again after its backoff (unless fenced for good).
void World::LinkEnds(uint64_t id, const std::string& why) {
  Link& link = links_.at(id);
  if (link.broken) return;
  link.broken = true;
  if (coordinator_ && coordinator_->incarnation == link.coordinator)
    CoordinatorDoes([this, id] { coordinator_->attachments->OnClosed(id); });
  const uint64_t mid = link.mid;
  MidAfter(mid, Uniform(1, 3), [this, id, why] { ManagerLinkEnded(id, why); });
}

void World::ManagerLinkEnded(uint64_t id, const std::string& why) {
  Manager* m = ByMid(links_.at(id).mid);
  if (!m || m->link != id) return;
  links_.at(id).broken = true;
  m->link = 0;
  m->core->Detached();
  m->core->Failed(why);
  if (m->core->fenced_by()) {
    Trace("manager process " + std::to_string(m->mid) + " is fenced: " + *m->core->fenced_by());
    if (m->job) Flush(*m);
    return;
  }
  const uint64_t mid = m->mid;
  const int64_t backoff = m->backoff_ms;
  m->backoff_ms = std::min(backoff * 2, kAttachBackoffMaxMs);
  MidAfter(mid, backoff, [this, mid] { Attach(mid); });
}

// Manager `m` and the coordinator cannot reach each other for `ms`; a cut that outlasts the
// keepalive ends its link.
void World::CutFromCoordinator(Manager& m, int64_t ms) {
  m.coordinator_cut_until = std::max(m.coordinator_cut_until, now_ + ms);
  if (ms < kKeepaliveMs || !m.link) return;
  const uint64_t id = m.link;
  After(kKeepaliveMs, [this, id] { LinkEnds(id, "keepalive: no answer to the ping"); });
}

void World::CoordinatorDoes(Fn fn) {
  if (!coordinator_) return;
  if (coordinator_->paused_until <= now_) return fn();
  At(coordinator_->paused_until,
     [this, incarnation = coordinator_->incarnation, fn = std::move(fn)]() mutable {
       if (coordinator_ && coordinator_->incarnation == incarnation) CoordinatorDoes(std::move(fn));
     });
}

// The scheduler is paused for `ms`: what reaches it waits (in order), and past the keepalive
// every manager ends its link, unanswered.
void World::PauseCoordinator(int64_t ms) {
  coordinator_->paused_until = std::max(coordinator_->paused_until, now_ + ms);
  if (ms < kKeepaliveMs) return;
  for (const auto& [id, link] : links_)
    if (!link.broken && link.coordinator == coordinator_->incarnation)
      After(kKeepaliveMs, [this, id = id] { LinkEnds(id, "keepalive: no answer to the ping"); });
}

// ---------------------------------------------------------------------------------------------
// Agents (agent::AgentCore, the agent's own code) and trainers
// ---------------------------------------------------------------------------------------------

void Pod::OpenSession() { world->OpenSession(this); }
void Pod::SendToManager(const v1::AgentMessage& message) { world->SendToManager(this, message); }
void Pod::CancelSession() { world->CancelSession(this); }
bool Pod::SendToTrainer(uint32_t r, const v1::AgentReply& reply) {
  return world->SendToTrainer(this, r, reply);
}
StatusOr<int> Pod::StartProcess(uint32_t r) { return world->StartProcess(this, r); }
void Pod::Signal(int pid, int signal) { world->Signal(this, pid, signal); }
std::vector<uint32_t> Pod::FreePorts() {
  std::vector<uint32_t> ports;
  for (int i = 0; i < 4; ++i) ports.push_back(32768 + (port_cursor++ % 28000));
  return ports;
}
void Pod::Exit(int code, bool, const std::string&) {
  world->PodExits(this, /*replace=*/code != 0, "the agent exits with code " + std::to_string(code));
}

Pod* World::NewPod(int64_t slot) {
  auto pod = std::make_unique<Pod>(this);
  pod->slot = slot;
  int generation = 0;
  for (const auto& p : pods_) generation += p->slot == slot;
  pod->base_uid =
      "pod-" + std::to_string(slot) + (generation ? "-r" + std::to_string(generation) : "");
  pod->step_ms = Uniform(40, 120);
  pod->ranks.resize(static_cast<size_t>(spec_.processes_per_pod));
  agent::AgentOptions& o = pod->options;
  o.manager_addr = "manager";
  o.job_id = kJobId;
  o.pod_uid = o.pod_name = pod->base_uid;
  o.node_name = "node-" + std::to_string(slot);
  o.host = "10.0.0." + std::to_string(slot);
  o.node_rank = static_cast<int>(slot);
  o.nproc = static_cast<int>(spec_.processes_per_pod);
  pod->agent = std::make_unique<agent::AgentCore>(pod->options, pod.get());
  Pod* raw = pod.get();
  pods_.push_back(std::move(pod));
  slots_[static_cast<size_t>(slot)] = raw;
  Trace("pod " + raw->base_uid + " starts");
  SchedulerSees(raw, REGROUP_POD_RUNNING);
  PodAfter(raw, Uniform(1, 50), [this, raw] { Agent(raw, [](agent::AgentCore& a, Millis now) { a.Start(now); }); });
  return raw;
}

template <typename Entry>
void World::Agent(Pod* pod, Entry&& entry) {
  if (pod->dead) return;
  entry(*pod->agent, Millis(now_));
  ArmTimers(pod);
}

// The agent's timers: one event at its next deadline (its loop's epoll timeout).
void World::ArmTimers(Pod* pod) {
  if (pod->dead) return;
  const int64_t at = pod->agent->NextDeadline(Millis(now_)).count();
  if (at >= pod->timer_at && pod->timer_at > now_) return;
  pod->timer_at = at;
  const uint64_t token = ++pod->timer_token;
  PodAfter(pod, at - now_, [this, pod, token] {
    if (pod->timer_token != token) return;
    pod->timer_at = INT64_MAX;
    Agent(pod, [](agent::AgentCore& a, Millis now) { a.OnTimers(now); });
  });
}

// A new session: the channel connects (or is refused, or times out on a cut link), then the
// stream opens and the agent registers.
void World::OpenSession(Pod* pod) {
  const uint64_t session = ++pod->session;
  pod->stream = 0;
  if (managers_.empty() || pod->cut_until > now_) {
    // Connection refused (no manager listening) or timed out (the link is cut).
    const int64_t ms = managers_.empty() ? Uniform(1, 5) : Uniform(1000, 2000);
    PodAfter(pod, ms, [this, pod, session] {
      if (pod->session == session) SessionEnded(pod, "unavailable", false);
    });
    return;
  }
  pod->stream = OpenStream(pod);
  PodAfter(pod, Latency(pod), [this, pod, session] {
    if (pod->session == session && pod->stream)
      Agent(pod, [](agent::AgentCore& a, Millis now) { a.OnSessionOpened(now); });
  });
}

void World::SendToManager(Pod* pod, const v1::AgentMessage& message) {
  if (!pod->stream) return;
  if (message.has_process_exit())
    Trace(pod->uid() + " reports local rank " + std::to_string(message.process_exit().local_rank()) +
          " exited with code " + std::to_string(message.process_exit().exit_code()));
  Packet p;
  p.up = message;
  SendUp(pod->stream, std::move(p));
}

// The agent cancels its call (to register again at once): gRPC reports it to the agent at once.
void World::CancelSession(Pod* pod) {
  const uint64_t session = pod->session;
  if (pod->stream) {
    Packet close;
    close.close = true;
    SendUp(pod->stream, close);
  }
  PodAfter(pod, 1, [this, pod, session] {
    if (pod->session == session) SessionEnded(pod, "cancelled", false);
  });
}

void World::SessionEnded(Pod* pod, const std::string& detail, bool by_manager) {
  if (pod->dead) return;
  if (pod->stream) streams_.at(pod->stream).agent_open = false;
  pod->stream = 0;
  ++pod->session;
  Agent(pod, [&](agent::AgentCore& a, Millis now) { a.OnSessionClosed(now, detail, by_manager); });
}

void World::AgentReceive(Pod* pod, uint64_t stream, const Packet& packet) {
  if (pod->stream != stream) return;  // an old session's leftovers
  if (packet.close) {
    SessionEnded(pod, packet.detail, packet.detail == kEndedByManager);
    return;
  }
  Observe(pod, packet.down);
  if (pod->dies_at_plan && packet.down.has_start() && packet.down.start().plan().ranks_size() > 0) {
    Trace("FAULT kill_agent_at_plan " + pod->uid() + ": killed as generation " +
          std::to_string(packet.down.start().plan().generation()) + "'s plan reached it");
    PodExits(pod, /*replace=*/true, "killed");
    return;
  }
  Agent(pod, [&](agent::AgentCore& a, Millis now) { a.OnManagerMessage(now, packet.down); });
}

// What the invariants learn from a manager message the agent is about to follow (one of a lower
// epoch than the agent's it ignores).
void World::Observe(Pod* pod, const v1::ManagerMessage& m) {
  const uint64_t epoch = m.header().epoch();
  if (epoch < pod->agent->epoch()) return;
  switch (m.body_case()) {
    case v1::ManagerMessage::kWelcome:
      Trace(pod->uid() + (m.welcome().resumed() ? " resumed its session" : " welcomed") +
            " as node rank " + std::to_string(m.welcome().node_rank()) + " by epoch " +
            std::to_string(epoch));
      break;
    case v1::ManagerMessage::kStart: {
      const v1::GenerationPlan& plan = m.start().plan();
      if (pod->agent->stopping() || (plan.epoch() != 0 && plan.epoch() < epoch)) break;
      CheckPlan(pod, plan, epoch);
      break;
    }
    case v1::ManagerMessage::kStop: {
      const v1::StopTraining& stop = m.stop();
      // A stop for the whole job (not a standby, not this pod's planned departure, not an
      // incarnation stopping only itself: fenced, or giving up; its pods come back to another).
      if (stop.mode() != v1::StopTraining::MODE_STANDBY && !job_stopped_ &&
          stop.reason().rfind("planned departure", 0) != 0 && !stop.incarnation_only()) {
        job_stopped_ = true;
        job_stopped_at_ = now_;
        stop_reason_ = stop.reason();
        finished_ = stop.reason().rfind("training finished", 0) == 0;
      }
      break;
    }
    case v1::ManagerMessage::kRefusal:
      Trace(pod->uid() + " refused" + (m.refusal().fenced() ? " (fenced" : "") +
            (m.refusal().readmit() ? ", may come back)" : m.refusal().fenced() ? ")" : "") +
            ": " + m.refusal().reason());
      break;
    default:
      break;
  }
}

// One membership per generation, a store per generation, and the committer a plan names.
void World::CheckPlan(Pod* pod, const v1::GenerationPlan& plan, uint64_t epoch) {
  // A plan that names the generation that committed its step names the one that did: a rank
  // applies its own vote for the step only when it voted in that generation.
  const std::pair<uint64_t, uint64_t> named{plan.committed_epoch(), plan.committed_generation()};
  world_of_.emplace(std::make_pair(epoch, plan.generation()), plan.world_size());
  // A restarted manager may finish a vote the one before it did not decide, naming the
  // generation that cast it, when every rank of that generation voted for the step: its
  // decision, here.
  if (auto by = committed_by_.find(plan.committed_step());
      named != std::pair<uint64_t, uint64_t>{0, 0} && (by == committed_by_.end() || by->second != named)) {
    auto world = world_of_.find(named);
    auto votes = votes_.find({named.first, named.second, plan.committed_step()});
    if (world != world_of_.end() && votes != votes_.end() && votes->second.size() == world->second) {
      if (epoch < highest_commit_epoch_)
        Violate("epoch " + std::to_string(epoch) + " finishes the vote of step " +
                std::to_string(plan.committed_step()) + " after epoch " +
                std::to_string(highest_commit_epoch_) + " committed: a fenced incarnation commits");
      highest_commit_epoch_ = std::max(highest_commit_epoch_, epoch);
      committed_by_.insert_or_assign(plan.committed_step(), named);
      by = committed_by_.find(plan.committed_step());
    }
  }
  if (auto by = committed_by_.find(plan.committed_step());
      named != std::pair<uint64_t, uint64_t>{0, 0} && by != committed_by_.end() && by->second != named)
    Violate("generation (" + std::to_string(epoch) + ", " + std::to_string(plan.generation()) +
            ") says step " + std::to_string(plan.committed_step()) + " was committed by (" +
            std::to_string(named.first) + ", " + std::to_string(named.second) + "), but (" +
            std::to_string(by->second.first) + ", " + std::to_string(by->second.second) +
            ") committed it");
  // A store per generation: a port a recent generation's store may still hold is never given to
  // the next (its rank 0 could not listen, and its ranks would read the older one's keys).
  const auto store = std::make_pair(plan.store_host(), plan.store_port());
  if (auto [it, added] = store_of_.emplace(store, std::make_pair(epoch, plan.generation()));
      !added && it->second != std::make_pair(epoch, plan.generation())) {
    if (it->second.first == epoch && plan.generation() - it->second.second < 16)
      Violate("generation (" + std::to_string(epoch) + ", " + std::to_string(plan.generation()) +
              ") has its store on " + store.first + ":" + std::to_string(store.second) +
              ", the store of generation " + std::to_string(it->second.second));
    it->second = {epoch, plan.generation()};
  }
  // One membership per generation.
  const auto node_key = std::make_tuple(epoch, plan.generation(), pod->slot);
  if (auto [it, added] = node_holder_.emplace(node_key, pod->uid());
      !added && it->second != pod->uid())
    Violate("node rank " + std::to_string(pod->slot) + " of generation (" +
            std::to_string(epoch) + ", " + std::to_string(plan.generation()) + ") is held by " +
            it->second + " and " + pod->uid());
  uint32_t assigned = 0;
  for (const auto& a : plan.ranks()) {
    if (a.local_rank() >= pod->ranks.size()) continue;
    const auto key = std::make_tuple(epoch, plan.generation(), a.rank());
    const std::string me = pod->uid() + "/" + std::to_string(a.local_rank());
    if (auto [it, added] = rank_holder_.emplace(key, me); !added && it->second != me)
      Violate("rank " + std::to_string(a.rank()) + " of generation (" + std::to_string(epoch) +
              ", " + std::to_string(plan.generation()) + ") is held by " + it->second + " and " + me);
    ++assigned;
  }
  Trace(pod->uid() + " starts generation (" + std::to_string(epoch) + ", " +
        std::to_string(plan.generation()) + ") after step " +
        std::to_string(plan.committed_step()) + " with " + std::to_string(assigned) + " ranks");
}

StatusOr<int> World::StartProcess(Pod* pod, uint32_t local) {
  Trainer& t = pod->ranks[local];
  t = Trainer();
  t.alive = true;
  t.pid = next_pid_++;
  const int32_t pid = t.pid;
  TrainerAfter(pod, local, Uniform(200, 1500), [this, pod, local, pid] {
    Trainer& t = pod->ranks[local];
    if (!t.alive || t.pid != pid) return;
    t.hello = true;
    t.phase = v1::PHASE_PAUSED;
    v1::TrainerHello hello;
    hello.set_pid(static_cast<uint32_t>(pid));
    hello.set_committed_step(-1);
    hello.set_heard_commit_step(-1);
    Agent(pod, [&](agent::AgentCore& a, Millis now) { a.OnHello(now, local, hello); });
    TrainerBeats(pod, local, pid);
  });
  return pid;
}

void World::TrainerBeats(Pod* pod, uint32_t local, int32_t pid) {
  Trainer& t = pod->ranks[local];
  if (!t.alive || t.pid != pid) return;
  TrainerTells(pod, local);
  TrainerAfter(pod, local, kTrainerBeatMs, [this, pod, local, pid] { TrainerBeats(pod, local, pid); });
}

// A trainer's status as python/regroup/trainer.py reports it: outside a step (paused, or
// receiving the state) no step (-1), so that a rank that dies while the job waits is not blamed
// on the step the job resumes at (the engine's poison-step guard).
void World::TrainerTells(Pod* pod, uint32_t local) {
  const Trainer& t = pod->ranks[local];
  const bool outside = t.phase == v1::PHASE_PAUSED || t.phase == v1::PHASE_SYNCING;
  v1::TrainerMessage beat;
  beat.mutable_heartbeat()->set_step(outside ? -1 : t.step);
  beat.mutable_heartbeat()->set_phase(t.phase);
  Agent(pod, [&](agent::AgentCore& a, Millis now) { a.OnTrainerMessage(now, local, beat); });
}

// The trainer reads what its agent sent (the socket hands it over at once; it acts on it as an
// event of its own, never inside the agent's call).
bool World::SendToTrainer(Pod* pod, uint32_t local, const v1::AgentReply& reply) {
  if (!pod->TrainerConnected(local)) return false;
  const int32_t pid = pod->ranks[local].pid;
  TrainerAfter(pod, local, 0, [this, pod, local, pid, reply] {
    if (pod->ranks[local].alive && pod->ranks[local].pid == pid) TrainerReceive(pod, local, reply);
  });
  return true;
}

void World::TrainerReceive(Pod* pod, uint32_t local, const v1::AgentReply& reply) {
  Trainer& t = pod->ranks[local];
  switch (reply.body_case()) {
    case v1::AgentReply::kStart:
      TrainerStarts(pod, local, reply.start().plan(), reply.start().assignment());
      break;
    case v1::AgentReply::kOutcome: {
      const v1::StepOutcome& outcome = reply.outcome();
      // Heard, standing by too: its agent reports it, and no later plan may undo it.
      if (outcome.commit()) t.heard = std::max(t.heard, outcome.step());
      if (outcome.step() >= t.voted) t.voted = -1;
      if (!t.assigned || t.generation != outcome.generation() || t.step != outcome.step() ||
          t.phase != v1::PHASE_VOTED)
        break;
      if (outcome.commit()) {
        t.committed = outcome.step();
        ++result_.commits;
        ++t.step;
      }
      BeginStep(pod, local);  // the next step, or the same one again after a rollback
      break;
    }
    case v1::AgentReply::kAbort:
      if (t.phase != v1::PHASE_DONE) t.phase = v1::PHASE_PAUSED;
      ++t.token;
      if (reply.abort().generation() >= t.training_in.second) t.training_in = {0, 0};
      TrainerTells(pod, local);  // leaving a step is told at once
      break;
    case v1::AgentReply::kPause:
      if (t.phase != v1::PHASE_DONE) t.phase = v1::PHASE_PAUSED;
      ++t.token;  // the step in flight waits
      TrainerTells(pod, local);
      break;
    case v1::AgentReply::kStop:
      ++t.token;
      t.assigned = false;
      t.training_in = {0, 0};
      if (reply.stop().mode() == v1::StopTraining::MODE_STANDBY) {
        if (t.phase != v1::PHASE_DONE) t.phase = v1::PHASE_PAUSED;
        break;
      }
      // Exit, dump or leave: the trainer ends on its own (a dump writes its checkpoint first).
      TrainerAfter(pod, local, Uniform(5, 200), [this, pod, local, pid = t.pid] {
        if (pod->ranks[local].alive && pod->ranks[local].pid == pid) ProcessEnds(pod, local, 0, 0);
      });
      break;
    default:
      break;
  }
}

void World::TrainerStarts(Pod* pod, uint32_t local, const v1::GenerationPlan& plan,
                          const v1::RankAssignment&) {
  Trainer& t = pod->ranks[local];
  const uint64_t epoch = plan.epoch();
  // Commits never go backwards: no live trainer heard a commit the plan undoes.
  if (t.heard > plan.committed_step())
    Violate("generation (" + std::to_string(epoch) + ", " + std::to_string(plan.generation()) +
            ") resumes after step " + std::to_string(plan.committed_step()) + ", but " +
            pod->uid() + " local rank " + std::to_string(local) + " heard step " +
            std::to_string(t.heard) + " committed");
  // A generation's ranks leave it on its abort: one not aborted holds them (in its rendezvous,
  // or its collectives) until the collective timeout, whatever starts after it.
  if (t.training_in.first == epoch && t.training_in.second != 0 &&
      plan.generation() > t.training_in.second)
    Violate(pod->uid() + " local rank " + std::to_string(local) + " starts generation (" +
            std::to_string(epoch) + ", " + std::to_string(plan.generation()) +
            ") while it trains in generation " + std::to_string(t.training_in.second) +
            ", which was never aborted");
  // The census: does this rank hold the state at the plan's step (its own, or the step it voted
  // for, committed by the generation it voted in)?
  const int64_t c = plan.committed_step();
  const std::pair<uint64_t, uint64_t> by{plan.committed_epoch(), plan.committed_generation()};
  const bool own_vote = by == std::pair<uint64_t, uint64_t>{0, 0} ||
                        by == std::make_pair(t.epoch, t.generation);
  const bool holds = t.committed == c || (t.voted == c && t.committed + 1 == c && own_vote);
  const uint32_t replica_size = std::max(1u, plan.tensor_parallel() * plan.pipeline_parallel());
  for (const auto& a : plan.ranks())
    if (a.local_rank() == local) {
      arrived_[{epoch, plan.generation()}].insert(a.rank());
      if (a.rank() == 0)
        TrainerAfter(pod, local, kStoreReportMs,
                     [this, pod, local, epoch, g = plan.generation(), n = plan.world_size(),
                      pid = t.pid] { StoreHostWatches(pod, local, epoch, g, n, pid); });
      Census& census = census_[{epoch, plan.generation()}];
      census.step = c;
      census.positions.insert(a.rank() % replica_size);
      if (holds) census.held.insert(a.rank() % replica_size);
    }
  ++t.token;
  t.assigned = true;
  t.epoch = epoch;
  t.voted = -1;
  t.training_in = {epoch, plan.generation()};
  // State sync: every rank of the generation holds the plan's committed step (a step it holds
  // so is not one it heard committed). The census of the real trainers is measured above, not
  // modelled: a plan whose step nobody at some position holds would fail it there.
  t.generation = plan.generation();
  t.committed = plan.committed_step();
  t.step = plan.committed_step() + 1;
  BeginStep(pod, local);
}

void World::StoreHostWatches(Pod* pod, uint32_t local, uint64_t epoch, uint64_t generation,
                             uint32_t world_size, int32_t pid) {
  const Trainer& t = pod->ranks[local];
  if (!t.alive || t.pid != pid || t.training_in != std::make_pair(epoch, generation)) return;
  const std::set<uint32_t>& arrived = arrived_[{epoch, generation}];
  v1::TrainerMessage word;
  auto* f = word.mutable_fault();
  for (uint32_t r = 0; r < world_size; ++r)
    if (!arrived.count(r)) f->add_missing_ranks(r);
  if (f->missing_ranks_size() == 0) return;  // all arrived: the wait is over
  f->set_kind(v1::FAULT_KIND_COLLECTIVE_ERROR);
  f->set_generation(generation);
  f->set_step(t.step);
  f->set_early(true);
  f->set_detail("ranks have not reached the store");
  Trace(pod->uid() + " local rank " + std::to_string(local) + " (the store's host) names " +
        std::to_string(f->missing_ranks_size()) + " ranks of generation " +
        std::to_string(generation) + " not arrived");
  Agent(pod, [&](agent::AgentCore& a, Millis now) { a.OnTrainerMessage(now, local, word); });
  TrainerAfter(pod, local, kStoreReportMs, [this, pod, local, epoch, generation, world_size, pid] {
    StoreHostWatches(pod, local, epoch, generation, world_size, pid);
  });
}

void World::BeginStep(Pod* pod, uint32_t local) {
  Trainer& t = pod->ranks[local];
  if (t.step >= total_steps_) {  // training done: the process exits 0
    t.phase = v1::PHASE_DONE;
    ProcessEnds(pod, local, 0, 0);
    return;
  }
  t.phase = v1::PHASE_COMPUTING;
  // The first moment of a step is told at once, as python/regroup/trainer.py does: the agent
  // then knows the trainer holds the step before it.
  TrainerTells(pod, local);
  const uint64_t token = ++t.token;
  TrainerAfter(pod, local, pod->step_ms + Uniform(0, 20), [this, pod, local, token] {
    StepDone(pod, local, token);
  });
}

void World::StepDone(Pod* pod, uint32_t local, uint64_t token) {
  Trainer& t = pod->ranks[local];
  if (!t.alive || t.token != token) return;
  t.phase = v1::PHASE_VOTED;
  t.voted = t.step;
  votes_[{t.epoch, t.generation, t.step}].insert(pod->uid() + "/" + std::to_string(local));
  v1::TrainerMessage vote;
  vote.mutable_vote()->set_generation(t.generation);
  vote.mutable_vote()->set_step(t.step);
  vote.mutable_vote()->set_ok(true);
  Agent(pod, [&](agent::AgentCore& a, Millis now) { a.OnTrainerMessage(now, local, vote); });
}

// A trainer's process ends; its agent sees it at once (SIGCHLD).
void World::ProcessEnds(Pod* pod, uint32_t local, int32_t code, int32_t signal) {
  Trainer& t = pod->ranks[local];
  if (!t.alive) return;
  t.alive = false;
  ++t.token;
  Agent(pod, [&](agent::AgentCore& a, Millis now) { a.OnProcessExit(now, local, code, signal); });
}

void World::Signal(Pod* pod, int pid, int signal) {
  for (uint32_t l = 0; l < pod->ranks.size(); ++l) {
    Trainer& t = pod->ranks[l];
    if (!t.alive || t.pid != pid) continue;
    // A stopped process dies of SIGKILL at once; of SIGTERM once it runs again.
    const int64_t at = signal == SIGKILL ? now_ : std::max(now_, t.paused_until);
    PodAfter(pod, at - now_ + 1, [this, pod, l, pid, signal] {
      Trainer& t = pod->ranks[l];
      if (!t.alive || t.pid != pid) return;
      t.alive = false;  // gone; the agent reaps it as an event of its own
      ++t.token;
      Agent(pod, [&](agent::AgentCore& a, Millis now) { a.OnProcessExit(now, l, -1, signal); });
    });
  }
}

void World::PodExits(Pod* pod, bool replace, const std::string& why) {
  if (pod->dead) return;
  Trace(pod->uid() + " exits: " + why);
  pod->dead = true;
  if (pod->stream) {
    // The kernel ends the connection of a dead process at once.
    const uint64_t id = pod->stream;
    Stream& s = streams_.at(id);
    if (!s.broken && s.agent_open) {
      Packet close;
      close.close = true;
      SendUp(id, close);
    }
  }
  if (replace) SchedulerSees(pod, REGROUP_POD_FAILED);
  if (replace && !job_stopped_) {
    const int64_t slot = pod->slot;
    ++replacements_due_[slot];
    After(Uniform(1000, 8000), [this, slot] {
      --replacements_due_[slot];
      if (!job_stopped_ && slots_[static_cast<size_t>(slot)]->dead) NewPod(slot);
    });
  }
}

// ---------------------------------------------------------------------------------------------
// Invariants over time, and the end
// ---------------------------------------------------------------------------------------------

void World::Watch() {
  // The job ends without a stop of its own when no incarnation is left to run it: every manager
  // running stopped only itself (the newest gave up for want of a majority; one fenced is
  // older), and none is on its way. (A stop of the job is seen as its pods get it: Observe.)
  if (!job_stopped_ && !managers_.empty() && manager_starts_due_ == 0 && starting_.empty() &&
      std::all_of(managers_.begin(), managers_.end(),
                  [](const auto& m) {
                    const v1::StopTraining* stop = m.second->job->stopped();
                    return stop && stop->incarnation_only();
                  })) {
    job_stopped_ = true;
    job_stopped_at_ = now_;
    stop_reason_ = Newest()->job->stopped()->reason();
    Trace("the job is over: no manager incarnation is left to run it (" + stop_reason_ + ")");
  }
  for (Pod* pod : slots_) {
    if (!pod || pod->dead) continue;
    // What a pod can be told needs it reachable (not paused, its link not cut), the manager it
    // follows running (not paused), and so the manager its session reaches now (with two
    // incarnations running, a pod whose stream broke may reconnect to the other).
    const Manager* m = ManagerOf(pod->agent->epoch());
    const auto session = pod->stream ? streams_.find(pod->stream) : streams_.end();
    const Manager* reached = session != streams_.end() ? ManagerOf(session->second.epoch) : nullptr;
    if (pod->paused_until > now_ || pod->cut_until > now_ || (m && m->paused_until > now_) ||
        (reached && reached->paused_until > now_)) {
      reachable_since_.erase(pod->uid());
      continue;
    }
    const int64_t since = reachable_since_.emplace(pod->uid(), now_).first->second;
    // A pod declared lost is told so and stops, or is readmitted, within a bound.
    const bool lost = m && m->job->IsFenced(pod->uid());
    if (!lost) {
      limbo_since_.erase(pod->uid());
    } else {
      const int64_t from = std::max(since, limbo_since_.emplace(pod->uid(), now_).first->second);
      // Told so, its agent stops its trainers: within the stop bound (a stopped trainer gets
      // the stop grace before SIGKILL).
      const int64_t bound = pod->agent->stopping() ? kStoppedBoundMs : kFenceBoundMs;
      if (now_ - from > bound)
        Violate(pod->uid() + " was declared lost and is still alive and reachable " +
                std::to_string(now_ - from) + " ms later, neither stopped nor readmitted");
    }
    // Every pod stops once the job did.
    if (job_stopped_ && now_ - std::max(since, job_stopped_at_) > kStoppedBoundMs)
      Violate(pod->uid() + " still runs " + std::to_string(now_ - job_stopped_at_) +
              " ms after the job stopped (" + stop_reason_ + ")");
  }
  for (const auto& [epoch, m] : managers_)
    if (m->job->events().size() > 256)
      Violate("manager epoch " + std::to_string(epoch) + "'s event log holds " +
              std::to_string(m->job->events().size()) + " events");
  for (const auto& [id, s] : streams_)
    if (s.down.queue.size() > 100000 || s.up.queue.size() > 100000)
      Violate("stream " + std::to_string(id) + " queues more than 100,000 messages");
}

bool World::Over() const {
  for (Pod* pod : slots_)
    if (pod && !pod->dead) return false;
  for (const auto& [slot, due] : replacements_due_)
    if (due > 0) return false;
  return true;
}

Result World::Run() {
  // The agents' logs would drown the trace: silent for the run.
  const spdlog::level::level_enum level = spdlog::get_level();
  spdlog::set_level(spdlog::level::off);
  Result result = RunSeed();
  spdlog::set_level(level);
  return result;
}

Result World::RunSeed() {
  if (!DrawJob()) {
    result_.ok = false;
    result_.violation = "the drawn job does not validate: " + result_.setup;
    return result_;
  }
  DrawFaults();
  slots_.assign(static_cast<size_t>(spec_.pods), nullptr);
  if (options_.coordinator) StartCoordinator();
  StartManager();
  for (int64_t n = 0; n < spec_.pods; ++n) NewPod(n);
  const int64_t deadline = options_.fault_window_ms + options_.quiet_bound_ms;
  int64_t next_watch = 0;
  while (!queue_.empty() && result_.ok) {
    Event e = queue_.top();
    queue_.pop();
    now_ = e.at;
    ++result_.events;
    e.fn();
    if (now_ >= next_watch) {
      Watch();
      next_watch = now_ + 100;
      if (Over()) break;
    }
    if (now_ > deadline) {
      std::string phase = "no manager";
      if (const Manager* m = Newest()) {
        const auto s = m->job->StatusReport();
        phase = "phase " + s.phase() + " at generation " + std::to_string(s.generation()) +
                ", committed step " + std::to_string(s.committed_step());
      }
      if (coordinator_)
        if (const Job* job = coordinator_->engine.FindJob(kJobId))
          Trace("the coordinator's engine: " + job->StateJson().dump());
      Violate("liveness: the job neither finished nor stopped " +
              std::to_string(deadline - last_fault_ms_) + " ms after the last fault (" + phase +
              ")");
    }
  }
  // Every pod gone and nothing decided (no finish, no stop of the job's own) is a liveness
  // failure: the job is over and nobody can say why.
  if (result_.ok && !finished_ && !job_stopped_)
    Violate("liveness: every pod is gone and the job neither finished nor stopped");
  if (result_.ok) {
    result_.at_ms = now_;
    result_.outcome = finished_ ? "finished" : "stopped: " + stop_reason_;
  } else {
    result_.trace.assign(trace_.begin(), trace_.end());
  }
  return result_;
}

}  // namespace

Result Run(const Options& options) { return World(options).Run(); }

}  // namespace regroup::sim
