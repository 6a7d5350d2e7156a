#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The chart's alert rules as Prometheus reads them: `promtool check rules` parses the rule file,
# and `promtool test rules` runs tests/monitoring/regroup-alerts.test.yaml (each alert fires for
# the series it is about and not for its near miss). promtool: $PROMTOOL, else the PATH's, else
# the one scripts/setup unpacked into the cache.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$here/.."
promtool="${PROMTOOL:-$(command -v promtool || true)}"
if [[ -z "$promtool" ]]; then
  promtool="${XDG_CACHE_HOME:-$HOME/.cache}/regroup/promtool/usr/bin/promtool"
fi
if [[ ! -x "$promtool" ]]; then
  echo "promtool_test: no promtool (not on PATH, \$PROMTOOL unset, none at $promtool): run scripts/setup" >&2
  exit 1
fi
"$promtool" --version 2>&1 | head -1
"$promtool" check rules "$root/deploy/helm/regroup/files/regroup-alerts.yaml"
cd "$root/tests/monitoring"
"$promtool" test rules regroup-alerts.test.yaml
