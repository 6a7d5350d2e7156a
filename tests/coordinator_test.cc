// SPDX-License-Identifier: Apache-2.0
// The coordinator in libregroup.so (through its C ABI, over a real engine) with real managers:
// the manager's JobControl over RemoteDecisions in this process, and raw gRPC clients for the
// refusals. Every server is on a port the OS chooses; every wait is bounded. The coordinator holds
// the cluster key; each manager sends its job's token (common/job_token.h).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include "common/credential.h"
#include "common/grpc_settings.h"
#include "common/job_token.h"
#include "common/random_message.h"
#include "manager/remote_decisions.h"
#include "manager/job_control.h"
#include "manager/test_certificates.h"
#include "plugin/engine.h"
#include "regroup.h"
#include "regroup/v1/wire.grpc.pb.h"

namespace {

namespace v1 = ::regroup::v1;
namespace rt = ::regroup::manager;
using nlohmann::json;
using namespace std::chrono_literals;

constexpr char kJob[] = "default/coord";
constexpr char kClusterKey[] = "the-cluster-key";
constexpr auto kWait = 10s;  // the bound of every wait

// The token of a job of JobJson (its uid is "uid-" + its id).
std::string TokenOf(const std::string& job) {
  return regroup::JobToken(kClusterKey, job, "uid-" + job);
}
const std::string kCredential = TokenOf(kJob);

// Two pods of one process (dp 2), a decision wait of 1 s.
std::string JobJson(const std::string& strategies, const std::string& id = kJob) {
  return json{{"id", id},
              {"uid", "uid-" + id},
              {"labels", {{"fault-scheduling", "force"}}},
              {"annotations", {{"recover-strategy", strategies}}},
              {"env", {{"MINDIO_WAIT_MINDX_TIME", "1"}}},
              {"pods", 2},
              {"processes_per_pod", 1}}
      .dump();
}

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Waits until `done` holds or kWait passes.
bool Eventually(const std::function<bool()>& done) {
  const auto until = std::chrono::steady_clock::now() + kWait;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

std::string Message(regroup_error* err) {
  std::string m = err ? regroup_error_message(err) : "";
  regroup_error_free(err);
  return m;
}

// A raw manager stream, for what RemoteDecisions never sends. The call's deadline bounds reads.
class RawStream {
 public:
  RawStream(int port, const std::string& credential) {
    stub_ = v1::Coordinator::NewStub(regroup::MakeChannel("127.0.0.1:" + std::to_string(port)).value());
    regroup::AttachCredential(context_, credential);
    context_.set_deadline(std::chrono::system_clock::now() + kWait);
    stream_ = stub_->Attach(&context_);
  }
  bool Send(v1::ManagerReport report, const std::string& job, uint64_t epoch) {
    report.mutable_header()->set_job_id(job);
    report.mutable_header()->set_sender("manager/" + std::to_string(epoch));
    report.mutable_header()->set_epoch(epoch);
    return stream_->Write(report);
  }
  // Epoch 0 asks the coordinator for one; else the epoch reattaching, with its ticket.
  // `lease_sent_ms` >= 0: it asks for the lease too.
  bool Hello(const std::string& job, uint64_t epoch, const std::string& ticket = "",
             int64_t lease_sent_ms = -1) {
    v1::ManagerReport r;
    r.mutable_hello()->set_epoch(epoch);
    r.mutable_hello()->set_ticket(ticket);
    if (lease_sent_ms >= 0) r.mutable_lease()->set_sent_ms(lease_sent_ms);
    return Send(r, job, epoch);
  }
  // The next message; an empty message once the stream ended.
  v1::CoordinatorDirective Read() {
    v1::CoordinatorDirective m;
    if (!stream_->Read(&m)) m.Clear();
    return m;
  }
  // How the stream ended, the coordinator ending it (this side sends nothing more, not even its
  // end of writes).
  grpc::Status AwaitEnd() {
    v1::CoordinatorDirective rest;
    while (stream_->Read(&rest)) {
    }
    return stream_->Finish();
  }
  grpc::Status Finish() {
    stream_->WritesDone();
    v1::CoordinatorDirective rest;
    while (stream_->Read(&rest)) {
    }
    return stream_->Finish();
  }

 private:
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::ManagerReport, v1::CoordinatorDirective>> stream_;
};

v1::ManagerReport FaultReport(v1::FaultKind kind, std::vector<uint32_t> pods,
                              std::vector<uint32_t> ranks, int64_t step) {
  v1::ManagerReport r;
  r.mutable_fault()->set_kind(kind);
  for (uint32_t p : pods) r.mutable_fault()->add_pods(p);
  for (uint32_t k : ranks) r.mutable_fault()->add_ranks(k);
  r.mutable_fault()->set_step(step);
  r.mutable_fault()->set_detail("from the test");
  return r;
}

// A job's manager: the real JobControl over RemoteDecisions, with two simulated agents (pods p0
// and p1, one process each) and a simulated clock. As regroup-manager does, it waits (kWait at
// most) for the coordinator to grant its epoch and builds the job control with it; `credential`
// "" is its job's token.
class Manager {
 public:
  Manager(const std::string& job_json, int port, const std::string& credential = "") {
    auto spec = regroup::ParseJobSpec(std::string_view(job_json));
    EXPECT_TRUE(spec.ok()) << spec.status().message();
    spec_ = *spec;
    auto resolved = spec_.Resolve();
    EXPECT_TRUE(resolved.ok());
    rt::RemoteDecisionsOptions o;
    o.target = "127.0.0.1:" + std::to_string(port);
    o.channel = regroup::MakeChannel(o.target).value();
    o.credential = credential.empty() ? TokenOf(spec_.id) : credential;
    o.job_id = spec_.id;
    auto remote = std::make_unique<rt::RemoteDecisions>(o);
    remote_ = remote.get();
    (void)remote->WaitAvailable(credential.empty() ? kWait : 500ms);
    rt::JobControlOptions ro;
    ro.epoch = std::max<uint64_t>(1, remote->epoch());  // refused: the job control is unused
    ro.join_window_ms = 5000;
    job_ = std::make_unique<rt::JobControl>(spec_, resolved.config, ro, std::move(remote));
  }

  rt::RemoteDecisions& remote() { return *remote_; }
  rt::JobControl& job() { return *job_; }
  int64_t now = 1000;

  // Pod n registers as `uid` on `stream`, its trainer waiting for a generation.
  void Register(int64_t n, const std::string& uid, uint64_t stream) {
    v1::Register reg;
    reg.set_pod_uid(uid);
    reg.set_node_rank(static_cast<int32_t>(n));
    reg.set_host("127.0.0.1");
    reg.set_nproc(1);
    reg.set_free_port(30000 + static_cast<uint32_t>(n));
    auto* rank = reg.add_ranks();
    rank->set_alive(true);
    rank->set_phase(v1::PHASE_PAUSED);
    v1::Header h;
    h.set_job_id(spec_.id);
    h.set_sender(uid);
    h.set_epoch(job_->epoch());
    auto registered = job_->Register(stream, h, reg, now);
    ASSERT_TRUE(registered.ok()) << registered.status().message();
    for (auto& o : job_->TakeOutgoing()) sent_.push_back(std::move(o));
  }
  // Both agents register; the first generation forms.
  void StartTraining() {
    for (int64_t n = 0; n < 2; ++n) Register(n, Uid(n), Stream(n));
    Tick();
    ASSERT_TRUE(job_->training());
  }
  // Pod n's stream breaks (its node died, or it was evicted).
  void Disconnect(int64_t n) { job_->Disconnected(Stream(n), now); }
  // Pod n's process exits with code 1: a fault the job control reports to the decision maker.
  void ProcessExits(int64_t n, int64_t step) {
    v1::AgentMessage m;
    m.mutable_header()->set_job_id(spec_.id);
    m.mutable_header()->set_sender(Uid(n));
    m.mutable_header()->set_epoch(job_->epoch());
    m.mutable_process_exit()->set_local_rank(0);
    m.mutable_process_exit()->set_exit_code(1);
    m.mutable_process_exit()->set_step(step);
    regroup::Status st = job_->Handle(Stream(n), m, now);
    ASSERT_TRUE(st.ok()) << st.message();
    const size_t before = sent_.size();
    for (auto& o : job_->TakeOutgoing()) sent_.push_back(std::move(o));
    bool aborted = false;
    for (size_t i = before; i < sent_.size(); ++i) aborted |= sent_[i].message.has_abort();
    ASSERT_TRUE(aborted) << "the generation is aborted at once";
  }
  // How many RestartProcesses pod n was sent.
  int Restarts(int64_t n) const {
    int count = 0;
    for (const auto& o : sent_) count += o.node_rank == n && o.message.has_restart();
    return count;
  }
  // One tick of the job control at `now`; what it sends is kept.
  void Tick() {
    job_->Tick(now);
    for (auto& o : job_->TakeOutgoing()) sent_.push_back(std::move(o));
  }
  // Ticks (real time passing, the job control's clock 1 ms a tick) until a message for an agent
  // satisfies `match`.
  bool TickUntilSent(const std::function<bool(const rt::JobControl::Outgoing&)>& match) {
    return Eventually([&] {
      ++now;
      Tick();
      for (const auto& o : sent_)
        if (match(o)) return true;
      return false;
    });
  }
  bool HasEvent(const std::string& kind) const {
    const v1::GetStatusResponse status = job_->StatusReport();
    for (const auto& e : status.events())
      if (e.kind() == kind) return true;
    return false;
  }
  const std::vector<rt::JobControl::Outgoing>& sent() const { return sent_; }

 private:
  static std::string Uid(int64_t n) { return "p" + std::to_string(n); }
  static uint64_t Stream(int64_t n) { return static_cast<uint64_t>(n) + 1; }

  regroup::JobSpec spec_;
  rt::RemoteDecisions* remote_ = nullptr;  // owned by job_
  std::unique_ptr<rt::JobControl> job_;
  std::vector<rt::JobControl::Outgoing> sent_;
};

bool IsRestart(const rt::JobControl::Outgoing& o, int64_t node) {
  return o.node_rank == node && o.message.has_restart();
}

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(regroup_engine_new(&engine_, nullptr, nullptr), REGROUP_OK);
    AddJob(JobJson("recover-in-place,dump"));
    Start("127.0.0.1:0");
    ASSERT_GT(port_, 0);
  }
  void TearDown() override {
    regroup_coordinator_free(coordinator_);
    regroup_engine_free(engine_);
  }

  void AddJob(const std::string& job_json) {
    regroup_error* err = nullptr;
    ASSERT_EQ(regroup_engine_upsert_job(engine_, nullptr, job_json.data(), job_json.size(), Now(),
                                        &err),
              REGROUP_OK)
        << Message(err);
    const std::string id = json::parse(job_json)["id"];
    for (uint32_t i = 0; i < 2; ++i)
      ASSERT_EQ(regroup_engine_set_pod_state(engine_, id.c_str(), i, ("p" + std::to_string(i)).c_str(),
                                             REGROUP_POD_RUNNING, ("n" + std::to_string(i)).c_str(),
                                             Now(), nullptr),
                REGROUP_OK);
  }
  // With `tls`, serving TLS with tls->cert and tls->key, and with tls->client_ca (when not
  // empty) requiring a certificate that CA signed from every manager.
  struct Tls {
    std::string cert, key, client_ca;
  };
  void Start(const std::string& listen, int64_t lease_ms = 0, const Tls* tls = nullptr) {
    regroup_coordinator_options o = REGROUP_COORDINATOR_OPTIONS_INIT;
    o.listen = listen.c_str();
    o.credential = kClusterKey;
    o.lease_ms = lease_ms;
    if (tls) {
      o.tls_cert_file = tls->cert.c_str();
      o.tls_key_file = tls->key.c_str();
      if (!tls->client_ca.empty()) o.tls_client_ca_file = tls->client_ca.c_str();
    }
    regroup_error* err = nullptr;
    ASSERT_EQ(regroup_coordinator_start(&coordinator_, engine_, &o, &err), REGROUP_OK)
        << Message(err);
    port_ = regroup_coordinator_port(coordinator_);
  }
  void Stop() {
    regroup_coordinator_free(coordinator_);
    coordinator_ = nullptr;
  }
  void Publish() { ASSERT_EQ(regroup_coordinator_publish(coordinator_, nullptr), REGROUP_OK); }
  // The job's state as the engine exports it, and imported back (as a restarted scheduler does).
  json EngineState() {
    char* out = nullptr;
    EXPECT_EQ(regroup_engine_export_job_state(engine_, &out, kJob, nullptr), REGROUP_OK);
    json state = json::parse(out ? out : "null");
    regroup_string_free(out);
    return state;
  }
  void ImportState(const json& state) {
    const std::string text = state.dump();
    regroup_error* err = nullptr;
    ASSERT_EQ(regroup_engine_import_job_state(engine_, kJob, text.data(), text.size(), &err),
              REGROUP_OK)
        << Message(err);
  }
  // How many times `text` occurs in the job's engine state (a fault's detail: once per fault).
  size_t CountInState(const std::string& text) {
    const std::string s = EngineState().dump();
    size_t n = 0;
    for (size_t at = s.find(text); at != std::string::npos; at = s.find(text, at + 1)) ++n;
    return n;
  }
  // The manager's fact number `seq`: pod 0 lost, told by `detail`.
  static v1::ManagerReport NumberedFault(uint64_t seq, const std::string& detail) {
    v1::ManagerReport r = FaultReport(v1::FAULT_KIND_POD_LOST, {0}, {}, -1);
    r.mutable_fault()->set_detail(detail);
    r.set_seq(seq);
    return r;
  }
  regroup_decision Decision(const char* job = kJob) {
    regroup_decision d = REGROUP_DECISION_INIT;
    EXPECT_EQ(regroup_engine_decision(engine_, &d, job, nullptr), REGROUP_OK);
    return d;
  }
  // Ticks the engine past the report window until the job's directive is `kind`. `real_time`:
  // at the real clock, so the window lasts its 200 ms and faults arriving within it join it.
  bool EngineDecides(regroup_directive_kind kind, const char* job = kJob, bool real_time = false) {
    return Eventually([&] {
      EXPECT_EQ(regroup_engine_tick(engine_, Now() + (real_time ? 0 : 300), nullptr, nullptr),
                REGROUP_OK);
      return Decision(job).kind == kind;
    });
  }
  json DecisionJson(const char* job = kJob) {
    char* out = nullptr;
    EXPECT_EQ(regroup_engine_decision_json(engine_, &out, job, nullptr), REGROUP_OK);
    json j = json::parse(out ? out : "null");
    regroup_string_free(out);
    return j;
  }

  // Jobs `victim` and `attacker`, and the victim's manager attached (null if it could not).
  std::unique_ptr<Manager> AttachVictim(const std::string& victim, const std::string& attacker) {
    AddJob(JobJson("recover-in-place,dump", victim));
    AddJob(JobJson("recover-in-place,dump", attacker));
    auto real = std::make_unique<Manager>(JobJson("recover-in-place,dump", victim), port_);
    if (!real->remote().WaitAvailable(kWait)) {
      ADD_FAILURE() << real->remote().last_error();
      return nullptr;
    }
    return real;
  }

  // The victim's manager, attacked: still attached at `epoch`, nothing decided for its job, and
  // its own next fault (a process of pod 1 exits) still decided and delivered.
  void ExpectUntouched(Manager& real, const std::string& victim, uint64_t epoch) {
    EXPECT_TRUE(real.remote().Available()) << real.remote().last_error();
    EXPECT_EQ(real.remote().epoch(), epoch);
    ASSERT_EQ(regroup_engine_tick(engine_, Now() + 5000, nullptr, nullptr), REGROUP_OK);
    EXPECT_EQ(Decision(victim.c_str()).kind, REGROUP_DIRECTIVE_CONTINUE)
        << DecisionJson(victim.c_str()).dump();
    real.StartTraining();
    real.ProcessExits(1, 7);
    ASSERT_TRUE(EngineDecides(REGROUP_DIRECTIVE_RESTART_IN_PLACE, victim.c_str()))
        << DecisionJson(victim.c_str()).dump();
    Publish();
    EXPECT_TRUE(real.TickUntilSent([](const auto& o) { return IsRestart(o, 1); }));
  }

  regroup_engine* engine_ = nullptr;
  regroup_coordinator* coordinator_ = nullptr;
  int port_ = 0;
};

bool IsStop(const rt::JobControl::Outgoing& o, v1::StopTraining::Mode mode) {
  return o.message.has_stop() && o.message.stop().mode() == mode;
}

TEST_F(CoordinatorTest, FaultReachesTheEngineAndItsDirectiveReachesTheManager) {
  Manager m(JobJson("recover-in-place,dump"), port_);
  ASSERT_TRUE(m.remote().WaitAvailable(kWait)) << m.remote().last_error();
  m.StartTraining();
  m.ProcessExits(1, 7);

  ASSERT_TRUE(EngineDecides(REGROUP_DIRECTIVE_RESTART_IN_PLACE))
      << "the manager's fault never reached the engine: " << DecisionJson().dump();
  EXPECT_EQ(DecisionJson()["directive"]["restart_ranks"], json::array({1}));
  EXPECT_FALSE(m.remote().Poll()) << "no directive before the plugin publishes";
  // The manager restarted the process at once and the other replica trains on (the survivors
  // continue: regroup.io/survivors-continue); the engine's decision follows.
  EXPECT_TRUE(m.job().training()) << "the survivors continue before the engine decides";
  EXPECT_EQ(m.Restarts(1), 1);
  Publish();
  EXPECT_TRUE(Eventually([&] {
    ++m.now;
    m.Tick();
    return m.HasEvent("directive");
  })) << "the engine's directive never reached the manager";
  EXPECT_EQ(m.Restarts(1), 1) << "the directive restarts nothing the manager restarted already";
}

// Found by integration scenario 13 with Volcano in the loop: at a job-level restart the scheduler
// gives up every pod and recreates them. A replacement that registered while its predecessor's
// broken stream still had time to resume was reported as a new loss of the pod, and the engine,
// taking it for the replacement's, restarted the job a second time.
TEST_F(CoordinatorTest, AJobRestartsReplacementsAreNotReportedAsNewLosses) {
  const std::string id = "team/resched";
  AddJob(json{{"id", id},
              {"uid", "uid-" + id},
              {"labels", {{"fault-scheduling", "force"}, {"process-recover-enable", "off"}}},
              {"annotations", json::object()},
              {"pods", 2},
              {"processes_per_pod", 1}}
             .dump());
  Manager m(json{{"id", id}, {"pods", 2}, {"processes_per_pod", 1}}.dump(), port_);
  ASSERT_TRUE(m.remote().WaitAvailable(kWait)) << m.remote().last_error();
  m.StartTraining();
  // Pod 1's node dies: its stream breaks, and the scheduler reports the pod failed.
  m.Disconnect(1);
  ASSERT_EQ(regroup_engine_set_pod_state(engine_, id.c_str(), 1, "p1", REGROUP_POD_FAILED, "n1",
                                         Now(), nullptr),
            REGROUP_OK);
  ASSERT_TRUE(EngineDecides(REGROUP_DIRECTIVE_RESTART_JOB, id.c_str()))
      << DecisionJson(id.c_str()).dump();
  Publish();
  ASSERT_TRUE(Eventually([&] {
    ++m.now;
    m.Tick();
    return m.HasEvent("job_rescheduling");
  }));
  // The scheduler evicts pod 0 (its stream breaks too) and recreates both; the new pods register.
  m.Disconnect(0);
  for (uint32_t i = 0; i < 2; ++i)
    ASSERT_EQ(regroup_engine_set_pod_state(engine_, id.c_str(), i, ("p" + std::to_string(i) + "b").c_str(),
                                           REGROUP_POD_RUNNING, ("n" + std::to_string(i + 2)).c_str(),
                                           Now(), nullptr),
              REGROUP_OK);
  for (int64_t n = 0; n < 2; ++n) m.Register(n, "p" + std::to_string(n) + "b", 10 + n);
  // The engine resumes as soon as the new pods run (at the real clock: within the report window
  // of any fact the registrations sent).
  ASSERT_TRUE(EngineDecides(REGROUP_DIRECTIVE_RESUME, id.c_str(), /*real_time=*/true))
      << DecisionJson(id.c_str()).dump();
  // Facts the manager had to send are in; the engine's window passes: still one restart.
  for (int i = 0; i < 20; ++i) {
    ++m.now;
    m.Tick();
    ASSERT_EQ(regroup_engine_tick(engine_, Now() + 300 * (i + 1), nullptr, nullptr), REGROUP_OK);
  }
  EXPECT_EQ(Decision(id.c_str()).kind, REGROUP_DIRECTIVE_RESUME) << DecisionJson(id.c_str()).dump();
  char* out = nullptr;
  ASSERT_EQ(regroup_engine_history_json(engine_, &out, id.c_str(), nullptr), REGROUP_OK);
  const json history = json::parse(out ? out : "[]");
  regroup_string_free(out);
  int restarts = 0;
  for (const auto& h : history) restarts += h["kind"] == "restart_job";
  EXPECT_EQ(restarts, 1) << history.dump();
}

TEST_F(CoordinatorTest, AManagerGivenOnlyTheJobsIdAndSizesLearnsItsKeysFromTheCoordinator) {
  // MindCluster's manager.py passes the job id, node count and processes per node, nothing more.
  Manager m(json{{"id", kJob}, {"pods", 2}, {"processes_per_pod", 1}}.dump(), port_);
  ASSERT_TRUE(m.remote().Available()) << m.remote().last_error();
  const v1::JobKeys keys = m.remote().job_keys();
  EXPECT_EQ(keys.pods(), 2u);
  EXPECT_EQ(keys.processes_per_pod(), 1u);
  regroup::JobSpec spec;
  spec.id = kJob;
  spec.pods = 2;
  EXPECT_FALSE(spec.Resolve().config.recovery_on());  // what it would run with alone
  const rt::TakenKeys taken = rt::TakeJobKeys(keys, spec);
  EXPECT_TRUE(taken.taken);
  EXPECT_TRUE(taken.differences.empty());  // nothing given: nothing replaced, line by line
  EXPECT_EQ(spec.labels, (std::map<std::string, std::string>{{"fault-scheduling", "force"}}));
  EXPECT_EQ(spec.annotations,
            (std::map<std::string, std::string>{{"recover-strategy", "recover-in-place,dump"}}));
  EXPECT_EQ(spec.env, (std::map<std::string, std::string>{{"MINDIO_WAIT_MINDX_TIME", "1"}}));
  EXPECT_TRUE(spec.Resolve().config.recovery_on());
}

TEST(TakeJobKeys, TheCoordinatorsKeysReplaceTheManagersAndEachDifferenceIsNamed) {
  v1::JobKeys keys;
  (*keys.mutable_labels())["fault-scheduling"] = "force";
  (*keys.mutable_annotations())["recover-strategy"] = "recover,exit";
  keys.set_pods(4);
  keys.set_processes_per_pod(2);
  regroup::JobSpec spec;
  spec.id = kJob;
  spec.labels = {{"fault-scheduling", "grace"}, {"pod-rescheduling", "on"}};
  spec.pods = 3;
  spec.processes_per_pod = 2;
  const rt::TakenKeys taken = rt::TakeJobKeys(keys, spec);
  ASSERT_TRUE(taken.taken);
  EXPECT_EQ(taken.differences,
            (std::vector<std::string>{"label fault-scheduling=force (was grace)",
                                      "label pod-rescheduling unset (was on)",
                                      "annotation recover-strategy=recover,exit (was unset)",
                                      "pod count 4 (was 3)"}));
  EXPECT_EQ(spec.labels, (std::map<std::string, std::string>{{"fault-scheduling", "force"}}));
  EXPECT_EQ(spec.pods, 4);

  // A size that differs says where the scheduler's side read it, so the pod template can be fixed.
  keys.set_processes_per_pod(1);
  const rt::TakenKeys sized = rt::TakeJobKeys(keys, spec);
  ASSERT_EQ(sized.differences.size(), 1u);
  EXPECT_EQ(sized.differences[0],
            "processes per pod 1 (was 2; the scheduler's side reads it from the pod template: an "
            "accelerator request, else --nproc-per-node in the command, else PET_NPROC_PER_NODE "
            "in the env, else 1)");
  keys.set_processes_per_pod(2);
  spec.processes_per_pod = 2;

  // A coordinator that predates the keys sends none: the manager keeps its own.
  regroup::JobSpec mine = spec;
  EXPECT_FALSE(rt::TakeJobKeys(v1::JobKeys(), mine).taken);
  EXPECT_EQ(mine.labels, spec.labels);
}

TEST_F(CoordinatorTest, DirectiveCarriesEveryFieldAndIsSentOncePerId) {
  RawStream s(port_, kCredential);
  const int64_t before = Now();
  ASSERT_TRUE(s.Hello(kJob, 0));
  v1::CoordinatorDirective first = s.Read();
  ASSERT_TRUE(first.has_directive()) << "a manager gets its job's directive when it attaches";
  EXPECT_EQ(first.directive().id(), 0u);
  EXPECT_EQ(first.directive().kind(), v1::Directive::KIND_CONTINUE);
  EXPECT_EQ(first.header().job_id(), kJob);
  EXPECT_EQ(first.header().sender(), "coordinator");
  const uint64_t epoch = first.header().epoch();
  EXPECT_GE(epoch, static_cast<uint64_t>(before)) << "the epoch granted is at least the clock";
  EXPECT_EQ(first.epoch_ticket(), regroup::EpochTicket(kClusterKey, kJob, "uid-default/coord", epoch));

  ASSERT_TRUE(s.Send(FaultReport(v1::FAULT_KIND_PROCESS_EXIT, {1}, {1}, 9), kJob, epoch));
  ASSERT_TRUE(EngineDecides(REGROUP_DIRECTIVE_RESTART_IN_PLACE));
  Publish();
  Publish();  // the same id again: not sent twice
  v1::CoordinatorDirective next = s.Read();
  ASSERT_TRUE(next.has_directive());
  const json want = DecisionJson()["directive"];
  const v1::Directive& d = next.directive();
  EXPECT_EQ(d.id(), want["id"].get<uint64_t>());
  EXPECT_EQ(d.kind(), v1::Directive::KIND_RESTART_IN_PLACE);
  EXPECT_EQ(d.strategy(), want["strategy"].get<std::string>());
  EXPECT_EQ(d.dp(), want["dp"].get<uint32_t>());
  EXPECT_EQ(std::vector<uint32_t>(d.keep_replicas().begin(), d.keep_replicas().end()),
            want["keep_replicas"].get<std::vector<uint32_t>>());
  EXPECT_EQ(std::vector<uint32_t>(d.restart_ranks().begin(), d.restart_ranks().end()),
            std::vector<uint32_t>{1});
  EXPECT_EQ(d.committed_step(), want["committed_step"].get<int64_t>());
  EXPECT_EQ(d.deadline_ms(), -1);
  EXPECT_EQ(d.reason(), want["reason"].get<std::string>());
  EXPECT_TRUE(s.Finish().ok());
}

TEST_F(CoordinatorTest, MissingOrWrongCredentialIsRefused) {
  RawStream none(port_, "");
  (void)none.Hello(kJob, 0);
  grpc::Status st = none.Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();

  RawStream s(port_, "wrong");
  (void)s.Hello(kJob, 0);
  st = s.Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED) << st.error_message();
  EXPECT_NE(st.error_message().find("not the token of job default/coord"), std::string::npos)
      << st.error_message();

  Manager m(JobJson("recover-in-place,dump"), port_, "wrong");
  EXPECT_FALSE(m.remote().WaitAvailable(500ms));
  EXPECT_EQ(m.remote().epoch(), 0u) << "no epoch is granted to a refused manager";
  EXPECT_EQ(m.remote().job_keys().ByteSizeLong(), 0u) << "nor the job's keys";
  EXPECT_TRUE(Eventually([&] {
    return m.remote().last_error().find("not the token of job default/coord") != std::string::npos;
  })) << m.remote().last_error();
}

// Issue 40, finding 2: streams that never said hello were never closed (15,000 of them, each with
// any non-empty token, held 303 MB in the scheduler). At most 64 are kept, more are refused at
// once, and each is closed when it has said no hello within 5 s; the real manager then attaches.
TEST_F(CoordinatorTest, StreamsThatNeverSayHelloAreBoundedAndClosed) {
  constexpr int kStreams = 100;
  std::vector<std::unique_ptr<RawStream>> silent;
  for (int i = 0; i < kStreams; ++i) silent.push_back(std::make_unique<RawStream>(port_, "any-token"));
  int refused = 0, timed_out = 0;
  std::string other;
  for (auto& s : silent) {
    grpc::Status st = s->AwaitEnd();
    if (st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
        st.error_message().find("64 streams have said no hello yet") != std::string::npos)
      ++refused;
    else if (st.error_code() == grpc::StatusCode::UNAUTHENTICATED &&
             st.error_message().find("said no hello within 5 s") != std::string::npos)
      ++timed_out;
    else
      other = std::to_string(st.error_code()) + " " + st.error_message();
  }
  EXPECT_EQ(refused, kStreams - 64) << other;
  EXPECT_EQ(timed_out, 64) << other;
  Manager m(JobJson("recover-in-place,dump"), port_, TokenOf(kJob));
  EXPECT_TRUE(m.remote().WaitAvailable(kWait)) << m.remote().last_error();
}

TEST_F(CoordinatorTest, UnknownJobIsRefused) {
  RawStream s(port_, kCredential);
  ASSERT_TRUE(s.Hello("default/nope", 0));
  v1::CoordinatorDirective m = s.Read();
  ASSERT_TRUE(m.has_refusal());
  EXPECT_NE(m.refusal().reason().find("no job default/nope"), std::string::npos);
  EXPECT_EQ(s.Finish().error_code(), grpc::StatusCode::NOT_FOUND);
}

// A refusal names the job it refuses, but never echoes more of a caller's job id than a real one
// can hold: a 100 KB id in a status's metadata broke the connection other streams shared with it
// (RESOURCE_EXHAUSTED: "received initial metadata size exceeds limit").
TEST_F(CoordinatorTest, ARefusalEchoesABoundedPartOfAHugeJobId) {
  const std::string huge = "default/" + std::string(100000, 'x');
  RawStream s(port_, kCredential);
  ASSERT_TRUE(s.Hello(huge, 0));
  v1::CoordinatorDirective m = s.Read();
  ASSERT_TRUE(m.has_refusal());
  EXPECT_NE(m.refusal().reason().find("no job default/xxx"), std::string::npos);
  EXPECT_LE(m.refusal().reason().size(), 1024u);
  EXPECT_LE(m.header().job_id().size(), 512u);
  const grpc::Status st = s.Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND) << st.error_message().substr(0, 200);
  EXPECT_LE(st.error_message().size(), 1024u);
}

TEST_F(CoordinatorTest, FirstMessageMustBeHello) {
  RawStream s(port_, kCredential);
  ASSERT_TRUE(s.Send(FaultReport(v1::FAULT_KIND_HANG, {0}, {}, 1), kJob, 0));
  EXPECT_TRUE(s.Read().has_refusal());
  EXPECT_EQ(s.Finish().error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(CoordinatorTest, OlderEpochIsFencedAndANewerOneReplacesTheAttachedManager) {
  // An earlier incarnation, granted its epoch and gone.
  uint64_t three = 0;
  std::string three_ticket;
  {
    RawStream s(port_, kCredential);
    ASSERT_TRUE(s.Hello(kJob, 0));
    v1::CoordinatorDirective granted = s.Read();
    ASSERT_TRUE(granted.has_directive());
    three = granted.header().epoch();
    three_ticket = granted.epoch_ticket();
    EXPECT_TRUE(s.Finish().ok());
  }
  Manager five(JobJson("recover-in-place,dump"), port_);
  ASSERT_TRUE(five.remote().WaitAvailable(kWait)) << five.remote().last_error();
  EXPECT_GT(five.remote().epoch(), three) << "every grant is above the one before";
  EXPECT_EQ(five.job().epoch(), five.remote().epoch()) << "the manager adopts the granted epoch";

  RawStream older(port_, kCredential);
  ASSERT_TRUE(older.Hello(kJob, three, three_ticket));
  v1::CoordinatorDirective refusal = older.Read();
  ASSERT_TRUE(refusal.has_refusal());
  EXPECT_NE(refusal.refusal().reason().find("fenced"), std::string::npos);
  EXPECT_EQ(refusal.refusal().epoch(), five.remote().epoch())
      << "the refusal names the epoch served";
  grpc::Status st = older.Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("fenced"), std::string::npos);
  EXPECT_TRUE(five.remote().Available()) << "a refused older manager changes nothing";

  Manager seven(JobJson("recover-in-place,dump"), port_);
  ASSERT_TRUE(seven.remote().WaitAvailable(kWait)) << seven.remote().last_error();
  EXPECT_GT(seven.remote().epoch(), five.remote().epoch());
  EXPECT_TRUE(Eventually([&] { return !five.remote().Available(); }))
      << "the replaced manager's stream was not closed";
  EXPECT_TRUE(Eventually([&] {
    return five.remote().last_error().find("fenced") != std::string::npos;
  })) << five.remote().last_error();

  // Only the newer manager's facts reach the engine, and its directives only it.
  seven.StartTraining();
  seven.ProcessExits(0, 3);
  ASSERT_TRUE(EngineDecides(REGROUP_DIRECTIVE_RESTART_IN_PLACE));
  Publish();
  EXPECT_TRUE(seven.TickUntilSent([](const auto& o) { return IsRestart(o, 0); }));
  EXPECT_FALSE(five.remote().Poll());
  EXPECT_FALSE(five.remote().Available());
}

TEST_F(CoordinatorTest, BadFactsAreRefusedAndChangeNothing) {
  RawStream s(port_, kCredential);
  ASSERT_TRUE(s.Hello(kJob, 0));
  v1::CoordinatorDirective granted = s.Read();
  ASSERT_TRUE(granted.has_directive());
  const uint64_t e = granted.header().epoch();
  const json before = DecisionJson();

  ASSERT_TRUE(s.Send(FaultReport(v1::FAULT_KIND_POD_LOST, {7}, {}, -1), kJob, e));
  v1::CoordinatorDirective m = s.Read();
  ASSERT_TRUE(m.has_refusal());
  EXPECT_NE(m.refusal().reason().find("has no pod 7"), std::string::npos)
      << m.refusal().reason();

  v1::ManagerReport zombie;
  zombie.mutable_replacement()->set_pod(1);
  zombie.mutable_replacement()->set_pod_uid("p1");
  // Pod 1 is lost (its pod failed), then "p1" comes back claiming to be its replacement.
  ASSERT_EQ(regroup_engine_set_pod_state(engine_, kJob, 1, "p1", REGROUP_POD_FAILED, "n1", Now(),
                                         nullptr),
            REGROUP_OK);
  ASSERT_TRUE(s.Send(zombie, kJob, e));
  m = s.Read();
  ASSERT_TRUE(m.has_refusal());
  EXPECT_NE(m.refusal().reason().find("zombie"), std::string::npos) << m.refusal().reason();

  v1::ManagerReport no_kind = FaultReport(v1::FAULT_KIND_UNSPECIFIED, {0}, {}, 1);
  ASSERT_TRUE(s.Send(no_kind, kJob, e));
  EXPECT_TRUE(s.Read().has_refusal());
  ASSERT_TRUE(s.Send(FaultReport(v1::FAULT_KIND_HANG, {0}, {}, 1), "default/other", e));
  EXPECT_TRUE(s.Read().has_refusal()) << "a report for another job";
  v1::ManagerReport empty;
  ASSERT_TRUE(s.Send(empty, kJob, e));
  EXPECT_TRUE(s.Read().has_refusal()) << "a report without a body";

  json after = DecisionJson();
  EXPECT_EQ(after["directive"], before["directive"]);
  // The stream stays attached: a good replacement is taken.
  v1::ManagerReport good;
  good.mutable_replacement()->set_pod(1);
  good.mutable_replacement()->set_pod_uid("p1-new");
  ASSERT_TRUE(s.Send(good, kJob, e));
  char* state = nullptr;
  EXPECT_TRUE(Eventually([&] {
    EXPECT_EQ(regroup_engine_export_job_state(engine_, &state, kJob, nullptr), REGROUP_OK);
    // The state keeps the replacement's uid as its fingerprint.
    const bool seen =
        std::string(state).find(regroup::UidFingerprint("p1-new").substr(1)) != std::string::npos;
    regroup_string_free(state);
    return seen;
  }));
  EXPECT_TRUE(s.Finish().ok());
}

// Simulation seed 145 with a coordinator: a fault written during a cut longer than the
// keepalive was lost with the stream, and the engine never decided. Facts are numbered, the
// coordinator acknowledges the highest it applied, and one sent again after a reattach counts
// once.
TEST_F(CoordinatorTest, AFactSentAgainAfterAReattachIsAppliedOnceAndEveryMessageAcknowledges) {
  uint64_t e = 0;
  std::string ticket;
  {
    RawStream s(port_, kCredential);
    ASSERT_TRUE(s.Hello(kJob, 0));
    const v1::CoordinatorDirective granted = s.Read();
    ASSERT_TRUE(granted.has_directive());
    EXPECT_TRUE(granted.acks_facts());
    EXPECT_EQ(granted.applied_seq(), 0u);
    e = granted.header().epoch();
    ticket = granted.epoch_ticket();
    ASSERT_TRUE(s.Send(NumberedFault(1, "lost-once"), kJob, e));
    v1::ManagerReport lease;
    lease.mutable_lease()->set_sent_ms(1);
    ASSERT_TRUE(s.Send(lease, kJob, e));
    const v1::CoordinatorDirective ack = s.Read();
    EXPECT_TRUE(ack.has_lease());
    EXPECT_EQ(ack.applied_seq(), 1u) << "the lease's answer acknowledges the fault";
  }
  ASSERT_TRUE(Eventually([&] { return CountInState("lost-once") == 1; }));
  // The stream broke; the manager attaches again and sends what it saw no acknowledgment of.
  RawStream again(port_, kCredential);
  ASSERT_TRUE(again.Hello(kJob, e, ticket));
  const v1::CoordinatorDirective answer = again.Read();
  ASSERT_TRUE(answer.has_directive()) << answer.DebugString();
  EXPECT_EQ(answer.applied_seq(), 1u) << "the answer to the hello says what was applied";
  ASSERT_TRUE(again.Send(NumberedFault(1, "lost-once"), kJob, e));
  ASSERT_TRUE(again.Send(NumberedFault(2, "lost-after"), kJob, e));
  v1::ManagerReport lease;
  lease.mutable_lease()->set_sent_ms(2);
  ASSERT_TRUE(again.Send(lease, kJob, e));
  EXPECT_EQ(again.Read().applied_seq(), 2u);
  EXPECT_EQ(CountInState("lost-once"), 1u) << "the fault sent again is not counted twice";
  EXPECT_EQ(CountInState("lost-after"), 1u);
  EXPECT_TRUE(again.Finish().ok());
}

// Simulation seeds 3932, 6444 and others with a coordinator: a fact acknowledged, then lost with
// an engine state not yet saved when the scheduler restarted, was never sent again. Once the
// scheduler saves states through the coordinator, only what a saved state holds is acknowledged.
TEST_F(CoordinatorTest, OnceStatesAreSavedOnlyTheFactsASavedStateHoldsAreAcknowledged) {
  RawStream s(port_, kCredential);
  ASSERT_TRUE(s.Hello(kJob, 0));
  const v1::CoordinatorDirective granted = s.Read();
  ASSERT_TRUE(granted.has_directive());
  const uint64_t e = granted.header().epoch();
  auto send = [&](uint64_t seq) {
    v1::ManagerReport r = FaultReport(v1::FAULT_KIND_POD_LOST, {0}, {}, -1);
    r.set_seq(seq);
    ASSERT_TRUE(s.Send(r, kJob, e));
  };
  auto acked = [&](int64_t sent_ms) {
    v1::ManagerReport lease;
    lease.mutable_lease()->set_sent_ms(sent_ms);
    EXPECT_TRUE(s.Send(lease, kJob, e));
    return s.Read().applied_seq();
  };
  auto export_state = [&](uint64_t& epoch, uint64_t& seq) {
    char* state = nullptr;
    ASSERT_EQ(regroup_coordinator_export_job_state(coordinator_, kJob, &state, &epoch, &seq, nullptr),
              REGROUP_OK);
    char* engine_state = nullptr;
    ASSERT_EQ(regroup_engine_export_job_state(engine_, &engine_state, kJob, nullptr), REGROUP_OK);
    EXPECT_STREQ(state, engine_state) << "the engine's export, with a mark";
    regroup_string_free(state);
    regroup_string_free(engine_state);
  };
  send(1);
  EXPECT_EQ(acked(1), 1u) << "no state saved through the coordinator yet: what was applied";
  uint64_t epoch = 0, seq = 0;
  export_state(epoch, seq);
  EXPECT_EQ(epoch, e);
  EXPECT_EQ(seq, 1u);
  send(2);
  ASSERT_EQ(regroup_coordinator_state_saved(coordinator_, kJob, epoch, seq, nullptr), REGROUP_OK);
  EXPECT_EQ(acked(2), 1u) << "fault 2 is in no saved state";
  export_state(epoch, seq);
  EXPECT_EQ(seq, 2u);
  ASSERT_EQ(regroup_coordinator_state_saved(coordinator_, kJob, epoch, seq, nullptr), REGROUP_OK);
  EXPECT_EQ(acked(3), 2u);
  ASSERT_EQ(regroup_coordinator_state_saved(coordinator_, kJob, epoch + 1, 9, nullptr), REGROUP_OK);
  EXPECT_EQ(acked(4), 2u) << "a mark of another epoch changes nothing";
  char* state = nullptr;
  uint64_t ignored = 0;
  regroup_error* err = nullptr;
  EXPECT_EQ(regroup_coordinator_export_job_state(coordinator_, "default/nope", &state, &ignored,
                                                 &ignored, &err),
            REGROUP_NOT_FOUND);
  EXPECT_NE(Message(err).find("no job default/nope"), std::string::npos);
  EXPECT_EQ(state, nullptr);
  EXPECT_EQ(regroup_coordinator_export_job_state(coordinator_, kJob, nullptr, &ignored, &ignored,
                                                 nullptr),
            REGROUP_INVALID_ARGUMENT);
  EXPECT_EQ(regroup_coordinator_state_saved(nullptr, kJob, 0, 0, nullptr), REGROUP_INVALID_ARGUMENT);
  EXPECT_TRUE(s.Finish().ok());
}

// Scenario 18 with a 30 s lease: a fault applied and stored by the scheduler, whose
// acknowledgment the manager had not heard (it rides on the lease's answers) when the scheduler
// restarted, was sent again to the new coordinator and applied again: a second wait, with a new
// deadline, replaced the stored one. A stored state says which facts it holds.
TEST_F(CoordinatorTest, AFactAStoredStateHoldsIsNotAppliedAgainAfterARestart) {
  const int port = port_;
  RawStream s(port_, kCredential);
  ASSERT_TRUE(s.Hello(kJob, 0));
  const v1::CoordinatorDirective granted = s.Read();
  ASSERT_TRUE(granted.has_directive());
  const uint64_t e = granted.header().epoch();
  ASSERT_TRUE(s.Send(NumberedFault(1, "lost-before-the-restart"), kJob, e));
  ASSERT_TRUE(Eventually([&] { return CountInState("lost-before-the-restart") == 1; }));
  char* out = nullptr;
  uint64_t epoch = 0, seq = 0;
  ASSERT_EQ(regroup_coordinator_export_job_state(coordinator_, kJob, &out, &epoch, &seq, nullptr),
            REGROUP_OK);
  const json stored = json::parse(out);
  regroup_string_free(out);
  EXPECT_EQ((std::pair<uint64_t, uint64_t>{epoch, seq}), (std::pair<uint64_t, uint64_t>{e, 1}));
  EXPECT_EQ(stored.value("facts_epoch", uint64_t{0}), e) << stored.dump();
  EXPECT_EQ(stored.value("facts_seq", uint64_t{0}), 1u);
  ASSERT_EQ(regroup_coordinator_state_saved(coordinator_, kJob, epoch, seq, nullptr), REGROUP_OK);

  // The scheduler restarts before the manager heard the acknowledgment, and imports the state.
  Stop();
  EXPECT_FALSE(s.Finish().ok());
  ImportState(stored);
  Start("127.0.0.1:" + std::to_string(port));
  RawStream again(port_, kCredential);
  ASSERT_TRUE(again.Hello(kJob, e, granted.epoch_ticket()));
  const v1::CoordinatorDirective answer = again.Read();
  ASSERT_TRUE(answer.has_directive()) << answer.DebugString();
  EXPECT_EQ(answer.applied_seq(), 1u) << "the stored state holds fact 1: the manager need not resend it";
  ASSERT_TRUE(again.Send(NumberedFault(1, "lost-before-the-restart"), kJob, e));
  ASSERT_TRUE(again.Send(NumberedFault(2, "lost-after-the-restart"), kJob, e));
  ASSERT_TRUE(Eventually([&] { return CountInState("lost-after-the-restart") == 1; }));
  EXPECT_EQ(CountInState("lost-before-the-restart"), 1u) << "the fault sent again is not applied twice";
  EXPECT_TRUE(again.Finish().ok());
}

TEST_F(CoordinatorTest, CoordinatorDownPausesSurvivorsThenDumpsAfterTheDecisionWait) {
  Manager m(JobJson("recover-in-place,dump"), port_);
  ASSERT_TRUE(m.remote().WaitAvailable(kWait));
  m.StartTraining();
  Stop();
  ASSERT_TRUE(Eventually([&] { return !m.remote().Available(); }));

  m.ProcessExits(1, 4);
  m.Tick();
  EXPECT_TRUE(m.HasEvent("decisions_unavailable"));
  EXPECT_GE(m.remote().queued(), 1u) << "the fault waits for the coordinator";
  m.now += 999;
  m.Tick();
  EXPECT_FALSE(m.HasEvent("decision_timeout")) << "survivors stay paused for the whole wait";
  m.now += 1;
  m.Tick();
  EXPECT_TRUE(m.HasEvent("decision_timeout"));
  int dumps = 0;
  for (const auto& o : m.sent()) dumps += IsStop(o, v1::StopTraining::MODE_DUMP);
  EXPECT_EQ(dumps, 2) << "both agents are told to dump";
  EXPECT_EQ(m.job().StatusReport().phase(), "stopped");
}

TEST_F(CoordinatorTest, CoordinatorDownWithoutDumpExitsAfterTheDecisionWait) {
  AddJob(JobJson("recover-in-place", "default/nodump"));
  Manager m(JobJson("recover-in-place", "default/nodump"), port_);
  ASSERT_TRUE(m.remote().WaitAvailable(kWait));
  m.StartTraining();
  Stop();
  ASSERT_TRUE(Eventually([&] { return !m.remote().Available(); }));
  m.ProcessExits(0, 4);
  m.Tick();
  m.now += 1000;
  m.Tick();
  int exits = 0;
  for (const auto& o : m.sent()) exits += IsStop(o, v1::StopTraining::MODE_EXIT);
  EXPECT_EQ(exits, 2);
}

// Issue 37: the manager's word that its faults are settled travels as a fact, after the fault;
// the coordinator's engine then decides without waiting out the report window (its clock here
// stays 50 ms past the moment the fault was sent: only the settle can close the window).
TEST_F(CoordinatorTest, AManagersFaultsSettledCloseTheReportWindowAtTheCoordinator) {
  Manager m(JobJson("recover-in-place,dump"), port_);
  ASSERT_TRUE(m.remote().WaitAvailable(kWait)) << m.remote().last_error();
  v1::FaultFacts f;
  f.set_kind(v1::FAULT_KIND_PROCESS_EXIT);
  f.add_pods(0);
  f.add_ranks(0);
  f.set_step(5);
  const int64_t sent = Now();
  m.remote().Fault(f, 0);
  auto decided_within_the_window = [&] {
    EXPECT_EQ(regroup_engine_tick(engine_, sent + 50, nullptr, nullptr), REGROUP_OK);
    return Decision().kind == REGROUP_DIRECTIVE_RESTART_IN_PLACE;
  };
  // The fault is in: its window is open at the coordinator, and does not close by itself.
  ASSERT_TRUE(Eventually([&] { return EngineState()["window_start_ms"].get<int64_t>() >= 0; }))
      << EngineState().dump();
  EXPECT_FALSE(decided_within_the_window());
  m.remote().FaultsSettled(1, 0);
  EXPECT_TRUE(Eventually(decided_within_the_window)) << DecisionJson().dump();
}

TEST_F(CoordinatorTest, FactsQueuedWhileAwayAreDeliveredAfterReattach) {
  Manager m(JobJson("recover-in-place,dump"), port_);
  ASSERT_TRUE(m.remote().WaitAvailable(kWait));
  const int port = port_;
  Stop();
  ASSERT_TRUE(Eventually([&] { return !m.remote().Available(); }));

  v1::FaultFacts first, second;
  first.set_kind(v1::FAULT_KIND_PROCESS_EXIT);
  first.add_pods(0);
  first.add_ranks(0);
  first.set_step(5);
  second = first;
  second.set_kind(v1::FAULT_KIND_HANG);
  m.remote().Fault(first, 0);
  m.remote().Fault(second, 0);
  EXPECT_EQ(m.remote().queued(), 2u);
  EXPECT_EQ(Decision().kind, REGROUP_DIRECTIVE_CONTINUE);

  Start("127.0.0.1:" + std::to_string(port));  // the scheduler restarted, same address
  ASSERT_TRUE(m.remote().WaitAvailable(kWait)) << m.remote().last_error();
  ASSERT_TRUE(Eventually([&] { return m.remote().queued() == 0; }));
  // Written is not yet read by the coordinator: the second fact may still be on its way when
  // the first opens the report window, which must then not be closed early.
  ASSERT_TRUE(EngineDecides(REGROUP_DIRECTIVE_RESTART_IN_PLACE, kJob, /*real_time=*/true))
      << DecisionJson().dump();
  const std::string reason = DecisionJson()["directive"]["reason"];
  ASSERT_NE(reason.find("hang"), std::string::npos) << "both queued faults arrived: " << reason;
  EXPECT_LT(reason.find("process_exit"), reason.find("hang")) << "in order: " << reason;
  EXPECT_EQ(m.remote().attaches(), 2u);
  Publish();
  std::optional<regroup::Directive> d;
  EXPECT_TRUE(Eventually([&] { return (d = m.remote().Poll()).has_value(); }));
  if (d) {
    EXPECT_EQ(d->kind, REGROUP_DIRECTIVE_RESTART_IN_PLACE);
    EXPECT_EQ(d->restart_ranks, (std::vector<int64_t>{0}));
  }
}

// A coordinator's address that accepts connections and never answers them (a wedged server, or
// a client's own state gone bad): after fresh_channel_after without an attach, the manager makes
// a new channel, which reaches the coordinator.
TEST_F(CoordinatorTest, AManagerThatCannotAttachConnectsAgainOnAFreshChannel) {
  const int silent = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(silent, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::bind(silent, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(silent, 16), 0);
  ASSERT_EQ(::getsockname(silent, reinterpret_cast<sockaddr*>(&addr), &len), 0);

  rt::RemoteDecisionsOptions o;
  o.target = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  o.channel = regroup::MakeChannel(o.target, {}, 300ms).value();
  int fresh = 0;
  const std::string coordinator = "127.0.0.1:" + std::to_string(port_);
  o.make_channel = [&]() -> std::shared_ptr<grpc::Channel> {
    ++fresh;
    return regroup::MakeChannel(coordinator).value();
  };
  o.fresh_channel_after = 500ms;
  o.credential = kCredential;
  o.job_id = kJob;
  rt::RemoteDecisions remote(o);
  EXPECT_TRUE(remote.WaitAvailable(kWait)) << remote.last_error();
  EXPECT_GT(remote.epoch(), 0u);
  // At least one: on a loaded machine a fresh channel may itself take past fresh_channel_after.
  EXPECT_GE(fresh, 1);
  ::close(silent);
}

TEST_F(CoordinatorTest, RemovedJobEndsItsManagersStream) {
  RawStream s(port_, kCredential);
  ASSERT_TRUE(s.Hello(kJob, 0));
  ASSERT_TRUE(s.Read().has_directive());
  ASSERT_EQ(regroup_engine_remove_job(engine_, kJob, nullptr), REGROUP_OK);
  Publish();
  v1::CoordinatorDirective m = s.Read();
  ASSERT_TRUE(m.has_refusal());
  EXPECT_EQ(s.Finish().error_code(), grpc::StatusCode::NOT_FOUND);
}

// Issue 12's attack: a manager of one job (or anyone holding the cluster key) claims another job.
TEST_F(CoordinatorTest, AnotherJobsTokenOrTheClusterKeyNeverActsAsTheJob) {
  const std::string victim = "team-a/victim", attacker = "team-b/attacker";
  auto victims_manager = AttachVictim(victim, attacker);
  ASSERT_TRUE(victims_manager);
  Manager& real = *victims_manager;
  const uint64_t epoch = real.remote().epoch();

  // Another job's token, the cluster key itself, and the token of an earlier job of the same
  // name (another uid).
  for (const std::string& credential :
       {TokenOf(attacker), std::string(kClusterKey),
        regroup::JobToken(kClusterKey, victim, "uid-of-a-deleted-job")}) {
    RawStream s(port_, credential);
    ASSERT_TRUE(s.Hello(victim, 0));
    v1::CoordinatorDirective m = s.Read();
    ASSERT_TRUE(m.has_refusal()) << "no directive for a job the caller is not";
    EXPECT_TRUE(m.epoch_ticket().empty()) << "no epoch is granted";
    EXPECT_EQ(m.refusal().epoch(), 0u) << "nothing of the job's state is told";
    EXPECT_EQ(m.header().epoch(), 0u);
    (void)s.Send(FaultReport(v1::FAULT_KIND_POD_LOST, {0, 1}, {}, -1), victim, epoch);
    grpc::Status st = s.Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED) << st.error_message();
    EXPECT_NE(st.error_message().find("not the token of job team-a/victim"), std::string::npos)
        << st.error_message();
    EXPECT_EQ(st.error_message().find(credential), std::string::npos) << "a secret echoed";
    EXPECT_EQ(m.refusal().reason().find(credential), std::string::npos) << "a secret echoed";
  }
  // The manager's own client, with the attacker's token.
  Manager impostor(JobJson("recover-in-place,dump", victim), port_, TokenOf(attacker));
  EXPECT_FALSE(impostor.remote().Available());
  EXPECT_EQ(impostor.remote().epoch(), 0u);
  EXPECT_TRUE(Eventually([&] {
    return impostor.remote().last_error().find("not the token of job team-a/victim") !=
           std::string::npos;
  })) << impostor.remote().last_error();

  // Nothing changed for the victim: its manager is attached as before, the engine evicts
  // nothing, and the real manager's facts still decide.
  ExpectUntouched(real, victim, epoch);

  // The attacker's token is good for its own job.
  RawStream own(port_, TokenOf(attacker));
  ASSERT_TRUE(own.Hello(attacker, 0));
  EXPECT_TRUE(own.Read().has_directive());
  EXPECT_TRUE(own.Finish().ok());
}

// Issue 12, "fuzzing": a manager that holds its own job's token but sends anything, through the
// real server. 300 streams from three threads (a fixed seed each) of up to 12 random reports
// (every body kind, any field; half of them headed for its own job, a quarter for the victim's,
// the rest anywhere; hellos with any epoch and ticket; a third of the streams open with a good
// hello), each ended, cancelled or timed out. Every
// call ends with a status; the victim's manager stays attached at its epoch, the engine decides
// nothing for the victim, and the victim's next fault is still decided and delivered.
TEST_F(CoordinatorTest, AHostileManagerWithItsOwnTokenNeverReachesAnotherJob) {
  const regroup::ProtobufQuiet quiet;  // (its complaints about the reports' bad UTF-8)
  const std::string victim = "team-a/victim", attacker = "team-b/attacker";
  auto victims_manager = AttachVictim(victim, attacker);
  ASSERT_TRUE(victims_manager);
  Manager& real = *victims_manager;
  const uint64_t epoch = real.remote().epoch();
  const json before = DecisionJson(victim.c_str());

  std::atomic<int> calls{0}, granted{0};
  auto hostile = [&](uint64_t seed) {
    regroup::RandomMessages random(seed);
    auto stub = v1::Coordinator::NewStub(
        regroup::MakeChannel("127.0.0.1:" + std::to_string(port_)).value());
    for (int i = 0; i < 100; ++i) {
      grpc::ClientContext ctx;
      regroup::AttachCredential(ctx, TokenOf(attacker));
      ctx.set_deadline(std::chrono::system_clock::now() + 200ms);
      auto stream = stub->Attach(&ctx);
      const bool hello = random.OneIn(3);
      for (uint64_t n = 0, count = random.Below(13); n < count; ++n) {
        auto r = random.Make<v1::ManagerReport>();
        const uint64_t to = random.Below(4);
        if (to < 3) r.mutable_header()->set_job_id(to < 2 ? attacker : victim);
        if (to < 3 && random.OneIn(2)) r.mutable_header()->set_epoch(epoch + random.Below(3) - 1);
        if (n == 0 && hello) {  // a good hello first: the rest reaches the coordinator's logic
          r.Clear();
          r.mutable_header()->set_job_id(attacker);
          r.mutable_hello();
        }
        if (!stream->Write(r)) break;
      }
      if (random.OneIn(4)) {
        ctx.TryCancel();
      } else if (random.OneIn(2)) {
        stream->WritesDone();
      }
      v1::CoordinatorDirective m;
      while (stream->Read(&m))
        if (m.has_directive() && m.header().job_id() == attacker) ++granted;
      (void)stream->Finish();  // every call ends, with a status
      ++calls;
    }
  };
  std::vector<std::thread> threads;
  for (uint64_t seed = 1; seed <= 3; ++seed)
    threads.emplace_back(hostile, regroup::HostileSeedBase() + seed);
  for (auto& t : threads) t.join();
  std::printf("%d calls: %d granted an epoch of the attacker's own job\n", calls.load(),
              granted.load());
  EXPECT_EQ(calls.load(), 300);
  EXPECT_GT(granted.load(), 0) << "some of it attached to its own job, into the coordinator's logic";

  // The victim: its manager attached as before, nothing decided, and its own fault still decided.
  EXPECT_EQ(DecisionJson(victim.c_str())["directive"], before["directive"]);
  ExpectUntouched(real, victim, epoch);
}

// Issue 12's lockout: `--epoch 18446744073709551615` fenced the real manager for good. Epochs
// are granted: one a client makes up is refused, even with the job's own token.
TEST_F(CoordinatorTest, AnEpochTheCoordinatorDidNotGrantNeverFencesTheRealManager) {
  const std::string victim = "team-a/victim";
  const std::string uid = "uid-" + victim;
  AddJob(JobJson("recover-in-place,dump", victim));
  Manager real(JobJson("recover-in-place,dump", victim), port_);
  ASSERT_TRUE(real.remote().WaitAvailable(kWait)) << real.remote().last_error();
  const uint64_t epoch = real.remote().epoch();
  ASSERT_GT(epoch, 0u);

  const uint64_t huge = std::numeric_limits<uint64_t>::max();
  for (const std::string& ticket :
       {std::string(), std::string("forged"), regroup::EpochTicket("another-key", victim, uid, huge),
        regroup::EpochTicket(kClusterKey, victim, uid, epoch)}) {  // a real ticket, another epoch
    RawStream s(port_, TokenOf(victim));
    ASSERT_TRUE(s.Hello(victim, huge, ticket));
    v1::CoordinatorDirective m = s.Read();
    ASSERT_TRUE(m.has_refusal());
    grpc::Status st = s.Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED) << st.error_message();
    EXPECT_NE(st.error_message().find("was not granted by the coordinator"), std::string::npos)
        << st.error_message();
  }
  EXPECT_TRUE(real.remote().Available()) << real.remote().last_error();
  EXPECT_EQ(real.remote().epoch(), epoch);

  // The real manager's facts still reach the engine, and the engine records its epoch, not a
  // made-up one.
  real.StartTraining();
  real.ProcessExits(0, 3);
  ASSERT_TRUE(EngineDecides(REGROUP_DIRECTIVE_RESTART_IN_PLACE, victim.c_str()));
  Publish();
  EXPECT_TRUE(real.TickUntilSent([](const auto& o) { return IsRestart(o, 0); }));
  char* state = nullptr;
  ASSERT_EQ(regroup_engine_export_job_state(engine_, &state, victim.c_str(), nullptr), REGROUP_OK);
  const json saved = json::parse(state);
  regroup_string_free(state);
  EXPECT_LE(saved["manager"]["epoch"].get<uint64_t>(), epoch) << saved.dump();

  // A restarted manager is granted a higher epoch and replaces the first.
  Manager restarted(JobJson("recover-in-place,dump", victim), port_);
  ASSERT_TRUE(restarted.remote().WaitAvailable(kWait)) << restarted.remote().last_error();
  EXPECT_GT(restarted.remote().epoch(), epoch);
  EXPECT_TRUE(Eventually([&] { return !real.remote().Available(); }));
}

// A restarted scheduler's coordinator never grants an epoch below the one its engine's saved state
// holds, and fences a manager older than it.
// Issue 11, split brain with a coordinator: the older manager learned that it was fenced (its
// stream closed with a refusal naming the newer epoch), kept reattaching in vain, and its job
// control trained on: it committed steps beside the newer one. Now it commits nothing more and
// stops its pods, as an incarnation fenced by the durable record does.
TEST_F(CoordinatorTest, AManagerTheCoordinatorFencedCommitsNothingAndStopsItsPods) {
  Manager five(JobJson("recover-in-place,dump"), port_);
  ASSERT_TRUE(five.remote().WaitAvailable(kWait)) << five.remote().last_error();
  five.StartTraining();
  Manager seven(JobJson("recover-in-place,dump"), port_);
  ASSERT_TRUE(seven.remote().WaitAvailable(kWait)) << seven.remote().last_error();
  const std::string newer = std::to_string(seven.remote().epoch());
  EXPECT_TRUE(five.TickUntilSent([](const auto& o) { return o.message.has_stop(); }))
      << "the fenced manager's pods were never stopped";
  for (const auto& o : five.sent()) {
    if (!o.message.has_stop()) continue;
    EXPECT_NE(o.message.stop().reason().find("fenced: the coordinator serves manager epoch " +
                                             newer),
              std::string::npos)
        << o.message.stop().reason();
  }
  EXPECT_TRUE(five.HasEvent("superseded"));
  EXPECT_EQ(five.job().StatusReport().phase(), "stopped");
  EXPECT_TRUE(five.remote().FencedBy().has_value());
  EXPECT_FALSE(seven.remote().FencedBy().has_value());
}

TEST_F(CoordinatorTest, ARestartedCoordinatorGrantsAboveTheSavedEpochAndFencesOlderManagers) {
  Manager m(JobJson("recover-in-place,dump"), port_);
  ASSERT_TRUE(m.remote().WaitAvailable(kWait)) << m.remote().last_error();
  const uint64_t epoch = m.remote().epoch();
  const int port = port_;
  Stop();
  ASSERT_TRUE(Eventually([&] { return !m.remote().Available(); }));

  // The saved state holds a newer manager's epoch, ahead of this clock by a day.
  json state = EngineState();
  const int64_t newer = Now() + 86400000;
  state["manager"]["epoch"] = newer;
  ImportState(state);

  Start("127.0.0.1:" + std::to_string(port));
  EXPECT_TRUE(Eventually([&] {
    return m.remote().last_error().find("fenced") != std::string::npos;
  })) << m.remote().last_error();
  EXPECT_FALSE(m.remote().Available());
  EXPECT_TRUE(m.remote().FencedBy().has_value())
      << "the refusal names the epoch the saved state holds";

  RawStream s(port_, kCredential);
  ASSERT_TRUE(s.Hello(kJob, 0, "", /*lease_sent_ms=*/7));
  v1::CoordinatorDirective granted = s.Read();
  ASSERT_TRUE(granted.has_directive());
  EXPECT_GT(granted.header().epoch(), static_cast<uint64_t>(newer));
  EXPECT_GT(granted.header().epoch(), epoch);
  // It knows nothing of the leases it granted before its restart: none for a lease after it.
  EXPECT_EQ(granted.lease().sent_ms(), 7);
  EXPECT_EQ(granted.lease().lease_ms(), 0);
  EXPECT_GT(granted.lease().wait_ms(), 0);
  EXPECT_LE(granted.lease().wait_ms(), 11000);
  EXPECT_TRUE(s.Finish().ok());
}

// A manager cut off from the coordinator never hears that a newer one replaced it: the newer
// one gets its epoch at once, and its lease only once the older one's ran out.
TEST_F(CoordinatorTest, ANewerManagerGetsNoLeaseBeforeTheOlderOnesRanOut) {
  Stop();
  Start("127.0.0.1:0", /*lease_ms=*/3000);
  Manager older(JobJson("recover-in-place,dump"), port_);
  ASSERT_TRUE(older.remote().WaitAvailable(kWait)) << older.remote().last_error();
  // A coordinator that just started grants no lease for a lease and a tenth (it may have granted
  // one before a restart): once the older manager holds one, only its lease runs.
  ASSERT_TRUE(Eventually([&] { return older.remote().WhyNoCommit().empty(); }))
      << older.remote().WhyNoCommit();

  RawStream newer(port_, kCredential);
  ASSERT_TRUE(newer.Hello(kJob, 0, "", /*lease_sent_ms=*/5));
  const v1::CoordinatorDirective granted = newer.Read();
  ASSERT_TRUE(granted.has_directive());
  const uint64_t epoch = granted.header().epoch();
  EXPECT_GT(epoch, older.remote().epoch());
  EXPECT_EQ(granted.lease().lease_ms(), 0) << "the older manager's lease runs";
  EXPECT_GT(granted.lease().wait_ms(), 0);
  EXPECT_LE(granted.lease().wait_ms(), 3300);
  ASSERT_TRUE(Eventually([&] { return older.remote().FencedBy().has_value(); }));
  EXPECT_NE(older.remote().WhyNoCommit(), "");

  std::this_thread::sleep_for(std::chrono::milliseconds(granted.lease().wait_ms() + 20));
  v1::ManagerReport ask;
  ask.mutable_lease()->set_sent_ms(6);
  ASSERT_TRUE(newer.Send(ask, kJob, epoch));
  const v1::CoordinatorDirective lease = newer.Read();
  EXPECT_FALSE(lease.has_directive());
  EXPECT_FALSE(lease.has_refusal());
  EXPECT_EQ(lease.lease().sent_ms(), 6);
  EXPECT_EQ(lease.lease().lease_ms(), 3000);
  EXPECT_TRUE(newer.Finish().ok());
}

// Issue 40, finding 12: a scheduler restart paused every job's commits for a lease, though the
// holder of the last lease cannot have a rival. Once states are saved, a new holder's first lease
// waits until a stored state names it; a restarted coordinator leases that holder at once and
// every other epoch only after a lease.
TEST_F(CoordinatorTest, ARestartedCoordinatorLeasesTheHolderOnRecordAtOnceAndNoOtherBeforeALease) {
  Stop();
  Start("127.0.0.1:0", /*lease_ms=*/3000);
  const int port = port_;
  auto export_state = [&](uint64_t& epoch, uint64_t& seq) {
    char* out = nullptr;
    EXPECT_EQ(regroup_coordinator_export_job_state(coordinator_, kJob, &out, &epoch, &seq, nullptr),
              REGROUP_OK);
    json state = json::parse(out ? out : "null");
    regroup_string_free(out);
    return state;
  };
  uint64_t fact_epoch = 0, fact_seq = 0;
  export_state(fact_epoch, fact_seq);
  ASSERT_EQ(regroup_coordinator_state_saved(coordinator_, kJob, fact_epoch, fact_seq, nullptr),
            REGROUP_OK);  // states are saved from now on

  RawStream first(port_, kCredential);
  ASSERT_TRUE(first.Hello(kJob, 0, "", /*lease_sent_ms=*/1));
  const v1::CoordinatorDirective attached = first.Read();
  ASSERT_TRUE(attached.has_directive());
  const uint64_t epoch = attached.header().epoch();
  EXPECT_EQ(attached.lease().lease_ms(), 0) << "a lease granted before the start may still run";
  std::this_thread::sleep_for(std::chrono::milliseconds(attached.lease().wait_ms() + 20));
  v1::ManagerReport ask;
  ask.mutable_lease()->set_sent_ms(2);
  ASSERT_TRUE(first.Send(ask, kJob, epoch));
  v1::CoordinatorDirective answer = first.Read();
  EXPECT_EQ(answer.lease().lease_ms(), 0) << "no stored state names this epoch the holder yet";
  EXPECT_GT(answer.lease().wait_ms(), 0);
  EXPECT_EQ(regroup_coordinator_save_wanted(coordinator_, kJob), 1);

  const json stored = export_state(fact_epoch, fact_seq);
  EXPECT_EQ(stored.value("lease_holder", uint64_t{0}), epoch);
  ASSERT_EQ(regroup_coordinator_state_saved(coordinator_, kJob, fact_epoch, fact_seq, nullptr),
            REGROUP_OK);
  EXPECT_EQ(regroup_coordinator_save_wanted(coordinator_, kJob), 0);
  ask.mutable_lease()->set_sent_ms(3);
  ASSERT_TRUE(first.Send(ask, kJob, epoch));
  answer = first.Read();
  EXPECT_EQ(answer.lease().lease_ms(), 3000) << "a stored state names it";

  // The scheduler restarts and imports the stored state.
  Stop();
  EXPECT_FALSE(first.Finish().ok());
  ImportState(stored);
  Start("127.0.0.1:" + std::to_string(port), /*lease_ms=*/3000);

  RawStream again(port_, kCredential);
  ASSERT_TRUE(again.Hello(kJob, epoch, attached.epoch_ticket(), /*lease_sent_ms=*/4));
  const v1::CoordinatorDirective reattached = again.Read();
  ASSERT_TRUE(reattached.has_directive());
  EXPECT_EQ(reattached.header().epoch(), epoch);
  EXPECT_EQ(reattached.lease().lease_ms(), 3000) << "the holder on record is leased at once";

  // A newer manager waits for the holder's lease, as before the restart, and any epoch but the
  // one on record waits a lease from the restart.
  RawStream newer(port_, kCredential);
  ASSERT_TRUE(newer.Hello(kJob, 0, "", /*lease_sent_ms=*/5));
  const v1::CoordinatorDirective granted = newer.Read();
  ASSERT_TRUE(granted.has_directive());
  EXPECT_GT(granted.header().epoch(), epoch);
  EXPECT_EQ(granted.lease().lease_ms(), 0);
  EXPECT_GT(granted.lease().wait_ms(), 0);
  EXPECT_LE(granted.lease().wait_ms(), 3300);
  EXPECT_TRUE(newer.Finish().ok());
  EXPECT_FALSE(again.Finish().ok()) << "the newer manager replaced it";
}

// The stored holder fences: a manager older than the holder a restored state names is refused,
// even when the holder reported no progress.
TEST_F(CoordinatorTest, ARestoredLeaseHolderFencesOlderManagers) {
  Manager m(JobJson("recover-in-place,dump"), port_);
  ASSERT_TRUE(m.remote().WaitAvailable(kWait)) << m.remote().last_error();
  const int port = port_;
  Stop();
  ASSERT_TRUE(Eventually([&] { return !m.remote().Available(); }));
  json state = EngineState();
  state["lease_holder"] = m.remote().epoch() + 1;
  ImportState(state);
  Start("127.0.0.1:" + std::to_string(port));
  EXPECT_TRUE(Eventually([&] { return m.remote().FencedBy().has_value(); }))
      << m.remote().last_error();
}

// Mutual TLS (issue 40): a coordinator given a client CA attaches only the managers that present
// a certificate that CA signed (the manager's --coordinator-tls-cert/--coordinator-tls-key, from
// the same cert-manager Secret layout); a manager without one, or with another CA's, is refused
// at the handshake, and its error names the TLS handshake failure.
TEST_F(CoordinatorTest, WithAClientCaOnlyManagersWithACertificateItSignedAttach) {
  const regroup::testing::Certificates certs;
  ASSERT_TRUE(certs.ok()) << "openssl failed: see " << certs.Path("openssl.log");
  Stop();
  const Tls tls{certs.Path("ip.crt"), certs.Path("ip.key"), certs.Path("ca.crt")};
  Start("127.0.0.1:0", 0, &tls);
  const std::string target = "127.0.0.1:" + std::to_string(port_);
  // A manager's link to the coordinator, as regroup-manager makes it, presenting `client`
  // (.crt and .key of the run) when given.
  auto link = [&](const std::string& client) {
    regroup::ClientTls client_tls{certs.Path("ca.crt"), ""};
    if (!client.empty()) {
      client_tls.cert_file = certs.Path(client + ".crt");
      client_tls.key_file = certs.Path(client + ".key");
    }
    rt::RemoteDecisionsOptions o;
    o.target = target;
    o.channel = regroup::MakeChannel(target, client_tls).value();
    o.tls = true;
    o.credential = kCredential;
    o.job_id = kJob;
    return std::make_unique<rt::RemoteDecisions>(o);
  };
  for (const char* refused : {"", "stranger"}) {
    auto remote = link(refused);
    EXPECT_TRUE(Eventually([&] { return !remote->last_error().empty(); }));
    EXPECT_FALSE(remote->Available()) << (*refused ? refused : "no certificate");
    EXPECT_EQ(remote->epoch(), 0u);
    const std::string said = remote->last_error();
    EXPECT_NE(said.find("the TLS handshake with " + target + " failed: "), std::string::npos)
        << (*refused ? refused : "no certificate") << ": " << said;
  }
  auto served = link("named");  // its name does not matter: the coordinator checks the signer
  ASSERT_TRUE(served->WaitAvailable(kWait)) << served->last_error();
  EXPECT_GT(served->epoch(), 0u);
}

TEST_F(CoordinatorTest, StartRefusesBadArguments) {
  regroup_coordinator* c = reinterpret_cast<regroup_coordinator*>(this);
  regroup_error* err = nullptr;
  EXPECT_EQ(regroup_coordinator_start(&c, nullptr, nullptr, &err), REGROUP_INVALID_ARGUMENT);
  EXPECT_EQ(c, nullptr);
  regroup_error_free(err);
  EXPECT_EQ(regroup_coordinator_start(nullptr, engine_, nullptr, nullptr),
            REGROUP_INVALID_ARGUMENT);

  regroup_coordinator_options o = REGROUP_COORDINATOR_OPTIONS_INIT;
  o.version = 99;
  EXPECT_EQ(regroup_coordinator_start(&c, engine_, &o, &err), REGROUP_VERSION_MISMATCH);
  regroup_error_free(err);

  // A lease out of range: refused, naming it.
  for (int64_t lease : {int64_t{-1}, int64_t{600001}}) {
    o = REGROUP_COORDINATOR_OPTIONS_INIT;
    o.listen = "127.0.0.1:0";
    o.credential = kClusterKey;
    o.lease_ms = lease;
    EXPECT_EQ(regroup_coordinator_start(&c, engine_, &o, &err), REGROUP_INVALID_ARGUMENT);
    EXPECT_NE(Message(err).find("the managers' lease of " + std::to_string(lease) +
                                " ms is out of range"),
              std::string::npos);
    err = nullptr;
  }

  // No credential and no explicit insecure mode: refused before anything listens.
  o = REGROUP_COORDINATOR_OPTIONS_INIT;
  o.listen = "127.0.0.1:0";
  EXPECT_EQ(regroup_coordinator_start(&c, engine_, &o, &err), REGROUP_INVALID_ARGUMENT);
  EXPECT_NE(Message(err).find("the coordinator has no credential"), std::string::npos);
  err = nullptr;

  o = REGROUP_COORDINATOR_OPTIONS_INIT;
  o.credential = kClusterKey;
  const std::string taken = "127.0.0.1:" + std::to_string(port_);
  o.listen = taken.c_str();
  EXPECT_EQ(regroup_coordinator_start(&c, engine_, &o, &err), REGROUP_INVALID_ARGUMENT);
  EXPECT_NE(Message(err).find(taken), std::string::npos);
  err = nullptr;

  o = REGROUP_COORDINATOR_OPTIONS_INIT;
  o.credential = kClusterKey;
  o.listen = "127.0.0.1:0";
  o.tls_cert_file = "/nonexistent/cert.pem";
  EXPECT_EQ(regroup_coordinator_start(&c, engine_, &o, &err), REGROUP_INVALID_ARGUMENT);
  EXPECT_NE(Message(err).find("TLS"), std::string::npos) << "a certificate without its key";
  err = nullptr;
  o.tls_key_file = "/nonexistent/key.pem";
  EXPECT_EQ(regroup_coordinator_start(&c, engine_, &o, &err), REGROUP_INVALID_ARGUMENT);
  EXPECT_NE(Message(err).find("/nonexistent/cert.pem"), std::string::npos);
  err = nullptr;

  // A client CA without the coordinator's own certificate and key: refused, naming the option
  // (a plaintext server would check no manager).
  o.tls_cert_file = nullptr;
  o.tls_key_file = nullptr;
  o.tls_client_ca_file = "/nonexistent/ca.pem";
  EXPECT_EQ(regroup_coordinator_start(&c, engine_, &o, &err), REGROUP_INVALID_ARGUMENT);
  EXPECT_NE(Message(err).find("tls_client_ca_file /nonexistent/ca.pem) needs its own certificate "
                              "and key"),
            std::string::npos);
  err = nullptr;
  // ... but a version 3 struct has no such field: the library never reads it.
  o.version = 3;
  EXPECT_EQ(regroup_coordinator_start(&c, engine_, &o, &err), REGROUP_OK) << Message(err);
  regroup_coordinator_free(c);

  EXPECT_EQ(regroup_coordinator_publish(nullptr, nullptr), REGROUP_INVALID_ARGUMENT);
  EXPECT_EQ(regroup_coordinator_port(nullptr), 0);
  regroup_coordinator_free(nullptr);
}

}  // namespace
