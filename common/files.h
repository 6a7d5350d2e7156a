// SPDX-License-Identifier: Apache-2.0
// Reading the small files the servers are given (credentials, TLS certificates and keys).
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

#include "common/status.h"

namespace regroup {

// The most a credential, certificate or key file may hold.
inline constexpr std::uintmax_t kMaxSmallFileBytes = 1 << 20;

// The whole file at `path`; an error naming the `what` and the path when it cannot be read, is a
// directory (a Secret's mount folder given instead of the file inside it) or is larger than
// kMaxSmallFileBytes.
inline StatusOr<std::string> ReadSmallFile(const std::string& path, std::string_view what) {
  const std::string named = "the " + std::string(what) + " file " + path;
  std::error_code error;
  if (std::filesystem::is_directory(path, error))
    return InvalidArgument(named + " is a directory: give the file inside it (a mounted Secret's "
                                   "key, e.g. " + path + "/token)");
  auto size = std::filesystem::file_size(path, error);
  if (!error && size > kMaxSmallFileBytes)
    return InvalidArgument(named + " holds " + std::to_string(size) + " bytes, more than the " +
                           std::to_string(kMaxSmallFileBytes) + " allowed");
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgument("cannot read " + named);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return InvalidArgument("cannot read " + named);
  return text.str();
}

}  // namespace regroup
