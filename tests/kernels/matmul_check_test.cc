// CheckMatMul (kernels/cpu/matmul_check.h): passes for the CPU backend on host and opaque
// memory, and names the op when a backend's matmul is off, not batch-invariant, or its fused
// ops differ from the plain ones.
#include "kernels/cpu/matmul_check.h"

#include <cmath>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "tests/kernels/delegating_backend.h"

namespace recall::kernels {
namespace {

// The CPU backend with one fault.
class WrongMatMul final : public testing::DelegatingBackend {
 public:
  enum Fault { kOff, kVariant, kMany, kAddNorm, kInt8Sign };
  explicit WrongMatMul(Fault fault) : fault_(fault) {}
  const char* Name() const override { return "wrong"; }
  void MatMul(const float* x, int n, const Matrix& w, float* y) override {
    cpu_->MatMul(x, n, w, y);
    if (fault_ == kOff && n > 1) y[0] += 1e-2f;                           // off the reference
    if (fault_ == kVariant && n == 1) y[0] = std::nextafter(y[0], 1e9f);  // one bit, alone
    if (fault_ == kInt8Sign && w.dtype == DType::kI8) {                   // e.g. a wrong zero point
      for (int64_t r = 0; r < w.rows; ++r) y[r] = -y[r];
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
