#!/usr/bin/env bash
# Installs dependencies, builds, and runs the main job: `recall serve` (a coordinator and one
# worker) on the stories260K model in ../shared, then a scripted multi-turn chat against it
# with `recall chat`, then stops the server.
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
DATA="$(mktemp -d)"
./build/cli/recall serve --model "$MODEL" --tokenizer "$SHARED/models/stories260K/tok512.bin" \
  --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --data-dir "$DATA" --port-file "$DATA/port" \
  --policy lazy --budget-frac 0.5 --window 32 > "$DATA/serve.log" 2>&1 &
SERVE=$!
trap 'kill $SERVE 2>/dev/null; wait $SERVE 2>/dev/null; rm -rf "$DATA"' EXIT
for _ in $(seq 600); do [ -f "$DATA/port" ] && break; sleep 0.1; done
if [ ! -f "$DATA/port" ]; then
  echo "quickstart: recall serve did not start:" >&2; cat "$DATA/serve.log" >&2; exit 1
fi
cat "$DATA/serve.log"  # its addresses; its per-turn lines are printed after the chat
SERVER="127.0.0.1:$(sed 's/.*grpc=\([0-9]*\).*/\1/' "$DATA/port")"
printf '%s\n' "Once upon a time, there was a little cat named Tom." \
  "What did Tom find in the garden?" "How did the story end?" "/stats" |
  ./build/cli/recall chat --server "$SERVER" --max-tokens "${MAX_TOKENS:-80}" \
    --temperature 0.8 --seed "${SEED:-42}"
echo "--- recall serve's log (one line per turn):"
grep ' turn session=' "$DATA/serve.log" || true
