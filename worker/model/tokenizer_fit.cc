#include "worker/model/tokenizer_fit.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/model/chat_stops.h"
#include "worker/model/chat_template.h"

namespace recall::model {
namespace {

constexpr ChatFormat kFormats[] = {ChatFormat::kPlain, ChatFormat::kChatML, ChatFormat::kLlama2,
                                   ChatFormat::kLlama3};

// Texts a turn may encode: every byte value (ill-formed UTF-8 included), the llama2.c/
// SentencePiece special markers, and a conversation in every chat format.
std::vector<std::string> ProbeTexts() {
  std::string bytes;
  for (int b = 1; b < 256; ++b) bytes.push_back(static_cast<char>(b));
  std::vector<std::string> texts = {bytes,
                                    "Once upon a time, 42 cats <s>sat</s> \xE2\x96\x81 here."};
  const std::vector<ChatMessage> chat = {
      {"system", "Be brief."}, {"user", "Hi!"}, {"assistant", "Hello."}, {"user", "Bye?"}};
  for (ChatFormat format : kFormats) {
    absl::StatusOr<std::string> text = RenderChat(format, chat, /*add_generation_prompt=*/true);
    if (text.ok()) texts.push_back(*std::move(text));
  }
  return texts;
}

}  // namespace

absl::Status CheckTokenizerFitsModel(const ModelConfig& config, const Tokenizer& tokenizer,
                                     const std::string& tokenizer_path) {
  const int n = tokenizer.vocab_size();
  if (n < 1 || n > config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        tokenizer_path, ": its vocabulary (", n, " tokens) is ",
        n < 1 ? "empty" : "larger than the model's", " (vocab_size ", config.vocab_size, ")"));
  }
  for (const auto& [name, id] :
       {std::pair{"BOS", tokenizer.bos_id()}, std::pair{"EOS", tokenizer.eos_id()}}) {
    if (id < -1 || id >= n) {
      return absl::InvalidArgumentError(absl::StrCat(tokenizer_path, ": its ", name, " id ", id,
                                                     " is outside its vocabulary [0, ", n, ")"));
    }
  }
  for (const std::string& text : ProbeTexts()) {
    for (bool add_bos : {false, true}) {
      for (int32_t id : tokenizer.Encode(text, add_bos)) {
        if (id < 0 || id >= n) {
          return absl::InvalidArgumentError(
              absl::StrCat(tokenizer_path, ": encoding a probe text gives token id ", id,
                           ", outside its vocabulary [0, ", n, ")"));
        }
      }
    }
  }
  for (ChatFormat format : kFormats) {
    for (int32_t id :
         StopsFor(format, tokenizer, /*bos_ends_sequence=*/true, /*chat=*/true).token_ids) {
      if (id < 0 || id >= config.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat(tokenizer_path, ": the ", ChatFormatName(format), " stop token id ", id,
                         " is outside the model's vocabulary [0, ", config.vocab_size, ")"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace recall::model
