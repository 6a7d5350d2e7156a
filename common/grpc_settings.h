// SPDX-License-Identifier: Apache-2.0
// The gRPC settings every server and client of Regroup shares: message sizes, keepalives, TLS,
// and how a library status becomes a gRPC status.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "common/status.h"

namespace regroup {

// The largest message either side accepts (a generation plan of 16,384 ranks is far smaller).
inline constexpr int kMaxMessageBytes = 4 << 20;

// The gRPC status for a library status: chosen by what the caller should do (retry the call,
// fix the request, ...), with the message kept.
grpc::Status ToGrpcStatus(const Status& status);

// Keepalive and size settings for a server. Clients ping at most every `kClientPingInterval`;
// the server permits pings that often, so it never answers `too_many_pings`.
inline constexpr std::chrono::milliseconds kClientPingInterval{10000};
// The server pings its clients as often; a ping unanswered for kPingTimeout ends the connection.
inline constexpr std::chrono::milliseconds kServerPingInterval{10000};
inline constexpr std::chrono::milliseconds kPingTimeout{5000};
void ConfigureServer(grpc::ServerBuilder& builder);
// How a client checks the server it connects to. Empty `ca_file`: plaintext.
struct ClientTls {
  std::string ca_file;      // the CA bundle (PEM) that signed the server's certificate
  // The name the server's certificate must carry, when it is not the target's host (a server
  // reached by IP address, or through a Service name its certificate does not list). Only with
  // ca_file: it is gRPC's SSL target name override.
  std::string server_name;
  // The client's own certificate and key (PEM), for a server that requires one (mutual TLS:
  // the server's --tls-client-ca). Both or neither, and only with ca_file.
  std::string cert_file;
  std::string key_file;
};
// The least time gRPC gives one connection attempt, TCP and TLS handshakes together. One second
// is ample within a cluster and finds a moved server soon; a client that connects rarely and
// must get through a loaded machine's handshakes (a manager to its coordinator) gives more.
inline constexpr std::chrono::milliseconds kConnectTimeout{1000};
// A client channel to `target` with matching keepalives, over TLS when `tls.ca_file` is given.
// A CA file that cannot be read or holds no certificate, or a server name without a CA file, is
// an error naming the path: a channel never falls back to the system's roots or to plaintext. A
// client certificate without its key (or the reverse), one whose key does not match it, or one
// given without a CA file is an error naming the files.
StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(
    const std::string& target, const ClientTls& tls = {},
    std::chrono::milliseconds connect_timeout = kConnectTimeout);
// Why a call to `target` failed, in words: a TLS handshake failure (gRPC puts "Ssl handshake
// failed: REASON", or "Peer name N is not in peer certificate", in a failed call's message) is
// named as such, with the peer, the reason and what to check; any other failure is gRPC's
// message. `over_tls`: the channel is TLS, so a connection the server closed as it was made
// ("Socket closed") is named as a refused handshake too: under TLS 1.3 a server that requires a
// client certificate (mutual TLS) checks it after the client's side of the handshake is done,
// and closes the connection when it refuses it.
std::string DescribeCallFailure(const grpc::Status& status, const std::string& target,
                                bool over_tls = false);
// Server credentials: TLS when a certificate and key are given, else insecure. With
// `client_ca_file` (mutual TLS) every client must present a certificate that CA signed: a client
// without one fails its handshake. It needs the certificate and key.
StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const std::string& tls_cert_file, const std::string& tls_key_file,
    const std::string& client_ca_file = "");

}  // namespace regroup
