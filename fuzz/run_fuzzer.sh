#!/usr/bin/env bash
# A bounded, reproducible run of one loader fuzzer (what ctest runs):
#   run_fuzzer.sh FUZZER SEED_DIR WORK_DIR RUNS MAX_LEN [DICT]
# Starts from a fresh corpus in WORK_DIR/corpus plus the seeds (read only), runs RUNS inputs
# with a fixed seed, and fails on any crash, sanitizer report, timeout (10 s), allocation
# over 256 MB or RSS over 2 GB; the input that failed is kept as WORK_DIR/crash-*
# (reproduce with: FUZZER WORK_DIR/crash-...). Longer runs by hand: docs/architecture.md.
set -euo pipefail
if [ $# -lt 5 ]; then
  echo "usage: $0 FUZZER SEED_DIR WORK_DIR RUNS MAX_LEN [DICT]" >&2
  exit 2
fi
fuzzer=$1 seeds=$2 work=$3 runs=$4 max_len=$5 dict=${6:-}
if [ ! -d "$seeds" ]; then
  echo "$0: no seed corpus at $seeds (run recall_fuzz_seeds first)" >&2
  exit 2
fi
rm -rf "$work/corpus"
mkdir -p "$work/corpus"
# The fuzzer writes each input to a file here; removed even when the fuzzer crashes.
scratch_root=/dev/shm
if [ ! -w "$scratch_root" ]; then scratch_root=$work; fi
RECALL_FUZZ_SCRATCH=$(mktemp -d "$scratch_root/recall_fuzz_run_XXXXXX")
export RECALL_FUZZ_SCRATCH
trap 'rm -rf "$RECALL_FUZZ_SCRATCH"' EXIT
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:allocator_may_return_null=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
args=(-runs="$runs" -seed=1 -max_len="$max_len" -timeout=10 -rss_limit_mb=2048
      -malloc_limit_mb=256 -print_final_stats=1 -artifact_prefix="$work/")
if [ -n "$dict" ]; then args+=(-dict="$dict"); fi
start=$EPOCHREALTIME
"$fuzzer" "${args[@]}" "$work/corpus" "$seeds"
awk -v name="$(basename "$fuzzer")" -v runs="$runs" -v s="$start" -v e="$EPOCHREALTIME" \
  'BEGIN { printf "%s: %d runs in %.1f s, no crash\n", name, runs, e - s }'
