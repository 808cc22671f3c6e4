#!/usr/bin/env bash
# One device-machine call of the real training run (README.md, "The real run"): trains for
# at most MINUTES minutes, continuing where the last call stopped, then exports the model
# (bf16, ~16 MB) and copies it and the log to $OUT, so every call brings back a usable model
# even if the machine is given back before the next call.
#
#   run from the repository root on the device machine:
#     bash tools/train/device_train.sh            # first and later calls alike
#   env: RUN (default build-train/run, ignored by git: stays on a warm machine between
#        calls), TOK (default tools/train/tokenizer/tokenizer.model, the committed one),
#        INIT (an export brought back by an earlier call, carried as an ignored path: used
#        when RUN has no checkpoint, i.e. on a fresh machine; default build-train/export
#        when that holds one, so copy each call's OUT/model there and carry it in every
#        call: a machine idle for 30 s between two calls is given back, and a call on a
#        fresh machine without it starts from scratch), MINUTES (this call's training time, default 8), TRAIN_MINUTES (the
#        whole run's training time over all calls, default 22: the cosine schedule follows
#        it, so the run ends its schedule within one session's 30 device minutes whatever
#        the speed; 0 means step-based, STEPS steps), STEPS (default 4000), EXTRA (more
#        train.py flags, e.g. "--compile").
set -euo pipefail
RUN=${RUN:-build-train/run}
TOK=${TOK:-tools/train/tokenizer/tokenizer.model}
if [ -z "${INIT:-}" ] && [ -f build-train/export/training.json ]; then INIT=build-train/export; fi
MINUTES=${MINUTES:-8}
TRAIN_MINUTES=${TRAIN_MINUTES:-22}
STEPS=${STEPS:-4000}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
mkdir -p "$RUN"
[ -f "$TOK" ] || { echo "device_train: no tokenizer at $TOK (see README.md)" >&2; exit 2; }

start=()
if [ -f "$RUN/ckpt.pt" ]; then
  start=(--resume)
elif [ -n "${INIT:-}" ]; then
  start=(--init-from "$INIT")
  echo "device_train: no checkpoint in $RUN; continuing from the export $INIT"
fi
nproc_workers=$(( $(nproc) > 4 ? $(nproc) - 4 : 1 ))
# shellcheck disable=SC2086
$PY tools/train/train.py --tokenizer "$TOK" --out-dir "$RUN" \
    --device cuda --dtype bf16 --dim 256 --layers 8 --heads 8 --kv-heads 2 --hidden 1024 \
    --context 4096 --questions 24 --qa-reserve 400 --batch 32 --steps "$STEPS" --train-minutes "$TRAIN_MINUTES" --lr 1e-3 --min-lr 1e-4 --warmup 200 \
    --workers "$nproc_workers" --eval-every 250 --eval-convs 32 --eval-questions 4 \
    --save-every 250 --time-limit "$MINUTES" "${start[@]}" ${EXTRA:-} 2>&1 | tee -a "$RUN/train.out"

$PY tools/train/export_hf.py "$RUN/ckpt.pt" "$RUN/model" --dtype bf16 --check
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT/model"
  cp "$RUN"/model/* "$OUT/model/"
  cp "$RUN/log.jsonl" "$OUT/"  # 8 files come back at most: the export (7) and the log
fi
tail -n 3 "$RUN/log.jsonl"
