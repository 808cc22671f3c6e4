#include "cache/episodic/kmeans.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace recall::cache::episodic {
namespace {

using Points = std::vector<std::vector<float>>;

// Uniform in [0, 1) from the top 53 bits of one raw draw: identical on every platform.
double Uniform(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

double SquaredDistance(const std::vector<float>& p, const double* c) {
  double d = 0.0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double diff = static_cast<double>(p[i]) - c[i];
    d += diff * diff;
  }
  return d;
}

size_t CountDistinct(const Points& points) {
  std::vector<const std::vector<float>*> sorted;
  sorted.reserve(points.size());
  for (const auto& p : points) sorted.push_back(&p);
  std::sort(sorted.begin(), sorted.end(), [](const auto* a, const auto* b) { return *a < *b; });
  size_t distinct = 1;
  for (size_t i = 1; i < sorted.size(); ++i) distinct += *sorted[i] != *sorted[i - 1] ? 1 : 0;
  return distinct;
}

// One k-means run. Centroids are kept in double, flattened [k][dim].
class Run {
 public:
  Run(const Points& points, size_t k)
      : points_(points),
        n_(points.size()),
        dim_(points[0].size()),
        k_(k),
        centroids_(k * dim_, 0.0),
        assignment_(n_, -1),
        dist2_(n_, 0.0) {}

  // k-means++: REQUIRES k <= the number of distinct points, so the D^2 mass stays positive
  // until k distinct centres are chosen.
  void Seed(std::mt19937_64& rng) {
    std::vector<double> d2(n_, std::numeric_limits<double>::infinity());
    size_t chosen = std::min(n_ - 1, static_cast<size_t>(Uniform(rng) * static_cast<double>(n_)));
    for (size_t c = 0;; ++c) {
      const std::vector<float>& p = points_[chosen];
      std::copy(p.begin(), p.end(), centroids_.begin() + static_cast<ptrdiff_t>(c * dim_));
      if (c + 1 == k_) break;
      double total = 0.0;
      for (size_t i = 0; i < n_; ++i) {
        d2[i] = std::min(d2[i], SquaredDistance(points_[i], Centroid(c)));
        total += d2[i];
      }
      const double target = Uniform(rng) * total;
      double cumulative = 0.0;
      size_t last_positive = 0;
      chosen = n_;
      for (size_t i = 0; i < n_ && chosen == n_; ++i) {
        if (d2[i] <= 0.0) continue;
        last_positive = i;
        cumulative += d2[i];
        if (cumulative > target) chosen = i;
      }
      if (chosen == n_) chosen = last_positive;  // rounding left target just past the sum
    }
  }

  // Nearest centroid for every point (ties to the lower index). True if anything moved.
  bool Assign() {
    bool changed = false;
    for (size_t i = 0; i < n_; ++i) {
      int best = 0;
      double best_d = SquaredDistance(points_[i], Centroid(0));
      for (size_t c = 1; c < k_; ++c) {
        const double d = SquaredDistance(points_[i], Centroid(c));
        if (d < best_d) {
          best_d = d;
          best = static_cast<int>(c);
        }
      }
      changed |= assignment_[i] != best;
      assignment_[i] = best;
      dist2_[i] = best_d;
    }
    return changed;
  }

  // Centroids to their members' means; empty ones re-seeded at the farthest points.
  void Update() {
    std::vector<size_t> count(k_, 0);
    std::fill(centroids_.begin(), centroids_.end(), 0.0);
    for (size_t i = 0; i < n_; ++i) {
      const size_t c = static_cast<size_t>(assignment_[i]);
      ++count[c];
      double* sum = Centroid(c);
      for (size_t j = 0; j < dim_; ++j) sum[j] += points_[i][j];
    }
    bool any_empty = false;
    for (size_t c = 0; c < k_; ++c) {
      if (count[c] == 0) {
        any_empty = true;
        continue;
      }
      double* mean = Centroid(c);
      for (size_t j = 0; j < dim_; ++j) mean[j] /= static_cast<double>(count[c]);
    }
    if (!any_empty) return;
    std::vector<double> far(n_);
    for (size_t i = 0; i < n_; ++i) {
      far[i] = SquaredDistance(points_[i], Centroid(static_cast<size_t>(assignment_[i])));
    }
    for (size_t c = 0; c < k_; ++c) {
      if (count[c] != 0) continue;
      const size_t i = static_cast<size_t>(std::max_element(far.begin(), far.end()) - far.begin());
      std::copy(points_[i].begin(), points_[i].end(),
                centroids_.begin() + static_cast<ptrdiff_t>(c * dim_));
      far[i] = -1.0;  // not again for another empty cluster
    }
  }

  double Inertia() const {
    double sum = 0.0;
    for (double d : dist2_) sum += d;
    return sum;
  }

  // The result, with empty clusters dropped and the rest relabelled in order.
  KMeansResult Result() const {
    std::vector<size_t> count(k_, 0);
    for (int a : assignment_) ++count[static_cast<size_t>(a)];
    std::vector<int> label(k_, -1);
    KMeansResult r;
    for (size_t c = 0; c < k_; ++c) {
      if (count[c] == 0) continue;
      label[c] = static_cast<int>(r.centroids.size());
      const double* src = centroids_.data() + c * dim_;
      r.centroids.emplace_back(src, src + dim_);  // double -> float
    }
    r.assignment.reserve(n_);
    for (int a : assignment_) r.assignment.push_back(label[static_cast<size_t>(a)]);
    r.inertia = Inertia();
    return r;
  }

 private:
  double* Centroid(size_t c) { return centroids_.data() + c * dim_; }

  const Points& points_;
  const size_t n_;
  const size_t dim_;
  const size_t k_;
  std::vector<double> centroids_;  // [k][dim]
  std::vector<int> assignment_;    // [n]
  std::vector<double> dist2_;      // [n], to the assigned centroid after Assign
};

absl::Status Validate(const Points& points, const KMeansOptions& options) {
  if (options.k < 1) {
    return absl::InvalidArgumentError(absl::StrCat("kmeans: k must be >= 1, got ", options.k));
  }
  if (options.restarts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("kmeans: restarts must be >= 1, got ", options.restarts));
  }
  if (options.max_iterations < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("kmeans: max_iterations must be >= 1, got ", options.max_iterations));
  }
  if (points.empty()) return absl::InvalidArgumentError("kmeans: points must not be empty");
  const size_t dim = points[0].size();
  if (dim == 0) return absl::InvalidArgumentError("kmeans: points must have dimension >= 1");
  for (size_t i = 0; i < points.size(); ++i) {
    if (points[i].size() != dim) {
      return absl::InvalidArgumentError(absl::StrCat("kmeans: points[", i, "] has dimension ",
                                                     points[i].size(), ", points[0] has ", dim));
    }
    for (size_t j = 0; j < dim; ++j) {
      if (!std::isfinite(points[i][j])) {
        return absl::InvalidArgumentError(
            absl::StrCat("kmeans: points[", i, "][", j, "] is not finite: ", points[i][j]));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<KMeansResult> KMeans(const Points& points, const KMeansOptions& options) {
  if (absl::Status s = Validate(points, options); !s.ok()) return s;
  const size_t k = std::min(static_cast<size_t>(options.k), CountDistinct(points));
  std::mt19937_64 rng(options.seed);
  KMeansResult best;
  for (int r = 0; r < options.restarts; ++r) {
    Run run(points, k);
    run.Seed(rng);
    run.Assign();
    for (int it = 0; it < options.max_iterations; ++it) {
      run.Update();
      if (!run.Assign()) break;
    }
    if (r == 0 || run.Inertia() < best.inertia) best = run.Result();
  }
  return best;
}

}  // namespace recall::cache::episodic
