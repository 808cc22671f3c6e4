#include "worker/runtime/episodic/episode_set.h"

#include <algorithm>

#include "common/clock.h"
#include "common/status.h"

namespace recall::runtime::episodic {

namespace ep = cache::episodic;

absl::StatusOr<EpisodeSet> BuildEpisodeSet(ForwardPass& forward, cache::BlockPool& pool,
                                           const model::Tokenizer& tokenizer,
                                           ep::Embedder& embedder,
                                           const std::vector<ep::Window>& windows,
                                           std::span<const int32_t> history,
                                           std::span<const int32_t> budgets,
                                           const EpisodeBuildOptions& options) {
  if (windows.empty()) return absl::InvalidArgumentError("windows: none to cluster");
  EpisodeSet set;
  Stopwatch watch;
  if (auto* tfidf = dynamic_cast<ep::HashedTfIdfEmbedder*>(&embedder)) {
    std::vector<std::string> texts;
    for (const ep::Window& w : windows) texts.push_back(w.text);
    tfidf->Fit(texts);
  }
  std::vector<std::vector<float>> embeddings;
  for (const ep::Window& w : windows) {
    RECALL_ASSIGN_OR_RETURN(std::vector<float> e, embedder.Embed(w.text));
    embeddings.push_back(std::move(e));
  }
  ep::KMeansOptions km;
  km.k = std::min<int>(options.episodes, static_cast<int>(windows.size()));
  km.restarts = options.restarts;
  km.seed = options.seed;
  RECALL_ASSIGN_OR_RETURN(set.episodes, ep::BuildEpisodes(embeddings, km, options.patch_windows));
  set.embed_seconds = watch.ElapsedSeconds();
  watch.Reset();
  for (const ep::Episode& episode : set.episodes) {
    // The instruction, then the windows' text. A patch must leave room for history in a
    // block: past half a block the windows' text loses its beginning; the instruction is
    // kept whole when it takes at most half of that room, else left out.
    std::vector<int32_t> patch = tokenizer.Encode(options.instruction, /*add_bos=*/false);
    std::vector<int32_t> text =
        tokenizer.Encode(ep::PatchedPrompt(windows, episode), /*add_bos=*/false);
    const size_t max_patch = static_cast<size_t>(options.block.block_tokens / 2);
    if (patch.size() > max_patch / 2) patch.clear();  // no room for it beside the text
    const size_t room = max_patch - patch.size();
    if (text.size() > room) text.erase(text.begin(), text.end() - room);
    patch.insert(patch.end(), text.begin(), text.end());
    if (patch.empty()) return absl::InternalError("episodic: an episode's patched prompt is empty");
    set.caches.push_back(std::make_unique<cache::SequenceCache>(&pool));
    RECALL_ASSIGN_OR_RETURN(
        const BlockPrefillStats built,
        BlockwisePrefill(forward, set.caches.back().get(), history, patch, budgets, options.block));
    set.build_peak_bytes = std::max(set.build_peak_bytes, built.peak_bytes);
    set.caches.back()->OffloadToHost();
    set.patches.push_back(std::move(patch));
  }
  set.build_seconds = watch.ElapsedSeconds();
  return set;
}

int RouteOrFallBack(std::span<const float> query, const std::vector<ep::Episode>& episodes,
                    int fallback_window, bool* fell_back) {
  const int e = ep::RouteToEpisode(query, episodes);
  *fell_back = e < 0;
  if (e >= 0) return e;
  for (size_t i = 0; i < episodes.size(); ++i) {
    const std::vector<int>& w = episodes[i].windows;
    if (std::find(w.begin(), w.end(), fallback_window) != w.end()) return static_cast<int>(i);
  }
  return 0;
}

}  // namespace recall::runtime::episodic
