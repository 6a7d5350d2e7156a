#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Checks the Go modules against a built libregroup.so: gofmt, go vet, go test, and go test -race,
# for the cgo binding (go/, package go/regroup) and the Volcano plugin with the scheduler build
# (go/volcano, its own module: it pulls in Volcano and Kubernetes, which the binding does not need).
#
#   go/test.sh          the checks
#   go/test.sh bench    the checks, then the benchmarks (one scheduling session of 1,000 jobs on
#                       10,000 nodes through the engine, and through Volcano's framework with and
#                       without the plugin; one decision, ...), printed as go test prints them
#
# BUILD_DIR: the CMake build folder that holds libregroup.so (default: build/ at the repository
# root, /work/main/build). Build it with: cmake --build "$BUILD_DIR" --target regroup
# RACE=0 skips the -race runs. The plugin's -race run recompiles all of Kubernetes (about 8 min of
# CPU cold), so it runs only with VOLCANO_RACE=1 (the binding's, where the concurrency is, always
# runs unless RACE=0). VOLCANO=0 skips go/volcano (the binding alone: no Kubernetes
# modules to download or compile). BENCHTIME (default 1s) and COUNT (default 3) tune the
# benchmarks.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build_dir="${BUILD_DIR:-$here/../build}"
if [[ ! -d "$build_dir" ]] || ! ls "$build_dir"/libregroup.so >/dev/null 2>&1; then
  echo "go/test.sh: no libregroup.so in $build_dir; build it with" \
       "'cmake --build $build_dir --target regroup' or set BUILD_DIR" >&2
  exit 1
fi
build_dir="$(cd "$build_dir" && pwd)"

export CGO_ENABLED=1
export CGO_LDFLAGS="-L$build_dir${CGO_LDFLAGS:+ $CGO_LDFLAGS}"
export LD_LIBRARY_PATH="$build_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cd "$here"

unformatted="$(gofmt -l .)"
if [[ -n "$unformatted" ]]; then
  echo "go/test.sh: gofmt would change: $unformatted" >&2
  exit 1
fi
modules=(.)
if [[ "${VOLCANO:-1}" != 0 ]]; then modules+=(volcano); fi
# The chart's alert rules and dashboard, read by Prometheus's own rule and PromQL parsers (its own
# module: it pulls in Prometheus). MONITORING=0 skips it.
if [[ "${MONITORING:-1}" != 0 ]]; then modules+=(monitoring); fi

for m in "${modules[@]}"; do
  (
    cd "$m"
    go vet ./...
    go test -count=1 ./...
    if [[ "${RACE:-1}" != 0 && ( "$m" == . || "${VOLCANO_RACE:-0}" == 1 ) ]]; then
      go test -race -count=1 ./...
    fi
  )
done

if [[ "${1:-}" == bench ]]; then
  for m in "${modules[@]}"; do
    (cd "$m" && go test -run '^$' -bench . -benchmem -benchtime "${BENCHTIME:-1s}" -count "${COUNT:-3}" ./...)
  done
fi
