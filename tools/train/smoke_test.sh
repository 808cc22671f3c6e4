#!/bin/sh
# End-to-end smoke test of the training pipeline on tiny settings (CPU, one thread):
# generate -> tokenizer -> train (0.85M parameters, context 1024) -> export -> recall generate
# -> eval_recall.py. Accuracy stays near 0: this checks plumbing, not quality.
#
#   tools/train/smoke_test.sh [OUT_DIR]      (default /tmp/train_smoke; run from anywhere)
#
# Training stops every --time-limit minutes and resumes (the loop below), so no single
# command runs long on a busy machine. Needs /usr/bin/python3 with python3-torch,
# python3-sentencepiece, python3-numpy, and build/cli/recall.
set -eu
S=${1:-/tmp/train_smoke}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-/usr/bin/python3}
T=$ROOT/tools/train
mkdir -p "$S"

$PY "$T/train_tokenizer.py" --conversations 200 --vocab 512 --out-dir "$S/tok"
$PY "$T/gen_conversations.py" --split train --count 200 --min-tokens 400 --max-tokens 832 \
    --tokenizer "$S/tok/tokenizer.model" --out "$S/train.jsonl"
$PY "$T/gen_conversations.py" --split heldout --count 20 --min-tokens 600 --max-tokens 960 \
    --tokenizer "$S/tok/tokenizer.model" --out "$S/heldout.jsonl"
$PY "$T/tok.py" --check "$S/tok/tokenizer.model" "$S/train.jsonl"

train() {
  $PY "$T/train.py" --tokenizer "$S/tok/tokenizer.model" --out-dir "$S/run" \
      --data "$S/train.jsonl" --dim 128 --layers 4 --heads 4 --kv-heads 2 --hidden 384 \
      --context 1024 --batch 8 --bucket 4 --steps 200 --lr 2e-3 --min-lr 2e-4 --warmup 20 \
      --device cpu --threads 1 --workers 1 --log-every 10 --eval-every 100 --eval-convs 4 \
      --eval-questions 2 --save-every 100 --time-limit 4 "$@"
}
train
until grep -q '"step": 200,' "$S/run/log.jsonl"; do train --resume; done

$PY "$T/export_hf.py" "$S/run/ckpt.pt" "$S/model" --check
"$ROOT/build/cli/recall" generate --model "$S/model" --temperature 0 --max-tokens 40 \
    --threads 1 --stats --prompt "[Session 1, May 2020]
Anna: Hi Tom! How have you been?
Tom:"
$PY "$T/eval_recall.py" --model "$S/model" --data "$S/heldout.jsonl" --convs 10 --questions 2 \
    --modes full,window,streaming --budget 256 --out "$S/eval.json"
