// The CUDA backend: the Backend interface (kernels/backend.h) on one NVIDIA GPU. Activations,
// weights and the KV pool live in device memory (Backend::memory()); ops are queued in order
// on the backend's own stream. Matmuls of up to 64 rows (decode batches, batch-invariant
// pieces) are our own batch-invariant kernel (fp32 activations times the weights widened to
// fp32); larger ones go through cuBLAS (bf16/f16 weights: the activations are rounded to the
// weights' type and accumulated in fp32; f32 weights: fp32 SGEMM without TF32; FP8 weights:
// cuBLASLt's block-scaled FP8 GEMM on Hopper, kernels/cuda/fp8_gemm.h); every other
// op is one of our kernels (kernels/cuda/), LazyEviction's per-step update
// (LazyObserve) and eviction step (LazyEvict), the greedy choice (ArgmaxRows) and
// temperature / top-k / top-p sampling (SampleRows) included. Sampling with a repetition
// penalty runs the CPU reference sampler on the logits the forward pass copies back.
//
// Built when RECALL_WITH_CUDA is on; otherwise CreateCudaBackend answers Unimplemented.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace recall::kernels {

struct CudaBackendOptions {
  int device = 0;  // CUDA device ordinal
  // Records the GPU time of every op (two CUDA events each; for profiling: CudaOpTimes).
  bool time_ops = false;
  // Token picks (ArgmaxRows, SampleRows) on the host: the logits rows are copied back and
  // picked by the reference sampler. Otherwise CreateCudaBackend first checks the device's
  // pick kernels against that reference (CheckPicks, kernels/cpu/pick_check.h) and, if they
  // disagree or fail, logs a warning and picks on the host (CudaPicksOnHost says which).
  bool host_picks = false;
  // LazyEviction's eviction step (LazyEvict) on the host: each row's state is copied back and
  // its keep list chosen by the reference. Otherwise CreateCudaBackend checks the device's
  // eviction kernel against that reference (CheckLazyEvict, kernels/cpu/lazy_evict_check.h)
  // and falls back the same way (CudaEvictsOnHost says which).
  bool host_evict = false;
  // Every matmul through cuBLAS (BatchInvariantRows() is then 1) and the fused ops
  // (MatMulMany, AddRmsNorm) as their plain sequences. Otherwise CreateCudaBackend checks our
  // batch-invariant matmul and fused kernels against the host reference (CheckMatMul,
  // kernels/cpu/matmul_check.h) and falls back the same way (CudaMatMulsOnCublas says which).
  bool cublas_matmuls = false;
  // Key re-rotation (RerotateKeys) on the host: each moved key row is copied back, rotated by
  // the reference and copied in. Otherwise CreateCudaBackend checks the device's kernel
  // against that reference (CheckRerotate, kernels/cpu/rerotate_check.h) and falls back the
  // same way.
  bool host_rerotate = false;
  // Refuse int8 weights (RunsInt8Weights() false). Otherwise CreateCudaBackend checks the int8
  // matmul and embedding (CheckInt8MatMul, kernels/cpu/matmul_check.h) and, when they fail,
  // refuses them this way: an engine with int8 weights then fails to start, by name.
  bool refuse_int8_weights = false;
  // Refuse FP8 weights (RunsFp8Weights() false), as refuse_int8_weights for CheckFp8MatMul.
  bool refuse_fp8_weights = false;
  // FP8 matmuls of every row count on the batch-invariant kernel. Otherwise, on Hopper with
  // cuBLAS 12.9 or later, those of more than BatchInvariantRows() rows (prefill and decode
  // batches with batch invariance off) go to cuBLASLt's block-scaled FP8 GEMM
  // (kernels/cuda/fp8_gemm.h: the activations are quantized to E4M3 too), once
  // CreateCudaBackend has checked it (CheckFp8ManyRows, kernels/cpu/matmul_check.h); a failed
  // check falls back the same way (CudaFp8OnCublasLt says which).
  bool no_fp8_gemm = false;
  // Chunks of 8 weights each lane of the batch-invariant matmul loads before their FMAs, at up
  // to 4 rows (decode): 1, 2 or 4, or 0 for the default of the weights' type
  // (kernels/cuda/matmul.cu). Every value gives the same bits; only the speed differs (for
  // benchmarks: recall_gpu_matmul_bench, recall_gpu_decode_bench --chunks-in-flight).
  int skinny_chunks_in_flight = 0;
};

// FailedPrecondition when no CUDA device is present (or `device` is out of range);
// Unimplemented in builds without CUDA.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const CudaBackendOptions& options = {});

// Number of CUDA devices this process sees (0 without CUDA or a driver).
int CudaDeviceCount();

// Free memory of CUDA device `device` in bytes (cudaMemGetInfo), for sizing a KV pool.
// FailedPrecondition for a device that does not exist; Unimplemented without CUDA.
absl::StatusOr<int64_t> CudaFreeMemory(int device);

// The cudaStream_t (as void*) a CUDA backend queues its ops on, so other work (NCCL) can be
// ordered with them; null for other backends and in builds without CUDA.
void* CudaStreamOf(Backend& backend);

// A CUDA backend created with time_ops: a table of GPU time per op (matmuls per weight shape
// and row count), waiting for the ops queued so far; `reset` starts the totals afresh. Empty
// for other backends, without time_ops and in builds without CUDA.
std::string CudaOpTimes(Backend& backend, bool reset);

// Whether a CUDA backend picks tokens on the host (CudaBackendOptions::host_picks, asked for
// or taken after a failed check); false for other backends and in builds without CUDA.
bool CudaPicksOnHost(Backend& backend);
// Whether a CUDA backend moves keys to new positions on the host (host_rerotate).
bool CudaRerotatesOnHost(Backend& backend);

// Whether a CUDA backend runs LazyEvict on the host (CudaBackendOptions::host_evict, asked for
// or taken after a failed check); false for other backends and in builds without CUDA.
bool CudaEvictsOnHost(Backend& backend);

// Whether a CUDA backend runs every matmul through cuBLAS (CudaBackendOptions::cublas_matmuls,
// asked for or taken after a failed check); false for other backends and without CUDA.
bool CudaMatMulsOnCublas(Backend& backend);

// Whether a CUDA backend sends FP8 matmuls of many rows to cuBLASLt's FP8 GEMM (Hopper,
// cuBLAS 12.9+, not no_fp8_gemm, check passed); false for other backends and without CUDA.
bool CudaFp8OnCublasLt(Backend& backend);

// Makes `device` the calling thread's current CUDA device (cudaSetDevice). A thread must do
// this before it queues ops of a backend on that device when the process drives several GPUs
// (kernel launches go to the current device). Unimplemented without CUDA.
absl::Status CudaBindThread(int device);

}  // namespace recall::kernels
