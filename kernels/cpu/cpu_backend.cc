#include "kernels/cpu/cpu_backend.h"

#include <memory>

#include "kernels/cpu/elementwise.h"

namespace recall::kernels {
namespace cpu {

CpuBackend::CpuBackend(const CpuBackendOptions& options)
    : pool_(options.num_threads), matmul_(pool_), attention_(pool_),
      memory_(options.opaque_memory ? OpaqueHostMemory() : HostMemory()) {}

void CpuBackend::Embedding(const Matrix& table, const int32_t* tokens, int n, float* out) {
  cpu::Embedding(pool_, table, tokens, n, out);
}

void CpuBackend::RmsNorm(const float* x, const float* weight, int n, int dim, float eps,
                         float* out) {
  cpu::RmsNorm(pool_, x, weight, n, dim, eps, out);
}

void CpuBackend::Rope(float* x, const int32_t* positions, int n, int n_heads, int head_dim,
                      float theta, RopeStyle style) {
  cpu::Rope(pool_, x, positions, n, n_heads, head_dim, theta, style);
}

void CpuBackend::MatMul(const float* x, int n, const Matrix& w, float* y) {
  matmul_.Run(x, n, w, y);
}

void CpuBackend::AddBias(float* x, const float* bias, int n, int dim) {
  cpu::AddBias(pool_, x, bias, n, dim);
}

void CpuBackend::Add(float* x, const float* y, int64_t count) { cpu::Add(pool_, x, y, count); }

void CpuBackend::SiluMul(const float* gate, const float* up, int64_t count, float* out) {
  cpu::SiluMul(pool_, gate, up, count, out);
}

void CpuBackend::Softmax(float* x, int rows, int cols) { cpu::Softmax(pool_, x, rows, cols); }

void CpuBackend::StoreKv(const PagedKv& kv, int layer, const float* k, const float* v, int n,
                         const int32_t* start_slots) {
  attention_.StoreKv(kv, layer, k, v, n, start_slots);
}

void CpuBackend::PrefillAttention(const PagedKv& kv, int layer, const int32_t* kv_lens,
                                  const float* q, int n, int n_heads, float scale, float* out) {
  attention_.Prefill(kv, layer, kv_lens, q, n, n_heads, scale, out);
}

void CpuBackend::DecodeAttention(const PagedKv& kv, int layer, const int32_t* kv_lens,
                                 const float* q, int n_heads, float scale, float* out, float* probs,
                                 int64_t probs_stride) {
  attention_.Decode(kv, layer, kv_lens, q, n_heads, scale, out, probs, probs_stride);
}

int32_t CpuBackend::Sample(float* logits, int vocab, const SamplingParams& params, Rng& rng,
                           const int32_t* history, int n_history) {
  return sampler_.Sample(logits, vocab, params, rng, history, n_history);
}

}  // namespace cpu

std::unique_ptr<Backend> CreateCpuBackend(const CpuBackendOptions& options) {
  return std::make_unique<cpu::CpuBackend>(options);
}

}  // namespace recall::kernels
