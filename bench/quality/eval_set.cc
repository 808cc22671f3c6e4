#include "bench/quality/eval_set.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/offline/generator.h"

namespace recall::bench {

absl::StatusOr<std::vector<EvalText>> SampleEvalSet(runtime::ForwardPass& forward,
                                                    cache::BlockPool& pool,
                                                    const model::Tokenizer& tokenizer,
                                                    const EvalSetOptions& options) {
  const int context = forward.model().config.max_seq_len;
  if (options.length < 2 || options.length > context) {
    return absl::InvalidArgumentError(absl::StrCat("text length must be in [2, ", context,
                                                   "], got ", options.length));
  }
  if (options.prompts.empty()) return absl::InvalidArgumentError("prompts: none given");
  std::vector<EvalText> texts;
  for (int i = 0; i < options.n_texts; ++i) {
    EvalText text;
    text.prompt = options.prompts[i % options.prompts.size()];
    text.seed = options.seed + static_cast<uint64_t>(i);
    std::vector<int32_t> prompt = tokenizer.Encode(text.prompt, /*add_bos=*/true);
    if (static_cast<int>(prompt.size()) >= options.length) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt '", text.prompt, "' is longer than the text length"));
    }
    offline::GenerateOptions go;
    go.max_tokens = options.length - static_cast<int>(prompt.size());
    go.sampling.temperature = options.temperature;
    go.sampling.top_p = options.top_p;
    go.sampling.seed = text.seed;
    // No stop tokens: after BOS the model starts the next story, as run.c's stream would.
    RECALL_ASSIGN_OR_RETURN(offline::GenerateResult r,
                            offline::Generate(forward, pool, tokenizer, prompt, go));
    text.tokens = std::move(prompt);
    text.tokens.insert(text.tokens.end(), r.tokens.begin(), r.tokens.end());
    if (static_cast<int>(text.tokens.size()) != options.length) {
      return absl::InternalError(absl::StrCat("text ", i, " has ", text.tokens.size(),
                                              " tokens, expected ", options.length));
    }
    texts.push_back(std::move(text));
  }
  return texts;
}

namespace {

// Capitalised words that open sentences in TinyStories and are not names.
const std::set<std::string>& NotNames() {
  static const std::set<std::string> words = {
      "The", "She", "He", "They", "One", "Once", "On", "It", "But", "When", "Then", "So",
      "Her", "His", "At", "In", "We", "You", "After", "Every", "Mom", "Dad", "Mommy", "Daddy",
      "And", "As", "All", "This", "That", "There", "What", "Why", "How", "Can", "Do", "Let",
      "Yes", "No", "Thank", "Look", "Please", "Wow", "Oh", "Hello", "Hi", "I", "A", "My",
      "Now", "Sorry", "Come", "From", "Suddenly", "Together", "Finally", "While", "If",
      "Are", "Is", "Okay", "OK", "Where", "Who", "Our", "Your", "Maybe", "Just", "Later",
      "Soon", "Some", "Today", "Don", "Mum", "Grandma", "Grandpa", "Ok", "Good", "Bye"};
  return words;
}

struct Word {
  int start;
  int n_tokens;
  std::string text;
};

// Splits the ids into words: a word starts at a token whose bytes begin with a space (or
// right after BOS) and continues over tokens made of letters only.
std::vector<Word> Words(const model::Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::vector<Word> words;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string piece = tok.TokenBytes(/*prev=*/3, ids[i]);  // prev: not BOS
    const bool starts = !piece.empty() && piece[0] == ' ' && piece.size() > 1 &&
                        std::isalpha(static_cast<unsigned char>(piece[1]));
    if (!starts) continue;
    Word w{static_cast<int>(i), 1, piece.substr(1)};
    for (size_t j = i + 1; j < ids.size(); ++j) {
      const std::string next = tok.TokenBytes(3, ids[j]);
      if (next.empty() || !std::all_of(next.begin(), next.end(), [](char c) {
            return std::isalpha(static_cast<unsigned char>(c)) != 0;
          })) {
        break;
      }
      w.text += next;
      ++w.n_tokens;
    }
    words.push_back(std::move(w));
  }
  return words;
}

}  // namespace

std::vector<RecallProbe> FindRecallProbes(const model::Tokenizer& tokenizer,
                                          const std::vector<EvalText>& texts, int early,
                                          int late) {
  std::vector<RecallProbe> probes;
  for (size_t t = 0; t < texts.size(); ++t) {
    std::map<std::string, int> first;  // name -> first position
    for (const Word& w : Words(tokenizer, texts[t].tokens)) {
      if (w.text.size() < 3 || !std::isupper(static_cast<unsigned char>(w.text[0])) ||
          NotNames().count(w.text) > 0) {
        continue;
      }
      if (w.start < early && first.count(w.text) == 0) first[w.text] = w.start;
      auto it = first.find(w.text);
      if (w.start >= late && it != first.end()) {
        probes.push_back({static_cast<int>(t), w.start, w.n_tokens, it->second, w.text});
      }
    }
  }
  return probes;
}

}  // namespace recall::bench
