#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# regroupctl as a user runs it: exit codes and the messages a user reads.
set -u
ctl=$1; src=$2; manager=${3:-}
fail() { echo "FAIL: $*"; exit 1; }

out=$("$ctl" validate "$src/examples/jobs/elastic-job.yaml") || fail "the example job must validate: $out"
grep -q "ok: job default/llama-elastic, 4 pods x 8 processes" <<<"$out" || fail "validate said: $out"

out=$("$ctl" validate "$src/examples/jobs/bad-regroup-key.yaml"); rc=$?
[ $rc -eq 1 ] || fail "a bad job must exit 1, got $rc"
for want in \
  'warning: annotation wait-reschedule-timeout="500" is not allowed (an integer from 30 to 270); using "270" as MindCluster does' \
  'error: annotation regroup.io/min-data-parallel="zero" is invalid: it must be an integer from 1 to 65536' \
  'error: a replica of tensor x pipeline = 3x1=3 ranks does not line up with 8 processes per pod' \
  'error: the Volcano policy spec.policies[0] (PodEvicted -> RestartJob) would restart the whole job' \
  'error: minAvailable 5 is more than the job'"'"'s 4 pods; set minAvailable to 1, or to every pod (4'; do
  grep -qF -- "$want" <<<"$out" || fail "validate did not report: $want; it said: $out"
done

out=$("$ctl" validate "$src/examples/jobs/bad-regroup-key.yaml" --json) ; [ $? -eq 1 ] || fail "--json exit code"
grep -q '"severity": "error"' <<<"$out" || fail "--json report: $out"

out=$("$ctl" validate /nonexistent.yaml 2>&1); [ $? -ne 0 ] || fail "a missing file must fail"

out=$("$ctl" simulate "$src/examples/jobs/elastic-job.yaml" "$src/examples/faults/node-loss.txt") \
  || fail "simulate failed: $out"
for want in "restart_in_place [recover-in-place]" "wait [recover]" "scale_in [elastic-training]" \
            "scale_out [elastic-training]" "end: phase running, dp 4 of 4"; do
  grep -qF -- "$want" <<<"$out" || fail "simulate did not show: $want; it said: $out"
done

# MindCluster's job-level rescheduling: every pod replaced, every process back at the newest
# checkpoint, the job running again at full size once capacity returns.
out=$("$ctl" simulate "$src/examples/jobs/mindcluster-rescheduling.yaml" \
      "$src/examples/faults/node-lost-then-back.txt") || fail "simulate failed: $out"
for want in "restart_job [job-rescheduling] phase=restarting" "reschedule 1 of 5" \
            "every process restarts from the newest checkpoint, step 60; 5 steps are done again" \
            "replacement for pod 3 bound to node-8" "resume [job-rescheduling] phase=running dp=4" \
            "end: phase running, dp 4 of 4"; do
  grep -qF -- "$want" <<<"$out" || fail "simulate did not show: $want; it said: $out"
done

# A job's token at the coordinator: HMAC-SHA256 of the job's id and uid under the cluster key
# (common/job_token.h), the value `printf 'regroup-job-v1\0team-a/victim\0c0ffee-uid' |
# openssl dgst -sha256 -hmac k3y` gives.
keyf=$(mktemp); printf 'k3y\n' >"$keyf"
out=$("$ctl" token --cluster-key-file "$keyf" --job team-a/victim --uid c0ffee-uid) || fail "token: $out"
[ "$out" = 29ae38b9ef0a12788d74ee08b95e28360fab9489bc2541d3e198e0da941ffd3d ] || fail "token printed: $out"
out2=$("$ctl" token --cluster-key-file "$keyf" --job team-b/victim --uid c0ffee-uid)
[ "$out2" != "$out" ] || fail "two jobs got the same token"
out=$("$ctl" token --cluster-key-file /nonexistent/key --job a/b --uid u 2>&1); rc=$?
[ $rc -eq 2 ] || fail "a missing key file must exit 2, got $rc"
grep -qF "/nonexistent/key" <<<"$out" || fail "token with a missing key said: $out"
out=$("$ctl" token --cluster-key-file "$keyf" --job a/b --uid "" 2>&1); rc=$?
[ $rc -eq 2 ] || fail "an empty uid must exit 2, got $rc: $out"
grep -qF -- "--uid must be the job's metadata.uid" <<<"$out" || fail "token with an empty uid said: $out"
for bad in victim /victim team-a/ team-a/victim/x; do
  out=$("$ctl" token --cluster-key-file "$keyf" --job "$bad" --uid u 2>&1); rc=$?
  [ $rc -eq 2 ] || fail "token for job id '$bad' must exit 2, got $rc: $out"
  grep -qF -- "--job must be the job's NAMESPACE/NAME" <<<"$out" || fail "token for '$bad' said: $out"
done
rm -f "$keyf"

tmp=$(mktemp); trap 'rm -f "$tmp"' EXIT
printf '10s node node-1 melts\n' >"$tmp"
out=$("$ctl" simulate "$src/examples/jobs/elastic-job.yaml" "$tmp" 2>&1); rc=$?
[ $rc -eq 2 ] || fail "a bad script must exit 2, got $rc"
grep -qF 'fault script line 1: a node fails, recovers or joins, not "melts"' <<<"$out" || fail "$out"

# Bytes that are not UTF-8 in a job's values are reported, never a crash.
printf 'kind: Job\nmetadata:\n  name: x\n  annotations:\n    recover-strategy: "\xff"\nspec:\n  tasks: [{replicas: 1}]\n' >"$tmp"
out=$("$ctl" validate "$tmp" --json 2>&1); rc=$?
[ $rc -eq 2 ] || fail "invalid UTF-8: validate must refuse the document (exit 2), got $rc: $out"
grep -q "not valid UTF-8" <<<"$out" || fail "invalid UTF-8 report: $out"

# Every input is read up to a limit: a device or an endless pipe is refused, never read whole.
out=$(timeout 20 "$ctl" validate /dev/zero 2>&1); rc=$?
[ $rc -eq 2 ] || fail "/dev/zero: validate must refuse it (exit 2), got $rc: $out"
grep -qF "/dev/zero is larger than 4 MiB" <<<"$out" || fail "/dev/zero report: $out"
out=$(yes 'kind: Job' | timeout 20 "$ctl" validate /dev/stdin 2>&1); rc=$?
[ $rc -eq 2 ] || fail "an endless pipe: validate must refuse it (exit 2), got $rc: $out"
out=$(timeout 20 "$ctl" simulate "$src/examples/jobs/elastic-job.yaml" /dev/zero 2>&1); rc=$?
[ $rc -eq 2 ] || fail "/dev/zero as a fault script must be refused (exit 2), got $rc: $out"

# Issue 40, finding 8: a numeric flag that is not a number exited 104 with CLI11's bare words.
for flag in --timeout-ms; do
  out=$(timeout 20 "$ctl" status $flag abc 2>&1); rc=$?
  [ $rc -eq 2 ] || fail "status $flag abc must exit 2, got $rc: $out"
  grep -qF "error: $flag: \"abc\" is not a number" <<<"$out" || fail "status $flag abc: $out"
done

out=$("$ctl" keys) || fail "keys"
grep -qF '`wait-reschedule-timeout` | annotation | an integer from 30 to 270 | 270' <<<"$out" || fail "$out"

# The configuration reference's table is generated (regroupctl keys).
docs_table=$(sed -n '/<!-- keys:begin -->/,/<!-- keys:end -->/p' "$src/docs/configuration.md" | sed '1d;$d')
[ -n "$docs_table" ] || fail "docs/configuration.md has no table between the keys:begin/keys:end markers"
[ "$docs_table" = "$out" ] || fail "docs/configuration.md's configuration table is stale: regenerate it
  with build/regroupctl keys and paste it between the keys:begin/keys:end markers"
# convert: every MindCluster example becomes a Volcano Job that validates; the report is on
# stderr, the job on stdout or in -o's file.
conv=$(mktemp -d); trap 'rm -rf "$tmp" "$conv"' EXIT
for f in "$src"/examples/mindcluster/*.yaml; do
  name=$(basename "$f" .yaml)
  "$ctl" convert "$f" -o "$conv/$name.yaml" 2>"$conv/$name.report" \
    || fail "convert $name failed: $(cat "$conv/$name.report")"
  if [ "$name" = pytorch-resnet50-910b ]; then
    # MindCluster's plain job has no recovery keys: convert and validate both say so, naming
    # the keys to add, and nothing else.
    want="warning: recovery is off for this job: a fault ends it. To recover, add the label fault-scheduling=force"
    grep -qF "$want" "$conv/$name.report" || fail "convert $name report: $(cat "$conv/$name.report")"
    out=$("$ctl" validate "$conv/$name.yaml"); rc=$?
    [ $rc -eq 1 ] && grep -qF "$want" <<<"$out" && [ "$(grep -c warning <<<"$out")" -eq 1 ] \
      || fail "validate of converted $name (exit $rc) said: $out"
    continue
  fi
  grep -qF "$f: the converted job passes \`regroupctl validate\`" "$conv/$name.report" \
    || fail "convert $name report: $(cat "$conv/$name.report")"
  out=$("$ctl" validate "$conv/$name.yaml") || fail "the converted $name must validate: $out"
  grep -qF "ok: job" <<<"$out" || fail "validate of converted $name said: $out"
done
# A key the strategies leave unused is named: the seed's wait-reschedule-timeout without
# `recover` among the strategies.
sed 's|recover-strategy: .*|recover-strategy: "retry,elastic-training,exit"|' \
  "$src/examples/mindcluster/pytorch-elastic-910b.yaml" >"$tmp"
grep -q 'recover-strategy: "retry,elastic-training,exit"' "$tmp" || fail "the example's recover-strategy moved"
out=$("$ctl" convert "$tmp" -o "$conv/unused.yaml" 2>&1)
grep -qF 'warning: annotation wait-reschedule-timeout="' <<<"$out" || fail "an unused wait-reschedule-timeout: $out"
grep -qF 'is not used: it is how long `recover` waits for a replacement' <<<"$out" || fail "$out"
grep -qF 'ok: job training/llama-pretrain, 4 pods x 8 processes' \
  <<<"$("$ctl" validate "$conv/pytorch-elastic-910b.yaml")" || fail "converted elastic job"
report=$(cat "$conv/pytorch-elastic-910b.report")
for want in \
  "$src/examples/mindcluster/pytorch-elastic-910b.yaml: converted AscendJob training/llama-pretrain into a Volcano Job: 4 training pods x 8 processes and a manager" \
  '  changed spec.runPolicy.schedulingPolicy.minAvailable 4 -> spec.minAvailable 3: the job'"'"'s elastic minimum (2 training pods for regroup.io/min-data-parallel=2, and the manager)' \
  '  changed spec.tasks[worker].template.spec.containers[0].command: torchrun -> regroup-agent' \
  '  kept    metadata.labels, metadata.annotations: framework, ring-controller.atlas, tor-affinity, fault-scheduling, fault-retry-times, pod-rescheduling, process-recover-enable, recover-strategy, wait-reschedule-timeout,' \
  '  check   Secret llama-pretrain-regroup-credential: create it before the job: kubectl create secret generic llama-pretrain-regroup-credential -n training --from-literal=token=$(openssl rand -hex 32)'; do
  grep -qF -- "$want" <<<"$report" || fail "convert did not report: $want; it said: $report"
done
out=$("$ctl" convert "$src/examples/mindcluster/pytorch-gpu-workers.yaml" 2>/dev/null) || fail "convert to stdout"
grep -qx 'kind: Job' <<<"$out" || fail "convert printed: $out"
grep -qx 'kind: ConfigMap' <<<"$out" || fail "convert must keep the other document: $out"
grep -qF -- '- "regroup-agent"' <<<"$out" || fail "convert must start regroup-agent: $out"
# Refused input: exit 2 and the reason; nothing on stdout.
out=$("$ctl" convert "$src/examples/jobs/elastic-job.yaml" 2>&1 >/dev/null); rc=$?
[ $rc -eq 2 ] || fail "converting a Volcano Job must exit 2, got $rc"
grep -qF 'error: kind is "Job"; expected a MindCluster AscendJob (kind: AscendJob, apiVersion: mindxdl.gitee.com/v1); a Volcano Job needs no conversion' <<<"$out" || fail "$out"
printf 'apiVersion: mindxdl.gitee.com/v1\nkind: AscendJob\nmetadata: {name: "\xff"}\n' >"$tmp"
out=$("$ctl" convert "$tmp" 2>&1); rc=$?
[ $rc -eq 2 ] || fail "non-UTF-8 input must exit 2, got $rc"
grep -qF "error: the YAML document is not valid UTF-8 (byte 67)" <<<"$out" || fail "$out"
printf 'apiVersion: mindxdl.gitee.com/v1\nkind: AscendJob\nmetadata: {name: j}\nspec: {}\n' >"$tmp"
out=$("$ctl" convert "$tmp" 2>&1); rc=$?
[ $rc -eq 2 ] || fail "an AscendJob without replicaSpecs must exit 2, got $rc"
grep -qF "error: spec.replicaSpecs is missing: an AscendJob lists its pods there (Master and Worker)" <<<"$out" || fail "$out"
# A job whose Regroup keys are wrong is converted, and exits 1 with validate's error.
sed 's|regroup.io/min-data-parallel: "2"|regroup.io/min-data-parallel: "zero"|' \
  "$src/examples/mindcluster/pytorch-elastic-910b.yaml" >"$tmp"
out=$("$ctl" convert "$tmp" -o "$conv/bad.yaml" 2>&1); rc=$?
[ $rc -eq 1 ] || fail "a converted job that does not validate must exit 1, got $rc"
grep -qF 'error: annotation regroup.io/min-data-parallel="zero" is invalid' <<<"$out" || fail "$out"
[ -s "$conv/bad.yaml" ] || fail "the job must still be written"

# An AscendJob as written validates as `convert` would make it, naming every change convert makes.
out=$("$ctl" validate "$src/examples/mindcluster/pytorch-elastic-910b.yaml") ||
  fail "an AscendJob that converts to a valid job must validate: $out"
grep -qF "would convert AscendJob training/llama-pretrain into a Volcano Job" <<<"$out" || fail "$out"
grep -qF "changed kind: AscendJob (mindxdl.gitee.com/v1) -> Job" <<<"$out" || fail "$out"
grep -qF "ok: job training/llama-pretrain, 4 pods x 8 processes, as \`regroupctl convert\` writes it" <<<"$out" ||
  fail "$out"
"$ctl" validate --json "$src/examples/mindcluster/pytorch-elastic-910b.yaml" | grep -qF '"converted_from": "AscendJob"' ||
  fail "validate --json of an AscendJob must say it was converted"
# ...one whose converted job has a problem exits 1 naming it; one that does not convert, 2.
out=$("$ctl" validate "$src/examples/mindcluster/pytorch-resnet50-910b.yaml"); rc=$?
[ $rc -eq 1 ] || fail "an AscendJob with recovery off must exit 1, got $rc: $out"
grep -qF "warning: recovery is off for this job" <<<"$out" || fail "$out"
printf 'apiVersion: mindxdl.gitee.com/v1\nkind: AscendJob\nmetadata: {name: a}\n' >"$tmp"
out=$("$ctl" validate "$tmp" 2>&1); rc=$?
[ $rc -eq 2 ] || fail "an AscendJob that cannot convert must exit 2, got $rc: $out"
grep -qF "error: spec is missing or not a map" <<<"$out" || fail "$out"

# The deployment example validates.
out=$("$ctl" validate "$src/deploy/examples/pytorch-job.yaml") || fail "deploy/examples/pytorch-job.yaml must validate: $out"
grep -qF "ok: job default/gpt-elastic, 4 pods x 8 processes" <<<"$out" || fail "validate said: $out"
# ...and so does the pilot's (no scheduler plugin: the manager decides alone), without a warning.
out=$("$ctl" validate "$src/deploy/examples/pilot-job.yaml") || fail "deploy/examples/pilot-job.yaml must validate: $out"
[ "$out" = "$src/deploy/examples/pilot-job.yaml: ok: job default/gpt-pilot, 2 pods x 8 processes" ] ||
  fail "validate said: $out"

# status, against a real manager (port chosen by the system; the manager is stopped on exit).
if [ -n "$manager" ]; then
  dir=$(mktemp -d)
  printf 's3cret\n' >"$dir/cred"
  "$manager" --job-id default/status-test --nodes 2 --nproc-per-node 2 --listen 127.0.0.1:0 \
    --port-file "$dir/port" --credential-file "$dir/cred" --record "$dir/record.json" >"$dir/log" 2>&1 &
  mpid=$!
  trap 'kill $mpid 2>/dev/null; wait $mpid 2>/dev/null; rm -rf "$dir" "$tmp" "$conv"' EXIT
  for _ in $(seq 100); do [ -s "$dir/port" ] && break; sleep 0.05; done
  [ -s "$dir/port" ] || fail "the manager did not start: $(cat "$dir/log")"
  addr=127.0.0.1:$(cat "$dir/port")
  out=$("$ctl" status --manager "$addr" --credential-file "$dir/cred") || fail "status: $out"
  grep -qF "job default/status-test: joining, epoch" <<<"$out" || fail "status said: $out"
  grep -qE "^ +1  missing" <<<"$out" || fail "status nodes: $out"
  out=$("$ctl" status --manager "$addr" --credential-file "$dir/cred" --json) || fail "$out"
  grep -qF '"job_id": "default/status-test"' <<<"$out" || fail "status --json: $out"
  out=$(REGROUP_CREDENTIAL=wrong "$ctl" status --manager "$addr" 2>&1); rc=$?
  [ $rc -eq 1 ] || fail "a wrong credential must fail"
  grep -qF "a wrong credential" <<<"$out" || fail "status with a wrong credential said: $out"
fi
echo "regroupctl: all checks passed"
