#!/usr/bin/env bash
# Installs dependencies, builds, and runs the main job: today, text generation from the
# stories260K model in ../shared (later: `recall serve` plus a chat).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
bash tools/build.sh
SHARED="${RECALL_SHARED_DIR:-$(pwd)/../shared}"
MODEL="$SHARED/models/stories260K/stories260K.bin"
if [ ! -f "$MODEL" ]; then
  echo "quickstart: $MODEL not found; set RECALL_SHARED_DIR to the shared/ folder" >&2
  exit 1
fi
exec ./build/client/recall generate --model "$MODEL" \
  --tokenizer "$SHARED/models/stories260K/tok512.bin" \
  --prompt "${PROMPT:-Once upon a time}" --max-tokens "${MAX_TOKENS:-200}" \
  --temperature 0.8 --top-p 0.9 --seed "${SEED:-42}" --stats
