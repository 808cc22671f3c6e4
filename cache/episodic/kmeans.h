// K-means clustering of window embeddings into episodes (EpiCache step 3).
//
// Algorithm, per restart: k-means++ seeding (first centre uniform, each next one drawn with
// probability proportional to the squared distance to the nearest chosen centre), then Lloyd
// iterations (assign every point to its nearest centroid, ties to the lower index; move each
// centroid to its members' mean) until the assignment stops changing or max_iterations
// updates have run. A centroid left with no members is re-seeded at the point farthest from
// its own centroid (ties to the lower index). `restarts` runs draw from one std::mt19937_64
// seeded with `seed`, one after another; the run with the lowest inertia (sum of squared
// Euclidean distances to the assigned centroids) wins, ties to the earlier run. Uniform draws
// are taken from the raw 64-bit output (no <random> distributions), so a seed gives the same
// result with every standard library; adding restarts never increases the inertia (the first
// R runs are the same whatever `restarts` is).
//
// k is clamped to the number of distinct points, so the result may have fewer centroids than
// k; empty clusters are dropped from the result (relabelled in order), so every returned
// centroid has at least one member. Labels follow the seeding order, not any geometry.
//
// Errors: InvalidArgument naming the field for no points, points of dimension 0, ragged
// dimensions, non-finite values, k < 1, restarts < 1, max_iterations < 1.
//
// A pure function; thread safe. O(restarts * iterations * n * k * dim) time.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace recall::cache::episodic {

struct KMeansOptions {
  int k = 4;                 // clusters wanted (EpiCache's E), >= 1
  int restarts = 10;         // independent k-means++ runs, >= 1
  int max_iterations = 100;  // Lloyd updates per run, >= 1
  uint64_t seed = 1;
};

struct KMeansResult {
  std::vector<std::vector<float>> centroids;  // [k' <= k][dim], k' = clusters found
  std::vector<int> assignment;                // [n], each in [0, k')
  double inertia = 0.0;                       // sum of squared distances to the centroids
};

absl::StatusOr<KMeansResult> KMeans(const std::vector<std::vector<float>>& points,
                                    const KMeansOptions& options);

}  // namespace recall::cache::episodic
