#include "bench/quality/episodic_eval.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bench/quality/batch_runs.h"
#include "cache/episodic/embedder.h"
#include "cache/episodic/episodes.h"
#include "cache/eviction/session_evictor.h"
#include "common/clock.h"
#include "common/status.h"
#include "worker/offline/episodic_sequence.h"
#include "worker/offline/sequence.h"
#include "worker/runtime/episodic/model_embedder.h"

namespace recall::bench {
namespace {

using offline::TokenSpan;

void LogSoftmax(const float* logits, int vocab, std::vector<double>* out) {
  out->resize(static_cast<size_t>(vocab));
  bench::LogSoftmax(logits, vocab, out->data());
}

bool IsStop(int32_t id, const model::Tokenizer& tokenizer) {
  return id == tokenizer.bos_id() || id == tokenizer.eos_id();
}

// Prefills `prompt` whole, then decodes greedily; `on_position(i, logits)` sees the logits that
// predict continuation token i. Stops after `max_new` tokens or a stop token (kept in out).
absl::Status Greedy(offline::Sequence& seq, const std::vector<int32_t>& prompt, int max_new,
                    int vocab, const model::Tokenizer& tokenizer, std::vector<int32_t>* out,
                    double* prefill_seconds,
                    const std::function<void(int, const float*)>& on_position) {
  std::vector<float> logits(static_cast<size_t>(vocab));
  Stopwatch watch;
  RECALL_RETURN_IF_ERROR(seq.Prefill(prompt, static_cast<int>(prompt.size()), logits.data()));
  *prefill_seconds = watch.ElapsedSeconds();
  out->clear();
  while (true) {
    if (on_position) on_position(static_cast<int>(out->size()), logits.data());
    const int32_t next = Argmax(logits.data(), vocab);
    out->push_back(next);
    if (IsStop(next, tokenizer) || static_cast<int>(out->size()) >= max_new) break;
    RECALL_RETURN_IF_ERROR(seq.Decode(next, logits.data()));
  }
  return absl::OkStatus();
}

// Prefills `prompt` and feeds `forced`; on_position(i, logits) sees the logits predicting
// forced[i].
absl::Status TeacherForce(offline::Sequence& seq, const std::vector<int32_t>& prompt,
                          const std::vector<int32_t>& forced, int vocab,
                          const std::function<void(int, const float*)>& on_position) {
  std::vector<float> logits(static_cast<size_t>(vocab));
  RECALL_RETURN_IF_ERROR(seq.Prefill(prompt, static_cast<int>(prompt.size()), logits.data()));
  for (size_t i = 0; i < forced.size(); ++i) {
    on_position(static_cast<int>(i), logits.data());
    if (i + 1 < forced.size()) RECALL_RETURN_IF_ERROR(seq.Decode(forced[i], logits.data()));
  }
  return absl::OkStatus();
}

std::string DecodeText(const std::vector<int32_t>& tokens, const model::Tokenizer& tokenizer) {
  std::vector<int32_t> ids = tokens;
  if (!ids.empty() && IsStop(ids.back(), tokenizer)) ids.pop_back();
  return tokenizer.Decode(ids, /*skip_special=*/true);
}

const cache::SequenceCache& ActiveCache(const offline::Sequence& seq) {
  if (const auto* e = dynamic_cast<const offline::EpisodicSequence*>(&seq)) {
    return e->cache();
  }
  return dynamic_cast<const offline::LocalSequence&>(seq).cache();
}

// Over every (layer, head) of `cache`: slots whose position lies in the prompt's stories
// (and below `limit`), per story.
struct Held {
  std::vector<int64_t> per_story;
  int max_slots = 0;  // most such slots in one (layer, head)
};

Held CountHeld(const cache::SequenceCache& cache, const StoryPrompt& prompt, int32_t limit,
               int n_layers, int n_kv_heads) {
  Held h;
  h.per_story.assign(prompt.stories.size(), 0);
  for (int l = 0; l < n_layers; ++l) {
    for (int kv = 0; kv < n_kv_heads; ++kv) {
      int slots = 0;
      for (int s = 0; s < cache.length(l, kv); ++s) {
        const int32_t p = cache.position(l, kv, s);
        if (p >= limit) continue;
        for (size_t st = 0; st < prompt.stories.size(); ++st) {
          if (p >= prompt.stories[st].begin && p < prompt.stories[st].end) {
            ++h.per_story[st];
            ++slots;
            break;
          }
        }
      }
      h.max_slots = std::max(h.max_slots, slots);
    }
  }
  return h;
}

double TargetShare(const Held& h, int target) {
  int64_t total = 0;
  for (int64_t c : h.per_story) total += c;
  return total > 0 ? static_cast<double>(h.per_story[target]) / total : 0;
}

// Keys of the history slots (position < limit) a cache keeps, sorted.
std::vector<int64_t> KeptKeys(const cache::SequenceCache& cache, int32_t limit, int n_layers,
                              int n_kv_heads) {
  std::vector<int64_t> keys;
  for (int l = 0; l < n_layers; ++l) {
    for (int kv = 0; kv < n_kv_heads; ++kv) {
      for (int s = 0; s < cache.length(l, kv); ++s) {
        const int32_t p = cache.position(l, kv, s);
        if (p < limit) keys.push_back((static_cast<int64_t>(l * n_kv_heads + kv) << 20) | p);
      }
    }
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

double Jaccard(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  std::vector<int64_t> both;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
  const size_t either = a.size() + b.size() - both.size();
  return either > 0 ? static_cast<double>(both.size()) / either : 1;
}

// EpiCache's windows, episodes and routing, replayed as EpisodicSequence::Prefill does them
// (same sentence split, windows, embedder, k-means options), to see which stories each
// episode was built for.
struct Replica {
  std::vector<cache::episodic::Window> windows;
  std::vector<cache::episodic::Episode> episodes;
  int active = -1;
};

absl::StatusOr<Replica> ReplayRouting(runtime::ForwardPass& forward,
                                      const model::Tokenizer& tokenizer, const StoryPrompt& prompt,
                                      const Method& method) {
  const offline::EpisodicOptions defaults;
  const std::vector<TokenSpan> spans = offline::SplitSentences(prompt.tokens, tokenizer);
  const int n = static_cast<int>(spans.size());
  const int recent = std::max(0, n - 1 - method.recent);
  Replica r;
  for (int first = 0; first < recent; first += defaults.window_utterances) {
    const int count = std::min(defaults.window_utterances, recent - first);
    std::vector<int32_t> ids(prompt.tokens.begin() + spans[first].begin,
                             prompt.tokens.begin() + spans[first + count - 1].end);
    r.windows.push_back({first, count, tokenizer.Decode(ids, /*skip_special=*/true)});
  }
  if (r.windows.size() < 2) return r;
  std::unique_ptr<cache::episodic::Embedder> embedder;
  if (method.embedder == "model") {
    runtime::episodic::ModelEmbedderOptions eo;
    eo.add_bos = tokenizer.bos_id() >= 0;
    eo.max_tokens = std::min(256, forward.model().config.max_seq_len - 1);
    RECALL_ASSIGN_OR_RETURN(embedder, runtime::episodic::ModelEmbedder::Create(
                                          forward.model(), forward.backend(), tokenizer, eo));
  } else {
    RECALL_ASSIGN_OR_RETURN(auto tfidf, cache::episodic::HashedTfIdfEmbedder::Create({}));
    std::vector<std::string> texts;
    for (const auto& w : r.windows) texts.push_back(w.text);
    tfidf->Fit(texts);
    embedder = std::move(tfidf);
  }
  std::vector<std::vector<float>> embeddings;
  for (const auto& w : r.windows) {
    RECALL_ASSIGN_OR_RETURN(std::vector<float> e, embedder->Embed(w.text));
    embeddings.push_back(std::move(e));
  }
  cache::episodic::KMeansOptions km;
  km.k = std::min<int>(defaults.episodes, static_cast<int>(r.windows.size()));
  km.restarts = defaults.restarts;
  km.seed = defaults.seed;
  RECALL_ASSIGN_OR_RETURN(r.episodes,
                          cache::episodic::BuildEpisodes(embeddings, km, defaults.patch_windows));
  std::vector<int32_t> query(prompt.tokens.begin() + spans[n - 1].begin, prompt.tokens.end());
  RECALL_ASSIGN_OR_RETURN(const std::vector<float> q,
                          embedder->Embed(tokenizer.Decode(query, /*skip_special=*/true)));
  r.active = cache::episodic::RouteToEpisode(q, r.episodes);
  if (r.active < 0) {  // the engine's fallback: the episode of the most recent window
    r.active = 0;
    const int last = static_cast<int>(r.windows.size()) - 1;
    for (size_t e = 0; e < r.episodes.size(); ++e) {
      const auto& w = r.episodes[e].windows;
      if (std::find(w.begin(), w.end(), last) != w.end()) r.active = static_cast<int>(e);
    }
  }
  return r;
}

absl::StatusOr<std::unique_ptr<offline::Sequence>> MakeSequence(runtime::ForwardPass& forward,
                                                                cache::BlockPool& pool,
                                                                const model::Tokenizer& tokenizer,
                                                                const Method& method,
                                                                const EvalSettings& settings) {
  if (method.kind == "full") {
    RECALL_ASSIGN_OR_RETURN(auto seq, offline::LocalSequence::Create(forward, pool, std::nullopt));
    return std::unique_ptr<offline::Sequence>(std::move(seq));
  }
  cache::eviction::SessionEvictorOptions eo;
  eo.policy.name = method.kind == "episodic" ? "lazy" : method.policy;
  eo.policy.window = settings.window;
  eo.policy.alpha = settings.alpha;
  eo.policy.sinks = settings.sinks;
  eo.budget.unit = cache::eviction::BudgetOptions::Unit::kTokens;
  eo.budget.budget = settings.budget;
  if (method.kind == "policy") {
    RECALL_ASSIGN_OR_RETURN(auto seq, offline::LocalSequence::Create(forward, pool, eo));
    return std::unique_ptr<offline::Sequence>(std::move(seq));
  }
  offline::EpisodicOptions o;
  o.decode = eo;
  o.episodes = settings.episodes;
  o.embedder = method.embedder;
  o.recent_utterances = method.recent;
  o.block.block_tokens = settings.block_tokens;
  RECALL_ASSIGN_OR_RETURN(auto seq, offline::EpisodicSequence::Create(forward, pool, tokenizer, o));
  return std::unique_ptr<offline::Sequence>(std::move(seq));
}

}  // namespace

absl::StatusOr<StoryPrompt> PreparePrompt(const Conversation& c, const model::Tokenizer& tokenizer,
                                          const std::string& separator) {
  const std::vector<Story>& pool = StoryPool();
  StoryPrompt p;
  const bool bos = separator == "bos";
  if (!bos && separator != "space") {
    return absl::InvalidArgumentError(
        absl::StrCat("separator: '", separator, "' is not one of space, bos"));
  }
  if (bos) {
    for (const std::string& segment : c.segments) {
      const std::vector<int32_t> ids = tokenizer.Encode(segment, /*add_bos=*/true);
      p.tokens.insert(p.tokens.end(), ids.begin(), ids.end());
    }
  } else {
    p.tokens = tokenizer.Encode(c.text, /*add_bos=*/true);
  }
  // A BOS inside the prompt is a "sentence" of its own to SplitSentences (its piece in
  // llama2.c vocabularies holds newlines); it belongs to no story here.
  std::vector<TokenSpan> spans;
  for (const TokenSpan& s : offline::SplitSentences(p.tokens, tokenizer)) {
    if (s.end - s.begin == 1 && p.tokens[static_cast<size_t>(s.begin)] == tokenizer.bos_id()) {
      continue;
    }
    spans.push_back(s);
  }
  size_t want = 1;
  for (int s : c.stories) want += pool[s].sentences.size();
  if (spans.size() != want) {
    return absl::InternalError(absl::StrCat("conversation '", c.text.substr(0, 60), "...': ",
                                            spans.size(), " sentences found, ", want, " written"));
  }
  size_t next = 0;
  for (int s : c.stories) {
    const size_t n = pool[s].sentences.size();
    p.stories.push_back({spans[next].begin, spans[next + n - 1].end});
    p.story_sentences.push_back({static_cast<int>(next), static_cast<int>(next + n)});
    next += n;
  }
  p.query = spans.back();
  p.target = c.target;
  const Story& target = pool[c.stories[c.target]];
  p.name = target.name;
  p.companion = target.companion;
  for (size_t i = 0; i < c.stories.size(); ++i) {
    if (static_cast<int>(i) == c.target) continue;
    p.other_names.push_back(pool[c.stories[i]].name);
    p.other_names.push_back(pool[c.stories[i]].companion);
  }
  p.name_ids = tokenizer.Encode(p.name, /*add_bos=*/false);
  p.companion_ids = tokenizer.Encode(p.companion, /*add_bos=*/false);
  const std::vector<std::string> rest(target.sentences.begin() + 1, target.sentences.end());
  // The query's part of the prompt, and the same part followed by the story's own text.
  const size_t query_start = bos ? p.tokens.size() - tokenizer.Encode(c.query, true).size() : 0;
  const std::vector<int32_t> head(p.tokens.begin() + static_cast<std::ptrdiff_t>(query_start),
                                  p.tokens.end());
  const std::vector<int32_t> whole =
      tokenizer.Encode((bos ? c.query : c.text) + " " + absl::StrJoin(rest, " "), /*add_bos=*/true);
  if (whole.size() <= head.size() || !std::equal(head.begin(), head.end(), whole.begin())) {
    return absl::InternalError(absl::StrCat("conversation '", c.text.substr(0, 60),
                                            "...': the prompt's tokens are not a prefix of the "
                                            "prompt and its story's continuation"));
  }
  p.original.assign(whole.begin() + static_cast<std::ptrdiff_t>(head.size()), whole.end());
  p.original_name_at = FindName(p.original, p.name_ids, tokenizer);
  p.original_companion_at = FindName(p.original, p.companion_ids, tokenizer);
  return p;
}

std::vector<int> FindName(const std::vector<int32_t>& tokens, const std::vector<int32_t>& ids,
                          const model::Tokenizer& tokenizer) {
  std::vector<int> at;
  const size_t k = ids.size();
  if (k == 0) return at;
  for (size_t i = 0; i + k <= tokens.size(); ++i) {
    if (!std::equal(ids.begin(), ids.end(), tokens.begin() + i)) continue;
    if (i + k < tokens.size()) {
      // The word must end with the name: "Tim" does not match the start of "Timmy".
      const std::string after = tokenizer.TokenBytes(tokens[i + k - 1], tokens[i + k]);
      if (!after.empty() && std::isalpha(static_cast<unsigned char>(after[0]))) continue;
    }
    at.push_back(static_cast<int>(i));
  }
  return at;
}

absl::StatusOr<Method> ParseMethod(const std::string& label, int default_recent) {
  Method m;
  m.label = label;
  if (label == "full") {
    m.kind = "full";
    return m;
  }
  if (!absl::StartsWith(label, "episodic-")) {
    if (label == "episodic") {
      return absl::InvalidArgumentError("methods: say episodic-model or episodic-tfidf");
    }
    m.kind = "policy";
    m.policy = label;
    return m;
  }
  m.kind = "episodic";
  m.recent = default_recent;
  std::string rest = label.substr(9);
  const size_t dash = rest.find("-r");
  if (dash != std::string::npos) {
    if (!absl::SimpleAtoi(rest.substr(dash + 2), &m.recent) || m.recent < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("methods: '", label, "': -r must give recent sentences >= 0"));
    }
    rest = rest.substr(0, dash);
  }
  m.embedder = rest;
  const auto& names = offline::EpisodicEmbedders();
  if (std::find(names.begin(), names.end(), rest) == names.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("methods: '", label, "': unknown embedder '", rest, "'"));
  }
  return m;
}

absl::StatusOr<Reference> RunReference(runtime::ForwardPass& forward, cache::BlockPool& pool,
                                       const model::Tokenizer& tokenizer, const StoryPrompt& prompt,
                                       int max_new) {
  const int vocab = forward.model().config.vocab_size;
  Reference r;
  std::vector<double> times;
  std::vector<float> logits(static_cast<size_t>(vocab));
  for (int rep = 0; rep < 2; ++rep) {  // two more one-shot prefills, for the median
    RECALL_ASSIGN_OR_RETURN(auto seq, offline::LocalSequence::Create(forward, pool, std::nullopt));
    Stopwatch watch;
    RECALL_RETURN_IF_ERROR(
        seq->Prefill(prompt.tokens, static_cast<int>(prompt.tokens.size()), logits.data()));
    times.push_back(watch.ElapsedSeconds());
  }
  RECALL_ASSIGN_OR_RETURN(auto seq, offline::LocalSequence::Create(forward, pool, std::nullopt));
  double prefill = 0;
  bool first = true;
  RECALL_RETURN_IF_ERROR(Greedy(*seq, prompt.tokens, max_new, vocab, tokenizer, &r.tokens, &prefill,
                                [&](int, const float* l) {
                                  if (first) r.prefill_kv_bytes = seq->stats().kv_bytes;
                                  first = false;
                                  r.logp.emplace_back();
                                  LogSoftmax(l, vocab, &r.logp.back());
                                }));
  times.push_back(prefill);
  std::sort(times.begin(), times.end());
  r.prefill_seconds = times[1];
  r.final_kv_bytes = seq->stats().kv_bytes;
  r.text = DecodeText(r.tokens, tokenizer);
  r.name_at = FindName(r.tokens, prompt.name_ids, tokenizer);
  r.companion_at = FindName(r.tokens, prompt.companion_ids, tokenizer);
  RECALL_ASSIGN_OR_RETURN(auto forced, offline::LocalSequence::Create(forward, pool, std::nullopt));
  std::vector<double> logp;
  RECALL_RETURN_IF_ERROR(
      TeacherForce(*forced, prompt.tokens, prompt.original, vocab, [&](int i, const float* l) {
        LogSoftmax(l, vocab, &logp);
        r.original_logp.push_back(logp[prompt.original[static_cast<size_t>(i)]]);
      }));
  return r;
}

absl::StatusOr<MethodRun> RunMethod(runtime::ForwardPass& forward, cache::BlockPool& pool,
                                    const model::Tokenizer& tokenizer, const StoryPrompt& prompt,
                                    const Reference& reference, const Method& method,
                                    const EvalSettings& settings) {
  const model::ModelConfig& mc = forward.model().config;
  const int vocab = mc.vocab_size;
  MethodRun run;
  const int32_t query_begin = prompt.query.begin;
  {
    RECALL_ASSIGN_OR_RETURN(auto seq, MakeSequence(forward, pool, tokenizer, method, settings));
    auto* episodic = dynamic_cast<offline::EpisodicSequence*>(seq.get());
    bool checked = false;
    RECALL_RETURN_IF_ERROR(Greedy(
        *seq, prompt.tokens, settings.max_new, vocab, tokenizer, &run.tokens, &run.prefill_seconds,
        [&](int, const float*) {
          if (checked || episodic == nullptr) return;
          checked = true;  // right after Prefill: every episode as built
          const offline::EpisodicStats& es = episodic->episodic_stats();
          run.clustered = es.active >= 0;
          run.active = es.active;
          run.routed_by_fallback = es.routed_by_fallback;
          run.embed_seconds = es.embed_seconds;
          run.build_seconds = es.build_seconds;
          run.build_peak_bytes = es.build_peak_bytes;
          run.history_tokens = es.history_tokens;
          run.recent_tokens = es.recent_tokens;
          for (size_t e = 0; e < episodic->caches().size() && run.clustered; ++e) {
            const Held h = CountHeld(*episodic->caches()[e], prompt, es.history_tokens, mc.n_layers,
                                     mc.n_kv_heads);
            EpisodeCheck c;
            c.target_share = TargetShare(h, prompt.target);
            for (size_t st = 0; st < h.per_story.size(); ++st) {
              c.story_shares.push_back(TargetShare(h, static_cast<int>(st)));
            }
            c.max_history_slots = h.max_slots;
            c.dominant_story = static_cast<int>(
                std::max_element(h.per_story.begin(), h.per_story.end()) - h.per_story.begin());
            c.kv_bytes = es.episodes[e].kv_bytes;
            c.resident = es.episodes[e].resident;
            run.episodes.push_back(c);
          }
          if (!run.clustered) return;
          std::vector<std::vector<int64_t>> kept;
          for (const auto& cache : episodic->caches()) {
            kept.push_back(KeptKeys(*cache, es.history_tokens, mc.n_layers, mc.n_kv_heads));
          }
          double sum = 0;
          int pairs = 0;
          for (size_t a = 0; a < kept.size(); ++a) {
            for (size_t b = a + 1; b < kept.size(); ++b, ++pairs) sum += Jaccard(kept[a], kept[b]);
          }
          run.episode_overlap = pairs > 0 ? sum / pairs : 1;
        }));
    const offline::SequenceStats st = seq->stats();
    run.peak_kv_bytes = st.peak_kv_bytes;
    run.final_kv_bytes = st.kv_bytes;
    run.target_share_end =
        TargetShare(CountHeld(ActiveCache(*seq), prompt, query_begin, mc.n_layers, mc.n_kv_heads),
                    prompt.target);
  }
  run.text = DecodeText(run.tokens, tokenizer);

  RECALL_ASSIGN_OR_RETURN(auto seq, MakeSequence(forward, pool, tokenizer, method, settings));
  std::vector<double> logp;
  RECALL_RETURN_IF_ERROR(
      TeacherForce(*seq, prompt.tokens, reference.tokens, vocab, [&](int i, const float* l) {
        LogSoftmax(l, vocab, &logp);
        const std::vector<double>& full = reference.logp[static_cast<size_t>(i)];
        double kl = 0;
        for (int v = 0; v < vocab; ++v) kl += std::exp(full[v]) * (full[v] - logp[v]);
        run.kl_sum += std::max(0.0, kl);
        const int32_t want = reference.tokens[static_cast<size_t>(i)];
        run.ref_logp.push_back(logp[want]);
        run.top1 += Argmax(l, vocab) == want ? 1 : 0;
        ++run.positions;
      }));
  run.tf_final_kv_bytes = seq->stats().kv_bytes;
  run.total_kv_bytes = run.tf_final_kv_bytes;
  for (const EpisodeCheck& c : run.episodes) {
    if (!c.resident) run.total_kv_bytes += c.kv_bytes;
  }
  if (auto* e = dynamic_cast<offline::EpisodicSequence*>(seq.get())) {
    run.embed_seconds = 0.5 * (run.embed_seconds + e->episodic_stats().embed_seconds);
    run.build_seconds = 0.5 * (run.build_seconds + e->episodic_stats().build_seconds);
  }

  RECALL_ASSIGN_OR_RETURN(auto own, MakeSequence(forward, pool, tokenizer, method, settings));
  RECALL_RETURN_IF_ERROR(
      TeacherForce(*own, prompt.tokens, prompt.original, vocab, [&](int i, const float* l) {
        LogSoftmax(l, vocab, &logp);
        run.original_logp.push_back(logp[prompt.original[static_cast<size_t>(i)]]);
      }));

  if (run.clustered) {
    RECALL_ASSIGN_OR_RETURN(const Replica replica,
                            ReplayRouting(forward, tokenizer, prompt, method));
    run.replica_active = replica.active;
    run.windows = static_cast<int>(replica.windows.size());
    const auto [t_first, t_end] = prompt.story_sentences[static_cast<size_t>(prompt.target)];
    for (size_t e = 0; e < replica.episodes.size() && e < run.episodes.size(); ++e) {
      EpisodeCheck& c = run.episodes[e];
      c.windows = replica.episodes[e].windows;
      for (int w : c.windows) {
        const auto& win = replica.windows[static_cast<size_t>(w)];
        if (win.first < t_end && win.first + win.count > t_first) c.has_target_window = true;
      }
    }
    run.routed_to_target_window = run.active >= 0 &&
                                  run.active < static_cast<int>(run.episodes.size()) &&
                                  run.episodes[static_cast<size_t>(run.active)].has_target_window;
  }
  return run;
}

}  // namespace recall::bench
