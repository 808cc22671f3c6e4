#!/usr/bin/env bash
# Offline check of the Helm chart helm/recall (ctest: helm_chart). No helm binary: the chart
# is rendered by helm/test/renderer (Go text/template + sprig, as Helm does) for several
# values files; each rendering is linted (yamllint), validated against the Kubernetes JSON
# schemas of the npm packages kubernetes-models and @kubernetes-models/prometheus-operator
# (validate_k8s.js) and checked for what matters (assert_manifests.py); values files are
# validated against values.schema.json, and bad ones must be rejected (validate_values.py).
# Prints PASS/FAIL per assertion; exits 1 if any failed.
#
# Needs (tools/install_deps.sh): golang-go golang-github-masterminds-sprig-dev yamllint
# python3-jsonschema python3-yaml shellcheck, and node + npm with the npm registry reachable
# the first time (packages pinned in package-lock.json, cached in helm/test/node_modules).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
chart=$repo/helm/recall
cache=${RECALL_HELM_CACHE:-$here/.cache}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
die() { echo "FAIL $*"; echo "helm chart check: FAILED (could not run)"; exit 1; }
# Debian's python3 (python3-jsonschema, python3-yaml), even when another python3 is first on PATH.
py=/usr/bin/python3
[ -x "$py" ] || py=python3

# ---- Tools ---------------------------------------------------------------------------------
for t in go yamllint node npm sh; do
  command -v "$t" >/dev/null 2>&1 || die "tools: '$t' is missing (bash tools/install_deps.sh)"
done
"$py" -c 'import jsonschema, yaml' 2>/dev/null ||
  die "tools: $py lacks jsonschema or yaml (apt-get install python3-jsonschema python3-yaml)"
[ -d /usr/share/gocode/src/github.com/Masterminds/sprig ] ||
  die "tools: sprig is missing (apt-get install golang-github-masterminds-sprig-dev)"
command -v shellcheck >/dev/null 2>&1 || echo "NOTE shellcheck is not installed: scripts get sh -n only"

# ---- The renderer: GOPATH mode over Debian's Go sources, no module download ------------------
# Debian installs sprig v3 and semver v3 without the /v3 suffix of their import paths; a
# GOPATH entry of two symbolic links supplies it.
gopath=$cache/gopath
mkdir -p "$gopath/src/github.com/Masterminds/sprig" "$gopath/src/github.com/Masterminds/semver"
ln -sfn /usr/share/gocode/src/github.com/Masterminds/sprig "$gopath/src/github.com/Masterminds/sprig/v3"
ln -sfn /usr/share/gocode/src/github.com/Masterminds/semver "$gopath/src/github.com/Masterminds/semver/v3"
export GO111MODULE=off GOPATH="$gopath:/usr/share/gocode" GOCACHE="$cache/go-build" GOFLAGS="" GOPROXY=off
render=$cache/helm-render
if (cd "$here/renderer" && go build -o "$render" . 2>"$work/go.log"); then
  pass "renderer: builds offline (Go $(go env GOVERSION), Debian's sprig)"
else
  cat "$work/go.log"
  die "renderer: does not build"
fi
if (cd "$here/renderer" && go test . >"$work/gotest.log" 2>&1); then
  pass "renderer: self-test (values coalescing, float64 numbers, toYaml, tpl, include, required, Capabilities, kubeVersion)"
else
  cat "$work/gotest.log"
  fail "renderer: self-test"
fi

# ---- Kubernetes schemas: npm ci once per package-lock.json -------------------------------------
stamp=$here/node_modules/.recall-lock-sha256
lock_sum=$(sha256sum "$here/package-lock.json" | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$lock_sum" ]; then
  echo "npm ci --no-audit --no-fund (in $here)"
  if (cd "$here" && npm ci --no-audit --no-fund >"$work/npm.log" 2>&1); then
    echo "$lock_sum" >"$stamp"
  else
    tail -20 "$work/npm.log"
    die "npm: 'npm ci' could not install kubernetes-models from the npm registry" \
      "($(npm config get registry 2>/dev/null)); is it reachable? Run it once online, the packages are cached in $here/node_modules"
  fi
fi
pass "schemas: kubernetes-models $(node -p 'require("'"$here"'/node_modules/kubernetes-models/package.json").version'), @kubernetes-models/prometheus-operator $(node -p 'require("'"$here"'/node_modules/@kubernetes-models/prometheus-operator/package.json").version')"

# ---- Scenarios: name | values files | extra API versions | release | namespace ---------------
monitoring=monitoring.coreos.com/v1
scenarios=(
  "default|||recall|default"
  "with-prometheus-operator||$monitoring|recall|default"
  "gpu-tp2-ha|values/gpu-tp2-ha.yaml||prod|inference"
  "full|values/full.yaml|$monitoring|recall-production-eu-west-1-gpu-cluster-blue|inference"
  "cpu-external-redis|values/cpu-external-redis.yaml|$monitoring|cpu|default"
  "sqlite-claim|values/sqlite-claim.yaml||recall|default"
)
good=()
for s in "${scenarios[@]}"; do
  IFS='|' read -r name files apis release ns <<<"$s"
  out=$work/$name
  mkdir -p "$out"
  args=(--chart "$chart" --release "$release" --namespace "$ns" --strict
    --values-out "$out/values.json" --notes-out "$out/notes.txt")
  for f in ${files//,/ }; do args+=(-f "$here/$f"); done
  [ -n "$apis" ] && args+=(--api-versions "$apis")
  if ! "$render" "${args[@]}" >"$out/manifests.yaml" 2>"$out/render.log"; then
    fail "$name: renders (${files:-defaults}): $(cat "$out/render.log")"
    continue
  fi
  pass "$name: renders (${files:-defaults}; release $release in $ns$([ -n "$apis" ] && echo "; API $apis")):" \
    "$(grep -c '^kind:' "$out/manifests.yaml") objects"
  good+=("$name=$out/values.json")
  if yamllint -f parsable -c "$here/yamllint.yaml" "$out/manifests.yaml" >"$out/yamllint.log"; then
    pass "$name: yamllint on the rendered manifests"
  else
    fail "$name: yamllint on the rendered manifests"
    sed 's/^/     /' "$out/yamllint.log"
  fi
  "$py" "$here/assert_manifests.py" --scenario "$name" --manifests "$out/manifests.yaml" \
    --values "$out/values.json" --notes "$out/notes.txt" --namespace "$ns" --repo "$repo" \
    --api-versions "$apis" --json-out "$out/manifests.json" >"$out/assert.log" 2>&1
  rc=$?
  cat "$out/assert.log"
  if [ $rc -ne 0 ] && ! grep -q '^FAIL' "$out/assert.log"; then fail "$name: assert_manifests.py crashed"; fi
  failures=$((failures + $(grep -c '^FAIL' "$out/assert.log")))
  if [ -f "$out/manifests.json" ]; then
    (cd "$here" && node validate_k8s.js "$name" "$out/manifests.json") >"$out/schema.log" 2>&1
    rc=$?
    cat "$out/schema.log"
    if [ $rc -ne 0 ] && ! grep -q '^FAIL' "$out/schema.log"; then fail "$name: validate_k8s.js crashed"; fi
    failures=$((failures + $(grep -c '^FAIL' "$out/schema.log")))
  fi
done

# ---- Rollouts: a setting rolls only its own workload's pods ------------------------------
# (one checksum of both tiers' settings replaced the coordinator, and with it an emptyDir
# /data of sessions, whenever a worker setting changed)
checksums() {  # "Kind" per workload whose checksum/* annotations are these, one line each
  "$py" -c 'import sys, yaml
for d in yaml.safe_load_all(open(sys.argv[1])):
    if d and d["kind"] in ("Deployment", "StatefulSet"):
        a = d["spec"]["template"]["metadata"]["annotations"]
        print(d["kind"], " ".join(f"{k}={v}" for k, v in sorted(a.items()) if k != "checksum/cluster-token"))' "$1"
}
# (the cluster token is random at each rendering here: without a cluster there is no lookup)
printf 'coordinator:\n  settings:\n    max-turns: 50\n' >"$work/roll-coordinator-setting.yaml"
printf 'worker:\n  settings:\n    window: 64\n' >"$work/roll-worker-setting.yaml"
printf 'worker:\n  model:\n    download:\n      token:\n        value: hf_new\n' >"$work/roll-model-token.yaml"
base=$(checksums "$work/default/manifests.yaml" 2>/dev/null)
for change in "coordinator-setting|Deployment " "worker-setting|StatefulSet " "model-token|"; do
  IFS='|' read -r what want <<<"$change"
  if "$render" --chart "$chart" -f "$work/roll-$what.yaml" >"$work/roll-$what.out" 2>&1; then
    changed=$(diff <(echo "$base") <(checksums "$work/roll-$what.out") | sed -n 's/^> //p' | cut -d' ' -f1 | tr '\n' ' ')
    if [ -n "$base" ] && [ "$changed" = "$want" ]; then
      pass "rollouts: a ${what/-/ } change rolls ${want:-no workload}"
    else
      fail "rollouts: a ${what/-/ } change rolls '${changed}' (want '${want:-nothing}')"
    fi
  else
    fail "rollouts: ${what}: $(head -c 300 "$work/roll-$what.out")"
  fi
done

# ---- Values the schema cannot judge (a rule between two settings): the templates refuse them --
for f in "$here"/values/refused/*.yaml; do
  b=$(basename "$f" .yaml)
  want=$(sed -n 's/^# refused with: //p' "$f")
  if "$render" --chart "$chart" -f "$f" >/dev/null 2>"$work/refused-$b.log"; then
    fail "values refused/$b: the templates rendered it"
  elif [ -n "$want" ] && grep -qF "$want" "$work/refused-$b.log"; then
    pass "values refused/$b: the templates refuse it: $want"
  else
    fail "values refused/$b: refused, but not with '$want': $(cut -c1-200 "$work/refused-$b.log")"
  fi
done

# ---- Values: good files pass values.schema.json, bad ones are rejected -----------------------
bad=()
for f in "$here"/values/bad/*.yaml; do
  b=$(basename "$f" .yaml)
  if "$render" --chart "$chart" -f "$f" --values-only --values-out "$work/bad-$b.json" 2>"$work/bad-$b.log"; then
    bad+=("bad/$b=$work/bad-$b.json=$f")
  else
    fail "values bad/$b: cannot be read: $(cat "$work/bad-$b.log")"
  fi
  # Under Helm the schema stops these first; the templates refuse some of them on their own.
  if ! "$render" --chart "$chart" -f "$f" >/dev/null 2>"$work/bad-$b.render"; then
    echo "NOTE values bad/$b: the templates refuse it too: $(sed 's/.*error calling [a-z]*: //' "$work/bad-$b.render" | cut -c1-160)"
  fi
done
"$py" "$here/validate_values.py" --schema "$chart/values.schema.json" --good "${good[@]}" \
  --bad "${bad[@]}" --documented "$chart/values.yaml" >"$work/values.log" 2>&1
rc=$?
cat "$work/values.log"
if [ $rc -ne 0 ] && ! grep -q '^FAIL' "$work/values.log"; then fail "validate_values.py crashed"; fi
failures=$((failures + $(grep -c '^FAIL' "$work/values.log")))

if yamllint -f parsable -c "$here/yamllint.yaml" "$chart/Chart.yaml" "$chart/values.yaml" \
  "$here"/values/*.yaml "$here"/values/bad/*.yaml "$here/yamllint.yaml" >"$work/yamllint.log"; then
  pass "yamllint on Chart.yaml, values.yaml and the test values files"
else
  fail "yamllint on Chart.yaml, values.yaml and the test values files"
  sed 's/^/     /' "$work/yamllint.log"
fi

if [ "$failures" -eq 0 ]; then
  echo "helm chart check: all passed"
else
  echo "helm chart check: $failures FAILED"
  exit 1
fi
