// Generate: run one sequence from a prompt to a finish condition (max tokens, a stop token,
// a stop string, or the context limit), streaming text deltas.
//
// Used by `recall generate` and the golden tests; the serving scheduler (worker issue) runs
// many sequences through the same ForwardPass.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/block_pool.h"
#include "cache/eviction/session_evictor.h"
#include "kernels/sampling_params.h"
#include "worker/offline/sequence.h"
#include "worker/runtime/forward.h"
#include "worker/runtime/positions.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::offline {

struct GenerateOptions {
  int max_tokens = 256;                   // generated tokens at most (>= 1)
  kernels::SamplingParams sampling;       // temperature 1, no top-k/top-p, seed 0
  std::vector<int32_t> stop_token_ids;    // e.g. EOS; not part of the output text
  std::vector<std::string> stop_strings;  // output ends before the first occurrence
  int prefill_chunk = 256;                // prompt tokens per forward pass
  // KV eviction while decoding (the prompt is prefilled whole, then evictable); unset means
  // the full cache.
  std::optional<cache::eviction::SessionEvictorOptions> eviction;
  // With an eviction policy, kCompact goes on past the context length (runtime/positions.h);
  // with SnapKV, until its cache (the prompt compressed once, then a slot per token) holds it.
  runtime::Positions positions = runtime::Positions::kOriginal;
};

enum class FinishReason { kLength, kStopToken, kStopString, kContext };
const char* FinishReasonName(FinishReason reason);

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids (without a final stop token)
  std::string text;             // generated text (stop string excluded)
  FinishReason finish_reason = FinishReason::kLength;
  int prompt_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
  int64_t peak_kv_bytes = 0;   // most KV bytes the sequence held at any point
  int64_t final_kv_bytes = 0;  // KV bytes held when generation ended
  int64_t evictions = 0;       // (layer, KV head) compactions done by the eviction policy
  int64_t evicted_slots = 0;   // token slots evicted in total
};

// Called with each new piece of text as soon as it cannot belong to a stop string.
using TextCallback = std::function<void(const std::string& delta)>;

// Runs `prompt` (token ids; non-empty) through `seq` (fresh) and samples with `sampler`
// (tensor parallelism: rank 0's backend; the sampled token is what every rank appends next).
// `config` is the (full) model's. GenerateOptions::eviction is ignored: the sequence was made
// with its evictor. InvalidArgument for bad options or a prompt longer than the context.
absl::StatusOr<GenerateResult> Generate(Sequence& seq, kernels::Backend& sampler,
                                        const model::ModelConfig& config,
                                        const model::Tokenizer& tokenizer,
                                        const std::vector<int32_t>& prompt,
                                        const GenerateOptions& options,
                                        const TextCallback& on_text = nullptr);

// Runs `prompt` (token ids; non-empty) through a fresh LocalSequence in `pool`. The sequence's
// blocks are returned to the pool before returning. InvalidArgument for bad options or a
// prompt longer than the context; ResourceExhausted if the pool is too small.
absl::StatusOr<GenerateResult> Generate(runtime::ForwardPass& forward, cache::BlockPool& pool,
                                        const model::Tokenizer& tokenizer,
                                        const std::vector<int32_t>& prompt,
                                        const GenerateOptions& options,
                                        const TextCallback& on_text = nullptr);

}  // namespace recall::offline
