#include "cache/episodic/segment.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"

namespace recall::cache::episodic {

std::string RenderUtterance(const Utterance& utterance) {
  return absl::StrCat(utterance.speaker, " said, \"", utterance.text, "\"");
}

absl::StatusOr<std::vector<Window>> SegmentWindows(std::span<const Utterance> utterances,
                                                   int window_size) {
  if (window_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("segment: window_size must be >= 1, got ", window_size));
  }
  const int n = static_cast<int>(utterances.size());
  std::vector<Window> windows;
  windows.reserve(static_cast<size_t>(n / window_size + (n % window_size != 0 ? 1 : 0)));
  // 64-bit stride: first + window_size may exceed INT_MAX for a huge window_size.
  for (int64_t first = 0; first < n; first += window_size) {
    Window w;
    w.first = static_cast<int>(first);
    w.count = static_cast<int>(std::min<int64_t>(window_size, n - first));
    for (int i = w.first; i < w.first + w.count; ++i) {
      if (i > w.first) w.text += '\n';
      absl::StrAppend(&w.text, RenderUtterance(utterances[static_cast<size_t>(i)]));
    }
    windows.push_back(std::move(w));
  }
  return windows;
}

}  // namespace recall::cache::episodic
