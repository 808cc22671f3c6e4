// A SentencePiece model's normalization tables (NormalizerSpec.precompiled_charsmap), checked
// before libsentencepiece reads them: the library walks the table's trie (a darts-clone
// double array) without bounds checks, so a damaged table crashed the process at its first
// Encode instead of being refused.
#pragma once

#include <string_view>

#include "absl/status/status.h"

namespace recall::model::internal {

// Every precompiled_charsmap of the serialized ModelProto `model` (normalizer_spec and
// denormalizer_spec): each trie transition an input can take stays inside the table and
// each value names a NUL-terminated string of the table. InvalidArgument naming the spec
// and the fault; OK for a table that is absent or empty (the identity), and for bytes that
// are not a protocol buffer (the library refuses those itself).
absl::Status CheckCharsMaps(std::string_view model);

}  // namespace recall::model::internal
