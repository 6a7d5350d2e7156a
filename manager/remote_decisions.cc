#include "manager/remote_decisions.h"

#include <algorithm>

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "common/credential.h"
#include "common/wire.h"
#include "regroup/v1/wire.grpc.pb.h"

namespace regroup::manager {
namespace {

// `kind` is p's kind, already decoded (DirectiveKindFromWire).
Directive FromProto(const v1::Directive& p, DirectiveKind kind) {
  Directive d;
  d.kind = kind;
  d.id = p.id();
  d.deadline_ms = p.deadline_ms();
  d.strategy = p.strategy();
  d.dp = p.dp();
  d.keep_replicas.assign(p.keep_replicas().begin(), p.keep_replicas().end());
  d.remove_replicas.assign(p.remove_replicas().begin(), p.remove_replicas().end());
  d.standby_pods.assign(p.standby_pods().begin(), p.standby_pods().end());
  d.restart_ranks.assign(p.restart_ranks().begin(), p.restart_ranks().end());
  for (uint64_t m : p.microbatches()) d.microbatches.push_back(static_cast<int64_t>(m));
  d.committed_step = p.committed_step();
  d.reason = p.reason();
  return d;
}

std::string Describe(const grpc::Status& s) {
  static const char* kCodes[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT",
                                 "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
                                 "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
                                 "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
                                 "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
  const int code = static_cast<int>(s.error_code());
  std::string out = code >= 0 && code <= 16 ? kCodes[code] : std::to_string(code);
  if (!s.error_message().empty()) out += ": " + s.error_message();
  return out;
}

}  // namespace

RemoteDecisions::RemoteDecisions(RemoteDecisionsOptions options) : options_(std::move(options)) {
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

v1::Header RemoteDecisions::MakeHeader() const {
  return ManagerHeader(options_.job_id, epoch_, generation_);
}

void RemoteDecisions::Enqueue(v1::ManagerReport report) {
  std::lock_guard lock(mu_);
  if (stopping_) return;
  *report.mutable_header() = MakeHeader();
  // Only the latest progress matters: one waiting behind another replaces it (never the one
  // being written, which is the front).
  if (report.has_progress() && queue_.size() > (writing_ ? 1u : 0u) &&
      queue_.back().has_progress()) {
    queue_.back() = std::move(report);
    return;
  }
  queue_.push_back(std::move(report));
  if (queue_.size() > std::max<size_t>(options_.max_queued, 2)) {
    queue_.erase(queue_.begin() + (writing_ ? 1 : 0));
    ++dropped_;
    if ((dropped_ & (dropped_ - 1)) == 0)  // at 1, 2, 4, 8, ... drops
      spdlog::warn("coordinator {} unreachable: {} facts queued, {} of the oldest dropped",
                   options_.target, queue_.size(), dropped_);
  }
  cv_.notify_all();
}

void RemoteDecisions::PodRunning(int64_t, const std::string&, const std::string&, int64_t) {}

void RemoteDecisions::Fault(const v1::FaultFacts& fault, int64_t) {
  v1::ManagerReport r;
  *r.mutable_fault() = fault;
  Enqueue(std::move(r));
}

void RemoteDecisions::ReplacementRegistered(int64_t pod, const std::string& uid, int64_t) {
  v1::ManagerReport r;
  r.mutable_replacement()->set_pod(static_cast<uint32_t>(std::max<int64_t>(0, pod)));
  r.mutable_replacement()->set_pod_uid(uid);
  Enqueue(std::move(r));
}

void RemoteDecisions::Progress(uint64_t, uint64_t generation, int64_t committed_step,
                               uint32_t live_ranks, int64_t) {
  {
    std::lock_guard lock(mu_);
    generation_ = generation;
  }
  v1::ManagerReport r;
  r.mutable_progress()->set_generation(generation);
  r.mutable_progress()->set_committed_step(committed_step);
  r.mutable_progress()->set_live_ranks(live_ranks);
  Enqueue(std::move(r));
}

void RemoteDecisions::Tick(int64_t) {}

std::optional<Directive> RemoteDecisions::Poll() {
  std::lock_guard lock(mu_);
  std::optional<Directive> d = std::move(unseen_);
  unseen_.reset();
  return d;
}

bool RemoteDecisions::Available() const {
  std::lock_guard lock(mu_);
  return attached_;
}

bool RemoteDecisions::WaitAvailable(std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [this] { return attached_ || stopping_; }) && attached_;
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
  return job_keys_;
}

uint64_t RemoteDecisions::epoch() const {
  std::lock_guard lock(mu_);
  return epoch_;
}

std::string RemoteDecisions::last_error() const {
  std::lock_guard lock(mu_);
  return last_error_;
}

size_t RemoteDecisions::queued() const {
  std::lock_guard lock(mu_);
  return queue_.size();
}

uint64_t RemoteDecisions::attaches() const {
  std::lock_guard lock(mu_);
  return attaches_;
}

void RemoteDecisions::OnDirective(const v1::CoordinatorDirective& m, bool first) {
  if (m.has_refusal()) {
    last_error_ = "the coordinator refused: " + m.refusal().reason();
    spdlog::warn("{}", last_error_);
    return;
  }
  if (!m.has_directive()) return;
  const v1::Directive& d = m.directive();
  if (first && (!ever_attached_ || d.id() < newest_id_)) {
    if (ever_attached_)
      spdlog::warn("the coordinator's directive ids went back from {} to {} (its engine lost the "
                   "job's state): taking {} as seen",
                   newest_id_, d.id(), d.id());
    newest_id_ = d.id();
    unseen_.reset();
    return;
  }
  if (d.id() <= newest_id_) return;
  newest_id_ = d.id();
  const std::optional<DirectiveKind> kind = DirectiveKindFromWire(d.kind());
  if (!kind) {
    spdlog::error("refused directive {} from the coordinator: its kind {} is not one this manager "
                  "knows (a newer coordinator?); waiting for the next directive",
                  d.id(), static_cast<int>(d.kind()));
    return;
  }
  unseen_ = FromProto(d, *kind);
}

void RemoteDecisions::Fail(const std::string& what) {
  if (what != last_error_)
    spdlog::warn("coordinator {}: {}; retrying", options_.target, what);
  last_error_ = what;
}

bool RemoteDecisions::Sleep(std::chrono::milliseconds d) {
  std::unique_lock lock(mu_);
  return !cv_.wait_for(lock, d, [this] { return stopping_; });
}

void RemoteDecisions::Run() {
  auto stub = v1::Coordinator::NewStub(options_.channel);
  auto backoff = options_.initial_backoff;
  while (true) {
    grpc::ClientContext context;
    AttachCredential(context, options_.credential);
    v1::ManagerReport hello;
    {
      std::lock_guard lock(mu_);
      if (stopping_) return;
      context_ = &context;
      broken_ = false;
      *hello.mutable_header() = MakeHeader();
      // Epoch 0 asks for one; later, the epoch granted and its ticket.
      hello.mutable_hello()->set_epoch(epoch_);
      hello.mutable_hello()->set_ticket(ticket_);
    }
    auto stream = stub->Attach(&context);

    // Attached once the coordinator answers the hello with the job's directive.
    v1::CoordinatorDirective first;
    const bool wrote = stream->Write(hello);
    const bool read = wrote && stream->Read(&first);
    std::string failure;
    bool granted_other = false;
    if (read && first.has_directive()) {
      std::lock_guard lock(mu_);
      if (epoch_ == 0) {
        epoch_ = first.header().epoch();
        ticket_ = first.epoch_ticket();
        job_keys_ = first.job();
      } else {
        granted_other = first.header().epoch() != epoch_;
      }
    }
    if (read && first.has_directive() && !granted_other && epoch_ != 0) {
      {
        std::lock_guard lock(mu_);
        OnDirective(first, true);
        attached_ = true;
        ever_attached_ = true;
        ++attaches_;
        last_error_.clear();
      }
      cv_.notify_all();
      spdlog::info("attached to the coordinator {} for job {} (epoch {})", options_.target,
                   options_.job_id, epoch());
      backoff = options_.initial_backoff;

      std::thread reader([&] {
        v1::CoordinatorDirective m;
        while (stream->Read(&m)) {
          std::lock_guard lock(mu_);
          OnDirective(m, false);
        }
        {
          std::lock_guard lock(mu_);
          broken_ = true;
          attached_ = false;
        }
        cv_.notify_all();
      });
      // The writer: the queued facts, in order; one leaves the queue once written.
      {
        std::unique_lock lock(mu_);
        while (true) {
          cv_.wait(lock, [this] { return stopping_ || broken_ || !queue_.empty(); });
          if (stopping_ || broken_) break;
          v1::ManagerReport next = queue_.front();
          writing_ = true;
          lock.unlock();
          const bool ok = stream->Write(next);
          lock.lock();
          writing_ = false;
          if (!ok) break;
          queue_.pop_front();
        }
        attached_ = false;
        // Stopping, or a write failed: end the call, and so the reader's Read. When the reader
        // saw the end first, the call is over and Finish gives the coordinator's own status.
        if (!broken_) context.TryCancel();
      }
      cv_.notify_all();
      reader.join();
      failure = "the stream ended (" + Describe(stream->Finish()) + ")";
    } else {
      if (read && first.has_refusal()) {
        failure = "refused: " + first.refusal().reason();
        v1::CoordinatorDirective rest;
        while (stream->Read(&rest)) {
        }
      } else if (read && first.has_directive()) {
        failure = "the coordinator attached this manager as epoch " +
                  std::to_string(first.header().epoch()) + ", not the epoch " +
                  std::to_string(epoch()) + " it was granted";
        context.TryCancel();
      } else if (read) {
        failure = "the coordinator answered the hello with neither a directive nor a refusal";
        context.TryCancel();
      }
      const grpc::Status st = stream->Finish();
      if (failure.empty()) failure = "cannot attach (" + Describe(st) + ")";
    }
    {
      std::lock_guard lock(mu_);
      context_ = nullptr;
      if (stopping_) return;
      Fail(failure);
    }
    if (!Sleep(backoff)) return;
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

}  // namespace regroup::manager
