// SPDX-License-Identifier: Apache-2.0
// The manager's HTTP(S) server for /status and /metrics, bounded against whoever reaches its port
// (issue 40, finding 3): cpp-httplib's own server reads headers without a count limit (3,000,000
// small headers took the manager to 470 MB) and gives each read 5 s, so eight trickling
// connections held its eight threads and blocked /status and /metrics for as long as they
// trickled. Here each connection is bounded in bytes, header lines and time, and the number
// served at once is bounded; more are closed at accept.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "common/status.h"

namespace httplib {
class Server;
struct Request;
}

namespace regroup::manager {

struct HttpLimits {
  size_t connections = 32;       // served at once: more are closed at accept
  size_t header_lines = 64;      // a request's headers
  size_t request_bytes = 16384;  // a request's line, headers and body together
  // A connection's whole life: its TLS handshake, its request and its answer. One request a
  // connection (no keep-alive), so a slow client holds one slot for this long at most.
  std::chrono::milliseconds deadline{5000};
};

// An httplib::Server (HTTPS with `cert_file` and `key_file` when both are given) that serves
// each connection under `limits`. An error names the certificate and key when they cannot serve,
// and says when the key does not match the certificate. With `client_ca_file` (HTTPS only) a
// client is asked for its certificate: one that CA did not sign fails the handshake, and a
// request on a connection that presented one the CA signed has ClientCertified(request) true
// (a client may present none: the kubelet's probes do not).
StatusOr<std::unique_ptr<httplib::Server>> MakeHttpServer(const std::string& cert_file,
                                                           const std::string& key_file,
                                                           const HttpLimits& limits = {},
                                                           const std::string& client_ca_file = "");
// Whether `request` came on a connection whose client presented a certificate the server's client
// CA signed (MakeHttpServer's client_ca_file).
bool ClientCertified(const httplib::Request& request);

}  // namespace regroup::manager
