#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# regroup-manager's command line as a user types it: a bad number, address or file is an error
# that names the flag, before anything listens.
set -u
manager=$1
fail() { echo "FAIL: $*"; exit 1; }
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
printf 'flags-token\n' >"$dir/token"
# The managers started here are standalone: each gets the durable record it needs from the
# environment (a --record given wins), but for the case that proves it is needed.
export REGROUP_RECORD_FILE="$dir/record.json"
job=(--job-id t/flags --nodes 1 --listen 127.0.0.1:0 --credential-file "$dir/token")

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
# In a Kubernetes pod given its coordinator token, the coordinator is found with no address given.
out=$(KUBERNETES_SERVICE_HOST=10.96.0.1 REGROUP_COORDINATOR_CREDENTIAL_FILE="$dir/token" timeout 10 \
  "$manager" "${job[@]}" --epoch 5 2>&1); rc=$?
[ $rc -eq 2 ] || fail "in a pod with a coordinator token, --epoch must exit 2, got $rc: $out"
grep -qF "the coordinator is regroup-coordinator.volcano-system.svc:8899" <<<"$out" || fail "in-cluster default: $out"
expect_refused '--listen "127.0.0.1:99999"' --job-id t/flags --nodes 1 --listen 127.0.0.1:99999
expect_refused '--http "127.0.0.1:99999"' "${job[@]}" --http 127.0.0.1:99999
# A manager.py that cannot pass flags takes its addresses from its pod's environment, checked alike.
out=$(REGROUP_MANAGER_HTTP=127.0.0.1:99999 timeout 10 "$manager" "${job[@]}" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -qF -- '--http "127.0.0.1:99999"' <<<"$out" || fail "\$REGROUP_MANAGER_HTTP is checked: $rc $out"
out=$(REGROUP_MANAGER_LISTEN=127.0.0.1:99999 timeout 10 "$manager" --job-id t/flags --nodes 1 2>&1); rc=$?
[ $rc -eq 2 ] && grep -qF -- '--listen "127.0.0.1:99999"' <<<"$out" || fail "\$REGROUP_MANAGER_LISTEN: $rc $out"
out=$(REGROUP_MANAGER_LISTEN=127.0.0.1:99999 timeout 10 "$manager" "${job[@]}" --http 127.0.0.1:99999 2>&1)
grep -qF -- '--http' <<<"$out" || fail "--listen given beats \$REGROUP_MANAGER_LISTEN: $out"
expect_refused '--listen "localhost"' --job-id t/flags --nodes 1 --listen localhost
# The coordinator's TLS: a CA that cannot be read, or a name without a CA, never means plaintext.
expect_refused "--coordinator-ca: cannot read the TLS CA file $dir/none.crt" "${job[@]}" \
  --coordinator 127.0.0.1:1 --coordinator-ca "$dir/none.crt"
expect_refused "--coordinator-ca: the TLS CA file $dir is a directory" "${job[@]}" \
  --coordinator 127.0.0.1:1 --coordinator-ca "$dir"
expect_refused "--coordinator-server-name: the TLS server name c.svc needs a CA file" "${job[@]}" \
  --coordinator 127.0.0.1:1 --coordinator-server-name c.svc
# This manager's certificate for a coordinator that requires one (mutual TLS): a key that does
# not match it, or one given alone, is named before anything connects.
for name in ca other; do
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$dir/$name.key" \
    -out "$dir/$name.crt" -days 2 -subj "/CN=$name" 2>>"$dir/openssl.log" || fail "openssl: $(cat "$dir/openssl.log")"
done
expect_refused "--coordinator-tls-cert/--coordinator-tls-key: the TLS key $dir/other.key does not match the TLS certificate $dir/ca.crt" \
  "${job[@]}" --coordinator 127.0.0.1:1 --coordinator-ca "$dir/ca.crt" \
  --coordinator-tls-cert "$dir/ca.crt" --coordinator-tls-key "$dir/other.key"
out=$(REGROUP_COORDINATOR_TLS_KEY_FILE="$dir/ca.key" timeout 10 "$manager" "${job[@]}" \
  --coordinator 127.0.0.1:1 --coordinator-ca "$dir/ca.crt" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -qF "the key $dir/ca.key is given alone" <<<"$out" \
  || fail "\$REGROUP_COORDINATOR_TLS_KEY_FILE alone must be refused by name: $rc $out"

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
echo '{"version": 1, "job_id": "t/other", "epoch": 5, "leader_epoch": 5, "generation": 1, "members": [], "lost": []}' \
  >"$dir/other.json"
expect_refused "is the record of job t/other, not t/flags" "${job[@]}" --record "$dir/other.json"
echo '{"version": 1, "job_id": "t/flags"' >"$dir/torn.json"
expect_refused "$dir/torn.json: the job record is not a JSON object" "${job[@]}" --record "$dir/torn.json"
# Issue 40, finding 5: an epoch of 2^64-1 wrapped (the manager fenced itself at every start and
# the log said nothing); -5 read as 2^64-5. Refused at the start, naming the file, field and value.
for epoch in 18446744073709551615 -5; do
  printf '{"version":1,"job_id":"t/flags","epoch":%s,"leader_epoch":0,"generation":0,"members":[],"lost":[]}' \
    "$epoch" >"$dir/epoch.json"
  expect_refused "--record: $dir/epoch.json: the job record's \"epoch\" is $epoch" "${job[@]}" \
    --record "$dir/epoch.json"
done
mkdir "$dir/record-dir"
expect_refused "the job record file $dir/record-dir is a directory" "${job[@]}" --record "$dir/record-dir"

# Issue 40, finding 1: two standalone managers of one job without a record both trained. A manager
# with no coordinator and no record is refused, naming the fix; --no-record starts it, warned.
out=$(env -u REGROUP_RECORD_FILE timeout 10 "$manager" "${job[@]}" 2>&1); rc=$?
[ $rc -eq 2 ] || fail "no --record and no --no-record must exit 2, got $rc: $out"
grep -qF -- "no durable record: a manager without --coordinator is fenced only by its job's record. Give --record FILE" \
  <<<"$out" || fail "no record: the message must name --record FILE: $out"
grep -qF -- "or give --no-record to accept the risk" <<<"$out" || fail "no record: name --no-record: $out"
env -u REGROUP_RECORD_FILE "$manager" "${job[@]}" --no-record --port-file "$dir/norecord.port" \
  >"$dir/norecord.log" 2>&1 &
pid=$!
for _ in $(seq 200); do [ -s "$dir/norecord.port" ] && break; sleep 0.05; done
kill $pid 2>/dev/null; wait $pid 2>/dev/null
[ -s "$dir/norecord.port" ] || fail "--no-record must start the manager: $(cat "$dir/norecord.log")"
grep -qF -- "regroup-manager: --no-record: no durable record and no coordinator: nothing fences another manager" \
  "$dir/norecord.log" || fail "--no-record must be logged as a warning: $(cat "$dir/norecord.log")"
expect_refused "--no-record cannot be given with a record ($dir/record.json" "${job[@]}" --no-record

# No credential: refused unless --insecure, which then starts with a warning saying so.
out=$(env -u REGROUP_CREDENTIAL_FILE -u REGROUP_CREDENTIAL timeout 10 "$manager" --job-id t/flags \
  --nodes 1 --listen 127.0.0.1:0 2>&1); rc=$?
[ $rc -eq 2 ] || fail "no credential must exit 2, got $rc: $out"
grep -qF -- "no job credential: give --credential-file (or \$REGROUP_CREDENTIAL_FILE, \$REGROUP_CREDENTIAL), or --insecure" \
  <<<"$out" || fail "no credential: $out"
env -u REGROUP_CREDENTIAL_FILE -u REGROUP_CREDENTIAL "$manager" --job-id t/flags --nodes 1 \
  --listen 127.0.0.1:0 --insecure --port-file "$dir/insecure.port" >"$dir/insecure.log" 2>&1 &
pid=$!
for _ in $(seq 200); do [ -s "$dir/insecure.port" ] && break; sleep 0.05; done
kill $pid 2>/dev/null; wait $pid 2>/dev/null
[ -s "$dir/insecure.port" ] || fail "--insecure must start the manager: $(cat "$dir/insecure.log")"
grep -qF -- "--insecure: no job credential, any client reaching 127.0.0.1:0" "$dir/insecure.log" \
  || fail "--insecure must be logged as a warning: $(cat "$dir/insecure.log")"
# A manager given only the job id and sizes (a MindCluster manager.py) says where its strategy
# came from, and that recovery is off.
grep -qF -- "0 labels and 0 annotations from nowhere (no --job, --label or --annotation)" \
  "$dir/insecure.log" || fail "the configuration's source must be logged: $(cat "$dir/insecure.log")"
grep -qF -- "process-level recovery is off" "$dir/insecure.log" \
  || fail "recovery off must be a warning: $(cat "$dir/insecure.log")"
# Keys read elsewhere (regroup.api from the Kubernetes API) are logged with where they came from.
env -u REGROUP_CREDENTIAL_FILE -u REGROUP_CREDENTIAL "$manager" --job-id t/flags --nodes 1 \
  --listen 127.0.0.1:0 --insecure --port-file "$dir/keys.port" --label fault-scheduling=force \
  --annotation recover-strategy=recover,exit --keys-source "the Kubernetes API: Job t/flags" \
  >"$dir/keys.log" 2>&1 &
pid=$!
for _ in $(seq 200); do [ -s "$dir/keys.port" ] && break; sleep 0.05; done
kill $pid 2>/dev/null; wait $pid 2>/dev/null
grep -qF -- "1 labels and 1 annotations from the Kubernetes API: Job t/flags" "$dir/keys.log" \
  || fail "--keys-source must name where the keys came from: $(cat "$dir/keys.log")"
echo "regroup-manager flags: ok"
