// SPDX-License-Identifier: Apache-2.0
#include "common/log_format.h"

#include <chrono>
#include <ctime>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

namespace regroup {

namespace {

class JsonFormatter final : public spdlog::formatter {
 public:
  JsonFormatter(std::string program, LogFields fields)
      : program_(std::move(program)), fields_(std::move(fields)) {}

  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    nlohmann::ordered_json line;
    line["time"] = Utc(msg.time);
    const auto level = spdlog::level::to_string_view(msg.level);
    line["level"] = std::string(level.data(), level.size());
    line["logger"] = msg.logger_name.size() ? std::string(msg.logger_name.data(),
                                                          msg.logger_name.size())
                                            : program_;
    for (const auto& [key, value] : fields_) line[key] = value;
    line["message"] = std::string(msg.payload.data(), msg.payload.size());
    const std::string text =
        line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
    dest.append(text.data(), text.data() + text.size());
  }

  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>(program_, fields_);
  }

 private:
  // RFC 3339 in UTC, to the millisecond.
  static std::string Utc(spdlog::log_clock::time_point t) {
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
    const std::time_t seconds = static_cast<std::time_t>(ms / 1000);
    std::tm tm{};
    gmtime_r(&seconds, &tm);
    char text[40];
    const size_t n = std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%S", &tm);
    std::snprintf(text + n, sizeof(text) - n, ".%03dZ", static_cast<int>(ms % 1000));
    return text;
  }

  std::string program_;
  LogFields fields_;
};

}  // namespace

StatusOr<LogFormat> ParseLogFormat(std::string_view text) {
  if (text == "text") return LogFormat::kText;
  if (text == "json") return LogFormat::kJson;
  return InvalidArgument("\"" + std::string(text) + "\" is not a log format: text or json");
}

std::unique_ptr<spdlog::formatter> JsonLogFormatter(std::string program, LogFields fields) {
  return std::make_unique<JsonFormatter>(std::move(program), std::move(fields));
}

void UseLogFormat(LogFormat format, const std::string& program, LogFields fields) {
  if (format == LogFormat::kJson)
    spdlog::set_formatter(JsonLogFormatter(program, std::move(fields)));
}

}  // namespace regroup
