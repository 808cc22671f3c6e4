// Embedding, RmsNorm, Rope, AddBias, Add, SiluMul and Softmax against llama2.c run.c's
// plain loops. All but SiluMul promise run.c's exact float arithmetic, so results are
// compared bit for bit; sizes cover both the single-thread and the threaded paths.
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "tests/kernels/reference.h"

namespace recall::kernels {
namespace {

using testing::RandomMatrix;
using testing::RandomVector;

class ElementwiseTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend_ = CreateCpuBackend({2});
};

// Scenario: rows of f32 / f16 / bf16 tables are gathered and widened exactly.
TEST_F(ElementwiseTest, EmbeddingGathersRows) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    testing::TestMatrix table = RandomMatrix(t, 50, 37, 11);
    const std::vector<int32_t> tokens = {3, 0, 49, 3, 17};
    std::vector<float> out(tokens.size() * 37);
    backend_->Embedding(table.m, tokens.data(), tokens.size(), out.data());
    for (size_t i = 0; i < tokens.size(); ++i) {
      for (int j = 0; j < 37; ++j) {
        ASSERT_EQ(out[i * 37 + j], table.values[tokens[i] * 37 + j]) << DTypeName(t);
      }
    }
  }
}

// Scenario: RmsNorm equals run.c's rmsnorm bit for bit, for 1 row and 300 rows (threaded),
// and in place (out aliases x).
TEST_F(ElementwiseTest, RmsNormMatchesRunC) {
  const int dim = 576;
  const std::vector<float> w = RandomVector(dim, 1, 0.5f, 1.5f);
  for (int n : {1, 300}) {
    std::vector<float> x = RandomVector(static_cast<int64_t>(n) * dim, 2 + n, -3.0f, 3.0f);
    std::vector<float> out(x.size()), ref(x.size());
    for (int i = 0; i < n; ++i) {
      const float* xi = x.data() + i * dim;
      float ss = 0.0f;
      for (int j = 0; j < dim; ++j) ss += xi[j] * xi[j];
      ss /= dim;
      ss += 1e-5f;
      ss = 1.0f / sqrtf(ss);
      for (int j = 0; j < dim; ++j) ref[i * dim + j] = w[j] * (ss * xi[j]);
    }
    backend_->RmsNorm(x.data(), w.data(), n, dim, 1e-5f, out.data());
    EXPECT_EQ(out, ref) << "n " << n;
    backend_->RmsNorm(x.data(), w.data(), n, dim, 1e-5f, x.data());
    EXPECT_EQ(x, ref) << "in place, n " << n;
  }
}

// Scenario: one 2-element head at position 3, theta 10000: freq 1, angle 3 rad, so
// (1, 2) -> (cos 3 - 2 sin 3, sin 3 + 2 cos 3). Both styles agree for head_dim 2.
TEST_F(ElementwiseTest, RopeHandComputedTwoElements) {
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kHalfSplit}) {
    float x[2] = {1.0f, 2.0f};
    const int32_t pos = 3;
    backend_->Rope(x, &pos, 1, 1, 2, 10000.0f, style);
    EXPECT_NEAR(x[0], std::cos(3.0) - 2 * std::sin(3.0), 1e-6);
    EXPECT_NEAR(x[1], std::sin(3.0) + 2 * std::cos(3.0), 1e-6);
  }
}

// Scenario: head_dim 4, theta 100, position 2: pair 0 turns by 2 rad, pair 1 by
// 2 * 100^(-1/2) = 0.2 rad. Interleaved pairs are (0,1), (2,3); half-split (0,2), (1,3).
TEST_F(ElementwiseTest, RopeHandComputedPairsPerStyle) {
  const int32_t pos = 2;
  auto rot = [](double a, double b, double ang, double* oa, double* ob) {
    *oa = a * std::cos(ang) - b * std::sin(ang);
    *ob = a * std::sin(ang) + b * std::cos(ang);
  };
  double e[4];
  float x[4] = {1, 2, 3, 4};
  backend_->Rope(x, &pos, 1, 1, 4, 100.0f, RopeStyle::kInterleaved);
  rot(1, 2, 2.0, &e[0], &e[1]);
  rot(3, 4, 0.2, &e[2], &e[3]);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(x[i], e[i], 1e-6) << "interleaved " << i;
  float y[4] = {1, 2, 3, 4};
  backend_->Rope(y, &pos, 1, 1, 4, 100.0f, RopeStyle::kHalfSplit);
  rot(1, 3, 2.0, &e[0], &e[2]);
  rot(2, 4, 0.2, &e[1], &e[3]);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(y[i], e[i], 1e-6) << "half split " << i;
}

// Scenario: random heads at scattered positions equal run.c's RoPE loop (interleaved) and
// the Hugging Face rotate_half form (half split) bit for bit, with each frequency's power
// taken in double and rounded once (RopeFreq: host and device powf differ by an ulp for
// some pairs); 200 tokens use the threads.
TEST_F(ElementwiseTest, RopeMatchesReferenceBothStyles) {
  const int n_heads = 3, hd = 64, n = 200;
  std::vector<int32_t> pos(n);
  for (int i = 0; i < n; ++i) pos[i] = (i * 37) % 1000;
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kHalfSplit}) {
    std::vector<float> x = RandomVector(static_cast<int64_t>(n) * n_heads * hd, 5);
    std::vector<float> ref = x;
    for (int t = 0; t < n; ++t) {
      for (int h = 0; h < n_heads; ++h) {
        float* v = ref.data() + (t * n_heads + h) * hd;
        for (int i = 0; i < hd; i += 2) {
          const float freq = static_cast<float>(1.0 / std::pow(10000.0, static_cast<double>(i) / hd));
          const float val = pos[t] * freq;
          const float fcr = cosf(val), fci = sinf(val);
          const int a = style == RopeStyle::kInterleaved ? i : i / 2;
          const int b = style == RopeStyle::kInterleaved ? i + 1 : i / 2 + hd / 2;
          const float v0 = v[a], v1 = v[b];
          v[a] = v0 * fcr - v1 * fci;
          v[b] = v0 * fci + v1 * fcr;
        }
      }
    }
    backend_->Rope(x.data(), pos.data(), n, n_heads, hd, 10000.0f, style);
    EXPECT_EQ(x, ref) << static_cast<int>(style);
  }
}

// Scenario: AddBias adds the bias to every row; Add adds elementwise (large: threaded).
TEST_F(ElementwiseTest, AddBiasAndAdd) {
  std::vector<float> x = RandomVector(5 * 7, 1);
  const std::vector<float> bias = RandomVector(7, 2);
  std::vector<float> ref = x;
  for (int i = 0; i < 5; ++i) {
    for (int j = 0; j < 7; ++j) ref[i * 7 + j] += bias[j];
  }
  backend_->AddBias(x.data(), bias.data(), 5, 7);
  EXPECT_EQ(x, ref);

  std::vector<float> a = RandomVector(300001, 3);
  const std::vector<float> b = RandomVector(300001, 4);
  std::vector<float> sum(a.size());
  for (size_t i = 0; i < a.size(); ++i) sum[i] = a[i] + b[i];
  backend_->Add(a.data(), b.data(), a.size());
  EXPECT_EQ(a, sum);
}

// Scenario: SiluMul matches run.c's SwiGLU loop (with expf) within a few ulp (it uses a
// vector exp), for a length that is not a multiple of the vector width, also with out
// aliasing gate; the aliased result is bit-identical to the separate one.
TEST_F(ElementwiseTest, SiluMulMatchesRunC) {
  const int64_t count = 100003;
  std::vector<float> gate = RandomVector(count, 1, -20.0f, 20.0f);
  const std::vector<float> up = RandomVector(count, 2);
  std::vector<float> ref(count), out(count);
  for (int64_t i = 0; i < count; ++i) {
    float val = gate[i];
    val *= (1.0f / (1.0f + expf(-val)));
    val *= up[i];
    ref[i] = val;
  }
  backend_->SiluMul(gate.data(), up.data(), count, out.data());
  for (int64_t i = 0; i < count; ++i) {
    ASSERT_NEAR(out[i], ref[i], 4e-7f * std::fabs(ref[i]) + 1e-30f) << "gate " << gate[i];
  }
  backend_->SiluMul(gate.data(), up.data(), count, gate.data());
  EXPECT_EQ(gate, out);
}

// Scenario: row-wise Softmax equals run.c's softmax bit for bit and rows sum to 1.
TEST_F(ElementwiseTest, SoftmaxMatchesRunC) {
  for (auto [rows, cols] : {std::pair{1, 1}, std::pair{3, 17}, std::pair{64, 1000}}) {
    std::vector<float> x = RandomVector(static_cast<int64_t>(rows) * cols, cols, -20.0f, 20.0f);
    std::vector<float> ref = x;
    for (int r = 0; r < rows; ++r) testing::RefSoftmax(ref.data() + r * cols, cols);
    backend_->Softmax(x.data(), rows, cols);
    EXPECT_EQ(x, ref);
    for (int r = 0; r < rows; ++r) {
      double s = 0;
      for (int c = 0; c < cols; ++c) s += x[r * cols + c];
      EXPECT_NEAR(s, 1.0, 1e-5);
    }
  }
}

}  // namespace
}  // namespace recall::kernels
