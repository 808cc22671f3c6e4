#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cstring>

#include "common/logging.h"
#include "kernels/cpu/attend_head.h"
#include "kernels/kv_rows.h"

namespace recall::kernels::cpu {

void Attention::ReserveScratch(int64_t len) {
  const int64_t stride = (len + 15) / 16 * 16;
  if (stride > scratch_stride_) {
    scratch_stride_ = stride;
    scratch_.resize(static_cast<size_t>(stride) * pool_.num_threads());
  }
}

void Attention::StoreKv(const PagedKv& kv, int layer, const float* k, const float* v, int n,
                        const int32_t* start_slots) {
  const int nkv = kv.layout.n_kv_heads, hd = kv.layout.head_dim;
  for (int h = 0; h < nkv; ++h) {
    const PagedKvHead rows = kv.Head(layer, h);
    for (int i = 0; i < n; ++i) {
      const int64_t src = (static_cast<int64_t>(i) * nkv + h) * hd;
      const int slot = start_slots[h] + i;
      StoreKvRow(rows, 0, slot, k + src);
      StoreKvRow(rows, 1, slot, v + src);
    }
  }
}

void Attention::Prefill(const PagedKv& kv, int layer, const int32_t* kv_lens, const float* q, int n,
                        int n_heads, float scale, float* out) {
  const int nkv = kv.layout.n_kv_heads, hd = kv.layout.head_dim;
  RECALL_CHECK(nkv > 0 && n_heads % nkv == 0) << n_heads << " heads, " << nkv << " kv heads";
  const int group = n_heads / nkv;
  int max_len = 0;
  for (int h = 0; h < nkv; ++h) max_len = std::max(max_len, kv_lens[h]);
  ReserveScratch(max_len);
  // Tasks are head-major (task = qh * n + i) so that equal-cost heads split evenly across
  // threads and consecutive tasks reuse the same K/V rows from cache.
  const int64_t tasks = static_cast<int64_t>(n_heads) * n;
  const int64_t min_tasks = std::max<int64_t>(1, 4096 / std::max(1, max_len));
  pool_.ParallelFor(tasks, min_tasks, [&](int64_t b, int64_t e, int t) {
    float* p = Scratch(t);
    for (int64_t task = b; task < e; ++task) {
      const int qh = static_cast<int>(task / n), i = static_cast<int>(task % n);
      const int h = qh / group;
      const int len = kv_lens[h] - n + i + 1;
      const int64_t off = (static_cast<int64_t>(i) * n_heads + qh) * hd;
      AttendHead(kv.Head(layer, h), len, q + off, scale, p, out + off);
    }
  });
}

void Attention::Decode(const PagedKv& kv, int layer, const int32_t* kv_lens, const float* q,
                       int n_heads, float scale, float* out, float* probs, int64_t probs_stride) {
  const int nkv = kv.layout.n_kv_heads, hd = kv.layout.head_dim;
  RECALL_CHECK(nkv > 0 && n_heads % nkv == 0) << n_heads << " heads, " << nkv << " kv heads";
  const int group = n_heads / nkv;
  int max_len = 0;
  for (int h = 0; h < nkv; ++h) max_len = std::max(max_len, kv_lens[h]);
  if (probs == nullptr) ReserveScratch(max_len);
  const int64_t min_heads = std::max<int64_t>(1, 2048 / std::max(1, max_len));
  pool_.ParallelFor(n_heads, min_heads, [&](int64_t b, int64_t e, int t) {
    for (int64_t qh = b; qh < e; ++qh) {
      const int h = static_cast<int>(qh) / group;
      float* p = probs != nullptr ? probs + qh * probs_stride : Scratch(t);
      AttendHead(kv.Head(layer, h), kv_lens[h], q + qh * hd, scale, p, out + qh * hd);
    }
  });
}

}  // namespace recall::kernels::cpu
