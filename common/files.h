// Reading the small files the servers are given (credentials, TLS certificates and keys).
#pragma once

#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

#include "common/status.h"

namespace regroup {

// The whole file at `path`; an error naming the `what` and the path when it cannot be read.
inline StatusOr<std::string> ReadSmallFile(const std::string& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgument("cannot read the " + std::string(what) + " file " + path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace regroup
