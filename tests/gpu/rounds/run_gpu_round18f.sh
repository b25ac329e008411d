#!/bin/bash
# run_gpu_round18f.sh [CARRY] - round 18 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: is the 2048-token prefill power-bound?  18d/18e: the
# engine's fa2pp attention takes 174 us a layer between the GEMMs,
# against 137.8 us alone in test_attn --bench.  nvidia-smi samples (50
# ms: power, SM clock, throttle reasons) over (1) test_attn --bench alone,
# (2) back-to-back bench_cuda prefill runs of 2048 tokens.  Carry:
# gpu/{bench_cuda,test_attn}, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r18f "${1:-build-r18f}"
phase() { # NAME CMD...: smi over the command, then its summary
  local name=$1; shift
  smi_start
  run "$name" 200 "$@"
  smi_stop; sleep 0.2
  mv "$out/smi.csv" "$out/smi_$name.csv"
  {
    echo "### $name: samples, mean power W, mean SM MHz, min SM MHz; throttle reasons seen"
    awk -F, '{p+=$2; c+=$3; n++; if (min==""||$3+0<min) min=$3+0} END {printf "%d samples, %.0f W, %.0f MHz, min %d MHz\n", n, p/n, c/n, min}' "$out/smi_$name.csv"
    cut -d, -f4 "$out/smi_$name.csv" | sort | uniq -c | sort -rn | head -4
    echo "power >= 650 W: $(awk -F, '$2+0 >= 650' "$out/smi_$name.csv" | wc -l)"
  } >> "$tmp/summary"
}
phase attn "$c/gpu/test_attn" --bench
phase prefill env BT_X=1 "$c/gpu/bench_cuda" --model synth:llama3-8b \
  --batch 1 --ctx 512 --steps 5 --prefill 2048,2048,2048,2048,8192
{
  echo "## round 18f $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  cat "$tmp/summary"
  grep -E "^prefill attn fa2pp" "$tmp/attn"
  grep -E "^\| prefill " "$tmp/prefill"
} > "$table"
cat "$table"
