#include "worker/model/quantize.h"

#include <vector>

#include "common/status.h"
#include "kernels/cpu/int8.h"
#include "kernels/half.h"
#include "worker/model/file_storage.h"

namespace recall::model {
namespace {

absl::Status Quantize(Model& model, kernels::Matrix& m) {
  if (m.empty() || m.dtype == kernels::DType::kI8) return absl::OkStatus();
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

}  // namespace

absl::Status QuantizeWeightsInt8(Model& model) {
  for (LayerWeights& l : model.layers) {
    for (kernels::Matrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      RECALL_RETURN_IF_ERROR(Quantize(model, *m));
    }
  }
  RECALL_RETURN_IF_ERROR(Quantize(model, model.lm_head));
  model.config.weight_dtype = kernels::DType::kI8;
  return absl::OkStatus();
}

}  // namespace recall::model
