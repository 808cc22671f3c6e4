#include "worker/model/quantize.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/status.h"
#include "kernels/cpu/int8.h"
#include "kernels/fp8.h"
#include "kernels/half.h"
#include "worker/model/file_storage.h"

namespace recall::model {
namespace {

// A matrix's bytes before quantization.
struct Range {
  const char* begin;
  size_t bytes;
  bool Overlaps(const kernels::Matrix& m) const {
    if (m.empty() || m.data == nullptr) return false;
    const char* b = static_cast<const char*>(m.data);
    return b < begin + bytes && begin < b + m.bytes();
  }
};

absl::Status Quantize(Model& model, kernels::Matrix& m, std::vector<Range>& originals) {
  if (m.empty() || m.dtype == kernels::DType::kI8) return absl::OkStatus();
  originals.push_back({static_cast<const char*>(m.data), m.bytes()});
  const size_t q_bytes = static_cast<size_t>(m.numel());
  const size_t scale_offset = (q_bytes + 63) / 64 * 64;
  const size_t rows = static_cast<size_t>(m.rows);
  RECALL_ASSIGN_OR_RETURN(
      std::unique_ptr<HeapStorage> s,
      HeapStorage::Create(scale_offset + rows * (sizeof(float) + sizeof(int32_t))));
  auto* q = static_cast<int8_t*>(s->MutableData());
  auto* scales = reinterpret_cast<float*>(static_cast<char*>(s->MutableData()) + scale_offset);
  auto* sums = reinterpret_cast<int32_t*>(scales + rows);
  std::vector<float> row(static_cast<size_t>(m.cols));
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t c = 0; c < m.cols; ++c) {
      row[static_cast<size_t>(c)] = kernels::LoadAsF32(m.data, m.dtype, r * m.cols + c);
    }
    kernels::cpu::QuantizeRowsInt8(row.data(), 1, m.cols, q + r * m.cols, scales + r, sums + r);
  }
  m.data = q;
  m.scales = scales;
  m.row_sums = sums;
  m.dtype = kernels::DType::kI8;
  model.storage.push_back(std::move(s));
  return absl::OkStatus();
}

// m as E4M3 with one scale per row and block of kFp8Block columns.
absl::Status QuantizeFp8(Model& model, kernels::Matrix& m, std::vector<Range>& originals) {
  if (m.empty() || m.dtype == kernels::DType::kF8E4M3) return absl::OkStatus();
  if (m.dtype == kernels::DType::kI8) {
    return absl::FailedPreconditionError("FP8 from int8 weights: quantize from the loaded type");
  }
  originals.push_back({static_cast<const char*>(m.data), m.bytes()});
  kernels::Matrix out{nullptr, kernels::DType::kF8E4M3, m.rows, m.cols};
  out.scale_block = kFp8Block;
  const int64_t per_row = out.ScaleColumns();
  const size_t scale_offset = (static_cast<size_t>(m.numel()) + 63) / 64 * 64;
  RECALL_ASSIGN_OR_RETURN(std::unique_ptr<HeapStorage> s,
                          HeapStorage::Create(scale_offset + out.scale_bytes()));
  auto* q = static_cast<uint8_t*>(s->MutableData());
  auto* scales = reinterpret_cast<float*>(static_cast<char*>(s->MutableData()) + scale_offset);
  std::vector<float> row(static_cast<size_t>(m.cols));
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t c = 0; c < m.cols; ++c) {
      row[static_cast<size_t>(c)] = kernels::LoadAsF32(m.data, m.dtype, r * m.cols + c);
    }
    for (int64_t b = 0; b < per_row; ++b) {
      const int64_t c0 = b * kFp8Block, c1 = std::min(m.cols, c0 + kFp8Block);
      float most = 0.0f;
      for (int64_t c = c0; c < c1; ++c) most = std::max(most, std::fabs(row[c]));
      const float scale = most > 0.0f ? most / 448.0f : 1.0f;
      scales[r * per_row + b] = scale;
      for (int64_t c = c0; c < c1; ++c) q[r * m.cols + c] = kernels::F32ToE4M3(row[c] / scale);
    }
  }
  out.data = q;
  out.scales = scales;
  m = out;
  model.storage.push_back(std::move(s));
  return absl::OkStatus();
}

// Gives back the memory of the quantized matrices' originals that no remaining view reads
// (a tied table quantized one way only stays for the other).
void DiscardOriginals(Model& model, const std::vector<Range>& originals) {
  std::vector<const kernels::Matrix*> kept = {&model.tok_embeddings, &model.lm_head,
                                              &model.final_norm};
  for (const LayerWeights& l : model.layers) {
    for (const kernels::Matrix* m :
         {&l.attn_norm, &l.bq, &l.bk, &l.bv, &l.q_norm, &l.k_norm, &l.ffn_norm}) {
      kept.push_back(m);
    }
  }
  for (const Range& r : originals) {
    if (std::any_of(kept.begin(), kept.end(), [&](const auto* m) { return r.Overlaps(*m); })) {
      continue;
    }
    for (const std::unique_ptr<Storage>& s : model.storage) {
      const char* b = static_cast<const char*>(s->data());
      if (b != nullptr && r.begin >= b && r.begin + r.bytes <= b + s->size()) {
        s->Discard(r.begin, r.bytes);
        break;
      }
    }
  }
}

}  // namespace

absl::Status QuantizeWeightsInt8(Model& model, const Int8Options& options) {
  std::vector<Range> originals;
  for (LayerWeights& l : model.layers) {
    for (kernels::Matrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      RECALL_RETURN_IF_ERROR(Quantize(model, *m, originals));
    }
  }
  const bool tied = model.lm_head.data == model.tok_embeddings.data;
  if (options.lm_head) RECALL_RETURN_IF_ERROR(Quantize(model, model.lm_head, originals));
  if (options.embeddings) {
    if (tied && options.lm_head) {
      model.tok_embeddings = model.lm_head;  // one int8 copy for both
    } else {
      RECALL_RETURN_IF_ERROR(Quantize(model, model.tok_embeddings, originals));
    }
  }
  DiscardOriginals(model, originals);
  model.config.weight_dtype = kernels::DType::kI8;
  return absl::OkStatus();
}

absl::Status QuantizeWeightsFp8(Model& model) {
  std::vector<Range> originals;
  for (LayerWeights& l : model.layers) {
    for (kernels::Matrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      RECALL_RETURN_IF_ERROR(QuantizeFp8(model, *m, originals));
    }
  }
  DiscardOriginals(model, originals);
  model.config.weight_dtype = kernels::DType::kF8E4M3;
  return absl::OkStatus();
}

}  // namespace recall::model
