// SPDX-License-Identifier: Apache-2.0
// Reading JSON defensively: every accessor checks the type and names the field on failure, so
// no input can throw past the C ABI or crash the library.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace regroup::json_util {


// Parses text into JSON; the error names the position. `what` names the document.
StatusOr<nlohmann::json> Parse(std::string_view text, std::string_view what);

// Field readers. `where` prefixes error messages ("job spec", "event 3").
Status GetString(const nlohmann::json& obj, std::string_view field, std::string_view where,
                 std::string& out, bool required = true);
Status GetInt(const nlohmann::json& obj, std::string_view field, std::string_view where,
              int64_t min, int64_t max, int64_t& out, bool required = true);
Status GetBool(const nlohmann::json& obj, std::string_view field, std::string_view where,
               bool& out, bool required = true);
Status GetStringMap(const nlohmann::json& obj, std::string_view field, std::string_view where,
                    std::map<std::string, std::string>& out);
Status GetIntList(const nlohmann::json& obj, std::string_view field, std::string_view where,
                  int64_t min, int64_t max, std::vector<int64_t>& out, size_t max_items = 100000);
// Strings of at most `max_bytes` each.
Status GetStringList(const nlohmann::json& obj, std::string_view field, std::string_view where,
                     size_t max_bytes, std::vector<std::string>& out, size_t max_items = 1000);

}  // namespace regroup::json_util
