#!/usr/bin/env bash
# Checks the Go binding (go/regroup) against a built libregroup.so: gofmt, go vet, go test, and
# go test -race.
#
#   go/test.sh          the checks
#   go/test.sh bench    the checks, then the benchmarks (one scheduling session of 1,000 jobs on
#                       10,000 nodes, one decision, ...), printed as go test prints them
#
# BUILD_DIR: the CMake build folder that holds libregroup.so (default: build/ at the repository
# root, /work/main/build). Build it with: cmake --build "$BUILD_DIR" --target regroup
# RACE=0 skips the -race run. BENCHTIME (default 1s) and COUNT (default 3) tune the benchmarks.
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
go vet ./...
go test -count=1 ./...
if [[ "${RACE:-1}" != 0 ]]; then
  go test -race -count=1 ./...
fi

if [[ "${1:-}" == bench ]]; then
  go test -run '^$' -bench . -benchmem -benchtime "${BENCHTIME:-1s}" -count "${COUNT:-3}" ./...
fi
