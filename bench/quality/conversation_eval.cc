#include "bench/quality/conversation_eval.h"

#include <cmath>
#include <memory>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/offline/episodic_sequence.h"
#include "worker/offline/sequence.h"

namespace recall::bench {
namespace {

// One question's outcome for one method against the FullKV argmaxes.
struct Outcome {
  bool correct = true;
  bool agree = true;
  int token_agree = 0;
};

void Score(const QaQuestion& q, const Outcome& o, const Outcome& full, int far_tokens,
           ConvStats& s) {
  const bool far = q.distance_tokens >= far_tokens;
  s.questions += 1;
  s.correct += o.correct;
  s.far += far;
  s.far_correct += far && o.correct;
  s.agree += o.agree;
  s.answer_tokens += static_cast<int64_t>(q.answer.size());
  s.token_agree += o.token_agree;
  s.full_correct += full.correct;
  s.far_full_correct += far && full.correct;
}

// Argmax after every answer-predicting position of `seq` run teacher-forced: the prompt's
// logits predict answer[0], then Decode(answer[k]) predicts answer[k + 1].
absl::StatusOr<std::vector<int32_t>> AnswerArgmaxes(offline::Sequence& seq,
                                                    const std::vector<int32_t>& prompt,
                                                    const QaQuestion& q, int vocab, int chunk) {
  std::vector<float> logits(static_cast<size_t>(vocab));
  RECALL_RETURN_IF_ERROR(seq.Prefill(prompt, chunk, logits.data()));
  std::vector<int32_t> out = {Argmax(logits.data(), vocab)};
  for (size_t k = 0; k + 1 < q.answer.size(); ++k) {
    RECALL_RETURN_IF_ERROR(seq.Decode(q.answer[k], logits.data()));
    out.push_back(Argmax(logits.data(), vocab));
  }
  return out;
}

Outcome Compare(const QaQuestion& q, const std::vector<int32_t>& mine,
                const std::vector<int32_t>& full) {
  Outcome o;
  for (size_t k = 0; k < q.answer.size(); ++k) {
    o.correct &= mine[k] == q.answer[k];
    o.agree &= mine[k] == full[k];
    o.token_agree += mine[k] == full[k];
  }
  return o;
}

}  // namespace

int ConvMethod::Budget(const QaConversation& c) const {
  if (budget_tokens > 0) return budget_tokens;
  return static_cast<int>(std::ceil(fraction * c.conversation_tokens - 1e-9));
}

absl::StatusOr<ConvMethod> ParseConvMethod(const std::string& label) {
  if (label.empty()) return absl::InvalidArgumentError("methods: an empty method name");
  ConvMethod m;
  m.label = label;
  if (absl::StartsWith(label, "episodic-")) {
    m.episodic = true;
    m.embedder = label.substr(9);
  } else {
    m.policy = label;
  }
  return m;
}

absl::Status EvaluatePolicies(runtime::ForwardPass& forward, cache::BlockPool& pool,
                              const QaConversation& c, const std::vector<ConvMethod>& methods,
                              const ConvEvalOptions& options, std::vector<ConvStats>* stats,
                              ConvStats* full_stats) {
  const int vocab = forward.model().config.vocab_size;
  std::vector<int> answer_starts;
  const std::vector<int32_t> seq = QaSequence(c, &answer_starts);
  if (options.prefix < 1 || options.prefix >= c.conversation_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prefix must be in [1, ", c.conversation_tokens - 1, "], got ", options.prefix));
  }
  std::vector<RunSpec> specs;
  for (const ConvMethod& m : methods) specs.push_back({m.policy, m.Budget(c)});
  RECALL_ASSIGN_OR_RETURN(std::vector<Run> runs,
                          MakeRuns(forward, pool, specs, options.knobs, c.seed));
  const int k_runs = static_cast<int>(runs.size());
  std::vector<float> logits(static_cast<size_t>(k_runs) * vocab);
  RECALL_RETURN_IF_ERROR(PrefillRuns(forward, runs, seq.data(), options.prefix, logits.data()));

  // Per question and run, the argmax at each answer position.
  const size_t n_q = c.questions.size();
  std::vector<std::vector<std::vector<int32_t>>> argmax(
      n_q, std::vector<std::vector<int32_t>>(static_cast<size_t>(k_runs)));
  std::vector<int> all(static_cast<size_t>(k_runs));
  for (int i = 0; i < k_runs; ++i) all[static_cast<size_t>(i)] = i;
  std::vector<int32_t> feed(static_cast<size_t>(k_runs));
  size_t q = 0;  // the next question whose answer is still ahead
  const int last = answer_starts.back() + static_cast<int>(c.questions.back().answer.size());
  for (int pos = options.prefix; pos < last - 1; ++pos) {
    std::fill(feed.begin(), feed.end(), seq[static_cast<size_t>(pos)]);
    RECALL_RETURN_IF_ERROR(DecodeRuns(forward, runs, all, feed.data(), logits.data()));
    const int target = pos + 1;
    while (q < n_q && target >= answer_starts[q] + static_cast<int>(c.questions[q].answer.size())) {
      ++q;
    }
    if (q == n_q || target < answer_starts[q]) continue;
    for (int i = 0; i < k_runs; ++i) {
      argmax[q][static_cast<size_t>(i)].push_back(
          Argmax(logits.data() + static_cast<size_t>(i) * vocab, vocab));
    }
  }
  const double full_bytes = static_cast<double>(runs[0].seq->bytes_held());
  for (size_t qi = 0; qi < n_q; ++qi) {
    const QaQuestion& question = c.questions[qi];
    const std::vector<int32_t>& full = argmax[qi][0];
    const Outcome full_outcome = Compare(question, full, full);
    Score(question, full_outcome, full_outcome, options.far_tokens, *full_stats);
    for (size_t m = 0; m < methods.size(); ++m) {
      Score(question, Compare(question, argmax[qi][m + 1], full), full_outcome, options.far_tokens,
            (*stats)[m]);
    }
  }
  full_stats->kv_fraction_sum += 1.0;
  full_stats->kv_samples += 1;
  full_stats->budget_fraction_sum += 1.0;
  full_stats->conversations += 1;
  for (size_t m = 0; m < methods.size(); ++m) {
    ConvStats& s = (*stats)[m];
    s.kv_fraction_sum += static_cast<double>(runs[m + 1].seq->bytes_held()) / full_bytes;
    s.kv_samples += 1;
    s.budget_fraction_sum += static_cast<double>(specs[m].budget_tokens) / c.conversation_tokens;
    s.conversations += 1;
  }
  return absl::OkStatus();
}

absl::Status EvaluateEpisodic(runtime::ForwardPass& forward, cache::BlockPool& pool,
                              const model::Tokenizer& tokenizer, const QaConversation& c,
                              const std::vector<ConvMethod>& methods,
                              const ConvEvalOptions& options, std::vector<ConvStats>* stats,
                              ConvStats* full_stats) {
  const int vocab = forward.model().config.vocab_size;
  for (const QaQuestion& q : c.questions) {
    std::vector<int32_t> prompt = c.context;
    prompt.insert(prompt.end(), q.ask.begin(), q.ask.end());
    std::vector<int32_t> full;
    double full_bytes = 0;
    {
      RECALL_ASSIGN_OR_RETURN(auto seq,
                              offline::LocalSequence::Create(forward, pool, std::nullopt));
      RECALL_ASSIGN_OR_RETURN(full, AnswerArgmaxes(*seq, prompt, q, vocab, options.chunk));
      full_bytes = static_cast<double>(seq->stats().kv_bytes);
    }
    const Outcome full_outcome = Compare(q, full, full);
    Score(q, full_outcome, full_outcome, options.far_tokens, *full_stats);
    full_stats->kv_fraction_sum += 1.0;
    full_stats->kv_samples += 1;
    for (size_t m = 0; m < methods.size(); ++m) {
      const ConvMethod& method = methods[m];
      offline::EpisodicOptions o;
      o.decode.policy.name = "lazy";
      o.decode.policy.window = options.knobs.window;
      o.decode.policy.alpha = options.knobs.alpha;
      o.decode.policy.sinks = options.knobs.sinks;
      o.decode.budget.unit = cache::eviction::BudgetOptions::Unit::kTokens;
      o.decode.budget.budget = method.Budget(c);
      o.episodes = options.episodes;
      o.embedder = method.embedder;
      o.recent_utterances = options.recent;
      o.block.block_tokens = options.block_tokens;
      o.block.chunk = options.chunk;
      RECALL_ASSIGN_OR_RETURN(auto seq,
                              offline::EpisodicSequence::Create(forward, pool, tokenizer, o));
      RECALL_ASSIGN_OR_RETURN(std::vector<int32_t> mine,
                              AnswerArgmaxes(*seq, prompt, q, vocab, options.chunk));
      ConvStats& s = (*stats)[m];
      Score(q, Compare(q, mine, full), full_outcome, options.far_tokens, s);
      s.kv_fraction_sum += static_cast<double>(seq->stats().kv_bytes) / full_bytes;
      s.kv_samples += 1;
    }
  }
  full_stats->budget_fraction_sum += 1.0;
  full_stats->conversations += 1;
  for (size_t m = 0; m < methods.size(); ++m) {
    (*stats)[m].budget_fraction_sum +=
        static_cast<double>(methods[m].Budget(c)) / c.conversation_tokens;
    (*stats)[m].conversations += 1;
  }
  return absl::OkStatus();
}

}  // namespace recall::bench
