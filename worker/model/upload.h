// UploadModel: a copy of a loaded model in a backend's memory (a GPU's device memory), for
// the backends whose ops cannot read host weights. Matrices keep their dtype unless
// `f32_to_bf16` rounds the fp32 linear weights (and embeddings) to bf16, halving them;
// norms and biases stay fp32. Tied embeddings stay one copy.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/memory.h"
#include "worker/model/model.h"

namespace recall::model {

struct UploadOptions {
  bool f32_to_bf16 = false;
};

// ResourceExhausted (naming the size) when the weights do not fit.
absl::StatusOr<std::unique_ptr<Model>> UploadModel(const Model& host, kernels::Memory& memory,
                                                   const UploadOptions& options = {});

// Bytes the uploaded weights take.
int64_t WeightBytes(const Model& model);

}  // namespace recall::model
