// FP8 matmuls of many rows on the tensor cores: cuBLASLt's block-scaled FP8 GEMM (cuBLAS 12.9
// and later; Hopper, sm_90). y [n, rows] = x [n, cols] * w^T for w of DType::kF8E4M3 whose
// scales cover blocks of 128 columns (an FP8 checkpoint's 128x128 blocks, or Recall's own
// 1x128 quantization). Unlike the batch-invariant kernel (kernels/cuda/matmul.cu), which
// widens the weights and keeps x in fp32, the activations are quantized too: per row and block
// of 128 columns to E4M3 with an fp32 scale (DeepSeek-V3's recipe), so an output is off the
// widened weights' product by at most about 2^-4 of sum |x_k w_k| (E4M3 keeps 3 mantissa
// bits). cuBLASLt reads both operands' scales per 128 elements of K (VEC128_32F), the outer
// dimension contiguous: the weights' [rows][blocks] scales are transposed on every call (1/32
// of the weights' bytes).
//
// The CUDA backend takes this path only for FP8 matmuls of more than its batch-invariant rows
// (prefill and large batches with batch invariance off), after a start-up check against the
// host (kernels/cpu/matmul_check.h, CheckFp8ManyRows); a shape cuBLASLt has no algorithm for
// stays on the batch-invariant kernel.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "absl/status/statusor.h"
#include "common/cuda/cuda_raii.h"
#include "kernels/tensor.h"

namespace recall::kernels::cuda {

class Fp8Gemm {
 public:
  // Null (not an error) where cuBLASLt has no block-scaled FP8: a cuBLAS older than 12.9, a
  // device of compute capability below 9.0, or no cuBLASLt handle (a warning). Ops are
  // queued on `stream`.
  static absl::StatusOr<std::unique_ptr<Fp8Gemm>> Create(int device, cudaStream_t stream);
  ~Fp8Gemm();
  Fp8Gemm(const Fp8Gemm&) = delete;
  Fp8Gemm& operator=(const Fp8Gemm&) = delete;

  // Whether Run takes w, x and y: FP8 with 128-column scale blocks, cols a multiple of 128,
  // rows a multiple of 16, all three 16-byte aligned (cuBLASLt's FP8 minimum).
  static bool Takes(const Matrix& w, const float* x, const float* y);
  // The rows of an n-row call that Run takes (n rounded down to 16); the caller multiplies the
  // rest.
  static int GemmRows(int n) { return n / 16 * 16; }

  // Scratch for calls of up to n rows of x of up to `cols` columns (the weights' scales, a
  // 1/128 of a matrix's fp32 size, grow on the first call of each larger shape).
  absl::Status Reserve(int64_t n, int64_t cols);
  // y = x * w^T. REQUIRES: Takes(w, x, y), n == GemmRows(n) > 0. Unavailable when y was not
  // written and the caller should multiply another way: cuBLASLt has no algorithm for the
  // shape or refused the call as unsupported (logged once per shape; the shape is not tried
  // again), or the scratch could not be allocated. Another error when a queued call failed.
  // The algorithm is asked for the pointers' real alignment (cuBLASLt assumes 256 bytes
  // unless told), so a weight or output view at a 16-byte offset gets a kernel that takes it.
  absl::Status Run(const float* x, int n, const Matrix& w, float* y);

 private:
  struct Plan {
    bool supported = false;
    cudaDataType_t out = CUDA_R_32F;  // the GEMM's output type (bf16 is widened after)
    cublasLtMatmulAlgo_t algo{};
  };
  Fp8Gemm(cublasLtHandle_t handle, cudaStream_t stream) : handle_(handle), stream_(stream) {}
  // The algorithm for an (rows, cols, n) call whose weights and fp32 output are aligned to
  // align_w and align_y bytes: fp32 output first, else bf16 (into out_bf16_); unsupported
  // (and a warning) when cuBLASLt offers neither or refuses the descriptors.
  Plan& PlanFor(int64_t rows, int64_t cols, int n, uint32_t align_w, uint32_t align_y);
  void Refused(int64_t rows, int64_t cols, int n, const std::string& why);
  absl::Status Grow(recall::cuda::DeviceBuffer& buffer, size_t bytes);

  cublasLtHandle_t handle_;
  cudaStream_t stream_;
  recall::cuda::DeviceBuffer workspace_;
  recall::cuda::DeviceBuffer x_q_;       // x in E4M3
  recall::cuda::DeviceBuffer x_scales_;  // [cols / 128, n]
  recall::cuda::DeviceBuffer w_scales_;  // [cols / 128, rows]
  recall::cuda::DeviceBuffer out_bf16_;  // [n, rows] where the plan's output is bf16
  std::map<std::tuple<int64_t, int64_t, int, uint32_t, uint32_t>, Plan> plans_;
  std::set<std::pair<int64_t, int64_t>> warned_;  // shapes refused and logged
};

}  // namespace recall::kernels::cuda
