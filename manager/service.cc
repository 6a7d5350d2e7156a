#include "manager/service.h"

#include <deque>
#include <sstream>

#include <google/protobuf/util/json_util.h>
#include <httplib.h>
#include <spdlog/spdlog.h>

#include "common/clock.h"
#include "common/credential.h"
#include "common/grpc_settings.h"

namespace regroup::manager {

namespace {

// A stream refused before it starts (a wrong credential).
class Rejected final : public grpc::ServerBidiReactor<v1::AgentMessage, v1::ManagerMessage> {
 public:
  explicit Rejected(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

ManagerServer::ManagerServer(std::unique_ptr<JobRuntime> runtime, ServerOptions options)
    : options_(std::move(options)), runtime_(std::move(runtime)) {}

ManagerServer::~ManagerServer() { Stop(); }

Status ManagerServer::Start() {
  auto creds = ServerCredentials(options_.tls_cert_file, options_.tls_key_file);
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
    http_ = std::make_unique<httplib::Server>();
    http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(MetricsText(), "text/plain; version=0.0.4");
    });
    http_->Get("/status", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(StatusJson(), "application/json");
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
    spdlog::warn("refused a session: {}", auth.error_message());
    return new Rejected(auth);
  }
  std::lock_guard lock(mu_);
  auto* stream = new Stream(this, next_stream_++, "the agent is gone");
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
  if (!request->job_id().empty() && request->job_id() != runtime_->spec().id) {
    reactor->Finish({grpc::StatusCode::NOT_FOUND,
                     "this manager serves job " + runtime_->spec().id + ", not " +
                         request->job_id()});
    return reactor;
  }
  *response = runtime_->StatusReport();
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
      auto registered = runtime_->Register(stream->id(), message.header(), message.register_(), now);
      if (registered.ok()) node = *registered;
      else st = registered.status();
    }
    if (!st.ok()) {
      ++refusals_;
      spdlog::warn("refused a registration: {}", st.message());
      const bool fenced =
          message.has_register_() && runtime_->IsFenced(message.register_().pod_uid());
      stream->Send(runtime_->MakeRefusal(st.message(), fenced), true, ToGrpcStatus(st));
      return;
    }
    if (auto old = by_node_.find(node); old != by_node_.end() && old->second != stream)
      old->second->Close(grpc::Status(grpc::StatusCode::ABORTED, "replaced by a newer session"));
    stream->tag = node;
    by_node_[node] = stream;
  } else {
    Status st = runtime_->Handle(stream->id(), message, now);
    if (!st.ok()) {
      ++refusals_;
      spdlog::info("refused a message of node rank {}: {}", stream->tag, st.message());
      stream->Send(runtime_->MakeRefusal(st.message()), false);
    }
  }
  Flush();
}

void ManagerServer::OnStreamDone(Stream* stream) {
  std::lock_guard lock(mu_);
  streams_.erase(stream->id());
  if (stream->tag >= 0) {
    auto it = by_node_.find(stream->tag);
    if (it != by_node_.end() && it->second == stream) by_node_.erase(it);
  }
  runtime_->Disconnected(stream->id(), WallMs());
  Flush();
}

void ManagerServer::Flush() {
  for (auto& out : runtime_->TakeOutgoing()) {
    auto it = by_node_.find(out.node_rank);
    if (it == by_node_.end()) continue;
    it->second->Send(out.message, out.close);
  }
}

void ManagerServer::TickLoop() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    runtime_->Tick(WallMs());
    Flush();
    stop_cv_.wait_for(lock, options_.tick, [this] { return stopping_; });
  }
}

std::string ManagerServer::StatusJson() {
  v1::GetStatusResponse status;
  {
    std::lock_guard lock(mu_);
    status = runtime_->StatusReport();
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
  const JobRuntime& r = *runtime_;
  const auto& c = r.counters();
  const std::string job = "{job=\"" + r.spec().id + "\"}";
  std::ostringstream m;
  auto gauge = [&](const char* name, const char* help, double value) {
    m << "# HELP " << name << " " << help << "\n# TYPE " << name << " gauge\n"
      << name << job << " " << value << "\n";
  };
  gauge("regroup_epoch", "The manager incarnation.", static_cast<double>(r.epoch()));
  gauge("regroup_generation", "The current generation n of (epoch, n).",
        static_cast<double>(r.generation()));
  gauge("regroup_world_size", "Ranks in the current generation.", r.world_size());
  gauge("regroup_committed_step", "The last committed step.", static_cast<double>(r.committed_step()));
  gauge("regroup_training", "1 while a generation trains.", r.training() ? 1 : 0);
  gauge("regroup_agents_connected", "Agents with a live stream.", static_cast<double>(by_node_.size()));
  gauge("regroup_step_seconds", "Median step time.", c.step_seconds);
  gauge("regroup_last_recovery_ms", "From the last abort to the next generation's first commit.",
        c.last_recovery_ms);
  m << "# HELP regroup_faults_total Faults by kind.\n# TYPE regroup_faults_total counter\n";
  for (const auto& [kind, n] : c.faults)
    m << "regroup_faults_total{job=\"" << r.spec().id << "\",kind=\"" << kind << "\"} " << n << "\n";
  m << "# HELP regroup_directives_total Directives carried out, by kind.\n"
       "# TYPE regroup_directives_total counter\n";
  for (const auto& [kind, n] : c.directives)
    m << "regroup_directives_total{job=\"" << r.spec().id << "\",kind=\"" << kind << "\"} " << n
      << "\n";
  m << "# TYPE regroup_commits_total counter\nregroup_commits_total" << job << " " << c.commits
    << "\n";
  m << "# TYPE regroup_messages_total counter\nregroup_messages_total" << job << " " << messages_
    << "\n";
  m << "# TYPE regroup_refusals_total counter\nregroup_refusals_total" << job << " " << refusals_
    << "\n";
  return m.str();
}

}  // namespace regroup::manager
