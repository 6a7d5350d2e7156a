#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Checks localsched (Volcano in the loop) against a built libregroup.so: gofmt, go vet, go test;
# then builds the binary the integration scenarios use (cached by integration/volcano_loop.py), so
# the scenarios' clock is not spent compiling.   BUILD_DIR: the folder holding libregroup.so.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build_dir="$(cd "${BUILD_DIR:-$here/../../build}" && pwd)"
export CGO_ENABLED=1
export CGO_LDFLAGS="-L$build_dir${CGO_LDFLAGS:+ $CGO_LDFLAGS}"
export LD_LIBRARY_PATH="$build_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cd "$here"
unformatted="$(gofmt -l .)"
if [[ -n "$unformatted" ]]; then echo "localsched: gofmt would change: $unformatted" >&2; exit 1; fi
go vet ./...
go test -count=1 ./...
REGROUP_BUILD_DIR="$build_dir" /usr/bin/python3 -c \
  'import sys; sys.path[:0] = ["..", "../../python"]; import volcano_loop; print(volcano_loop.build_localsched())'
