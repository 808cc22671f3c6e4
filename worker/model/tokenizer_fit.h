// Whether a tokenizer can drive a model. A turn encodes text, looks the ids up in the
// model's embedding and stops on the tokenizer's special ids; every one of those must be
// inside the model's vocabulary. LoadAll checks this once, so that a mismatched pair fails
// when a worker starts (before it serves), not on its first turn.
// Thread safety: pure function over const arguments.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "worker/model/model_config.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::model {

// InvalidArgument naming `tokenizer_path` and the limit when: the tokenizer's vocabulary is
// empty or larger than config.vocab_size; its BOS/EOS id is outside it; encoding a probe
// (every byte value, "<s>"/"</s>", and a conversation rendered in every chat format, with
// and without BOS) gives an id outside it; or a chat format's stop token is outside the
// model's vocabulary.
absl::Status CheckTokenizerFitsModel(const ModelConfig& config, const Tokenizer& tokenizer,
                                     const std::string& tokenizer_path);

}  // namespace recall::model
