#include "worker/model/finite.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "worker/model/half.h"

namespace recall::model {
namespace {

// Branch-free over blocks (vectorized by the compiler); the block holding a hit is searched.
template <typename Bits>
int64_t FirstWithExponentAllOnes(const void* data, int64_t n, Bits exponent) {
  const auto* bits = static_cast<const unsigned char*>(data);
  constexpr int64_t kBlock = 1024;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t end = b + kBlock < n ? b + kBlock : n;
    Bits block[kBlock];
    std::memcpy(block, bits + b * sizeof(Bits), static_cast<size_t>(end - b) * sizeof(Bits));
    bool hit = false;
    for (int64_t i = 0; i < end - b; ++i) hit |= (block[i] & exponent) == exponent;
    if (!hit) continue;
    for (int64_t i = 0; i < end - b; ++i) {
      if ((block[i] & exponent) == exponent) return b + i;
    }
  }
  return -1;
}

}  // namespace

int64_t FirstNonFinite(const void* data, kernels::DType dtype, int64_t n) {
  switch (dtype) {
    case kernels::DType::kF32:
      return FirstWithExponentAllOnes<uint32_t>(data, n, 0x7F800000u);
    case kernels::DType::kF16:
      return FirstWithExponentAllOnes<uint16_t>(data, n, 0x7C00u);
    case kernels::DType::kBF16:
      return FirstWithExponentAllOnes<uint16_t>(data, n, 0x7F80u);
    default:
      return -1;
  }
}

absl::Status CheckFinite(const std::string& file, const std::string& name, const void* data,
                         kernels::DType dtype, int64_t rows, int64_t cols) {
  const int64_t i = FirstNonFinite(data, dtype, rows * cols);
  if (i < 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(file, ": tensor \"", name, "\": weight [", i / cols, ", ", i % cols, "] is ",
                   LoadAsF32(data, dtype, i),
                   " (weights must be finite: the checkpoint is damaged, or its training "
                   "diverged)"));
}

}  // namespace recall::model
