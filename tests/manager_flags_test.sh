#!/usr/bin/env bash
# regroup-manager's command line as a user types it: a bad number, address or file is an error
# that names the flag, before anything listens.
set -u
manager=$1
fail() { echo "FAIL: $*"; exit 1; }
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
job=(--job-id t/flags --nodes 1 --listen 127.0.0.1:0)

expect_refused() {  # expect_refused WANT ARGS...: exit 2 and WANT in the message
  local want=$1; shift
  out=$(timeout 10 "$manager" "$@" 2>&1); rc=$?
  [ $rc -eq 2 ] || fail "$* must exit 2, got $rc: $out"
  grep -qF -- "$want" <<<"$out" || fail "$*: the message must name '$want'; it said: $out"
}
expect_refused "--nodes" --job-id t/flags --nodes 2000000000
expect_refused "--nproc-per-node" --job-id t/flags --nodes 1 --nproc-per-node 2000000000
expect_refused "--epoch" "${job[@]}" --epoch -1
# The coordinator grants the epoch: a manager never takes one from a flag when it has one.
expect_refused "--epoch cannot be given with --coordinator" "${job[@]}" --epoch 5 --coordinator 127.0.0.1:1
expect_refused '--listen "127.0.0.1:99999"' --job-id t/flags --nodes 1 --listen 127.0.0.1:99999
expect_refused '--http "127.0.0.1:99999"' "${job[@]}" --http 127.0.0.1:99999
expect_refused '--listen "localhost"' --job-id t/flags --nodes 1 --listen localhost

mkdir "$dir/ro" && chmod 0500 "$dir/ro"
if [ "$(id -u)" -ne 0 ] || ! touch "$dir/ro/probe" 2>/dev/null; then
  out=$(timeout 10 "$manager" "${job[@]}" --port-file "$dir/ro/port" 2>&1); rc=$?
  [ $rc -eq 1 ] || fail "an unwritable --port-file must exit 1, got $rc: $out"
  grep -qF -- "--port-file: cannot write $dir/ro/port" <<<"$out" || fail "port file message: $out"
fi
out=$(timeout 10 "$manager" "${job[@]}" --port-file "$dir/no/such/dir/port" 2>&1); rc=$?
[ $rc -eq 1 ] || fail "a --port-file in a missing folder must exit 1, got $rc: $out"
grep -qF -- "--port-file: cannot write $dir/no/such/dir/port" <<<"$out" || fail "port file: $out"
# The durable record: a corrupt one, or another job's, is refused by name (never taken as none).
echo '{"version": 1, "job_id": "t/other", "epoch": 5, "generation": 1, "members": [], "lost": []}' \
  >"$dir/other.json"
expect_refused "is the record of job t/other, not t/flags" "${job[@]}" --record "$dir/other.json"
echo '{"version": 1, "job_id": "t/flags"' >"$dir/torn.json"
expect_refused "$dir/torn.json: the job record is not a JSON object" "${job[@]}" --record "$dir/torn.json"
mkdir "$dir/record-dir"
expect_refused "the job record file $dir/record-dir is a directory" "${job[@]}" --record "$dir/record-dir"
echo "regroup-manager flags: ok"
