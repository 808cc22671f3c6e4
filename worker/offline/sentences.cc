#include "worker/offline/sentences.h"

#include <string>

namespace recall::offline {
namespace {

bool Ends(const std::string& text) { return text.find_first_of(".!?\n") != std::string::npos; }

bool Closes(const std::string& text) {
  return !text.empty() && (text[0] == '"' || text[0] == '\'' || text[0] == ')');
}

}  // namespace

std::vector<TokenSpan> SplitSentences(std::span<const int32_t> tokens,
                                      const model::Tokenizer& tokenizer) {
  std::vector<TokenSpan> spans;
  const int n = static_cast<int>(tokens.size());
  int begin = 0;
  if (n > 0 && tokens[0] == tokenizer.bos_id()) begin = 1;
  int32_t prev = begin == 1 ? tokens[0] : -1;
  for (int i = begin; i < n; ++i) {
    if (tokens[i] == tokenizer.bos_id()) {
      // A BOS inside the prompt separates texts: it ends a sentence and starts the next.
      if (begin < i) spans.push_back({begin, i});
      begin = i;
      prev = tokens[i];
      continue;
    }
    const std::string text = tokenizer.TokenBytes(prev, tokens[i]);
    prev = tokens[i];
    if (!Ends(text)) continue;
    int end = i + 1;
    while (end < n && Closes(tokenizer.TokenBytes(tokens[end - 1], tokens[end]))) ++end;
    spans.push_back({begin, end});
    begin = end;
    i = end - 1;
    prev = tokens[i];
  }
  if (begin < n) spans.push_back({begin, n});
  return spans;
}

}  // namespace recall::offline
