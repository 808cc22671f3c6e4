#!/usr/bin/env bash
# Installs every system package the build and the tests need, from Debian's archive.
# Idempotent: packages already present are skipped; nothing is downloaded from elsewhere.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libabsl-dev libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libgtest-dev libgmock-dev libbenchmark-dev
  libsentencepiece-dev libopenblas-dev nlohmann-json3-dev libpcre2-dev
  libsqlite3-dev libhiredis-dev redis-server openssl
  # the session store tests damage a store by hand (sqlite3; redis-cli comes with redis-server)
  sqlite3
  # the coordinator's OpenAI-compatible HTTP API (cpp-httplib 0.11, built with OpenSSL)
  libcpp-httplib-dev libssl-dev curl
  # recall chat's line editing and history
  libedit-dev
  # the Python gRPC client test (tests/integration/python_grpc)
  python3-grpcio python3-protobuf
  gnuplot-nox
  # the loader fuzzers (fuzz/, tests/fuzz): clang with libFuzzer and the sanitizer runtimes
  clang libclang-rt-14-dev
  # the Helm chart and Dockerfile checks (helm/test/check.sh, tests/docker)
  golang-go golang-github-masterminds-sprig-dev golang-gopkg-yaml.v2-dev
  yamllint python3-jsonschema python3-yaml shellcheck
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
