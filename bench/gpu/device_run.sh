#!/usr/bin/env bash
# On the GPU machine, in one device call, with .gpuz/ carried (made by bench/gpu/bundle.sh; it
# is unpacked into .gpu/ here unless .gpu/ came along): run_all.sh over the bundled binaries, then every log packed into $OUT/gpu_run.tgz (a device
# call brings back at most 8 files). RUN_ALL_TIMEOUT (seconds) bounds run_all.sh so the pack
# always happens; the other knobs are run_all.sh's.
set -u
[ -d .gpu ] || tar xJf .gpuz/gpu.tar.xz || { echo 'device_run: no .gpu/ and no .gpuz/gpu.tar.xz: carry .gpuz (bench/gpu/bundle.sh)' >&2; exit 2; }
FINAL=${OUT:-/tmp/recall-gpu-out}; mkdir -p "$FINAL"
export OUT=/tmp/recall-gpu; rm -rf "$OUT"; mkdir -p "$OUT"
export BIN=$PWD/.gpu/bin LIB=$PWD/.gpu/lib RECALL_SHARED_DIR=$PWD/.gpu/shared
# The tests that run the repository's tools (the FP8 checkpoint writer) find them here.
export RECALL_SOURCE_DIR=$PWD
timeout "${RUN_ALL_TIMEOUT:-480}" bash bench/gpu/run_all.sh 2>&1 | tee "$OUT"/run_all.log
tar czf "$FINAL"/gpu_run.tgz -C "$OUT" .
