// SPDX-License-Identifier: Apache-2.0
// The coordinator's logic without gRPC: which manager stream serves which job, what each message
// of a stream does to the engine, and which directives go down which stream. The gRPC service
// (coordinator.h) calls it under its own lock; tests and the fuzzer drive it directly.
//
// Identity (docs/security.md): with a cluster key, a stream attaches as job J only with J's token
// (common/job_token.h, recomputed from the key and the uid the engine has for J); another job's
// token, or the cluster key itself, is refused PERMISSION_DENIED naming J.
//
// Epochs are granted here, never taken from a manager: a hello with epoch 0 asks for one, and is
// granted an epoch above any this job had (the highest seen here, the one the engine's saved state
// holds for the job's manager, and the wall clock in ms, so a restarted scheduler never grants a
// lower one), with its ticket (EpochTicket). A manager that reattaches sends its epoch with that
// ticket; an epoch without a valid ticket is refused PERMISSION_DENIED. Only the highest epoch of a
// job is served: an older manager is refused as fenced, a newer one (or the same epoch on a new
// stream: a reconnect) replaces the attached stream, which is closed. An attached stream's facts
// become engine events; a bad fact is answered with a Refusal carrying the engine's error and
// changes nothing. The job's directive goes down on attach and whenever its id changes (Publish).
//
// Facts are acknowledged: every message to an attached stream carries the highest fact number
// (ManagerReport.seq) of its epoch applied or refused, and a fact numbered at or below it, sent
// again by a manager that reattached after a stream broke, is not applied twice. So a fact that
// a broken stream lost on its way is not lost for good, and none counts twice. Once the job's
// state is saved through ExportJobState and Saved (the scheduler plugin stores it in the
// PodGroup), only what a saved state holds is acknowledged: a fact applied after the last save
// is kept by the manager and sent again to a restarted coordinator, whose engine came back from
// that state without it.
//
// Leases (docs/membership.md): a manager commits a step only while it holds a lease, which it asks
// for on its hello and alone every quarter of a lease (ManagerReport.lease), counted by its own
// clock from when it asked. An epoch of a job gets no lease before the last one granted to another
// epoch has run out here (plus a tenth for the clocks' drift). So an older manager cut off from
// the coordinator, which never hears that it was replaced, stops committing before the newer one
// starts. Once the job's state is saved (Saved), an epoch's first lease also waits until a stored
// state names it the lease holder (ExportJobState writes it, `lease_holder`; SaveWanted asks for
// that save): after a restart, which forgets what was granted, the holder the stored state names
// is granted its lease at once, and every other epoch waits a lease from the start. No other
// epoch can hold one then: each was named in a stored state before its first lease, and named
// only once the lease before it had run out.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/text.h"
#include "plugin/engine.h"
#include "common/status.h"
#include "regroup/v1/wire.pb.h"

namespace regroup::coordinator {

namespace v1 = ::regroup::v1;

inline constexpr int64_t kDefaultLeaseMs = 10000;
inline constexpr int64_t kMaxLeaseMs = 600000;

// An engine directive in its wire form (strings made valid UTF-8, which proto3 requires).
std::optional<v1::Directive> DirectiveToProto(const Directive& d);  // nullopt: not a wire kind

class Attachments {
 public:
  // A message for one stream. `close`: end that stream after it, with `status` (never ok).
  struct Outgoing {
    uint64_t stream = 0;
    v1::CoordinatorDirective message;
    bool close = false;
    Status status;
    // The refusal is of the caller's identity (a token that is not its job's, an epoch it was
    // not granted): the stream ends PERMISSION_DENIED, whatever `status`'s code.
    bool permission_denied = false;
  };

  // `engine_mu` is the lock every user of `engine` holds (the C ABI's per-engine lock): shared
  // to read, exclusive to change. Not thread-safe itself: one caller at a time.
  // `cluster_key`: the key the jobs' tokens and the epochs' tickets derive from; "" (a
  // coordinator run without a credential) checks no token, and its tickets prove nothing.
  // `lease_ms`: the managers' lease, 1 to kMaxLeaseMs (clamped), counted on `lease_clock` (ms;
  // default: a steady clock, which no step of the wall clock moves).
  Attachments(std::shared_mutex& engine_mu, Engine& engine, std::string cluster_key = "",
              int64_t lease_ms = kDefaultLeaseMs, std::function<int64_t()> lease_clock = {})
      : engine_mu_(engine_mu),
        engine_(engine),
        cluster_key_(std::move(cluster_key)),
        lease_ms_(std::clamp<int64_t>(lease_ms, 1, kMaxLeaseMs)),
        lease_clock_(lease_clock ? std::move(lease_clock) : regroup::SteadyMs) {}

  // A message of stream `stream` (any id; a stream is new until its hello is accepted). Facts are
  // applied to the engine at `now_ms`. Returns what to send, possibly to other streams (the one
  // a newer manager replaces). `credential`: the token the stream's call carries (read at its
  // hello only).
  std::vector<Outgoing> OnReport(uint64_t stream, const v1::ManagerReport& report,
                                 int64_t now_ms, std::string_view credential = {});
  // The stream ended; its job has no manager attached until the next hello.
  void OnClosed(uint64_t stream);
  // The current directive of every attached job whose directive id changed since it was last
  // sent; a job the engine no longer has ends its stream (NOT_FOUND), and its epoch is
  // forgotten.
  std::vector<Outgoing> Publish();

  // Which facts a saved state holds: those of the job's manager epoch `epoch` up to `seq`.
  struct StateMark {
    uint64_t epoch = 0;
    uint64_t seq = 0;
  };
  // The job's state (Job::StateJson, what a restarted scheduler imports) and the mark of the
  // facts it holds, read together; nothing when the engine has no such job. Takes the engine's
  // lock (shared).
  std::optional<std::pair<nlohmann::json, StateMark>> ExportJobState(std::string_view job);
  // The state exported with `mark` is stored where a restarted scheduler reads it back: its
  // facts are acknowledged from now on, and the lease holder it names is on record. It confirms
  // the job's latest export with that mark (export, store, then Saved, one job at a time). The
  // first call makes this coordinator acknowledge only saved facts and record lease holders.
  void Saved(std::string_view job, StateMark mark);
  // The job's state names a lease holder not yet stored: export and store it, then Saved.
  bool SaveWanted(std::string_view job) const;

  bool attached(uint64_t stream) const { return streams_.count(stream) > 0; }
  size_t attached_count() const { return streams_.size(); }
  // The highest manager epoch granted or seen for a job (0: none), and the stream serving it (0:
  // none).
  uint64_t epoch_of(std::string_view job) const;
  uint64_t stream_of(std::string_view job) const;

 private:
  struct Attached {
    std::string job;
    uint64_t epoch = 0;
    uint64_t sent_directive = 0;  // id of the last directive sent down this stream
  };
  struct JobEntry {
    uint64_t epoch = 0;   // the highest epoch granted or attached
    uint64_t stream = 0;  // the stream serving it; 0 while none is attached
    uint64_t lease_epoch = 0;     // the epoch the last lease was granted to
    int64_t lease_until_ms = 0;   // that lease runs until then (with the margin)
    uint64_t applied_epoch = 0;   // the epoch whose facts applied_seq counts
    uint64_t applied_seq = 0;     // its highest fact number applied (or refused)
    uint64_t saved_seq = 0;       // ... that a saved state holds
    // The lease holder: the one this coordinator chose (0: none yet; exports name it), the one a
    // stored state names once this coordinator stored one (`holder_stored`; before, the one the
    // engine's restored state names), and the holder and mark of the latest export.
    uint64_t holder = 0;
    uint64_t stored_holder = 0;
    bool holder_stored = false;
    std::optional<std::pair<StateMark, uint64_t>> exported;
  };

  std::vector<Outgoing> Handle(uint64_t stream, const v1::ManagerReport& report, int64_t now_ms,
                               std::string_view credential);
  // Every message to an attached stream acknowledges the facts of its epoch applied so far.
  void StampAcks(std::vector<Outgoing>& out) const;

  std::vector<Outgoing> Hello(uint64_t stream, const v1::ManagerReport& report, int64_t now_ms,
                              std::string_view credential);
  Status ApplyFact(const Attached& a, const v1::ManagerReport& report, int64_t now_ms);
  // These two read the engine: the caller holds engine_mu_ (shared at least).
  // The job's directive for stream `stream`; false if the engine does not know the job.
  bool DirectiveFor(uint64_t stream, Attached& a, Outgoing& out) const;
  Outgoing Refusal(uint64_t stream, std::string_view job, uint64_t epoch, const Status& why,
                   bool close) const;
  // The answer to a request for the lease sent at the manager's `sent_ms`, granted or not.
  // The caller holds engine_mu_ (shared at least).
  v1::LeaseGrant Lease(std::string_view job, JobEntry& entry, uint64_t epoch, int64_t sent_ms);
  // The holder the latest stored state of the job names (0: none known).
  uint64_t StoredHolder(std::string_view job, const JobEntry& entry) const;
  // A lease as this coordinator counts it: a tenth more, for the clocks' drift.
  int64_t LeaseSpanMs() const { return lease_ms_ + lease_ms_ / 10; }
  v1::Header MakeHeader(std::string_view job, uint64_t epoch) const;

  std::shared_mutex& engine_mu_;
  Engine& engine_;
  const std::string cluster_key_;
  const int64_t lease_ms_;
  const std::function<int64_t()> lease_clock_;
  int64_t started_ms_ = -1;  // the first report, on lease_clock_: no earlier lease is known
  // Saved was called: acknowledge only saved facts, and grant a new holder its lease only once
  // a stored state names it.
  bool acks_saved_only_ = false;
  std::map<uint64_t, Attached> streams_;                // attached streams
  std::map<std::string, JobEntry, std::less<>> jobs_;  // every job a manager attached to
};

}  // namespace regroup::coordinator
