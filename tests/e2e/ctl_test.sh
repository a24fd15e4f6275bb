#!/usr/bin/env bash
# harrier-ctl against 2 real shards (job token, checkpoints) and a real
# worker training the MLP: status (text and --json) with the values the job
# has, health, checkpoint, the token refusals, usage errors, and a shutdown
# that stops both shards with a final checkpoint each.
set -uo pipefail
root="$TEST_SRCDIR/${TEST_WORKSPACE:-harrier}"
server="$root/server/harrier-server"
worker="$root/worker/harrier-worker"
ctl="$root/server/harrier-ctl"
python=/usr/bin/python3
tmp=$TEST_TMPDIR
passed=0
failed=0
check() { if eval "$2"; then echo "PASS $1"; passed=$((passed + 1)); else echo "FAIL $1"; failed=$((failed + 1)); fi; }
# Waits at most $2 s for process $1, then kills it; returns its exit status.
wait_for() { timeout "$2" tail --pid="$1" -f /dev/null; kill -KILL "$1" 2>/dev/null; wait "$1"; }
# A field of a --json status: json_get FILE 'python expression on s'.
json_get() { "$python" -c "import json, sys; s = json.load(open(sys.argv[1])); print($2)" "$1" 2>/dev/null; }
pids=()
trap 'kill -KILL "${pids[@]}" 2>/dev/null; wait 2>/dev/null' EXIT

# The MLP's default layers 784,256,256,10: weights and biases, float32.
mlp_bytes=$(( (784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10) * 4 ))

printf 'ctl-test-token\n' >"$tmp/token"
chmod 600 "$tmp/token"
mkdir -p "$tmp/ckpt"
for shard in 0 1; do
  "$server" --host=127.0.0.1 --port=0 --port_file="$tmp/port$shard" --shard=$shard --num_shards=2 \
    --num_workers=1 --checkpoint_dir="$tmp/ckpt" --auth_token_file="$tmp/token" \
    --exit_when_done=false --health_port=0 --shutdown_grace_ms=1000 2>"$tmp/server$shard.log" &
  pids+=($!)
  server_pid[$shard]=$!
done
for _ in $(seq 300); do [ -s "$tmp/port0" ] && [ -s "$tmp/port1" ] && break; sleep 0.1; done
a0="127.0.0.1:$(cat "$tmp/port0")"
a1="127.0.0.1:$(cat "$tmp/port1")"
servers="$a0,$a1"
health_port0=$(sed -n 's/.*serving shard=0.* health_port=\([0-9]*\).*/\1/p' "$tmp/server0.log")
auth=(--servers="$servers" --auth_token_file="$tmp/token")

# Usage errors: exit 2 with the usage.
"$ctl" "${auth[@]}" >/dev/null 2>"$tmp/usage.err"
check "no command: exit 2 with the usage" "[ $? -eq 2 ] && grep -q 'no command' '$tmp/usage.err' && grep -q '^Usage: harrier-ctl' '$tmp/usage.err'"
"$ctl" "${auth[@]}" frobnicate >/dev/null 2>"$tmp/usage.err"
check "unknown command: exit 2 naming it" "[ $? -eq 2 ] && grep -q \"unknown command 'frobnicate'\" '$tmp/usage.err'"
HARRIER_TIMEOUT_MS=1000 "$server" --help >/dev/null 2>"$tmp/env.err"
check "harrier-server accepts harrier-ctl's HARRIER_TIMEOUT_MS" "! grep -q 'unknown HARRIER_' '$tmp/env.err'"

# Health before any worker: every shard SERVING; also on the plaintext
# health port, and through HARRIER_SERVERS.
"$ctl" --servers="$servers" health >"$tmp/health.out" 2>&1
rc=$?
check "health: exit 0 with both shards up" "[ $rc -eq 0 ]"
check "health: one SERVING line per shard" "grep -qx '$a0 SERVING' '$tmp/health.out' && grep -qx '$a1 SERVING' '$tmp/health.out'"
HARRIER_SERVERS="127.0.0.1:$health_port0" "$ctl" health --timeout_ms=2000 >"$tmp/health_port.out" 2>&1
check "health on --health_port via HARRIER_SERVERS (port '$health_port0')" "[ $? -eq 0 ] && grep -qx '127.0.0.1:$health_port0 SERVING' '$tmp/health_port.out'"

"$ctl" "${auth[@]}" --json status >"$tmp/waiting.json" 2>"$tmp/waiting.err"
check "status before any worker: exit 0, job state waiting" "[ $? -eq 0 ] && [ \"\$(json_get '$tmp/waiting.json' 's[\"job_state\"]')\" = waiting ]"

# The worker: slow steps, so the job is seen running.
"$worker" --servers="$servers" --auth_token_file="$tmp/token" --num_workers=1 --rank=0 \
  --train_examples=6000 --batch_size=32 --epochs=100 --max_steps=300 --step_delay_ms=20 \
  --log_every=50 >"$tmp/w0.out" 2>"$tmp/w0.err" &
w0=$!
pids+=("$w0")

# Poll until rank 0 has pushed (next clock > 0) on every shard's view.
seen=no
for _ in $(seq 300); do
  if "$ctl" "${auth[@]}" --json status >"$tmp/running.json" 2>/dev/null &&
    [ "$(json_get "$tmp/running.json" 's["ranks"][0]["next_clock"] > 0 and s["job_state"] == "running"')" = True ]; then
    seen=yes
    break
  fi
  sleep 0.1
done
worker_alive=$(kill -0 "$w0" 2>/dev/null && echo yes || echo no)
check "status while training: job running, rank 0 next clock > 0 (worker alive: $worker_alive)" "[ $seen = yes ] && [ $worker_alive = yes ]"
check "--json parses (python3 -m json.tool)" "'$python' -m json.tool '$tmp/running.json' >/dev/null"
check "json: rank 0 present, epoch >= 1, heard within 5 s" "[ \"\$(json_get '$tmp/running.json' 's[\"ranks\"][0][\"state\"] == \"present\" and s[\"ranks\"][0][\"epoch\"] >= 1 and 0 <= s[\"ranks\"][0][\"last_heard_ms_ago\"] < 5000')\" = True ]"
check "json: job, job_id and 2 shards" "[ \"\$(json_get '$tmp/running.json' 's[\"job\"] == \"harrier\" and \"job_id\" in s and len(s[\"shards\"]) == 2 and s[\"failure\"] == \"\"')\" = True ]"
check "json: every shard holds keys and has received bytes" "[ \"\$(json_get '$tmp/running.json' 'all(x[\"keys\"] > 0 and x[\"chunks\"] > 0 and x[\"bytes_in\"] > 0 and x[\"bytes_out\"] > 0 for x in s[\"shards\"])')\" = True ]"
param_total=$(json_get "$tmp/running.json" 'sum(x["param_bytes"] for x in s["shards"])')
check "json: param bytes over the shards = the MLP's $mlp_bytes (got $param_total)" "[ '$param_total' = '$mlp_bytes' ]"

"$ctl" "${auth[@]}" status >"$tmp/status.txt" 2>"$tmp/status.err"
rc=$?
sed 's/^/  | /' "$tmp/status.txt"
sed 's/^/  | /' "$tmp/running.json"
check "status (text): exit 0" "[ $rc -eq 0 ]"
check "status (text): job line with state and sync" "grep -Eq '^job harrier  job_id [0-9]+  state running  sync bsp' '$tmp/status.txt'"
check "status (text): rank 0 present with a clock > 0" "awk '\$1 == \"0\" && \$2 == \"present\" && \$3 > 0 { found = 1 } END { exit !found }' '$tmp/status.txt'"
text_total=$(awk -v a0="$a0" -v a1="$a1" '($2 == a0 || $2 == a1) && $3 > 0 { sum += $5 } END { print sum }' "$tmp/status.txt")
check "status (text): both shards listed, param bytes agree with --json ($text_total)" "[ '$text_total' = '$mlp_bytes' ]"

# Checkpoints now: each shard names a file that exists; the version grows.
"$ctl" "${auth[@]}" checkpoint >"$tmp/ckpt1.out" 2>"$tmp/ckpt1.err"
check "checkpoint: exit 0, one line per shard" "[ $? -eq 0 ] && [ \$(grep -c '^shard=[01] version=[0-9]* path=' '$tmp/ckpt1.out') -eq 2 ]"
path0=$(sed -n 's/^shard=0 version=[0-9]* path=//p' "$tmp/ckpt1.out")
path1=$(sed -n 's/^shard=1 version=[0-9]* path=//p' "$tmp/ckpt1.out")
check "checkpoint: the files it names exist and are non-empty ($path0, $path1)" "[ -s '$path0' ] && [ -s '$path1' ] && [ '$path0' != '$path1' ]"
v1=$(sed -n 's/^shard=0 version=\([0-9]*\) .*/\1/p' "$tmp/ckpt1.out")
"$ctl" "${auth[@]}" checkpoint >"$tmp/ckpt2.out" 2>"$tmp/ckpt2.err"
v2=$(sed -n 's/^shard=0 version=\([0-9]*\) .*/\1/p' "$tmp/ckpt2.out")
check "checkpoint again: shard 0's version grows ($v1 -> $v2)" "[ -n '$v1' ] && [ -n '$v2' ] && [ '$v2' -gt '$v1' ]"
"$ctl" "${auth[@]}" --json status >"$tmp/after_ckpt.json" 2>/dev/null
check "status shows that checkpoint: version $v2, age < 30 s" "[ \"\$(json_get '$tmp/after_ckpt.json' 's[\"shards\"][0][\"checkpoint_version\"] == $v2 and 0 <= s[\"shards\"][0][\"checkpoint_age_seconds\"] < 30')\" = True ]"

# Without the token: every command but health is refused, naming the shard.
for command in status checkpoint shutdown; do
  "$ctl" --servers="$servers" "$command" >/dev/null 2>"$tmp/notoken.err"
  rc=$?
  check "$command without the token: exit 1, UNAUTHENTICATED naming the shard" "[ $rc -eq 1 ] && grep -q 'shard 0 ($a0).*UNAUTHENTICATED' '$tmp/notoken.err'"
done
"$ctl" --servers="$servers" health >/dev/null 2>&1
check "the refused shutdown stopped nothing (health still 0)" "[ $? -eq 0 ]"

# A shard that does not answer: shown unreachable, exit 1.
"$ctl" --servers="$servers,127.0.0.1:1" --auth_token_file="$tmp/token" --timeout_ms=2000 status >"$tmp/partial.txt" 2>"$tmp/partial.err"
check "status with a dead shard: exit 1, it is shown unreachable" "[ $? -eq 1 ] && grep -q '^2 .*127.0.0.1:1 .*unreachable (UNAVAILABLE' '$tmp/partial.txt' && grep -q 'shard 2 (127.0.0.1:1): UNAVAILABLE' '$tmp/partial.err'"

wait_for "$w0" 120
rc=$?
check "the worker finishes (exit $rc)" "[ $rc -eq 0 ]"
# Each shard sees the run done at its monitor's next tick (200 ms) after the
# worker gave its rank back: poll, within 10 s.
for _ in $(seq 50); do
  "$ctl" "${auth[@]}" --json status >"$tmp/done.json" 2>/dev/null
  state=$(json_get "$tmp/done.json" 's["ranks"][0]["state"] + " " + s["job_state"]')
  [ "$state" = 'done done' ] && break
  sleep 0.2
done
check "after the worker exits: rank 0 left or done, the job done ($state)" "[ '$state' = 'left done' ] || [ '$state' = 'done done' ]"

# A TLS shard: health (the probes' command) and status over TLS with
# --tls_ca; without it the TLS port does not answer.
(
  cd "$tmp" || exit 1
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 -out ca.key &&
    openssl req -x509 -new -key ca.key -out ca.pem -days 2 -subj /CN=ctl-test-ca \
      -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign &&
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 -out server.key &&
    openssl req -new -key server.key -out server.csr -subj /CN=localhost &&
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >server.ext &&
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem \
      -days 2 -extfile server.ext
) >"$tmp/openssl.log" 2>&1
check "openssl made the test certificates" "[ -s '$tmp/server.pem' ]"
"$server" --host=127.0.0.1 --port=0 --port_file="$tmp/port_tls" --num_workers=1 \
  --exit_when_done=false --tls_cert="$tmp/server.pem" --tls_key="$tmp/server.key" 2>"$tmp/tls.log" &
tls=$!
pids+=("$tls")
for _ in $(seq 300); do [ -s "$tmp/port_tls" ] && break; sleep 0.1; done
tls_address="127.0.0.1:$(cat "$tmp/port_tls")"
"$ctl" --servers="$tls_address" --tls_ca="$tmp/ca.pem" --timeout_ms=3000 health >"$tmp/tls_health.out" 2>&1
check "health over TLS with --tls_ca: SERVING" "[ $? -eq 0 ] && grep -qx '$tls_address SERVING' '$tmp/tls_health.out'"
"$ctl" --servers="$tls_address" --timeout_ms=1000 health >"$tmp/tls_plain.out" 2>&1
check "health in plaintext at the TLS port: exit 1, UNREACHABLE" "[ $? -eq 1 ] && grep -q '^$tls_address UNREACHABLE (' '$tmp/tls_plain.out'"
"$ctl" --servers="$tls_address" --tls_ca="$tmp/ca.pem" --json status >"$tmp/tls.json" 2>&1
check "status over TLS: the shard's view (waiting, no keys)" "[ \"\$(json_get '$tmp/tls.json' 's[\"job_state\"] == \"waiting\" and s[\"shards\"][0][\"keys\"] == 0 and s[\"ranks\"][0][\"state\"] == \"absent\" and s[\"ranks\"][0][\"last_heard_ms_ago\"] == -1')\" = True ]"
"$ctl" --servers="$tls_address" --tls_ca="$tmp/ca.pem" shutdown >/dev/null 2>&1
wait_for "$tls" 15
rc=$?
check "shutdown over TLS stops that shard (exit $rc)" "[ $rc -eq 0 ]"

# A shard without --checkpoint_dir: checkpoint is FAILED_PRECONDITION.
"$server" --host=127.0.0.1 --port=0 --port_file="$tmp/port_plain" --num_workers=1 \
  --exit_when_done=false 2>"$tmp/plain.log" &
plain=$!
pids+=("$plain")
for _ in $(seq 300); do [ -s "$tmp/port_plain" ] && break; sleep 0.1; done
plain_address="127.0.0.1:$(cat "$tmp/port_plain")"
"$ctl" --servers="$plain_address" checkpoint >/dev/null 2>"$tmp/plain.err"
check "checkpoint without --checkpoint_dir: exit 1, FAILED_PRECONDITION naming the flag" "[ $? -eq 1 ] && grep -q 'FAILED_PRECONDITION: shard 0 has no --checkpoint_dir' '$tmp/plain.err'"
"$ctl" --servers="$plain_address" shutdown >/dev/null 2>&1
wait_for "$plain" 15
rc=$?
check "that shard shut down too, no token needed (exit $rc)" "[ $rc -eq 0 ]"

# Shutdown: both shards stop, 0, each with a final checkpoint past $v2.
started=$(date +%s.%N)
"$ctl" "${auth[@]}" --timeout_ms=15000 shutdown >"$tmp/shutdown.out" 2>"$tmp/shutdown.err"
rc=$?
check "shutdown: exit 0, both shards stopped" "[ $rc -eq 0 ] && grep -q '^shard 0 ($a0): stopped' '$tmp/shutdown.out' && grep -q '^shard 1 ($a1): stopped' '$tmp/shutdown.out'"
check "shutdown: shard 1 asked before shard 0" "[ \"\$(grep 'shutdown requested' '$tmp/shutdown.out' | cut -c1-7 | tr '\n' ' ')\" = 'shard 1 shard 0 ' ]"
for shard in 0 1; do
  wait_for "${server_pid[$shard]}" 15
  rc=$?
  check "shard $shard exits 0 (got $rc)" "[ $rc -eq 0 ]"
  final=$(sed -n "s/.*event=checkpoint shard=$shard version=\\([0-9]*\\) .*/\\1/p" "$tmp/server$shard.log" | tail -1)
  check "shard $shard wrote a final checkpoint (version $final > $v2)" "[ -n '$final' ] && [ '$final' -gt '$v2' ] && grep -q 'AdminService.Shutdown: harrier-ctl shutdown' '$tmp/server$shard.log'"
done
took=$(echo "$(date +%s.%N) - $started" | bc)
check "both stopped within 15 s ($took s)" "awk -v t='$took' 'BEGIN { exit !(t < 15) }'"
"$ctl" --servers="$servers" --timeout_ms=1000 health >"$tmp/health_after.out" 2>&1
rc=$?
check "health after shutdown: exit 1 naming the unreachable shards" "[ $rc -eq 1 ] && grep -q '^$a0 UNREACHABLE (' '$tmp/health_after.out' && grep -q '^$a1 UNREACHABLE (' '$tmp/health_after.out'"

echo "$passed checks passed, $failed failed"
[ "$failed" -eq 0 ]
