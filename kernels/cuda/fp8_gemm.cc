// cuBLASLt's block-scaled FP8 GEMM (kernels/cuda/fp8_gemm.h).
#include "kernels/cuda/fp8_gemm.h"

#include <cublas_api.h>

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "kernels/cuda/launch.h"

namespace recall::kernels::cuda {
namespace {

constexpr int64_t kBlock = 128;
constexpr size_t kWorkspaceBytes = 32u << 20;  // what cuBLASLt's Hopper kernels may ask for
constexpr uint32_t kMallocAlignment = 256;     // cudaMalloc's, our scratch's

// The largest power of two (at most 256) that divides p's address.
uint32_t Alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  return a == 0 ? kMallocAlignment
                : static_cast<uint32_t>(std::min<uintptr_t>(a & (~a + 1), kMallocAlignment));
}

// cuBLASLt answers these before running anything: the call is not for this shape or
// alignment, and another kernel may take it.
bool Unsupported(cublasStatus_t st) {
  return st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE ||
         st == CUBLAS_STATUS_ARCH_MISMATCH;
}

absl::Status LtStatus(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cublasLt ", what, ": ", cublasGetStatusString(st)));
}

#define RECALL_LT_RETURN_IF_ERROR(call) RECALL_RETURN_IF_ERROR(LtStatus((call), #call))

// The descriptors of one call, destroyed with it.
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  ~Descriptors() {
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

#if CUBLAS_VERSION >= 120900
// Column-major, as cuBLASLt sees it: A = w^T's storage (k x m, ld = cols, transposed), B = x
// (k x n, ld = cols), D = y^T (m x n, ld = rows), which is y [n, rows] row-major.
absl::Status Describe(Descriptors& d, int64_t rows, int64_t cols, int n, cudaDataType_t out,
                      const float* w_scales, const float* x_scales) {
  RECALL_LT_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transpose = CUBLAS_OP_T, none = CUBLAS_OP_N;
  RECALL_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA,
                                                           &transpose, sizeof(transpose)));
  RECALL_LT_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &none, sizeof(none)));
  const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  RECALL_LT_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode)));
  RECALL_LT_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode)));
  RECALL_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      d.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scales, sizeof(w_scales)));
  RECALL_LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      d.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scales, sizeof(x_scales)));
  RECALL_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&d.a, CUDA_R_8F_E4M3, cols, rows, cols));
  RECALL_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&d.b, CUDA_R_8F_E4M3, cols, n, cols));
  RECALL_LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&d.d, out, rows, n, rows));
  return absl::OkStatus();
}
#endif

}  // namespace

absl::StatusOr<std::unique_ptr<Fp8Gemm>> Fp8Gemm::Create(int device, cudaStream_t stream) {
#if CUBLAS_VERSION >= 120900
  if (cublasLtGetVersion() < 120900) return std::unique_ptr<Fp8Gemm>();
  int major = 0;
  RECALL_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major < 9) return std::unique_ptr<Fp8Gemm>();
  cublasLtHandle_t handle = nullptr;
  if (const cublasStatus_t st = cublasLtCreate(&handle); st != CUBLAS_STATUS_SUCCESS) {
    RECALL_LOG(WARNING) << "cublasLtCreate: " << cublasGetStatusString(st)
                        << "; FP8 matmuls stay on the batch-invariant kernel";
    return std::unique_ptr<Fp8Gemm>();
  }
  return std::unique_ptr<Fp8Gemm>(new Fp8Gemm(handle, stream));
#else
  return std::unique_ptr<Fp8Gemm>();
#endif
}

Fp8Gemm::~Fp8Gemm() {
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

bool Fp8Gemm::Takes(const Matrix& w, const float* x, const float* y) {
  return w.dtype == DType::kF8E4M3 && w.scale_block == kBlock && w.cols % kBlock == 0 &&
         w.rows % 16 == 0 && Alignment(x) >= 16 && Alignment(y) >= 16 && Alignment(w.data) >= 16;
}

absl::Status Fp8Gemm::Grow(recall::cuda::DeviceBuffer& buffer, size_t bytes) {
  if (buffer.bytes() >= bytes) return absl::OkStatus();
  if (buffer.get() != nullptr) cudaStreamSynchronize(stream_);  // queued calls may read it
  buffer = recall::cuda::DeviceBuffer();
  RECALL_ASSIGN_OR_RETURN(buffer, recall::cuda::DeviceBuffer::Allocate(bytes));
  return absl::OkStatus();
}

absl::Status Fp8Gemm::Reserve(int64_t n, int64_t cols) {
  const int64_t blocks = (cols + kBlock - 1) / kBlock;
  RECALL_RETURN_IF_ERROR(Grow(workspace_, kWorkspaceBytes));
  RECALL_RETURN_IF_ERROR(Grow(x_q_, static_cast<size_t>(n * cols)));
  return Grow(x_scales_, static_cast<size_t>(n * blocks) * sizeof(float));
}

void Fp8Gemm::Refused(int64_t rows, int64_t cols, int n, const std::string& why) {
  if (!warned_.insert(std::make_pair(rows, cols)).second) return;
  RECALL_LOG(WARNING) << "cublasLt: no block-scaled FP8 GEMM for " << rows << "x" << cols << " by "
                      << n << " rows (" << why
                      << "); those matmuls stay on the batch-invariant kernel (said once per "
                         "shape)";
}

Fp8Gemm::Plan& Fp8Gemm::PlanFor(int64_t rows, int64_t cols, int n, uint32_t align_w,
                                uint32_t align_y) {
  const auto key = std::make_tuple(rows, cols, n, align_w, align_y);
  if (const auto it = plans_.find(key); it != plans_.end()) return it->second;
  Plan plan;
  std::string refused;
#if CUBLAS_VERSION >= 120900
  cublasLtMatmulPreference_t preference = nullptr;
  if (cublasLtMatmulPreferenceCreate(&preference) == CUBLAS_STATUS_SUCCESS) {
    const size_t workspace = kWorkspaceBytes;
    cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                         &workspace, sizeof(workspace));
    // A is the weights, B our quantized x; C and D the output (y, or our bf16 scratch).
    const uint32_t align_b = kMallocAlignment;
    cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                         &align_w, sizeof(align_w));
    cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                         &align_b, sizeof(align_b));
    for (const cudaDataType_t out : {CUDA_R_32F, CUDA_R_16BF}) {
      const uint32_t align_d = out == CUDA_R_32F ? align_y : kMallocAlignment;
      cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                           &align_d, sizeof(align_d));
      cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                           &align_d, sizeof(align_d));
      Descriptors d;
      // The scale pointers only need to be set for the query; any aligned device address does.
      const absl::Status described =
          Describe(d, rows, cols, n, out, w_scales_.as<float>(), x_scales_.as<float>());
      if (!described.ok()) {
        refused = std::string(described.message());
        break;
      }
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle_, d.op, d.a, d.b, d.d, d.d,
                                                               preference, 1, &result, &found);
      if (st == CUBLAS_STATUS_SUCCESS && found > 0) {
        plan = Plan{true, out, result.algo};
        break;
      }
      absl::StrAppend(
          &refused, refused.empty() ? "" : "; ", out == CUDA_R_32F ? "fp32" : "bf16",
          " output: ", st == CUBLAS_STATUS_SUCCESS ? "no algorithm" : cublasGetStatusString(st));
    }
    cublasLtMatmulPreferenceDestroy(preference);
  } else {
    refused = "cublasLtMatmulPreferenceCreate failed";
  }
#else
  refused = "built with a cuBLAS older than 12.9";
#endif
  if (!plan.supported) Refused(rows, cols, n, refused);
  return plans_.emplace(key, plan).first->second;
}

absl::Status Fp8Gemm::Run(const float* x, int n, const Matrix& w, float* y) {
  const int64_t rows = w.rows, cols = w.cols, blocks = cols / kBlock;
  if (const absl::Status st = Reserve(n, cols); !st.ok())
    return absl::UnavailableError(st.message());
  if (const absl::Status st = Grow(w_scales_, static_cast<size_t>(rows * blocks) * sizeof(float));
      !st.ok()) {
    return absl::UnavailableError(st.message());
  }
  Plan& plan = PlanFor(rows, cols, n, Alignment(w.data), Alignment(y));
  if (!plan.supported) {
    return absl::UnavailableError(absl::StrCat("cublasLt has no block-scaled FP8 GEMM for ", rows,
                                               "x", cols, " by ", n, " rows"));
  }
  void* out = y;
  if (plan.out == CUDA_R_16BF) {
    if (const absl::Status st = Grow(out_bf16_, static_cast<size_t>(n * rows) * 2); !st.ok()) {
      return absl::UnavailableError(st.message());
    }
    out = out_bf16_.get();
  }
#if CUBLAS_VERSION >= 120900
  Descriptors d;
  if (const absl::Status st =
          Describe(d, rows, cols, n, plan.out, w_scales_.as<float>(), x_scales_.as<float>());
      !st.ok()) {
    return absl::UnavailableError(st.message());
  }
  LaunchQuantizeE4M3Rows(x, n, cols, x_q_.as<uint8_t>(), x_scales_.as<float>(), stream_);
  LaunchTransposeScales(w.scales, rows, blocks, w_scales_.as<float>(), stream_);
  RECALL_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  const float one = 1.0f, zero = 0.0f;
  const cublasStatus_t st =
      cublasLtMatmul(handle_, d.op, &one, w.data, d.a, x_q_.get(), d.b, &zero, out, d.d, out, d.d,
                     &plan.algo, workspace_.get(), workspace_.bytes(), stream_);
  if (Unsupported(st)) {  // refused before it ran: only our scratch was written
    plan.supported = false;
    Refused(rows, cols, n, absl::StrCat("cublasLtMatmul: ", cublasGetStatusString(st)));
    return absl::UnavailableError(absl::StrCat("cublasLtMatmul: ", cublasGetStatusString(st)));
  }
  RECALL_RETURN_IF_ERROR(LtStatus(st, "cublasLtMatmul"));
  if (plan.out == CUDA_R_16BF) {
    LaunchWidenBf16(out, static_cast<int64_t>(n) * rows, y, stream_);
    RECALL_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
#endif
  return absl::OkStatus();
}

}  // namespace recall::kernels::cuda
