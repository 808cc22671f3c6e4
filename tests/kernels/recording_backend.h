// RecordingBackend: a CPU backend over opaque memory that records ops the way a CUDA graph
// does, for tests of code that records steps (worker/runtime/step_graphs.h) on machines
// without a GPU.
//
// Record() keeps each op with its arguments by value (pointers, sizes, scalars; a KvBatch
// with its device arrays) instead of running it, and Replay() runs them again on the CPU,
// reading the memory behind the pointers as it is then. Like a kernel, a replayed batch op
// reads the batch's arrays in backend memory (never the host_ copies, which the recorder
// drops), and the cache lengths must fit in the recorded max_kv_len (the attention grid a GPU
// launched): a longer head counts as a coverage violation. Ops a graph cannot hold (copies
// across to the host, allocations, per-sequence staged ops, sampling, eviction) make Record
// return null, as the CUDA backend does.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "tests/kernels/delegating_backend.h"

namespace recall::kernels::testing {

class RecordingBackend : public DelegatingBackend {
 public:
  RecordingBackend() : guard_(this) {
    CpuBackendOptions o;
    o.num_threads = 1;
    o.opaque_memory = true;
    cpu_ = CreateCpuBackend(o);
  }
  const char* Name() const override { return "recording"; }
  Memory& memory() override { return guard_; }

  bool CanRecord() const override { return true; }
  absl::StatusOr<std::unique_ptr<OpGraph>> Record(absl::FunctionRef<void()> ops) override {
    recording_ = true;
    refused_.clear();
    tape_.clear();
    ops();
    recording_ = false;
    if (!refused_.empty()) return std::unique_ptr<OpGraph>();
    ++recordings_;
    return std::unique_ptr<OpGraph>(new Graph(this, std::move(tape_)));
  }

  // A workspace the recorded ops use moved: graphs recorded before are stale.
  void MoveWorkspace() { ++moves_; }
  int64_t recordings() const { return recordings_; }
  int64_t replays() const { return replays_; }
  // Batch ops whose heads outgrew the max_kv_len they were launched (or recorded) with.
  int64_t coverage_violations() const { return violations_; }
  // The op that made the last Record return null ("" if none).
  const std::string& refused() const { return refused_; }
  // A broken graph, for tests of the check of the first one: replays leave out the last op.
  bool skip_last_op_on_replay = false;

  void Embedding(const Matrix& t, const int32_t* tok, int n, float* out) override {
    Op([=, this] { cpu_->Embedding(t, tok, n, out); });
  }
  void RmsNorm(const float* x, const float* w, int n, int dim, float eps, float* out) override {
    Op([=, this] { cpu_->RmsNorm(x, w, n, dim, eps, out); });
  }
  void Rope(float* x, const int32_t* p, int n, int h, int d, float theta, RopeStyle s) override {
    Op([=, this] { cpu_->Rope(x, p, n, h, d, theta, s); });
  }
  void MatMul(const float* x, int n, const Matrix& w, float* y) override {
    Op([=, this] { cpu_->MatMul(x, n, w, y); });
  }
  void AddBias(float* x, const float* b, int n, int dim) override {
    Op([=, this] { cpu_->AddBias(x, b, n, dim); });
  }
  void Add(float* x, const float* y, int64_t n) override {
    Op([=, this] { cpu_->Add(x, y, n); });
  }
  void SiluMul(const float* g, const float* u, int64_t n, float* out) override {
    Op([=, this] { cpu_->SiluMul(g, u, n, out); });
  }
  void Softmax(float* x, int rows, int cols) override {
    Op([=, this] { cpu_->Softmax(x, rows, cols); });
  }
  void StoreKvBatch(const KvBatch& b, int layer, const float* k, const float* v) override {
    const KvBatch d = DeviceView(b);
    Op([=, this] {
      Cover(d, layer);
      cpu_->StoreKvBatch(d, layer, k, v);
    });
  }
  void AttentionBatch(const KvBatch& b, int layer, const float* q, int n_heads, float scale,
                      float* out) override {
    const KvBatch d = DeviceView(b);
    Op([=, this] {
      Cover(d, layer);
      cpu_->AttentionBatch(d, layer, q, n_heads, scale, out);
    });
  }

  // Not recordable: staged through the host, or per-step host arguments.
  void StoreKv(const PagedKv& kv, int l, const float* k, const float* v, int n,
               const int32_t* s) override {
    if (!Refuse("StoreKv")) DelegatingBackend::StoreKv(kv, l, k, v, n, s);
  }
  void PrefillAttention(const PagedKv& kv, int l, const int32_t* lens, const float* q, int n, int h,
                        float scale, float* out) override {
    if (!Refuse("PrefillAttention"))
      DelegatingBackend::PrefillAttention(kv, l, lens, q, n, h, scale, out);
  }
  void DecodeAttention(const PagedKv& kv, int l, const int32_t* lens, const float* q, int h,
                       float scale, float* out, float* probs, int64_t stride) override {
    if (!Refuse("DecodeAttention")) {
      DelegatingBackend::DecodeAttention(kv, l, lens, q, h, scale, out, probs, stride);
    }
  }
  void LazyObserve(const LazyObserveArgs& a) override {
    if (!Refuse("LazyObserve")) cpu_->LazyObserve(a);
  }
  void LazyEvict(const LazyEvictArgs& a) override {
    if (!Refuse("LazyEvict")) cpu_->LazyEvict(a);
  }
  void ArgmaxRows(const float* x, int rows, int cols, int32_t* out) override {
    if (!Refuse("ArgmaxRows")) cpu_->ArgmaxRows(x, rows, cols, out);
  }
  void SampleRows(const float* x, int rows, int cols, const SamplingParams* params,
                  const float* draws, int32_t* out) override {
    if (!Refuse("SampleRows")) cpu_->SampleRows(x, rows, cols, params, draws, out);
  }

 private:
  class Graph final : public OpGraph {
   public:
    Graph(RecordingBackend* b, std::vector<std::function<void()>> tape)
        : b_(b), tape_(std::move(tape)), moves_(b->moves_) {}
    absl::Status Replay() override {
      if (b_->moves_ != moves_) return absl::FailedPreconditionError("recording: stale graph");
      ++b_->replays_;
      const size_t n = tape_.size() - (b_->skip_last_op_on_replay && !tape_.empty() ? 1 : 0);
      for (size_t i = 0; i < n; ++i) tape_[i]();
      return absl::OkStatus();
    }

   private:
    RecordingBackend* b_;
    std::vector<std::function<void()>> tape_;
    int64_t moves_;
  };

  // The backend's memory, refusing what a graph cannot capture while recording.
  class GuardMemory final : public Memory {
   public:
    explicit GuardMemory(RecordingBackend* b) : b_(b) {}
    const char* Name() const override { return "recording opaque"; }
    bool host_accessible() const override { return false; }
    absl::StatusOr<void*> Allocate(size_t bytes) override {
      if (b_->Refuse("Allocate"))
        return absl::FailedPreconditionError("allocation while recording");
      return M().Allocate(bytes);
    }
    void Free(void* p) override { M().Free(p); }
    void CopyIn(void* d, const void* s, size_t n) override {
      if (!b_->Refuse("CopyIn")) M().CopyIn(d, s, n);
    }
    void CopyOut(void* d, const void* s, size_t n) override {
      if (!b_->Refuse("CopyOut")) M().CopyOut(d, s, n);
    }
    void Copy(void* d, const void* s, size_t n) override {
      b_->Op([=, this] { M().Copy(d, s, n); });
    }
    void CopyOutRows(void* d, size_t ds, const void* s, size_t ss, size_t rb,
                     size_t rows) override {
      if (!b_->Refuse("CopyOutRows")) M().CopyOutRows(d, ds, s, ss, rb, rows);
    }
    void CompactRows(const PagedKvHead& rows, const int32_t* keep, int n) override {
      if (!b_->Refuse("CompactRows")) M().CompactRows(rows, keep, n);
    }

   private:
    Memory& M() { return b_->cpu_->memory(); }
    RecordingBackend* b_;
  };

  // Runs `op` now, or appends it to the tape while recording.
  void Op(std::function<void()> op) {
    if (recording_) {
      tape_.push_back(std::move(op));
    } else {
      op();
    }
  }
  bool Refuse(const char* what) {
    if (!recording_) return false;
    if (refused_.empty()) refused_ = what;
    return true;
  }
  // The batch as a kernel sees it: the arrays in backend memory (opaque memory is host memory
  // underneath), never the host_ copies of the step it was recorded in.
  static KvBatch DeviceView(const KvBatch& b) {
    KvBatch d = b;
    d.host_token_begin = b.token_begin;
    d.host_kv_start = b.kv_start;
    d.host_table_begin = b.table_begin;
    d.host_table_count = b.table_count;
    d.host_tables = b.tables;
    d.host_probs = b.probs;
    d.host_probs_stride = b.probs_stride;
    return d;
  }
  // Counts the heads of `layer` longer (after the step) than the grid of b.max_kv_len covers.
  void Cover(const KvBatch& b, int layer) {
    const int n_kv = b.layout.n_kv_heads;
    for (int i = 0; i < b.n_items; ++i) {
      const int n = b.token_begin[i + 1] - b.token_begin[i];
      const int32_t* start =
          b.kv_start + (static_cast<size_t>(i) * b.layout.n_layers + layer) * n_kv;
      for (int h = 0; h < n_kv; ++h) violations_ += start[h] + n > b.max_kv_len ? 1 : 0;
    }
  }

  GuardMemory guard_;
  bool recording_ = false;
  std::string refused_;
  std::vector<std::function<void()>> tape_;
  int64_t moves_ = 0, recordings_ = 0, replays_ = 0, violations_ = 0;
};

}  // namespace recall::kernels::testing
