// SPDX-License-Identifier: Apache-2.0
// The manager's HTTP endpoints against clients that hold no credential and mean harm (issue 40,
// finding 3): a flood of headers, and connections that trickle.
#include "manager/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <optional>
#include <utility>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "common/credential.h"
#include "common/grpc_settings.h"
#include "manager/engine_decisions_test.h"
#include "manager/service.h"

namespace regroup::manager {
namespace {

using namespace std::chrono_literals;

// The embedded engine, whose Tick waits while `hold` is set (a wedged job control: its tick loop
// holds the manager's lock).
class HeldDecisions final : public EngineDecisions {
 public:
  HeldDecisions(const JobSpec& spec, std::atomic<bool>& hold)
      : EngineDecisions(spec), hold_(hold) {}
  void Tick(int64_t now) override {
    while (hold_) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EngineDecisions::Tick(now);
  }

 private:
  std::atomic<bool>& hold_;
};

std::atomic<bool> g_no_hold{false};

std::unique_ptr<ManagerServer> StartWithHttp(const std::string& http = "127.0.0.1:0",
                                             std::atomic<bool>& hold = g_no_hold) {
  JobSpec spec;
  spec.id = "default/http";
  spec.pods = 1;
  spec.processes_per_pod = 1;
  auto resolved = spec.Resolve();
  JobControlOptions ro;
  ro.epoch = 5;
  auto job = std::make_unique<JobControl>(spec, resolved.config, ro,
                                          std::make_unique<HeldDecisions>(spec, hold));
  ServerOptions so;
  so.listen = "127.0.0.1:0";
  so.http_listen = http;
  so.credential = "secret";
  auto server = std::make_unique<ManagerServer>(std::move(job), so);
  Status st = server->Start();
  EXPECT_TRUE(st.ok()) << st.message();
  return server;
}

// This process's resident memory, in bytes.
int64_t Resident() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

// A TCP connection to 127.0.0.1:port whose every read and write gives up after `timeout`.
int Connect(int port, std::chrono::seconds timeout = 30s) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv{static_cast<time_t>(timeout.count()), 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

int StatusCode(int port) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(10s);
  client.set_read_timeout(20s);
  auto res = client.Get("/status");
  return res ? res->status : -1;
}

// 3,000,000 small headers (33 MB) took the manager to 470 MB, never given back: cpp-httplib
// keeps every header of a request. Here 1,000,000 (6 MB) grew it by well over 100 MB.
TEST(ManagerHttp, AFloodOfHeadersNeverGrowsTheManager) {
  auto server = StartWithHttp();
  ASSERT_EQ(StatusCode(server->http_port()), 200);
  const int64_t before = Resident();
  const int fd = Connect(server->http_port());
  ASSERT_GE(fd, 0);
  std::string chunk = "GET /status HTTP/1.1\r\nHost: m\r\n";
  std::string headers;
  for (int i = 0; i < 10000; ++i) headers += "X: y\r\n";
  size_t sent = 0;
  for (int round = 0; round < 100; ++round) {  // 1,000,000 headers
    const std::string& what = round == 0 ? chunk + headers : headers;
    const ssize_t n = ::send(fd, what.data(), what.size(), MSG_NOSIGNAL);
    if (n <= 0) break;  // the server closed the connection: what this test wants
    sent += static_cast<size_t>(n);
  }
  ::send(fd, "\r\n", 2, MSG_NOSIGNAL);
  char buffer[4096];
  while (::recv(fd, buffer, sizeof(buffer), 0) > 0) {
  }
  ::close(fd);
  EXPECT_EQ(StatusCode(server->http_port()), 200) << "the endpoint still serves";
  const int64_t grown = Resident() - before;
  EXPECT_LT(grown, 32 << 20) << "the manager grew by " << grown << " bytes for " << sent
                             << " bytes of headers";
  server->Stop();
}

// Eight connections that sent a byte every few seconds held cpp-httplib's eight threads, and
// /status and /metrics waited for as long as they trickled. Here 16 trickle (and reconnect when
// they are closed): another client's /status is still answered, and the tricklers are closed.
TEST(ManagerHttp, TricklingClientsNeverBlockAnotherClientsStatus) {
  auto server = StartWithHttp();
  const int port = server->http_port();
  std::atomic<bool> stop{false};
  std::atomic<int> connected{0}, closed_by_server{0};
  std::vector<std::thread> tricklers;
  for (int i = 0; i < 16; ++i) {
    tricklers.emplace_back([&] {
      bool counted = false;
      while (!stop) {
        const int fd = Connect(port, 1s);
        if (fd < 0) {
          std::this_thread::sleep_for(100ms);
          continue;
        }
        if (!counted) {
          counted = true;
          ++connected;
        }
        const std::string head = "GET /status HTTP/1.1\r\nX-Slow: ";
        bool open = ::send(fd, head.data(), head.size(), MSG_NOSIGNAL) > 0;
        while (open && !stop) {
          std::this_thread::sleep_for(100ms);
          open = ::send(fd, "a", 1, MSG_NOSIGNAL) > 0;
          char byte;
          const ssize_t got = ::recv(fd, &byte, 1, MSG_DONTWAIT);
          if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) open = false;
        }
        if (!open) ++closed_by_server;
        ::close(fd);
      }
    });
  }
  for (int i = 0; i < 300 && connected < 16; ++i) std::this_thread::sleep_for(100ms);
  std::this_thread::sleep_for(500ms);  // every trickler has sent something and holds its slot
  EXPECT_EQ(StatusCode(port), 200) << "/status was blocked by trickling connections";
  for (int i = 0; i < 300 && closed_by_server == 0; ++i) std::this_thread::sleep_for(100ms);
  EXPECT_GT(closed_by_server.load(), 0) << "no trickling connection was ever closed by the server";
  stop = true;
  for (auto& t : tricklers) t.join();
  server->Stop();
}

// A GET of `path` without a credential: the status and the body (-1 and "" when no answer).
std::pair<int, std::string> Probe(int port, const std::string& path) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(10s);
  client.set_read_timeout(20s);
  auto res = client.Get(path);
  if (!res) return {-1, ""};
  return {res->status, res->body};
}

// Kubelet's probes carry no token: off loopback /healthz and /readyz answer without one (and say
// nothing of the job), while /status still needs it. /readyz turns 503 while the job control is
// wedged (its tick loop holds the lock), without waiting for that lock; /healthz stays 200.
TEST(ManagerHttp, HealthAndReadinessAreOpenAndReadinessFollowsTheTickLoop) {
  std::atomic<bool> hold{false};
  auto server = StartWithHttp("0.0.0.0:0", hold);
  const int port = server->http_port();
  EXPECT_EQ(StatusCode(port), 401) << "/status needs the credential off loopback";
  EXPECT_EQ(Probe(port, "/healthz"), std::make_pair(200, std::string("ok\n")));
  std::pair<int, std::string> ready;
  for (int i = 0; i < 100 && ready.first != 200; ++i, std::this_thread::sleep_for(20ms))
    ready = Probe(port, "/readyz");
  EXPECT_EQ(ready, std::make_pair(200, std::string("ok\n")));
  hold = true;  // the next tick waits
  const auto deadline =
      std::chrono::steady_clock::now() + ManagerServer::kReadyTickBound + 10s;
  while (ready.first == 200 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(100ms);
    ready = Probe(port, "/readyz");
  }
  EXPECT_EQ(ready.first, 503);
  EXPECT_NE(ready.second.find("the tick loop last ran"), std::string::npos) << ready.second;
  EXPECT_EQ(Probe(port, "/healthz").first, 200) << "the process still serves";
  hold = false;
  for (int i = 0; i < 100 && ready.first != 200; ++i, std::this_thread::sleep_for(20ms))
    ready = Probe(port, "/readyz");
  EXPECT_EQ(ready.first, 200) << "ready again once the tick loop runs";
  server->Stop();
}

// Issue 40, finding 7: every session refused for its credential logged a line (10,000 lines in
// 7 s); registrations refused were already limited to one line a second.
TEST(ManagerHttp, RefusedSessionsAreLoggedOneLineASecond) {
  std::ostringstream lines;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(lines);
  spdlog::default_logger()->sinks().push_back(sink);
  auto server = StartWithHttp();
  auto channel = MakeChannel("127.0.0.1:" + std::to_string(server->port())).value();
  auto stub = v1::Manager::NewStub(channel);
  constexpr int kTries = 200;
  const auto started = std::chrono::steady_clock::now();
  for (int i = 0; i < kTries; ++i) {
    grpc::ClientContext context;
    AttachCredential(context, "guess");
    context.set_deadline(std::chrono::system_clock::now() + 10s);
    auto stream = stub->Session(&context);
    v1::ManagerMessage m;
    while (stream->Read(&m)) {
    }
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  const auto seconds =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - started);
  server->Stop();
  spdlog::default_logger()->sinks().pop_back();
  const std::string text = lines.str();
  int logged = 0;
  for (size_t at = text.find("refused a session"); at != std::string::npos;
       at = text.find("refused a session", at + 1))
    ++logged;
  EXPECT_GE(logged, 1);
  EXPECT_LE(logged, seconds.count() + 1) << kTries << " refusals in " << seconds.count() << " s";
}

}  // namespace
}  // namespace regroup::manager
