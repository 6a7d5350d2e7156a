#include "sim/world.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <random>
#include <set>
#include <sstream>

#include "agent/vote_tally.h"
#include "manager/job_control.h"

namespace regroup::sim {

namespace v1 = ::regroup::v1;
using manager::EmbeddedDecisions;
using manager::JobControl;
using manager::JobControlOptions;

namespace {

constexpr int64_t kTickMs = 20;               // the manager's ticker (ServerOptions::tick)
constexpr int64_t kKeepaliveMs = 15000;       // a ping every 10 s, 5 s to answer (grpc_settings)
constexpr int64_t kReconnectTimeoutMs = 60000;  // the agent's --reconnect-timeout-s default
constexpr int64_t kMaxBackoffMs = 500;        // the agent's reconnect backoff, 100 ms doubling
constexpr int64_t kDoneGraceMs = 5000;        // an agent whose trainers finished exits by then
constexpr int64_t kFenceBoundMs = 5000;       // a lost, reachable pod is told so by then
constexpr int64_t kStoppedBoundMs = 10000;    // a pod still running this long after the job stopped
constexpr size_t kTraceLines = 80;
constexpr size_t kMaxOutgoingPerFlush = 4096;

const char* kJobId = "sim/job";
const char* kEndedByManager = "the manager ended the session";

}  // namespace

const std::vector<std::string>& FaultKinds() {
  static const std::vector<std::string> kinds = {
      "crash_trainer", "kill_agent", "pause_agent", "cut_link",
      "reset_connection", "slow_link", "crash_manager"};
  return kinds;
}

namespace {

// A simulated trainer process.
struct Trainer {
  bool alive = true;
  bool hello = false;  // said hello to its agent (no longer STARTING)
  int32_t pid = 0;
  v1::Phase phase = v1::PHASE_STARTING;
  bool assigned = false;
  uint64_t generation = 0;
  int64_t step = 0;
  int64_t committed = -1;
  int64_t heard = -1;
  std::pair<uint64_t, uint64_t> heard_by{0, 0};  // the generation whose commit of `heard` it heard
  uint64_t token = 0;  // bumped to cancel a scheduled step end or hello
};

// A pod: one agent and its trainers. A replacement is a new Pod (a new uid) in the same slot.
struct Pod {
  int64_t slot = 0;
  std::string uid;
  std::string base_uid;  // the pod's own; uid is base_uid/<n> once it came back n-1 times
  int readmissions = 0;
  bool dead = false;
  bool stopping = false;        // told to stop by the manager (or done)
  int64_t paused_until = -1;    // SIGSTOP
  int64_t cut_until = -1;       // link cut
  int64_t slow_until = -1;
  int64_t slow_ms = 0;
  int64_t step_ms = 80;

  enum class Link { kDown, kRegistering, kUp } link = Link::kDown;
  uint64_t stream = 0;
  uint64_t epoch = 0;
  uint64_t generation = 0;
  int64_t outage_since = -1;
  int64_t backoff_ms = 100;
  bool reregister_now = false;
  std::deque<v1::AgentMessage> pending;
  std::deque<v1::AgentMessage> unconfirmed;  // sent in this session; again if it resumes
  int64_t heartbeat_ms = 100;
  uint64_t heartbeat_token = 0;
  int64_t liveness_ms = 500;  // Welcome.liveness_timeout_ms
  uint64_t pause_token = 0;   // bumped to cancel a pending pause of the trainers
  uint32_t last_generation_agents = 0;
  // The generation (epoch, generation) this pod's ranks train in and that no abort ended yet.
  std::pair<uint64_t, uint64_t> training_in{0, 0};
  uint32_t port_cursor = 0;  // the free ports it reports: 4 new ones each time, as bind(0) gives
  agent::VoteTally tally;
  std::vector<Trainer> ranks;
  int64_t done_at = -1;  // every trainer exited 0
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
  uint64_t epoch = 0;
  std::unique_ptr<JobControl> job;
  std::map<int64_t, uint64_t> by_node;  // node rank -> stream
  uint64_t events_traced = 0;
};

class World {
 public:
  explicit World(const Options& options) : options_(options), rng_(options.seed) {}

  Result Run();

 private:
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
  void StartManager();
  void CrashManager();
  void ManagerReceive(Stream& s, const v1::AgentMessage& message);
  void ManagerStreamDone(Stream& s);
  void ManagerClose(uint64_t stream);
  void Flush();
  void ManagerTick(uint64_t epoch);

  // Agent model (agent/agent.cc's contract).
  Pod* NewPod(int64_t slot);
  void StartTrainer(Pod* pod, uint32_t local, int64_t delay);
  void Connect(Pod* pod);
  void AgentReceive(Pod* pod, uint64_t stream, const Packet& packet);
  void SessionClosed(Pod* pod, const std::string& detail);
  void OnManagerMessage(Pod* pod, const v1::ManagerMessage& m);
  void OnStart(Pod* pod, const v1::StartGeneration& start, uint64_t epoch);
  void OnOutcome(Pod* pod, const v1::StepOutcome& outcome, uint64_t epoch);
  void OnStop(Pod* pod, const v1::StopTraining& stop);
  void OnRefusal(Pod* pod, const v1::Refusal& refusal);
  void RegisterAgain(Pod* pod);
  void BeginStep(Pod* pod, uint32_t local);
  void StepDone(Pod* pod, uint32_t local, uint64_t token);
  void CheckVotes(Pod* pod);
  void CrashTrainer(Pod* pod, uint32_t local, int32_t code);
  void SendEvent(Pod* pod, v1::AgentMessage m);
  void SendHeartbeat(Pod* pod);
  void HeartbeatLoop(Pod* pod, uint64_t token);
  v1::AgentMessage NewMessage(const Pod* pod) const;
  v1::LocalRank Report(const Pod* pod, uint32_t local) const;
  template <typename Message>
  void FreePorts(Pod* pod, Message* report);
  void PauseTrainers(Pod* pod);
  void PodExits(Pod* pod, bool replace, const std::string& why);

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

  std::unique_ptr<Manager> manager_;
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
  uint64_t highest_commit_epoch_ = 0;
  // step -> the (e, g) that last committed it, as the manager decided it
  std::map<int64_t, std::pair<uint64_t, uint64_t>> committed_by_;
  std::set<std::string> ever_lost_;          // uids some incarnation declared lost
  std::map<std::string, int64_t> limbo_since_;      // lost uid, alive, since
  std::map<std::string, int64_t> reachable_since_;  // not paused, link not cut, since
  bool job_stopped_ = false;
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
  const std::vector<std::string>& menu = options_.menu.empty() ? FaultKinds() : options_.menu;
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
  if (kind == "crash_manager") {
    if (!manager_) return;
    Trace("FAULT crash_manager (epoch " + std::to_string(manager_->epoch) + ")");
    CrashManager();
    After(Uniform(500, 3000), [this] { StartManager(); });
    return;
  }
  std::vector<Pod*> live;
  for (Pod* p : slots_)
    if (p && !p->dead && !p->stopping) live.push_back(p);
  if (live.empty()) return;
  Pod* pod = live[static_cast<size_t>(Uniform(0, static_cast<int64_t>(live.size()) - 1))];
  const std::string who = " " + pod->uid;
  if (kind == "crash_trainer") {
    std::vector<uint32_t> alive;
    for (uint32_t l = 0; l < pod->ranks.size(); ++l)
      if (pod->ranks[l].alive) alive.push_back(l);
    if (alive.empty()) return;
    const uint32_t l = alive[static_cast<size_t>(Uniform(0, static_cast<int64_t>(alive.size()) - 1))];
    Trace("FAULT crash_trainer" + who + " local rank " + std::to_string(l));
    CrashTrainer(pod, l, 1);
  } else if (kind == "kill_agent") {
    Trace("FAULT kill_agent" + who);
    PodExits(pod, /*replace=*/true, "killed");
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
  s.epoch = manager_ ? manager_->epoch : 0;
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
  } else if (manager_ && manager_->epoch == s.epoch) {
    if (packet.close) ManagerStreamDone(s);
    else ManagerReceive(s, packet.up);
  }
}

// Both ends learn that the stream broke; what was in flight is lost.
void World::Reset(uint64_t id, const std::string& why) {
  Stream& s = streams_.at(id);
  if (s.broken) return;
  s.broken = true;
  Trace("stream " + std::to_string(id) + " of " + s.pod->uid + " broke: " + why);
  Pod* pod = s.pod;
  if (s.agent_open)
    PodAfter(pod, Latency(pod), [this, pod, id, why] {
      if (pod->stream == id) SessionClosed(pod, why);
    });
  const uint64_t epoch = s.epoch;
  if (s.manager_open)
    After(Latency(pod), [this, id, epoch] {
      if (manager_ && manager_->epoch == epoch) ManagerStreamDone(streams_.at(id));
    });
  s.agent_open = s.manager_open = false;
}

// ---------------------------------------------------------------------------------------------
// The manager
// ---------------------------------------------------------------------------------------------

void World::StartManager() {
  JobControlOptions o;
  o.epoch = ++last_epoch_;
  o.join_window_ms = 10000;
  o.record = record_;
  o.fenced_by = [this, epoch = o.epoch] { return manager::FencedBy(record_, epoch); };
  manager_ = std::make_unique<Manager>();
  manager_->epoch = o.epoch;
  manager_->job = std::make_unique<JobControl>(spec_, config_, o,
                                               std::make_unique<EmbeddedDecisions>(spec_));
  Trace("manager epoch " + std::to_string(o.epoch) + " starts");
  const uint64_t epoch = o.epoch;
  After(kTickMs, [this, epoch] { ManagerTick(epoch); });
}

void World::CrashManager() {
  for (auto& [id, s] : streams_)
    if (!s.broken && s.epoch == manager_->epoch) {
      s.manager_open = false;  // nobody left to notice on this side
      Reset(id, "the manager crashed");
    }
  manager_.reset();
}

void World::ManagerTick(uint64_t epoch) {
  if (!manager_ || manager_->epoch != epoch) return;
  manager_->job->Tick(now_);
  Flush();
  After(kTickMs, [this, epoch] { ManagerTick(epoch); });
}

void World::ManagerReceive(Stream& s, const v1::AgentMessage& message) {
  JobControl& job = *manager_->job;
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
      Trace("manager refuses " + s.pod->uid + ": " + st.message() + (fenced ? " (fenced)" : ""));
      // A replacement is never refused for a pod that is lost or gone.
      const std::string held = "is held by pod ";
      if (auto at = st.message().find(held); at != std::string::npos) {
        const std::string holder = st.message().substr(at + held.size(),
                                                       st.message().find(';', at) - at - held.size());
        bool gone = ever_lost_.count(holder) > 0;
        for (const auto& p : pods_)
          if (p->uid == holder && p->dead) gone = true;
        if (gone)
          Violate("replacement " + s.pod->uid + " refused for node rank " +
                  std::to_string(s.pod->slot) + ", held by " + holder + ", which is lost or gone");
      }
      Packet p;
      p.down = job.MakeRefusal(st.message(), fenced,
                               fenced && job.MayReadmit(message.register_().pod_uid()));
      SendDown(s.id, p);
      ManagerClose(s.id);
      return;
    }
    if (auto old = manager_->by_node.find(node);
        old != manager_->by_node.end() && old->second != s.id)
      ManagerClose(old->second);
    s.node = node;
    manager_->by_node[node] = s.id;
  } else {
    Status st = job.Handle(s.id, message, now_);
    if (!st.ok()) {
      Packet p;
      p.down = job.MakeRefusal(st.message());
      SendDown(s.id, p);
    }
  }
  Flush();
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
  if (!manager_ || manager_->epoch != s.epoch) return;
  s.manager_open = false;
  if (s.node >= 0) {
    auto it = manager_->by_node.find(s.node);
    if (it != manager_->by_node.end() && it->second == s.id) manager_->by_node.erase(it);
  }
  manager_->job->Disconnected(s.id, now_);
  Flush();
}

void World::Flush() {
  if (!manager_) return;
  if (auto r = manager_->job->TakeRecord()) {
    std::string why;
    if (auto merged = manager::MergeJobRecord(record_, *r, &why)) record_ = std::move(*merged);
    else manager_->job->Superseded(why, now_);
  }
  auto out = manager_->job->TakeOutgoing();
  if (out.size() > kMaxOutgoingPerFlush)
    Violate("the manager queued " + std::to_string(out.size()) + " messages in one turn");
  for (auto& o : out) {
    // Who committed a step is the manager's decision, known when it is made: a pod may hear it
    // after the next generation's plan has named that generation (seeds 7681, 14897: its link
    // was slow).
    if (o.message.has_outcome() && o.message.outcome().commit())
      committed_by_.insert_or_assign(
          o.message.outcome().step(),
          std::make_pair(manager_->epoch, o.message.outcome().generation()));
    auto it = manager_->by_node.find(o.node_rank);
    if (it == manager_->by_node.end()) continue;
    const uint64_t id = it->second;
    Packet p;
    p.down = std::move(o.message);
    SendDown(id, std::move(p));
    if (o.close) ManagerClose(id);
  }
  // The manager's own events, into the trace.
  const JobControl& job = *manager_->job;
  const uint64_t fresh = job.events_logged() - manager_->events_traced;
  for (size_t i = job.events().size() - std::min<uint64_t>(fresh, job.events().size());
       i < job.events().size(); ++i) {
    result_.aborts += job.events()[i].kind() == "abort";
    Trace("manager " + std::to_string(manager_->epoch) + ": " + job.events()[i].kind() + ": " +
          job.events()[i].message());
  }
  manager_->events_traced = job.events_logged();
  // Lost pods, as this incarnation sees them.
  for (Pod* pod : slots_)
    if (pod && manager_->job->IsFenced(pod->uid)) ever_lost_.insert(pod->uid);
}

// ---------------------------------------------------------------------------------------------
// Agents and trainers
// ---------------------------------------------------------------------------------------------

Pod* World::NewPod(int64_t slot) {
  auto pod = std::make_unique<Pod>();
  pod->slot = slot;
  int generation = 0;
  for (const auto& p : pods_) generation += p->slot == slot;
  pod->uid = "pod-" + std::to_string(slot) + (generation ? "-r" + std::to_string(generation) : "");
  pod->base_uid = pod->uid;
  pod->step_ms = Uniform(40, 120);
  pod->ranks.resize(static_cast<size_t>(spec_.processes_per_pod));
  pod->outage_since = now_;
  Pod* raw = pod.get();
  pods_.push_back(std::move(pod));
  slots_[static_cast<size_t>(slot)] = raw;
  Trace("pod " + raw->uid + " starts");
  for (uint32_t l = 0; l < raw->ranks.size(); ++l) StartTrainer(raw, l, Uniform(200, 1500));
  PodAfter(raw, Uniform(1, 50), [this, raw] { Connect(raw); });
  return raw;
}

void World::StartTrainer(Pod* pod, uint32_t local, int64_t delay) {
  Trainer& t = pod->ranks[local];
  t = Trainer();
  t.pid = next_pid_++;
  const uint64_t token = t.token;
  PodAfter(pod, delay, [this, pod, local, token] {
    Trainer& t = pod->ranks[local];
    if (!t.alive || t.token != token) return;
    t.hello = true;
    t.phase = v1::PHASE_PAUSED;
  });
}

v1::AgentMessage World::NewMessage(const Pod* pod) const {
  v1::AgentMessage m;
  auto* h = m.mutable_header();
  h->set_job_id(kJobId);
  h->set_sender(pod->uid);
  h->set_epoch(pod->epoch);
  h->set_generation(pod->generation);
  return m;
}

v1::LocalRank World::Report(const Pod* pod, uint32_t local) const {
  const Trainer& t = pod->ranks[local];
  v1::LocalRank r;
  r.set_local_rank(local);
  r.set_pid(t.pid);
  r.set_alive(t.alive);
  r.set_step(t.step);
  r.set_phase(!t.hello ? v1::PHASE_STARTING : t.phase);
  r.set_generation(t.generation);
  r.set_committed_step(t.committed);
  r.set_heard_commit_step(t.heard);
  r.set_heard_commit_epoch(t.heard_by.first);
  r.set_heard_commit_generation(t.heard_by.second);
  return r;
}

template <typename Message>
void World::FreePorts(Pod* pod, Message* report) {
  for (int i = 0; i < 4; ++i) {
    const uint32_t port = 32768 + (pod->port_cursor++ % 28000);
    if (i == 0) report->set_free_port(port);
    report->add_free_ports(port);
  }
}

void World::Connect(Pod* pod) {
  if (pod->dead || pod->stopping) return;
  pod->link = Pod::Link::kRegistering;
  if (!manager_ || pod->cut_until > now_) {
    // Connection refused (no manager listening) or timed out (the link is cut).
    pod->stream = 0;
    const int64_t ms = manager_ ? Uniform(1000, 2000) : Uniform(1, 5);
    PodAfter(pod, ms, [this, pod] {
      if (pod->link == Pod::Link::kRegistering && pod->stream == 0)
        SessionClosed(pod, "unavailable");
    });
    return;
  }
  pod->stream = OpenStream(pod);
  v1::AgentMessage m = NewMessage(pod);
  auto* reg = m.mutable_register_();
  reg->set_pod_uid(pod->uid);
  reg->set_pod_name(pod->uid);
  reg->set_node_rank(static_cast<int32_t>(pod->slot));
  reg->set_node_name("node-" + std::to_string(pod->slot));
  reg->set_host("10.0.0." + std::to_string(pod->slot));
  reg->set_nproc(static_cast<uint32_t>(pod->ranks.size()));
  FreePorts(pod, reg);
  reg->set_last_generation_agents(pod->last_generation_agents);
  for (uint32_t l = 0; l < pod->ranks.size(); ++l) *reg->add_ranks() = Report(pod, l);
  Packet p;
  p.up = std::move(m);
  SendUp(pod->stream, std::move(p));
}

void World::SessionClosed(Pod* pod, const std::string& detail) {
  if (pod->dead) return;
  if (pod->stream) streams_.at(pod->stream).agent_open = false;
  const bool was_up = pod->link == Pod::Link::kUp;
  pod->stream = 0;
  pod->link = Pod::Link::kDown;
  pod->heartbeat_token++;
  if (pod->done_at >= 0 && detail == kEndedByManager) {
    PodExits(pod, false, "training done; the manager ended the session");
    return;
  }
  if (pod->reregister_now) {
    pod->reregister_now = false;
    Connect(pod);
    return;
  }
  if (pod->outage_since < 0) pod->outage_since = now_;
  if (was_up) {
    // A broken stream is not a lost manager: the trainers go on for the liveness timeout, in
    // which a resumed session continues the generation.
    Trace(pod->uid + " lost its session (" + detail + "): trainers pause in " +
          std::to_string(pod->liveness_ms) + " ms unless it resumes");
    const uint64_t token = ++pod->pause_token;
    PodAfter(pod, pod->liveness_ms, [this, pod, token] {
      if (pod->pause_token != token || pod->link == Pod::Link::kUp) return;
      Trace(pod->uid + ": no session for the liveness timeout: trainers paused");
      PauseTrainers(pod);
    });
  }
  if (now_ - pod->outage_since >= kReconnectTimeoutMs) {
    PodExits(pod, true, "no manager for the reconnect timeout");
    return;
  }
  const int64_t backoff = pod->backoff_ms;
  pod->backoff_ms = std::min(pod->backoff_ms * 2, kMaxBackoffMs);
  PodAfter(pod, backoff, [this, pod] {
    if (pod->link == Pod::Link::kDown) Connect(pod);
  });
}

void World::PauseTrainers(Pod* pod) {
  for (Trainer& t : pod->ranks)
    if (t.alive && t.hello) {
      t.phase = v1::PHASE_PAUSED;
      ++t.token;  // the step in flight waits
    }
}

void World::AgentReceive(Pod* pod, uint64_t stream, const Packet& packet) {
  if (pod->stream != stream) return;  // an old session's leftovers
  if (packet.close) {
    SessionClosed(pod, packet.detail);
    return;
  }
  OnManagerMessage(pod, packet.down);
}

void World::OnManagerMessage(Pod* pod, const v1::ManagerMessage& m) {
  const v1::Header& h = m.header();
  if (h.epoch() < pod->epoch) return;  // obeys only the highest epoch seen
  if (h.epoch() > pod->epoch) {
    pod->epoch = h.epoch();
    pod->generation = h.generation();
  } else {
    pod->generation = std::max(pod->generation, h.generation());
  }
  switch (m.body_case()) {
    case v1::ManagerMessage::kWelcome: {
      pod->link = Pod::Link::kUp;
      pod->backoff_ms = 100;
      pod->outage_since = -1;
      pod->heartbeat_ms = m.welcome().heartbeat_interval_ms() ? m.welcome().heartbeat_interval_ms() : 100;
      if (m.welcome().liveness_timeout_ms()) pod->liveness_ms = m.welcome().liveness_timeout_ms();
      if (!m.welcome().resumed()) PauseTrainers(pod);  // the generation it was in is gone
      ++pod->pause_token;
      Trace(pod->uid + (m.welcome().resumed() ? " resumed its session" : " welcomed") +
            " as node rank " + std::to_string(m.welcome().node_rank()) + " by epoch " +
            std::to_string(h.epoch()));
      {
        std::deque<v1::AgentMessage> again;
        again.swap(pod->unconfirmed);
        if (m.welcome().resumed())
          for (v1::AgentMessage& e : again) {
            *e.mutable_header() = NewMessage(pod).header();
            SendEvent(pod, std::move(e));
          }
      }
      while (!pod->pending.empty()) {
        v1::AgentMessage e = std::move(pod->pending.front());
        pod->pending.pop_front();
        *e.mutable_header() = NewMessage(pod).header();
        SendEvent(pod, std::move(e));
      }
      SendHeartbeat(pod);
      const uint64_t token = ++pod->heartbeat_token;
      PodAfter(pod, pod->heartbeat_ms, [this, pod, token] { HeartbeatLoop(pod, token); });
      break;
    }
    case v1::ManagerMessage::kStart:
      OnStart(pod, m.start(), h.epoch());
      break;
    case v1::ManagerMessage::kAbort:
      for (Trainer& t : pod->ranks)
        if (t.alive && t.hello) {
          t.phase = v1::PHASE_PAUSED;
          ++t.token;
        }
      if (!pod->tally.active() || m.abort().generation() >= pod->tally.generation())
        pod->tally.Clear();
      if (m.abort().generation() >= pod->training_in.second) pod->training_in = {0, 0};
      pod->unconfirmed.clear();
      break;
    case v1::ManagerMessage::kOutcome:
      OnOutcome(pod, m.outcome(), h.epoch());
      break;
    case v1::ManagerMessage::kStop:
      OnStop(pod, m.stop());
      break;
    case v1::ManagerMessage::kRestart:
      std::erase_if(pod->unconfirmed, [](const v1::AgentMessage& e) { return !e.has_votes(); });
      for (uint32_t l : m.restart().local_ranks()) {
        if (l >= pod->ranks.size()) continue;
        Trace(pod->uid + " restarts local rank " + std::to_string(l));
        StartTrainer(pod, l, Uniform(200, 1500));
      }
      CheckVotes(pod);
      break;
    case v1::ManagerMessage::kRefusal:
      OnRefusal(pod, m.refusal());
      break;
    default:
      break;
  }
}

void World::OnStart(Pod* pod, const v1::StartGeneration& start, uint64_t epoch) {
  const v1::GenerationPlan& plan = start.plan();
  if (plan.epoch() != 0 && plan.epoch() < pod->epoch) return;
  pod->generation = std::max(pod->generation, plan.generation());
  pod->last_generation_agents = plan.agents();
  if (pod->stopping) return;
  // Commits never go backwards: no live trainer of this pod heard a commit the plan undoes.
  for (uint32_t l = 0; l < pod->ranks.size(); ++l) {
    const Trainer& t = pod->ranks[l];
    if (t.alive && t.heard > plan.committed_step())
      Violate("generation (" + std::to_string(epoch) + ", " + std::to_string(plan.generation()) +
              ") resumes after step " + std::to_string(plan.committed_step()) + ", but " +
              pod->uid + " local rank " + std::to_string(l) + " heard step " +
              std::to_string(t.heard) + " committed");
  }
  // A plan that names the generation that committed its step names the one that did: a rank
  // applies its own vote for the step only when it voted in that generation.
  const std::pair<uint64_t, uint64_t> named{plan.committed_epoch(), plan.committed_generation()};
  if (auto by = committed_by_.find(plan.committed_step());
      named != std::pair<uint64_t, uint64_t>{0, 0} && by != committed_by_.end() && by->second != named)
    Violate("generation (" + std::to_string(epoch) + ", " + std::to_string(plan.generation()) +
            ") says step " + std::to_string(plan.committed_step()) + " was committed by (" +
            std::to_string(named.first) + ", " + std::to_string(named.second) + "), but (" +
            std::to_string(by->second.first) + ", " + std::to_string(by->second.second) +
            ") committed it");
  // A generation's ranks leave it on its abort: one not aborted holds them (in its rendezvous,
  // or its collectives) until the collective timeout, whatever starts after it.
  if (pod->training_in.first == epoch && pod->training_in.second != 0 &&
      plan.generation() > pod->training_in.second)
    Violate(pod->uid + " starts generation (" + std::to_string(epoch) + ", " +
            std::to_string(plan.generation()) + ") while its ranks train in generation " +
            std::to_string(pod->training_in.second) + ", which was never aborted");
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
  if (auto [it, added] = node_holder_.emplace(node_key, pod->uid); !added && it->second != pod->uid)
    Violate("node rank " + std::to_string(pod->slot) + " of generation (" +
            std::to_string(epoch) + ", " + std::to_string(plan.generation()) + ") is held by " +
            it->second + " and " + pod->uid);
  std::vector<uint32_t> assigned;
  for (uint32_t l = 0; l < pod->ranks.size(); ++l) pod->ranks[l].assigned = false;
  for (const auto& a : plan.ranks()) {
    if (a.local_rank() >= pod->ranks.size()) continue;
    const auto key = std::make_tuple(epoch, plan.generation(), a.rank());
    const std::string me = pod->uid + "/" + std::to_string(a.local_rank());
    if (auto [it, added] = rank_holder_.emplace(key, me); !added && it->second != me)
      Violate("rank " + std::to_string(a.rank()) + " of generation (" + std::to_string(epoch) +
              ", " + std::to_string(plan.generation()) + ") is held by " + it->second + " and " + me);
    assigned.push_back(a.local_rank());
    Trainer& t = pod->ranks[a.local_rank()];
    t.assigned = true;
  }
  pod->tally.Start(plan.generation(), assigned);
  if (!assigned.empty()) pod->training_in = {epoch, plan.generation()};
  else if (plan.generation() > pod->training_in.second) pod->training_in = {0, 0};
  pod->unconfirmed.clear();
  Trace(pod->uid + " starts generation (" + std::to_string(epoch) + ", " +
        std::to_string(plan.generation()) + ") after step " +
        std::to_string(plan.committed_step()) + " with " + std::to_string(assigned.size()) +
        " ranks");
  for (uint32_t l = 0; l < pod->ranks.size(); ++l) {
    Trainer& t = pod->ranks[l];
    if (!t.alive || !t.hello) continue;
    ++t.token;
    if (!t.assigned) {
      t.phase = v1::PHASE_PAUSED;  // standby
      continue;
    }
    // State sync: every rank of the generation holds the plan's committed step.
    t.generation = plan.generation();
    t.committed = plan.committed_step();
    if (plan.committed_step() > t.heard) {
      t.heard = plan.committed_step();
      t.heard_by = named;
    }
    t.step = plan.committed_step() + 1;
    BeginStep(pod, l);
  }
}

void World::BeginStep(Pod* pod, uint32_t local) {
  Trainer& t = pod->ranks[local];
  if (t.step >= total_steps_) {  // training done: the process exits 0
    t.phase = v1::PHASE_DONE;
    CrashTrainer(pod, local, 0);
    return;
  }
  t.phase = v1::PHASE_COMPUTING;
  const uint64_t token = ++t.token;
  PodAfter(pod, pod->step_ms + Uniform(0, 20), [this, pod, local, token] {
    StepDone(pod, local, token);
  });
}

void World::StepDone(Pod* pod, uint32_t local, uint64_t token) {
  Trainer& t = pod->ranks[local];
  if (!t.alive || t.token != token) return;
  t.phase = v1::PHASE_VOTED;
  v1::TrainerVote vote;
  vote.set_generation(t.generation);
  vote.set_step(t.step);
  vote.set_ok(true);
  (void)pod->tally.Add(local, vote);
  CheckVotes(pod);
}

void World::CheckVotes(Pod* pod) {
  auto live = [pod](uint32_t l) { return pod->ranks[l].alive && pod->ranks[l].hello; };
  for (auto& votes : pod->tally.TakeComplete(live)) {
    v1::AgentMessage m = NewMessage(pod);
    *m.mutable_votes() = std::move(votes);
    SendEvent(pod, std::move(m));
  }
}

void World::OnOutcome(Pod* pod, const v1::StepOutcome& outcome, uint64_t epoch) {
  if (outcome.commit()) {
    if (epoch < highest_commit_epoch_)
      Violate(pod->uid + " heard epoch " + std::to_string(epoch) + " commit step " +
              std::to_string(outcome.step()) + " after epoch " +
              std::to_string(highest_commit_epoch_) + " committed: a fenced incarnation commits");
    highest_commit_epoch_ = std::max(highest_commit_epoch_, epoch);
  }
  for (uint32_t l = 0; l < pod->ranks.size(); ++l) {
    Trainer& t = pod->ranks[l];
    if (!t.alive || !t.hello || !t.assigned || t.generation != outcome.generation() ||
        t.step != outcome.step() || t.phase != v1::PHASE_VOTED)
      continue;
    if (outcome.commit()) {
      t.committed = t.heard = outcome.step();
      t.heard_by = {epoch, outcome.generation()};
      ++result_.commits;
      ++t.step;
    }
    BeginStep(pod, l);  // the next step, or the same one again after a rollback
  }
  pod->tally.Settle(outcome.generation(), outcome.step());
  std::erase_if(pod->unconfirmed, [&](const v1::AgentMessage& m) {
    return m.has_votes() && (m.votes().generation() < outcome.generation() ||
                             (m.votes().generation() == outcome.generation() &&
                              m.votes().step() <= outcome.step()));
  });
}

void World::OnStop(Pod* pod, const v1::StopTraining& stop) {
  if (stop.mode() == v1::StopTraining::MODE_STANDBY) {
    PauseTrainers(pod);
    pod->tally.Clear();
    return;
  }
  // A stop for the whole job, or this pod's planned departure.
  if (!job_stopped_ && stop.reason().rfind("planned departure", 0) != 0) {
    job_stopped_ = true;
    job_stopped_at_ = now_;
    stop_reason_ = stop.reason();
    finished_ = stop.reason().rfind("training finished", 0) == 0;
  }
  PodExits(pod, false, pod->done_at >= 0 ? "training done; the manager acknowledged"
                                         : "StopTraining: " + stop.reason());
}

void World::OnRefusal(Pod* pod, const v1::Refusal& refusal) {
  if (refusal.fenced() && refusal.readmit() && pod->readmissions < 5) {
    // Back as its own replacement (agent.cc, Readmit): a new incarnation of its uid, its
    // trainers out of their generation and holding stale state.
    ++pod->readmissions;
    const std::string old = pod->uid;
    pod->uid = pod->base_uid + "/" + std::to_string(pod->readmissions + 1);
    Trace(old + " was declared lost and comes back as " + pod->uid);
    for (Trainer& t : pod->ranks)
      if (t.alive && t.hello) {
        ++t.token;
        t.phase = v1::PHASE_PAUSED;
        t.assigned = false;
      }
    pod->tally.Clear();
    pod->training_in = {0, 0};  // the agent aborts its trainers' generation itself
    pod->pending.clear();
    pod->unconfirmed.clear();
    ++pod->pause_token;
    pod->last_generation_agents = 0;
    RegisterAgain(pod);
    return;
  }
  if (refusal.fenced()) {
    PodExits(pod, true, "declared lost (fenced): " + refusal.reason());
    return;
  }
  if (refusal.epoch() > pod->epoch) {
    pod->epoch = refusal.epoch();
    pod->generation = refusal.generation();
    RegisterAgain(pod);
  }
}

// The agent cancels its session to register again at once (gRPC reports the cancelled call to
// the agent at once).
void World::RegisterAgain(Pod* pod) {
  pod->reregister_now = true;
  if (!pod->stream) return;
  const uint64_t id = pod->stream;
  Packet close;
  close.close = true;
  SendUp(id, close);
  PodAfter(pod, 1, [this, pod, id] {
    if (pod->stream == id) SessionClosed(pod, "cancelled to register again");
  });
}

void World::CrashTrainer(Pod* pod, uint32_t local, int32_t code) {
  Trainer& t = pod->ranks[local];
  if (!t.alive) return;
  t.alive = false;
  ++t.token;
  v1::AgentMessage m = NewMessage(pod);
  m.mutable_process_exit()->set_local_rank(local);
  m.mutable_process_exit()->set_exit_code(code);
  m.mutable_process_exit()->set_step(t.step);
  SendEvent(pod, std::move(m));
  CheckVotes(pod);
  bool all_done = true;
  for (const Trainer& r : pod->ranks) all_done = all_done && !r.alive && r.phase == v1::PHASE_DONE;
  if (all_done && pod->done_at < 0) {
    pod->done_at = now_;
    PodAfter(pod, kDoneGraceMs, [this, pod] { PodExits(pod, false, "training done (5 s)"); });
  }
}

void World::SendEvent(Pod* pod, v1::AgentMessage m) {
  if (pod->link != Pod::Link::kUp || !pod->stream) {
    pod->pending.push_back(std::move(m));
    return;
  }
  if (m.has_process_exit())
    Trace(pod->uid + " reports local rank " + std::to_string(m.process_exit().local_rank()) +
          " exited with code " + std::to_string(m.process_exit().exit_code()));
  if (m.has_votes() || m.has_process_exit()) pod->unconfirmed.push_back(m);
  Packet p;
  p.up = std::move(m);
  SendUp(pod->stream, std::move(p));
}

void World::SendHeartbeat(Pod* pod) {
  v1::AgentMessage m = NewMessage(pod);
  auto* hb = m.mutable_heartbeat();
  for (uint32_t l = 0; l < pod->ranks.size(); ++l) *hb->add_ranks() = Report(pod, l);
  FreePorts(pod, hb);
  Packet p;
  p.up = std::move(m);
  SendUp(pod->stream, std::move(p));
}

void World::HeartbeatLoop(Pod* pod, uint64_t token) {
  if (pod->heartbeat_token != token || pod->link != Pod::Link::kUp) return;
  SendHeartbeat(pod);
  PodAfter(pod, pod->heartbeat_ms, [this, pod, token] { HeartbeatLoop(pod, token); });
}

void World::PodExits(Pod* pod, bool replace, const std::string& why) {
  if (pod->dead) return;
  Trace(pod->uid + " exits: " + why);
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
  for (Pod* pod : slots_) {
    if (!pod || pod->dead) continue;
    // What a pod can be told needs it reachable: not paused, its link not cut.
    if (pod->paused_until > now_ || pod->cut_until > now_) {
      reachable_since_.erase(pod->uid);
      continue;
    }
    const int64_t since = reachable_since_.emplace(pod->uid, now_).first->second;
    // A pod declared lost is told so and stops, or is readmitted, within a bound.
    const bool lost = manager_ && manager_->job->IsFenced(pod->uid);
    if (!lost) {
      limbo_since_.erase(pod->uid);
    } else {
      const int64_t from = std::max(since, limbo_since_.emplace(pod->uid, now_).first->second);
      if (now_ - from > kFenceBoundMs)
        Violate(pod->uid + " was declared lost and is still alive and reachable " +
                std::to_string(now_ - from) + " ms later, neither stopped nor readmitted");
    }
    // Every pod stops once the job did.
    if (job_stopped_ && now_ - std::max(since, job_stopped_at_) > kStoppedBoundMs)
      Violate(pod->uid + " still runs " + std::to_string(now_ - job_stopped_at_) +
              " ms after the job stopped (" + stop_reason_ + ")");
  }
  if (manager_ && manager_->job->events().size() > 256)
    Violate("the manager's event log holds " + std::to_string(manager_->job->events().size()) +
            " events");
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
  if (!DrawJob()) {
    result_.ok = false;
    result_.violation = "the drawn job does not validate: " + result_.setup;
    return result_;
  }
  DrawFaults();
  slots_.assign(static_cast<size_t>(spec_.pods), nullptr);
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
      if (manager_) {
        const auto s = manager_->job->StatusReport();
        phase = "phase " + s.phase() + " at generation " + std::to_string(s.generation()) +
                ", committed step " + std::to_string(s.committed_step());
      }
      Violate("liveness: the job neither finished nor stopped " +
              std::to_string(deadline - last_fault_ms_) + " ms after the last fault (" + phase +
              ")");
    }
  }
  if (result_.ok) {
    result_.at_ms = now_;
    result_.outcome = finished_ ? "finished"
                      : job_stopped_ ? "stopped: " + stop_reason_
                                     : "ended with every pod gone";
  } else {
    result_.trace.assign(trace_.begin(), trace_.end());
  }
  return result_;
}

}  // namespace

Result Run(const Options& options) { return World(options).Run(); }

}  // namespace regroup::sim
