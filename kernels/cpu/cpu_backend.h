// CpuBackend: the reference Backend (kernels/backend.h), also built for speed: SIMD GEMV for
// decode, OpenBLAS sgemm for prefill, a persistent thread pool for everything else.
// Owns its thread pool and grow-once workspaces; after the first calls of a given size the
// decode path allocates nothing. Used by one thread at a time (see Backend).
#pragma once

#include "kernels/backend.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/sampling.h"
#include "kernels/cpu/thread_pool.h"

namespace recall::kernels::cpu {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options);

  const char* Name() const override { return "cpu"; }
  Memory& memory() override { return memory_; }
  int num_threads() const { return pool_.num_threads(); }

  void Embedding(const Matrix& table, const int32_t* tokens, int n, float* out) override;
  void RmsNorm(const float* x, const float* weight, int n, int dim, float eps, float* out) override;
  void Rope(float* x, const int32_t* positions, int n, int n_heads, int head_dim, float theta,
            RopeStyle style) override;
  void MatMul(const float* x, int n, const Matrix& w, float* y) override;
  // The GEMV path: every output is one row's dot product in a fixed order.
  int BatchInvariantRows() const override { return cpu::MatMul::kGemvMaxInputs; }
  void AddBias(float* x, const float* bias, int n, int dim) override;
  void Add(float* x, const float* y, int64_t count) override;
  void SiluMul(const float* gate, const float* up, int64_t count, float* out) override;
  void Softmax(float* x, int rows, int cols) override;
  void StoreKv(const PagedKv& kv, int layer, const float* k, const float* v, int n,
               const int32_t* start_slots) override;
  void PrefillAttention(const PagedKv& kv, int layer, const int32_t* kv_lens, const float* q, int n,
                        int n_heads, float scale, float* out) override;
  void DecodeAttention(const PagedKv& kv, int layer, const int32_t* kv_lens, const float* q,
                       int n_heads, float scale, float* out, float* probs,
                       int64_t probs_stride) override;
  int32_t Sample(float* logits, int vocab, const SamplingParams& params, Rng& rng,
                 const int32_t* history, int n_history) override;

 private:
  ThreadPool pool_;
  cpu::MatMul matmul_;
  Attention attention_;
  Sampler sampler_;
  Memory& memory_;
};

}  // namespace recall::kernels::cpu
