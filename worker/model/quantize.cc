#include "worker/model/quantize.h"

#include <algorithm>
#include <vector>

#include "common/status.h"
#include "kernels/cpu/int8.h"
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

}  // namespace recall::model
