#include "worker/serving/turn_request.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cache/eviction/session_evictor.h"
#include "common/status.h"
#include "common/utf8.h"

namespace recall::serving {
namespace {

absl::Status Invalid(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

absl::Status ValidateMessages(const std::vector<model::ChatMessage>& messages,
                              const std::string& field) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const model::ChatMessage& m = messages[i];
    const std::string at = absl::StrCat(field, "[", i, "]");
    if (m.role != "system" && m.role != "user" && m.role != "assistant") {
      return Invalid(at + ".role",
                     absl::StrCat("\"", m.role, "\" is not one of system, user, assistant"));
    }
    if (!utf8::IsValid(m.content)) return Invalid(at + ".content", "is not valid UTF-8");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status HistoryNeededError(const std::string& session_id, int history_length) {
  absl::Status st = absl::FailedPreconditionError(
      absl::StrCat("history: session \"", session_id, "\" is not on this worker; resend with ",
                   "history (", history_length, " messages)"));
  st.SetPayload("recall.history_needed", absl::Cord(absl::StrCat(history_length)));
  return st;
}

std::string PastContextAdvice(bool evicts_as_fed) {
  if (evicts_as_fed) {
    return "its policy evicts, but it keeps its tokens' original positions (CacheSettings."
           "positions \"original\"); with positions \"compact\", the default for a policy "
           "that evicts, it goes on past it (a new session)";
  }
  return "a session whose cache policy evicts as tokens are fed goes on past it (start one: "
         "gRPC CacheSettings.policy, recall chat --policy; an OpenAI API session takes the "
         "server's --policy)";
}

bool IsHistoryNeeded(const absl::Status& status) {
  return status.GetPayload("recall.history_needed").has_value();
}

absl::Status ValidateSampling(const kernels::SamplingParams& s, const std::string& prefix,
                              int vocab_size) {
  if (!(s.temperature >= 0.0f && s.temperature <= kMaxTemperature)) {
    return Invalid(prefix + "temperature",
                   absl::StrCat("must be in [0, ", kMaxTemperature, "], got ", s.temperature));
  }
  if (!(s.top_p > 0.0f && s.top_p <= 1.0f)) {
    return Invalid(prefix + "top_p", absl::StrCat("must be in (0, 1], got ", s.top_p));
  }
  if (s.top_k < 0 || s.top_k > vocab_size) {
    return Invalid(prefix + "top_k",
                   absl::StrCat("must be in [0, ", vocab_size,
                                "] (0: off; the vocabulary's size), got ", s.top_k));
  }
  if (!(s.repetition_penalty > 0.0f && s.repetition_penalty <= kMaxRepetitionPenalty)) {
    return Invalid(
        prefix + "repetition_penalty",
        absl::StrCat("must be in (0, ", kMaxRepetitionPenalty, "], got ", s.repetition_penalty));
  }
  for (const auto& [field, value] : {std::pair{"frequency_penalty", s.frequency_penalty},
                                     std::pair{"presence_penalty", s.presence_penalty}}) {
    if (!(value >= -kMaxReplyPenalty && value <= kMaxReplyPenalty)) {
      return Invalid(prefix + field, absl::StrCat("must be in [", -kMaxReplyPenalty, ", ",
                                                  kMaxReplyPenalty, "], got ", value));
    }
  }
  if (s.logit_bias.size() > static_cast<size_t>(kMaxLogitBiasTokens)) {
    return Invalid(prefix + "logit_bias", absl::StrCat("at most ", kMaxLogitBiasTokens,
                                                       " tokens, got ", s.logit_bias.size()));
  }
  for (const auto& [token, bias] : s.logit_bias) {
    if (token < 0 || token >= vocab_size) {
      return Invalid(
          prefix + "logit_bias",
          absl::StrCat("token ", token, " is outside the vocabulary [0, ", vocab_size, ")"));
    }
    if (!(bias >= -kMaxLogitBias && bias <= kMaxLogitBias)) {
      return Invalid(prefix + "logit_bias",
                     absl::StrCat("token ", token, ": the bias must be in [", -kMaxLogitBias, ", ",
                                  kMaxLogitBias, "], got ", bias));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateEpisodicSettings(const CacheRequest& c) {
  const auto range = [](const char* field, const std::optional<int>& v, int lo,
                        int hi) -> absl::Status {
    if (!v.has_value() || (*v >= lo && *v <= hi)) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": must be in [", lo, ", ", hi, "], got ", *v));
  };
  RECALL_RETURN_IF_ERROR(range("cache.episodes", c.episodes, 1, kMaxEpisodes));
  RECALL_RETURN_IF_ERROR(range("cache.block_tokens", c.block_tokens, 16, 1 << 16));
  RECALL_RETURN_IF_ERROR(range("cache.recluster_turns", c.recluster_turns, 1, 1 << 20));
  if (c.embedder.has_value() && *c.embedder != "model" && *c.embedder != "tfidf") {
    return absl::InvalidArgumentError(absl::StrCat("cache.embedder: unknown embedder \"",
                                                   *c.embedder, "\" (one of model, tfidf)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateTurnRequest(const TurnRequest& r, const TurnLimits& limits,
                                 const std::vector<std::string>& known_policies) {
  if (r.session_id.empty()) return Invalid("session_id", "is required");
  if (r.session_id.size() > limits.max_session_id_bytes) {
    return Invalid("session_id", absl::StrCat(r.session_id.size(), " bytes; at most ",
                                              limits.max_session_id_bytes));
  }
  if (!utf8::IsValid(r.session_id)) return Invalid("session_id", "is not valid UTF-8");
  if (r.messages.empty()) return Invalid("messages", "a turn needs at least one new message");
  RECALL_RETURN_IF_ERROR(ValidateMessages(r.messages, "messages"));
  if (r.history_length < 0) {
    return Invalid("history_length", absl::StrCat("must be >= 0, got ", r.history_length));
  }
  if (!r.history.empty() && static_cast<int>(r.history.size()) != r.history_length) {
    return Invalid("history", absl::StrCat(r.history.size(), " messages but history_length is ",
                                           r.history_length));
  }
  RECALL_RETURN_IF_ERROR(ValidateMessages(r.history, "history"));
  RECALL_RETURN_IF_ERROR(ValidateSampling(r.sampling, "sampling.", limits.vocab_size));
  if (r.max_tokens < 1 || r.max_tokens > limits.max_tokens) {
    return Invalid("sampling.max_tokens",
                   absl::StrCat("must be in [1, ", limits.max_tokens, "], got ", r.max_tokens));
  }
  if (r.top_logprobs < 0 || r.top_logprobs > kMaxTopLogprobs) {
    return Invalid("sampling.top_logprobs",
                   absl::StrCat("must be in [0, ", kMaxTopLogprobs, "], got ", r.top_logprobs));
  }
  if (r.top_logprobs > 0 && !r.logprobs) {
    return Invalid("sampling.top_logprobs", "needs sampling.logprobs");
  }
  if (r.stop.size() > limits.max_stop_strings) {
    return Invalid("sampling.stop",
                   absl::StrCat(r.stop.size(), " stop strings; at most ", limits.max_stop_strings));
  }
  for (size_t i = 0; i < r.stop.size(); ++i) {
    const std::string at = absl::StrCat("sampling.stop[", i, "]");
    if (r.stop[i].empty()) return Invalid(at, "must not be empty");
    if (r.stop[i].size() > limits.max_stop_bytes) {
      return Invalid(at, absl::StrCat(r.stop[i].size(), " bytes; at most ", limits.max_stop_bytes));
    }
    if (!utf8::IsValid(r.stop[i])) return Invalid(at, "is not valid UTF-8");
  }
  if (static_cast<int>(r.resume_tokens.size()) >= r.max_tokens) {
    return Invalid("resume_tokens", absl::StrCat(r.resume_tokens.size(),
                                                 " tokens leave nothing to generate under "
                                                 "max_tokens ",
                                                 r.max_tokens));
  }
  return ValidateCacheRequest(r.cache, known_policies);
}

absl::Status ValidateCacheRequest(const CacheRequest& c,
                                  const std::vector<std::string>& known_policies) {
  if (c.policy.has_value() &&
      std::find(known_policies.begin(), known_policies.end(), *c.policy) == known_policies.end()) {
    if (*c.policy == "episodic") {  // a policy, not of this worker's (it was "unknown")
      return Invalid("cache.policy",
                     absl::StrCat("episodic sessions run on a worker of one CPU rank; this one "
                                  "runs tensor-parallel or GPU ranks (one of ",
                                  absl::StrJoin(known_policies, ", "), ")"));
    }
    return Invalid("cache.policy", absl::StrCat("unknown policy \"", *c.policy, "\" (one of ",
                                                absl::StrJoin(known_policies, ", "), ")"));
  }
  if (c.budget_tokens.has_value() && c.budget_fraction.has_value()) {
    return Invalid("cache.budget_tokens", "give budget_tokens or budget_fraction, not both");
  }
  if (c.budget_tokens.has_value() && *c.budget_tokens < 1) {
    return Invalid("cache.budget_tokens", absl::StrCat("must be >= 1, got ", *c.budget_tokens));
  }
  if (c.budget_fraction.has_value() && !(*c.budget_fraction > 0 && *c.budget_fraction <= 1)) {
    return Invalid("cache.budget_fraction",
                   absl::StrCat("must be in (0, 1], got ", *c.budget_fraction));
  }
  if (c.window.has_value() && *c.window < 1) {
    return Invalid("cache.window", absl::StrCat("must be >= 1, got ", *c.window));
  }
  if (c.alpha.has_value() && !(*c.alpha > 0 && *c.alpha < 1)) {
    return Invalid("cache.alpha", absl::StrCat("must be in (0, 1), got ", *c.alpha));
  }
  if (c.tp_eviction.has_value()) {
    const auto& modes = cache::eviction::TpEvictionModes();
    if (std::find(modes.begin(), modes.end(), *c.tp_eviction) == modes.end()) {
      return Invalid("cache.tp_eviction",
                     absl::StrCat("unknown mode \"", *c.tp_eviction, "\" (one of ",
                                  absl::StrJoin(modes, ", "), ")"));
    }
  }
  return ValidateEpisodicSettings(c);
}

}  // namespace recall::serving
