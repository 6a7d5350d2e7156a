// SPDX-License-Identifier: Apache-2.0
#include "manager/service.h"

#include <deque>
#include <sstream>

#include <google/protobuf/util/json_util.h>
#include <httplib.h>
#include <spdlog/spdlog.h>

#include "common/address.h"
#include "common/clock.h"
#include "common/credential.h"
#include "common/grpc_settings.h"
#include "manager/http_server.h"
#include "manager/metrics.h"

namespace regroup::manager {

namespace {

// A stream refused before it starts (a wrong credential).
class Rejected final : public grpc::ServerBidiReactor<v1::AgentMessage, v1::ManagerMessage> {
 public:
  explicit Rejected(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

ManagerServer::ManagerServer(std::unique_ptr<JobControl> job, ServerOptions options)
    : options_(std::move(options)),
      job_(std::move(job)),
      metrics_(std::make_unique<ManagerMetrics>(job_->spec().id)) {
  job_->OnTiming([metrics = metrics_.get()](JobControl::Timing timing, double seconds) {
    metrics->Observe(timing, seconds);
  });
}

ManagerServer::~ManagerServer() { Stop(); }

Status ManagerServer::Start() {
  auto creds = ServerCredentials(options_.tls_cert_file, options_.tls_key_file,
                                 options_.tls_client_ca_file);
  if (!creds.ok()) return creds.status();
  grpc::ServerBuilder builder;
  ConfigureServer(builder);
  builder.AddListeningPort(options_.listen, *creds, &port_);
  builder.RegisterService(this);
  server_ = builder.BuildAndStart();
  if (!server_ || port_ == 0)
    return InvalidArgument("regroup-manager cannot listen on " + options_.listen +
                           " (in use, or not an address of this host)");
  if (!options_.http_listen.empty()) {
    const bool loopback = IsLoopbackAddress(options_.http_listen);
    if (!loopback && options_.credential.empty()) {
      Stop();
      return FailedPrecondition(
          "regroup-manager will not serve /status and /metrics on " + options_.http_listen +
          " without a credential (it runs --insecure): give --http a loopback address "
          "(127.0.0.1:PORT), or the manager a credential");
    }
    // Pod uids, node names and the job's events are not for whoever reaches the port.
    // With --tls-client-ca (mutual TLS), also a client certificate that CA signed.
    const bool need_certificate = !options_.tls_client_ca_file.empty();
    auto certified = [need_certificate](const httplib::Request& req) {
      return !need_certificate || ClientCertified(req);
    };
    auto allowed = [this, loopback, certified](const httplib::Request& req, bool metrics) {
      return loopback || (metrics && options_.metrics_open) ||
             (certified(req) &&
              BearerHeaderMatches(req.get_header_value("Authorization"), options_.credential));
    };
    auto refuse = [certified](const httplib::Request& req, httplib::Response& res) {
      if (!certified(req)) {
        res.status = 403;
        res.set_content("no client certificate: off loopback, " + req.path +
                            " needs a certificate that the manager's --tls-client-ca signed "
                            "(mutual TLS), and the job's credential\n",
                        "text/plain");
        return;
      }
      res.status = 401;
      res.set_header("WWW-Authenticate", "Bearer");
      res.set_content(std::string(req.has_header("Authorization") ? "a wrong credential"
                                                                   : "no credential") +
                          ": off loopback, " + req.path +
                          " needs \"Authorization: Bearer <the job's credential>\"\n",
                      "text/plain");
    };
    // With a certificate, HTTP is HTTPS with it too: the credential never crosses in clear.
    // Each connection is bounded in bytes, header lines and time (http_server.h).
    auto http = MakeHttpServer(options_.tls_cert_file, options_.tls_key_file, {},
                               options_.tls_client_ca_file);
    if (!http.ok()) {
      Stop();
      return InvalidArgument("regroup-manager cannot serve HTTPS on " + options_.http_listen +
                             ": " + http.status().message());
    }
    http_ = std::move(*http);
    http_->Get("/metrics", [this, allowed, refuse](const httplib::Request& req,
                                                   httplib::Response& res) {
      if (!allowed(req, /*metrics=*/true)) return refuse(req, res);
      res.set_content(MetricsText(), "text/plain; version=0.0.4");
    });
    http_->Get("/status", [this, allowed, refuse](const httplib::Request& req,
                                                  httplib::Response& res) {
      if (!allowed(req, /*metrics=*/false)) return refuse(req, res);
      res.set_content(StatusJson(), "application/json");
    });
    // The probes a kubelet sends carry no token: they are open, and say nothing of the job.
    // /healthz: the process serves HTTP. /readyz: it serves the agents, its gRPC port listening
    // and its tick loop (detection, decisions, the commit) running within kReadyTickBound; it
    // takes no lock, so a wedged job control reads as not ready instead of hanging the probe.
    http_->Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok\n", "text/plain");
    });
    http_->Get("/readyz", [this](const httplib::Request&, httplib::Response& res) {
      const std::string why = WhyNotReady();
      res.status = why.empty() ? 200 : 503;
      res.set_content(why.empty() ? "ok\n" : why + "\n", "text/plain");
    });
    const auto colon = options_.http_listen.rfind(':');
    const std::string host = options_.http_listen.substr(0, colon);
    const int want = colon == std::string::npos ? 0 : std::atoi(options_.http_listen.c_str() + colon + 1);
    http_port_ = want ? (http_->bind_to_port(host, want) ? want : -1) : http_->bind_to_any_port(host);
    if (http_port_ <= 0) {
      Stop();
      return InvalidArgument("regroup-manager cannot serve HTTP on " + options_.http_listen);
    }
    http_thread_ = std::thread([this] { http_->listen_after_bind(); });
    // httplib's stop() does nothing until the listening loop runs; a Stop() right after Start()
    // would then leave that loop in accept() for good. Start returns once it runs.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!http_->is_running() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (!http_->is_running()) {
      Stop();
      return FailedPrecondition("regroup-manager's HTTP server on " + options_.http_listen +
                                " did not start within 10 s");
    }
  }
  ticker_ = std::thread([this] { TickLoop(); });
  return Status::Ok();
}

void ManagerServer::Stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (ticker_.joinable()) ticker_.join();
  if (http_) http_->stop();
  if (http_thread_.joinable()) http_thread_.join();
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_->Wait();
  }
}

grpc::ServerBidiReactor<v1::AgentMessage, v1::ManagerMessage>* ManagerServer::Session(
    grpc::CallbackServerContext* context) {
  grpc::Status auth = CheckCredential(*context, options_.credential);
  if (!auth.ok()) {
    ++refusals_;
    std::lock_guard lock(session_refusal_mu_);  // not mu_: a flood must not stall the job
    if (auto held = session_refusal_log_.Allow(LogLimit::Clock::now()))
      spdlog::warn("refused a session: {}{}", auth.error_message(),
                   *held ? " (and " + std::to_string(*held) + " more not logged)" : "");
    return new Rejected(auth);
  }
  std::lock_guard lock(mu_);
  auto* stream = new Stream(this, next_stream_++, "the agent is gone", context);
  streams_[stream->id()] = stream;
  return stream;
}

grpc::ServerUnaryReactor* ManagerServer::GetStatus(grpc::CallbackServerContext* context,
                                                   const v1::GetStatusRequest* request,
                                                   v1::GetStatusResponse* response) {
  auto* reactor = context->DefaultReactor();
  grpc::Status auth = CheckCredential(*context, options_.credential);
  if (!auth.ok()) {
    reactor->Finish(auth);
    return reactor;
  }
  if (context->deadline() == std::chrono::system_clock::time_point::max()) {
    reactor->Finish({grpc::StatusCode::INVALID_ARGUMENT,
                     "GetStatus needs a deadline: every unary call to the manager must set one"});
    return reactor;
  }
  std::lock_guard lock(mu_);
  if (!request->job_id().empty() && request->job_id() != job_->spec().id) {
    reactor->Finish({grpc::StatusCode::NOT_FOUND,
                     "this manager serves job " + job_->spec().id + ", not " +
                         request->job_id()});
    return reactor;
  }
  *response = job_->StatusReport();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

void ManagerServer::OnMessage(Stream* stream, const v1::AgentMessage& message) {
  ++messages_;
  std::lock_guard lock(mu_);
  const int64_t now = WallMs();
  if (stream->tag < 0) {
    Status st = message.has_register_()
                    ? Status::Ok()
                    : FailedPrecondition("the first message of a session must be Register");
    int64_t node = -1;
    if (st.ok()) {
      auto registered = job_->Register(stream->id(), message.header(), message.register_(), now);
      if (registered.ok()) node = *registered;
      else st = registered.status();
    }
    if (!st.ok()) {
      ++refusals_;
      if (auto held = registration_refusal_log_.Allow(LogLimit::Clock::now()))
        spdlog::warn("refused a registration: {}{}", st.message(),
                     *held ? " (and " + std::to_string(*held) + " more not logged)" : "");
      const bool fenced =
          message.has_register_() && job_->IsFenced(message.register_().pod_uid());
      const bool readmit = fenced && job_->MayReadmit(message.register_().pod_uid());
      stream->Send(job_->MakeRefusal(st.message(), fenced, readmit), true, ToGrpcStatus(st));
      return;
    }
    if (auto old = by_node_.find(node); old != by_node_.end() && old->second != stream)
      old->second->Close(grpc::Status(grpc::StatusCode::ABORTED, "replaced by a newer session"));
    stream->tag = node;
    by_node_[node] = stream;
  } else {
    Status st = job_->Handle(stream->id(), message, now);
    if (!st.ok()) {
      ++refusals_;
      if (auto held = message_refusal_log_.Allow(LogLimit::Clock::now()))
        spdlog::info("refused a message of node rank {}: {}{}", stream->tag, st.message(),
                     *held ? " (and " + std::to_string(*held) + " more not logged)" : "");
      stream->Send(job_->MakeRefusal(st.message()), false);
    }
  }
  Flush();
}

void ManagerServer::OnStreamDone(Stream* stream) {
  if (const std::string why = stream->cut_off(); !why.empty())
    spdlog::warn("cut off the stream of node rank {}: {}", stream->tag, why);
  std::lock_guard lock(mu_);
  streams_.erase(stream->id());
  if (stream->tag >= 0) {
    auto it = by_node_.find(stream->tag);
    if (it != by_node_.end() && it->second == stream) by_node_.erase(it);
  }
  job_->Disconnected(stream->id(), WallMs());
  Flush();
}

void ManagerServer::Flush() {
  if (auto record = job_->TakeRecord(); record && !options_.record_file.empty()) {
    std::string why;
    auto written = UpdateJobRecord(options_.record_file, *record, &why);
    if (!written.ok()) {
      if (auto held = record_log_.Allow(LogLimit::Clock::now()))
        spdlog::error("{}{}: a restarted manager may readmit lost pods",
                      written.status().message(),
                      *held ? " (and " + std::to_string(*held) + " more not logged)" : "");
    } else if (!*written) {
      spdlog::error("the job record {} says {}: this manager is fenced and stops its pods",
                    options_.record_file, why);
      job_->Superseded(why, WallMs());
    }
  }
  for (auto& out : job_->TakeOutgoing()) {
    auto it = by_node_.find(out.node_rank);
    if (it == by_node_.end()) continue;
    it->second->Send(std::move(out.message), out.close);
  }
}

bool ManagerServer::DoneAndAlone() {
  std::lock_guard lock(mu_);
  return job_->stopped() != nullptr && streams_.empty();
}

std::string ManagerServer::WhyNotReady() const {
  if (!server_ || port_ == 0) return "not listening";
  const int64_t last = last_tick_ms_.load();
  if (last < 0) return "the tick loop has not run yet";
  const int64_t ago = SteadyMs() - last;
  if (ago > kReadyTickBound.count())
    return "the tick loop last ran " + std::to_string(ago) + " ms ago";
  return "";
}

void ManagerServer::TickLoop() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    job_->Tick(WallMs());
    Flush();
    last_tick_ms_ = SteadyMs();
    stop_cv_.wait_for(lock, options_.tick, [this] { return stopping_; });
  }
}

std::string ManagerServer::StatusJson() {
  v1::GetStatusResponse status;
  {
    std::lock_guard lock(mu_);
    status = job_->StatusReport();
  }
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(status, &out, options);
  return out;
}

std::string ManagerServer::MetricsText() {
  std::lock_guard lock(mu_);
  ManagerMetrics::Server server;
  server.agents_connected = by_node_.size();
  server.messages = messages_;
  server.refusals = refusals_;
  return metrics_->Text(*job_, server);
}

}  // namespace regroup::manager
