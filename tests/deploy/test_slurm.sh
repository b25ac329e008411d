#!/usr/bin/env bash
# deploy/slurm on a real one-node Slurm (slurmctld + slurmd on 127.0.0.1,
# auth/none, state in a temp dir, memory tracked: CR_CPU_Memory),
# CPU backend, aidreams260K:
#   1. sbatch --mem=2000 deploy/slurm/baton.sbatch (1 prefill + 1 decode +
#      baton-http; each worker step must ask for its share of the job's
#      memory, or the second waits for the first's forever)
#      becomes ready (endpoints file) and `baton generate` through its
#      router returns the golden greedy ids of golden.jsonl's first line;
#      baton-http answers /health; each worker task got its own GPU
#      (CUDA_VISIBLE_DEVICES from --gpus-per-task over stand-in gres/gpu
#      devices; the workers still run on the CPU), router and http none;
#      the job's readiness wait is `baton status --wait-workers` (its
#      status table is left in the log dir);
#   2. deploy/slurm/baton-scale.sh out adds a decode worker as its own job
#      (`baton status --wait-workers 1,2` sees it register with the
#      running router), `baton-scale.sh in` drains
#      it (the router logs it draining, its job ends);
#   3. a job with fewer tasks than workers fails at once with a message
#      saying so (it used to wait for the readiness timeout);
#   4. scancel --batch --signal=TERM: ordered drain, its budget cut to the
#      job's time left (--time=3, BATON_DRAIN_TIMEOUT=600), the job ends,
#      every process of both jobs is gone and each process logged its stop;
#   5. BATON_GPUS_PER_WORKER=2: an aggregated decode worker gets two
#      distinct GPUs and `--tp 2` (recorded by a stand-in baton-decode
#      that then runs the real one on the CPU, which has no tensor
#      parallelism) and the job becomes ready.
# Skipped (exit 0, "SKIP") without root or the Slurm packages.  Every wait
# is bounded; the whole test takes ~40 s.
set -u
SRC=${BT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
. "$SRC/tests/deploy/slurm_lib.sh"
if ! slurm_available; then
  echo "SKIP deploy/slurm: needs root and slurmctld, slurmd, sbatch"; exit 0
fi
BIN=$BATON_BIN
MODELS=$BT_SHARED_DIR/models
tmp=$(mktemp -d /tmp/baton-slurm.XXXXXX)
chmod 755 "$tmp"
JOB='' SCALE_JOB='' SHORT_JOB='' TP_JOB=''
fail() {
  echo "FAIL: $*"
  for f in "$tmp"/job/*.log "$tmp"/job.out "$tmp"/scale/*.log \
           "$tmp"/scale.out "$tmp"/short.out "$tmp"/tp/*.log "$tmp"/tp.out \
           "$tmp"/slurm/slurmctld.log; do
    [ -f "$f" ] && { echo "--- $f"; tail -n 15 "$f"; }
  done
  exit 1
}
cleanup() {
  for j in $SCALE_JOB $JOB $SHORT_JOB $TP_JOB; do
    timeout 5 scancel "$j" 2>/dev/null
  done
  for j in $JOB $SCALE_JOB $SHORT_JOB $TP_JOB; do
    for _ in $(seq 1 50); do
      [ -z "$(job_pids "$j")" ] && break; sleep 0.2
    done
  done
  slurm_stop
  slurm_kill_leftovers $JOB $SCALE_JOB $SHORT_JOB $TP_JOB
  rm -rf "$tmp"
}
trap cleanup EXIT
# job_gone JOBID SECONDS: waits until squeue no longer lists JOBID.
job_gone() {
  for _ in $(seq 1 $(($2 * 5))); do
    [ -z "$(timeout 5 squeue -h -j "$1" -o %i 2>/dev/null)" ] && return 0
    sleep 0.2
  done
  return 1
}

t0=$(date +%s)
slurm_start "$tmp/slurm" 4 || fail "slurm daemons did not come up"
echo "slurm up in $(( $(date +%s) - t0 )) s ($SLURM_CONF," \
  "$SLURM_TEST_GPUS stand-in GPUs)"
GPUS=0 GPU_ARGS=()
if [ "$SLURM_TEST_GPUS" -ge 3 ]; then GPUS=1 GPU_ARGS=(--gpus-per-task=1); fi

PORT=$(free_port); HTTP=$(free_port)
[ "$HTTP" != "$PORT" ] && [ "$HTTP" != $((PORT + 1)) ] || HTTP=$(free_port)
line=$(head -n 1 "$MODELS/golden.jsonl")
ids() { echo "$line" | sed -n "s/.*\"$1\": *\[\([0-9, ]*\)\].*/\1/p" | tr -d ,; }
PROMPT=$(ids prompt_ids); WANT=$(ids greedy_ids)
STEPS=$(echo "$line" | sed -n 's/.*"steps": *\([0-9]*\).*/\1/p')
n_prompt=$(echo "$PROMPT" | wc -w)
[ -n "$WANT" ] && [ "$n_prompt" -gt 0 ] || fail "cannot read golden.jsonl"

# 1. the cluster job
JOB=$(cd "$tmp" && BATON_BIN=$BIN BATON_MODEL=$MODELS/aidreams260K.bin \
  BATON_TOKENIZER=$MODELS/aidreams-tok512.bin BATON_PREFILL=1 \
  BATON_DECODE=1 BATON_GPUS_PER_WORKER=$GPUS BATON_CPUS_PER_WORKER=1 \
  BATON_DEVICE=cpu BATON_BLOCK_SIZE=8 BATON_KV_BLOCKS=128 \
  BATON_PORT=$PORT BATON_HTTP_PORT=$HTTP BATON_MODEL_NAME=aidreams \
  BATON_READY_TIMEOUT=30 BATON_DRAIN_TIMEOUT=600 BATON_LOG_DIR=$tmp/job \
  timeout 10 sbatch --parsable -N 1 --ntasks=2 --cpus-per-task=1 --mem=2000 \
    --time=3 "${GPU_ARGS[@]}" --output="$tmp/job.out" \
    "$SRC/deploy/slurm/baton.sbatch") ||
  fail "sbatch refused the job: $JOB"
echo "cluster job $JOB"
for _ in $(seq 1 200); do
  [ -f "$tmp/job/endpoints" ] && break
  [ -z "$(timeout 5 squeue -h -j "$JOB" -o %i 2>/dev/null)" ] &&
    fail "job $JOB ended before it was ready"
  sleep 0.2
done
[ -f "$tmp/job/endpoints" ] || fail "job $JOB not ready after 40 s"
. "$tmp/job/endpoints"
# CURVE: the job made its keys; clients use client.env
[ -n "${BATON_KEY_DIR:-}" ] || fail "no BATON_KEY_DIR in the endpoints file"
[ "$(stat -c %a "$BATON_KEY_DIR")" = 700 ] || fail "key dir not mode 700"
[ "$(stat -c %a "$BATON_KEY_DIR/router.key")" = 600 ] || fail "router.key not 600"
. "$BATON_KEY_DIR/client.env"
export BATON_CURVE_SECRET_KEY BATON_ROUTER_PUBLIC_KEY
echo "ready in $(( $(date +%s) - t0 )) s: $BATON_ROUTER_CLIENT $BATON_HTTP"
[ "$BATON_ROUTER_CLIENT" = "tcp://localhost:$PORT" ] ||
  fail "endpoints file says $BATON_ROUTER_CLIENT"
# the readiness check (baton status --wait-workers) left its status table
grep -q "^  prefill-.* prefill " "$tmp/job/status" &&
  grep -q "^  decode-.* decode " "$tmp/job/status" ||
  fail "no worker table in $tmp/job/status: $(cat "$tmp/job/status")"
echo "ok readiness by baton status: $(head -n 1 "$tmp/job/status")"

got=$(timeout 30 "$BIN/baton" generate --router "$BATON_ROUTER_CLIENT" \
  --prompt-ids "$PROMPT" --max-tokens $((STEPS - n_prompt + 1)) \
  --ignore-eos --stop-id 1 --ids 2>"$tmp/gen.err")
[ "$got" = "$WANT" ] || { cat "$tmp/gen.err"
  fail "golden ids differ:
 got  $got
 want $WANT"; }
echo "ok golden greedy ids through the job's router (${#WANT} chars)"

health=$(timeout 5 bash -c "exec 3<>/dev/tcp/127.0.0.1/$HTTP
  printf 'GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n' >&3
  cat <&3" 2>/dev/null | head -n 1)
case "$health" in
  *" 200 "*) echo "ok baton-http /health: $health" ;;
  *) fail "baton-http /health answered '$health'" ;;
esac

# GPU binding: one distinct device per worker task, none for the rest
if [ $GPUS = 1 ]; then
  seen=""
  for p in $(job_pids "$JOB"); do
    exe=$(readlink "/proc/$p/exe" 2>/dev/null) || continue
    dev=$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null |
      sed -n 's/^CUDA_VISIBLE_DEVICES=//p')
    case $exe in
      */baton-prefill|*/baton-decode)
        [ -n "$dev" ] || fail "$exe has no CUDA_VISIBLE_DEVICES"
        case " $seen " in *" $dev "*) fail "GPU $dev given twice" ;; esac
        seen="$seen $dev" ;;
      */baton-router|*/baton-http)
        [ -z "$dev" ] || fail "$exe got GPU $dev" ;;
    esac
  done
  [ "$(echo $seen | wc -w)" = 2 ] || fail "GPUs of the workers: '$seen'"
  echo "ok each worker task has its own GPU:$seen; router and http none"
fi

# 2. scale out by one decode worker in its own job, then in again
SCALE_JOB=$(cd "$tmp" && BATON_BIN=$BIN BATON_GPUS_PER_WORKER=$GPUS \
  BATON_DEVICE=cpu BATON_LOG_DIR=$tmp/scale \
  timeout 10 bash "$SRC/deploy/slurm/baton-scale.sh" out decode 1 \
    --cluster-dir "$tmp/job" -- --cpus-per-task=1 --mem=1000 "${GPU_ARGS[@]}" \
    --output="$tmp/scale.out") || fail "baton-scale.sh out: $SCALE_JOB"
echo "scale-out job $SCALE_JOB"
timeout 30 "$BIN/baton" status --router "$BATON_ROUTER_CLIENT" \
  --wait-workers 1,2 --timeout 20 >"$tmp/scale.status" ||
  fail "the scale-out decode worker did not register: $(cat "$tmp/scale.status")"
grep -q "^  decode-.*-$SCALE_JOB\..* decode " "$tmp/scale.status" ||
  fail "the scale-out worker is not in the status: $(cat "$tmp/scale.status")"
echo "ok the scale-out worker registered"
timeout 10 bash "$SRC/deploy/slurm/baton-scale.sh" in "$SCALE_JOB" ||
  fail "baton-scale.sh in failed"
job_gone "$SCALE_JOB" 20 || fail "scale-out job $SCALE_JOB still queued"
grep -q "worker decode-.*-$SCALE_JOB\..* is draining" "$tmp/job/router.log" ||
  fail "the router never saw the scale-out worker drain"
left=$(job_pids "$SCALE_JOB")
[ -z "$left" ] || fail "scale-out job left processes: $left"
echo "ok scale-in drained the worker and its job ended"

# 3. fewer tasks than workers: refused at once, not after the timeout
SHORT_JOB=$(cd "$tmp" && BATON_BIN=$BIN BATON_MODEL=$MODELS/aidreams260K.bin \
  BATON_PREFILL=1 BATON_DECODE=1 BATON_GPUS_PER_WORKER=0 BATON_DEVICE=cpu \
  BATON_HTTP_PORT=0 BATON_PORT=$(free_port) BATON_READY_TIMEOUT=60 \
  BATON_LOG_DIR=$tmp/short timeout 10 sbatch --parsable -N 1 --ntasks=1 \
    --cpus-per-task=1 --mem=500 --output="$tmp/short.out" \
    "$SRC/deploy/slurm/baton.sbatch") || fail "sbatch refused the short job"
job_gone "$SHORT_JOB" 15 || fail "job $SHORT_JOB with 1 task for 2 workers" \
  "still runs after 15 s"
grep -q "the job has 1 tasks but needs one per worker.*--ntasks=2" \
  "$tmp/short.out" || fail "no clear message for too few tasks"
echo "ok 1 task for 2 workers: $(grep -o 'the job has.*' "$tmp/short.out")"
SHORT_JOB=''

# 4. ordered stop of the cluster job
timeout 5 scancel --batch --signal=TERM "$JOB" || fail "scancel failed"
job_gone "$JOB" 30 || fail "job $JOB still queued 30 s after SIGTERM"
for _ in $(seq 1 25); do
  [ -z "$(job_pids "$JOB")" ] && break; sleep 0.2
done
left=$(job_pids "$JOB")
[ -z "$left" ] || { ps -o pid,args -p "$(echo $left | tr ' ' ,)"
  fail "job $JOB left processes"; }
grep -q "stopped: " "$tmp/job/router.log" || fail "the router did not stop cleanly"
grep -q "stopped after" "$tmp"/job/prefill-*.log || fail "prefill did not stop cleanly"
grep -q "stopped: " "$tmp"/job/decode-*.log || fail "decode did not stop cleanly"
[ ! -f "$tmp/job/endpoints" ] || fail "endpoints file left behind"
grep -q "stopping: draining" "$tmp/job.out" || fail "no ordered teardown in job output"
# the router was still up when the workers drained: it saw them go
for role in prefill decode; do
  grep -q "worker $role-.*-$JOB\..* is draining" "$tmp/job/router.log" ||
    fail "the router did not see the $role worker drain"
done
# the drain budget was cut to the job's time left (--time=3) minus the
# front ends' 50 s and 5 s of slack, not BATON_DRAIN_TIMEOUT=600
stop=$(grep -o "stopping: draining .*" "$tmp/job.out")
budget=$(echo "$stop" |
  sed -n 's/.* up to \([0-9]*\)s (the job ends in \([0-9]*\)s).*/\1 \2/p')
[ -n "$budget" ] || fail "no drain budget with the job's time left: $stop"
read -r b l <<<"$budget"
[ "$b" -le $((l - 55)) ] && [ "$b" -lt 600 ] && [ "$l" -le 180 ] ||
  fail "drain budget $b s with $l s left"
echo "ok scancel --batch: workers drained, router stopped, no process left;" \
  "drain budget $b s with $l s left"
JOB=''

# 5. two GPUs per worker: --tp 2.  The CPU backend has no tensor
# parallelism, so a stand-in baton-decode records its arguments and GPUs,
# then runs the real one on the CPU without --tp.
if [ "$SLURM_TEST_GPUS" -ge 2 ]; then
  mkdir -p "$tmp/tpbin" "$tmp/tp"
  for b in baton baton-router baton-prefill baton-http; do
    ln -s "$BIN/$b" "$tmp/tpbin/$b"
  done
  cat >"$tmp/tpbin/baton-decode" <<EOF
#!/usr/bin/env bash
echo "CUDA_VISIBLE_DEVICES=\${CUDA_VISIBLE_DEVICES:-} \$*" >"$tmp/tp/args.\$\$"
a=()
while [ \$# -gt 0 ]; do
  case \$1 in
    --tp) shift 2 ;;
    --device) a+=(--device cpu); shift 2 ;;
    *) a+=("\$1"); shift ;;
  esac
done
exec "$BIN/baton-decode" "\${a[@]}"
EOF
  chmod 755 "$tmp/tpbin/baton-decode"
  TP_JOB=$(cd "$tmp" && BATON_BIN=$tmp/tpbin \
    BATON_MODEL=$MODELS/aidreams260K.bin BATON_PREFILL=0 BATON_DECODE=1 \
    BATON_GPUS_PER_WORKER=2 BATON_CPUS_PER_WORKER=1 BATON_DEVICE=cuda \
    BATON_BLOCK_SIZE=8 BATON_KV_BLOCKS=128 BATON_PORT=$(free_port) \
    BATON_HTTP_PORT=0 BATON_READY_TIMEOUT=30 BATON_DRAIN_TIMEOUT=15 \
    BATON_LOG_DIR=$tmp/tp timeout 10 sbatch --parsable -N 1 --ntasks=1 \
      --cpus-per-task=1 --mem=1000 --gpus-per-task=2 --output="$tmp/tp.out" \
      "$SRC/deploy/slurm/baton.sbatch") || fail "sbatch refused the tp job"
  for _ in $(seq 1 150); do
    [ -f "$tmp/tp/endpoints" ] && break
    [ -z "$(timeout 5 squeue -h -j "$TP_JOB" -o %i 2>/dev/null)" ] &&
      fail "tp job $TP_JOB ended before it was ready"
    sleep 0.2
  done
  [ -f "$tmp/tp/endpoints" ] || fail "tp job $TP_JOB not ready after 30 s"
  rec=$(cat "$tmp"/tp/args.* 2>/dev/null)
  case "$rec " in
    *" --tp 2 "*) ;;
    *) fail "the 2-GPU worker ran without --tp 2: $rec" ;;
  esac
  devs=$(echo "$rec" | sed -n 's/^CUDA_VISIBLE_DEVICES=\([^ ]*\) .*/\1/p')
  [ "$(echo "$devs" | tr , '\n' | sort -u | grep -c .)" = 2 ] ||
    fail "the 2-GPU worker sees GPUs '$devs'"
  echo "ok BATON_GPUS_PER_WORKER=2: GPUs $devs and --tp 2, job ready"
  timeout 5 scancel --batch --signal=TERM "$TP_JOB" || fail "scancel tp failed"
  job_gone "$TP_JOB" 30 || fail "tp job $TP_JOB still queued 30 s after SIGTERM"
  TP_JOB=''
fi
slurm_stop
left=$(daemon_pids)
[ -z "$left" ] || fail "slurm daemons left processes: $left"
SCALE_JOB=''
echo "PASS deploy/slurm ($(( $(date +%s) - t0 )) s)"
