#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the libFuzzer targets and runs each for SECONDS (default 30).
#
#   tests/fuzz/run.sh [SECONDS] [BUILD_DIR]
#
# BUILD_DIR defaults to <repo>/build-fuzz (also settable as REGROUP_FUZZ_BUILD_DIR). Each target
# fuzzes a copy of its seed corpus (tests/fuzz/corpus/<target>) in a temporary directory, so the
# repository is not modified, and first replays its regression inputs
# (tests/fuzz/regressions/<target>). REGROUP_FUZZ_TARGETS="fuzz_events fuzz_snapshot" runs a
# subset; REGROUP_FUZZ_REGRESSIONS=0 skips the regression inputs (to keep fuzzing while a known
# bug is open); REGROUP_FUZZ_JOBS sets the build's parallelism (default 2). A crash, a leak, a timeout
# or an out-of-memory input is kept under BUILD_DIR/fuzz-artifacts/<target>/, its path printed;
# the script then exits 1.
set -euo pipefail

seconds="${1:-30}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="${2:-${REGROUP_FUZZ_BUILD_DIR:-$root/build-fuzz}}"
jobs="${REGROUP_FUZZ_JOBS:-2}"
all_targets=(fuzz_job_spec fuzz_events fuzz_job_state fuzz_snapshot fuzz_coordinator
  fuzz_manager fuzz_agent fuzz_volcano_yaml fuzz_fault_script)
read -r -a targets <<<"${REGROUP_FUZZ_TARGETS:-${all_targets[*]}}"

if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ]; then
  echo "usage: $0 [SECONDS] [BUILD_DIR]" >&2
  exit 2
fi

echo "== building the fuzz targets in $build"
cmake -S "$root" -B "$build" -G Ninja \
  -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
  -DREGROUP_FUZZ=ON -DBUILD_TESTING=OFF -DREGROUP_BENCH=OFF >/dev/null
cmake --build "$build" -j "$jobs" --target "${targets[@]}"

work="$(mktemp -d "${TMPDIR:-/tmp}/regroup-fuzz.XXXXXX")"
trap 'rm -rf "$work"' EXIT
artifacts="$build/fuzz-artifacts"
mkdir -p "$artifacts"

dictionary() {
  case "$1" in
    fuzz_volcano_yaml) echo "$here/volcano_yaml.dict" ;;
    fuzz_fault_script) echo "$here/fault_script.dict" ;;
    fuzz_coordinator) echo "$here/coordinator.dict" ;;
    *) echo "$here/json.dict" ;;
  esac
}

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:symbolize=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

failed=0
summary=()
for target in "${targets[@]}"; do
  binary="$build/tests/fuzz/$target"
  if [ ! -x "$binary" ]; then
    echo "error: $binary was not built" >&2
    exit 2
  fi
  corpus="$work/corpus/$target"
  mkdir -p "$corpus"
  if [ -d "$here/corpus/$target" ]; then cp -R "$here/corpus/$target/." "$corpus/"; fi
  seeds=("$corpus")
  if [ "${REGROUP_FUZZ_REGRESSIONS:-1}" != 0 ] && [ -d "$here/regressions/$target" ]; then
    seeds+=("$here/regressions/$target")
  fi
  out="$artifacts/$target"
  rm -rf "$out"
  mkdir -p "$out"
  log="$out/fuzz.log"
  dict="$(dictionary "$target")"
  dict_flag=()
  if [ -f "$dict" ]; then dict_flag=(-dict="$dict"); fi

  echo "== $target: ${seconds}s"
  set +e
  "$binary" -max_total_time="$seconds" -max_len=65536 -timeout=30 -rss_limit_mb=4096 \
    -print_final_stats=1 -artifact_prefix="$out/" "${dict_flag[@]}" "${seeds[@]}" >"$log" 2>&1
  rc=$?
  set -e

  execs="$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$log" | tail -n 1)"
  if [ -z "$execs" ]; then
    execs="$(sed -n 's/^#\([0-9][0-9]*\).*/\1/p' "$log" | tail -n 1)"
  fi
  execs="${execs:-0}"
  found=()
  while IFS= read -r -d '' file; do found+=("$file"); done \
    < <(find "$out" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' \
        -o -name 'oom-*' -o -name 'slow-unit-*' \) ! -name 'slow-unit-*' -print0)
  if [ "$rc" -ne 0 ] || [ "${#found[@]}" -gt 0 ]; then
    failed=1
    echo "!! $target: FAILED (exit $rc) after $execs executions"
    for file in "${found[@]}"; do echo "!! $target: input kept at $file"; done
    echo "!! $target: log at $log; its end:"
    grep -E "ERROR: |SUMMARY: |runtime error|==fuzz==|what\\(\\)|#[0-9]+ 0x.* $root/" "$log" |
      head -n 30 | sed 's/^/   /'
    summary+=("$target: $execs executions, CRASH: ${found[*]:-see $log}")
  else
    echo "   $target: $execs executions, no crash"
    summary+=("$target: $execs executions, no crash")
    rm -rf "$out"
  fi
done

echo "== summary (${seconds}s per target)"
printf '   %s\n' "${summary[@]}"
exit "$failed"
