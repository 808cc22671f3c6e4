#include "kernels/cpu/elementwise.h"

#include <algorithm>
#include <cmath>

#include "common/logging.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/int8.h"
#include "kernels/cpu/simd_math.h"

namespace recall::kernels::cpu {
namespace {

// Elements per thread below which an op is not worth splitting.
constexpr int64_t kMinElementsPerThread = int64_t{1} << 14;

int64_t RowsPerThread(int64_t row_elements) {
  return std::max<int64_t>(1, kMinElementsPerThread / std::max<int64_t>(1, row_elements));
}

}  // namespace

void Embedding(ThreadPool& pool, const Matrix& table, const int32_t* tokens, int n, float* out) {
  const int64_t dim = table.cols;
  const size_t row_bytes = static_cast<size_t>(dim) * DTypeSize(table.dtype);
  pool.ParallelFor(n, RowsPerThread(dim), [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) {
      if (table.dtype == DType::kI8) {  // int8 rows carry their scales
        DequantizeRowsInt8(table, tokens[i], 1, out + i * dim);
        continue;
      }
      const char* row = static_cast<const char*>(table.data) + tokens[i] * row_bytes;
      ConvertToF32(row, table.dtype, dim, out + i * dim);
    }
  });
}

void RmsNorm(ThreadPool& pool, const float* x, const float* weight, int n, int dim, float eps,
             float* out) {
  pool.ParallelFor(n, RowsPerThread(dim), [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) {
      const float* xi = x + i * dim;
      float* oi = out + i * dim;
      float ss = 0.0f;
      for (int j = 0; j < dim; ++j) ss += xi[j] * xi[j];
      ss /= dim;
      ss += eps;
      ss = 1.0f / sqrtf(ss);
      for (int j = 0; j < dim; ++j) oi[j] = weight[j] * (ss * xi[j]);
    }
  });
}

void Rope(ThreadPool& pool, float* x, const int32_t* positions, int n, int n_heads, int head_dim,
          float theta, RopeStyle style) {
  RECALL_CHECK(head_dim % 2 == 0 && head_dim <= kMaxRopeHeadDim) << "head_dim " << head_dim;
  const int pairs = head_dim / 2;
  float freq[kMaxRopeHeadDim / 2];
  for (int i = 0; i < pairs; ++i) {
    freq[i] = RopeFreq(theta, i, head_dim);
  }
  const int64_t row = static_cast<int64_t>(n_heads) * head_dim;
  pool.ParallelFor(n, RowsPerThread(row * 4), [&](int64_t b, int64_t e, int) {
    float fcr[kMaxRopeHeadDim / 2], fci[kMaxRopeHeadDim / 2];
    for (int64_t t = b; t < e; ++t) {
      const int pos = positions[t];
      for (int i = 0; i < pairs; ++i) {
        const float val = pos * freq[i];
        fcr[i] = cosf(val);
        fci[i] = sinf(val);
      }
      for (int h = 0; h < n_heads; ++h) {
        float* v = x + t * row + static_cast<int64_t>(h) * head_dim;
        // Pair i is (2i, 2i + 1) interleaved, or (i, i + head_dim / 2) half split.
        const int stride = style == RopeStyle::kInterleaved ? 2 : 1;
        const int offset = style == RopeStyle::kInterleaved ? 1 : pairs;
        for (int i = 0; i < pairs; ++i) {
          float* p0 = v + i * stride;
          float* p1 = p0 + offset;
          const float v0 = *p0;
          const float v1 = *p1;
          *p0 = v0 * fcr[i] - v1 * fci[i];
          *p1 = v0 * fci[i] + v1 * fcr[i];
        }
      }
    }
  });
}

void AddBias(ThreadPool& pool, float* x, const float* bias, int n, int dim) {
  pool.ParallelFor(n, RowsPerThread(dim), [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) {
      float* xi = x + i * dim;
      for (int j = 0; j < dim; ++j) xi[j] += bias[j];
    }
  });
}

void Add(ThreadPool& pool, float* x, const float* y, int64_t count) {
  pool.ParallelFor(count, kMinElementsPerThread * 4, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) x[i] += y[i];
  });
}

void SiluMul(ThreadPool& pool, const float* gate, const float* up, int64_t count, float* out) {
  // run.c's statements (val *= 1 / (1 + exp(-val)); val *= up) with a vector exp.
  pool.ParallelFor(count, kMinElementsPerThread / 4, [&](int64_t b, int64_t e, int) {
#if defined(RECALL_CPU_AVX512)
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = b; i < e; i += 16) {
      const __mmask16 m = e - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (e - i)) - 1);
      __m512 val = _mm512_maskz_loadu_ps(m, gate + i);
      const __m512 ex = Exp16(_mm512_sub_ps(_mm512_setzero_ps(), val));
      val = _mm512_mul_ps(val, _mm512_div_ps(one, _mm512_add_ps(one, ex)));
      val = _mm512_mul_ps(val, _mm512_maskz_loadu_ps(m, up + i));
      _mm512_mask_storeu_ps(out + i, m, val);
    }
#elif defined(__AVX2__) && defined(__FMA__)
    const __m256 one = _mm256_set1_ps(1.0f);
    for (int64_t i = b; i < e; i += 8) {
      // The tail goes through zero-padded copies so that every element takes the same path.
      const int cnt = static_cast<int>(std::min<int64_t>(8, e - i));
      alignas(32) float g8[8] = {}, u8[8] = {}, o8[8];
      const float* g = gate + i;
      const float* u = up + i;
      if (cnt < 8) {
        std::copy(gate + i, gate + i + cnt, g8);
        std::copy(up + i, up + i + cnt, u8);
        g = g8;
        u = u8;
      }
      __m256 val = _mm256_loadu_ps(g);
      const __m256 ex = Exp8(_mm256_sub_ps(_mm256_setzero_ps(), val));
      val = _mm256_mul_ps(val, _mm256_div_ps(one, _mm256_add_ps(one, ex)));
      val = _mm256_mul_ps(val, _mm256_loadu_ps(u));
      _mm256_store_ps(o8, val);
      std::copy(o8, o8 + cnt, out + i);
    }
#else
    for (int64_t i = b; i < e; ++i) {
      float val = gate[i];
      val *= (1.0f / (1.0f + expf(-val)));
      val *= up[i];
      out[i] = val;
    }
#endif
  });
}

void SoftmaxRow(float* x, int64_t n) {
  if (n <= 0) return;
  float max_val = x[0];
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > max_val) max_val = x[i];
  }
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = expf(x[i] - max_val);
    sum += x[i];
  }
  for (int64_t i = 0; i < n; ++i) x[i] /= sum;
}

void Softmax(ThreadPool& pool, float* x, int rows, int cols) {
  pool.ParallelFor(rows, RowsPerThread(cols * 4), [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) SoftmaxRow(x + r * cols, cols);
  });
}

}  // namespace recall::kernels::cpu
