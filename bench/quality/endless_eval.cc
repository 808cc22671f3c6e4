#include "bench/quality/endless_eval.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>

#include "absl/strings/str_cat.h"
#include "bench/quality/batch_runs.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/status.h"
#include "worker/offline/generator.h"
#include "worker/offline/sequence.h"

namespace recall::bench {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// -log softmax(logits)[target] in double.
double TargetNll(const float* logits, int vocab, int32_t target, std::vector<double>& scratch) {
  scratch.resize(static_cast<size_t>(vocab));
  LogSoftmax(logits, vocab, scratch.data());
  return -scratch[target];
}

// The text index of every held slot of a cache, followed through appends, evictions and
// re-positionings: all three keep each (layer, KV head) row's slots in order, an eviction
// keeps a subset of the positions and a re-positioning makes a row's slots consecutive,
// ending just before the `next` it is given (runtime::CompactPositions).
class SlotOrigins {
 public:
  // From a cache that was never re-positioned (its positions are text indices).
  explicit SlotOrigins(const cache::SequenceCache& cache) {
    ReadPositions(cache);
    pos_.resize(rows_);
    origin_.resize(rows_);
    for (int r = 0; r < rows_; ++r) {
      pos_[r].assign(&buf_[r * stride_], &buf_[r * stride_] + lens_[r]);
      origin_[r] = pos_[r];
    }
  }

  // After one Decode that fed text token `t`; `compacted_to` is the `next` the cache was
  // re-positioned to before the append, or -1.
  void Update(const cache::SequenceCache& cache, int32_t t, int32_t compacted_to) {
    const int32_t appended = cache.next_position() - 1;
    ReadPositions(cache);
    for (int r = 0; r < rows_; ++r) {
      std::vector<int32_t>& pos = pos_[r];
      std::vector<int32_t>& origin = origin_[r];
      const int len = static_cast<int>(pos.size());
      if (compacted_to >= 0) {
        for (int s = 0; s < len; ++s) pos[s] = compacted_to - len + s;
      }
      pos.push_back(appended);
      origin.push_back(t);
      // The eviction kept a subset, in order.
      size_t j = 0;
      for (int s = 0; s < lens_[r]; ++s) {
        const int32_t p = buf_[r * stride_ + s];
        while (j < pos.size() && pos[j] != p) ++j;
        RECALL_CHECK(j < pos.size()) << "row " << r << ": position " << p << " not held before";
        pos[s] = p;
        origin[s] = origin[j++];
      }
      pos.resize(static_cast<size_t>(lens_[r]));
      origin.resize(static_cast<size_t>(lens_[r]));
    }
  }

  // Adds the ages of the held slots at text token `t` to *sum, those >= `old` to *old_count,
  // and the slots to *count.
  void AddAges(int32_t t, int32_t old, double* sum, int64_t* old_count, int64_t* count) const {
    for (const std::vector<int32_t>& origin : origin_) {
      for (int32_t o : origin) {
        *sum += t - o;
        *old_count += t - o >= old ? 1 : 0;
      }
      *count += static_cast<int64_t>(origin.size());
    }
  }

 private:
  void ReadPositions(const cache::SequenceCache& cache) {
    const kernels::PagedKv kv = cache.View();
    const int n_heads = kv.layout.n_kv_heads;
    rows_ = kv.layout.n_layers * n_heads;
    stride_ = std::max(1, cache.max_length());
    buf_.resize(static_cast<size_t>(rows_) * stride_);
    cache.Positions(buf_.data(), stride_);
    lens_.resize(rows_);
    for (int r = 0; r < rows_; ++r) lens_[r] = cache.length(r / n_heads, r % n_heads);
  }

  int rows_ = 0;
  int64_t stride_ = 1;
  std::vector<int32_t> buf_, lens_;                 // the positions just read
  std::vector<std::vector<int32_t>> pos_, origin_;  // per row: positions, text indices
};

}  // namespace

absl::StatusOr<std::vector<EndlessText>> SampleEndlessTexts(runtime::ForwardPass& forward,
                                                            cache::BlockPool& pool,
                                                            const model::Tokenizer& tokenizer,
                                                            const EndlessTextOptions& options) {
  if (options.length < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("text length must be at least 2, got ", options.length));
  }
  const int context = forward.model().config.max_seq_len;
  const int32_t bos = tokenizer.bos_id();
  std::vector<EndlessText> texts;
  int story = 0;
  for (int i = 0; i < options.n_texts; ++i) {
    EndlessText text;
    while (static_cast<int>(text.tokens.size()) < options.length) {
      offline::GenerateOptions go;
      go.max_tokens = context - 1;
      go.sampling.temperature = options.temperature;
      go.sampling.seed = StorySeed(options.seed, story++);
      go.stop_token_ids = {bos, tokenizer.eos_id()};
      RECALL_ASSIGN_OR_RETURN(offline::GenerateResult r,
                              offline::Generate(forward, pool, tokenizer, {bos}, go));
      text.story_seeds.push_back(go.sampling.seed);
      if (r.finish_reason != offline::FinishReason::kStopToken) ++text.capped;
      text.tokens.push_back(bos);
      text.tokens.insert(text.tokens.end(), r.tokens.begin(), r.tokens.end());
    }
    text.tokens.resize(static_cast<size_t>(options.length));
    texts.push_back(std::move(text));
  }
  return texts;
}

absl::StatusOr<Nll> FullCacheNll(runtime::ForwardPass& forward, cache::BlockPool& pool,
                                 const std::vector<int32_t>& tokens, int n) {
  const int vocab = forward.model().config.vocab_size;
  n = std::min<int>(n, static_cast<int>(tokens.size()));
  if (n < 1 || n > forward.model().config.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("full cache over ", n, " tokens"));
  }
  RECALL_ASSIGN_OR_RETURN(std::unique_ptr<offline::LocalSequence> seq,
                          offline::LocalSequence::Create(forward, pool, std::nullopt));
  Nll nll(tokens.size(), kNaN);
  std::vector<float> logits(static_cast<size_t>(vocab));
  std::vector<double> scratch;
  RECALL_RETURN_IF_ERROR(seq->Prefill(std::span(tokens.data(), 1), 1, logits.data()));
  for (int t = 1; t < n; ++t) {
    if (t > 1) RECALL_RETURN_IF_ERROR(seq->Decode(tokens[t - 1], logits.data()));
    nll[t] = TargetNll(logits.data(), vocab, tokens[t], scratch);
  }
  return nll;
}

absl::StatusOr<CompactRun> TeacherForceCompact(runtime::ForwardPass& forward,
                                               cache::BlockPool& pool,
                                               const serving::SessionCacheSpec& spec,
                                               const std::vector<int32_t>& tokens) {
  const int vocab = forward.model().config.vocab_size;
  const int n = static_cast<int>(tokens.size());
  if (n < 2) return absl::InvalidArgumentError("a text needs at least 2 tokens");
  Stopwatch watch;
  RECALL_ASSIGN_OR_RETURN(
      std::unique_ptr<offline::LocalSequence> seq,
      offline::LocalSequence::Create(forward, pool, spec.evictor, spec.positions));
  if (!seq->endless()) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy ", spec.policy,
                     ": the session is not endless (its positions are original, or its policy "
                     "evicts at the first prompt only)"));
  }
  CompactRun run;
  run.nll.assign(tokens.size(), kNaN);
  std::vector<float> logits(static_cast<size_t>(vocab));
  std::vector<double> scratch;
  RECALL_RETURN_IF_ERROR(seq->Prefill(std::span(tokens.data(), 1), 1, logits.data()));
  run.peak_slots = seq->cache().max_length();
  run.nll[1] = TargetNll(logits.data(), vocab, tokens[1], scratch);
  SlotOrigins origins(seq->cache());
  const int context = forward.model().config.max_seq_len;
  double age_sum = 0;
  int64_t old_slots = 0, slots = 0;
  for (int t = 1; t + 1 < n; ++t) {
    const int32_t before = seq->next_position();
    const int32_t longest = seq->cache().max_length();
    run.peak_slots = std::max(run.peak_slots, longest + 1);
    RECALL_RETURN_IF_ERROR(seq->Decode(tokens[t], logits.data()));
    const bool compacted = seq->next_position() != before + 1;
    if (compacted) ++run.compactions;
    // LocalSequence re-positions to the longest row's length (its next token).
    origins.Update(seq->cache(), t, compacted ? longest : -1);
    if (t >= context) origins.AddAges(t, context, &age_sum, &old_slots, &slots);
    run.nll[t + 1] = TargetNll(logits.data(), vocab, tokens[t + 1], scratch);
  }
  if (slots > 0) {
    run.mean_age = age_sum / static_cast<double>(slots);
    run.share_older_than_context = static_cast<double>(old_slots) / static_cast<double>(slots);
  }
  const offline::SequenceStats stats = seq->stats();
  run.peak_kv_bytes = stats.peak_kv_bytes;
  run.evictions = stats.evictions;
  run.evicted_slots = stats.evicted_slots;
  run.seconds = watch.ElapsedSeconds();
  return run;
}

absl::StatusOr<Nll> SlidingWindowNll(runtime::ForwardPass& forward, cache::BlockPool& pool,
                                     const std::vector<int32_t>& tokens, int m) {
  const int vocab = forward.model().config.vocab_size;
  if (m < 1 || m > forward.model().config.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("window of ", m, " tokens"));
  }
  Nll nll(tokens.size(), kNaN);
  std::vector<float> logits(static_cast<size_t>(vocab));
  std::vector<double> scratch;
  const int chunk = std::min(m, forward.max_batch_tokens());
  for (size_t t = 1; t < tokens.size(); ++t) {
    const size_t start = t > static_cast<size_t>(m) ? t - m : 0;
    RECALL_ASSIGN_OR_RETURN(std::unique_ptr<offline::LocalSequence> seq,
                            offline::LocalSequence::Create(forward, pool, std::nullopt));
    RECALL_RETURN_IF_ERROR(
        seq->Prefill(std::span(tokens.data() + start, t - start), chunk, logits.data()));
    nll[t] = TargetNll(logits.data(), vocab, tokens[t], scratch);
  }
  return nll;
}

absl::StatusOr<StepTimes> TimeDecodeSteps(runtime::ForwardPass& forward, cache::BlockPool& pool,
                                          const serving::SessionCacheSpec& spec, int32_t bos,
                                          const StepTimeOptions& options) {
  const int vocab = forward.model().config.vocab_size;
  const int half = options.steps / 2;
  for (int c : options.centers) {
    if (c - half < 1 || c + half > options.tokens) {
      return absl::InvalidArgumentError(absl::StrCat("a window around token ", c, " needs ",
                                                     c + half, " tokens, have ", options.tokens));
    }
  }
  Stopwatch total;
  RECALL_ASSIGN_OR_RETURN(
      std::unique_ptr<offline::LocalSequence> seq,
      offline::LocalSequence::Create(forward, pool, spec.evictor, spec.positions));
  if (!seq->endless()) return absl::InvalidArgumentError("the session is not endless");
  kernels::SamplingParams sampling;
  sampling.temperature = 1.0f;
  sampling.seed = options.seed;
  kernels::Rng rng(options.seed);
  kernels::Backend& backend = forward.backend();
  std::vector<float> logits(static_cast<size_t>(vocab));
  const int32_t first = bos;
  RECALL_RETURN_IF_ERROR(seq->Prefill(std::span(&first, 1), 1, logits.data()));
  int32_t next = backend.Sample(logits.data(), vocab, sampling, rng, nullptr, 0);
  std::vector<std::vector<double>> ms(options.centers.size());
  StepTimes out;
  out.compactions.assign(options.centers.size(), 0);
  const RealClock& clock = RealClock::Get();
  for (int i = 1; i < options.tokens; ++i) {
    const int32_t before = seq->next_position();
    const int64_t t0 = clock.NowNanos();
    RECALL_RETURN_IF_ERROR(seq->Decode(next, logits.data()));
    next = backend.Sample(logits.data(), vocab, sampling, rng, nullptr, 0);
    const int64_t t1 = clock.NowNanos();
    const bool compacted = seq->next_position() != before + 1;
    out.compactions_total += compacted ? 1 : 0;
    for (size_t c = 0; c < options.centers.size(); ++c) {
      if (i >= options.centers[c] - half && i < options.centers[c] + half) {
        ms[c].push_back(static_cast<double>(t1 - t0) * 1e-6);
        out.compactions[c] += compacted ? 1 : 0;
      }
    }
  }
  for (std::vector<double>& v : ms) {
    std::sort(v.begin(), v.end());
    const size_t k = v.size();
    out.median_ms.push_back(k % 2 == 1 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]));
    double sum = 0;
    for (double x : v) sum += x;
    out.mean_ms.push_back(sum / static_cast<double>(k));
    out.max_ms.push_back(v.back());
  }
  out.peak_kv_bytes = seq->stats().peak_kv_bytes;
  out.seconds = total.ElapsedSeconds();
  return out;
}

double Perplexity(const std::vector<Nll>& per_text, int from, int to) {
  double sum = 0;
  int64_t count = 0;
  for (const Nll& nll : per_text) {
    for (int t = std::max(from, 0); t < std::min<int>(to, static_cast<int>(nll.size())); ++t) {
      sum += nll[t];
      ++count;
    }
  }
  return count == 0 ? kNaN : std::exp(sum / static_cast<double>(count));
}

}  // namespace recall::bench
