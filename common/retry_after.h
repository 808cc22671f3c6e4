// The wait a refusal asks for: a worker that is full says "...; retry after N ms" (its
// RESOURCE_EXHAUSTED, passed on by the coordinator). Read by the coordinator's HTTP edge
// (retry-after-ms) and by the SDK, which waits that long before it asks again. Header-only:
// the SDK links no other library of the project.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"

namespace recall {

// N of the first "retry after N ms" in `message`; nullopt when it says none.
inline std::optional<int64_t> RetryAfterMs(absl::string_view message) {
  constexpr absl::string_view kAfter = "retry after ";
  const size_t at = message.find(kAfter);
  if (at == absl::string_view::npos) return std::nullopt;
  const absl::string_view rest = message.substr(at + kAfter.size());
  const size_t digits = std::min(rest.find_first_not_of("0123456789"), rest.size());
  int64_t ms = 0;
  if (digits == 0 || !absl::StartsWith(rest.substr(digits), " ms") ||
      !absl::SimpleAtoi(rest.substr(0, digits), &ms)) {
    return std::nullopt;
  }
  return ms;
}

}  // namespace recall
