#include "worker/serving/stop_text.h"

#include <algorithm>

namespace recall::serving {

StopText::StopText(std::vector<std::string> stops) : stops_(std::move(stops)) {}

bool StopText::Append(std::string_view piece) {
  if (stopped_) return true;
  const size_t old_size = text_.size();
  text_.append(piece);
  size_t cut = std::string::npos;
  for (const std::string& stop : stops_) {
    // Only occurrences that end in the new piece are new.
    const size_t from = old_size >= stop.size() ? old_size - stop.size() + 1 : 0;
    const size_t at = text_.find(stop, from);
    if (at != std::string::npos) cut = std::min(cut, at);
  }
  if (cut == std::string::npos) return false;
  text_.resize(cut);
  taken_ = std::min(taken_, cut);
  stopped_ = true;
  return true;
}

void StopText::AppendUnchecked(std::string_view piece) {
  if (!stopped_) text_.append(piece);
}

std::string StopText::TakeReady() {
  // Hold back the longest tail that is a proper prefix of some stop string.
  size_t hold = 0;
  if (!stopped_) {
    for (const std::string& stop : stops_) {
      for (size_t len = std::min(text_.size(), stop.size() - 1); len > hold; --len) {
        if (text_.compare(text_.size() - len, len, stop, 0, len) == 0) {
          hold = len;
          break;
        }
      }
    }
  }
  const size_t ready = text_.size() - hold;
  if (ready <= taken_) return "";
  std::string out = text_.substr(taken_, ready - taken_);
  taken_ = ready;
  return out;
}

TokensAtCut TokensBeforeCut(const std::vector<int64_t>& ends, size_t cut, int limit) {
  for (int i = std::min(limit, static_cast<int>(ends.size())); i > 0; --i) {
    const int64_t end = ends[static_cast<size_t>(i) - 1];
    if (end >= 0 && static_cast<size_t>(end) <= cut) return {i, static_cast<size_t>(end)};
  }
  return {};
}

std::string StopText::TakeAll() {
  std::string out = text_.substr(std::min(taken_, text_.size()));
  taken_ = text_.size();
  return out;
}

}  // namespace recall::serving
