// LazyEviction's slot score (EVICTION.md section 1), the same bits on the host and on a GPU:
//
//   H1 = 2 / (1 + exp(1 + (t - ts) / (mri + 1e-5)))
//   H2 = mri > 0 ? 2 / (1 + exp(mri - 1)) : 0
//   S  = H1 + H2                                   (in double)
//
// The eviction step keeps the slots with the highest S, so a slot's fate can turn on the last
// bit of S. The C library's exp and CUDA's may differ in that bit, and compilers may fuse a
// multiply and an add into an fma on one side and not the other. PortableExp therefore uses
// only operations IEEE 754 rounds exactly (+, -, *, /, fma and rint), each written out, so the
// host reference (LazyPolicy, Backend::LazyEvict) and the CUDA kernel rank slots identically.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define RECALL_HOST_DEVICE __host__ __device__
#else
#define RECALL_HOST_DEVICE
#endif

namespace recall::kernels {

// exp(x) within about one unit in the last place, for x in [-708, 709]; 0 below, +inf above
// (and for NaN). Cody-Waite reduction x = k ln2 + r, |r| <= ln2 / 2, then the Taylor
// polynomial of degree 13 (its truncation error is below 1e-17) by Horner's rule with fma.
RECALL_HOST_DEVICE inline double PortableExp(double x) {
  if (x < -708.0) return 0.0;
  if (!(x <= 709.0)) return INFINITY;
  const double k = rint(x * 1.4426950408889634);  // x / ln 2
  double r = fma(-k, 0.6931471803691238, x);      // ln 2, high part (exact times k)
  r = fma(-k, 1.9082149292705877e-10, r);         // ln 2, low part
  double p = 1.6059043836821613e-10;              // 1/13!
  p = fma(p, r, 2.08767569878681e-09);
  p = fma(p, r, 2.505210838544172e-08);
  p = fma(p, r, 2.755731922398589e-07);
  p = fma(p, r, 2.7557319223985893e-06);
  p = fma(p, r, 2.48015873015873e-05);
  p = fma(p, r, 0.0001984126984126984);
  p = fma(p, r, 0.001388888888888889);
  p = fma(p, r, 0.008333333333333333);
  p = fma(p, r, 0.041666666666666664);
  p = fma(p, r, 0.16666666666666666);
  p = fma(p, r, 0.5);
  p = fma(p, r, 1.0);
  p = fma(p, r, 1.0);
  // 2^k by its bits: k is in [-1021, 1023], a normal number.
  const uint64_t bits = static_cast<uint64_t>(static_cast<int64_t>(k) + 1023) << 52;
  double scale;
  memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// S for a slot last important at step ts, with maximum recurrence interval mri, at step t.
RECALL_HOST_DEVICE inline double LazyScore(int t, int32_t ts, int32_t mri) {
  const double h1 =
      2.0 /
      (1.0 + PortableExp(1.0 + static_cast<double>(t - ts) / (static_cast<double>(mri) + 1e-5)));
  const double h2 = mri > 0 ? 2.0 / (1.0 + PortableExp(static_cast<double>(mri) - 1.0)) : 0.0;
  return h1 + h2;
}

}  // namespace recall::kernels
