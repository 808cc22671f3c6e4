// bf16 / f16 -> f32 conversion: known bit patterns, and the SIMD bulk conversion against the
// scalar one for every length around the vector widths.
#include "kernels/cpu/convert.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/reference.h"

namespace recall::kernels::cpu {
namespace {

// Scenario: hand-picked bf16 patterns widen to the f32 with the same top 16 bits.
TEST(ConvertTest, Bf16KnownValues) {
  EXPECT_EQ(Bf16ToF32(0x3F80), 1.0f);
  EXPECT_EQ(Bf16ToF32(0xC000), -2.0f);
  EXPECT_EQ(Bf16ToF32(0x0000), 0.0f);
  EXPECT_EQ(Bf16ToF32(0x3E80), 0.25f);
  EXPECT_TRUE(std::isinf(Bf16ToF32(0x7F80)));
}

// Scenario: hand-picked f16 patterns, including subnormals and infinity.
TEST(ConvertTest, F16KnownValues) {
  EXPECT_EQ(F16ToF32(0x3C00), 1.0f);
  EXPECT_EQ(F16ToF32(0xC000), -2.0f);
  EXPECT_EQ(F16ToF32(0x3555), 0.333251953125f);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(F16ToF32(0x03FF), 1023.0f * std::ldexp(1.0f, -24));
  EXPECT_EQ(F16ToF32(0x7BFF), 65504.0f);
  EXPECT_EQ(F16ToF32(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(F16ToF32(0x8000), -0.0f);
}

// Scenario: ConvertToF32 (SIMD body + scalar tail) equals the element-wise reference for
// lengths 0..40 and every dtype.
TEST(ConvertTest, BulkMatchesScalarForAllTailLengths) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    testing::TestMatrix m = testing::RandomMatrix(t, 1, 40, 5);
    for (int len = 0; len <= 40; ++len) {
      std::vector<float> out(len + 1, -7.0f);
      ConvertToF32(m.m.data, t, len, out.data());
      for (int i = 0; i < len; ++i) ASSERT_EQ(out[i], m.values[i]) << DTypeName(t) << " " << i;
      EXPECT_EQ(out[len], -7.0f) << "wrote past the end, len " << len;
    }
  }
}

}  // namespace
}  // namespace recall::kernels::cpu
