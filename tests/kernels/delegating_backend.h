// DelegatingBackend: a Backend that forwards every op to a one-thread CPU backend, for tests
// of code that checks a backend (pick_check, lazy_evict_check): a fake derives from it and
// overrides the op it gets wrong.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "kernels/backend.h"

namespace recall::kernels::testing {

class DelegatingBackend : public Backend {
 public:
  const char* Name() const override { return "delegating"; }
  Memory& memory() override { return cpu_->memory(); }
  void Embedding(const Matrix& t, const int32_t* tok, int n, float* out) override {
    cpu_->Embedding(t, tok, n, out);
  }
  void RmsNorm(const float* x, const float* w, int n, int dim, float eps, float* out) override {
    cpu_->RmsNorm(x, w, n, dim, eps, out);
  }
  void Rope(float* x, const int32_t* p, int n, int h, int d, float theta, RopeStyle s) override {
    cpu_->Rope(x, p, n, h, d, theta, s);
  }
  void MatMul(const float* x, int n, const Matrix& w, float* y) override {
    cpu_->MatMul(x, n, w, y);
  }
  int BatchInvariantRows() const override { return cpu_->BatchInvariantRows(); }
  void AddBias(float* x, const float* b, int n, int dim) override { cpu_->AddBias(x, b, n, dim); }
  void Add(float* x, const float* y, int64_t n) override { cpu_->Add(x, y, n); }
  void SiluMul(const float* g, const float* u, int64_t n, float* out) override {
    cpu_->SiluMul(g, u, n, out);
  }
  void Softmax(float* x, int rows, int cols) override { cpu_->Softmax(x, rows, cols); }
  void StoreKv(const PagedKv& kv, int l, const float* k, const float* v, int n,
               const int32_t* s) override {
    cpu_->StoreKv(kv, l, k, v, n, s);
  }
  void PrefillAttention(const PagedKv& kv, int l, const int32_t* lens, const float* q, int n, int h,
                        float scale, float* out) override {
    cpu_->PrefillAttention(kv, l, lens, q, n, h, scale, out);
  }
  void DecodeAttention(const PagedKv& kv, int l, const int32_t* lens, const float* q, int h,
                       float scale, float* out, float* probs, int64_t stride) override {
    cpu_->DecodeAttention(kv, l, lens, q, h, scale, out, probs, stride);
  }
  int32_t Sample(float* logits, int vocab, const SamplingParams& p, Rng& rng,
                 const int32_t* history, int n) override {
    return cpu_->Sample(logits, vocab, p, rng, history, n);
  }
  void ArgmaxRows(const float* x, int rows, int cols, int32_t* out) override {
    cpu_->ArgmaxRows(x, rows, cols, out);
  }
  void SampleRows(const float* x, int rows, int cols, const SamplingParams* params,
                  const float* draws, int32_t* out) override {
    cpu_->SampleRows(x, rows, cols, params, draws, out);
  }
  void LazyEvict(const LazyEvictArgs& args) override { cpu_->LazyEvict(args); }

 protected:
  std::unique_ptr<Backend> cpu_ = CreateCpuBackend({1});
};

// `check` on a one-thread CPU backend over host memory, then over opaque memory: OK, or the
// first failure with " (opaque memory)" added when it came from the second.
inline absl::Status OnHostAndOpaqueCpu(absl::Status (*check)(Backend&)) {
  for (const bool opaque : {false, true}) {
    CpuBackendOptions o;
    o.num_threads = 1;
    o.opaque_memory = opaque;
    const std::unique_ptr<Backend> cpu = CreateCpuBackend(o);
    const absl::Status st = check(*cpu);
    if (!st.ok()) {
      return absl::Status(st.code(),
                          std::string(st.message()) + (opaque ? " (opaque memory)" : ""));
    }
  }
  return absl::OkStatus();
}

}  // namespace recall::kernels::testing
