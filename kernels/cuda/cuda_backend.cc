// The CUDA backend (kernels/cuda_backend.h).
#include "kernels/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_raii.h"
#include "common/logging.h"
#include "common/status.h"
#include "kernels/cpu/lazy_evict.h"
#include "kernels/cpu/lazy_evict_check.h"
#include "kernels/cpu/matmul_check.h"
#include "kernels/cpu/pick_check.h"
#include "kernels/cpu/rerotate.h"
#include "kernels/cpu/rerotate_check.h"
#include "kernels/cpu/sampling.h"
#include "kernels/cuda/cuda_memory.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/op_timer.h"
#include "kernels/kv_rows.h"

namespace recall::kernels {
namespace cuda {
namespace {

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, recall::cuda::Stream stream, cublasHandle_t blas,
              std::unique_ptr<Fp8Gemm> fp8_gemm, int sm_count, const CudaBackendOptions& options)
      : device_(device),
        stream_(std::move(stream)),
        blas_(blas),
        fp8_gemm_(std::move(fp8_gemm)),
        sm_count_(sm_count),
        memory_(device, stream_.get()),
        host_picks_(options.host_picks),
        host_evict_(options.host_evict),
        cublas_matmuls_(options.cublas_matmuls),
        int8_weights_(!options.refuse_int8_weights),
        fp8_weights_(!options.refuse_fp8_weights),
        host_rerotate_(options.host_rerotate),
        chunks_in_flight_(options.skinny_chunks_in_flight) {
    if (options.time_ops) timer_ = std::make_unique<OpTimer>();
  }
  ~CudaBackend() override {
    cudaSetDevice(device_);  // the destroying thread may be bound to another GPU
    cudaStreamSynchronize(stream_.get());
    if (blas_ != nullptr) cublasDestroy(blas_);
  }

  const char* Name() const override { return "cuda"; }
  // CudaOpTimes.
  std::string OpTimes(bool reset) { return timer_ == nullptr ? "" : timer_->Report(reset); }
  // CudaPicksOnHost.
  bool picks_on_host() const { return host_picks_; }
  // CudaEvictsOnHost.
  bool evicts_on_host() const { return host_evict_; }
  bool rerotates_on_host() const { return host_rerotate_; }
  // CudaMatMulsOnCublas.
  bool matmuls_on_cublas() const { return cublas_matmuls_; }
  // CudaFp8OnCublasLt.
  bool fp8_on_cublaslt() const { return fp8_gemm_ != nullptr; }
  Memory& memory() override { return memory_; }
  absl::Status Health() override { return memory_.status(); }

  // A CUDA graph of the ops, captured from the stream. Not with the op timer (its events are
  // host round trips) nor with the cuBLAS fallback (its calls may allocate).
  bool CanRecord() const override { return timer_ == nullptr && !cublas_matmuls_; }
  absl::StatusOr<std::unique_ptr<OpGraph>> Record(absl::FunctionRef<void()> ops) override;

  absl::Status ReserveWorkspace(const WorkspaceNeeds& needs) override {
    RECALL_RETURN_IF_ERROR(GrowRounding(static_cast<int64_t>(needs.max_tokens) * needs.max_cols));
    if (fp8_gemm_ != nullptr && needs.weight_dtype == DType::kF8E4M3 &&
        needs.max_matmul_rows > kSkinnyRows) {
      RECALL_RETURN_IF_ERROR(fp8_gemm_->Reserve(needs.max_tokens, needs.max_cols));
    }
    return GrowAttention(needs.max_tokens, needs.max_heads, needs.head_dim);
  }

  void Embedding(const Matrix& table, const int32_t* tokens, int n, float* out) override {
    const Timed timed(this, "embedding");
    LaunchEmbedding(table, tokens, n, out, s());
    Launched("embedding");
  }
  void RmsNorm(const float* x, const float* weight, int n, int dim, float eps,
               float* out) override {
    const Timed timed(this, "rmsnorm");
    LaunchRmsNorm(x, weight, n, dim, eps, out, s());
    Launched("rmsnorm");
  }
  void AddRmsNorm(float* x, const float* y, const float* weight, int n, int dim, float eps,
                  float* out) override {
    if (cublas_matmuls_) return Backend::AddRmsNorm(x, y, weight, n, dim, eps, out);
    const Timed timed(this, "add_rmsnorm");
    LaunchAddRmsNorm(x, y, weight, n, dim, eps, out, s());
    Launched("add_rmsnorm");
  }
  void Rope(float* x, const int32_t* positions, int n, int n_heads, int head_dim, float theta,
            RopeStyle style) override {
    const Timed timed(this, "rope");
    LaunchRope(x, positions, n, n_heads, head_dim, theta, style, s());
    Launched("rope");
  }
  void MatMul(const float* x, int n, const Matrix& w, float* y) override;
  // Calls of up to kSkinnyRows rows run our own matmul (LaunchSkinnyMatMul), whose every
  // output is the same sequence of operations whatever the row count; larger ones go to
  // cuBLAS, which may pick another algorithm (and summation order) for another row count.
  static constexpr int kSkinnyRows = 64;
  int BatchInvariantRows() const override { return cublas_matmuls_ ? 1 : kSkinnyRows; }
  bool RunsInt8Weights() const override { return int8_weights_; }
  bool RunsFp8Weights() const override { return fp8_weights_; }
  // Up to three matrices of one dtype over few rows: one launch of the same kernel.
  void MatMulMany(const float* x, int n, const Matrix* w, float* const* y, int count) override {
    if (count == 1) return MatMul(x, n, w[0], y[0]);
    bool one_launch = !cublas_matmuls_ && n <= kSkinnyRows && count <= kMaxProjections;
    for (int i = 1; one_launch && i < count; ++i) one_launch = w[i].dtype == w[0].dtype;
    if (!one_launch) return Backend::MatMulMany(x, n, w, y, count);
    for (int i = 0; i < count; ++i) {
      if (RefusedScaleBlock(w[i])) return;
    }
    const Timed timed(this, timer_ == nullptr ? std::string()
                                              : absl::StrCat("matmul x", count, " ",
                                                             DTypeName(w[0].dtype), " n", n));
    LaunchSkinnyMatMul(x, n, w, y, count, chunks_in_flight_, s());
    Launched("matmul (skinny, several)");
  }
  void AddBias(float* x, const float* bias, int n, int dim) override {
    const Timed timed(this, "add_bias");
    LaunchAddBias(x, bias, n, dim, s());
    Launched("add_bias");
  }
  void Add(float* x, const float* y, int64_t count) override {
    const Timed timed(this, "add");
    LaunchAdd(x, y, count, s());
    Launched("add");
  }
  void SiluMul(const float* gate, const float* up, int64_t count, float* out) override {
    const Timed timed(this, "silu_mul");
    LaunchSiluMul(gate, up, count, out, s());
    Launched("silu_mul");
  }
  void Softmax(float* x, int rows, int cols) override {
    const Timed timed(this, "softmax");
    LaunchSoftmax(x, rows, cols, s());
    Launched("softmax");
  }

  void StoreKvBatch(const KvBatch& batch, int layer, const float* k, const float* v) override {
    const Timed timed(this, "store_kv");
    LaunchStoreKv(batch, layer, k, v, s());
    Launched("store_kv");
  }
  void AttentionBatch(const KvBatch& batch, int layer, const float* q, int n_heads, float scale,
                      float* out) override {
    const Timed timed(this, batch.max_new_tokens == 1 ? "attention decode" : "attention prefill");
    if (!memory_.Check(batch.layout.head_dim <= 256 ? cudaSuccess : cudaErrorInvalidValue,
                       "attention: head_dim above 256") ||
        !GrowAttention(batch.total_tokens, n_heads, batch.layout.head_dim).ok()) {
      return;
    }
    AttentionScratch scratch{attn_partials_.as<float>(), attn_partial_floats_,
                             attn_stats_.as<float>(), attn_stat_floats_, sm_count_};
    LaunchAttention(batch, layer, q, n_heads, scale, out, scratch, s());
    Launched("attention");
  }

  // The per-sequence ops stage a one-item batch (host block tables and lengths) first.
  void StoreKv(const PagedKv& kv, int layer, const float* k, const float* v, int n,
               const int32_t* start_slots) override {
    if (memory_.Refuse("StoreKv (stages its tables)")) return;
    const KvBatch b = StageOne(kv, layer, start_slots, n, nullptr, 0);
    StoreKvBatch(b, 0, k, v);
  }
  void PrefillAttention(const PagedKv& kv, int layer, const int32_t* kv_lens, const float* q,
                        int n, int n_heads, float scale, float* out) override {
    if (memory_.Refuse("PrefillAttention (stages its tables)")) return;
    StageStarts(kv, kv_lens, n);
    const KvBatch b = StageOne(kv, layer, starts_.data(), n, nullptr, 0);
    AttentionBatch(b, 0, q, n_heads, scale, out);
  }
  void DecodeAttention(const PagedKv& kv, int layer, const int32_t* kv_lens, const float* q,
                       int n_heads, float scale, float* out, float* probs,
                       int64_t probs_stride) override {
    if (memory_.Refuse("DecodeAttention (stages its tables)")) return;
    StageStarts(kv, kv_lens, 1);
    const KvBatch b = StageOne(kv, layer, starts_.data(), 1, probs, probs_stride);
    AttentionBatch(b, 0, q, n_heads, scale, out);
  }

  void LazyObserve(const LazyObserveArgs& a) override {
    if (memory_.Refuse("LazyObserve (reads host lengths)")) return;
    const Timed timed(this, "lazy_observe");
    const int rows = a.n_layers * a.n_kv_heads;
    if (rows <= 0) return;
    const int max_len = *std::max_element(a.lens, a.lens + rows);
    if (rows <= kLazyObserveInlineRows) {  // the lengths travel with the launch
      LaunchLazyObserveInline(a, max_len, s());
      Launched("lazy_observe");
      return;
    }
    // Both length arrays in one small copy.
    lens_.assign(a.old_lens, a.old_lens + rows);
    lens_.insert(lens_.end(), a.lens, a.lens + rows);
    if (!Grow(lens_device_, lens_.size() * sizeof(int32_t)).ok()) {
      memory_.Check(cudaErrorMemoryAllocation, "lazy observe lengths");
      return;
    }
    memory_.CopyIn(lens_device_.get(), lens_.data(), lens_.size() * sizeof(int32_t));
    const int32_t* d = lens_device_.as<int32_t>();
    LaunchLazyObserve(a, d, d + rows, max_len, s());
    Launched("lazy_observe");
  }

  void RerotateKeys(const RerotateArgs& a) override {
    if (memory_.Refuse("RerotateKeys (stages its rows)")) return;
    if (host_rerotate_) return RerotateOnHost(a);
    const Timed timed(this, "rerotate_keys");
    const PagedKvLayout& l = a.kv.layout;
    rerotate_.clear();
    for (int r = 0; r < l.n_layers * l.n_kv_heads; ++r) {
      const PagedKvHead head = a.kv.Head(r / l.n_kv_heads, r % l.n_kv_heads);
      for (int s = 0; s < a.lens[r]; ++s) {
        const int32_t from = a.from[r * a.stride + s], to = a.to[r * a.stride + s];
        if (from == to) continue;
        const uint8_t* base = static_cast<const uint8_t*>(a.kv.pool);
        rerotate_.push_back({head.RowData(0, s) - base,
                             reinterpret_cast<const uint8_t*>(head.RowScale(0, s)) - base, from,
                             to});
      }
    }
    if (rerotate_.empty()) return;
    const size_t bytes = rerotate_.size() * sizeof(RerotateRow);
    if (!Grow(rerotate_device_, bytes).ok()) {
      memory_.Check(cudaErrorMemoryAllocation, "rerotate rows");
      return;
    }
    memory_.CopyIn(rerotate_device_.get(), rerotate_.data(), bytes);
    LaunchRerotateKeys(static_cast<uint8_t*>(a.kv.pool), rerotate_device_.as<RerotateRow>(),
                       static_cast<int>(rerotate_.size()), l.head_dim, a.theta, a.style, l.dtype,
                       s());
    Launched("rerotate_keys");
  }

  // RerotateKeys by the host reference, one key row at a time (the fallback).
  void RerotateOnHost(const RerotateArgs& a) {
    const PagedKvLayout& l = a.kv.layout;
    std::vector<float> row(static_cast<size_t>(l.head_dim));
    std::vector<uint8_t> bytes(static_cast<size_t>(l.RowBytes()));
    for (int r = 0; r < l.n_layers * l.n_kv_heads; ++r) {
      const PagedKvHead head = a.kv.Head(r / l.n_kv_heads, r % l.n_kv_heads);
      for (int s = 0; s < a.lens[r]; ++s) {
        const int32_t from = a.from[r * a.stride + s], to = a.to[r * a.stride + s];
        if (from == to) continue;
        float scale = 1.0f;
        memory_.CopyOut(bytes.data(), head.RowData(0, s), bytes.size());
        if (l.dtype == KvDType::kInt8) memory_.CopyOut(&scale, head.RowScale(0, s), sizeof scale);
        DecodeKvRow(l.dtype, bytes.data(), scale, l.head_dim, row.data());
        cpu::RerotateRow(row.data(), l.head_dim, from, to, a.theta, a.style);
        EncodeKvRow(l.dtype, row.data(), l.head_dim, bytes.data(), &scale);
        memory_.CopyIn(head.RowData(0, s), bytes.data(), bytes.size());
        if (l.dtype == KvDType::kInt8) memory_.CopyIn(head.RowScale(0, s), &scale, sizeof scale);
      }
    }
  }

  void LazyEvict(const LazyEvictArgs& a) override {
    if (a.n_rows <= 0 || memory_.Refuse("LazyEvict (stages its rows)")) return;
    if (host_evict_) return EvictOnHost(a);
    const Timed timed(this, "lazy_evict");
    // One copy: the rows, then the block tables of their layers (rows ascend, so a layer's
    // rows are adjacent).
    static_assert(sizeof(LazyEvictRow) == 5 * sizeof(int32_t), "LazyEvictRow is 5 int32");
    const int n_kv = a.kv.layout.n_kv_heads;
    evict_.assign(static_cast<size_t>(a.n_rows) * 5, 0);
    int last_layer = -1, table_begin = 0;
    for (int i = 0; i < a.n_rows; ++i) {
      const int layer = a.rows[i] / n_kv;
      if (layer != last_layer) {
        table_begin = static_cast<int>(evict_.size()) - a.n_rows * 5;
        evict_.insert(evict_.end(), a.kv.block_tables[layer],
                      a.kv.block_tables[layer] + a.kv.block_counts[layer]);
        last_layer = layer;
      }
      int32_t* r = evict_.data() + static_cast<size_t>(i) * 5;
      r[0] = a.rows[i];
      r[1] = a.rows[i] % n_kv;
      r[2] = a.lens[i];
      r[3] = a.keeps[i];
      r[4] = table_begin;
    }
    if (!Grow(evict_device_, evict_.size() * sizeof(int32_t)).ok()) {
      memory_.Check(cudaErrorMemoryAllocation, "lazy evict rows");
      return;
    }
    memory_.CopyIn(evict_device_.get(), evict_.data(), evict_.size() * sizeof(int32_t));
    const int32_t* d = evict_device_.as<int32_t>();
    LaunchLazyEvict(a, reinterpret_cast<const LazyEvictRow*>(d), d + a.n_rows * 5, s());
    Launched("lazy_evict");
  }

  void ArgmaxRows(const float* x, int rows, int cols, int32_t* out) override {
    if (memory_.Refuse("ArgmaxRows")) return;
    if (host_picks_) return PickOnHost(x, rows, cols, nullptr, nullptr, out);
    const Timed timed(this, "argmax_rows");
    LaunchArgmaxRows(x, rows, cols, out, s());
    Launched("argmax_rows");
  }

  void SampleRows(const float* x, int rows, int cols, const SamplingParams* params,
                  const float* draws, int32_t* out) override {
    if (rows <= 0 || memory_.Refuse("SampleRows (per-step draws)")) return;
    if (host_picks_) return PickOnHost(x, rows, cols, params, draws, out);
    bool greedy = true;
    for (int r = 0; r < rows; ++r) greedy &= !(params[r].temperature > 0.0f);
    if (greedy) return ArgmaxRows(x, rows, cols, out);
    const Timed timed(this, "sample_rows");
    picks_.resize(static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r) {
      picks_[r].temperature = params[r].temperature;
      picks_[r].top_k = params[r].top_k;
      picks_[r].top_p = params[r].top_p;
      picks_[r].draw = draws[r];
    }
    if (rows <= kSampleRowsInlineRows) {  // the picks travel with the launch
      LaunchSampleRowsInline(x, rows, cols, picks_.data(), out, s());
      Launched("sample_rows");
      return;
    }
    if (!Grow(picks_device_, picks_.size() * sizeof(RowPick)).ok()) {
      memory_.Check(cudaErrorMemoryAllocation, "sample rows parameters");
      return;
    }
    memory_.CopyIn(picks_device_.get(), picks_.data(), picks_.size() * sizeof(RowPick));
    LaunchSampleRows(x, rows, cols, static_cast<const RowPick*>(picks_device_.get()), out, s());
    Launched("sample_rows");
  }

  int32_t Sample(float* logits, int vocab, const SamplingParams& params, Rng& rng,
                 const int32_t* history, int n_history) override {
    return sampler_.Sample(logits, vocab, params, rng, history, n_history);
  }

 private:
  // Times the op it spans when CudaBackendOptions::time_ops (a no-op otherwise).
  class Timed {
   public:
    Timed(CudaBackend* b, std::string key) : b_(b), key_(std::move(key)) {
      if (b_->timer_ != nullptr) b_->timer_->Begin(b_->s());
    }
    ~Timed() {
      if (b_->timer_ != nullptr) b_->timer_->End(key_, b_->s());
    }

   private:
    CudaBackend* b_;
    std::string key_;
  };

  // ArgmaxRows (params null) or SampleRows by the host reference, on the rows copied back.
  void PickOnHost(const float* x, int rows, int cols, const SamplingParams* params,
                  const float* draws, int32_t* out) {
    const Timed timed(this, "picks_on_host");
    if (rows <= 0 || cols <= 0) return;
    host_rows_.resize(static_cast<size_t>(rows) * cols);
    host_picked_.resize(static_cast<size_t>(rows));
    memory_.CopyOut(host_rows_.data(), x, host_rows_.size() * sizeof(float));
    if (params == nullptr) {
      for (int r = 0; r < rows; ++r) {
        host_picked_[r] = cpu::ArgMax(host_rows_.data() + static_cast<size_t>(r) * cols, cols);
      }
    } else {
      Backend::SampleRows(host_rows_.data(), rows, cols, params, draws, host_picked_.data());
    }
    memory_.CopyIn(out, host_picked_.data(), host_picked_.size() * sizeof(int32_t));
  }

  // LazyEvict by the host reference: each row's state is copied back, its keep list chosen
  // on the host, and its K/V rows moved by CompactRows.
  void EvictOnHost(const LazyEvictArgs& a) {
    const Timed timed(this, "lazy_evict_on_host");
    const int n_kv = a.kv.layout.n_kv_heads;
    for (int i = 0; i < a.n_rows; ++i) {
      const int r = a.rows[i], len = a.lens[i], keep = a.keeps[i];
      int32_t* ts = a.ts + r * a.state_stride;
      int32_t* mri = a.mri + r * a.state_stride;
      host_ts_.resize(static_cast<size_t>(len));
      host_mri_.resize(static_cast<size_t>(len));
      host_keep_.resize(static_cast<size_t>(keep));
      memory_.CopyOut(host_ts_.data(), ts, len * sizeof(int32_t));
      memory_.CopyOut(host_mri_.data(), mri, len * sizeof(int32_t));
      cpu::LazyKeepList(host_ts_.data(), host_mri_.data(), len, keep, a.window, a.t,
                        &keep_scratch_, host_keep_.data());
      memory_.CompactRows(a.kv.Head(r / n_kv, r % n_kv), host_keep_.data(), keep);
      cpu::CompactInts(host_ts_.data(), host_keep_.data(), keep);
      cpu::CompactInts(host_mri_.data(), host_keep_.data(), keep);
      memory_.CopyIn(ts, host_ts_.data(), keep * sizeof(int32_t));
      memory_.CopyIn(mri, host_mri_.data(), keep * sizeof(int32_t));
      memory_.CopyIn(a.keep_out + i * a.keep_stride, host_keep_.data(), keep * sizeof(int32_t));
    }
  }

  cudaStream_t s() const { return stream_.get(); }
  void Launched(const char* what) { memory_.Check(cudaGetLastError(), what); }
  // The FP8 kernels read one scale per 8-column chunk: blocks of any other width (0 would
  // divide by zero on the device) fail the backend instead of multiplying with wrong scales.
  // Every loader makes blocks of a multiple of 8 (Matrix::scale_block, kernels/tensor.h).
  bool RefusedScaleBlock(const Matrix& w) {
    if (w.dtype != DType::kF8E4M3 || (w.scale_block > 0 && w.scale_block % 8 == 0)) return false;
    memory_.Check(cudaErrorInvalidValue,
                  absl::StrCat("matmul: FP8 scale blocks of ", w.scale_block,
                               " columns (the kernels need a positive multiple of 8)")
                      .c_str());
    return true;
  }

  absl::Status Grow(recall::cuda::DeviceBuffer& buffer, size_t bytes) {
    if (buffer.bytes() >= bytes) return absl::OkStatus();
    buffer = recall::cuda::DeviceBuffer();
    RECALL_ASSIGN_OR_RETURN(buffer, recall::cuda::DeviceBuffer::Allocate(bytes));
    return absl::OkStatus();
  }
  absl::Status GrowRounding(int64_t elements) {
    return Grow(rounded_, static_cast<size_t>(std::max<int64_t>(elements, 1)) * 2);
  }
  absl::Status GrowAttention(int tokens, int heads, int head_dim) {
    const int64_t partials = AttentionPartialFloats(tokens, heads, head_dim, sm_count_);
    const int64_t stats = static_cast<int64_t>(tokens) * heads * 2;
    if (partials <= attn_partial_floats_ && stats <= attn_stat_floats_) return absl::OkStatus();
    if (memory_.Refuse("attention scratch growth")) {
      return absl::FailedPreconditionError("attention scratch cannot grow while recording");
    }
    ++workspace_moves_;          // graphs recorded before point at the old buffers
    cudaStreamSynchronize(s());  // the old buffers may still be read
    const int64_t p = std::max(partials, attn_partial_floats_);
    const int64_t st = std::max(stats, attn_stat_floats_);
    absl::Status status = Grow(attn_partials_, static_cast<size_t>(p) * sizeof(float));
    if (status.ok()) status = Grow(attn_stats_, static_cast<size_t>(st) * sizeof(float));
    if (!status.ok()) {
      memory_.Check(cudaErrorMemoryAllocation, "attention scratch");
      attn_partial_floats_ = attn_stat_floats_ = 0;
      return status;
    }
    attn_partial_floats_ = p;
    attn_stat_floats_ = st;
    return absl::OkStatus();
  }

  // starts_[h] = kv_lens[h] - n (slots before the new tokens).
  void StageStarts(const PagedKv& kv, const int32_t* kv_lens, int n) {
    starts_.resize(static_cast<size_t>(kv.layout.n_kv_heads));
    for (int h = 0; h < kv.layout.n_kv_heads; ++h) starts_[h] = kv_lens[h] - n;
  }

  // A one-item, one-layer KvBatch over layer `layer` of `kv` (host tables), in device memory.
  KvBatch StageOne(const PagedKv& kv, int layer, const int32_t* start_slots, int n, float* probs,
                   int64_t probs_stride) {
    const int n_kv = kv.layout.n_kv_heads;
    const int count = kv.block_counts[layer];
    // [token_begin 2 | token_item n | kv_start n_kv | table_begin 1 | table_count 1 | tables]
    one_.assign(static_cast<size_t>(2 + n + n_kv + 2 + count), 0);
    one_[1] = n;
    int max_len = 0;
    for (int h = 0; h < n_kv; ++h) {
      one_[2 + n + h] = start_slots[h];
      max_len = std::max(max_len, start_slots[h] + n);
    }
    one_[2 + n + n_kv + 1] = count;
    std::copy_n(kv.block_tables[layer], count, one_.begin() + 2 + n + n_kv + 2);
    const size_t bytes = one_.size() * sizeof(int32_t) + 2 * sizeof(int64_t);
    if (!Grow(one_device_, bytes + 64).ok()) memory_.Check(cudaErrorMemoryAllocation, "staging");
    char* d = static_cast<char*>(one_device_.get());
    int64_t tail[2] = {reinterpret_cast<int64_t>(probs), probs_stride};
    memory_.CopyIn(d, tail, sizeof(tail));
    memory_.CopyIn(d + sizeof(tail), one_.data(), one_.size() * sizeof(int32_t));
    const int32_t* m = reinterpret_cast<const int32_t*>(d + sizeof(tail));
    KvBatch b;
    b.layout = kv.layout;
    b.layout.n_layers = 1;
    b.pool = kv.pool;
    b.n_items = 1;
    b.total_tokens = n;
    b.max_new_tokens = n;
    b.max_kv_len = max_len;
    b.token_begin = m;
    b.token_item = m + 2;
    b.kv_start = m + 2 + n;
    b.table_begin = m + 2 + n + n_kv;
    b.table_count = m + 2 + n + n_kv + 1;
    b.tables = m + 2 + n + n_kv + 2;
    if (probs != nullptr) {
      b.probs = reinterpret_cast<float* const*>(d);
      b.probs_stride = reinterpret_cast<const int64_t*>(d) + 1;
    }
    return b;
  }

  friend class CudaOpGraph;

  int device_;
  recall::cuda::Stream stream_;
  cublasHandle_t blas_;
  std::unique_ptr<Fp8Gemm>
      fp8_gemm_;  // null: no cuBLASLt FP8 here, or CudaBackendOptions::no_fp8_gemm
  int sm_count_;
  CudaMemory memory_;
  cpu::Sampler sampler_;
  std::vector<RowPick> picks_;                // SampleRows' rows, staged
  recall::cuda::DeviceBuffer picks_device_;
  bool host_picks_;                           // CudaBackendOptions::host_picks
  std::vector<float> host_rows_;              // PickOnHost's rows and picks
  std::vector<int32_t> host_picked_;
  recall::cuda::DeviceBuffer rounded_;  // MatMul's input rounded to the weights' type
  recall::cuda::DeviceBuffer attn_partials_, attn_stats_;
  int64_t attn_partial_floats_ = 0, attn_stat_floats_ = 0;
  std::vector<int32_t> starts_, one_;
  recall::cuda::DeviceBuffer one_device_;
  std::vector<int32_t> lens_;  // LazyObserve's lengths, staged
  recall::cuda::DeviceBuffer lens_device_;
  std::vector<int32_t> evict_;  // LazyEvict's rows and block tables, staged
  std::vector<RerotateRow> rerotate_;  // RerotateKeys' rows, staged
  recall::cuda::DeviceBuffer evict_device_;
  recall::cuda::DeviceBuffer rerotate_device_;
  bool host_evict_;      // CudaBackendOptions::host_evict
  bool cublas_matmuls_;  // CudaBackendOptions::cublas_matmuls
  bool int8_weights_;    // !CudaBackendOptions::refuse_int8_weights
  bool fp8_weights_;     // !CudaBackendOptions::refuse_fp8_weights
  bool host_rerotate_;   // CudaBackendOptions::host_rerotate
  int chunks_in_flight_;  // CudaBackendOptions::skinny_chunks_in_flight
  std::vector<int32_t> host_ts_, host_mri_, host_keep_;  // EvictOnHost's row
  cpu::LazyKeepScratch keep_scratch_;
  std::unique_ptr<OpTimer> timer_;  // CudaBackendOptions::time_ops
  int64_t workspace_moves_ = 0;     // times a workspace graphs read was reallocated
};

// One recorded CUDA graph of a CudaBackend, replayed on its stream.
class CudaOpGraph final : public OpGraph {
 public:
  CudaOpGraph(CudaBackend* backend, recall::cuda::GraphExec exec)
      : backend_(backend), exec_(std::move(exec)), moves_(backend->workspace_moves_) {}

  absl::Status Replay() override {
    if (backend_->workspace_moves_ != moves_) {
      return absl::FailedPreconditionError(
          "cuda graph: stale (a workspace it uses was reallocated); record it again");
    }
    const cudaError_t err = cudaGraphLaunch(exec_.get(), backend_->s());
    backend_->memory_.Check(err, "cudaGraphLaunch");
    return recall::cuda::CudaStatus(err, "cudaGraphLaunch");
  }

 private:
  CudaBackend* backend_;
  recall::cuda::GraphExec exec_;
  int64_t moves_;
};

absl::StatusOr<std::unique_ptr<OpGraph>> CudaBackend::Record(absl::FunctionRef<void()> ops) {
  if (!CanRecord()) return std::unique_ptr<OpGraph>();
  RECALL_RETURN_IF_ERROR(memory_.status());
  // Thread-local: other threads (other ranks, other backends) may allocate meanwhile.
  RECALL_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(s(), cudaStreamCaptureModeThreadLocal));
  memory_.BeginRecording();
  ops();
  const char* refused = memory_.EndRecording();
  cudaGraph_t captured = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(s(), &captured);
  const recall::cuda::Graph graph(captured);
  const absl::Status launch = memory_.TakeRecordingError();  // a launch failed while recording
  if (ended != cudaSuccess || !launch.ok()) {
    cudaGetLastError();  // a capture that went wrong is not a sticky error
    return !launch.ok() ? launch : recall::cuda::CudaStatus(ended, "cudaStreamEndCapture");
  }
  if (refused != nullptr) {
    RECALL_LOG(DEBUG) << "cuda graph: not recorded: " << refused << " cannot be captured";
    return std::unique_ptr<OpGraph>();
  }
  RECALL_ASSIGN_OR_RETURN(recall::cuda::GraphExec exec,
                          recall::cuda::GraphExec::Instantiate(graph.get()));
  return std::unique_ptr<OpGraph>(new CudaOpGraph(this, std::move(exec)));
}

void CudaBackend::MatMul(const float* x, int n, const Matrix& w, float* y) {
  if (n <= 0 || RefusedScaleBlock(w)) return;
  const Timed timed(this, timer_ == nullptr ? std::string()
                                            : absl::StrCat("matmul ", DTypeName(w.dtype), " ",
                                                           w.rows, "x", w.cols, " n", n));
  // FP8 weights over many rows: cuBLASLt's FP8 GEMM (x quantized too) for the rows it takes.
  if (w.dtype == DType::kF8E4M3 && n > kSkinnyRows && fp8_gemm_ != nullptr &&
      Fp8Gemm::Takes(w, x, y)) {
    if (memory_.Refuse("cuBLASLt FP8 matmul (may allocate)")) return;
    const int m = Fp8Gemm::GemmRows(n);
    const absl::Status ran = fp8_gemm_->Run(x, m, w, y);
    if (ran.ok()) {
      if (m == n) return;
      x += static_cast<int64_t>(m) * w.cols, y += static_cast<int64_t>(m) * w.rows, n -= m;
    } else if (!absl::IsUnavailable(ran)) {
      memory_.Check(cudaErrorUnknown, std::string(ran.message()).c_str());
      return;
    }  // else: not taken (no algorithm for the shape, no scratch); our kernel takes every row
  }
  // Int8 and FP8 weights otherwise take our kernel (cuBLAS has no int8-weight, fp32-input
  // GEMM).
  if (w.dtype == DType::kI8 || w.dtype == DType::kF8E4M3 ||
      (!cublas_matmuls_ && n <= kSkinnyRows)) {
    LaunchSkinnyMatMul(x, n, &w, &y, 1, chunks_in_flight_, s());
    Launched("matmul (skinny)");
    return;
  }
  if (memory_.Refuse("cuBLAS matmul (may allocate)")) return;
  const float one = 1.0f, zero = 0.0f;
  const int rows = static_cast<int>(w.rows), cols = static_cast<int>(w.cols);
  cublasStatus_t st;
  if (w.dtype == DType::kF32) {
    // y^T [rows, n] = W [rows, cols] (row-major, i.e. column-major W^T) x x^T.
    st = cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, w.f32(), cols, x, cols,
                     &zero, y, rows);
  } else {
    if (!GrowRounding(static_cast<int64_t>(n) * cols).ok()) {
      memory_.Check(cudaErrorMemoryAllocation, "matmul input rounding buffer");
      return;
    }
    LaunchRoundTo(x, static_cast<int64_t>(n) * cols, w.dtype, rounded_.get(), s());
    Launched("round_to");
    const cudaDataType_t type = w.dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_16F;
    st = cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, w.data, type, cols,
                      rounded_.get(), type, cols, &zero, y, CUDA_R_32F, rows, CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT);
  }
  if (st != CUBLAS_STATUS_SUCCESS) {
    memory_.Check(cudaErrorUnknown, absl::StrCat("cublas matmul: ", cublasGetStatusString(st),
                                                 " (", rows, "x", cols, ", n ", n, ")")
                                        .c_str());
  }
}

}  // namespace
}  // namespace cuda

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

absl::StatusOr<int64_t> CudaFreeMemory(int device) {
  const int count = CudaDeviceCount();
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("device cuda: device ", device, " does not exist (", count, " visible)"));
  }
  RECALL_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  size_t free_bytes = 0, total_bytes = 0;
  RECALL_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<int64_t>(free_bytes);
}

void* CudaStreamOf(Backend& backend) {
  auto* memory = dynamic_cast<cuda::CudaMemory*>(&backend.memory());
  return memory == nullptr ? nullptr : static_cast<void*>(memory->stream());
}

std::string CudaOpTimes(Backend& backend, bool reset) {
  auto* cuda = dynamic_cast<cuda::CudaBackend*>(&backend);
  return cuda == nullptr ? "" : cuda->OpTimes(reset);
}

absl::Status CudaBindThread(int device) {
  return recall::cuda::CudaStatus(cudaSetDevice(device), "cudaSetDevice");
}

bool CudaPicksOnHost(Backend& backend) {
  auto* cuda = dynamic_cast<cuda::CudaBackend*>(&backend);
  return cuda != nullptr && cuda->picks_on_host();
}

bool CudaRerotatesOnHost(Backend& backend) {
  auto* cuda = dynamic_cast<cuda::CudaBackend*>(&backend);
  return cuda != nullptr && cuda->rerotates_on_host();
}

bool CudaEvictsOnHost(Backend& backend) {
  auto* cuda = dynamic_cast<cuda::CudaBackend*>(&backend);
  return cuda != nullptr && cuda->evicts_on_host();
}

bool CudaMatMulsOnCublas(Backend& backend) {
  auto* cuda = dynamic_cast<cuda::CudaBackend*>(&backend);
  return cuda != nullptr && cuda->matmuls_on_cublas();
}

bool CudaFp8OnCublasLt(Backend& backend) {
  auto* cuda = dynamic_cast<cuda::CudaBackend*>(&backend);
  return cuda != nullptr && cuda->fp8_on_cublaslt();
}

namespace {

absl::StatusOr<std::unique_ptr<Backend>> Build(const CudaBackendOptions& options) {
  RECALL_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));
  cudaDeviceProp prop;
  RECALL_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, options.device));
  RECALL_ASSIGN_OR_RETURN(recall::cuda::Stream stream, recall::cuda::Stream::Create());
  cublasHandle_t blas = nullptr;
  if (const cublasStatus_t st = cublasCreate(&blas); st != CUBLAS_STATUS_SUCCESS) {
    return absl::InternalError(
        absl::StrCat("device cuda: cublasCreate failed: ", cublasGetStatusString(st)));
  }
  cublasSetStream(blas, stream.get());
  cublasSetMathMode(blas, CUBLAS_DEFAULT_MATH);  // fp32 stays fp32 (no TF32)
  std::unique_ptr<cuda::Fp8Gemm> fp8_gemm;
  if (!options.no_fp8_gemm) {
    absl::StatusOr<std::unique_ptr<cuda::Fp8Gemm>> made =
        cuda::Fp8Gemm::Create(options.device, stream.get());
    if (!made.ok()) {
      cublasDestroy(blas);
      return made.status();
    }
    fp8_gemm = *std::move(made);
  }
  return std::unique_ptr<Backend>(new cuda::CudaBackend(options.device, std::move(stream), blas,
                                                        std::move(fp8_gemm),
                                                        prop.multiProcessorCount, options));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const CudaBackendOptions& options) {
  const int count = CudaDeviceCount();
  if (count == 0) {
    return absl::FailedPreconditionError("device cuda: no CUDA device is visible to this process");
  }
  if (options.device < 0 || options.device >= count) {
    return absl::FailedPreconditionError(absl::StrCat("device cuda: device ", options.device,
                                                      " does not exist (", count, " visible)"));
  }
  if (!cuda::ValidChunksInFlight(options.skinny_chunks_in_flight)) {
    return absl::InvalidArgumentError(
        absl::StrCat("device cuda: skinny_chunks_in_flight is ", options.skinny_chunks_in_flight,
                     "; it takes 0 (the default for the weights' type), 1, 2 or 4"));
  }
  RECALL_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, Build(options));
  // The device's picks and eviction kernels against the host reference; a kernel that fails
  // its check is replaced by the host path (a backend whose op failed keeps the error in
  // Health, so each fallback starts a fresh backend).
  struct Fallback {
    absl::Status (*check)(Backend&);
    bool CudaBackendOptions::*on_host;
    const char* what;
  };
  static constexpr Fallback kFallbacks[] = {
      {CheckMatMul, &CudaBackendOptions::cublas_matmuls,
       "batch-invariant matmul or fused ops failed their check, so every matmul goes through "
       "cuBLAS, one row per call where the worker asks for batch invariance"},
      {CheckPicks, &CudaBackendOptions::host_picks,
       "token picks failed their check, so tokens are picked on the host (the logits are "
       "copied back)"},
      {CheckLazyEvict, &CudaBackendOptions::host_evict,
       "LazyEviction step failed its check, so eviction steps select on the host (the state "
       "is copied back)"},
      {CheckRerotate, &CudaBackendOptions::host_rerotate,
       "key re-rotation failed its check, so keys are moved to new positions on the host "
       "(each key row is copied back)"},
      {CheckInt8MatMul, &CudaBackendOptions::refuse_int8_weights,
       "int8 matmul or embedding failed its check, so int8 weights are refused on it"},
      {CheckFp8MatMul, &CudaBackendOptions::refuse_fp8_weights,
       "FP8 matmul failed its check, so FP8 weights are refused on it (load the checkpoint "
       "with weight_dtype auto: widened to bf16)"},
      {CheckFp8ManyRows, &CudaBackendOptions::no_fp8_gemm,
       "cuBLASLt FP8 GEMM failed its check, so FP8 matmuls of many rows stay on the "
       "batch-invariant kernel"},
  };
  CudaBackendOptions fixed = options;
  for (const Fallback& f : kFallbacks) {
    if (fixed.*f.on_host) continue;
    const absl::Status check = f.check(*backend);
    if (check.ok()) continue;
    RECALL_LOG(WARNING) << "device cuda " << options.device << ": the device's " << f.what
                        << ": " << check;
    fixed.*f.on_host = true;
    backend.reset();
    RECALL_ASSIGN_OR_RETURN(backend, Build(fixed));
  }
  return backend;
}

}  // namespace recall::kernels
