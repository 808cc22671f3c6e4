// StopText: generated text checked against stop strings as it streams. The tail that could
// still be the start of a stop string is held back; when a stop string appears the text is
// cut just before it. Shared by Generate and the serving scheduler.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace recall::serving {

class StopText {
 public:
  explicit StopText(std::vector<std::string> stops = {});  // REQUIRES: no empty stop string

  // Appends a piece of output. Returns true once a stop string occurs: text() is then cut
  // before the earliest occurrence and further appends are ignored.
  bool Append(std::string_view piece);
  // Appends a piece no stop string is looked for in (what the decoder flushes after a stop
  // token ended the text: the text is not cut then). Ignored once stopped.
  void AppendUnchecked(std::string_view piece);
  bool stopped() const { return stopped_; }

  // The text that is safe to stream now and was not taken before.
  std::string TakeReady();
  // Everything not taken yet (at the end of generation).
  std::string TakeAll();

  const std::string& text() const { return text_; }

 private:
  std::vector<std::string> stops_;
  std::string text_;
  size_t taken_ = 0;
  bool stopped_ = false;
};

// Where a reply cut at a stop string leaves its tokens. ends[i]: the bytes of text the
// reply's first i + 1 tokens decoded to, or -1 where the decoder then held part of a
// character. Of the first `limit` tokens, the first `tokens` decode to text that ends on a
// character boundary at or before the cut (at `cut` bytes); the reply's text from `tail` to
// the cut is what the tokens after them put in before it.
struct TokensAtCut {
  int tokens = 0;
  size_t tail = 0;
};
TokensAtCut TokensBeforeCut(const std::vector<int64_t>& ends, size_t cut, int limit);

}  // namespace recall::serving
