// Every op of the CUDA backend against the CPU reference over a grid of shapes and dtypes.
// Outputs are poisoned with NaN first, so an unwritten element fails. Tolerances (relative
// error ||gpu - cpu|| / ||cpu||): exact for embedding and KV stores; 1e-5 for fp32
// arithmetic (other summation orders, libm vs CUDA expf/cosf; 1e-4 for a 49152-wide softmax,
// whose sequential CPU sum is itself that far off) and for matmuls of up to 64 rows; 1e-2 for
// larger bf16/f16 matmuls (cuBLAS: the GPU rounds the activations to the weights' type, the
// CPU keeps them fp32).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <tuple>

#include "kernels/cpu/int8.h"
#include "kernels/cpu/matmul_check.h"
#include "kernels/cpu/pick_check.h"
#include "kernels/cpu/rerotate_check.h"
#include "kernels/fp8.h"
#include "kernels/kv_rows.h"
#include "tests/cuda/cuda_test_util.h"
#include "worker/model/half.h"

namespace recall::kernels {
namespace {

std::vector<uint16_t> ToHalf(const std::vector<float>& v, DType t) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    out[i] = t == DType::kBF16 ? model::F32ToBf16(v[i]) : model::F32ToF16(v[i]);
  }
  return out;
}

// A host matrix of `dtype` holding `values` (rounded), and its device copy.
struct TestMatrix {
  std::vector<float> f32;
  std::vector<uint16_t> half;
  Matrix host;
  std::unique_ptr<DeviceVec<float>> dev_f32;
  std::unique_ptr<DeviceVec<uint16_t>> dev_half;
  Matrix device;

  TestMatrix(Backend& gpu, DType dtype, int64_t rows, int64_t cols, uint32_t seed) {
    f32 = RandomVec(static_cast<size_t>(rows * cols), seed, -0.5f, 0.5f);
    host = Matrix{f32.data(), DType::kF32, rows, cols};
    if (dtype != DType::kF32) {
      half = ToHalf(f32, dtype);
      host = Matrix{half.data(), dtype, rows, cols};
      dev_half = std::make_unique<DeviceVec<uint16_t>>(gpu, half);
      device = Matrix{dev_half->get(), dtype, rows, cols};
    } else {
      dev_f32 = std::make_unique<DeviceVec<float>>(gpu, f32);
      device = Matrix{dev_f32->get(), dtype, rows, cols};
    }
  }
};

// An int8 (per-row scales) or FP8 (E4M3, scales per row and block of `block` columns) matrix
// quantized from RandomVec(rows * cols, seed, -0.5, 0.5), staged as UploadModel stages it
// (the bytes, then the scales (and int8's row sums) from a 64-byte boundary), and the same
// weights widened to f32 on the host: the reference the device's product is held to.
struct QuantizedMatrix {
  std::vector<float> widened;
  std::unique_ptr<DeviceVec<uint8_t>> dev;
  Matrix device;

  QuantizedMatrix(Backend& gpu, DType dtype, int64_t rows, int64_t cols, uint32_t seed,
                  int block = 128) {
    const auto wf = RandomVec(static_cast<size_t>(rows * cols), seed, -0.5f, 0.5f);
    const size_t at = (static_cast<size_t>(rows * cols) + 63) / 64 * 64;
    widened.resize(wf.size());
    Matrix host{nullptr, dtype, rows, cols};
    std::vector<uint8_t> packed;
    if (dtype == DType::kI8) {
      packed.resize(at + static_cast<size_t>(rows) * 8);
      auto* q = reinterpret_cast<int8_t*>(packed.data());
      auto* scales = reinterpret_cast<float*>(packed.data() + at);
      auto* sums = reinterpret_cast<int32_t*>(scales + rows);
      cpu::QuantizeRowsInt8(wf.data(), rows, cols, q, scales, sums);
      cpu::DequantizeRowsInt8(Matrix{q, DType::kI8, rows, cols, scales, sums}, 0, rows,
                              widened.data());
    } else {
      host.scale_block = block;
      const int64_t per_row = host.ScaleColumns();
      packed.resize(at + host.scale_bytes());
      auto* scales = reinterpret_cast<float*>(packed.data() + at);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t b = 0; b < per_row; ++b) {
          const int64_t c0 = b * block, c1 = std::min(cols, c0 + block);
          float most = 0;
          for (int64_t c = c0; c < c1; ++c) most = std::max(most, std::fabs(wf[r * cols + c]));
          const float s = scales[r * per_row + b] = most > 0 ? most / 448.0f : 1.0f;
          for (int64_t c = c0; c < c1; ++c) {
            packed[r * cols + c] = F32ToE4M3(wf[r * cols + c] / s);
            widened[r * cols + c] = E4M3ToF32(packed[r * cols + c]) * s;
          }
        }
      }
    }
    dev = std::make_unique<DeviceVec<uint8_t>>(gpu, packed);
    device = host;
    device.data = dev->get();
    device.scales = reinterpret_cast<const float*>(dev->get() + at);
    if (dtype == DType::kI8) {
      device.row_sums = reinterpret_cast<const int32_t*>(dev->get() + at + rows * sizeof(float));
    }
  }
};

TEST_F(CudaTest, EmbeddingIsExactForEveryDtype) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int dim : {8, 64, 576}) {
      for (int n : {1, 33}) {
        TestMatrix table(*gpu_, dt, 100, dim, 7 + dim);
        std::vector<int32_t> tokens(n);
        for (int i = 0; i < n; ++i) tokens[i] = (i * 37 + 11) % 100;
        std::vector<float> ref(static_cast<size_t>(n) * dim);
        cpu_->Embedding(table.host, tokens.data(), n, ref.data());
        DeviceVec<int32_t> d_tokens(*gpu_, tokens);
        auto out = DeviceVec<float>::Poisoned(*gpu_, ref.size());
        gpu_->Embedding(table.device, d_tokens.get(), n, out.get());
        EXPECT_EQ(out.Download(), ref) << DTypeName(dt) << " dim " << dim << " n " << n;
      }
    }
  }
}

TEST_F(CudaTest, RmsNormMatchesReference) {
  for (int dim : {8, 64, 576, 4096}) {
    for (int n : {1, 7, 64}) {
      const auto x = RandomVec(static_cast<size_t>(n) * dim, n + dim, -3, 3);
      const auto w = RandomVec(dim, dim, 0.5f, 1.5f);
      std::vector<float> ref(x.size());
      cpu_->RmsNorm(x.data(), w.data(), n, dim, 1e-5f, ref.data());
      DeviceVec<float> dx(*gpu_, x), dw(*gpu_, w);
      auto out = DeviceVec<float>::Poisoned(*gpu_, x.size());
      gpu_->RmsNorm(dx.get(), dw.get(), n, dim, 1e-5f, out.get());
      EXPECT_LT(RelErr(out.Download(), ref), 1e-6) << "dim " << dim << " n " << n;
      // In place (out == x), as the forward pass's q/k norms use it.
      gpu_->RmsNorm(dx.get(), dw.get(), n, dim, 1e-5f, dx.get());
      EXPECT_LT(RelErr(dx.Download(), ref), 1e-6) << "in place, dim " << dim;
    }
  }
}

TEST_F(CudaTest, RopeMatchesReferenceInBothLayouts) {
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kHalfSplit}) {
    for (int hd : {8, 64, 128}) {
      for (int heads : {1, 3, 32}) {
        const int n = 17;
        std::vector<int32_t> pos(n);
        for (int i = 0; i < n; ++i) pos[i] = (i * 977) % 8192;
        const auto x = RandomVec(static_cast<size_t>(n) * heads * hd, hd * heads);
        std::vector<float> ref = x;
        cpu_->Rope(ref.data(), pos.data(), n, heads, hd, 10000.0f, style);
        DeviceVec<float> dx(*gpu_, x);
        DeviceVec<int32_t> dpos(*gpu_, pos);
        gpu_->Rope(dx.get(), dpos.get(), n, heads, hd, 10000.0f, style);
        EXPECT_LT(RelErr(dx.Download(), ref), 1e-5)
            << "style " << int(style) << " hd " << hd << " heads " << heads;
      }
    }
  }
}

TEST_F(CudaTest, ElementwiseOpsMatchReference) {
  for (int64_t count : {int64_t{1}, int64_t{1000}, int64_t{1} << 20}) {
    const auto a = RandomVec(count, 1, -6, 6), b = RandomVec(count, 2, -2, 2);
    {  // Add
      std::vector<float> ref = a;
      cpu_->Add(ref.data(), b.data(), count);
      DeviceVec<float> da(*gpu_, a), db(*gpu_, b);
      gpu_->Add(da.get(), db.get(), count);
      EXPECT_LT(RelErr(da.Download(), ref), 1e-7) << "add " << count;
    }
    {  // SiluMul
      std::vector<float> ref(count);
      cpu_->SiluMul(a.data(), b.data(), count, ref.data());
      DeviceVec<float> da(*gpu_, a), db(*gpu_, b);
      auto out = DeviceVec<float>::Poisoned(*gpu_, count);
      gpu_->SiluMul(da.get(), db.get(), count, out.get());
      EXPECT_LT(RelErr(out.Download(), ref), 1e-6) << "silu_mul " << count;
    }
  }
  for (int dim : {8, 896}) {  // AddBias
    const int n = 5;
    const auto x = RandomVec(static_cast<size_t>(n) * dim, 3), bias = RandomVec(dim, 4);
    std::vector<float> ref = x;
    cpu_->AddBias(ref.data(), bias.data(), n, dim);
    DeviceVec<float> dx(*gpu_, x), db(*gpu_, bias);
    gpu_->AddBias(dx.get(), db.get(), n, dim);
    EXPECT_LT(RelErr(dx.Download(), ref), 1e-7) << "add_bias " << dim;
  }
  for (int cols : {1, 100, 49152}) {  // Softmax
    const int rows = 4;
    const auto x = RandomVec(static_cast<size_t>(rows) * cols, cols, -20, 20);
    std::vector<float> ref = x;
    cpu_->Softmax(ref.data(), rows, cols);
    DeviceVec<float> dx(*gpu_, x);
    gpu_->Softmax(dx.get(), rows, cols);
    // 1e-4: the CPU sums 49152 exponentials one after another (expected error ~sqrt(n) ulp,
    // 2e-5 measured on an H200), the GPU in a tree.
    EXPECT_LT(RelErr(dx.Download(), ref), 1e-4) << "softmax " << cols;
  }
}

// Record: ops are captured, not run; each Replay runs them again, reading memory as it is
// then. An op that crosses to the host makes Record answer null and leaves the backend healthy.
TEST_F(CudaTest, RecordedOpsRunOnlyWhenReplayed) {
  ASSERT_TRUE(gpu_->CanRecord());
  const int64_t count = 4097;
  const auto a = RandomVec(count, 5, -1, 1), b = RandomVec(count, 6, -1, 1);
  DeviceVec<float> da(*gpu_, a), db(*gpu_, b);
  auto graph = gpu_->Record([&] {
    gpu_->Add(da.get(), db.get(), count);
    gpu_->SiluMul(da.get(), db.get(), count, db.get());
  });
  ASSERT_TRUE(graph.ok()) << graph.status();
  ASSERT_NE(*graph, nullptr);
  EXPECT_EQ(da.Download(), a) << "recording ran nothing";
  std::vector<float> ra = a, rb = b;
  for (int replay = 0; replay < 3; ++replay) {
    ASSERT_TRUE((*graph)->Replay().ok());
    cpu_->Add(ra.data(), rb.data(), count);
    cpu_->SiluMul(ra.data(), rb.data(), count, rb.data());
  }
  EXPECT_LT(RelErr(da.Download(), ra), 1e-6);
  EXPECT_LT(RelErr(db.Download(), rb), 1e-6);

  std::vector<float> host(count);
  auto refused = gpu_->Record([&] {
    gpu_->Add(da.get(), db.get(), count);
    gpu_->memory().CopyOut(host.data(), da.get(), count * sizeof(float));
  });
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(*refused, nullptr) << "a copy to the host cannot be in a graph";
  EXPECT_TRUE(gpu_->Health().ok()) << gpu_->Health();
  EXPECT_LT(RelErr(da.Download(), ra), 1e-6) << "nothing ran";
}

// Up to BatchInvariantRows() rows (our kernel, fp32 activations) every dtype is within 1e-5;
// past it cuBLAS rounds the activations to bf16/f16 (1e-2). 77 columns: unaligned loads.
TEST_F(CudaTest, MatMulMatchesReferenceForEveryDtype) {
  struct Shape {
    int rows, cols;
  };
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (Shape s :
         {Shape{576, 576}, Shape{1536, 576}, Shape{64, 8}, Shape{896, 4864}, Shape{101, 77}}) {
      TestMatrix w(*gpu_, dt, s.rows, s.cols, s.rows + s.cols);
      for (int n : {1, 3, 64, 257}) {
        const auto x = RandomVec(static_cast<size_t>(n) * s.cols, n);
        std::vector<float> ref(static_cast<size_t>(n) * s.rows);
        cpu_->MatMul(x.data(), n, w.host, ref.data());
        DeviceVec<float> dx(*gpu_, x);
        auto out = DeviceVec<float>::Poisoned(*gpu_, ref.size());
        gpu_->MatMul(dx.get(), n, w.device, out.get());
        const double tol = dt == DType::kF32 || n <= gpu_->BatchInvariantRows() ? 1e-5 : 1e-2;
        EXPECT_LT(RelErr(out.Download(), ref), tol)
            << DTypeName(dt) << " " << s.rows << "x" << s.cols << " n " << n;
      }
    }
  }
}

// Batch invariance: a row's output has the same bits whatever rows it is computed with, and
// whether the loads are 16-byte vectors or single elements (x one float off alignment).
TEST_F(CudaTest, MatMulUpToBatchInvariantRowsIsBatchInvariant) {
  ASSERT_FALSE(CudaMatMulsOnCublas(*gpu_)) << "our matmul failed its check at creation";
  const int most = gpu_->BatchInvariantRows();
  ASSERT_GE(most, 16);
  struct Shape {
    int rows, cols;
  };
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (Shape s : {Shape{896, 4864}, Shape{101, 77}, Shape{2048, 64}}) {
      TestMatrix w(*gpu_, dt, s.rows, s.cols, s.rows * 3 + s.cols);
      const auto x = RandomVec(static_cast<size_t>(most) * s.cols, s.cols, -2.0f, 2.0f);
      DeviceVec<float> dx(*gpu_, x);
      auto all = DeviceVec<float>::Poisoned(*gpu_, static_cast<size_t>(most) * s.rows);
      gpu_->MatMul(dx.get(), most, w.device, all.get());
      const std::vector<float> want = all.Download();
      for (int n : {1, 5, 16, 17, most - 3}) {
        const int first = 3;  // rows [first, first + n) of x, at another offset
        auto part = DeviceVec<float>::Poisoned(*gpu_, static_cast<size_t>(n) * s.rows);
        gpu_->MatMul(dx.get() + static_cast<size_t>(first) * s.cols, n, w.device, part.get());
        const std::vector<float> got = part.Download();
        ASSERT_TRUE(
            std::equal(got.begin(), got.end(), want.begin() + static_cast<size_t>(first) * s.rows))
            << DTypeName(dt) << " " << s.rows << "x" << s.cols << " n " << n;
      }
      std::vector<float> shifted(x.size() + 1, 0.0f);
      std::copy(x.begin(), x.end(), shifted.begin() + 1);
      DeviceVec<float> dshifted(*gpu_, shifted);
      auto unaligned = DeviceVec<float>::Poisoned(*gpu_, want.size());
      gpu_->MatMul(dshifted.get() + 1, most, w.device, unaligned.get());
      EXPECT_EQ(unaligned.Download(), want) << DTypeName(dt) << " " << s.rows << "x" << s.cols;
    }
  }
}

// AddRmsNorm is Add then RmsNorm in one launch, with the same bits, out aliasing y as the
// forward pass uses it.
TEST_F(CudaTest, AddRmsNormEqualsAddThenRmsNorm) {
  for (int dim : {64, 576, 4096}) {
    const int n = 5;
    const auto x = RandomVec(static_cast<size_t>(n) * dim, dim, -3.0f, 3.0f);
    const auto y = RandomVec(x.size(), dim + 1, -3.0f, 3.0f);
    const auto w = RandomVec(static_cast<size_t>(dim), dim + 2, 0.5f, 1.5f);
    DeviceVec<float> dw(*gpu_, w), x1(*gpu_, x), y1(*gpu_, y), x2(*gpu_, x), y2(*gpu_, y);
    auto out1 = DeviceVec<float>::Poisoned(*gpu_, x.size());
    gpu_->Add(x1.get(), y1.get(), static_cast<int64_t>(x.size()));
    gpu_->RmsNorm(x1.get(), dw.get(), n, dim, 1e-5f, out1.get());
    gpu_->AddRmsNorm(x2.get(), y2.get(), dw.get(), n, dim, 1e-5f, y2.get());
    EXPECT_EQ(x2.Download(), x1.Download()) << "dim " << dim;
    EXPECT_EQ(y2.Download(), out1.Download()) << "dim " << dim;
  }
}

// cublas_matmuls (the fallback): every matmul through cuBLAS, one row per invariant piece,
// within the cuBLAS tolerance of the CPU; the fused ops give the plain ops' bits.
TEST_F(CudaTest, CublasMatMulsFallbackComputesTheSame) {
  EXPECT_TRUE(CheckMatMul(*gpu_).ok()) << CheckMatMul(*gpu_);
  CudaBackendOptions o;
  o.cublas_matmuls = true;
  auto fallback = CreateCudaBackend(o);
  ASSERT_TRUE(fallback.ok()) << fallback.status();
  EXPECT_TRUE(CudaMatMulsOnCublas(**fallback));
  EXPECT_EQ((*fallback)->BatchInvariantRows(), 1);
  TestMatrix w(**fallback, DType::kBF16, 896, 4864, 5);
  const auto x = RandomVec(4 * 4864, 6);
  std::vector<float> ref(4 * 896);
  cpu_->MatMul(x.data(), 4, w.host, ref.data());
  DeviceVec<float> dx(**fallback, x);
  auto out = DeviceVec<float>::Poisoned(**fallback, ref.size());
  (*fallback)->MatMul(dx.get(), 4, w.device, out.get());
  EXPECT_LT(RelErr(out.Download(), ref), 1e-2);
  EXPECT_TRUE((*fallback)->Health().ok()) << (*fallback)->Health();
}

// Int8 weights (issue 31): the start-up check passes, and the GPU's weight-only product is
// within 1e-5 of the f32 product with the widened weights at 1, 16 and 64 rows (the CPU
// quantizes the activations too, so it is compared with the widened weights, not the CPU).
TEST_F(CudaTest, Int8MatMulIsTheWidenedWeightsProduct) {
  EXPECT_TRUE(CheckInt8MatMul(*gpu_).ok()) << CheckInt8MatMul(*gpu_);
  EXPECT_TRUE(gpu_->RunsInt8Weights());
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{896, 4864}, {130, 77}}) {
    const QuantizedMatrix q(*gpu_, DType::kI8, rows, cols, 21);
    const std::vector<float>& widened = q.widened;
    const Matrix& device = q.device;
    for (const int n : {1, 16, 64, 100}) {
      const auto x = RandomVec(static_cast<size_t>(n * cols), n, -1.0f, 1.0f);
      std::vector<float> ref(static_cast<size_t>(n * rows));
      cpu_->MatMul(x.data(), n, Matrix{widened.data(), DType::kF32, rows, cols}, ref.data());
      DeviceVec<float> dx(*gpu_, x);
      auto out = DeviceVec<float>::Poisoned(*gpu_, ref.size());
      gpu_->MatMul(dx.get(), n, device, out.get());
      EXPECT_LT(RelErr(out.Download(), ref), 1e-5) << rows << "x" << cols << " n " << n;
    }
  }
  EXPECT_TRUE(gpu_->Health().ok()) << gpu_->Health();
}

// FP8 weights (issue 31): the start-up check passes, and the GPU's product with E4M3 bytes and
// block scales is within 1e-5 of the f32 product with the widened weights (e4m3 * scale,
// exact in f32) at 1, 16, 64 and 100 rows, blocks of 128 over a Qwen2.5-0.5B MLP shape and of
// 16 over an unaligned width. Past the batch-invariant rows, where cuBLASLt's FP8 GEMM takes
// 128-column blocks (the activations quantized to E4M3 too), within 5e-2.
TEST_F(CudaTest, Fp8MatMulIsTheWidenedWeightsProduct) {
  EXPECT_TRUE(CheckFp8MatMul(*gpu_).ok()) << CheckFp8MatMul(*gpu_);
  EXPECT_TRUE(gpu_->RunsFp8Weights());
  for (const auto& [rows, cols, block] :
       {std::tuple<int64_t, int64_t, int>{896, 4864, 128}, {130, 77, 16}}) {
    const QuantizedMatrix q(*gpu_, DType::kF8E4M3, rows, cols, 23, block);
    const std::vector<float>& widened = q.widened;
    const Matrix& device = q.device;
    for (const int n : {1, 16, 64, 100}) {
      const auto x = RandomVec(static_cast<size_t>(n * cols), n, -1.0f, 1.0f);
      std::vector<float> ref(static_cast<size_t>(n * rows));
      cpu_->MatMul(x.data(), n, Matrix{widened.data(), DType::kF32, rows, cols}, ref.data());
      DeviceVec<float> dx(*gpu_, x);
      auto out = DeviceVec<float>::Poisoned(*gpu_, ref.size());
      gpu_->MatMul(dx.get(), n, device, out.get());
      const bool lt = CudaFp8OnCublasLt(*gpu_) && n > gpu_->BatchInvariantRows() && block == 128;
      EXPECT_LT(RelErr(out.Download(), ref), lt ? 5e-2 : 1e-5) << rows << "x" << cols << " n " << n;
    }
  }
  EXPECT_TRUE(gpu_->Health().ok()) << gpu_->Health();
}

// FP8 weights over many rows (prefill, or a decode batch with batch invariance off): on Hopper
// cuBLASLt's block-scaled FP8 GEMM passes its start-up check and takes them. The product of
// 1000 rows (992 through the GEMM, the last 8 through our kernel) by a 2048x1024 matrix with
// 128-column blocks is within 5e-2 of the widened weights' f32 product (the activations are
// quantized to E4M3 per 128 columns), and no row is left unwritten.
TEST_F(CudaTest, Fp8MatMulOfManyRowsTakesCublasLtOnHopper) {
  EXPECT_TRUE(CheckFp8ManyRows(*gpu_).ok()) << CheckFp8ManyRows(*gpu_);
  int major = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  if (major == 9) {
    EXPECT_TRUE(CudaFp8OnCublasLt(*gpu_)) << "sm_90: cuBLASLt's FP8 GEMM is missing or failed "
                                             "its start-up check (see the warning above)";
  }
  constexpr int64_t rows = 2048, cols = 1024;
  constexpr int n = 1000;
  Matrix host{nullptr, DType::kF8E4M3, rows, cols};
  host.scale_block = 128;
  const int64_t per_row = host.ScaleColumns();
  const auto wf = RandomVec(static_cast<size_t>(rows * cols), 29, -0.5f, 0.5f);
  const size_t at = static_cast<size_t>(rows * cols);
  std::vector<uint8_t> packed(at + host.scale_bytes());
  auto* scales = reinterpret_cast<float*>(packed.data() + at);
  std::vector<float> widened(wf.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < per_row; ++b) {
      float most = 0;
      for (int64_t c = b * 128; c < (b + 1) * 128; ++c) {
        most = std::max(most, std::fabs(wf[r * cols + c]));
      }
      const float s = scales[r * per_row + b] = most > 0 ? most / 448.0f : 1.0f;
      for (int64_t c = b * 128; c < (b + 1) * 128; ++c) {
        packed[r * cols + c] = F32ToE4M3(wf[r * cols + c] / s);
        widened[r * cols + c] = E4M3ToF32(packed[r * cols + c]) * s;
      }
    }
  }
  DeviceVec<uint8_t> dw(*gpu_, packed);
  Matrix device = host;
  device.data = dw.get();
  device.scales = reinterpret_cast<const float*>(dw.get() + at);
  const auto x = RandomVec(static_cast<size_t>(n * cols), 31, -2.0f, 2.0f);
  std::vector<float> ref(static_cast<size_t>(n * rows));
  cpu_->MatMul(x.data(), n, Matrix{widened.data(), DType::kF32, rows, cols}, ref.data());
  DeviceVec<float> dx(*gpu_, x);
  auto out = DeviceVec<float>::Poisoned(*gpu_, ref.size());
  gpu_->MatMul(dx.get(), n, device, out.get());
  const std::vector<float> got = out.Download();
  EXPECT_LT(RelErr(got, ref), 5e-2);
  // The rows on each side of the GEMM / kernel seam, alone.
  for (const int r : {0, 991, 992, 999}) {
    const std::vector<float> row(got.begin() + r * rows, got.begin() + (r + 1) * rows);
    const std::vector<float> want(ref.begin() + r * rows, ref.begin() + (r + 1) * rows);
    EXPECT_LT(RelErr(row, want), 5e-2) << "row " << r;
  }
  EXPECT_TRUE(gpu_->Health().ok()) << gpu_->Health();
}

// MatMulMany of n rows (RandomVec(..., seed)) by the three 896-column matrices w gives each
// the bits of its own MatMul.
void ExpectManyEqualsOnePerMatrix(Backend& gpu, const Matrix (&w)[3], int n, uint32_t seed) {
  const auto x = RandomVec(static_cast<size_t>(n) * 896, seed);
  DeviceVec<float> dx(gpu, x);
  std::vector<DeviceVec<float>> many, one;
  float* outs[3];
  for (int i = 0; i < 3; ++i) {
    many.push_back(DeviceVec<float>::Poisoned(gpu, static_cast<size_t>(n) * w[i].rows));
    one.push_back(DeviceVec<float>::Poisoned(gpu, static_cast<size_t>(n) * w[i].rows));
    outs[i] = many.back().get();
    gpu.MatMul(dx.get(), n, w[i], one.back().get());
  }
  gpu.MatMulMany(dx.get(), n, w, outs, 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(many[i].Download(), one[i].Download())
        << DTypeName(w[i].dtype) << " n " << n << " matrix " << i;
  }
}

// MatMulMany (q/k/v-like shapes of different heights in one launch) gives every matrix the
// bits of its own MatMul call, under the one-launch limit and past it.
TEST_F(CudaTest, MatMulManyEqualsOneMatMulPerMatrix) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    TestMatrix wq(*gpu_, dt, 896, 896, 1), wk(*gpu_, dt, 128, 896, 2), wv(*gpu_, dt, 130, 896, 3);
    const Matrix w[3] = {wq.device, wk.device, wv.device};
    for (int n : {1, 7, 64, 100}) ExpectManyEqualsOnePerMatrix(*gpu_, w, n, n + 40);
  }
}

// The same for int8 and FP8 weights (q/k/v of one type in one launch; FP8 with blocks of 128,
// 64 and 16 columns in it): each matrix gets the bits of its own MatMul.
TEST_F(CudaTest, MatMulManyOfQuantizedWeightsEqualsOneMatMulPerMatrix) {
  for (DType dt : {DType::kI8, DType::kF8E4M3}) {
    const QuantizedMatrix wq(*gpu_, dt, 896, 896, 1, 128), wk(*gpu_, dt, 128, 896, 2, 64),
        wv(*gpu_, dt, 130, 896, 3, 16);
    const Matrix w[3] = {wq.device, wk.device, wv.device};
    for (int n : {1, 3, 7, 64}) ExpectManyEqualsOnePerMatrix(*gpu_, w, n, n + 50);
  }
  EXPECT_TRUE(gpu_->Health().ok()) << gpu_->Health();
}

// Chunks in flight (CudaBackendOptions::skinny_chunks_in_flight) change only when the weights
// are loaded, never the FMAs' order: for every weight type, at 1 and 3 rows (the skinny
// kernel) and at 7 (the staged one, which ignores it), on widths with a 16-byte tail, a short
// one (one element at a time) and fewer chunks than lanes, MatMul and MatMulMany under 1, 2
// and 4 give the bits of the default (0). Any other count is refused by name.
TEST(CudaChunksInFlight, EveryCountGivesTheSameBits) {
  RECALL_REQUIRE_GPU();
  CudaBackendOptions bad;
  bad.skinny_chunks_in_flight = 3;
  const auto refused = CreateCudaBackend(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_NE(refused.status().message().find("skinny_chunks_in_flight"), std::string::npos);
  // Outputs by (count, case) in the order computed; case = dtype, width, rows, matrix.
  std::vector<std::vector<std::vector<float>>> outputs;
  for (const int count : {0, 1, 2, 4}) {
    CudaBackendOptions options;
    options.skinny_chunks_in_flight = count;
    auto made = CreateCudaBackend(options);
    ASSERT_TRUE(made.ok()) << made.status();
    Backend& gpu = **made;
    std::vector<std::vector<float>>& got = outputs.emplace_back();
    for (const DType dt : {DType::kF32, DType::kBF16, DType::kF16, DType::kI8, DType::kF8E4M3}) {
      for (const int64_t cols : {int64_t{4864 + 8}, int64_t{1000 + 3}, int64_t{96}}) {
        const bool quantized = dt == DType::kI8 || dt == DType::kF8E4M3;
        // Quantized and plain matrices of 3 heights (the last not a multiple of 2 outputs).
        std::vector<std::unique_ptr<QuantizedMatrix>> q;
        std::vector<std::unique_ptr<TestMatrix>> plain;
        Matrix w[3];
        const int64_t heights[3] = {256, 64, 33};
        for (int i = 0; i < 3; ++i) {
          if (quantized) {
            q.push_back(std::make_unique<QuantizedMatrix>(gpu, dt, heights[i], cols, 60 + i, 16));
            w[i] = q.back()->device;
          } else {
            plain.push_back(std::make_unique<TestMatrix>(gpu, dt, heights[i], cols, 60 + i));
            w[i] = plain.back()->device;
          }
        }
        for (const int n : {1, 3, 7}) {
          const auto x = RandomVec(static_cast<size_t>(n * cols), 70 + n);
          DeviceVec<float> dx(gpu, x);
          std::vector<DeviceVec<float>> many;
          float* outs[3];
          for (int i = 0; i < 3; ++i) {
            many.push_back(DeviceVec<float>::Poisoned(gpu, static_cast<size_t>(n) * heights[i]));
            outs[i] = many.back().get();
          }
          auto one = DeviceVec<float>::Poisoned(gpu, static_cast<size_t>(n) * heights[0]);
          gpu.MatMul(dx.get(), n, w[0], one.get());
          gpu.MatMulMany(dx.get(), n, w, outs, 3);
          got.push_back(one.Download());
          for (int i = 0; i < 3; ++i) got.push_back(many[i].Download());
        }
      }
    }
    EXPECT_TRUE(gpu.Health().ok()) << gpu.Health();
  }
  for (size_t u = 1; u < outputs.size(); ++u) {
    ASSERT_EQ(outputs[u].size(), outputs[0].size());
    for (size_t i = 0; i < outputs[0].size(); ++i) {
      for (const float v : outputs[0][i]) ASSERT_FALSE(std::isnan(v)) << "output " << i;
      EXPECT_EQ(outputs[u][i], outputs[0][i]) << "count index " << u << ", output " << i;
    }
  }
}

// Every E4M3 code (both zeros, the subnormals, the largest, the NaNs) widens on the device to
// exactly the host's E4M3ToF32: row r of a 256 x K matrix holds code r in column 0 and zeros
// elsewhere (scale 1), times x = (1, 0, ..., 0). K = 16 takes the 16-byte loads, K = 13 the
// one-element ones.
TEST_F(CudaTest, EveryE4M3CodeWidensAsOnTheHost) {
  for (const int64_t cols : {16, 13}) {
    Matrix host{nullptr, DType::kF8E4M3, 256, cols};
    host.scale_block = 16;
    const size_t at = 256 * static_cast<size_t>(cols) / 64 * 64 + 64;
    std::vector<uint8_t> packed(at + host.scale_bytes(), 0);
    auto* scales = reinterpret_cast<float*>(packed.data() + at);
    for (int r = 0; r < 256; ++r) {
      packed[static_cast<size_t>(r) * cols] = static_cast<uint8_t>(r);
      scales[r * host.ScaleColumns()] = 1.0f;
    }
    DeviceVec<uint8_t> dw(*gpu_, packed);
    Matrix device = host;
    device.data = dw.get();
    device.scales = reinterpret_cast<const float*>(dw.get() + at);
    std::vector<float> x(static_cast<size_t>(cols), 0.0f);
    x[0] = 1.0f;
    DeviceVec<float> dx(*gpu_, x);
    auto out = DeviceVec<float>::Poisoned(*gpu_, 256);
    gpu_->MatMul(dx.get(), 1, device, out.get());
    const std::vector<float> got = out.Download();
    for (int r = 0; r < 256; ++r) {
      const float want = E4M3ToF32(static_cast<uint8_t>(r));
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got[r])) << "code " << r << " K " << cols;
      } else {
        EXPECT_EQ(got[r], want) << "code " << r << " K " << cols;
      }
    }
  }
  EXPECT_TRUE(gpu_->Health().ok()) << gpu_->Health();
}

// Paged attention: the same pool contents and (shuffled) block tables on both backends.
struct AttnCase {
  int n_heads, n_kv, hd, base_len;
};

class CudaAttentionTest : public CudaTest, public ::testing::WithParamInterface<AttnCase> {
 protected:
  void CheckAttention(const AttnCase& p, KvDType dtype);
};

// Every KV type: the CUDA store writes the bytes the CPU store writes, and attention over a
// typed pool equals the CPU backend's over the same pool.
TEST_P(CudaAttentionTest, StoreDecodeAndPrefillMatchReference) {
  for (const KvDType dtype : {KvDType::kF32, KvDType::kBF16, KvDType::kF16, KvDType::kInt8}) {
    SCOPED_TRACE(KvDTypeName(dtype));
    CheckAttention(GetParam(), dtype);
  }
}

void CudaAttentionTest::CheckAttention(const AttnCase& p, KvDType dtype) {
  const int kLayers = 2, kBt = 16, kNew = 5;
  PagedKvLayout layout{kLayers, p.n_kv, p.hd, kBt, dtype};
  const int max_len = p.base_len + 3 * (p.n_kv - 1) + kNew;
  const int blocks_per_layer = (max_len + kBt - 1) / kBt;
  const int n_blocks = kLayers * blocks_per_layer + 3;
  // Shuffled block ids: layer l uses ids[l * blocks_per_layer ...].
  std::vector<int32_t> ids(n_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(p.hd));
  std::vector<const int32_t*> tables = {ids.data(), ids.data() + blocks_per_layer};
  std::vector<int32_t> counts = {blocks_per_layer, blocks_per_layer};
  // The cached rows, stored on the host in the pool's type (words, so that the pool can be
  // compared bit for bit).
  std::vector<float> cpu_pool(static_cast<size_t>(n_blocks) * layout.BlockBytes() / 4, 0.0f);
  PagedKv cpu_kv{layout, cpu_pool.data(), tables.data(), counts.data()};
  const int layer = 1;
  const float scale = 1.0f / std::sqrt(static_cast<float>(p.hd));
  std::vector<int32_t> start(p.n_kv), lens(p.n_kv), lens1(p.n_kv);
  for (int h = 0; h < p.n_kv; ++h) start[h] = p.base_len + 3 * h;
  for (int l = 0; l < kLayers; ++l) {
    for (int h = 0; h < p.n_kv; ++h) {
      for (int sl = 0; sl < start[h]; ++sl) {
        for (int is_v = 0; is_v < 2; ++is_v) {
          const auto row = RandomVec(static_cast<size_t>(p.hd), 99 + sl * 4 + is_v * 2 + h * 7);
          StoreKvRow(cpu_kv.Head(l, h), is_v, sl, row.data());
        }
      }
    }
  }
  DeviceVec<float> gpu_pool(*gpu_, cpu_pool);
  PagedKv gpu_kv{layout, gpu_pool.get(), tables.data(), counts.data()};

  // StoreKv of kNew tokens: both pools must be identical afterwards.
  const auto k = RandomVec(static_cast<size_t>(kNew) * p.n_kv * p.hd, 5);
  const auto v = RandomVec(k.size(), 6);
  cpu_->StoreKv(cpu_kv, layer, k.data(), v.data(), kNew, start.data());
  DeviceVec<float> dk(*gpu_, k), dv(*gpu_, v);
  gpu_->StoreKv(gpu_kv, layer, dk.get(), dv.get(), kNew, start.data());
  {
    const std::vector<float> got = gpu_pool.Download();
    ASSERT_EQ(0, std::memcmp(got.data(), cpu_pool.data(), cpu_pool.size() * 4))
        << "StoreKv wrote different bytes";
  }

  // Prefill attention of the kNew tokens.
  for (int h = 0; h < p.n_kv; ++h) lens[h] = start[h] + kNew;
  const auto q = RandomVec(static_cast<size_t>(kNew) * p.n_heads * p.hd, 7, -2, 2);
  std::vector<float> ref(q.size());
  cpu_->PrefillAttention(cpu_kv, layer, lens.data(), q.data(), kNew, p.n_heads, scale, ref.data());
  DeviceVec<float> dq(*gpu_, q);
  auto out = DeviceVec<float>::Poisoned(*gpu_, q.size());
  gpu_->PrefillAttention(gpu_kv, layer, lens.data(), dq.get(), kNew, p.n_heads, scale, out.get());
  EXPECT_LT(RelErr(out.Download(), ref), 1e-5) << "prefill";

  // Decode attention (the last new token's view) with probabilities.
  const int64_t stride = max_len + 7;
  const auto q1 = RandomVec(static_cast<size_t>(p.n_heads) * p.hd, 8, -2, 2);
  std::vector<float> ref1(q1.size()), ref_probs(static_cast<size_t>(p.n_heads) * stride, 0.0f);
  cpu_->DecodeAttention(cpu_kv, layer, lens.data(), q1.data(), p.n_heads, scale, ref1.data(),
                        ref_probs.data(), stride);
  DeviceVec<float> dq1(*gpu_, q1);
  auto out1 = DeviceVec<float>::Poisoned(*gpu_, q1.size());
  auto probs = DeviceVec<float>::Poisoned(*gpu_, ref_probs.size());
  gpu_->DecodeAttention(gpu_kv, layer, lens.data(), dq1.get(), p.n_heads, scale, out1.get(),
                        probs.get(), stride);
  EXPECT_LT(RelErr(out1.Download(), ref1), 1e-5) << "decode";
  const std::vector<float> got = probs.Download();
  for (int qh = 0; qh < p.n_heads; ++qh) {
    const int len = lens[qh / (p.n_heads / p.n_kv)];
    std::vector<float> g(got.begin() + qh * stride, got.begin() + qh * stride + len);
    std::vector<float> r(ref_probs.begin() + qh * stride, ref_probs.begin() + qh * stride + len);
    EXPECT_LT(RelErr(g, r), 1e-5) << "probs of query head " << qh;
    double sum = 0;
    for (float x : g) sum += x;
    EXPECT_NEAR(sum, 1.0, 1e-4);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttentionTest,
                         ::testing::Values(AttnCase{8, 8, 8, 1}, AttnCase{8, 8, 8, 300},
                                           AttnCase{9, 3, 64, 40}, AttnCase{9, 3, 64, 5000},
                                           AttnCase{32, 8, 128, 1000}, AttnCase{14, 2, 64, 9000},
                                           AttnCase{4, 1, 256, 77}));

TEST_F(CudaTest, CompactRowsMovesTheSameRowsAsHostMemory) {
  for (const KvDType dtype : {KvDType::kF32, KvDType::kBF16, KvDType::kF16, KvDType::kInt8}) {
    SCOPED_TRACE(KvDTypeName(dtype));
    PagedKvLayout layout{1, 2, 64, 16, dtype};
    const int n_blocks = 12;
    std::vector<int32_t> table = {5, 2, 9, 0, 11, 7, 1, 3};
    // Random words: rows and scales only move, so any bit pattern must arrive unchanged.
    const auto words = RandomVec(static_cast<size_t>(n_blocks) * layout.BlockBytes() / 4, 3);
    std::vector<float> host = words;
    DeviceVec<float> dev(*gpu_, words);
    std::vector<int32_t> keep;
    for (int s = 0; s < 120; ++s) {
      if (s % 3 != 1 || s > 100) keep.push_back(s);
    }
    for (int head = 0; head < 2; ++head) {
      PagedKvHead h_rows{reinterpret_cast<uint8_t*>(host.data()) + layout.PlaneOffset(head, 0),
                         table.data(),
                         layout.BlockBytes(),
                         layout.PlaneBytes(),
                         16,
                         64,
                         dtype};
      PagedKvHead d_rows = h_rows;
      d_rows.base = reinterpret_cast<uint8_t*>(dev.get()) + layout.PlaneOffset(head, 0);
      HostMemory().CompactRows(h_rows, keep.data(), static_cast<int>(keep.size()));
      gpu_->memory().CompactRows(d_rows, keep.data(), static_cast<int>(keep.size()));
    }
    const std::vector<float> got = dev.Download();
    EXPECT_EQ(0, std::memcmp(got.data(), host.data(), host.size() * sizeof(float)));
  }
}

// LazyObserve on both backends for 20 steps of a sequence of layers x kv rows.
void ObserveAndCompare(Backend& cpu, Backend& gpu, int layers, int kv, int heads) {
  const int stride = 700, cap = 768, rows = layers * kv;
  std::vector<int32_t> ts(static_cast<size_t>(rows) * cap, 0), mri(ts.size(), 0);
  DeviceVec<int32_t> d_ts(gpu, ts), d_mri(gpu, mri);
  std::vector<int32_t> old_lens(rows, 0), lens(rows, 0);
  for (int t = 1; t <= 20; ++t) {
    for (int r = 0; r < rows; ++r) {  // at most 500 + 149 + 2 * 19 < stride
      lens[r] = t == 1 ? 500 + (11 * r) % 150 : old_lens[r] + (t + r) % 3;
    }
    // Probabilities around alpha (1e-3), so both outcomes of the threshold occur.
    const std::vector<float> probs =
        RandomVec(static_cast<size_t>(layers) * heads * stride, 100 + t, 0.0f, 2e-3f);
    DeviceVec<float> d_probs(gpu, probs);
    LazyObserveArgs a;
    a.probs_stride = stride;
    a.n_layers = layers;
    a.n_heads = heads;
    a.n_kv_heads = kv;
    a.state_stride = cap;
    a.old_lens = old_lens.data();
    a.lens = lens.data();
    a.alpha = 1e-3f;
    a.t = t;
    a.probs = probs.data();
    a.ts = ts.data();
    a.mri = mri.data();
    cpu.LazyObserve(a);
    a.probs = d_probs.get();
    a.ts = d_ts.get();
    a.mri = d_mri.get();
    gpu.LazyObserve(a);
    ASSERT_TRUE(gpu.Health().ok()) << gpu.Health();
    ASSERT_EQ(d_ts.Download(), ts) << "step " << t;
    ASSERT_EQ(d_mri.Download(), mri) << "step " << t;
    old_lens = lens;
  }
}

// Integer state and a max over floats: the device must equal the reference exactly. 15 rows
// carry their lengths in the launch, 488 rows (more than kLazyObserveInlineRows) stage them.
TEST_F(CudaTest, LazyObserveEqualsTheReferenceExactly) {
  for (const int layers : {5, 61}) {
    SCOPED_TRACE(layers);
    ObserveAndCompare(*cpu_, *gpu_, layers, layers == 5 ? 3 : 8, layers == 5 ? 12 : 16);
  }
}

TEST_F(CudaTest, ArgmaxRowsPicksTheLowestOfEqualMaxima) {
  ASSERT_FALSE(CudaPicksOnHost(*gpu_)) << "the device picks failed their check at creation";
  for (const int cols : {1, 31, 97, 4096, 128256}) {
    const int rows = 9;
    std::vector<float> x = RandomVec(static_cast<size_t>(rows) * cols, cols, -5.0f, 5.0f);
    // Row 1: the maximum twice (the lower index wins); row 2: all equal (index 0).
    if (cols > 3) {
      x[cols + cols / 3] = 9.0f;
      x[cols + cols - 1] = 9.0f;
    }
    std::fill(x.begin() + 2 * cols, x.begin() + 3 * cols, 0.5f);
    std::vector<int32_t> want(rows);
    cpu_->ArgmaxRows(x.data(), rows, cols, want.data());
    DeviceVec<float> d_x(*gpu_, x);
    DeviceVec<int32_t> d_out(*gpu_, std::vector<int32_t>(rows, -1));
    gpu_->ArgmaxRows(d_x.get(), rows, cols, d_out.get());
    EXPECT_EQ(d_out.Download(), want) << "cols " << cols;
    if (cols > 3) {
      EXPECT_EQ(want[1], cols / 3);
    }
    EXPECT_EQ(want[2], 0);
  }
}

// Sampling on the device against the host reference (Backend::SampleRows' default), over
// vocabularies up to Llama-3's and every kind of row. Greedy and top_k = 1 rows must agree
// exactly. Sampled rows may differ only where a draw lies within rounding of a boundary of
// the cumulative sums (the host's in double, the device's exact): at most 1% of them. (With
// the host's sums in float, 6 of 34 rows at 128256 tokens differed on an H100: the float
// sums drifted by about one token's probability, as an exact reference showed on the CPU.) The
// device's choice must also be the same on a second run (integer sums, fixed reduction order).
TEST_F(CudaTest, SampleRowsAgreesWithTheReference) {
  ASSERT_FALSE(CudaPicksOnHost(*gpu_)) << "the device picks failed their check at creation";
  int sampled = 0, differ = 0;
  for (const int cols : {1, 7, 1000, 32000, 128256}) {
    // 48 rows carry their parameters in the launch; 300 (> kSampleRowsInlineRows) stage them.
    const int rows = cols == 1000 ? 300 : 48;
    std::vector<float> x = RandomVec(static_cast<size_t>(rows) * cols, cols + 3, -6.0f, 6.0f);
    std::fill(x.begin() + 5 * cols, x.begin() + 6 * cols, 0.25f);  // row 5: all equal
    std::vector<SamplingParams> params(rows);
    std::vector<float> draws(rows);
    Rng rng(cols);
    for (int r = 0; r < rows; ++r) {
      SamplingParams& p = params[r];
      p.temperature = r % 8 == 0 ? 0.0f : 0.3f + 0.25f * static_cast<float>(r % 5);
      p.top_k = r % 6 == 1 ? 1 : (r % 3 == 2 ? 50 : 0);
      p.top_p = r % 4 == 3 ? 0.9f : (r % 7 == 4 ? 0.3f : 1.0f);
      draws[r] = rng.NextFloat();
    }
    std::vector<int32_t> want(rows);
    cpu_->SampleRows(x.data(), rows, cols, params.data(), draws.data(), want.data());
    DeviceVec<float> d_x(*gpu_, x);
    DeviceVec<int32_t> d_out(*gpu_, std::vector<int32_t>(rows, -1));
    gpu_->SampleRows(d_x.get(), rows, cols, params.data(), draws.data(), d_out.get());
    ASSERT_TRUE(gpu_->Health().ok()) << gpu_->Health();
    const std::vector<int32_t> got = d_out.Download();
    gpu_->SampleRows(d_x.get(), rows, cols, params.data(), draws.data(), d_out.get());
    EXPECT_EQ(d_out.Download(), got) << "cols " << cols << ": not deterministic";
    EXPECT_EQ(d_x.Download(), x) << "cols " << cols << ": the logits were modified";
    for (int r = 0; r < rows; ++r) {
      ASSERT_GE(got[r], 0) << "cols " << cols << " row " << r;
      ASSERT_LT(got[r], cols) << "cols " << cols << " row " << r;
      if (params[r].temperature <= 0.0f || params[r].top_k == 1) {
        EXPECT_EQ(got[r], want[r]) << "cols " << cols << " row " << r;
      } else {
        ++sampled;
        differ += got[r] != want[r];
      }
    }
  }
  std::printf("SampleRows: %d of %d sampled rows differ from the host reference\n", differ,
              sampled);
  EXPECT_LE(differ * 100, sampled) << differ << " of " << sampled << " sampled rows differ";
}

// Keys moved to new positions on the device equal the host reference (1e-5 relative): long
// rows over shuffled blocks, moves down from past 20,000 and up, both RoPE layouts, every
// head_dim the attention kernels take; nothing else in the pool changes.
TEST_F(CudaTest, RerotateKeysEqualsTheReference) {
  EXPECT_FALSE(CudaRerotatesOnHost(*gpu_)) << "the device re-rotation failed its check at creation";
  uint32_t seed = 3;
  for (const int hd : {8, 64, 128, 256}) {
    for (const RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kHalfSplit}) {
      SCOPED_TRACE(::testing::Message() << "head_dim " << hd << " style " << int(style));
      const absl::Status st = CompareRerotate(*gpu_, MakeRerotateCase(hd, style, 2000, seed++));
      EXPECT_TRUE(st.ok()) << st;
    }
  }
}

// Typed pools: the device re-rotation widens each key row, rotates it and stores it again;
// the CPU backend does the same on the host. Rows agree within one step of the type (the
// two may round a rotated value on either side).
TEST_F(CudaTest, RerotateKeysOnTypedPoolsMatchesTheCpu) {
  for (const KvDType dtype : {KvDType::kBF16, KvDType::kF16, KvDType::kInt8}) {
    SCOPED_TRACE(KvDTypeName(dtype));
    const int hd = 64, n = 40;
    PagedKvLayout layout{2, 2, hd, 16, dtype};
    std::vector<int32_t> table = {3, 0, 2, 5, 1, 4};
    std::vector<const int32_t*> tables = {table.data(), table.data() + 3};
    std::vector<int32_t> counts = {3, 3};
    std::vector<float> cpu_pool(static_cast<size_t>(6) * layout.BlockBytes() / 4, 0.0f);
    PagedKv cpu_kv{layout, cpu_pool.data(), tables.data(), counts.data()};
    for (int l = 0; l < 2; ++l) {
      for (int h = 0; h < 2; ++h) {
        for (int sl = 0; sl < n; ++sl) {
          const auto row = RandomVec(hd, 5 + sl + 100 * h + 1000 * l);
          StoreKvRow(cpu_kv.Head(l, h), 0, sl, row.data());
        }
      }
    }
    DeviceVec<float> gpu_pool(*gpu_, cpu_pool);
    PagedKv gpu_kv{layout, gpu_pool.get(), tables.data(), counts.data()};
    std::vector<int32_t> lens = {n, n - 7, n, 3}, from(4 * n), to(4 * n);
    for (int i = 0; i < 4 * n; ++i) {
      from[i] = 20000 + 13 * i;
      to[i] = i % 9 == 4 ? from[i] : 100 + i;
    }
    RerotateArgs a;
    a.kv = cpu_kv;
    a.lens = lens.data();
    a.from = from.data();
    a.to = to.data();
    a.stride = n;
    a.style = RopeStyle::kHalfSplit;
    cpu_->RerotateKeys(a);
    a.kv = gpu_kv;
    gpu_->RerotateKeys(a);
    const std::vector<float> got_words = gpu_pool.Download();
    PagedKv got_kv{layout, const_cast<float*>(got_words.data()), tables.data(), counts.data()};
    const float step = dtype == KvDType::kBF16  ? 1.0f / 128
                       : dtype == KvDType::kF16 ? 1.0f / 1024
                                                : 1.5f / 127;
    for (int l = 0; l < 2; ++l) {
      for (int h = 0; h < 2; ++h) {
        std::vector<float> want(hd), got(hd);
        for (int sl = 0; sl < lens[l * 2 + h]; ++sl) {
          LoadKvRow(cpu_kv.Head(l, h), 0, sl, want.data());
          LoadKvRow(got_kv.Head(l, h), 0, sl, got.data());
          for (int d = 0; d < hd; ++d) {
            ASSERT_NEAR(got[d], want[d], step * 1.5f)
                << "layer " << l << " head " << h << " slot " << sl << " elem " << d;
          }
        }
      }
    }
  }
}

// host_picks: the rows are copied back and picked by the reference, so every pick equals
// the CPU's exactly.
TEST_F(CudaTest, HostPicksEqualTheReferenceExactly) {
  EXPECT_TRUE(CheckPicks(*gpu_).ok()) << CheckPicks(*gpu_);
  CudaBackendOptions o;
  o.host_picks = true;
  auto host = CreateCudaBackend(o);
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_TRUE(CudaPicksOnHost(**host));
  const int rows = 6, cols = 32000;
  const std::vector<float> x = RandomVec(static_cast<size_t>(rows) * cols, 77, -6.0f, 6.0f);
  std::vector<SamplingParams> params(rows);
  std::vector<float> draws(rows);
  for (int r = 0; r < rows; ++r) {
    params[r].temperature = r == 0 ? 0.0f : 0.7f;
    params[r].top_k = r == 2 ? 40 : 0;
    params[r].top_p = r == 3 ? 0.9f : 1.0f;
    draws[r] = 0.13f * static_cast<float>(r + 1);
  }
  std::vector<int32_t> want(rows);
  cpu_->SampleRows(x.data(), rows, cols, params.data(), draws.data(), want.data());
  DeviceVec<float> d_x(**host, x);
  DeviceVec<int32_t> d_out(**host, std::vector<int32_t>(rows, -1));
  (*host)->SampleRows(d_x.get(), rows, cols, params.data(), draws.data(), d_out.get());
  EXPECT_EQ(d_out.Download(), want);
  (*host)->ArgmaxRows(d_x.get(), 1, cols, d_out.get());
  EXPECT_EQ(d_out.Download()[0], want[0]);
  EXPECT_TRUE((*host)->Health().ok()) << (*host)->Health();
}

TEST(CudaOpTimes, ReportsTheOpsQueuedWhenAskedAndNothingOtherwise) {
  std::unique_ptr<Backend> cpu = CreateCpuBackend();
  EXPECT_EQ(CudaOpTimes(*cpu, false), "") << "not a CUDA backend";
  RECALL_REQUIRE_GPU();
  CudaBackendOptions o;
  o.time_ops = true;
  auto gpu = CreateCudaBackend(o);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const std::vector<float> x = RandomVec(4 * 64, 1);
  DeviceVec<float> d_x(**gpu, x), d_w(**gpu, std::vector<float>(64, 1.0f));
  DeviceVec<float> d_out = DeviceVec<float>::Poisoned(**gpu, x.size());
  for (int i = 0; i < 3; ++i) (*gpu)->RmsNorm(d_x.get(), d_w.get(), 4, 64, 1e-5f, d_out.get());
  (*gpu)->Add(d_out.get(), d_x.get(), 256);
  const std::string report = CudaOpTimes(**gpu, /*reset=*/true);
  EXPECT_NE(report.find("rmsnorm"), std::string::npos) << report;
  EXPECT_NE(report.find("add"), std::string::npos) << report;
  EXPECT_EQ(CudaOpTimes(**gpu, false).find("rmsnorm"), std::string::npos) << "reset";
  auto plain = CreateCudaBackend();
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(CudaOpTimes(**plain, false), "") << "time_ops off";
}

TEST(CudaBackendCreate, AnswersWithAStatusWhenTheDeviceIsMissing) {
  auto bad = CreateCudaBackend({/*device=*/1000});
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(bad.status().code() == absl::StatusCode::kFailedPrecondition ||
              bad.status().code() == absl::StatusCode::kUnimplemented)
      << bad.status();
  EXPECT_NE(bad.status().message().find("device"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace recall::kernels
