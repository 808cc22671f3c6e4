// A model of a given shape with random weights (for speed benchmarks and tests: speed does
// not depend on the weights being trained). Deterministic in `seed`.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "worker/model/model.h"

namespace recall::model {

// Matrices are stored in `dtype` (f32, f16 or bf16); norms are fp32 ones-ish. Values are
// uniform in +-1/sqrt(cols) so activations stay in range.
absl::StatusOr<std::unique_ptr<Model>> MakeRandomModel(const ModelConfig& config,
                                                       kernels::DType dtype, uint64_t seed);

// The bytes MakeRandomModel allocates for `config` in `dtype` (its matrices, norms and
// biases), before it allocates them.
int64_t RandomModelBytes(const ModelConfig& config, kernels::DType dtype);

// Reads a Hugging Face config.json into a ModelConfig (shared with the HF loader).
absl::StatusOr<ModelConfig> ReadHfConfig(const std::string& config_json_path);

}  // namespace recall::model
