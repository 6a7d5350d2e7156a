// SPDX-License-Identifier: Apache-2.0
#include "manager/prometheus_text.h"

#include <charconv>
#include <cmath>

namespace regroup::manager {

std::string PrometheusText::EscapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

void PrometheusText::Family(std::string_view name, std::string_view type, std::string_view help) {
  std::string escaped;  // HELP text escapes backslash and newline
  for (char c : help) escaped += c == '\\' ? "\\\\" : c == '\n' ? "\\n" : std::string(1, c);
  text_.append("# HELP ").append(name).append(" ").append(escaped).append("\n");
  text_.append("# TYPE ").append(name).append(" ").append(type).append("\n");
}

void PrometheusText::Name(std::string_view name, const Labels& labels) {
  text_.append(name);
  if (labels.empty()) return;
  text_ += '{';
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i) text_ += ',';
    text_.append(labels[i].first).append("=\"").append(EscapeLabelValue(labels[i].second)) += '"';
  }
  text_ += '}';
}

void PrometheusText::Sample(std::string_view name, const Labels& labels, int64_t value) {
  Name(name, labels);
  text_.append(" ").append(std::to_string(value)) += '\n';
}

void PrometheusText::Sample(std::string_view name, const Labels& labels, uint64_t value) {
  Name(name, labels);
  text_.append(" ").append(std::to_string(value)) += '\n';
}

void PrometheusText::Sample(std::string_view name, const Labels& labels, double value) {
  Name(name, labels);
  text_ += ' ';
  if (std::isnan(value)) {
    text_ += "NaN";
  } else if (std::isinf(value)) {
    text_ += value > 0 ? "+Inf" : "-Inf";
  } else {
    char buffer[64];
    auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);  // shortest exact form
    text_.append(buffer, ec == std::errc() ? end : buffer);
  }
  text_ += '\n';
}

}  // namespace regroup::manager
