// SPDX-License-Identifier: Apache-2.0
// The Prometheus text exposition format (version 0.0.4), as /metrics serves it: label values
// escaped (backslash, double quote, newline), integers printed as integers, and floating-point
// values with every digit they need, so no value is rounded and no label can inject a line.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace regroup::manager {

class PrometheusText {
 public:
  using Labels = std::vector<std::pair<std::string_view, std::string_view>>;

  // The HELP and TYPE lines of a metric family ("gauge" or "counter"); once per name.
  void Family(std::string_view name, std::string_view type, std::string_view help);
  void Sample(std::string_view name, const Labels& labels, int64_t value);
  void Sample(std::string_view name, const Labels& labels, uint64_t value);
  void Sample(std::string_view name, const Labels& labels, double value);

  const std::string& text() const { return text_; }

  // A label value with \ " and newline escaped.
  static std::string EscapeLabelValue(std::string_view value);

 private:
  void Name(std::string_view name, const Labels& labels);
  std::string text_;
};

}  // namespace regroup::manager
