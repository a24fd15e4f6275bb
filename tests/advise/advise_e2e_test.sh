#!/usr/bin/env bash
# harrier-advise against 2 real harrier-server shards on 127.0.0.1 with a
# job token: the measured link is positive and plausible, the --json line
# has its documented keys in order, every option of the grid appears once, the pick
# follows the calibration (one option clearly best on steps is picked; a
# calibration that flips it picks the other), never-reached options rank
# last, more bytes cost more comm, --measured_only ranks only a partial
# grid's options, and bad input fails in one line.
set -uo pipefail
root="$TEST_SRCDIR/${TEST_WORKSPACE:-harrier}"
server="$root/server/harrier-server"
advise="$root/bench/advise/harrier-advise"
worker="$root/worker/harrier-worker"
make_calibration="$root/tests/advise/make_calibration.py"
python=/usr/bin/python3
tmp=$TEST_TMPDIR
passed=0
failed=0
check() { if eval "$2"; then echo "PASS $1"; passed=$((passed + 1)); else echo "FAIL $1"; failed=$((failed + 1)); fi; }
# A value of the JSON line in FILE: json_get FILE 'python expression on j'.
json_get() { "$python" -c "import json, sys; j = json.loads(open(sys.argv[1]).read()); print($2)" "$1" 2>/dev/null; }
pids=()
trap 'kill -KILL "${pids[@]}" 2>/dev/null; wait 2>/dev/null' EXIT

printf 'advise-test-token\n' >"$tmp/token"
chmod 600 "$tmp/token"
for shard in 0 1; do
  "$server" --host=127.0.0.1 --port=0 --port_file="$tmp/port$shard" --shard=$shard --num_shards=2 \
    --num_workers=4 --auth_token_file="$tmp/token" --exit_when_done=false 2>"$tmp/server$shard.log" &
  pids+=($!)
done
for _ in $(seq 300); do [ -s "$tmp/port0" ] && [ -s "$tmp/port1" ] && break; sleep 0.1; done
servers="127.0.0.1:$(cat "$tmp/port0"),127.0.0.1:$(cat "$tmp/port1")"
# Small probes keep the test in seconds on 2 shared cores.
common=(--servers="$servers" --auth_token_file="$tmp/token" --probe_bytes=2097152 --probe_repeats=3
        --rtt_probes=10 --timeout_ms=20000)

"$advise" --help >"$tmp/help.out" 2>&1
check "--help prints the usage" "grep -q 'Usage: harrier-advise --servers' '$tmp/help.out'"

# A: bsp/topk/off reaches the target in 20 steps, every other option in 5000;
# two options never reach it.
"$python" "$make_calibration" --out="$tmp/a.jsonl" --best=bsp/topk/off \
  --never=asp/signsgd/off,asp/signsgd/on
timeout 120 "$advise" "${common[@]}" --calibration="$tmp/a.jsonl" --json >"$tmp/a.json" 2>"$tmp/a.err"
rc=$?
check "calibration A: exit 0 (rc $rc)" "[ $rc -eq 0 ]"
[ $rc -eq 0 ] || cat "$tmp/a.err"
check "one JSON line on stdout" "[ \$(wc -l <'$tmp/a.json') -eq 1 ] && json_get '$tmp/a.json' 1 >/dev/null"
keys=$(json_get "$tmp/a.json" "','.join(list(j)[:7])")
check "top-level keys in the documented order ($keys)" \
  "[ '$keys' = 'bench,model,link_gbps_measured_up,link_gbps_measured_down,rtt_ms,pick,options' ]"
pick_keys=$(json_get "$tmp/a.json" "','.join(list(j['pick'])[:6])")
check "pick keys ($pick_keys)" \
  "[ '$pick_keys' = 'sync,codec,pulls,pull_codec,techniques,predicted_time_to_target_s' ]"
option_keys=$(json_get "$tmp/a.json" "','.join(list(j['options'][0])[:6])")
check "option keys ($option_keys)" \
  "[ '$option_keys' = 'sync,codec,pulls,predicted_step_s,predicted_steps,predicted_time_to_target_s' ]"
check "bench advise, model mlp" "[ \"\$(json_get '$tmp/a.json' \"j['bench'] + ' ' + j['model']\")\" = 'advise mlp' ]"
up=$(json_get "$tmp/a.json" "j['link_gbps_measured_up']")
down=$(json_get "$tmp/a.json" "j['link_gbps_measured_down']")
rtt=$(json_get "$tmp/a.json" "j['rtt_ms']")
# Loopback over gRPC on 2 shared cores: tens of Mbit/s at the very least,
# and no more than memory bandwidth; a round trip under 100 ms.
check "measured up $up Gbit/s is plausible (0.05 .. 1000)" "json_get '$tmp/a.json' \"0.05 < j['link_gbps_measured_up'] < 1000\" | grep -q True"
check "measured down $down Gbit/s is plausible (0.05 .. 1000)" "json_get '$tmp/a.json' \"0.05 < j['link_gbps_measured_down'] < 1000\" | grep -q True"
check "round trip $rtt ms is plausible (0 .. 100)" "json_get '$tmp/a.json' \"0 < j['rtt_ms'] < 100\" | grep -q True"
all=$(json_get "$tmp/a.json" "len(j['options']) == 156 and len({(o['sync'], o['codec'], o['pulls']) for o in j['options']}) == 156 and {o['sync'] for o in j['options']} == {'bsp','ssp2','asp','local4'} and len({o['codec'] for o in j['options']}) == 13")
check "every option (4 syncs x 13 codecs x 3 pulls: off, on, paired) appears once" "[ '$all' = True ]"
check "every predicted step time is positive" "json_get '$tmp/a.json' \"all(o['predicted_step_s'] > 0 for o in j['options'])\" | grep -q True"
pick=$(json_get "$tmp/a.json" "'/'.join([j['pick']['sync'], j['pick']['codec'], j['pick']['pulls']])")
check "calibration A picks bsp/topk/off ($pick)" "[ '$pick' = bsp/topk/off ]"
check "the pick is the first option and the least time" "json_get '$tmp/a.json' \"j['options'][0]['codec'] == j['pick']['codec'] and j['pick']['predicted_time_to_target_s'] == min(o['predicted_time_to_target_s'] for o in j['options'] if o['predicted_time_to_target_s'] >= 0)\" | grep -q True"
check "pick's time = steps x step time" "json_get '$tmp/a.json' \"abs(j['options'][0]['predicted_steps'] * j['options'][0]['predicted_step_s'] - j['pick']['predicted_time_to_target_s']) < 1e-3 * j['pick']['predicted_time_to_target_s']\" | grep -q True"
check "never-reached options rank last with time -1" "json_get '$tmp/a.json' \"sorted(o['sync'] + '/' + o['codec'] + '/' + o['pulls'] for o in j['options'][-2:]) == ['asp/signsgd/off', 'asp/signsgd/on'] and all(o['predicted_time_to_target_s'] == -1 for o in j['options'][-2:])\" | grep -q True"
check "the report says which never reached it" "grep -q '2 option(s) never reached it there and rank last' '$tmp/a.err'"
check "the report has a table row per option" "[ \$(grep -cE '^  [0-9]+ +(bsp|ssp2|asp|local4) ' '$tmp/a.err') -eq 156 ]"
# More bytes, more comm: dense bsp pushes ~1 MiB, top-k 1 % ~34 KB.
check "bsp/none/off has over 1.3x the comm of bsp/topk/off (both pull dense)" "json_get '$tmp/a.json' \"[o for o in j['options'] if (o['sync'], o['codec'], o['pulls']) == ('bsp', 'none', 'off')][0]['comm_s'] > 1.3 * [o for o in j['options'] if (o['sync'], o['codec'], o['pulls']) == ('bsp', 'topk', 'off')][0]['comm_s']\" | grep -q True"
check "paired pulls cut comm more than the grid's (bsp/topk paired < on: top-k 1 % against 10 %)" "json_get '$tmp/a.json' \"[o for o in j['options'] if (o['sync'], o['codec'], o['pulls']) == ('bsp', 'topk', 'paired')][0]['comm_s'] < [o for o in j['options'] if (o['sync'], o['codec'], o['pulls']) == ('bsp', 'topk', 'on')][0]['comm_s']\" | grep -q True"
check "compressed pulls cut comm (bsp/topk on < off)" "json_get '$tmp/a.json' \"[o for o in j['options'] if (o['sync'], o['codec'], o['pulls']) == ('bsp', 'topk', 'on')][0]['comm_s'] < [o for o in j['options'] if (o['sync'], o['codec'], o['pulls']) == ('bsp', 'topk', 'off')][0]['comm_s']\" | grep -q True"

# B flips it: asp/qsgd8/on is the clearly best.
"$python" "$make_calibration" --out="$tmp/b.jsonl" --best=asp/qsgd8/on
timeout 120 "$advise" "${common[@]}" --calibration="$tmp/b.jsonl" --json >"$tmp/b.json" 2>"$tmp/b.err"
check "calibration B: exit 0" "[ $? -eq 0 ]"
pick=$(json_get "$tmp/b.json" "'/'.join([j['pick']['sync'], j['pick']['codec'], j['pick']['pulls'], j['pick']['pull_codec']])")
check "calibration B picks asp/qsgd8/on with the grid's pull codec for it ($pick)" "[ '$pick' = 'asp/qsgd8/on/fp16' ]"

# Scheduler settings on a slow link (1 Mbit/s planned: comm is most of a
# step): a bsp pick overlaps and fuses; a local4 pick gets none, since
# harrier-worker refuses --techniques with --sync=local.
"$python" "$make_calibration" --out="$tmp/l.jsonl" --best=local4/topk/off
timeout 120 "$advise" "${common[@]}" --calibration="$tmp/l.jsonl" --link_gbps=0.001 >"$tmp/l.out" 2>&1
check "local4 pick: the shards get --sync=local --local_steps=4 and topk's training flags" \
  "grep -qx '  harrier-server --sync=local --local_steps=4 --optimizer=nesterov --lr=0.08 --momentum=0.9' '$tmp/l.out'"
check "local4 pick: the workers get the codec and --techniques=none (harrier-worker refuses a scheduler with local SGD)" \
  "grep -qx '  harrier-worker --codec=topk:ratio=0.01 --pull_codec=none --techniques=none' '$tmp/l.out'"
timeout 120 "$advise" "${common[@]}" --calibration="$tmp/a.jsonl" --link_gbps=0.001 >"$tmp/a_slow.out" 2>&1
check "bsp pick on a slow link: recommends wfbp+fusion" \
  "grep -q '^  harrier-worker --codec=topk:ratio=0.01 --pull_codec=none --techniques=wfbp+fusion --fusion_bytes=' '$tmp/a_slow.out' && grep -qx '  harrier-server --sync=bsp --optimizer=nesterov --lr=0.08 --momentum=0.9' '$tmp/a_slow.out'"

# The recommendation runs as printed: 2 fresh shards with its harrier-server
# flags, one worker with its harrier-worker flags, 8 steps, exit 0.
run_recommendation() {  # name advise-output
  local name=$1 out=$2 server_args worker_args i rec_pids=() rec_servers="" rc
  server_args=$(sed -n 's/^  harrier-server //p' "$out")
  worker_args=$(sed -n 's/^  harrier-worker //p' "$out")
  if [ -z "$server_args" ] || [ -z "$worker_args" ]; then
    check "$name: the recommendation has a harrier-server and a harrier-worker line" false
    return
  fi
  for i in 0 1; do
    rm -f "$tmp/rec_port$i"
    # shellcheck disable=SC2086  # the recommendation's flags, one word each
    "$server" --host=127.0.0.1 --port=0 --port_file="$tmp/rec_port$i" --shard=$i --num_shards=2 \
      --num_workers=1 $server_args 2>"$tmp/rec_server$i.log" &
    rec_pids+=($!)
    pids+=($!)
  done
  for _ in $(seq 300); do [ -s "$tmp/rec_port0" ] && [ -s "$tmp/rec_port1" ] && break; sleep 0.1; done
  rec_servers="127.0.0.1:$(cat "$tmp/rec_port0"),127.0.0.1:$(cat "$tmp/rec_port1")"
  # shellcheck disable=SC2086
  timeout 120 "$worker" --servers="$rec_servers" $worker_args --max_steps=8 --train_examples=1000 \
    --rpc_timeout_s=20 >"$tmp/rec_worker.out" 2>"$tmp/rec_worker.err"
  rc=$?
  check "$name: harrier-server $server_args and harrier-worker $worker_args train 8 steps (exit $rc)" "[ $rc -eq 0 ]"
  [ $rc -eq 0 ] || tail -n 5 "$tmp/rec_worker.err" "$tmp/rec_server0.log"
  kill "${rec_pids[@]}" 2>/dev/null
  wait "${rec_pids[@]}" 2>/dev/null
}
run_recommendation "local4 pick" "$tmp/l.out"
run_recommendation "bsp pick with wfbp+fusion" "$tmp/a_slow.out"

# --tensors_from_job: the tensors a running job's shards hold. Before its
# worker registers any, said so (exit 1); after 2 steps of the mlp, its 6
# tensors and 269,322 parameters.
for i in 0 1; do
  rm -f "$tmp/job_port$i"
  "$server" --host=127.0.0.1 --port=0 --port_file="$tmp/job_port$i" --shard=$i --num_shards=2 \
    --num_workers=1 --sync=asp --exit_when_done=false 2>"$tmp/job_server$i.log" &
  pids+=($!)
done
for _ in $(seq 300); do [ -s "$tmp/job_port0" ] && [ -s "$tmp/job_port1" ] && break; sleep 0.1; done
job_servers="127.0.0.1:$(cat "$tmp/job_port0"),127.0.0.1:$(cat "$tmp/job_port1")"
job_common=(--servers="$job_servers" --probe_bytes=1048576 --probe_repeats=2 --rtt_probes=5 --timeout_ms=20000
            --syncs=bsp --codecs=none,topk --pulls=off --compute_ms=1)
timeout 120 "$advise" "${job_common[@]}" --tensors_from_job >/dev/null 2>"$tmp/job_empty.err"
check "tensors_from_job before any worker: exit 1, says to start the workers" \
  "[ $? -eq 1 ] && grep -q 'the shards hold no tensor yet: start the job' '$tmp/job_empty.err'"
timeout 120 "$worker" --servers="$job_servers" --max_steps=2 --train_examples=1000 --rpc_timeout_s=20 \
  >/dev/null 2>"$tmp/job_worker.err"
check "the job's worker trains 2 steps" "[ $? -eq 0 ]"
timeout 120 "$advise" "${job_common[@]}" --tensors_from_job --json >"$tmp/job.json" 2>"$tmp/job.err"
rc=$?
check "tensors_from_job: exit 0, the mlp's 6 tensors and 269322 parameters from the shards (rc $rc)" \
  "[ $rc -eq 0 ] && json_get '$tmp/job.json' \"j['tensors_from_job'] is True and j['tensors'] == 6 and j['parameters'] == 269322\" | grep -q True"
check "tensors_from_job: the report says where the tensors came from" \
  "grep -q '269322 parameters in 6 tensors (as the running job.s shards hold them)' '$tmp/job.err'"
"$advise" "${job_common[@]}" --tensors_from_job --tensors=w:10 >/dev/null 2>"$tmp/job_both.err"
check "tensors_from_job with --tensors: exit 2" "[ $? -eq 2 ] && grep -q 'leave out --tensors' '$tmp/job_both.err'"
"$advise" --servers="$job_servers" --tensors_from_job --model=mine >/dev/null 2>"$tmp/job_mine.err"
check "tensors_from_job with an unknown --model and no --compute_ms: exit 2" \
  "[ $? -eq 2 ] && grep -q -- '--tensors_from_job with --model=mine needs --compute_ms' '$tmp/job_mine.err'"

# --device: cpu by default (said in the JSON); cuda needs a CUDA build (this
# one is not: exit 2 saying so), anything else is refused.
check "the JSON says device cpu" "json_get '$tmp/a.json' \"j['device'] == 'cpu'\" | grep -q True"
"$advise" "${common[@]}" --device=cuda --compute_ms=1 >/dev/null 2>"$tmp/cuda.err"
rc=$?
check "--device=cuda without a CUDA build: exit 2 naming --config=cuda (rc $rc)" \
  "[ $rc -eq 2 ] && grep -q -- '--device=cuda: this build has no CUDA (bazel build --config=cuda)' '$tmp/cuda.err'"
"$advise" "${common[@]}" --device=tpu >/dev/null 2>"$tmp/tpu.err"
check "--device=tpu: exit 2" "[ $? -eq 2 ] && grep -q -- '--device=tpu: not cpu or cuda' '$tmp/tpu.err'"

# C: every option takes the same steps, so step time alone decides. On a
# planned 1 Mbit/s link the bytes dominate: a compressed codec with
# compressed pulls wins; on a 1000 Gbit/s link the codec's time does:
# no compression wins.
"$python" "$make_calibration" --out="$tmp/c.jsonl" --best=none --steps=1000
timeout 120 "$advise" "${common[@]}" --calibration="$tmp/c.jsonl" --link_gbps=0.001 --json >"$tmp/slow.json" 2>"$tmp/slow.err"
check "calibration C at 1 Mbit/s: exit 0" "[ $? -eq 0 ]"
pick=$(json_get "$tmp/slow.json" "'/'.join([j['pick']['sync'], j['pick']['codec'], j['pick']['pulls']])")
check "slow link: a compressed codec with compressed pulls ($pick)" "json_get '$tmp/slow.json' \"j['pick']['codec'] != 'none' and j['pick']['pulls'] in ('on', 'paired') and j['pick']['pull_codec'] != 'none' and j['link_gbps_planned'] == 0.001\" | grep -q True"
check "slow link: the measured rates are still reported" "json_get '$tmp/slow.json' \"j['link_gbps_measured_up'] > 0.05\" | grep -q True"
check "slow link: the report says it plans for 0.001 Gbit/s" "grep -q 'planning for 0.001 Gbit/s links' '$tmp/slow.err'"
timeout 120 "$advise" "${common[@]}" --calibration="$tmp/c.jsonl" --link_gbps=1000 --json >"$tmp/fast.json" 2>"$tmp/fast.err"
pick=$(json_get "$tmp/fast.json" "'/'.join([j['pick']['sync'], j['pick']['codec'], j['pick']['pulls']])")
check "fast link: no compression ($pick)" "json_get '$tmp/fast.json' \"j['pick']['codec'] == 'none'\" | grep -q True"

# E: the same job on 1 shared core (--colocated_cores=1): every option's step
# is bounded by the cluster's CPU work, at least 4 workers' 5 ms of compute
# on 1 core, so every step is longer than with cores of their own. Both
# plan for 10 Gbit/s (--link_gbps), so that the two runs' measured rates do
# not differ and comm (about 4 ms dense) stays under the 20 ms bound.
timeout 120 "$advise" "${common[@]}" --calibration="$tmp/c.jsonl" --syncs=bsp,asp --codecs=none,topk --colocated_cores=1 --compute_ms=5 --link_gbps=10 --json >"$tmp/shared.json" 2>"$tmp/shared.err"
rc=$?
timeout 120 "$advise" "${common[@]}" --calibration="$tmp/c.jsonl" --syncs=bsp,asp --codecs=none,topk --compute_ms=5 --link_gbps=10 --json >"$tmp/own.json" 2>/dev/null
check "shared cores: exit 0, colocated_cores 1 and a transport CPU cost in the JSON (rc $rc)" \
  "[ $rc -eq 0 ] && json_get '$tmp/shared.json' \"j['colocated_cores'] == 1 and j['transport_cpu_ns_per_byte'] > 0 and j['transport_cpu_us_per_call'] > 0\" | grep -q True"
check "shared cores: every option's cores bound is at least 4 workers x 5 ms compute" \
  "json_get '$tmp/shared.json' \"all(o['cpu_bound_s'] >= 0.020 and o['predicted_step_s'] >= o['cpu_bound_s'] for o in j['options'])\" | grep -q True"
check "own cores: no cores bound, and every step shorter than on 1 shared core" \
  "\"$python\" -c \"import json,sys; a=json.load(open('$tmp/shared.json')); b=json.load(open('$tmp/own.json')); s={(o['sync'],o['codec'],o['pulls']):o['predicted_step_s'] for o in a['options']}; sys.exit(0 if all(o['cpu_bound_s'] == 0 and o['predicted_step_s'] < s[(o['sync'],o['codec'],o['pulls'])] for o in b['options']) and b['colocated_cores'] == 0 else 1)\""
check "shared cores: the report explains the cores column" "grep -q 'shared cores (--colocated_cores)' '$tmp/shared.err'"
"$advise" "${common[@]}" --colocated_cores=-1 >/dev/null 2>"$tmp/neg.err"
check "--colocated_cores=-1: exit 2 naming the flag" "[ $? -eq 2 ] && grep -q -- '--colocated_cores must not be negative' '$tmp/neg.err'"

# D: a grid that is no cross product, two options only (bsp/none/off in 5000
# steps, bsp/topk/off in 4000). --measured_only ranks those two alone; without
# it the options the grid lacks get survey guesses and one of those wins.
"$python" -c '
import json, sys
keep = {("bsp", "none", "off"): 5000, ("bsp", "topk", "off"): 4000}
with open(sys.argv[2], "w") as out:
    for line in open(sys.argv[1]):
        r = json.loads(line)
        key = (r["sync"], r["codec"], "on" if "-pullon-" in r["run_id"] else "off")
        if key in keep:
            r["steps_to_target"] = keep[key]
            out.write(json.dumps(r) + "\n")' "$tmp/a.jsonl" "$tmp/d.jsonl"
timeout 120 "$advise" "${common[@]}" --calibration="$tmp/d.jsonl" --measured_only --json >"$tmp/d.json" 2>"$tmp/d.err"
rc=$?
pick=$(json_get "$tmp/d.json" "'/'.join([j['pick']['sync'], j['pick']['codec'], j['pick']['pulls']])")
check "measured_only: exit 0, the 2 measured options alone, bsp/topk/off picked ($pick)" \
  "[ $rc -eq 0 ] && [ '$pick' = bsp/topk/off ] && json_get '$tmp/d.json' \"len(j['options']) == 2 and j['options_left_out'] == 154 and all(o['steps_source'] == 'grid' for o in j['options'])\" | grep -q True"
check "measured_only: the report says how many were left out" "grep -q -- '--measured_only: 154 option(s) not in it were left out' '$tmp/d.err'"
timeout 120 "$advise" "${common[@]}" --calibration="$tmp/d.jsonl" --json >"$tmp/d_all.json" 2>/dev/null
check "without --measured_only: 156 options, a guessed one picked" \
  "json_get '$tmp/d_all.json' \"len(j['options']) == 156 and j['options_left_out'] == 0 and j['options'][0]['steps_source'] != 'grid'\" | grep -q True"
"$python" -c '
import json, sys
with open(sys.argv[2], "w") as out:
    for line in open(sys.argv[1]):
        r = json.loads(line)
        if r["sync"] == "bsp": out.write(line)' "$tmp/a.jsonl" "$tmp/bsp_only.jsonl"
"$advise" "${common[@]}" --calibration="$tmp/bsp_only.jsonl" --measured_only --syncs=asp >/dev/null 2>"$tmp/none_measured.err"
check "measured_only with nothing measured: exit 2 naming it" "[ $? -eq 2 ] && grep -q -- '--measured_only: no option of' '$tmp/none_measured.err'"

# Without calibration: the survey's guess, said so.
timeout 120 "$advise" "${common[@]}" --syncs=bsp --codecs=none,topk --pulls=off >"$tmp/guess.out" 2>&1
check "no calibration: exit 0, says GUESS and the survey" "[ $? -eq 0 ] && grep -q 'a GUESS' '$tmp/guess.out' && grep -q \"Tang et al.'s survey\" '$tmp/guess.out'"
check "no calibration: a recommendation for the shards and the workers" "grep -q '^recommendation (every shard, then every worker' '$tmp/guess.out' && grep -q '^  harrier-server --sync=bsp' '$tmp/guess.out' && grep -q '^  harrier-worker --codec=' '$tmp/guess.out'"

# Replay model and cnn.
timeout 120 "$advise" "${common[@]}" --model=replay:resnet50 --syncs=bsp --codecs=none,fp16 --pulls=off --json >"$tmp/replay.json" 2>"$tmp/replay.err"
check "replay:resnet50: exit 0 and its parameter count" "[ $? -eq 0 ] && grep -q 'model replay:resnet50, 25557032 parameters' '$tmp/replay.err'"
timeout 120 "$advise" "${common[@]}" --model=cnn --syncs=bsp --codecs=none --pulls=off --json >"$tmp/cnn_timed.json" 2>"$tmp/cnn.err"
check "cnn without --compute_ms: its step is timed (positive ms)" "[ $? -eq 0 ] && grep -q 'model cnn, 215370 parameters' '$tmp/cnn.err' && grep -Eq '\"compute_ms\":[0-9.]*[1-9]' '$tmp/cnn_timed.json'"
timeout 120 "$advise" "${common[@]}" --model=cnn --compute_ms=5 --syncs=bsp --codecs=topk --pulls=off --json >"$tmp/cnn.json" 2>"$tmp/cnn.err"
check "cnn with --compute_ms: 215370 parameters" "[ $? -eq 0 ] && grep -q 'model cnn, 215370 parameters' '$tmp/cnn.err'"

# Errors: one line each.
"$advise" --servers="$servers" --probe_bytes=2097152 --rtt_probes=1 --probe_repeats=1 >/dev/null 2>"$tmp/token.err"
check "no token: exit 1, UNAUTHENTICATED naming the shard" "[ $? -eq 1 ] && [ \$(wc -l <'$tmp/token.err') -eq 1 ] && grep -q 'shard 0 (127.0.0.1:.*UNAUTHENTICATED\\|shard 0 (127.0.0.1:.*job token' '$tmp/token.err'"
"$advise" "${common[@]}" --calibration="$tmp/missing.jsonl" >/dev/null 2>"$tmp/missing.err"
check "missing calibration: exit 2 naming it" "[ $? -eq 2 ] && grep -q 'cannot read --calibration=.*missing.jsonl' '$tmp/missing.err'"
"$advise" "${common[@]}" --codecs=zip >/dev/null 2>"$tmp/zip.err"
check "unknown codec: exit 2 naming it" "[ $? -eq 2 ] && grep -q \"unknown codec 'zip'\" '$tmp/zip.err'"
"$advise" "${common[@]}" --probe_bytes=67108865 >/dev/null 2>"$tmp/probe.err"
check "--probe_bytes over 64 MiB: exit 2" "[ $? -eq 2 ] && grep -q 'probe_bytes must be in' '$tmp/probe.err'"
"$advise" >/dev/null 2>"$tmp/noservers.err"
check "no --servers: exit 2" "[ $? -eq 2 ] && grep -q -- '--servers is required' '$tmp/noservers.err'"

echo "$passed checks passed, $failed failed"
[ "$failed" -eq 0 ]
