// SPDX-License-Identifier: Apache-2.0
#include "plugin/coordinator.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "common/clock.h"
#include "common/credential.h"
#include "common/grpc_settings.h"
#include "common/log_limit.h"
#include "common/queued_stream.h"
#include "plugin/attachments.h"
#include "regroup/v1/wire.grpc.pb.h"

namespace regroup::coordinator {

namespace {

using Reactor = grpc::ServerBidiReactor<v1::ManagerReport, v1::CoordinatorDirective>;

// Streams that have not said hello (issue 40: 15,000 of them held 303 MB): at most this many are
// kept, more are refused, and each is closed when it has said none within kHelloWithin.
constexpr size_t kMaxBeforeHello = 64;
constexpr auto kHelloWithin = std::chrono::seconds(5);

// A stream refused before its first message: a wrong credential, or the coordinator stopping.
class Rejected final : public Reactor {
 public:
  explicit Rejected(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

class Coordinator::Service final : public v1::Coordinator::CallbackService {
 public:
  Service(std::shared_mutex& engine_mu, Engine& engine, CoordinatorOptions options)
      : options_(std::move(options)),
        attachments_(engine_mu, engine, options_.credential, options_.lease_ms) {}

  Status Start() {
    auto creds = ServerCredentials(options_.tls_cert_file, options_.tls_key_file,
                                   options_.tls_client_ca_file);
    if (!creds.ok()) return creds.status();
    grpc::ServerBuilder builder;
    ConfigureServer(builder);
    // gRPC sets SO_REUSEPORT by default: a second coordinator on a port in use would start and
    // silently take part of its managers. Refuse the port instead.
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    builder.AddListeningPort(options_.listen, *creds, &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    if (!server_ || port_ == 0)
      return InvalidArgument("the coordinator cannot listen on " + options_.listen +
                             " (in use, or not an address of this host): choose another "
                             "address or port");
    sweeper_ = std::thread([this] { Sweep(); });
    return Status::Ok();
  }

  // Ends every stream, then stops the server; streams still open after a second are cancelled.
  void Stop() {
    {
      std::lock_guard lock(mu_);
      if (stopping_) return;
      stopping_ = true;
      for (auto& [id, stream] : streams_)
        stream->Close(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator is stopping"));
    }
    sweep_cv_.notify_all();
    if (sweeper_.joinable()) sweeper_.join();
    if (server_) {
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
      server_->Wait();
    }
  }

  int port() const { return port_; }

  void Publish() {
    std::lock_guard lock(mu_);
    Deliver(attachments_.Publish());
  }

  std::optional<std::pair<nlohmann::json, Attachments::StateMark>> ExportJobState(
      std::string_view job) {
    std::lock_guard lock(mu_);
    return attachments_.ExportJobState(job);
  }

  void Saved(std::string_view job, Attachments::StateMark mark) {
    std::lock_guard lock(mu_);
    attachments_.Saved(job, mark);
  }

  bool SaveWanted(std::string_view job) const {
    std::lock_guard lock(mu_);
    return attachments_.SaveWanted(job);
  }

  Reactor* Attach(grpc::CallbackServerContext* context) override {
    // Without a cluster key only managers that send no credential are served. With one, a
    // stream must carry a token; whose it must be is known at its hello (Attachments).
    std::string token;
    if (options_.credential.empty()) {
      grpc::Status auth = CheckCredential(*context, "");
      if (!auth.ok()) return new Rejected(auth);
    } else if (std::optional<std::string> t = BearerToken(*context); t && !t->empty()) {
      token = std::move(*t);
    } else {
      return new Rejected(grpc::Status(
          grpc::StatusCode::UNAUTHENTICATED,
          "no credential from " + context->peer() +
              ": a manager sends its job's token (REGROUP_COORDINATOR_CREDENTIAL_FILE)"));
    }
    std::lock_guard lock(mu_);
    if (stopping_)
      return new Rejected(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator is stopping"));
    if (streams_.size() - std::min(streams_.size(), attachments_.attached_count()) >=
        kMaxBeforeHello) {
      const std::string why = std::to_string(kMaxBeforeHello) +
                              " streams have said no hello yet, the most: refused a stream from " +
                              context->peer();
      LogBeforeHello(why);
      return new Rejected(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, why));
    }
    auto* stream = new Stream(this, next_stream_++, "the manager is gone", context);
    streams_[stream->id()] = stream;
    callers_[stream->id()] =
        Caller{std::move(token), context->peer(), std::chrono::steady_clock::now()};
    return stream;
  }

 private:
  // One manager's stream (writes queued: gRPC allows one in flight).
  using Stream = QueuedStream<v1::ManagerReport, v1::CoordinatorDirective, Service>;
  friend Stream;

  void OnMessage(Stream* stream, const v1::ManagerReport& report) {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    auto caller = callers_.find(stream->id());
    Deliver(attachments_.OnReport(stream->id(), report, WallMs(),
                                  caller == callers_.end() ? "" : caller->second.token));
  }

  void OnStreamDone(Stream* stream) {
    if (const std::string why = stream->cut_off(); !why.empty())
      std::fprintf(stderr, "regroup coordinator: cut off a manager's stream: %s\n", why.c_str());
    std::lock_guard lock(mu_);
    streams_.erase(stream->id());
    callers_.erase(stream->id());
    attachments_.OnClosed(stream->id());
  }

  // Sends what Attachments decided; holds mu_.
  void Deliver(std::vector<Attachments::Outgoing> out) {
    for (auto& o : out) {
      auto it = streams_.find(o.stream);
      if (it == streams_.end()) continue;
      grpc::Status status = grpc::Status::OK;
      if (o.permission_denied) {
        status = grpc::Status(grpc::StatusCode::PERMISSION_DENIED, o.status.message());
        LogDenied(o);
      } else if (o.close) {
        status = ToGrpcStatus(o.status);
      }
      it->second->Send(o.message, o.close, status);
    }
  }

  // Closes every stream that has said no hello within kHelloWithin, twice a second.
  void Sweep() {
    std::unique_lock lock(mu_);
    while (!stopping_) {
      sweep_cv_.wait_for(lock, std::chrono::milliseconds(500));
      if (stopping_) return;
      const auto late = std::chrono::steady_clock::now() - kHelloWithin;
      for (auto& [id, caller] : callers_) {
        if (caller.closed || caller.opened > late || attachments_.attached(id)) continue;
        auto stream = streams_.find(id);
        if (stream == streams_.end()) continue;
        caller.closed = true;
        const std::string why = "a stream from " + caller.peer + " said no hello within " +
                                std::to_string(kHelloWithin.count()) + " s";
        LogBeforeHello(why);
        stream->second->Close(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, why));
      }
    }
  }

  // A stream refused or closed before its hello, one line a second at most; holds mu_.
  void LogBeforeHello(const std::string& why) {
    if (const std::optional<uint64_t> held = before_hello_log_.Allow(LogLimit::Clock::now()))
      std::fprintf(stderr, "regroup coordinator: %s%s\n", why.c_str(),
                   *held ? (" (" + std::to_string(*held) + " more since the last line)").c_str()
                         : "");
  }

  // A refused identity is logged (naming the job and the peer, never a token), one line a
  // second at most, however often it is tried; holds mu_.
  void LogDenied(const Attachments::Outgoing& o) {
    const std::optional<uint64_t> held = denied_log_.Allow(LogLimit::Clock::now());
    if (!held) return;
    auto caller = callers_.find(o.stream);
    const std::string more =
        *held ? " (" + std::to_string(*held) + " more refusals since the last line)" : "";
    std::fprintf(stderr, "regroup coordinator: refused a manager at %s: %s%s\n",
                 caller == callers_.end() ? "?" : caller->second.peer.c_str(),
                 o.status.message().c_str(), more.c_str());
  }

  const CoordinatorOptions options_;
  mutable std::mutex mu_;  // before the engine's lock, never after
  Attachments attachments_;
  std::map<uint64_t, Stream*> streams_;  // every live stream, attached or not
  struct Caller {
    std::string token;  // the credential its call carries, checked at its hello
    std::string peer;
    std::chrono::steady_clock::time_point opened;
    bool closed = false;  // closed for saying no hello in time
  };
  std::map<uint64_t, Caller> callers_;  // by stream, as streams_
  LogLimit denied_log_{std::chrono::seconds(1)};
  LogLimit before_hello_log_{std::chrono::seconds(1)};
  std::condition_variable sweep_cv_;
  std::thread sweeper_;
  uint64_t next_stream_ = 1;
  bool stopping_ = false;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

Coordinator::Coordinator(std::unique_ptr<Service> service) : service_(std::move(service)) {}

Coordinator::~Coordinator() {
  try {
    service_->Stop();
  } catch (...) {
    // Stopping must not throw out of a destructor (and out of regroup_coordinator_free).
  }
}

StatusOr<std::unique_ptr<Coordinator>> Coordinator::Start(std::shared_mutex& engine_mu,
                                                          Engine& engine,
                                                          CoordinatorOptions options) {
  if (options.listen.empty()) options.listen = CoordinatorOptions().listen;
  // Open mode is never the default: a coordinator left without its token by a mistake in the
  // deployment would accept anyone as any job's manager.
  if (options.credential.empty() && !options.insecure)
    return InvalidArgument("the coordinator has no credential: give the token the managers send, "
                           "or ask for insecure mode to accept every manager (testing only)");
  // Managers' certificates are checked only in a TLS handshake: a client CA alone would serve
  // plaintext and check nobody.
  if (!options.tls_client_ca_file.empty() &&
      (options.tls_cert_file.empty() || options.tls_key_file.empty()))
    return InvalidArgument("the coordinator's TLS client CA (tls_client_ca_file " +
                           options.tls_client_ca_file +
                           ") needs its own certificate and key (tls_cert_file, tls_key_file): "
                           "managers' certificates are checked only over TLS");
  if (options.lease_ms < 1 || options.lease_ms > kMaxLeaseMs)
    return InvalidArgument("the managers' lease of " + std::to_string(options.lease_ms) +
                           " ms is out of range: 1 to " + std::to_string(kMaxLeaseMs) + " ms");
  auto service = std::make_unique<Service>(engine_mu, engine, std::move(options));
  if (Status st = service->Start(); !st.ok()) {
    service->Stop();
    return st;
  }
  return std::unique_ptr<Coordinator>(new Coordinator(std::move(service)));
}

int Coordinator::port() const { return service_->port(); }

void Coordinator::Publish() { service_->Publish(); }

std::optional<std::pair<nlohmann::json, Attachments::StateMark>> Coordinator::ExportJobState(
    std::string_view job) {
  return service_->ExportJobState(job);
}

bool Coordinator::SaveWanted(std::string_view job) const { return service_->SaveWanted(job); }

void Coordinator::Saved(std::string_view job, Attachments::StateMark mark) {
  service_->Saved(job, mark);
}

}  // namespace regroup::coordinator
