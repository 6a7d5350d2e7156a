// The per-job credential every RPC carries ("authorization: Bearer <token>" metadata), and the
// gRPC settings both sides share (keepalives, message sizes).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <grpcpp/grpcpp.h>

#include "plugin/status.h"

namespace regroup::runtime {

// The largest message either side accepts (a generation plan of 16,384 ranks is far smaller).
inline constexpr int kMaxMessageBytes = 4 << 20;

// Milliseconds since the Unix epoch: the clock of the manager and the coordinator.
int64_t WallMs();

// The gRPC status for a library status: chosen by what the caller should do (retry the call,
// fix the request, ...), with the message kept.
grpc::Status ToGrpcStatus(const Status& status);

// Reads the job's credential: `file` if given, else $REGROUP_CREDENTIAL_FILE, else
// $REGROUP_CREDENTIAL. An empty result means "no credential configured" (local testing only;
// the servers then accept only clients that send none). A file that cannot be read is an error.
StatusOr<std::string> LoadCredential(const std::string& file);

// Adds the credential to an outgoing call.
void AttachCredential(grpc::ClientContext& context, const std::string& credential);

// Checks an incoming call's credential in constant time. Returns an UNAUTHENTICATED status
// naming the peer when it is missing or wrong.
grpc::Status CheckCredential(const grpc::ServerContextBase& context, const std::string& expected);

// Keepalive and size settings for a server. Clients ping at most every `kClientPingInterval`;
// the server permits pings that often, so it never answers `too_many_pings`.
inline constexpr std::chrono::milliseconds kClientPingInterval{10000};
void ConfigureServer(grpc::ServerBuilder& builder);
// A client channel to `target` with matching keepalives, optionally over TLS (`tls_ca_file`
// non-empty: the server's CA bundle).
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           const std::string& tls_ca_file = "");
// Server credentials: TLS when a certificate and key are given, else insecure.
StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const std::string& tls_cert_file, const std::string& tls_key_file);

}  // namespace regroup::runtime
