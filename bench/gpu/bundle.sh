#!/usr/bin/env bash
# Here, on a machine without a GPU: builds the CUDA test and benchmark binaries for any x86-64
# CPU (RECALL_NATIVE=OFF, into build-gpu/) and stages them in .gpu/ with the shared libraries
# they need that a bare GPU machine lacks, and the stories260K model the engine tests read.
# .gpu/ is also packed into .gpuz/gpu.tar.xz (about 9 MB: Debian's OpenBLAS alone is 35 MB, so
# .gpu/ itself is over the 64 MiB a device call carries). Carry .gpuz to the GPU machine and run
# bench/gpu/device_run.sh there, which unpacks it (bench/gpu/README.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
SHARED=${RECALL_SHARED_DIR:-$PWD/../shared}
for d in /.gpu/ /.gpuz/; do grep -qx "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude; done
[ -f build-gpu/CMakeCache.txt ] ||
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DRECALL_NATIVE=OFF
TARGETS=(tests/cuda/recall_cuda_test tests/cuda/recall_cuda_tp_test tests/cuda/recall_cuda_serving_test
         bench/recall_gpu_decode_bench bench/recall_gpu_fp8_gemm_bench bench/recall_gpu_matmul_bench
         bench/recall_tp_eviction_bench)
ninja -C build-gpu "${TARGETS[@]##*/}"
rm -rf .gpu && mkdir -p .gpu/bin/tests/cuda .gpu/bin/bench .gpu/lib .gpu/shared/models
for t in "${TARGETS[@]}"; do cp "build-gpu/$t" ".gpu/bin/$t"; done
# Libraries from Debian's packages (absl, OpenBLAS and its Fortran runtime, PCRE2); glibc,
# libstdc++ and CUDA's own libraries are the GPU machine's.
for t in "${TARGETS[@]}"; do ldd "build-gpu/$t"; done | awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -E 'libabsl|openblas|gfortran|quadmath|pcre2' | xargs -I{} cp -L {} .gpu/lib/
cp -r "$SHARED/models/stories260K" .gpu/shared/models/
rm -rf .gpuz && mkdir .gpuz && tar cJf .gpuz/gpu.tar.xz .gpu
du -sh .gpu .gpuz
