// The defaults of Backend::AddRmsNorm, Backend::MatMulMany, Backend::RerotateKeys,
// Backend::LazyObserve, Backend::LazyEvict,
// Backend::ArgmaxRows and Backend::SampleRows: the reference host loops (kernels/backend.h).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/lazy_evict.h"
#include "kernels/cpu/rerotate.h"
#include "kernels/cpu/sampling.h"
#include "kernels/kv_rows.h"

namespace recall::kernels {

void Backend::AddRmsNorm(float* x, const float* y, const float* weight, int n, int dim,
                         float eps, float* out) {
  Add(x, y, static_cast<int64_t>(n) * dim);
  RmsNorm(x, weight, n, dim, eps, out);
}

void Backend::MatMulMany(const float* x, int n, const Matrix* w, float* const* y, int count) {
  for (int i = 0; i < count; ++i) MatMul(x, n, w[i], y[i]);
}

namespace cpu {

void RerotateRow(float* k, int head_dim, int32_t from, int32_t to, float theta, RopeStyle style) {
  if (from == to) return;
  const int pairs = head_dim / 2;
  const int stride = style == RopeStyle::kInterleaved ? 2 : 1;
  const int offset = style == RopeStyle::kInterleaved ? 1 : pairs;
  const float f = static_cast<float>(from), t = static_cast<float>(to);
  for (int i = 0; i < pairs; ++i) {
    const float freq = RopeFreq(theta, i, head_dim);
    // Rope's float angles at both positions; their difference in double.
    const double angle = static_cast<double>(t * freq) - static_cast<double>(f * freq);
    const float c = static_cast<float>(std::cos(angle)), s = static_cast<float>(std::sin(angle));
    float* p0 = k + i * stride;
    float* p1 = p0 + offset;
    const float v0 = *p0, v1 = *p1;
    *p0 = v0 * c - v1 * s;
    *p1 = v0 * s + v1 * c;
  }
}

}  // namespace cpu

void Backend::RerotateKeys(const RerotateArgs& a) {
  const PagedKvLayout& l = a.kv.layout;
  std::vector<float> row(static_cast<size_t>(l.head_dim));
  for (int r = 0; r < l.n_layers * l.n_kv_heads; ++r) {
    const PagedKvHead head = a.kv.Head(r / l.n_kv_heads, r % l.n_kv_heads);
    for (int s = 0; s < a.lens[r]; ++s) {
      const int32_t from = a.from[r * a.stride + s], to = a.to[r * a.stride + s];
      if (from == to) continue;
      if (l.dtype == KvDType::kF32) {
        cpu::RerotateRow(head.K(s), l.head_dim, from, to, a.theta, a.style);
        continue;
      }
      // Widened, rotated and stored again (with its rounding; int8 gets a new scale).
      LoadKvRow(head, 0, s, row.data());
      cpu::RerotateRow(row.data(), l.head_dim, from, to, a.theta, a.style);
      StoreKvRow(head, 0, s, row.data());
    }
  }
}

void Backend::LazyObserve(const LazyObserveArgs& a) {
  const int group = a.n_heads / a.n_kv_heads;
  for (int l = 0; l < a.n_layers; ++l) {
    for (int h = 0; h < a.n_kv_heads; ++h) {
      const int r = l * a.n_kv_heads + h;
      int32_t* ts = a.ts + r * a.state_stride;
      int32_t* mri = a.mri + r * a.state_stride;
      const float* first =
          a.probs + (static_cast<int64_t>(l) * a.n_heads + static_cast<int64_t>(h) * group) *
                        a.probs_stride;
      for (int j = 0; j < a.lens[r]; ++j) {
        if (j >= a.old_lens[r]) {
          ts[j] = a.t - 1;
          mri[j] = 0;
        }
        float p = first[j];
        for (int g = 1; g < group; ++g) p = std::max(p, first[g * a.probs_stride + j]);
        if (p >= a.alpha) {
          mri[j] = std::max(mri[j], a.t - ts[j]);
          ts[j] = a.t;
        }
      }
    }
  }
}

void Backend::LazyEvict(const LazyEvictArgs& a) {
  thread_local cpu::LazyKeepScratch scratch;
  for (int i = 0; i < a.n_rows; ++i) {
    const int r = a.rows[i];
    int32_t* ts = a.ts + r * a.state_stride;
    int32_t* mri = a.mri + r * a.state_stride;
    int32_t* keep = a.keep_out + i * a.keep_stride;
    cpu::LazyKeepList(ts, mri, a.lens[i], a.keeps[i], a.window, a.t, &scratch, keep);
    const int layer = r / a.kv.layout.n_kv_heads, head = r % a.kv.layout.n_kv_heads;
    memory().CompactRows(a.kv.Head(layer, head), keep, a.keeps[i]);
    cpu::CompactInts(ts, keep, a.keeps[i]);
    cpu::CompactInts(mri, keep, a.keeps[i]);
  }
}

void Backend::ArgmaxRows(const float* x, int rows, int cols, int32_t* out) {
  for (int r = 0; r < rows; ++r) out[r] = cpu::ArgMax(x + static_cast<int64_t>(r) * cols, cols);
}

void Backend::SampleRows(const float* x, int rows, int cols, const SamplingParams* params,
                         const float* draws, int32_t* out) {
  // Pick scales its row in place; x stays as it was. One sampler per thread: a backend is
  // used by one thread at a time, and the workspaces grow once.
  thread_local cpu::Sampler sampler;
  thread_local std::vector<float> row;
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<int64_t>(r) * cols;
    if (!(params[r].temperature > 0.0f)) {  // greedy: nothing to scale, no copy
      out[r] = cpu::ArgMax(xr, cols);
      continue;
    }
    row.assign(xr, xr + cols);
    out[r] = sampler.Pick(row.data(), cols, params[r], draws[r]);
  }
}

}  // namespace recall::kernels
