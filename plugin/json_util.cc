// SPDX-License-Identifier: Apache-2.0
#include "plugin/json_util.h"

namespace regroup::json_util {

namespace {
std::string Where(std::string_view where, std::string_view field) {
  return std::string(where) + " field \"" + std::string(field) + "\"";
}

// *items: the field's array, or null when it is absent or null.
Status ArrayField(const nlohmann::json& obj, std::string_view field, std::string_view where,
                  size_t max_items, const nlohmann::json*& items) {
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) return Status::Ok();
  if (!it->is_array()) return InvalidArgument(Where(where, field) + " must be an array");
  if (it->size() > max_items)
    return InvalidArgument(Where(where, field) + " has more than " + std::to_string(max_items) +
                           " items");
  items = &*it;
  return Status::Ok();
}
}  // namespace

StatusOr<nlohmann::json> Parse(std::string_view text, std::string_view what) {
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(std::string(what) + " is not valid JSON: " + e.what());
  }
}

Status GetString(const nlohmann::json& obj, std::string_view field, std::string_view where,
                 std::string& out, bool required) {
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) {
    if (required) return InvalidArgument(Where(where, field) + " is missing");
    return Status::Ok();
  }
  if (!it->is_string()) return InvalidArgument(Where(where, field) + " must be a string");
  out = it->get_ref<const std::string&>();
  return Status::Ok();
}

Status GetInt(const nlohmann::json& obj, std::string_view field, std::string_view where,
              int64_t min, int64_t max, int64_t& out, bool required) {
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) {
    if (required) return InvalidArgument(Where(where, field) + " is missing");
    return Status::Ok();
  }
  int64_t value = 0;
  if (it->is_number_integer()) {
    value = it->get<int64_t>();
  } else if (it->is_number_unsigned()) {
    uint64_t u = it->get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX))
      return InvalidArgument(Where(where, field) + " is too large");
    value = static_cast<int64_t>(u);
  } else {
    return InvalidArgument(Where(where, field) + " must be an integer");
  }
  if (value < min || value > max)
    return InvalidArgument(Where(where, field) + " is " + std::to_string(value) +
                           "; it must be from " + std::to_string(min) + " to " +
                           std::to_string(max));
  out = value;
  return Status::Ok();
}

Status GetStringMap(const nlohmann::json& obj, std::string_view field, std::string_view where,
                    std::map<std::string, std::string>& out) {
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) return Status::Ok();
  if (!it->is_object()) return InvalidArgument(Where(where, field) + " must be an object");
  for (const auto& [key, value] : it->items()) {
    if (!value.is_string())
      return InvalidArgument(Where(where, field) + " entry \"" + key +
                             "\" must be a string (Kubernetes labels, annotations and env "
                             "values are strings)");
    out[key] = value.get<std::string>();
  }
  return Status::Ok();
}

Status GetBool(const nlohmann::json& obj, std::string_view field, std::string_view where,
               bool& out, bool required) {
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) {
    if (required) return InvalidArgument(Where(where, field) + " is missing");
    return Status::Ok();
  }
  if (!it->is_boolean()) return InvalidArgument(Where(where, field) + " must be true or false");
  out = it->get<bool>();
  return Status::Ok();
}

Status GetIntList(const nlohmann::json& obj, std::string_view field, std::string_view where,
                  int64_t min, int64_t max, std::vector<int64_t>& out, size_t max_items) {
  const nlohmann::json* items = nullptr;
  REGROUP_RETURN_IF_ERROR(ArrayField(obj, field, where, max_items, items));
  if (!items) return Status::Ok();
  for (const auto& item : *items) {
    if (!item.is_number_integer() && !item.is_number_unsigned())
      return InvalidArgument(Where(where, field) + " must hold integers");
    if (item.is_number_unsigned() && item.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      return InvalidArgument(Where(where, field) + " holds a value that is too large");
    int64_t v = item.get<int64_t>();
    if (v < min || v > max)
      return InvalidArgument(Where(where, field) + " holds " + std::to_string(v) +
                             "; items must be from " + std::to_string(min) + " to " +
                             std::to_string(max));
    out.push_back(v);
  }
  return Status::Ok();
}

Status GetStringList(const nlohmann::json& obj, std::string_view field, std::string_view where,
                     size_t max_bytes, std::vector<std::string>& out, size_t max_items) {
  const nlohmann::json* items = nullptr;
  REGROUP_RETURN_IF_ERROR(ArrayField(obj, field, where, max_items, items));
  if (!items) return Status::Ok();
  for (const auto& item : *items) {
    if (!item.is_string() || item.get_ref<const std::string&>().size() > max_bytes)
      return InvalidArgument(Where(where, field) + " must hold strings of at most " +
                             std::to_string(max_bytes) + " bytes");
    out.push_back(item.get<std::string>());
  }
  return Status::Ok();
}

}  // namespace regroup::json_util
