// Sentences of a token sequence: the utterances of a single long prompt, when `recall
// generate --policy episodic` treats the prompt as the history (EpiCache segments a history
// into windows of utterances; a plain prompt has no speakers, so its sentences stand in).
//
// A sentence ends after a token whose text holds '.', '!', '?' or a newline; closing quotes
// right after it ('"', '\'', ')') belong to it. A leading BOS is part of no span; a BOS
// further on ends the sentence before it and begins the next one (texts packed with BOS
// between them). Spans cover every other token once, in order.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "worker/tokenizer/tokenizer.h"

namespace recall::offline {

struct TokenSpan {
  int begin = 0;
  int end = 0;  // exclusive
};

std::vector<TokenSpan> SplitSentences(std::span<const int32_t> tokens,
                                      const model::Tokenizer& tokenizer);

}  // namespace recall::offline
