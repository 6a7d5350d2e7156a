// SPDX-License-Identifier: Apache-2.0
// The environment a command line falls back to, passed in so that parsing stays pure: main gives
// the process's, tests give a map.
#pragma once

#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>

namespace regroup {

// The value of an environment variable, or nullopt when it is not set.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// The process environment, for main.
inline EnvLookup ProcessEnv() {
  return [](const std::string& name) -> std::optional<std::string> {
    if (const char* value = std::getenv(name.c_str())) return std::string(value);
    return std::nullopt;
  };
}

// An environment holding just `variables`, for tests.
inline EnvLookup EnvOf(std::map<std::string, std::string> variables) {
  return [variables = std::move(variables)](const std::string& name) -> std::optional<std::string> {
    auto it = variables.find(name);
    if (it == variables.end()) return std::nullopt;
    return it->second;
  };
}

}  // namespace regroup
