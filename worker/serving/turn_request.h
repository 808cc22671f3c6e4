// What the engine needs to run one turn of a session (the wire format is converted to this
// at the service edge), and its validation.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/sampling_params.h"
#include "worker/model/chat_template.h"
#include "worker/serving/replay.h"

namespace recall::serving {

// Per-session KV cache settings; unset fields take the scheduler's defaults.
inline constexpr int kMaxEpisodes = 16;

struct CacheRequest {
  std::optional<std::string> policy;
  std::optional<int> budget_tokens;
  std::optional<double> budget_fraction;
  std::optional<int> window;
  std::optional<double> alpha;
  // How tensor-parallel ranks (and the heads of a layer) agree on evictions: one of
  // cache::eviction::TpEvictionModes().
  std::optional<std::string> tp_eviction;
  // Policy "episodic" (EpiCache): episodes at most, the embedder ("model" or "tfidf"),
  // history + patch tokens per block of the block-wise build, and new turns between
  // re-clusterings.
  std::optional<int> episodes;
  std::optional<std::string> embedder;
  std::optional<int> block_tokens;
  std::optional<int> recluster_turns;
  // What happens at the model's context length: "original" (the session ends there) or
  // "compact" (the cached tokens are re-positioned: runtime/positions.h).
  std::optional<std::string> positions;
  // How the cache stores K and V ("f32", "bf16", "f16", "int8"): a worker's pools store one
  // type (its --kv-dtype), so a request may only name that one.
  std::optional<std::string> kv_dtype;
};

// The episodic fields of a CacheRequest: InvalidArgument naming the field ("cache.episodes",
// ...) and its range.
absl::Status ValidateEpisodicSettings(const CacheRequest& c);

struct TurnRequest {
  std::string session_id;
  std::string request_id;                    // unique among running turns; made when empty
  std::vector<model::ChatMessage> messages;  // this turn's new messages
  int history_length = 0;                    // messages before this turn
  std::vector<model::ChatMessage> history;   // those messages, or empty when not sent
  // Per history message: an assistant reply's tokens and end, when the caller kept them
  // (then a rebuild replays the history exactly: replay.h). Empty, or history's size.
  std::vector<std::optional<ReplyRecord>> history_replies;
  kernels::SamplingParams sampling;
  int max_tokens = 256;
  std::vector<std::string> stop;  // extra stop strings
  bool logprobs = false;
  int top_logprobs = 0;  // with logprobs: the most likely tokens at each place, at most 20
  CacheRequest cache;
  // Failover: reply tokens the client already has; fed after the prompt, not re-streamed.
  std::vector<int32_t> resume_tokens;
  // The resident cache, if any, is not continued: rebuilt from the history (RunTurnRequest).
  bool rebuild = false;
};

// Limits a request is checked against.
struct TurnLimits {
  int max_tokens = 4096;  // upper bound of max_tokens
  size_t max_session_id_bytes = 128;
  size_t max_stop_strings = 16;
  size_t max_stop_bytes = 256;
  int vocab_size = std::numeric_limits<int>::max();  // top_k's bound (the scheduler sets it)
};

// InvalidArgument naming the field (as on the wire: "sampling.top_p", "messages[2].role",
// ...) and the limit. Does not check what depends on the session (residency, context).
absl::Status ValidateTurnRequest(const TurnRequest& request, const TurnLimits& limits,
                                 const std::vector<std::string>& known_policies);

// Its cache part alone ("cache.policy", "cache.window", ...; the episodic fields too): what a
// new session's settings are checked against before the session is made.
absl::Status ValidateCacheRequest(const CacheRequest& cache,
                                  const std::vector<std::string>& known_policies);

// The error of a turn whose session this worker does not hold and whose request carried no
// history: FailedPrecondition, marked so the service can tell the caller to resend with the
// history (IsHistoryNeeded) without reading the message.
absl::Status HistoryNeededError(const std::string& session_id, int history_length);
bool IsHistoryNeeded(const absl::Status& status);

// How a session that ends at the model's context length could go on past it, for its error:
// one whose policy evicts as tokens are fed ends there only by keeping its tokens' original
// positions (positions "compact" goes on); any other needs such a policy.
std::string PastContextAdvice(bool evicts_as_fed);

// Sampling values alone; `prefix` is prepended to field names ("sampling." on the wire).
// Every float must be finite and within its bound; top_k at most `vocab_size`.
inline constexpr float kMaxTemperature = 100.0f;
inline constexpr float kMaxRepetitionPenalty = 100.0f;
// logit_bias: values in [-kMaxLogitBias, kMaxLogitBias] (OpenAI's range), token ids in
// [0, vocab_size), at most kMaxLogitBiasTokens of them.
inline constexpr float kMaxLogitBias = 100.0f;
inline constexpr int kMaxLogitBiasTokens = 1024;
// frequency_penalty, presence_penalty: in [-kMaxReplyPenalty, kMaxReplyPenalty] (OpenAI's).
inline constexpr float kMaxReplyPenalty = 2.0f;
// top_logprobs: at most this many alternatives per token (OpenAI's limit).
inline constexpr int kMaxTopLogprobs = 20;
absl::Status ValidateSampling(const kernels::SamplingParams& s, const std::string& prefix,
                              int vocab_size = std::numeric_limits<int>::max());

}  // namespace recall::serving
