// SPDX-License-Identifier: Apache-2.0
// The /metrics text: a hostile label cannot inject a line, and no value is rounded.
#include "manager/prometheus_text.h"

#include <gtest/gtest.h>

namespace regroup::manager {
namespace {

TEST(PrometheusText, ALabelWithAQuoteAndANewlineCannotInjectALine) {
  PrometheusText m;
  m.Family("regroup_epoch", "gauge", "The manager incarnation.");
  m.Sample("regroup_epoch", {{"job", "a\"} 1\nregroup_evil{x=\"\\"}}, int64_t{3});
  EXPECT_EQ(m.text(),
            "# HELP regroup_epoch The manager incarnation.\n"
            "# TYPE regroup_epoch gauge\n"
            "regroup_epoch{job=\"a\\\"} 1\\nregroup_evil{x=\\\"\\\\\"} 3\n");
  int lines = 0;
  for (char c : m.text()) lines += c == '\n';
  EXPECT_EQ(lines, 3);
}

TEST(PrometheusText, IntegersArePrintedWholeAndFloatsExactly) {
  PrometheusText m;
  m.Sample("a", {}, int64_t{1'796'100'000'000});
  m.Sample("b", {}, uint64_t{18'446'744'073'709'551'615u});
  m.Sample("c", {}, 1234567.25);
  m.Sample("d", {}, 0.1);
  EXPECT_EQ(m.text(), "a 1796100000000\nb 18446744073709551615\nc 1234567.25\nd 0.1\n");
}

}  // namespace
}  // namespace regroup::manager
