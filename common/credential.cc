// SPDX-License-Identifier: Apache-2.0
#include "common/credential.h"

#include <cstdlib>

#include "common/files.h"

namespace regroup {
namespace {

constexpr std::string_view kBearer = "Bearer ";

bool ConstantTimeEqual(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= a[i] ^ (i < b.size() ? b[i] : 0);
  return diff == 0;
}

}  // namespace

StatusOr<std::string> LoadCredential(const std::string& file) {
  std::string path = file;
  if (path.empty())
    if (const char* env = std::getenv("REGROUP_CREDENTIAL_FILE")) path = env;
  std::string token;
  if (!path.empty()) {
    auto text = ReadSmallFile(path, "credential");
    if (!text.ok()) return text.status();
    token = *text;
  } else if (const char* env = std::getenv("REGROUP_CREDENTIAL")) {
    token = env;
  }
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' '))
    token.pop_back();
  // A file that was named must hold a token: an empty one would silently turn authentication off.
  if (!path.empty() && token.empty())
    return InvalidArgument("the credential file " + path + " is empty: it must hold the token");
  return token;
}

void AttachCredential(grpc::ClientContext& context, const std::string& credential) {
  if (!credential.empty()) context.AddMetadata("authorization", std::string(kBearer) + credential);
}

std::optional<std::string> BearerToken(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return std::nullopt;
  std::string_view got(it->second.data(), it->second.size());
  if (got.substr(0, kBearer.size()) == kBearer) got.remove_prefix(kBearer.size());
  return std::string(got);
}

grpc::Status CheckCredential(const grpc::ServerContextBase& context, const std::string& expected) {
  const std::optional<std::string> got = BearerToken(context);
  if (ConstantTimeEqual(got.value_or(""), expected)) return grpc::Status::OK;
  return {grpc::StatusCode::UNAUTHENTICATED,
          std::string(!got ? "no credential" : "a wrong credential") +
              " from " + context.peer() +
              ": every call must carry this job's credential (REGROUP_CREDENTIAL_FILE)"};
}

bool BearerHeaderMatches(std::string_view header, std::string_view expected) {
  if (expected.empty() || header.substr(0, kBearer.size()) != kBearer) return false;
  return ConstantTimeEqual(header.substr(kBearer.size()), expected);
}

}  // namespace regroup
