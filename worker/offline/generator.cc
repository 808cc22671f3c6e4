#include "worker/offline/generator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cache/sequence_cache.h"
#include "common/clock.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/cpu/sampling.h"
#include "worker/serving/stop_text.h"
#include "worker/serving/turn_request.h"

namespace recall::offline {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStopToken:
      return "stop_token";
    case FinishReason::kStopString:
      return "stop_string";
    case FinishReason::kContext:
      return "context";
  }
  return "?";
}

namespace {

absl::Status ValidateOptions(const GenerateOptions& o, int vocab_size) {
  if (o.max_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens must be >= 1, got ", o.max_tokens));
  }
  if (o.prefill_chunk < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefill_chunk must be >= 1, got ", o.prefill_chunk));
  }
  RECALL_RETURN_IF_ERROR(serving::ValidateSampling(o.sampling, "", vocab_size));
  for (const std::string& stop : o.stop_strings) {
    if (stop.empty()) return absl::InvalidArgumentError("stop strings must not be empty");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GenerateResult> Generate(runtime::ForwardPass& forward, cache::BlockPool& pool,
                                        const model::Tokenizer& tokenizer,
                                        const std::vector<int32_t>& prompt,
                                        const GenerateOptions& options,
                                        const TextCallback& on_text) {
  RECALL_RETURN_IF_ERROR(ValidateOptions(options, forward.model().config.vocab_size));
  RECALL_ASSIGN_OR_RETURN(
      std::unique_ptr<LocalSequence> seq,
      LocalSequence::Create(forward, pool, options.eviction, options.positions));
  return Generate(*seq, forward.backend(), forward.model().config, tokenizer, prompt, options,
                  on_text);
}

absl::StatusOr<GenerateResult> Generate(Sequence& seq, kernels::Backend& backend,
                                        const model::ModelConfig& config,
                                        const model::Tokenizer& tokenizer,
                                        const std::vector<int32_t>& prompt,
                                        const GenerateOptions& options,
                                        const TextCallback& on_text) {
  RECALL_RETURN_IF_ERROR(ValidateOptions(options, config.vocab_size));
  if (prompt.empty()) return absl::InvalidArgumentError("prompt: needs at least one token");
  if (!seq.endless() && static_cast<int>(prompt.size()) >= config.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("prompt: ", prompt.size(),
                                                   " tokens leave no room in the context of ",
                                                   config.max_seq_len, " tokens"));
  }

  GenerateResult result;
  result.prompt_tokens = static_cast<int>(prompt.size());
  std::vector<float> logits(static_cast<size_t>(config.vocab_size));
  kernels::Rng rng(options.sampling.seed);
  std::vector<int32_t> history = prompt;
  history.reserve(prompt.size() + options.max_tokens);

  Stopwatch watch;
  RECALL_RETURN_IF_ERROR(seq.Prefill(prompt, options.prefill_chunk, logits.data()));
  result.prefill_seconds = watch.ElapsedSeconds();
  watch.Reset();

  model::TokenStreamDecoder stream(tokenizer);
  // Text is decoded over prompt + output so that context-dependent pieces (a leading space
  // after BOS) decode as the tokenizer would; only the output part is kept.
  for (int32_t id : prompt) stream.Next(id);
  stream.Flush();
  serving::StopText stop_text(options.stop_strings);

  while (true) {
    kernels::cpu::ApplyReplyPenalties(logits.data(), config.vocab_size, options.sampling,
                                      history.data() + prompt.size(),
                                      static_cast<int>(history.size() - prompt.size()));
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
    if (!seq.endless() && seq.context_used() >= config.max_seq_len) {
      result.finish_reason = FinishReason::kContext;
      break;
    }
    RECALL_RETURN_IF_ERROR(seq.Decode(result.tokens.back(), logits.data()));
  }
  const SequenceStats stats = seq.stats();
  result.peak_kv_bytes = stats.peak_kv_bytes;
  result.final_kv_bytes = stats.kv_bytes;
  result.evictions = stats.evictions;
  result.evicted_slots = stats.evicted_slots;
  if (result.finish_reason != FinishReason::kStopString) stop_text.Append(stream.Flush());
  const std::string rest = stop_text.TakeAll();
  if (on_text && !rest.empty()) on_text(rest);
  result.text = stop_text.text();
  result.decode_seconds = watch.ElapsedSeconds();
  return result;
}

}  // namespace recall::offline
