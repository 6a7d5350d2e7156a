// SPDX-License-Identifier: Apache-2.0
// The manager's gRPC service in process, with real streams: credentials, deadlines, sizes, a
// broken stream, status.
#include "manager/service.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <cstdio>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include "common/credential.h"
#include "common/grpc_settings.h"
#include "common/queued_stream.h"
#include "common/random_message.h"

namespace regroup::manager {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<ManagerServer> MakeManager(int64_t pods, const std::string& credential,
                                           const std::string& id, const std::string& http,
                                           bool metrics_open) {
  JobSpec spec;
  spec.id = id;
  spec.pods = pods;
  spec.processes_per_pod = 1;
  spec.labels = {{"fault-scheduling", "force"}};
  spec.annotations = {{"recover-strategy", "elastic-training"},
                      {"regroup.io/prefer-elastic", "true"}};
  auto resolved = spec.Resolve();
  JobControlOptions ro;
  ro.epoch = 5;
  ro.join_window_ms = 60000;
  auto job = std::make_unique<JobControl>(spec, resolved.config, ro,
                                              std::make_unique<EmbeddedDecisions>(spec));
  ServerOptions so;
  so.listen = "127.0.0.1:0";
  so.http_listen = http;
  so.metrics_open = metrics_open;
  so.credential = credential;
  so.tick = 5ms;
  return std::make_unique<ManagerServer>(std::move(job), so);
}

std::unique_ptr<ManagerServer> StartManager(int64_t pods, const std::string& credential,
                                            const std::string& id = "default/svc") {
  auto server = MakeManager(pods, credential, id, "127.0.0.1:0", false);
  Status st = server->Start();
  EXPECT_TRUE(st.ok()) << st.message();
  return server;
}

// A simulated agent on a real stream.
struct Agent {
  Agent(int port, const std::string& credential, int node) : node(node) {
    channel = MakeChannel("127.0.0.1:" + std::to_string(port)).value();
    stub = v1::Manager::NewStub(channel);
    AttachCredential(context, credential);
    stream = stub->Session(&context);
  }
  bool Register(const std::string& uid) {
    this->uid = uid;
    v1::AgentMessage m;
    m.mutable_header()->set_job_id("default/svc");
    m.mutable_header()->set_sender(uid);
    m.mutable_register_()->set_pod_uid(uid);
    m.mutable_register_()->set_node_rank(node);
    m.mutable_register_()->set_nproc(1);
    m.mutable_register_()->set_host("127.0.0.1");
    m.mutable_register_()->set_free_port(40000 + static_cast<uint32_t>(node));
    auto* rank = m.mutable_register_()->add_ranks();  // its trainer said hello
    rank->set_alive(true);
    rank->set_phase(v1::PHASE_PAUSED);
    return stream->Write(m);
  }
  // A heartbeat of manager epoch 5 (StartManager's): the pod is alive.
  bool Beat() {
    v1::AgentMessage m;
    m.mutable_header()->set_job_id("default/svc");
    m.mutable_header()->set_sender(uid);
    m.mutable_header()->set_epoch(5);
    auto* rank = m.mutable_heartbeat()->add_ranks();
    rank->set_alive(true);
    rank->set_phase(v1::PHASE_PAUSED);
    return stream->Write(m);
  }
  // Reads until a message with `body` arrives (or the stream ends).
  std::optional<v1::ManagerMessage> ReadUntil(v1::ManagerMessage::BodyCase body) {
    v1::ManagerMessage m;
    while (stream->Read(&m))
      if (m.body_case() == body) return m;
    return std::nullopt;
  }
  int node;
  std::string uid;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Manager::Stub> stub;
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<v1::AgentMessage, v1::ManagerMessage>> stream;
};

TEST(ManagerService, AgentsRegisterAndReceiveTheirGeneration) {
  auto server = StartManager(3, "secret");
  std::vector<std::unique_ptr<Agent>> agents;
  for (int n = 0; n < 3; ++n) {
    agents.push_back(std::make_unique<Agent>(server->port(), "secret", n));
    ASSERT_TRUE(agents.back()->Register("pod-" + std::to_string(n)));
  }
  for (auto& a : agents) {
    auto welcome = a->ReadUntil(v1::ManagerMessage::kWelcome);
    ASSERT_TRUE(welcome);
    EXPECT_EQ(welcome->welcome().epoch(), 5u);
    auto start = a->ReadUntil(v1::ManagerMessage::kStart);
    ASSERT_TRUE(start);
    EXPECT_EQ(start->start().plan().world_size(), 3u);
    EXPECT_EQ(start->start().plan().ranks(0).rank(), static_cast<uint32_t>(a->node));
  }
  // A node's stream breaks and is not resumed within the liveness timeout while the others
  // keep heartbeating: they are aborted and scale in.
  std::atomic<bool> beating{true};
  std::thread beats([&] {
    while (beating) {
      agents[0]->Beat();
      agents[1]->Beat();
      std::this_thread::sleep_for(50ms);
    }
  });
  agents[2]->context.TryCancel();
  auto abort = agents[0]->ReadUntil(v1::ManagerMessage::kAbort);
  ASSERT_TRUE(abort);
  EXPECT_NE(abort->abort().reason().find("pod_lost"), std::string::npos) << abort->abort().reason();
  auto next = agents[0]->ReadUntil(v1::ManagerMessage::kStart);
  ASSERT_TRUE(next);
  EXPECT_EQ(next->start().plan().world_size(), 2u);
  beating = false;
  beats.join();
  for (auto& a : agents) a->context.TryCancel();
  server->Stop();
}

// The manager exits once the job stopped and every pod left (main.cc): the job stopping is not
// enough while an agent still has its stream open.
TEST(ManagerService, DoneAndAloneOnceTheJobStoppedAndEveryStreamEnded) {
  auto server = StartManager(1, "secret");
  Agent agent(server->port(), "secret", 0);
  ASSERT_TRUE(agent.Register("pod-0"));
  auto start = agent.ReadUntil(v1::ManagerMessage::kStart);
  ASSERT_TRUE(start);
  EXPECT_FALSE(server->DoneAndAlone()) << "training";
  v1::AgentMessage exit;  // its one rank finished training
  exit.mutable_header()->set_job_id("default/svc");
  exit.mutable_header()->set_sender("pod-0");
  exit.mutable_header()->set_epoch(5);
  exit.mutable_header()->set_generation(start->header().generation());
  exit.mutable_process_exit()->set_local_rank(0);
  exit.mutable_process_exit()->set_exit_code(0);
  ASSERT_TRUE(agent.stream->Write(exit));
  auto stop = agent.ReadUntil(v1::ManagerMessage::kStop);
  ASSERT_TRUE(stop);
  EXPECT_FALSE(server->DoneAndAlone()) << "the job stopped, but its pod is still connected";
  agent.stream->WritesDone();
  v1::ManagerMessage rest;
  while (agent.stream->Read(&rest)) {
  }
  (void)agent.stream->Finish();
  bool done = false;
  for (int i = 0; i < 500 && !done; ++i, std::this_thread::sleep_for(10ms))
    done = server->DoneAndAlone();
  EXPECT_TRUE(done) << "the job stopped and its only pod left";
}

TEST(ManagerService, AWrongCredentialIsRefused) {
  auto server = StartManager(1, "secret");
  Agent a(server->port(), "guess", 0);
  a.Register("pod-0");
  v1::ManagerMessage m;
  EXPECT_FALSE(a.stream->Read(&m));
  grpc::Status st = a.stream->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(st.error_message().find("a wrong credential"), std::string::npos);
  server->Stop();
}

TEST(ManagerService, ARefusedRegistrationCarriesTheCurrentEpoch) {
  auto server = StartManager(1, "");
  Agent a(server->port(), "", 4);  // node rank 4 of a 1-pod job
  a.Register("pod-x");
  auto refusal = a.ReadUntil(v1::ManagerMessage::kRefusal);
  ASSERT_TRUE(refusal);
  EXPECT_EQ(refusal->refusal().epoch(), 5u);
  EXPECT_EQ(refusal->header().epoch(), 5u) << "agents drop messages of older epochs";
  EXPECT_FALSE(refusal->refusal().fenced());
  EXPECT_EQ(refusal->refusal().reason(), "node rank 4 is out of range: job default/svc has 1 pods");
  EXPECT_EQ(a.stream->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  server->Stop();
}

TEST(ManagerService, OversizedMessageIsRefused) {
  auto server = StartManager(1, "");
  Agent a(server->port(), "", 0);
  v1::AgentMessage m;
  m.mutable_register_()->set_pod_uid(std::string(kMaxMessageBytes + 10, 'x'));
  a.stream->Write(m);
  v1::ManagerMessage out;
  EXPECT_FALSE(a.stream->Read(&out));
  EXPECT_EQ(a.stream->Finish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  server->Stop();
}

TEST(ManagerService, GetStatusNeedsADeadline) {
  auto server = StartManager(1, "secret");
  auto stub = v1::Manager::NewStub(MakeChannel("127.0.0.1:" + std::to_string(server->port())).value());
  v1::GetStatusRequest req;
  v1::GetStatusResponse res;
  {
    grpc::ClientContext ctx;
    AttachCredential(ctx, "secret");
    grpc::Status st = stub->GetStatus(&ctx, req, &res);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(st.error_message(),
              "GetStatus needs a deadline: every unary call to the manager must set one");
  }
  {
    grpc::ClientContext ctx;
    AttachCredential(ctx, "secret");
    ctx.set_deadline(std::chrono::system_clock::now() + 5s);
    grpc::Status st = stub->GetStatus(&ctx, req, &res);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(res.job_id(), "default/svc");
    EXPECT_EQ(res.phase(), "joining");
  }
  EXPECT_NE(server->MetricsText().find("regroup_generation{regroup_job=\"default/svc\"} 0"),
            std::string::npos);
  EXPECT_NE(server->StatusJson().find("\"job_id\": \"default/svc\""), std::string::npos);
  server->Stop();
}

// Issue 12, "fuzzing": agents that hold the job's credential but send anything. 400 streams from
// four threads (a fixed seed each), each up to 12 random messages (every body kind, any field,
// half of them with this job's header; a third of the streams open with a good registration),
// then it ends its writes, or is cancelled, or its deadline passes. The server answers every call
// with a status, its /status and GetStatus keep answering, bounded, and it stops cleanly. (The
// ASan stage runs this too.)
TEST(ManagerService, HostileAuthenticatedAgentsNeverBreakTheServer) {
  const ProtobufQuiet quiet;  // (its complaints about the messages' bad UTF-8)
  auto server = StartManager(3, "secret");
  const std::string addr = "127.0.0.1:" + std::to_string(server->port());
  std::atomic<int> calls{0}, refused{0}, welcomed{0};
  auto hostile = [&](uint64_t seed) {
    RandomMessages random(seed);
    auto stub = v1::Manager::NewStub(MakeChannel(addr).value());
    for (int i = 0; i < 100; ++i) {
      grpc::ClientContext ctx;
      AttachCredential(ctx, "secret");
      ctx.set_deadline(std::chrono::system_clock::now() + 300ms);
      auto stream = stub->Session(&ctx);
      // Mostly a new pod (a replacement), now and then one of four that came before (its own
      // stream again, or a zombie once it was declared lost).
      const std::string uid = random.OneIn(4) ? "pod-" + std::to_string(random.Below(4))
                                              : "pod-" + std::to_string(seed) + "-" + std::to_string(i);
      const bool registers = random.OneIn(3);
      for (uint64_t n = 0, count = random.Below(13); n < count; ++n) {
        auto m = random.Make<v1::AgentMessage>();
        if (random.OneIn(2)) {
          m.mutable_header()->set_job_id("default/svc");
          m.mutable_header()->set_sender(uid);
          m.mutable_header()->set_epoch(random.OneIn(4) ? random.Int<uint64_t>() : 5);
        }
        if (n == 0 && registers) {  // a good registration first: the rest reaches the job control
          m.Clear();
          m.mutable_header()->set_job_id("default/svc");
          m.mutable_header()->set_sender(uid);
          m.mutable_register_()->set_pod_uid(uid);
          m.mutable_register_()->set_node_rank(static_cast<int32_t>(random.Below(3)));
          m.mutable_register_()->set_nproc(1);
          m.mutable_register_()->set_host("127.0.0.1");
        }
        if (!stream->Write(m)) break;
      }
      if (random.OneIn(4)) {
        ctx.TryCancel();
      } else if (random.OneIn(2)) {
        stream->WritesDone();
      }
      v1::ManagerMessage reply;
      while (stream->Read(&reply))
        if (reply.has_welcome()) ++welcomed;
      const grpc::Status st = stream->Finish();  // every call ends, with a status
      ++calls;
      if (!st.ok()) ++refused;
    }
  };
  std::vector<std::thread> threads;
  for (uint64_t seed = 1; seed <= 4; ++seed) threads.emplace_back(hostile, HostileSeedBase() + seed);
  for (auto& t : threads) t.join();
  std::printf("%d calls: %d welcomed into the job, %d ended with an error status\n", calls.load(),
              welcomed.load(), refused.load());
  EXPECT_EQ(calls.load(), 400);
  EXPECT_GT(refused.load(), 0) << "some of it is refused";
  EXPECT_GT(welcomed.load(), 0) << "some of it gets past registration, into the job control";

  auto stub = v1::Manager::NewStub(MakeChannel(addr).value());
  grpc::ClientContext ctx;
  AttachCredential(ctx, "secret");
  ctx.set_deadline(std::chrono::system_clock::now() + 5s);
  v1::GetStatusRequest req;
  v1::GetStatusResponse res;
  const grpc::Status st = stub->GetStatus(&ctx, req, &res);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(res.job_id(), "default/svc");
  httplib::Client http("127.0.0.1", server->http_port());
  http.set_read_timeout(5, 0);
  auto got = http.Get("/status", {{"Authorization", "Bearer secret"}});
  ASSERT_TRUE(got);
  EXPECT_EQ(got->status, 200);
  EXPECT_LT(got->body.size(), size_t{2} << 20) << "/status stays bounded";
  server->Stop();
}

// httplib ignores a stop() that comes before its listening loop runs: the server's Stop right
// after Start once hung in joining the HTTP thread (about 1 run in 150 under load). Each Stop runs
// on a thread of its own and must return within kStopBound; one that does not fails the test
// instead of hanging it (the thread is left behind, holding the server it is stuck in).
TEST(ManagerService, StopRightAfterStartNeverHangs) {
  constexpr auto kStopBound = 10s;
  for (int i = 0; i < 50; ++i) {
    std::shared_ptr<ManagerServer> server = StartManager(1, "secret");
    auto stopped = std::make_shared<std::promise<void>>();
    std::future<void> done = stopped->get_future();
    std::thread stopper([server, stopped] {
      server->Stop();
      stopped->set_value();
    });
    if (done.wait_for(kStopBound) != std::future_status::ready) {
      stopper.detach();
      FAIL() << "Stop right after Start did not return within 10 s (start and stop " << i + 1
             << " of 50)";
    }
    stopper.join();
  }
}

// Before: the job id went into the labels as it was (a quote and a newline injected a metric
// line), and gauges printed 6 significant digits (an epoch of 1.7e12 came out as 1.7961e+12).
TEST(ManagerService, MetricsEscapeTheJobIdAndPrintIntegersWhole) {
  auto server = StartManager(1, "secret", "ns/a\"} 1\nregroup_injected{x=\"");
  const std::string text = server->MetricsText();
  EXPECT_EQ(text.find("\nregroup_injected"), std::string::npos) << text;
  EXPECT_NE(text.find("regroup_epoch{regroup_job=\"ns/a\\\"} 1\\nregroup_injected{x=\\\"\"} 5\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("e+"), std::string::npos) << text;
}

// Issue 12: /status (pod uids, node names, events) and /metrics answered anyone who reached the
// port. Off loopback, each needs the job's credential; /metrics only when the operator opened it.
TEST(ManagerService, OffLoopbackTheHttpEndpointsNeedTheCredential) {
  auto get = [](int port, const std::string& path, const std::string& token) {
    httplib::Client client("127.0.0.1", port);
    client.set_connection_timeout(5);
    httplib::Headers headers;
    if (!token.empty()) headers.emplace("Authorization", "Bearer " + token);
    auto res = client.Get(path, headers);
    return res ? res->status : -1;
  };
  auto server = MakeManager(1, "secret", "default/svc", "0.0.0.0:0", false);
  ASSERT_TRUE(server->Start().ok());
  const int port = server->http_port();
  EXPECT_EQ(get(port, "/status", ""), 401);
  EXPECT_EQ(get(port, "/status", "guess"), 401);
  EXPECT_EQ(get(port, "/status", "secretx"), 401);
  EXPECT_EQ(get(port, "/status", "secret"), 200);
  EXPECT_EQ(get(port, "/metrics", ""), 401);
  EXPECT_EQ(get(port, "/metrics", "secret"), 200);
  server->Stop();

  auto open = MakeManager(1, "secret", "default/svc", "0.0.0.0:0", /*metrics_open=*/true);
  ASSERT_TRUE(open->Start().ok());
  EXPECT_EQ(get(open->http_port(), "/metrics", ""), 200);
  EXPECT_EQ(get(open->http_port(), "/status", ""), 401) << "only /metrics was opened";
  open->Stop();

  auto local = StartManager(1, "secret");  // HTTP on 127.0.0.1: nothing leaves the host
  EXPECT_EQ(get(local->http_port(), "/status", ""), 200);
}

TEST(ManagerService, WithoutACredentialHttpIsServedOnLoopbackOnly) {
  auto server = MakeManager(1, "", "default/svc", "0.0.0.0:0", false);
  const Status st = server->Start();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("0.0.0.0:0"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("loopback"), std::string::npos) << st.message();
}

// Issue 12: a peer that stops reading let the server queue messages for it without bound. Here
// a server answers each message with 32 KiB (8 messages of 4 KiB), and may queue 64 KiB for a
// stream: a client that keeps reading is served for good, one that stops is cut off, with a
// reason, instead of growing the server.
class Flood final : public v1::Manager::CallbackService {
 public:
  using Stream = QueuedStream<v1::AgentMessage, v1::ManagerMessage, Flood>;
  grpc::ServerBidiReactor<v1::AgentMessage, v1::ManagerMessage>* Session(
      grpc::CallbackServerContext* context) override {
    return new Stream(this, 1, "gone", context, /*max_queued_bytes=*/64 << 10);
  }
  void OnMessage(Stream* stream, const v1::AgentMessage&) {
    v1::ManagerMessage m;
    m.mutable_refusal()->set_reason(std::string(4096, 'x'));
    for (int i = 0; i < 8; ++i) stream->Send(m);
  }
  void OnStreamDone(Stream* stream) {
    std::lock_guard lock(mu);
    cut_off = stream->cut_off();
    done = true;
    cv.notify_all();
  }
  bool WaitDone() {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, 30s, [&] { return done; });
  }
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::string cut_off;
};

struct FloodServer {
  FloodServer() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    stub = v1::Manager::NewStub(MakeChannel("127.0.0.1:" + std::to_string(port)).value());
  }
  ~FloodServer() { server->Shutdown(std::chrono::system_clock::now() + 2s); }
  Flood service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<v1::Manager::Stub> stub;
};

TEST(QueuedStream, APeerThatKeepsReadingIsNeverCutOff) {
  FloodServer f;
  grpc::ClientContext context;
  auto stream = f.stub->Session(&context);
  v1::ManagerMessage m;
  for (int round = 0; round < 400; ++round) {  // 12.5 MiB in all, 32 KiB at a time
    ASSERT_TRUE(stream->Write(v1::AgentMessage()));
    for (int i = 0; i < 8; ++i) ASSERT_TRUE(stream->Read(&m)) << "round " << round;
  }
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  ASSERT_TRUE(f.service.WaitDone());
  EXPECT_EQ(f.service.cut_off, "");
}

TEST(QueuedStream, APeerThatStopsReadingIsCutOffAtTheBoundWithAReason) {
  FloodServer f;
  grpc::ClientContext context;
  auto stream = f.stub->Session(&context);
  for (int round = 0; round < 400 && !f.service.done; ++round)
    if (!stream->Write(v1::AgentMessage())) break;  // and never reads
  ASSERT_TRUE(f.service.WaitDone()) << "the stream was never cut off";
  EXPECT_NE(f.service.cut_off.find("reads too slowly"), std::string::npos) << f.service.cut_off;
  EXPECT_NE(f.service.cut_off.find("65536"), std::string::npos) << f.service.cut_off;
  context.TryCancel();  // a synchronous Finish would wait for the unread messages to be read
  EXPECT_FALSE(stream->Finish().ok());
}

}  // namespace
}  // namespace regroup::manager
