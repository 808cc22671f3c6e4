#include "coordinator/random_id.h"

#include <mutex>
#include <random>

#include "absl/strings/str_cat.h"

namespace recall::coordinator {

std::string RandomId(absl::string_view prefix) {
  static std::mutex mu;
  static std::mt19937_64 rng(std::random_device{}());
  std::lock_guard<std::mutex> lock(mu);
  const uint64_t hi = rng(), lo = rng();
  return absl::StrCat(prefix, absl::Hex(hi, absl::kZeroPad16), absl::Hex(lo, absl::kZeroPad16));
}

}  // namespace recall::coordinator
