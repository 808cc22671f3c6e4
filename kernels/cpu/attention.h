// Paged-KV attention of the CPU backend: StoreKv, PrefillAttention and DecodeAttention with
// the semantics of the matching Backend methods (kernels/backend.h), GQA included.
// The per-head kernel is AttendHead (attend_head.h); prefill and decode share it, so a
// one-token prefill equals decode bit for bit. Work is split across the pool by query head
// (and by query for prefill); each thread keeps its scores in a grow-once scratch row.
// Not thread safe: one caller at a time.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "kernels/tensor.h"

namespace recall::kernels::cpu {

class Attention {
 public:
  explicit Attention(ThreadPool& pool) : pool_(pool) {}

  // k, v: [n, n_kv_heads, head_dim]; start_slots: [n_kv_heads].
  void StoreKv(const PagedKv& kv, int layer, const float* k, const float* v, int n,
               const int32_t* start_slots);

  // q, out: [n, n_heads, head_dim]; kv_lens: [n_kv_heads] (after StoreKv).
  // REQUIRES: n_heads % n_kv_heads == 0; kv_lens[h] >= n.
  void Prefill(const PagedKv& kv, int layer, const int32_t* kv_lens, const float* q, int n,
               int n_heads, float scale, float* out);

  // q, out: [n_heads, head_dim]; probs: null or rows of probs_stride floats per query head.
  void Decode(const PagedKv& kv, int layer, const int32_t* kv_lens, const float* q, int n_heads,
              float scale, float* out, float* probs, int64_t probs_stride);

 private:
  // A scores row of at least `len` floats for each pool thread; grows, never shrinks.
  void ReserveScratch(int64_t len);
  float* Scratch(int thread) { return scratch_.data() + thread * scratch_stride_; }

  ThreadPool& pool_;
  std::vector<float> scratch_;
  int64_t scratch_stride_ = 0;
};

}  // namespace recall::kernels::cpu
