// SPDX-License-Identifier: Apache-2.0
// The coordinator: the gRPC service (regroup.v1.Coordinator, proto/regroup/v1/wire.proto) in
// libregroup.so that connects the jobs' managers to the scheduler's engine. One bidirectional
// stream per manager, on gRPC's callback API; the logic of a stream is Attachments
// (attachments.h). The C ABI wraps it as regroup_coordinator.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <utility>

#include "plugin/attachments.h"
#include "plugin/engine.h"
#include "common/status.h"

namespace regroup::coordinator {

struct CoordinatorOptions {
  std::string listen = "0.0.0.0:8899";  // port 0: any free port
  // The cluster key: each manager sends its job's token, derived from it (common/job_token.h).
  // Required unless `insecure`.
  std::string credential;
  bool insecure = false;                 // serve without a credential: managers must send none
  std::string tls_cert_file, tls_key_file;
  // Mutual TLS: every manager must present a certificate this CA bundle signed (its handshake
  // fails otherwise). Needs tls_cert_file and tls_key_file.
  std::string tls_client_ca_file;
  // The managers' lease (Attachments): from 1 ms to 10 minutes.
  int64_t lease_ms = kDefaultLeaseMs;
};

// Facts are applied to the engine at WallMs(): milliseconds since the Unix epoch.

class Coordinator {
 public:
  // Starts serving `engine`, whose every user holds `engine_mu` (shared to read, exclusive to
  // change). Both must outlive the coordinator. Errors name the address or the file, or say
  // that there is no credential (without `insecure`), or that a client CA has no certificate
  // and key to serve TLS with.
  static StatusOr<std::unique_ptr<Coordinator>> Start(std::shared_mutex& engine_mu, Engine& engine,
                                                      CoordinatorOptions options);
  // Stops accepting, ends every stream (UNAVAILABLE) and waits for them. Never throws.
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  int port() const;
  // Sends every attached manager its job's directive when its id changed since last sent.
  void Publish();
  // The job's state and the mark of its manager's facts it holds (Attachments::ExportJobState);
  // nothing for a job the engine does not have. Then Saved once the state is stored.
  std::optional<std::pair<nlohmann::json, Attachments::StateMark>> ExportJobState(
      std::string_view job);
  void Saved(std::string_view job, Attachments::StateMark mark);
  // A lease holder waits to be stored (Attachments::SaveWanted).
  bool SaveWanted(std::string_view job) const;

 private:
  class Service;
  explicit Coordinator(std::unique_ptr<Service> service);
  std::unique_ptr<Service> service_;
};

}  // namespace regroup::coordinator
