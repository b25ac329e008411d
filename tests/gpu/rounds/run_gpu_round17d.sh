#!/bin/bash
# run_gpu_round17d.sh [CARRY] - round 17 (2026-12-02), ON THE DEVICE
# MACHINE, issue 4: RoPE fused into the decode attention at batch 32 / 64
# again (BT_ATTN_ROPE_TOK=128; default 16, round 12 measured no gain at
# 64 with an older attention kernel), four interleaved pairs.
# Carry: gpu/bench_cuda, lib/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r17d "${1:-build-r17d}"
vars="def rope"
envof() {
  case $1 in
    def) echo BT_X=1;;
    rope) echo BT_ATTN_ROPE_TOK=128;;
  esac
}
report() {
  {
    echo "## round 17d $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    for v in $vars; do
      echo "### $v: b32 / b64 / b128 step ms"
      for i in 1 2 3 4; do
        bc_steps "$v$i"
      done
    done
  } > "$table"
}
for i in 1 2 3 4; do
  for v in $vars; do bc $v$i $(envof $v) -- --batch 32,64,128 --ctx 2048 --prefill 0; done
  report
done
cat "$table"
