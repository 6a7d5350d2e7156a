#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# CI's Kubernetes stage: the process kubelet's checks (gofmt, go vet, go test), the control plane's
# build (cached per source version; minutes the first time, integration/README.md), then the
# scenarios on it (integration/kube_test.py; REGROUP_KUBE_SCENARIOS picks them).
#   BUILD_DIR: the folder holding libregroup.so and the Regroup binaries (default build/).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build_dir="$(cd "${BUILD_DIR:-$here/../../build}" && pwd)"
export GOFLAGS="${GOFLAGS:--mod=mod}"
cd "$here"
unformatted="$(gofmt -l .)"
if [[ -n "$unformatted" ]]; then echo "kube: gofmt would change: $unformatted" >&2; exit 1; fi
go vet ./kubelet/
go test -count=1 ./kubelet/
start=$SECONDS
REGROUP_BUILD_DIR="$build_dir" /usr/bin/python3 ../kube_cluster.py build
echo "kube: the control plane's binaries ready in $((SECONDS - start)) s"
cd ..
REGROUP_BUILD_DIR="$build_dir" REGROUP_BIN_DIR="$build_dir" \
  /usr/bin/python3 -m pytest -q -p no:cacheprovider -s kube_test.py
