// Segmentation of a conversation history into windows (EpiCache step 1).
//
// A conversation is a sequence of utterances. SegmentWindows cuts it into windows of
// `window_size` consecutive utterances (EpiCache uses 4); the last window holds the rest and
// may be shorter. Each window is rendered as one line per utterance,
//   {speaker} said, "{text}"
// joined by "\n" (no trailing newline). Speaker and text are copied verbatim: quotes or
// newlines inside them are not escaped.
//
// Windows are the unit that is embedded and clustered into episodes (episodes.h); Window::first
// and Window::count let a caller map a window back to its utterances (and so to tokens).
//
// Pure functions; thread safe.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace recall::cache::episodic {

struct Utterance {
  std::string speaker;
  std::string text;
};

struct Window {
  int first = 0;  // index of the window's first utterance
  int count = 0;  // number of utterances, in [1, window_size]
  std::string text;
};

// Renders one utterance: {speaker} said, "{text}".
std::string RenderUtterance(const Utterance& utterance);

// Windows covering `utterances` in order: ceil(n / window_size) of them, none for n = 0.
// InvalidArgument if window_size < 1 (the message names window_size and the limit).
absl::StatusOr<std::vector<Window>> SegmentWindows(std::span<const Utterance> utterances,
                                                   int window_size = 4);

}  // namespace recall::cache::episodic
