// SPDX-License-Identifier: Apache-2.0
#include "manager/remote_decisions.h"

#include <algorithm>

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "common/clock.h"
#include "common/credential.h"
#include "common/grpc_settings.h"
#include "common/wire.h"
#include "regroup/v1/wire.grpc.pb.h"

namespace regroup::manager {
namespace {

// A TLS handshake failure is named as such, with `target` and gRPC's reason.
std::string Describe(const grpc::Status& s, const std::string& target, bool tls) {
  static const char* kCodes[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT",
                                 "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
                                 "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
                                 "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
                                 "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
  const int code = static_cast<int>(s.error_code());
  std::string out = code >= 0 && code <= 16 ? kCodes[code] : std::to_string(code);
  if (!s.error_message().empty()) out += ": " + regroup::DescribeCallFailure(s, target, tls);
  return out;
}

}  // namespace

RemoteDecisions::RemoteDecisions(RemoteDecisionsOptions options)
    : options_(std::move(options)),
      channel_(options_.channel),
      core_(options_.job_id, options_.max_queued) {
  thread_ = std::thread([this] { Run(); });
}

RemoteDecisions::~RemoteDecisions() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    if (context_) context_->TryCancel();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void RemoteDecisions::Enqueue(v1::ManagerReport report) {
  std::lock_guard lock(mu_);
  if (stopping_) return;
  if (core_.Enqueue(std::move(report))) {
    const size_t dropped = core_.dropped();
    if ((dropped & (dropped - 1)) == 0)  // at 1, 2, 4, 8, ... drops
      spdlog::warn("coordinator {} unreachable: {} facts queued, {} of the oldest dropped",
                   options_.target, core_.queued(), dropped);
  }
  cv_.notify_all();
}

void RemoteDecisions::PodRunning(int64_t, const std::string&, const std::string&, int64_t) {}

void RemoteDecisions::Fault(const v1::FaultFacts& fault, int64_t) {
  Enqueue(AttachCore::FaultReport(fault));
}

void RemoteDecisions::FaultsSettled(uint64_t generation, int64_t) {
  Enqueue(AttachCore::SettledReport(generation));
}

void RemoteDecisions::ReplacementRegistered(int64_t pod, const std::string& uid, int64_t) {
  Enqueue(AttachCore::ReplacementReport(pod, uid));
}

void RemoteDecisions::ReportProgress(uint64_t, uint64_t generation, int64_t committed_step,
                                     uint32_t live_ranks, int64_t) {
  {
    std::lock_guard lock(mu_);
    core_.SetGeneration(generation);
  }
  Enqueue(AttachCore::ProgressReport(generation, committed_step, live_ranks));
}

void RemoteDecisions::Tick(int64_t) {}

std::optional<Directive> RemoteDecisions::Poll() {
  std::lock_guard lock(mu_);
  return core_.Poll();
}

std::optional<Directive> RemoteDecisions::Standing() const {
  std::lock_guard lock(mu_);
  return core_.Standing();
}

bool RemoteDecisions::Available() const {
  std::lock_guard lock(mu_);
  return core_.attached();
}

std::optional<std::string> RemoteDecisions::FencedBy() const {
  std::lock_guard lock(mu_);
  return core_.fenced_by();
}

std::string RemoteDecisions::WhyNoCommit() const {
  const int64_t now = SteadyMs();
  std::lock_guard lock(mu_);
  return core_.WhyNoCommit(now, options_.target);
}

bool RemoteDecisions::WaitAvailable(std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [this] { return core_.attached() || stopping_; }) &&
         core_.attached();
}

namespace {

// The keys of `from` that `to` lacks or holds with another value, and those `to` has alone.
void Differences(std::string_view what, const std::map<std::string, std::string>& to,
                 const google::protobuf::Map<std::string, std::string>& from,
                 std::vector<std::string>& out) {
  for (const auto& [k, v] : from) {
    auto it = to.find(k);
    if (it == to.end()) out.push_back(std::string(what) + " " + k + "=" + v + " (was unset)");
    else if (it->second != v)
      out.push_back(std::string(what) + " " + k + "=" + v + " (was " + it->second + ")");
  }
  for (const auto& [k, v] : to)
    if (!from.contains(k)) out.push_back(std::string(what) + " " + k + " unset (was " + v + ")");
}

}  // namespace

TakenKeys TakeJobKeys(const v1::JobKeys& keys, JobSpec& spec) {
  TakenKeys taken;
  if (keys.pods() == 0) return taken;  // a coordinator that predates JobKeys
  taken.taken = true;
  // What the manager was given from nowhere (no keys at all) is not worth a line per key.
  const bool given = !spec.labels.empty() || !spec.annotations.empty() || !spec.env.empty();
  if (given) {
    Differences("label", spec.labels, keys.labels(), taken.differences);
    Differences("annotation", spec.annotations, keys.annotations(), taken.differences);
    Differences("environment variable", spec.env, keys.env(), taken.differences);
  }
  if (static_cast<int64_t>(keys.pods()) != spec.pods)
    taken.differences.push_back("pod count " + std::to_string(keys.pods()) + " (was " +
                                std::to_string(spec.pods) + ")");
  if (static_cast<int64_t>(keys.processes_per_pod()) != spec.processes_per_pod)
    taken.differences.push_back(
        "processes per pod " + std::to_string(keys.processes_per_pod()) + " (was " +
        std::to_string(spec.processes_per_pod) +
        "; the scheduler's side reads it from the pod template: an accelerator request, else "
        "--nproc-per-node in the command, else PET_NPROC_PER_NODE in the env, else 1)");
  spec.labels = {keys.labels().begin(), keys.labels().end()};
  spec.annotations = {keys.annotations().begin(), keys.annotations().end()};
  spec.env = {keys.env().begin(), keys.env().end()};
  spec.pods = keys.pods();
  spec.processes_per_pod = keys.processes_per_pod();
  return taken;
}

v1::JobKeys RemoteDecisions::job_keys() const {
  std::lock_guard lock(mu_);
  return core_.job_keys();
}

uint64_t RemoteDecisions::epoch() const {
  std::lock_guard lock(mu_);
  return core_.epoch();
}

std::string RemoteDecisions::last_error() const {
  std::lock_guard lock(mu_);
  return core_.last_error();
}

size_t RemoteDecisions::queued() const {
  std::lock_guard lock(mu_);
  return core_.queued();
}

uint64_t RemoteDecisions::attaches() const {
  std::lock_guard lock(mu_);
  return core_.attaches();
}

void RemoteDecisions::Fail(const std::string& what) {
  if (core_.Failed(what)) spdlog::warn("coordinator {}: {}; retrying", options_.target, what);
}

bool RemoteDecisions::Sleep(std::chrono::milliseconds d) {
  std::unique_lock lock(mu_);
  return !cv_.wait_for(lock, d, [this] { return stopping_; });
}

bool RemoteDecisions::FreshChannel(int64_t& unattached_since_ms) {
  const int64_t now = SteadyMs();
  if (!options_.make_channel || now - unattached_since_ms < options_.fresh_channel_after.count())
    return false;
  auto channel = options_.make_channel();
  if (!channel) return false;
  spdlog::warn("coordinator {}: not attached for {} ms: connecting again on a fresh channel",
               options_.target, now - unattached_since_ms);
  channel_ = std::move(channel);
  unattached_since_ms = now;
  return true;
}

void RemoteDecisions::Run() {
  auto stub = v1::Coordinator::NewStub(channel_);
  auto backoff = options_.initial_backoff;
  int64_t unattached_since_ms = SteadyMs();  // since the channel was made, or last detached
  while (true) {
    grpc::ClientContext context;
    AttachCredential(context, options_.credential);
    v1::ManagerReport hello;
    {
      std::lock_guard lock(mu_);
      if (stopping_) return;
      context_ = &context;
      broken_ = false;
      hello = core_.Hello(SteadyMs());
    }
    auto stream = stub->Attach(&context);

    // Attached once the coordinator answers the hello with the job's directive.
    v1::CoordinatorDirective first;
    const bool wrote = stream->Write(hello);
    const bool read = wrote && stream->Read(&first);
    std::string failure;
    if (read) {
      std::lock_guard lock(mu_);
      failure = core_.OnAnswer(first);
    }
    if (read && failure.empty()) {
      cv_.notify_all();
      spdlog::info("attached to the coordinator {} for job {} (epoch {})", options_.target,
                   options_.job_id, epoch());
      backoff = options_.initial_backoff;

      std::thread reader([&] {
        v1::CoordinatorDirective m;
        while (stream->Read(&m)) {
          {
            std::lock_guard lock(mu_);
            core_.OnMessage(m);
          }
          // A grant changes when the next request is due: the writer counts again.
          if (m.has_lease()) cv_.notify_all();
        }
        {
          std::lock_guard lock(mu_);
          broken_ = true;
          core_.Detached();
        }
        cv_.notify_all();
      });
      // The writer: the queued facts, in order; one leaves the queue once written. It asks for
      // the lease again when it is due.
      {
        std::unique_lock lock(mu_);
        while (true) {
          core_.RenewLease(SteadyMs());
          cv_.wait_for(lock, std::chrono::milliseconds(core_.LeaseRenewalIn(SteadyMs())),
                       [this] { return stopping_ || broken_ || core_.HasFactToWrite(); });
          if (stopping_ || broken_) break;
          if (!core_.HasFactToWrite()) continue;  // a request for the lease is due
          const v1::ManagerReport next = *core_.NextToWrite();
          lock.unlock();
          const bool ok = stream->Write(next);
          lock.lock();
          if (!ok) {
            core_.WriteFailed();
            break;
          }
          core_.Written();
        }
        core_.Detached();
        // Stopping, or a write failed: end the call, and so the reader's Read. When the reader
        // saw the end first, the call is over and Finish gives the coordinator's own status.
        if (!broken_) context.TryCancel();
      }
      cv_.notify_all();
      reader.join();
      // Attached: the handshake was done, so a closed socket is not a refused certificate.
      failure = "the stream ended (" + Describe(stream->Finish(), options_.target, false) + ")";
      unattached_since_ms = SteadyMs();
    } else {
      if (read && first.has_refusal()) {
        v1::CoordinatorDirective rest;
        while (stream->Read(&rest)) {
        }
      } else if (read) {
        context.TryCancel();  // attached as another epoch, or an answer that is neither
      }
      const grpc::Status st = stream->Finish();
      if (failure.empty())
        failure = "cannot attach (" + Describe(st, options_.target, options_.tls) + ")";
    }
    {
      std::lock_guard lock(mu_);
      context_ = nullptr;
      if (stopping_) return;
      Fail(failure);
      if (core_.fenced_by()) return;  // for good: a newer manager leads the job
    }
    if (!Sleep(backoff)) return;
    backoff = std::min(backoff * 2, options_.max_backoff);
    if (FreshChannel(unattached_since_ms)) stub = v1::Coordinator::NewStub(channel_);
  }
}

}  // namespace regroup::manager
