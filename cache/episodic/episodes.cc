#include "cache/episodic/episodes.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"

namespace recall::cache::episodic {

double CosineSimilarity(std::span<const float> a, std::span<const float> b) {
  RECALL_CHECK(a.size() == b.size())
      << "cosine of vectors of length " << a.size() << " and " << b.size();
  double dot = 0.0, na = 0.0, nb = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    dot += static_cast<double>(a[i]) * b[i];
    na += static_cast<double>(a[i]) * a[i];
    nb += static_cast<double>(b[i]) * b[i];
  }
  if (na == 0.0 || nb == 0.0) return 0.0;
  return dot / (std::sqrt(na) * std::sqrt(nb));
}

absl::StatusOr<std::vector<Episode>> BuildEpisodes(
    const std::vector<std::vector<float>>& window_embeddings, const KMeansOptions& options,
    int patch_windows) {
  if (patch_windows < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("episodes: patch_windows must be >= 1, got ", patch_windows));
  }
  RECALL_ASSIGN_OR_RETURN(KMeansResult clusters, KMeans(window_embeddings, options));
  std::vector<Episode> episodes(clusters.centroids.size());
  for (size_t e = 0; e < episodes.size(); ++e) {
    episodes[e].centroid = std::move(clusters.centroids[e]);
  }
  for (size_t w = 0; w < clusters.assignment.size(); ++w) {
    episodes[static_cast<size_t>(clusters.assignment[w])].windows.push_back(static_cast<int>(w));
  }
  for (Episode& episode : episodes) {
    std::vector<std::pair<double, int>> ranked;  // (cosine, window)
    ranked.reserve(episode.windows.size());
    for (int w : episode.windows) {
      ranked.emplace_back(
          CosineSimilarity(window_embeddings[static_cast<size_t>(w)], episode.centroid), w);
    }
    // Highest cosine first, ties to the earlier window.
    std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    const size_t keep = std::min(ranked.size(), static_cast<size_t>(patch_windows));
    for (size_t i = 0; i < keep; ++i) episode.patch.push_back(ranked[i].second);
    std::sort(episode.patch.begin(), episode.patch.end());
  }
  return episodes;
}

int RouteToEpisode(std::span<const float> query, const std::vector<Episode>& episodes) {
  bool all_zero = true;
  for (float v : query) {
    if (!std::isfinite(v)) return -1;
    all_zero = all_zero && v == 0.0f;
  }
  if (all_zero) return -1;
  int best = -1;
  double best_similarity = 0.0;
  for (size_t e = 0; e < episodes.size(); ++e) {
    if (episodes[e].windows.empty()) continue;
    const double s = CosineSimilarity(query, episodes[e].centroid);
    if (best < 0 || s > best_similarity) {
      best = static_cast<int>(e);
      best_similarity = s;
    }
  }
  return best;
}

std::string PatchedPrompt(const std::vector<Window>& windows, const Episode& episode) {
  std::string prompt;
  for (size_t i = 0; i < episode.patch.size(); ++i) {
    const int w = episode.patch[i];
    RECALL_CHECK(w >= 0 && static_cast<size_t>(w) < windows.size())
        << "patch window " << w << " of " << windows.size();
    if (i > 0) prompt += '\n';
    prompt += windows[static_cast<size_t>(w)].text;
  }
  return prompt;
}

}  // namespace recall::cache::episodic
