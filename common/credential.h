// SPDX-License-Identifier: Apache-2.0
// The per-job credential every RPC carries ("authorization: Bearer <token>" metadata).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <grpcpp/grpcpp.h>

#include "common/status.h"

namespace regroup {

// Reads the job's credential: `file` if given, else $REGROUP_CREDENTIAL_FILE, else
// $REGROUP_CREDENTIAL. An empty result means "no credential configured" (local testing only;
// the servers then accept only clients that send none). A file that cannot be read, is a
// directory or holds no token is an error, never "no credential".
StatusOr<std::string> LoadCredential(const std::string& file);

// Adds the credential to an outgoing call.
void AttachCredential(grpc::ClientContext& context, const std::string& credential);

// The token an incoming call carries ("authorization: Bearer <token>"); nullopt when it carries
// none.
std::optional<std::string> BearerToken(const grpc::ServerContextBase& context);

// Checks an incoming call's credential in constant time. Returns an UNAUTHENTICATED status
// naming the peer when it is missing or wrong.
grpc::Status CheckCredential(const grpc::ServerContextBase& context, const std::string& expected);

// Whether an HTTP "Authorization" header value is "Bearer <expected>", compared in constant time.
bool BearerHeaderMatches(std::string_view header, std::string_view expected);

}  // namespace regroup
