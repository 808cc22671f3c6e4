// Episodes: clusters of conversation windows, their patched prompts, and query routing
// (EpiCache steps 3, 4 and the online routing).
//
// BuildEpisodes clusters the window embeddings with KMeans (kmeans.h) and returns one Episode
// per cluster found (at most options.k; fewer when there are fewer distinct embeddings), in
// KMeans' label order. Each episode has at least one window. Its patch is the up-to
// `patch_windows` MEMBER windows with the highest cosine similarity to the centroid (ties to
// the earlier window), listed in chronological (ascending) order; EpiCache uses 8. The
// patched prompt (PatchedPrompt) is their text joined by "\n"; the caller prefixes its own
// instruction before running it as queries.
//
// Cosine similarity here: dot(a, b) / (|a| |b|), and 0 when either vector is all zeros.
// Centroids are the k-means means (not normalised); cosine does not care.
//
// RouteToEpisode picks the episode whose centroid is most cosine-similar to the query
// embedding (ties to the lower index), skipping episodes with no windows. It returns -1 when
// no episode has windows, or the query is all zeros (e.g. a turn with no words under the
// lexical embedder) or not finite; the caller then falls back, e.g. to the most recent
// episode.
//
// Pure functions; thread safe.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/episodic/kmeans.h"
#include "cache/episodic/segment.h"

namespace recall::cache::episodic {

struct Episode {
  std::vector<float> centroid;  // [dim]
  std::vector<int> windows;     // member windows, ascending
  std::vector<int> patch;       // the <= patch_windows members nearest the centroid, ascending
};

// Cosine similarity; 0 if either vector is all zeros. REQUIRES: a.size() == b.size().
double CosineSimilarity(std::span<const float> a, std::span<const float> b);

// window_embeddings: [n_windows][dim], in chronological order. Errors: those of KMeans, and
// InvalidArgument if patch_windows < 1.
absl::StatusOr<std::vector<Episode>> BuildEpisodes(
    const std::vector<std::vector<float>>& window_embeddings, const KMeansOptions& options,
    int patch_windows = 8);

// REQUIRES: every non-empty episode's centroid has query.size() elements.
int RouteToEpisode(std::span<const float> query, const std::vector<Episode>& episodes);

// REQUIRES: every index in episode.patch is < windows.size().
std::string PatchedPrompt(const std::vector<Window>& windows, const Episode& episode);

}  // namespace recall::cache::episodic
