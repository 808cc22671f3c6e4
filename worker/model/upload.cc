#include "worker/model/upload.h"

#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/model/half.h"

namespace recall::model {
namespace {

class BufferStorage final : public Storage {
 public:
  explicit BufferStorage(kernels::Buffer buffer) : buffer_(std::move(buffer)) {}
  const void* data() const override { return buffer_.get(); }
  size_t size() const override { return buffer_.bytes(); }

 private:
  kernels::Buffer buffer_;
};

class Uploader {
 public:
  Uploader(kernels::Memory& memory, Model& out) : memory_(memory), out_(out) {}

  // A device copy of `m` (the same copy for the same host data and dtype).
  absl::StatusOr<kernels::Matrix> Copy(const kernels::Matrix& m, bool to_bf16, const char* name) {
    if (m.empty()) return m;
    const bool convert = to_bf16 && m.dtype == kernels::DType::kF32;
    const auto key = std::make_pair(m.data, convert);
    if (auto it = done_.find(key); it != done_.end()) return it->second;
    kernels::Matrix d = m;
    const void* src = m.data;
    if (convert) {
      staging_.resize(static_cast<size_t>(m.numel()));
      const float* f = m.f32();
      for (int64_t i = 0; i < m.numel(); ++i) staging_[static_cast<size_t>(i)] = F32ToBf16(f[i]);
      src = staging_.data();
      d.dtype = kernels::DType::kBF16;
    }
    // Int8: the scales and the row sums follow the integers in the same buffer; FP8: the
    // scales follow the bytes.
    const bool int8 = d.dtype == kernels::DType::kI8;
    const bool fp8 = d.dtype == kernels::DType::kF8E4M3;
    const size_t scales_at = (d.bytes() + 63) / 64 * 64;
    const size_t total = int8 || fp8 ? scales_at + d.scale_bytes() : d.bytes();
    absl::StatusOr<kernels::Buffer> buffer = kernels::Buffer::Allocate(memory_, total);
    if (!buffer.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat("uploading the model's ", name, " (", total,
                                                       " bytes): ", buffer.status().message()));
    }
    memory_.CopyIn(buffer->get(), src, d.bytes());
    d.data = buffer->get();
    if (int8) {
      char* base = static_cast<char*>(buffer->get());
      const size_t scale_bytes = static_cast<size_t>(d.rows) * sizeof(float);
      memory_.CopyIn(base + scales_at, m.scales, scale_bytes);
      memory_.CopyIn(base + scales_at + scale_bytes, m.row_sums,
                     static_cast<size_t>(d.rows) * sizeof(int32_t));
      d.scales = reinterpret_cast<const float*>(base + scales_at);
      d.row_sums = reinterpret_cast<const int32_t*>(base + scales_at + scale_bytes);
    }
    if (fp8) {
      char* base = static_cast<char*>(buffer->get());
      memory_.CopyIn(base + scales_at, m.scales, d.scale_bytes());
      d.scales = reinterpret_cast<const float*>(base + scales_at);
    }
    out_.storage.push_back(std::make_unique<BufferStorage>(std::move(*buffer)));
    done_.emplace(key, d);
    return d;
  }

 private:
  kernels::Memory& memory_;
  Model& out_;
  std::map<std::pair<const void*, bool>, kernels::Matrix> done_;
  std::vector<uint16_t> staging_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> UploadModel(const Model& host, kernels::Memory& memory,
                                                   const UploadOptions& options) {
  auto out = std::make_unique<Model>();
  out->config = host.config;
  out->source = host.source;
  Uploader up(memory, *out);
  const bool b = options.f32_to_bf16;
  RECALL_ASSIGN_OR_RETURN(out->tok_embeddings, up.Copy(host.tok_embeddings, b, "embeddings"));
  RECALL_ASSIGN_OR_RETURN(out->final_norm, up.Copy(host.final_norm, false, "final norm"));
  RECALL_ASSIGN_OR_RETURN(out->lm_head, up.Copy(host.lm_head, b, "lm head"));
  out->layers.resize(host.layers.size());
  for (size_t l = 0; l < host.layers.size(); ++l) {
    const LayerWeights& h = host.layers[l];
    LayerWeights& d = out->layers[l];
    RECALL_ASSIGN_OR_RETURN(d.attn_norm, up.Copy(h.attn_norm, false, "attention norm"));
    RECALL_ASSIGN_OR_RETURN(d.wq, up.Copy(h.wq, b, "wq"));
    RECALL_ASSIGN_OR_RETURN(d.wk, up.Copy(h.wk, b, "wk"));
    RECALL_ASSIGN_OR_RETURN(d.wv, up.Copy(h.wv, b, "wv"));
    RECALL_ASSIGN_OR_RETURN(d.wo, up.Copy(h.wo, b, "wo"));
    RECALL_ASSIGN_OR_RETURN(d.bq, up.Copy(h.bq, false, "bq"));
    RECALL_ASSIGN_OR_RETURN(d.bk, up.Copy(h.bk, false, "bk"));
    RECALL_ASSIGN_OR_RETURN(d.bv, up.Copy(h.bv, false, "bv"));
    RECALL_ASSIGN_OR_RETURN(d.q_norm, up.Copy(h.q_norm, false, "q norm"));
    RECALL_ASSIGN_OR_RETURN(d.k_norm, up.Copy(h.k_norm, false, "k norm"));
    RECALL_ASSIGN_OR_RETURN(d.ffn_norm, up.Copy(h.ffn_norm, false, "ffn norm"));
    RECALL_ASSIGN_OR_RETURN(d.w_gate, up.Copy(h.w_gate, b, "w_gate"));
    RECALL_ASSIGN_OR_RETURN(d.w_up, up.Copy(h.w_up, b, "w_up"));
    RECALL_ASSIGN_OR_RETURN(d.w_down, up.Copy(h.w_down, b, "w_down"));
  }
  return out;
}

int64_t WeightBytes(const Model& model) {
  int64_t total = 0;
  for (const auto& s : model.storage) total += static_cast<int64_t>(s->size());
  return total;
}

}  // namespace recall::model
