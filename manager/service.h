// SPDX-License-Identifier: Apache-2.0
// regroup-manager's servers: the gRPC Manager service (one bidirectional stream per agent, on
// gRPC's callback API so thousands of agents need no thread each), a ticker, and an HTTP
// endpoint with Prometheus metrics and the JSON status.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "common/log_limit.h"
#include "common/queued_stream.h"
#include "manager/job_control.h"
#include "regroup/v1/wire.grpc.pb.h"

namespace httplib {
class Server;
}

namespace regroup::manager {

class ManagerMetrics;

struct ServerOptions {
  std::string listen = "0.0.0.0:9601";  // port 0: chosen by the system
  std::string credential;                // empty: no credential required
  std::string tls_cert_file, tls_key_file;
  // Mutual TLS: every gRPC client must present a certificate this CA signed (needs the two above).
  std::string tls_client_ca_file;
  // "" : no HTTP endpoint; "127.0.0.1:0" for any port. On a loopback address /status and
  // /metrics are open; elsewhere each request needs "Authorization: Bearer <credential>", but
  // /metrics is open when `metrics_open` (an operator's explicit choice, for a scraper without
  // the token). /healthz and /readyz are open everywhere (a kubelet's probes carry no token;
  // they tell nothing of the job). Off loopback without a credential (--insecure), HTTP does not
  // start. With
  // tls_cert_file and tls_key_file, it is HTTPS with the same certificate.
  std::string http_listen;
  bool metrics_open = false;
  std::chrono::milliseconds tick{20};
  // The job's durable record (job_record.h): written whenever it changes, before the messages
  // of that change are sent. "": none (a restarted manager then relies on the agents' word).
  std::string record_file;
};


class ManagerServer final : public v1::Manager::CallbackService {
 public:
  ManagerServer(std::unique_ptr<JobControl> job, ServerOptions options);
  ~ManagerServer() override;

  // Starts listening and ticking. Errors name the address.
  Status Start();
  // Stops accepting, ends every stream, stops the ticker. Safe to call twice.
  void Stop();

  int port() const { return port_; }
  int http_port() const { return http_port_; }

  std::string MetricsText();
  std::string StatusJson();
  // The job stopped (finished, or ended by a decision; or this incarnation fenced) and no agent
  // has a stream open: the manager has nothing more to tell anyone.
  bool DoneAndAlone();
  // Why the manager is not ready ("" when it is): see /readyz in Start().
  std::string WhyNotReady() const;
  // How long ago the tick loop last ran for the manager to be ready.
  static constexpr std::chrono::milliseconds kReadyTickBound{2000};

  grpc::ServerBidiReactor<v1::AgentMessage, v1::ManagerMessage>* Session(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const v1::GetStatusRequest* request,
                                      v1::GetStatusResponse* response) override;

 private:
  using Stream = QueuedStream<v1::AgentMessage, v1::ManagerMessage, ManagerServer>;
  friend Stream;

  void OnMessage(Stream* stream, const v1::AgentMessage& message);
  void OnStreamDone(Stream* stream);
  void Flush();  // sends what the job control queued; holds mu_
  void TickLoop();

  ServerOptions options_;
  std::mutex mu_;
  std::unique_ptr<JobControl> job_;
  std::unique_ptr<ManagerMetrics> metrics_;
  std::map<uint64_t, Stream*> streams_;   // every live stream, by id
  std::map<int64_t, Stream*> by_node_;    // registered streams, by node rank
  uint64_t next_stream_ = 1;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<httplib::Server> http_;
  std::thread http_thread_;
  std::thread ticker_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  int port_ = 0;
  int http_port_ = 0;
  std::atomic<int64_t> last_tick_ms_{-1};  // steady clock; read by /readyz without mu_
  std::atomic<uint64_t> messages_{0};
  std::atomic<uint64_t> refusals_{0};
  // A zombie retrying, or a flood of bad messages, logs one line a second (under mu_).
  LogLimit registration_refusal_log_{std::chrono::seconds(1)};
  std::mutex session_refusal_mu_;  // a session refused for its credential: one line a second
  LogLimit session_refusal_log_{std::chrono::seconds(1)};
  LogLimit message_refusal_log_{std::chrono::seconds(1)};
  LogLimit record_log_{std::chrono::seconds(10)};
};

}  // namespace regroup::manager
