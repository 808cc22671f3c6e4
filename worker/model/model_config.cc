#include "worker/model/model_config.h"

#include <cmath>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"

namespace recall::model {
namespace {

// Upper limits far above any supported model; they keep size arithmetic in int64 range.
constexpr int kMaxDim = 1 << 16;
constexpr int kMaxHiddenDim = 1 << 20;
constexpr int kMaxLayers = 1024;
constexpr int kMaxHeads = 1024;
constexpr int kMaxHeadDim = 1024;
constexpr int kMaxVocab = 1 << 24;
constexpr int kMaxSeqLen = 1 << 24;

absl::Status CheckRange(const char* field, int value, int max) {
  if (value < 1 || value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: ", field, " = ", value, " is out of range [1, ", max, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

const char* ArchName(Arch arch) {
  switch (arch) {
    case Arch::kLlama:
      return "llama";
    case Arch::kMistral:
      return "mistral";
    case Arch::kQwen2:
      return "qwen2";
    case Arch::kQwen3:
      return "qwen3";
  }
  return "unknown";
}

absl::Status ModelConfig::Validate() const {
  struct Field {
    const char* name;
    int value;
    int max;
  };
  const Field fields[] = {
      {"dim", dim, kMaxDim},
      {"hidden_dim", hidden_dim, kMaxHiddenDim},
      {"n_layers", n_layers, kMaxLayers},
      {"n_heads", n_heads, kMaxHeads},
      {"n_kv_heads", n_kv_heads, kMaxHeads},
      {"head_dim", head_dim, kMaxHeadDim},
      {"vocab_size", vocab_size, kMaxVocab},
      {"max_seq_len", max_seq_len, kMaxSeqLen},
  };
  for (const Field& f : fields) {
    if (absl::Status s = CheckRange(f.name, f.value, f.max); !s.ok()) return s;
  }
  if (n_heads % n_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model config: n_heads = ", n_heads, " is not a multiple of n_kv_heads = ", n_kv_heads));
  }
  if (head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: head_dim = ", head_dim, " must be even (RoPE rotates pairs)"));
  }
  const int64_t q_dim = static_cast<int64_t>(n_heads) * head_dim;
  if (q_dim > kMaxDim) {
    return absl::InvalidArgumentError(absl::StrCat("model config: n_heads * head_dim = ", q_dim,
                                                   " is out of range [1, ", kMaxDim, "]"));
  }
  if (!(rope_theta > 0.0f) || !std::isfinite(rope_theta)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: rope_theta = ", rope_theta, " must be positive and finite"));
  }
  for (const auto& [name, id] :
       {std::pair{"bos_token_id", bos_token_id}, std::pair{"eos_token_id", eos_token_id}}) {
    if (id < -1 || id >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("model config: ", name, " = ", id,
                                                     " is outside [0, vocab_size = ", vocab_size,
                                                     ") (or -1 for none)"));
    }
  }
  if (!(norm_eps > 0.0f) || norm_eps >= 1.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: norm_eps = ", norm_eps, " is out of range (0, 1)"));
  }
  return absl::OkStatus();
}

std::string ModelConfig::WeightsName() const {
  std::string name = kernels::DTypeName(weight_dtype);
  if (fp8) absl::StrAppend(&name, " (from FP8)");
  return name;
}

}  // namespace recall::model
