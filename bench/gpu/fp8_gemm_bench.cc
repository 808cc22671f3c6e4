// FP8 matmuls of many rows on a GPU (issue 31): cuBLASLt's block-scaled FP8 GEMM
// (kernels/cuda/fp8_gemm.h) against our batch-invariant kernel on the same FP8 weights and
// against cuBLAS on bf16 weights (what a bf16 model's prefill runs), in one run. Random
// weights of the linear shapes of Llama-3-8B and Qwen2.5-0.5B, blocks of 128 columns; x fp32.
// Prints, per (shape, rows): the time and TFLOP/s of each path, the FP8 paths' ratios against
// bf16 cuBLAS (the named baseline), and the FP8 GEMM's relative error against the kernel's
// product (the kernel keeps x in fp32; the GEMM quantizes it to E4M3).
//
//   recall_gpu_fp8_gemm_bench [--rows 256,1024,4096] [--iters 20]
#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "bench/gpu/device_buffers.h"
#include "kernels/cuda_backend.h"
#include "kernels/fp8.h"
#include "worker/model/half.h"

namespace recall {
namespace {

using kernels::Backend;
using kernels::Buffer;
using kernels::DType;
using kernels::Matrix;

struct Shape {
  const char* name;
  int64_t rows, cols;
};

// Seconds per call: 2 calls to warm up, then `iters` timed between device-wide waits.
double Time(const std::function<void()>& call, int iters) {
  call();
  call();
  cudaDeviceSynchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) call();
  cudaDeviceSynchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
}

int Run(const std::vector<int>& row_counts, int iters) {
  if (kernels::CudaDeviceCount() == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  auto lt = kernels::CreateCudaBackend();
  kernels::CudaBackendOptions plain;
  plain.no_fp8_gemm = true;
  auto kernel = kernels::CreateCudaBackend(plain);
  if (!lt.ok() || !kernel.ok()) {
    std::fprintf(stderr, "cuda backend: %s %s\n", lt.status().ToString().c_str(),
                 kernel.status().ToString().c_str());
    return 1;
  }
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  std::printf("device %s (sm_%d%d); cuBLASLt FP8 GEMM in use: %s\n", prop.name, prop.major,
              prop.minor, kernels::CudaFp8OnCublasLt(**lt) ? "yes" : "NO (kernel only)");
  const Shape shapes[] = {{"llama-3-8b q/o", 4096, 4096},
                          {"llama-3-8b gate/up", 14336, 4096},
                          {"llama-3-8b down", 4096, 14336},
                          {"qwen2.5-0.5b gate/up", 4864, 896},
                          {"qwen2.5-0.5b down", 896, 4864}};
  std::mt19937 rng(7);
  for (const Shape& s : shapes) {
    const size_t count = static_cast<size_t>(s.rows * s.cols);
    // FP8: random finite E4M3 bytes, one scale per row and 128 columns.
    Matrix fp8{nullptr, DType::kF8E4M3, s.rows, s.cols};
    fp8.scale_block = 128;
    std::vector<uint8_t> bytes(count);
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng() % 0x7F) | (rng() & 0x80);
    std::vector<float> scales(static_cast<size_t>(s.rows * fp8.ScaleColumns()));
    for (float& f : scales) f = std::ldexp(1.0f, -9 - static_cast<int>(rng() % 4));
    std::vector<uint16_t> bf16(count);
    for (size_t i = 0; i < count; ++i) {
      const float w = kernels::E4M3ToF32(bytes[i]) * scales[i / 128];  // cols % 128 == 0
      bf16[i] = model::F32ToBf16(w);
    }
    const Buffer w8 = bench::UploadOrExit(**lt, bytes.data(), bytes.size());
    const Buffer s8 = bench::UploadOrExit(**lt, scales.data(), scales.size() * sizeof(float));
    const Buffer w16 = bench::UploadOrExit(**lt, bf16.data(), bf16.size() * 2);
    fp8.data = w8.get();
    fp8.scales = s8.as<float>();
    const Matrix half{w16.get(), DType::kBF16, s.rows, s.cols};
    for (const int n : row_counts) {
      std::vector<float> x(static_cast<size_t>(n) * s.cols);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (float& v : x) v = normal(rng);
      const Buffer dx = bench::UploadOrExit(**lt, x.data(), x.size() * sizeof(float));
      const size_t out = static_cast<size_t>(n) * s.rows;
      const std::vector<float> zeros(out, 0.0f);
      const Buffer y_lt = bench::UploadOrExit(**lt, zeros.data(), out * 4);
      const Buffer y_kernel = bench::UploadOrExit(**lt, zeros.data(), out * 4);
      const Buffer y_bf16 = bench::UploadOrExit(**lt, zeros.data(), out * 4);
      const float* xf = dx.as<float>();
      const double t_bf16 = Time([&] { (*lt)->MatMul(xf, n, half, y_bf16.as<float>()); }, iters);
      const double t_lt = Time([&] { (*lt)->MatMul(xf, n, fp8, y_lt.as<float>()); }, iters);
      const double t_kernel =
          Time([&] { (*kernel)->MatMul(xf, n, fp8, y_kernel.as<float>()); }, iters);
      const std::vector<float> a = bench::DownloadFloats(**lt, y_lt, out),
                               b = bench::DownloadFloats(**lt, y_kernel, out);
      double diff = 0, norm = 0;
      for (size_t i = 0; i < out; ++i) {
        diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
        norm += static_cast<double>(b[i]) * b[i];
      }
      const double flop = 2.0 * n * s.rows * s.cols;
      std::printf(
          "%-22s %5lldx%-5lld n %5d: bf16 cublas %8.3f ms %6.1f TFLOP/s | fp8 kernel %8.3f ms "
          "%6.1f TFLOP/s (%.2fx bf16) | fp8 cublaslt %8.3f ms %6.1f TFLOP/s (%.2fx bf16, %.2fx "
          "kernel) rel err %.2e\n",
          s.name, static_cast<long long>(s.rows), static_cast<long long>(s.cols), n, t_bf16 * 1e3,
          flop / t_bf16 / 1e12, t_kernel * 1e3, flop / t_kernel / 1e12, t_bf16 / t_kernel,
          t_lt * 1e3, flop / t_lt / 1e12, t_bf16 / t_lt, t_kernel / t_lt,
          std::sqrt(diff / std::max(norm, 1e-30)));
      for (Backend* backend : {lt->get(), kernel->get()}) {
        if (const absl::Status h = backend->Health(); !h.ok()) {
          std::fprintf(stderr, "FAIL: %s\n", h.ToString().c_str());
          return 1;
        }
      }
    }
  }
  return 0;
}

constexpr char kUsage[] =
    R"U(usage: recall_gpu_fp8_gemm_bench [--rows 256,1024,4096] [--iters 20]

FP8 matmuls of many rows on a CUDA device: cuBLASLt's block-scaled FP8 GEMM against our
kernel on the same FP8 weights and against cuBLAS on bf16 weights, on random weights of
Llama-3-8B's and Qwen2.5-0.5B's linear shapes (blocks of 128 columns; x fp32). Prints per
(shape, rows) each path's time and TFLOP/s, the FP8 paths' ratios against bf16 cuBLAS, and
the FP8 GEMM's relative error against the kernel's product.

options:
  --rows LIST             rows of x (tokens) per matmul, positive counts (default 256,1024,4096)
  --iters N               timed calls per path, after two warm-up calls (default 20)
  -h, --help              print this and exit
)U";

}  // namespace
}  // namespace recall

int main(int argc, char** argv) {
  if (recall::bench::PrintHelpIfAsked(argc, argv, recall::kUsage)) return 0;
  std::vector<int> rows = {256, 1024, 4096};
  int iters = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--rows") {
      rows.clear();
      for (const absl::string_view part : absl::StrSplit(v, ',')) {
        int n = 0;
        if (!absl::SimpleAtoi(part, &n) || n <= 0) {
          std::fprintf(stderr, "--rows: %s is not a list of positive counts\n", v.c_str());
          return 2;
        }
        rows.push_back(n);
      }
    } else if (a == "--iters") {
      if (!absl::SimpleAtoi(v, &iters) || iters <= 0) {
        std::fprintf(stderr, "--iters: %s is not a positive count\n", v.c_str());
        return 2;
      }
    } else {
      std::fprintf(stderr, "unknown flag %s (flags: --rows, --iters)\n", a.c_str());
      return 2;
    }
  }
  return recall::Run(rows, iters);
}
