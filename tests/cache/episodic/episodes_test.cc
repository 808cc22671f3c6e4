#include "cache/episodic/episodes.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "cache/episodic/embedder.h"
#include "cache/episodic/segment.h"
#include "gtest/gtest.h"

namespace recall::cache::episodic {
namespace {

using Points = std::vector<std::vector<float>>;

Episode MakeEpisode(std::vector<float> centroid, std::vector<int> windows) {
  Episode e;
  e.centroid = std::move(centroid);
  e.windows = std::move(windows);
  e.patch = e.windows;
  return e;
}

TEST(CosineSimilarityTest, ScaleInvariantAndZeroForZeroVectors) {
  const std::vector<float> a = {3, 4}, b = {6, 8}, c = {-4, 3}, zero = {0, 0};
  EXPECT_DOUBLE_EQ(CosineSimilarity(a, b), 1.0);
  EXPECT_DOUBLE_EQ(CosineSimilarity(a, c), 0.0);
  EXPECT_EQ(CosineSimilarity(a, zero), 0.0);
  EXPECT_EQ(CosineSimilarity(zero, zero), 0.0);
}

// Scenario: one episode of 5 windows in 2-D whose mean lies at 45 degrees:
//   w0 (1, 0) cos 0.707, w1 (.75, .5) cos 0.981, w2 (.5, .75) cos 0.981, w3 (0, 1) cos 0.707,
//   w4 (.5, .5) cos 1 (exactly representable, so the ties are exact).
// The patch is the nearest windows (ties to the earlier one), listed chronologically.
TEST(BuildEpisodesTest, PatchIsTheNearestWindowsInChronologicalOrder) {
  const Points emb = {{1, 0}, {0.75f, 0.5f}, {0.5f, 0.75f}, {0, 1}, {0.5f, 0.5f}};
  KMeansOptions o;
  o.k = 1;
  const std::vector<std::pair<int, std::vector<int>>> cases = {
      {1, {4}}, {2, {1, 4}}, {3, {1, 2, 4}}, {4, {0, 1, 2, 4}}, {8, {0, 1, 2, 3, 4}}};
  for (const auto& [patch_windows, want] : cases) {
    absl::StatusOr<std::vector<Episode>> e = BuildEpisodes(emb, o, patch_windows);
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_EQ(e->size(), 1u);
    EXPECT_EQ((*e)[0].windows, (std::vector<int>{0, 1, 2, 3, 4}));
    EXPECT_EQ((*e)[0].centroid, (std::vector<float>{0.55f, 0.55f}));
    EXPECT_EQ((*e)[0].patch, want) << "patch_windows " << patch_windows;
  }
}

// Scenario: 30 windows in 3 interleaved directions (window w near axis w % 3): three
// episodes whose members are exactly those windows, ascending; the patch is 8 of them.
TEST(BuildEpisodesTest, EpisodesPartitionTheWindows) {
  Points emb;
  for (int w = 0; w < 30; ++w) {
    std::vector<float> v(3, 0.05f * static_cast<float>(w % 5));
    v[w % 3] = 1.0f;
    emb.push_back(v);
  }
  KMeansOptions o;
  o.k = 3;
  absl::StatusOr<std::vector<Episode>> e = BuildEpisodes(emb, o);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->size(), 3u);
  std::vector<std::vector<int>> members;
  for (const Episode& ep : *e) {
    members.push_back(ep.windows);
    EXPECT_EQ(ep.patch.size(), 8u);
    EXPECT_TRUE(std::is_sorted(ep.patch.begin(), ep.patch.end()));
    EXPECT_TRUE(
        std::includes(ep.windows.begin(), ep.windows.end(), ep.patch.begin(), ep.patch.end()));
  }
  std::sort(members.begin(), members.end());
  std::vector<std::vector<int>> want(3);
  for (int w = 0; w < 30; ++w) want[w % 3].push_back(w);
  EXPECT_EQ(members, want);
}

TEST(BuildEpisodesTest, ErrorsAreInvalidArgument) {
  absl::StatusOr<std::vector<Episode>> e = BuildEpisodes({{1, 0}}, KMeansOptions{}, 0);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e.status().message(), "episodes: patch_windows must be >= 1, got 0");
  e = BuildEpisodes({}, KMeansOptions{});
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e.status().message(), "kmeans: points must not be empty");
}

TEST(RouteToEpisodeTest, PicksTheMostSimilarCentroid) {
  const std::vector<Episode> eps = {MakeEpisode({1, 0, 0}, {0}), MakeEpisode({0, 2, 0}, {1}),
                                    MakeEpisode({0, 0, 0.5f}, {2})};
  EXPECT_EQ(RouteToEpisode(std::vector<float>{0.9f, 0.1f, 0.2f}, eps), 0);
  EXPECT_EQ(RouteToEpisode(std::vector<float>{0.1f, 0.3f, 0.2f}, eps), 1);
  EXPECT_EQ(RouteToEpisode(std::vector<float>{-1, -1, 0.01f}, eps), 2);
}

TEST(RouteToEpisodeTest, TiesGoToTheLowestIndex) {
  const std::vector<Episode> eps = {MakeEpisode({0, 1}, {0}), MakeEpisode({1, 0}, {1}),
                                    MakeEpisode({2, 0}, {2})};
  EXPECT_EQ(RouteToEpisode(std::vector<float>{1, 1}, eps), 0);
  EXPECT_EQ(RouteToEpisode(std::vector<float>{3, 0}, eps), 1);
}

TEST(RouteToEpisodeTest, EmptyEpisodesAreSkipped) {
  const std::vector<Episode> eps = {MakeEpisode({1, 0}, {}), MakeEpisode({0, 1}, {3})};
  EXPECT_EQ(RouteToEpisode(std::vector<float>{1, 0}, eps), 1);
  EXPECT_EQ(RouteToEpisode(std::vector<float>{1, 0}, {MakeEpisode({1, 0}, {})}), -1);
  EXPECT_EQ(RouteToEpisode(std::vector<float>{1, 0}, {}), -1);
}

TEST(RouteToEpisodeTest, ZeroOrNonFiniteQueryIsMinusOne) {
  const std::vector<Episode> eps = {MakeEpisode({1, 0}, {0})};
  EXPECT_EQ(RouteToEpisode(std::vector<float>{0, 0}, eps), -1);
  EXPECT_EQ(RouteToEpisode(std::vector<float>{1, std::nanf("")}, eps), -1);
}

TEST(PatchedPromptTest, JoinsThePatchWindowsText) {
  std::vector<Window> windows;
  for (int i = 0; i < 4; ++i) windows.push_back({i, 1, "w" + std::to_string(i)});
  Episode e = MakeEpisode({1}, {0, 1, 2, 3});
  e.patch = {1, 3};
  EXPECT_EQ(PatchedPrompt(windows, e), "w1\nw3");
  e.patch = {};
  EXPECT_EQ(PatchedPrompt(windows, e), "");
}

// End to end: a conversation drifting between cooking, football and astronomy (4 utterances
// per window, topics interleaved in time), segmented, TF-IDF embedded (fitted on the windows),
// clustered into 3 episodes = the 3 topics; a new question routes to its topic's episode.
TEST(EpisodesEndToEndTest, TopicsBecomeEpisodesAndQuestionsRouteToThem) {
  const std::vector<std::vector<std::string>> topics = {
      {"Roast the garlic and onions in the oven first.", "Then simmer the tomato sauce slowly.",
       "Add basil and olive oil to the sauce.", "Bake the bread while the sauce simmers.",
       "Chop more garlic for the pasta sauce.", "The oven should be hot before you roast.",
       "Season the onions with salt and pepper.", "Olive oil burns if the pan is too hot.",
       "Knead the dough before you bake the bread.", "Taste the tomato sauce for salt.",
       "Slice the onions thinly for the pan.", "Serve the pasta with basil and garlic."},
      {"The striker scored a late goal in the match.", "Our goalkeeper saved a penalty.",
       "The referee showed the defender a red card.", "That match went to extra time.",
       "The coach changed the striker at half time.", "A goal from a corner kick won the cup.",
       "The defender blocked the penalty kick.", "Fans sang for the goalkeeper all match.",
       "The league title depends on this match.", "The referee gave a penalty for the foul.",
       "The coach praised the striker after the goal.", "The cup final is next season."},
      {"The telescope shows the rings of Saturn.", "Jupiter has many moons and a red spot.",
       "A comet passes the sun every few years.", "The galaxy holds billions of stars.",
       "Through the telescope the moon craters look sharp.", "Mars is a red planet.",
       "Distant stars in the galaxy shine faintly.", "The planet Saturn has bright rings.",
       "Astronomers track the comet with a telescope.", "Jupiter is the largest planet.",
       "The night sky is full of stars and planets.", "The moon orbits our planet."}};
  std::vector<Utterance> utterances;
  std::vector<int> window_topic;
  for (int w = 0; w < 9; ++w) {  // window w: topic w % 3, utterances 4 * (w / 3) ...
    const int t = w % 3;
    window_topic.push_back(t);
    for (int i = 0; i < 4; ++i) {
      utterances.push_back({i % 2 == 0 ? "Alice" : "Bob", topics[t][4 * (w / 3) + i]});
    }
  }
  absl::StatusOr<std::vector<Window>> windows = SegmentWindows(utterances, 4);
  ASSERT_TRUE(windows.ok());
  ASSERT_EQ(windows->size(), 9u);
  absl::StatusOr<std::unique_ptr<HashedTfIdfEmbedder>> embedder = HashedTfIdfEmbedder::Create({});
  ASSERT_TRUE(embedder.ok());
  std::vector<std::string> texts;
  for (const Window& w : *windows) texts.push_back(w.text);
  (*embedder)->Fit(texts);
  Points emb;
  for (const std::string& t : texts) {
    absl::StatusOr<std::vector<float>> v = (*embedder)->Embed(t);
    ASSERT_TRUE(v.ok());
    emb.push_back(*v);
  }
  KMeansOptions o;
  o.k = 3;
  absl::StatusOr<std::vector<Episode>> eps = BuildEpisodes(emb, o);
  ASSERT_TRUE(eps.ok()) << eps.status();
  ASSERT_EQ(eps->size(), 3u);
  std::vector<int> episode_of_topic(3, -1);
  for (int e = 0; e < 3; ++e) {
    const std::vector<int>& members = (*eps)[e].windows;
    ASSERT_EQ(members.size(), 3u) << "episode " << e;
    const int t = window_topic[members[0]];
    for (int w : members) EXPECT_EQ(window_topic[w], t) << "episode " << e << " window " << w;
    episode_of_topic[t] = e;
    EXPECT_EQ((*eps)[e].patch, members);
  }
  const Episode& cooking = (*eps)[episode_of_topic[0]];
  EXPECT_EQ(PatchedPrompt(*windows, cooking),
            (*windows)[0].text + "\n" + (*windows)[3].text + "\n" + (*windows)[6].text);

  const std::vector<std::string> questions = {"How long should the garlic roast in the oven?",
                                              "Who scored the goal in the cup match?",
                                              "Can the telescope see the moons of Jupiter?"};
  for (int t = 0; t < 3; ++t) {
    absl::StatusOr<std::vector<float>> q = (*embedder)->Embed(questions[t]);
    ASSERT_TRUE(q.ok());
    EXPECT_EQ(RouteToEpisode(*q, *eps), episode_of_topic[t]) << questions[t];
  }
  absl::StatusOr<std::vector<float>> none = (*embedder)->Embed("?!");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(RouteToEpisode(*none, *eps), -1);
}

}  // namespace
}  // namespace recall::cache::episodic
