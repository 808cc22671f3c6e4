// The episodic benchmark's conversations: several short, different stories (TinyStories
// style, simple words, for the 512-token stories260K vocabulary) one after another, then a
// query that restarts one of them with its first sentence.
//
// Every story has a main character named in its first sentence (so also in the query) and a
// companion (a pet, a toy, a friend) named only in a later sentence: the companion is what a
// compressed cache must still hold to continue the right story. Main and companion names are
// distinct across the pool, none a prefix of another.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace recall::bench {

struct Story {
  std::string name;       // main character, in the first sentence
  std::string companion;  // named after the first sentence only
  std::vector<std::string> sentences;
};

// The pool (16 stories, 4 to 6 sentences each).
const std::vector<Story>& StoryPool();

struct Conversation {
  std::vector<int> stories;           // indices into StoryPool(), in prompt order
  int target = 0;                     // index into `stories` of the restarted story
  std::string query;                  // its first sentence
  std::vector<std::string> segments;  // each story's sentences joined by spaces, then the query
  std::string text;                   // the segments joined by spaces
};

struct ConversationOptions {
  int count = 24;
  int stories = 4;  // per conversation, <= StoryPool().size()
  uint64_t seed = 1;
};

// `count` conversations with pairwise different story sets, drawn deterministically from
// `seed` (mt19937_64 and a Fisher-Yates shuffle written out, so every standard library gives
// the same sets). Conversation i restarts story i % stories: first, middle and last ones.
std::vector<Conversation> MakeConversations(const ConversationOptions& options);

// Whether `text` holds `word` as a whole word (no letter right before or after it).
bool ContainsWord(const std::string& text, const std::string& word);

}  // namespace recall::bench
