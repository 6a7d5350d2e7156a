// SPDX-License-Identifier: Apache-2.0
// The log format every program shares: spdlog's text lines, or (--log-format json) one JSON
// object a line, for a log collector that parses them:
//   {"time":"2026-12-06T10:20:00.123Z","level":"info","logger":"regroup-manager","message":"..."}
// The message is escaped as JSON strings are (a newline in it stays inside its line); bytes that
// are not UTF-8 become U+FFFD.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <spdlog/formatter.h>

#include "common/status.h"

namespace regroup {

enum class LogFormat { kText, kJson };

// "text" or "json"; an error names the choices.
StatusOr<LogFormat> ParseLogFormat(std::string_view text);

// Fields every line carries after the logger (the agent's pod), in order.
using LogFields = std::vector<std::pair<std::string, std::string>>;

// The formatter of one JSON object a line; `program` is the logger named when the message's own
// logger has no name (spdlog's default logger).
std::unique_ptr<spdlog::formatter> JsonLogFormatter(std::string program, LogFields fields = {});

// Every logger of this process (the default one, and those made later) logs in `format`; a text
// format leaves the loggers' patterns as they are.
void UseLogFormat(LogFormat format, const std::string& program, LogFields fields = {});

}  // namespace regroup
