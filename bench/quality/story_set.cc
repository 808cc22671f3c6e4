#include "bench/quality/story_set.h"

#include <algorithm>
#include <cctype>
#include <random>
#include <set>

#include "absl/strings/str_join.h"

namespace recall::bench {

const std::vector<Story>& StoryPool() {
  static const std::vector<Story> pool = {
      {"Lily",
       "Spot",
       {"Lily had a little brown dog.", "His name was Spot.",
        "Every day, Lily and Spot played with a red ball in the park.",
        "One day, the ball fell into the pond.",
        "Spot jumped in and brought the ball back to Lily.",
        "Lily hugged Spot and said, \"You are a good dog!\""}},
      {"Tom",
       "Fluffy",
       {"Tom wanted to fly his big blue kite.", "His cat Fluffy wanted to help.",
        "The wind was strong and the kite went up high.", "Fluffy ran after the string and jumped.",
        "Tom laughed and held the kite tight."}},
      {"Sue",
       "Bubbles",
       {"Sue had a small fish in a glass bowl.", "The fish was called Bubbles.",
        "Sue gave Bubbles food every morning.", "One day, Bubbles looked sad.",
        "Sue put a pretty shell in the bowl.",
        "Bubbles swam around the shell and was happy again."}},
      {"Ben",
       "Daisy",
       {"Ben lived on a big farm.", "His best friend was a cow called Daisy.",
        "Every day, Ben gave Daisy green grass to eat.", "Daisy gave Ben good milk.",
        "Ben drank the milk and grew strong."}},
      {"Mia",
       "Coco",
       {"Mia found a little bird in the garden.", "The bird had a hurt wing.",
        "Mia named the bird Coco and took care of it.", "Soon Coco could fly again.",
        "Coco sat in the tree and sang a song for Mia."}},
      {"Max",
       "Rex",
       {"Max had a green toy dinosaur.", "He called it Rex.", "Max took Rex to the beach.",
        "They dug a big hole in the sand.", "A wave came and Rex got wet.",
        "Max dried Rex with his towel and smiled."}},
      {"Anna",
       "Bella",
       {"Anna had a tea party in her room.", "Her doll Bella sat at the table.",
        "Anna gave Bella a cup of tea and a cake.", "Then her mom came and sat down too.",
        "Anna and Bella had fun at the party."}},
      {"Jack",
       "Pip",
       {"Jack saw a tiny mouse in the kitchen.", "The mouse was named Pip.",
        "Pip was looking for cheese.", "Jack gave Pip a small piece of cheese.",
        "Pip ate it and ran back to his hole."}},
      {"Lucy",
       "Sunny",
       {"Lucy went to see her grandpa.", "Grandpa had a horse called Sunny.",
        "Lucy rode Sunny up the hill.", "From the hill, Lucy could see the whole town.",
        "She was very happy and gave Sunny an apple."}},
      {"Sam",
       "Buzz",
       {"Sam liked to look at the flowers.", "One day, a bee came to the flowers.",
        "The bee said, \"My name is Buzz.\"", "Sam and Buzz became friends.",
        "Buzz showed Sam how to make honey."}},
      {"Amy",
       "Rosie",
       {"Amy went to the farm with her dad.", "There she met a pink pig.",
        "The pig was called Rosie.", "Rosie liked to play in the mud.",
        "Amy laughed when Rosie got dirty.", "Amy and Rosie played all day."}},
      {"Bob",
       "Hoppy",
       {"Bob found a green frog near the river.", "The frog could jump very high.",
        "Bob called him Hoppy.", "Hoppy jumped on a rock and said ribbit.",
        "Bob clapped his hands.", "Then Hoppy jumped back into the river."}},
      {"Zoe",
       "Momo",
       {"Zoe went to the zoo with her mom.", "She saw a funny monkey.",
        "The monkey was named Momo.", "Momo ate a yellow banana.",
        "Then Momo waved at Zoe and Zoe waved back."}},
      {"Tim",
       "Nutty",
       {"Tim liked to climb the old tree.", "A squirrel lived in the tree.", "Her name was Nutty.",
        "Tim gave Nutty a big nut.", "Nutty was very happy and ran up the tree."}},
      {"Sara",
       "Snowy",
       {"Sara got a white bunny for her birthday.", "She called the bunny Snowy.",
        "Snowy had long ears and a pink nose.", "Sara gave Snowy a carrot.",
        "Snowy ate the carrot and hopped around the room."}},
      {"Joe",
       "Brownie",
       {"Joe could not sleep at night.", "He was scared of the dark.",
        "Then he held his old bear, Brownie.", "Brownie was soft and warm.",
        "Joe hugged Brownie and soon he was asleep."}},
  };
  return pool;
}

std::vector<Conversation> MakeConversations(const ConversationOptions& options) {
  const std::vector<Story>& pool = StoryPool();
  const int n = static_cast<int>(pool.size());
  const int k = std::clamp(options.stories, 1, n);
  std::mt19937_64 rng(options.seed);
  std::set<std::vector<int>> seen;
  std::vector<Conversation> out;
  // C(16, 4) = 1820 sets: far more than any sensible count; stop after many misses anyway.
  for (int tries = 0; static_cast<int>(out.size()) < options.count && tries < 100000; ++tries) {
    std::vector<int> order(n);
    for (int i = 0; i < n; ++i) order[i] = i;
    for (int i = n - 1; i > 0; --i) {
      const int j = static_cast<int>(rng() % static_cast<uint64_t>(i + 1));
      std::swap(order[i], order[j]);
    }
    order.resize(k);
    std::vector<int> key = order;
    std::sort(key.begin(), key.end());
    if (!seen.insert(key).second) continue;
    Conversation c;
    c.stories = order;
    c.target = static_cast<int>(out.size()) % k;
    c.query = pool[order[c.target]].sentences.front();
    for (int s : order) c.segments.push_back(absl::StrJoin(pool[s].sentences, " "));
    c.segments.push_back(c.query);
    c.text = absl::StrJoin(c.segments, " ");
    out.push_back(std::move(c));
  }
  return out;
}

bool ContainsWord(const std::string& text, const std::string& word) {
  const auto is_letter = [](char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; };
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) {
    const bool left = at == 0 || !is_letter(text[at - 1]);
    const size_t end = at + word.size();
    const bool right = end >= text.size() || !is_letter(text[end]);
    if (left && right) return true;
  }
  return false;
}

}  // namespace recall::bench
