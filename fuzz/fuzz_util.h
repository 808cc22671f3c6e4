// Helpers shared by the loader fuzzers. The loaders read paths, so each input is written to
// a file in a scratch directory (tmpfs when there is one) before the loader runs.
// A loader may reject any input with a Status; what the fuzzers check beyond "no crash, no
// sanitizer report, no allocation past -malloc_limit_mb" is what a loaded result promises:
// every weight view lies inside the storage that backs it, and a tokenizer that loaded
// encodes every probe text to ids inside its vocabulary. A broken promise aborts with a
// message (a finding, like a crash).
// Thread safety: none (libFuzzer runs one input at a time).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "worker/model/model.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::fuzz {

// This process's scratch directory, created on first use under $RECALL_FUZZ_SCRATCH (else
// /dev/shm, else /tmp) and removed at a normal exit (a crash leaves it: run_fuzzer.sh gives
// each run its own RECALL_FUZZ_SCRATCH and removes that).
const std::string& ScratchDir();

// Writes `size` bytes to `path` (replacing it); aborts when it cannot.
void WriteFile(const std::string& path, const uint8_t* data, size_t size);
void WriteFile(const std::string& path, std::string_view bytes);

// Aborts with `what` when `condition` is false.
void Require(bool condition, std::string_view what);

// Every matrix of `model` has the shape its config implies and lies inside one of its
// storage blocks.
void CheckModel(const model::Model& model);

// Encodes probe texts (every byte value, special markers, chat turns) with every option,
// decodes and streams the ids back, and requires every id inside the vocabulary; also
// decodes ids outside it (which must be ignored, not read).
void ExerciseTokenizer(const model::Tokenizer& tokenizer);

}  // namespace recall::fuzz
