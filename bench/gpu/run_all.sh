#!/usr/bin/env bash
# shellcheck disable=SC2086  # the *_ARGS knobs split into words on purpose
# On a GPU machine, from the repository root: the CUDA tests, the decode benchmark,
# transformers' baseline and the report side by side, and the TP eviction collectives on CUDA
# ranks sharing the GPU (staged). Logs and JSON go to $OUT (default /tmp/recall-gpu). Knobs:
# TEST_ARGS, BENCH=0 (tests only), BENCH_ARGS, HF_ARGS, GRAPHS_CMP=0 (skip the run without
# CUDA graphs), OPS=0 (skip the per-op GPU times), TP_BENCH=0 (skip the TP benchmark),
# KV_DTYPES="bf16 int8" (the decode benchmark again per KV type, beside bench.log's f32),
# WEIGHT_DTYPES="int8 fp8" (again per type of the layers' weights, beside a bf16 run),
# FP8_GEMM=0 (skip the FP8 prefill matmul benchmark), MATMUL=0 (skip decode's matmuls under
# each count of chunks in flight), CHUNKS="2 4" (the WEIGHT_DTYPES decode runs again with
# each count of chunks in flight, beside the default's).
set -u
OUT=${OUT:-/tmp/recall-gpu}; mkdir -p "$OUT"
# BIN: the build folder with tests/cuda/ and bench/ (default: build/);
# LIB: extra shared libraries to load first (a bundle built on another machine).
BIN=${BIN:-$PWD/build}
CUBLAS_DIRS=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && CUBLAS_DIRS="$CUBLAS_DIRS$d:"
done
PIP_NV=$(python3 -c "import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))" 2>/dev/null)
PIP_LIBS=$(find "$PIP_NV/nvidia" \( -name 'libcublas*.so*' -o -name 'libnccl*.so*' \) -printf '%h\n' 2>/dev/null | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH=${LIB:-}:$CUBLAS_DIRS$PIP_LIBS${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem --format=csv
ldd "$BIN"/tests/cuda/recall_cuda_test | grep -E "not found|cublas"
lscpu | grep -E "Model name|Flags" | cut -c1-200
timeout ${TEST_TIMEOUT:-180} "$BIN"/tests/cuda/recall_cuda_test ${TEST_ARGS:-} > "$OUT"/cuda_test.log 2>&1
echo "cuda test rc=$?"
grep -E "^\[  (FAILED|  OK|PASSED|SKIPPED) |Failure|error|Expected|Which is|actual|rel|<" "$OUT"/cuda_test.log | grep -v "^\[       OK" | head -60
tail -3 "$OUT"/cuda_test.log
# A session served past the context on the GPU (Scheduler over a CUDA engine; it links
# libnccl through the engine's TP ranks, like the TP test below).
ldd "$BIN"/tests/cuda/recall_cuda_serving_test | grep -E "not found|nccl"
timeout ${TEST_TIMEOUT:-180} "$BIN"/tests/cuda/recall_cuda_serving_test > "$OUT"/cuda_serving_test.log 2>&1
echo "cuda serving test rc=$?"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|Expected|Which is|GPU session" "$OUT"/cuda_serving_test.log | head -20
# Tensor-parallel CUDA ranks (needs libnccl: the toolkit's, or PyTorch's nvidia-nccl wheel).
ldd "$BIN"/tests/cuda/recall_cuda_tp_test | grep -E "not found|nccl"
timeout ${TEST_TIMEOUT:-180} "$BIN"/tests/cuda/recall_cuda_tp_test > "$OUT"/cuda_tp_test.log 2>&1
echo "cuda tp test rc=$?"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|Expected|Which is" "$OUT"/cuda_tp_test.log | head -30
if [ "${BENCH:-1}" = 1 ]; then
  timeout ${BENCH_TIMEOUT:-240} "$BIN"/bench/recall_gpu_decode_bench ${BENCH_ARGS:-} --out-json "$OUT"/recall.json 2>&1 | tee "$OUT"/bench.log
  PYTHONUNBUFFERED=1 timeout ${HF_TIMEOUT:-150} python3 bench/gpu/hf_decode.py --no-cudnn-sdpa ${HF_ARGS:-} --out-json "$OUT"/hf.json > "$OUT"/hf.log 2>&1
  echo "hf rc=$?"; tail -3 "$OUT"/hf.log
  python3 bench/gpu/report.py "$OUT"/recall.json "$OUT"/hf.json | tee "$OUT"/report.txt
fi
if [ "${BENCH:-1}" = 1 ] && [ "${GRAPHS_CMP:-1}" = 1 ]; then
  # The same steps launched op by op (no CUDA graphs): compare with bench.log's lines.
  timeout ${GRAPHS_TIMEOUT:-120} "$BIN"/bench/recall_gpu_decode_bench --shapes smollm2-135m,llama-3-8b \
    --batches 1,16 --contexts 1024 --graphs 0 > "$OUT"/no_graphs.txt 2>&1
  echo "no graphs rc=$?"; grep -E "^recall" "$OUT"/no_graphs.txt
fi
if [ "${BENCH:-1}" = 1 ] && [ "${OPS:-1}" = 1 ]; then
  # Where a step's time goes: GPU time per op beside the wall time (batch 1 and 16, 1K).
  timeout ${OPS_TIMEOUT:-120} "$BIN"/bench/recall_gpu_decode_bench --shapes smollm2-135m,llama-3-8b \
    --batches 1,16 --contexts 1024 --steps 16 --time-ops 1 > "$OUT"/op_times.txt 2>&1
  echo "op times rc=$?"; grep -E "^GPU time|all ops|^  matmul" "$OUT"/op_times.txt | head -40
fi
for d in ${KV_DTYPES:-}; do
  # The same steps with KV cached in another type: attention reads fewer bytes, and more
  # sessions fit (the capacity lines). Compare with bench.log's f32 lines of this run.
  timeout ${KV_TIMEOUT:-120} "$BIN"/bench/recall_gpu_decode_bench --shapes smollm2-135m,llama-3-8b \
    --batches 1,16 --contexts 1024,8192 --kv-dtype "$d" > "$OUT"/kv_"$d".txt 2>&1
  echo "kv $d rc=$?"; grep -E "^recall|sessions|lazy" "$OUT"/kv_"$d".txt | head -24
done
for d in ${WEIGHT_DTYPES:-}; do
  # Int8 / FP8 linear weights (issue 31): half the bytes of bf16 per step. Compare with the
  # bf16 lines of weights_bf16.txt, measured in the same loop.
  for w in bf16 "$d"; do
    [ "$w" = bf16 ] && [ -f "$OUT"/weights_bf16.txt ] && continue
    timeout ${WEIGHTS_TIMEOUT:-120} "$BIN"/bench/recall_gpu_decode_bench --shapes qwen2.5-0.5b,llama-3-8b \
      --batches 1,16 --contexts 1024 --weight-dtype "$w" > "$OUT"/weights_"$w".txt 2>&1
    echo "weights $w rc=$?"; grep -E "^recall|FAIL|weights read" "$OUT"/weights_"$w".txt | head -12
  done
  for u in ${CHUNKS:-}; do
    timeout ${WEIGHTS_TIMEOUT:-120} "$BIN"/bench/recall_gpu_decode_bench --shapes qwen2.5-0.5b,llama-3-8b \
      --batches 1 --contexts 1024 --weight-dtype "$d" --chunks-in-flight "$u" > "$OUT"/weights_"$d"_u"$u".txt 2>&1
    echo "weights $d chunks in flight $u rc=$?"; grep -E "^recall|FAIL" "$OUT"/weights_"$d"_u"$u".txt | head -4
  done
done
if [ "${BENCH:-1}" = 1 ] && [ "${MATMUL:-1}" = 1 ]; then
  # Decode's matmuls (1 and 4 rows) on bf16, int8 and FP8 weights under 1, 2 and 4 chunks in
  # flight: time, bytes per second against the copy bandwidth, and bit equality.
  timeout ${MATMUL_TIMEOUT:-120} "$BIN"/bench/recall_gpu_matmul_bench > "$OUT"/matmul.txt 2>&1
  echo "matmul rc=$?"; cat "$OUT"/matmul.txt | head -100
fi
if [ "${BENCH:-1}" = 1 ] && [ "${FP8_GEMM:-1}" = 1 ]; then
  # FP8 matmuls of many rows (prefill): cuBLASLt's FP8 GEMM against our kernel and bf16 cuBLAS.
  timeout ${FP8_GEMM_TIMEOUT:-120} "$BIN"/bench/recall_gpu_fp8_gemm_bench > "$OUT"/fp8_gemm.txt 2>&1
  echo "fp8 gemm rc=$?"; cat "$OUT"/fp8_gemm.txt | head -20
fi
if [ "${BENCH:-1}" = 1 ] && [ "${TP_BENCH:-1}" = 1 ]; then
  timeout ${TP_TIMEOUT:-180} "$BIN"/bench/recall_tp_eviction_bench --device cuda --tp 2 \
    --devices 0,0 --tp-comm staged --steps 96 2>&1 | tee "$OUT"/tp_eviction_cuda.txt
fi
