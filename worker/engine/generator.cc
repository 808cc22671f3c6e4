#include "worker/engine/generator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cache/sequence_cache.h"
#include "common/clock.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "worker/engine/stop_text.h"
#include "worker/engine/turn_request.h"

namespace recall::engine {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength: return "length";
    case FinishReason::kStopToken: return "stop_token";
    case FinishReason::kStopString: return "stop_string";
    case FinishReason::kContext: return "context";
  }
  return "?";
}

namespace {

absl::Status ValidateOptions(const GenerateOptions& o) {
  if (o.max_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens must be >= 1, got ", o.max_tokens));
  }
  if (o.prefill_chunk < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefill_chunk must be >= 1, got ", o.prefill_chunk));
  }
  RECALL_RETURN_IF_ERROR(ValidateSampling(o.sampling, ""));
  for (const std::string& stop : o.stop_strings) {
    if (stop.empty()) return absl::InvalidArgumentError("stop strings must not be empty");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GenerateResult> Generate(ForwardPass& forward, cache::BlockPool& pool,
                                        const model::Tokenizer& tokenizer,
                                        const std::vector<int32_t>& prompt,
                                        const GenerateOptions& options,
                                        const TextCallback& on_text) {
  RECALL_RETURN_IF_ERROR(ValidateOptions(options));
  if (prompt.empty()) return absl::InvalidArgumentError("prompt: needs at least one token");
  const model::ModelConfig& config = forward.model().config;
  if (static_cast<int>(prompt.size()) >= config.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("prompt: ", prompt.size(),
                                                   " tokens leave no room in the context of ",
                                                   config.max_seq_len, " tokens"));
  }

  GenerateResult result;
  result.prompt_tokens = static_cast<int>(prompt.size());
  cache::SequenceCache seq(&pool);
  std::vector<float> logits(static_cast<size_t>(config.vocab_size));
  kernels::Rng rng(options.sampling.seed);
  std::vector<int32_t> history = prompt;
  history.reserve(prompt.size() + options.max_tokens);

  std::unique_ptr<cache::eviction::SessionEvictor> evictor;
  std::vector<float> probs;
  int64_t probs_stride = 0;
  if (options.eviction.has_value()) {
    cache::eviction::SessionEvictorOptions eo = *options.eviction;
    eo.n_heads = config.n_heads;
    RECALL_ASSIGN_OR_RETURN(evictor, cache::eviction::SessionEvictor::Create(eo, &seq));
    if (evictor->policy().needs_attention()) {
      // A head never holds more slots than the context.
      probs_stride = config.max_seq_len;
      probs.resize(static_cast<size_t>(config.n_layers) * config.n_heads * probs_stride);
    }
  }
  // Prefill-time compression (SnapKV) scores the prompt by its last `window` queries.
  std::vector<float> window_queries;
  int window_w = 0;
  if (evictor != nullptr && evictor->policy().compresses_prefill()) {
    window_w = std::min<int>(evictor->policy().options().window, static_cast<int>(prompt.size()));
    window_queries.resize(static_cast<size_t>(config.n_layers) * window_w * config.n_heads *
                          config.head_dim);
  }

  // Prefill in chunks; only the last chunk's last token needs logits.
  Stopwatch watch;
  for (size_t start = 0; start < prompt.size(); start += options.prefill_chunk) {
    const int n = static_cast<int>(std::min<size_t>(options.prefill_chunk, prompt.size() - start));
    BatchItem item;
    item.cache = &seq;
    item.tokens = prompt.data() + start;
    item.n = n;
    item.want_logits = start + n == prompt.size();
    if (window_w > 0) {
      item.window_queries = window_queries.data();
      item.window_w = window_w;
      item.window_first = static_cast<int>(prompt.size()) - window_w;
    }
    RECALL_RETURN_IF_ERROR(forward.Run({&item, 1}, logits.data()));
  }
  result.prefill_seconds = watch.ElapsedSeconds();
  result.peak_kv_bytes = seq.bytes_held();
  if (window_w > 0) RECALL_RETURN_IF_ERROR(evictor->CompressPrefill(window_queries.data(), window_w));
  watch.Reset();

  model::TokenStreamDecoder stream(tokenizer);
  // Text is decoded over prompt + output so that context-dependent pieces (a leading space
  // after BOS) decode as the tokenizer would; only the output part is kept.
  for (int32_t id : prompt) stream.Next(id);
  stream.Flush();
  StopText stop_text(options.stop_strings);
  kernels::Backend& backend = forward.backend();

  while (true) {
    const int32_t next = backend.Sample(logits.data(), config.vocab_size, options.sampling, rng,
                                         history.data(), static_cast<int>(history.size()));
    if (std::find(options.stop_token_ids.begin(), options.stop_token_ids.end(), next) !=
        options.stop_token_ids.end()) {
      result.finish_reason = FinishReason::kStopToken;
      break;
    }
    result.tokens.push_back(next);
    history.push_back(next);
    if (stop_text.Append(stream.Next(next))) {
      result.finish_reason = FinishReason::kStopString;
      break;
    }
    const std::string ready = stop_text.TakeReady();
    if (on_text && !ready.empty()) on_text(ready);

    if (static_cast<int>(result.tokens.size()) >= options.max_tokens) {
      result.finish_reason = FinishReason::kLength;
      break;
    }
    if (seq.next_position() >= config.max_seq_len) {
      result.finish_reason = FinishReason::kContext;
      break;
    }
    BatchItem item;
    item.cache = &seq;
    item.tokens = &result.tokens.back();
    item.n = 1;
    item.attn_probs = probs.empty() ? nullptr : probs.data();
    item.probs_stride = probs_stride;
    RECALL_RETURN_IF_ERROR(forward.Run({&item, 1}, logits.data()));
    result.peak_kv_bytes = std::max(result.peak_kv_bytes, seq.bytes_held());
    if (evictor != nullptr) {
      RECALL_RETURN_IF_ERROR(evictor->Step(item.attn_probs, probs_stride));
    }
  }
  result.final_kv_bytes = seq.bytes_held();
  if (evictor != nullptr) {
    result.evictions = evictor->evictions();
    result.evicted_slots = evictor->evicted_slots();
  }
  if (result.finish_reason != FinishReason::kStopString) stop_text.Append(stream.Flush());
  const std::string rest = stop_text.TakeAll();
  if (on_text && !rest.empty()) on_text(rest);
  result.text = stop_text.text();
  result.decode_seconds = watch.ElapsedSeconds();
  return result;
}

}  // namespace recall::engine
