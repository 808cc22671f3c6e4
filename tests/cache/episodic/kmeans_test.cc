#include "cache/episodic/kmeans.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace recall::cache::episodic {
namespace {

using Points = std::vector<std::vector<float>>;

double Uniform(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// Standard normal by Box-Muller over raw draws (same numbers with every standard library).
double Gaussian(std::mt19937_64& rng) {
  const double u1 = 1.0 - Uniform(rng);  // (0, 1]
  const double u2 = Uniform(rng);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

// n points in `clusters` Gaussian blobs (sigma 0.3) around centres uniform in [-10, 10]^dim;
// point i belongs to blob i % clusters, so the blobs interleave.
Points Blobs(int n, int clusters, int dim, uint64_t seed, std::vector<int>* truth) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<double>> centres(clusters, std::vector<double>(dim));
  for (auto& c : centres) {
    for (double& x : c) x = 20.0 * Uniform(rng) - 10.0;
  }
  Points points;
  truth->clear();
  for (int i = 0; i < n; ++i) {
    std::vector<float> p(dim);
    for (int j = 0; j < dim; ++j)
      p[j] = static_cast<float>(centres[i % clusters][j] + 0.3 * Gaussian(rng));
    points.push_back(std::move(p));
    truth->push_back(i % clusters);
  }
  return points;
}

// True if the two labellings induce the same partition (equal up to renaming labels).
bool SamePartition(const std::vector<int>& a, const std::vector<int>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t j = 0; j < a.size(); ++j) {
      if ((a[i] == a[j]) != (b[i] == b[j])) return false;
    }
  }
  return true;
}

double SquaredDistance(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0.0;
  for (size_t i = 0; i < a.size(); ++i) d += (static_cast<double>(a[i]) - b[i]) * (a[i] - b[i]);
  return d;
}

// Checks the Lloyd fixed point: every cluster non-empty, every centroid the mean of its
// members, every point assigned to a nearest centroid, inertia the sum of squared distances.
void ExpectLloydFixedPoint(const Points& points, const KMeansResult& r) {
  const size_t k = r.centroids.size();
  const size_t dim = points[0].size();
  std::vector<std::vector<double>> mean(k, std::vector<double>(dim, 0.0));
  std::vector<int> count(k, 0);
  double inertia = 0.0;
  ASSERT_EQ(r.assignment.size(), points.size());
  for (size_t i = 0; i < points.size(); ++i) {
    const int a = r.assignment[i];
    ASSERT_GE(a, 0);
    ASSERT_LT(a, static_cast<int>(k));
    ++count[a];
    for (size_t j = 0; j < dim; ++j) mean[a][j] += points[i][j];
    const double own = SquaredDistance(points[i], r.centroids[a]);
    inertia += own;
    for (size_t c = 0; c < k; ++c) {
      EXPECT_LE(own, SquaredDistance(points[i], r.centroids[c]) * (1 + 1e-6) + 1e-9)
          << "point " << i << " is nearer centroid " << c << " than its own " << a;
    }
  }
  for (size_t c = 0; c < k; ++c) {
    EXPECT_GT(count[c], 0) << "cluster " << c << " is empty";
    for (size_t j = 0; j < dim; ++j) {
      EXPECT_NEAR(r.centroids[c][j], mean[c][j] / count[c], 1e-4) << "cluster " << c;
    }
  }
  EXPECT_NEAR(r.inertia, inertia, 1e-6 * (1.0 + inertia));
}

// Scenario: 40 points in 16 dimensions, 4 well-separated interleaved blobs, k = 4: the
// clusters found are exactly the blobs.
TEST(KMeansTest, RecoversFourSeparatedBlobsExactly) {
  std::vector<int> truth;
  const Points points = Blobs(40, 4, 16, 42, &truth);
  absl::StatusOr<KMeansResult> r = KMeans(points, KMeansOptions{});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->centroids.size(), 4u);
  EXPECT_TRUE(SamePartition(r->assignment, truth));
  ExpectLloydFixedPoint(points, *r);
}

TEST(KMeansTest, SameSeedGivesIdenticalResult) {
  std::vector<int> truth;
  const Points points = Blobs(60, 5, 8, 3, &truth);
  KMeansOptions o;
  o.k = 3;  // fewer clusters than blobs: the answer depends on the seeding
  o.seed = 99;
  absl::StatusOr<KMeansResult> a = KMeans(points, o);
  absl::StatusOr<KMeansResult> b = KMeans(points, o);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->centroids, b->centroids);
  EXPECT_EQ(a->assignment, b->assignment);
  EXPECT_EQ(a->inertia, b->inertia);
}

// Scenario: unstructured points, k = 6; restarts r = 1..20 with one seed. Runs are drawn in
// sequence from one generator, so more restarts only add candidates: the inertia never
// increases. Every result is a Lloyd fixed point with no empty cluster.
TEST(KMeansTest, MoreRestartsNeverIncreaseInertia) {
  std::mt19937_64 rng(5);
  Points points(50, std::vector<float>(3));
  for (auto& p : points) {
    for (float& x : p) x = static_cast<float>(Uniform(rng));
  }
  KMeansOptions o;
  o.k = 6;
  double previous = std::numeric_limits<double>::infinity();
  for (int restarts = 1; restarts <= 20; ++restarts) {
    o.restarts = restarts;
    absl::StatusOr<KMeansResult> r = KMeans(points, o);
    ASSERT_TRUE(r.ok());
    EXPECT_LE(r->inertia, previous) << restarts << " restarts";
    previous = r->inertia;
    ExpectLloydFixedPoint(points, *r);
  }
}

// Scenario: many small problems on an integer grid (duplicates, distance ties), k close to n:
// every result is a Lloyd fixed point whose clusters are all non-empty.
TEST(KMeansTest, ManySeedsGiveNonEmptyFixedPoints) {
  for (uint64_t seed = 0; seed < 40; ++seed) {
    std::mt19937_64 rng(seed);
    Points points(12, std::vector<float>(2));
    for (auto& p : points) {
      for (float& x : p) x = static_cast<float>(std::floor(Uniform(rng) * 8.0));
    }
    KMeansOptions o;
    o.k = 5;
    o.restarts = 3;
    o.seed = seed;
    absl::StatusOr<KMeansResult> r = KMeans(points, o);
    ASSERT_TRUE(r.ok());
    SCOPED_TRACE("seed " + std::to_string(seed));
    ExpectLloydFixedPoint(points, *r);
  }
}

// Scenario (found by search; the run is fixed by the seed): with one restart, seed 4258 and
// k = 3, a Lloyd update leaves cluster 1 empty. It is re-seeded at the point farthest from
// its centroid, (19, 5), which ends as a singleton: clusters {0, 1, 4, 8}, {2}, {3, 5, 6, 7}
// with means (3.25, 12.25), (19, 5), (11.75, 3.75) and inertia 59.5 + 0 + 51.5 = 111
// (a local optimum: the 10-restart default finds 97.33).
TEST(KMeansTest, EmptyClusterIsReseededAtTheFarthestPoint) {
  const Points points = {{6, 17}, {5, 13}, {19, 5}, {10, 1}, {1, 9},
                         {12, 0}, {14, 7}, {11, 7}, {1, 10}};
  KMeansOptions o;
  o.k = 3;
  o.restarts = 1;
  o.seed = 4258;
  absl::StatusOr<KMeansResult> r = KMeans(points, o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->assignment, (std::vector<int>{0, 0, 1, 2, 0, 2, 2, 2, 0}));
  EXPECT_EQ(r->centroids, (Points{{3.25f, 12.25f}, {19, 5}, {11.75f, 3.75f}}));
  EXPECT_EQ(r->inertia, 111.0);
  o.restarts = 10;
  o.seed = 1;
  r = KMeans(points, o);
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->inertia, 97.0 + 1.0 / 3.0, 1e-9);
}

// Scenario: 9 points with 3 distinct values, k = 5: k is clamped to 3, inertia 0.
TEST(KMeansTest, KIsClampedToTheNumberOfDistinctPoints) {
  const Points points = {{0, 0}, {5, 5}, {0, 0}, {9, 1}, {5, 5}, {0, 0}, {9, 1}, {9, 1}, {5, 5}};
  KMeansOptions o;
  o.k = 5;
  absl::StatusOr<KMeansResult> r = KMeans(points, o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->centroids.size(), 3u);
  EXPECT_EQ(r->inertia, 0.0);
  EXPECT_TRUE(SamePartition(r->assignment, {0, 1, 0, 2, 1, 0, 2, 2, 1}));
  // All points equal: one cluster.
  r = KMeans({{1, 2}, {1, 2}, {1, 2}}, o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->centroids, (Points{{1, 2}}));
  EXPECT_EQ(r->assignment, (std::vector<int>{0, 0, 0}));
}

// Scenario: k = 1 -> the mean; inertia = sum of squared distances to it.
TEST(KMeansTest, OneClusterIsTheMean) {
  KMeansOptions o;
  o.k = 1;
  absl::StatusOr<KMeansResult> r = KMeans({{0, 0}, {2, 0}, {4, 6}}, o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->centroids, (Points{{2, 2}}));
  EXPECT_EQ(r->assignment, (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(r->inertia, 8.0 + 4.0 + 20.0);
}

TEST(KMeansTest, BadInputIsInvalidArgumentNamingTheField) {
  const Points ok = {{0, 0}, {1, 1}};
  auto message = [](const Points& p, const KMeansOptions& o) {
    absl::StatusOr<KMeansResult> r = KMeans(p, o);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(r.status().message());
  };
  EXPECT_EQ(message({}, {}), "kmeans: points must not be empty");
  EXPECT_EQ(message({{}, {}}, {}), "kmeans: points must have dimension >= 1");
  EXPECT_EQ(message({{0, 0}, {1, 1}, {2}}, {}),
            "kmeans: points[2] has dimension 1, points[0] has 2");
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(message({{0, 0}, {1, nan}}, {}).rfind("kmeans: points[1][1] is not finite", 0), 0u);
  EXPECT_EQ(message({{inf, 0}}, {}).rfind("kmeans: points[0][0] is not finite", 0), 0u);
  EXPECT_EQ(message(ok, {.k = 0}), "kmeans: k must be >= 1, got 0");
  EXPECT_EQ(message(ok, {.restarts = 0}), "kmeans: restarts must be >= 1, got 0");
  EXPECT_EQ(message(ok, {.max_iterations = -1}), "kmeans: max_iterations must be >= 1, got -1");
}

}  // namespace
}  // namespace recall::cache::episodic
