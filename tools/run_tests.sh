#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite (ctest). Never prompts.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
bash tools/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 900
