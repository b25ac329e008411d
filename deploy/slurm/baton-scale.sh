#!/usr/bin/env bash
# baton-scale.sh - scale a running baton cluster out and in on Slurm.
#
#   baton-scale.sh out ROLE N (--cluster-dir DIR | --router EP) [-- SBATCH_ARGS...]
#       submits N more ROLE (prefill | decode | both) workers as one job of
#       their own (baton-workers.sbatch), registered with the router of the
#       cluster whose log dir is DIR (its `endpoints` file gives the router,
#       model and block size) or at control endpoint EP (then BATON_MODEL
#       must be set).  Prints the job id.  Settings: the BATON_* variables of
#       baton-workers.sbatch (BATON_GPUS_PER_WORKER, BATON_CPUS_PER_WORKER,
#       BATON_BIN, BATON_LOG_DIR, ...).
#   baton-scale.sh in JOBID...
#       drains and ends those worker jobs: SIGTERM to the job's script,
#       which forwards it to its workers (they finish their work first).
#
# Example: two more decode GPUs for the cluster job 1234:
#   deploy/slurm/baton-scale.sh out decode 2 --cluster-dir ~/baton-1234 \
#     -- --gpus-per-task=1 --cpus-per-task=8
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

[ $# -ge 1 ] || usage
cmd=$1; shift
case $cmd in
  out)
    [ $# -ge 2 ] || usage
    role=$1 n=$2; shift 2
    dir='' router=${BATON_ROUTER_EP:-}
    while [ $# -gt 0 ]; do
      case $1 in
        --cluster-dir) dir=$2; shift 2 ;;
        --router) router=$2; shift 2 ;;
        --) shift; break ;;
        *) usage ;;
      esac
    done
    if [ -n "$dir" ]; then
      [ -f "$dir/endpoints" ] ||
        { echo "baton-scale: no $dir/endpoints (is the cluster job ready?)" >&2; exit 1; }
      # endpoints file: BATON_ROUTER (control), BATON_MODEL, BATON_BLOCK_SIZE
      eval "$(grep -E '^BATON_(ROUTER|MODEL|BLOCK_SIZE|KEY_DIR)=' "$dir/endpoints" |
        sed -E 's/^([A-Z_]+)=(.*)$/c_\1=\x27\2\x27/')"
      router=${router:-$c_BATON_ROUTER}
      export BATON_MODEL=${BATON_MODEL:-$c_BATON_MODEL}
      export BATON_BLOCK_SIZE=${BATON_BLOCK_SIZE:-$c_BATON_BLOCK_SIZE}
      # the cluster's CURVE keys (worker.key, router.pub), when it has any
      [ -n "${c_BATON_KEY_DIR:-}" ] &&
        export BATON_KEY_DIR=${BATON_KEY_DIR:-$c_BATON_KEY_DIR}
    fi
    [ -n "$router" ] || { echo "baton-scale: give --cluster-dir or --router" >&2; exit 2; }
    [ -n "${BATON_MODEL:-}" ] || { echo "baton-scale: set BATON_MODEL" >&2; exit 2; }
    BATON_ROLE=$role BATON_ROUTER=$router sbatch --parsable --ntasks="$n" \
      --job-name="baton-$role" "$@" "$HERE/baton-workers.sbatch"
    ;;
  in)
    [ $# -ge 1 ] || usage
    for job in "$@"; do
      scancel --batch --signal=TERM "$job"
    done
    ;;
  *) usage ;;
esac
