#include "worker/offline/episodic_sequence.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "worker/offline/sentences.h"
#include "worker/runtime/episodic/model_embedder.h"

namespace recall::offline {
namespace {

namespace ep = cache::episodic;
namespace ev = cache::eviction;

absl::Status ValidateOptions(const EpisodicOptions& o) {
  const auto at_least = [](const char* field, int value, int min) -> absl::Status {
    if (value >= min) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", value, " must be >= ", min));
  };
  RECALL_RETURN_IF_ERROR(at_least("episodes", o.episodes, 1));
  RECALL_RETURN_IF_ERROR(at_least("window_utterances", o.window_utterances, 1));
  RECALL_RETURN_IF_ERROR(at_least("patch_windows", o.patch_windows, 1));
  RECALL_RETURN_IF_ERROR(at_least("recent_utterances", o.recent_utterances, 0));
  RECALL_RETURN_IF_ERROR(at_least("block_tokens", o.block.block_tokens, 2));
  RECALL_RETURN_IF_ERROR(at_least("restarts", o.restarts, 1));
  const std::vector<std::string>& names = EpisodicEmbedders();
  if (std::find(names.begin(), names.end(), o.embedder) == names.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("embedder: '", o.embedder, "' is not one of ", absl::StrJoin(names, ", ")));
  }
  return absl::OkStatus();
}

}  // namespace

const std::vector<std::string>& EpisodicEmbedders() {
  static const std::vector<std::string> names = {"model", "tfidf"};
  return names;
}

EpisodicSequence::EpisodicSequence(runtime::ForwardPass& forward, cache::BlockPool& pool,
                                   const model::Tokenizer& tokenizer,
                                   const EpisodicOptions& options, ev::BudgetAllocator budgets)
    : forward_(forward),
      pool_(pool),
      tokenizer_(tokenizer),
      options_(options),
      budgets_(std::move(budgets)) {}

absl::StatusOr<std::unique_ptr<EpisodicSequence>> EpisodicSequence::Create(
    runtime::ForwardPass& forward, cache::BlockPool& pool, const model::Tokenizer& tokenizer,
    const EpisodicOptions& options) {
  RECALL_RETURN_IF_ERROR(ValidateOptions(options));
  const model::ModelConfig& config = forward.model().config;
  EpisodicOptions o = options;
  o.decode.n_heads = config.n_heads;
  o.block.chunk = std::min(o.block.chunk, forward.max_batch_tokens());
  {
    // The decode options are checked now, on an empty cache, rather than after the build.
    cache::SequenceCache probe(&pool);
    RECALL_ASSIGN_OR_RETURN(std::unique_ptr<ev::SessionEvictor> evictor,
                            ev::SessionEvictor::Create(o.decode, &probe));
    if (evictor->policy().compresses_prefill()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "policy: ", evictor->policy().name(),
          " compresses the prompt; episodic decodes with a decode-time policy such as lazy"));
    }
    o.decode.budget.reserved = std::max(o.decode.budget.reserved, evictor->policy().min_budget());
  }
  RECALL_ASSIGN_OR_RETURN(ev::BudgetAllocator budgets,
                          ev::BudgetAllocator::Create(o.decode.budget, config.n_layers));
  std::unique_ptr<EpisodicSequence> seq(
      new EpisodicSequence(forward, pool, tokenizer, o, std::move(budgets)));
  if (o.embedder == "model") {
    runtime::episodic::ModelEmbedderOptions eo;
    eo.add_bos = tokenizer.bos_id() >= 0;
    eo.max_tokens = std::min(256, config.max_seq_len - 1);
    RECALL_ASSIGN_OR_RETURN(seq->embedder_, runtime::episodic::ModelEmbedder::Create(
                                                forward.model(), forward.backend(), tokenizer, eo));
  } else {
    RECALL_ASSIGN_OR_RETURN(seq->embedder_, ep::HashedTfIdfEmbedder::Create({}));
  }
  return seq;
}

absl::Status EpisodicSequence::Prefill(std::span<const int32_t> prompt, int chunk, float* logits) {
  if (!caches_.empty()) return absl::FailedPreconditionError("Prefill: called twice");
  const std::vector<TokenSpan> spans = SplitSentences(prompt, tokenizer_);
  const int n = static_cast<int>(spans.size());
  // The query: the last sentence, extended back over short ones ("A:" after a question) to
  // kMinQueryTokens tokens. Utterances before `recent` are the history to compress; the
  // recent ones and the query are prefilled as they are.
  int query_first = std::max(0, n - 1);
  while (query_first > 0 &&
         spans[static_cast<size_t>(n - 1)].end - spans[static_cast<size_t>(query_first)].begin <
             kMinQueryTokens) {
    --query_first;
  }
  const int recent = std::max(0, query_first - options_.recent_utterances);
  const int history_end = n == 0 ? 0 : spans[recent].begin;
  std::vector<ep::Window> windows;
  for (int first = 0; first < recent; first += options_.window_utterances) {
    const int count = std::min(options_.window_utterances, recent - first);
    const int end = spans[first + count - 1].end;
    std::vector<int32_t> ids(prompt.begin() + spans[first].begin, prompt.begin() + end);
    windows.push_back({first, count, tokenizer_.Decode(ids, /*skip_special=*/true)});
  }
  std::vector<int32_t> layer_budgets(static_cast<size_t>(forward_.model().config.n_layers));
  budgets_.Allocate(history_end, layer_budgets.data());
  const bool over = std::any_of(layer_budgets.begin(), layer_budgets.end(),
                                [&](int32_t b) { return b < history_end; });
  if (windows.size() < 2 || !over) {
    caches_.push_back(std::make_unique<cache::SequenceCache>(&pool_));
    stats_.recent_tokens = static_cast<int>(prompt.size());
    RECALL_ASSIGN_OR_RETURN(active_,
                            LocalSequence::CreateOn(forward_, caches_[0].get(), options_.decode));
    return active_->Prefill(prompt, chunk, logits);
  }
  const std::span<const int32_t> history = prompt.first(static_cast<size_t>(history_end));
  stats_.history_tokens = history_end;
  stats_.recent_tokens = static_cast<int>(prompt.size()) - history_end;
  runtime::episodic::EpisodeBuildOptions build;
  build.episodes = options_.episodes;
  build.patch_windows = options_.patch_windows;
  build.instruction = options_.instruction;
  build.block = options_.block;
  build.seed = options_.seed;
  build.restarts = options_.restarts;
  RECALL_ASSIGN_OR_RETURN(
      runtime::episodic::EpisodeSet set,
      runtime::episodic::BuildEpisodeSet(forward_, pool_, tokenizer_, *embedder_, windows, history,
                                         layer_budgets, build));
  stats_.embed_seconds = set.embed_seconds;
  stats_.build_seconds = set.build_seconds;
  stats_.build_peak_bytes = set.build_peak_bytes;
  for (size_t e = 0; e < set.episodes.size(); ++e) {
    stats_.episodes.push_back(
        {set.episodes[e].windows, static_cast<int>(set.patches[e].size()), 0, false});
  }
  caches_ = std::move(set.caches);
  episodes_ = std::move(set.episodes);
  const std::vector<int32_t> query(prompt.begin() + spans[static_cast<size_t>(query_first)].begin,
                                   prompt.end());
  RECALL_ASSIGN_OR_RETURN(const std::vector<float> q,
                          embedder_->Embed(tokenizer_.Decode(query, /*skip_special=*/true)));
  active_cache_ = runtime::episodic::RouteOrFallBack(
      q, episodes_, static_cast<int>(windows.size()) - 1, &stats_.routed_by_fallback);
  stats_.active = active_cache_;
  RECALL_RETURN_IF_ERROR(caches_[active_cache_]->RestoreFromHost());
  RECALL_ASSIGN_OR_RETURN(
      active_, LocalSequence::CreateOn(forward_, caches_[active_cache_].get(), options_.decode));
  RECALL_RETURN_IF_ERROR(
      active_->Prefill(prompt.subspan(static_cast<size_t>(history_end)), chunk, logits));
  for (size_t e = 0; e < caches_.size(); ++e) {
    EpisodeInfo& info = stats_.episodes[e];
    info.resident = static_cast<int>(e) == active_cache_;
    info.kv_bytes = info.resident ? caches_[e]->bytes_held() : caches_[e]->host_bytes();
  }
  return absl::OkStatus();
}

absl::Status EpisodicSequence::Decode(int32_t token, float* logits) {
  if (active_ == nullptr) return absl::FailedPreconditionError("Decode: before Prefill");
  return active_->Decode(token, logits);
}

int32_t EpisodicSequence::next_position() const {
  return caches_.empty() ? 0 : caches_[active_cache_]->next_position();
}

SequenceStats EpisodicSequence::stats() const {
  if (active_ == nullptr) return SequenceStats{};
  SequenceStats s = active_->stats();
  s.peak_kv_bytes = std::max(s.peak_kv_bytes, stats_.build_peak_bytes);
  return s;
}

}  // namespace recall::offline
