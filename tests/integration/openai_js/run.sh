#!/usr/bin/env bash
# ctest recall_openai_js: the official `openai` npm package (pinned in package-lock.json)
# against a real `recall serve` on stories260K: chat_test.mjs. Skips (exit 77) without node
# and npm or without the shared model; installs the package with `npm ci` on first use (and
# when the lock changes) into node_modules here, and fails saying so when the npm registry is
# unreachable.
#
# Needs RECALL_CLI_BINARY (the `recall` binary); the shared folder is RECALL_SHARED_DIR, else
# RECALL_SHARED_DIR_DEFAULT (set by ctest), else ../shared beside the checkout.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
skip() { echo "SKIP $*"; exit 77; }
command -v node >/dev/null 2>&1 || skip "node is not installed"
command -v npm >/dev/null 2>&1 || skip "npm is not installed"
shared=${RECALL_SHARED_DIR:-${RECALL_SHARED_DIR_DEFAULT:-$here/../../../../shared}}
model=$shared/models/stories260K/stories260K.bin
[ -f "$model" ] || skip "shared data missing: $model (set RECALL_SHARED_DIR to the shared/ folder)"
cli=${RECALL_CLI_BINARY:?set RECALL_CLI_BINARY to the recall binary}

# ---- The openai package: npm ci once per package-lock.json ----------------------------------
stamp=$here/node_modules/.recall-lock-sha256
lock_sum=$(sha256sum "$here/package-lock.json" | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$lock_sum" ]; then
  echo "npm ci --no-audit --no-fund (in $here)"
  if ! (cd "$here" && npm ci --no-audit --no-fund >"$here/npm-ci.log" 2>&1); then
    tail -20 "$here/npm-ci.log"
    echo "FAIL npm: 'npm ci' could not install the openai package from the npm registry" \
      "($(npm config get registry 2>/dev/null)); is it reachable? Run it once online, the" \
      "package is then cached in $here/node_modules"
    exit 1
  fi
  echo "$lock_sum" >"$stamp"
fi
echo "openai $(node -p 'require("'"$here"'/node_modules/openai/package.json").version'), node $(node --version)"

# ---- recall serve on free ports ---------------------------------------------------------------
work=$(mktemp -d)
serve_pid=
cleanup() {
  if [ -n "$serve_pid" ]; then
    kill "$serve_pid" 2>/dev/null
    wait "$serve_pid" 2>/dev/null
  fi
  rm -rf "$work"
}
trap cleanup EXIT
"$cli" serve --model "$model" --tokenizer "$shared/models/stories260K/tok512.bin" \
  --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --data-dir "$work" --port-file "$work/port" \
  --threads 1 --kv-cache-bytes 16M --max-turns 3 >"$work/serve.log" 2>&1 &
serve_pid=$!
for _ in $(seq 1200); do
  [ -s "$work/port" ] && break
  if ! kill -0 "$serve_pid" 2>/dev/null; then
    cat "$work/serve.log"
    echo "FAIL recall serve exited before listening"
    serve_pid=
    exit 1
  fi
  sleep 0.1
done
[ -s "$work/port" ] || { cat "$work/serve.log"; echo "FAIL recall serve did not listen in 120 s"; exit 1; }
http=$(sed 's/.*http=\([0-9]*\).*/\1/' "$work/port")
node "$here/chat_test.mjs" "http://127.0.0.1:$http/v1"
rc=$?
[ $rc -eq 0 ] || cat "$work/serve.log"
exit $rc
