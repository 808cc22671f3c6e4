// CheckMatMul (kernels/cpu/matmul_check.h): passes for the CPU backend on host and opaque
// memory, and names the op when a backend's matmul is off, not batch-invariant, or its fused
// ops differ from the plain ones.
#include "kernels/cpu/matmul_check.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/fp8.h"
#include "tests/kernels/delegating_backend.h"

namespace recall::kernels {
namespace {

// The CPU backend with one fault.
class WrongMatMul final : public testing::DelegatingBackend {
 public:
  enum Fault { kOff, kVariant, kMany, kAddNorm, kInt8Sign, kInt8NextScale };
  explicit WrongMatMul(Fault fault) : fault_(fault) {}
  const char* Name() const override { return "wrong"; }
  void MatMul(const float* x, int n, const Matrix& w, float* y) override {
    cpu_->MatMul(x, n, w, y);
    if (fault_ == kOff && n > 1) y[0] += 1e-2f;                           // off the reference
    if (fault_ == kVariant && n == 1) y[0] = std::nextafter(y[0], 1e9f);  // one bit, alone
    if (fault_ == kInt8Sign && w.dtype == DType::kI8) {                   // e.g. a wrong zero point
      for (int64_t r = 0; r < w.rows; ++r) y[r] = -y[r];
    }
    if (fault_ == kInt8NextScale && w.dtype == DType::kI8) {  // scales[r + 1] for row r
      std::vector<float> next(static_cast<size_t>(w.rows));
      for (int64_t r = 0; r < w.rows; ++r) next[r] = w.scales[(r + 1) % w.rows];
      Matrix shifted = w;
      shifted.scales = next.data();
      cpu_->MatMul(x, n, shifted, y);
    }
  }
  void MatMulMany(const float* x, int n, const Matrix* w, float* const* y, int count) override {
    Backend::MatMulMany(x, n, w, y, count);
    if (fault_ == kMany) y[count - 1][0] = std::nextafter(y[count - 1][0], 1e9f);
  }
  void AddRmsNorm(float* x, const float* y, const float* w, int n, int dim, float eps,
                  float* out) override {
    Backend::AddRmsNorm(x, y, w, n, dim, fault_ == kAddNorm ? eps * 2 : eps, out);
  }

 private:
  Fault fault_;
};

TEST(CheckMatMulTest, TheCpuBackendPassesOnHostAndOpaqueMemory) {
  const absl::Status st = testing::OnHostAndOpaqueCpu(CheckMatMul);
  EXPECT_TRUE(st.ok()) << st;
}

TEST(CheckMatMulTest, TheCpuBackendsInt8KernelsPassOnHostAndOpaqueMemory) {
  const absl::Status st = testing::OnHostAndOpaqueCpu(CheckInt8MatMul);
  EXPECT_TRUE(st.ok()) << st;
  WrongMatMul wrong(WrongMatMul::kInt8Sign);
  const absl::Status bad = CheckInt8MatMul(wrong);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInternal);
  EXPECT_NE(bad.message().find("MatMul of 24 rows of int8 300x512 is off the widened weights"),
            std::string::npos)
      << bad;
  WrongMatMul next_scale(WrongMatMul::kInt8NextScale);  // an index one row off
  const absl::Status shifted = CheckInt8MatMul(next_scale);
  EXPECT_EQ(shifted.code(), absl::StatusCode::kInternal);
  EXPECT_NE(shifted.message().find("rows of int8 300x512 is off the widened weights"),
            std::string::npos)
      << shifted;
}

// FP8 weights the way the CUDA kernel reads them, on the host: each weight widened to
// e4m3 * its row's and block's scale, then the CPU's f32 product. kWrongBlock reads the
// scale of the next block (a layout fault that the values of one block would not show).
// kGemm is cuBLASLt's FP8 GEMM's arithmetic (kernels/cuda/fp8_gemm.h): x quantized to E4M3
// per row and block of `scale_block` columns too; kGemmWeightScales and kGemmInputScales
// read the weights' or x's scales with rows and blocks swapped (the layout cuBLASLt reads
// is transposed from the one they are stored in).
class HostFp8 final : public testing::DelegatingBackend {
 public:
  enum Fault { kNone, kWrongBlock, kGemm, kGemmWeightScales, kGemmInputScales };
  explicit HostFp8(Fault fault) : fault_(fault) {}
  const char* Name() const override { return "host fp8"; }
  bool RunsFp8Weights() const override { return true; }
  void MatMul(const float* x, int n, const Matrix& w, float* y) override {
    if (w.dtype != DType::kF8E4M3) return cpu_->MatMul(x, n, w, y);
    std::vector<float> wide(static_cast<size_t>(w.numel()));
    const auto* q = static_cast<const uint8_t*>(w.data);
    const int64_t per_row = w.ScaleColumns();
    for (int64_t r = 0; r < w.rows; ++r) {
      for (int64_t c = 0; c < w.cols; ++c) {
        int64_t b = c / w.scale_block;
        if (fault_ == kWrongBlock) b = std::min(b + 1, per_row - 1);
        int64_t at = r * per_row + b;
        if (fault_ == kGemmWeightScales) at = b * w.rows + r;  // [blocks][rows] read flat
        wide[r * w.cols + c] = E4M3ToF32(q[r * w.cols + c]) * w.scales[at % (w.rows * per_row)];
      }
    }
    std::vector<float> xq(x, x + static_cast<size_t>(n) * w.cols);
    if (fault_ >= kGemm) QuantizeRows(xq, n, w.cols, w.scale_block);
    cpu_->MatMul(xq.data(), n, Matrix{wide.data(), DType::kF32, w.rows, w.cols}, y);
  }

 private:
  // x = E4M3(x / s) * s per row and block, s = the block's largest |x| / 448.
  void QuantizeRows(std::vector<float>& x, int n, int64_t cols, int block) const {
    const int64_t blocks = cols / block;
    std::vector<float> scales(static_cast<size_t>(n * blocks));
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t b = 0; b < blocks; ++b) {
        float most = 0;
        for (int64_t c = b * block; c < (b + 1) * block; ++c) {
          most = std::max(most, std::fabs(x[r * cols + c]));
        }
        scales[r * blocks + b] = most > 0 ? most / 448.0f : 1.0f;
      }
    }
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t b = 0; b < blocks; ++b) {
        const float s = scales[r * blocks + b];
        const float used = fault_ == kGemmInputScales ? scales[(b * n + r) % (n * blocks)] : s;
        for (int64_t c = b * block; c < (b + 1) * block; ++c) {
          x[r * cols + c] = E4M3ToF32(F32ToE4M3(x[r * cols + c] / s)) * used;
        }
      }
    }
  }
  Fault fault_;
};

// The many-row FP8 check holds cuBLASLt's arithmetic (x quantized to E4M3 as well) within its
// bound, and names a scale read with rows and blocks swapped, the weights' or x's.
TEST(CheckMatMulTest, TheFp8ManyRowsCheckPassesTheGemmsRoundingAndNamesSwappedScales) {
  for (const HostFp8::Fault right : {HostFp8::kNone, HostFp8::kGemm}) {
    HostFp8 backend(right);
    const absl::Status ok = CheckFp8ManyRows(backend);
    EXPECT_TRUE(ok.ok()) << ok;
  }
  for (const HostFp8::Fault fault : {HostFp8::kGemmWeightScales, HostFp8::kGemmInputScales}) {
    HostFp8 wrong(fault);
    const absl::Status bad = CheckFp8ManyRows(wrong);
    EXPECT_EQ(bad.code(), absl::StatusCode::kInternal) << fault;
    EXPECT_NE(bad.message().find("MatMul of 200 rows of fp8 384x512 (blocks of 128 columns) is "
                                 "off the widened weights' product at row "),
              std::string::npos)
        << bad;
  }
  // A backend without FP8 weights has nothing to check.
  const absl::Status cpu = testing::OnHostAndOpaqueCpu(CheckFp8ManyRows);
  EXPECT_TRUE(cpu.ok()) << cpu;
}

TEST(CheckMatMulTest, TheFp8CheckPassesTheFormatsMeaningAndNamesAWrongBlock) {
  HostFp8 right(HostFp8::kNone);
  const absl::Status ok = CheckFp8MatMul(right);
  EXPECT_TRUE(ok.ok()) << ok;
  HostFp8 wrong(HostFp8::kWrongBlock);
  const absl::Status bad = CheckFp8MatMul(wrong);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInternal);
  EXPECT_NE(bad.message().find("MatMul of 24 rows of fp8 300x512 (blocks of 128 columns) is off "
                               "the widened weights' product"),
            std::string::npos)
      << bad;
}

TEST(CheckMatMulTest, EachFaultIsNamed) {
  const struct {
    WrongMatMul::Fault fault;
    const char* message;
  } cases[] = {
      {WrongMatMul::kOff, "wrong backend: MatMul of 24 rows of f32 300x512 is off the host"},
      {WrongMatMul::kVariant, "MatMul of f32 300x512 is not batch-invariant: 1 rows alone"},
      {WrongMatMul::kMany, "MatMulMany of f32 300x512 differs from one MatMul per matrix"},
      {WrongMatMul::kAddNorm, "AddRmsNorm differs from Add then RmsNorm"},
  };
  for (const auto& c : cases) {
    WrongMatMul backend(c.fault);
    const absl::Status st = CheckMatMul(backend);
    EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << c.message;
    EXPECT_NE(st.message().find(c.message), std::string::npos) << st;
  }
}

}  // namespace
}  // namespace recall::kernels
