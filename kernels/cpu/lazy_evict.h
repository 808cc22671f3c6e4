// The host reference of Backend::LazyEvict's per-row work (kernels/backend.h): LazyEviction's
// keep list for one (layer, KV head) and the compaction of its ts / mri state. Used by the
// default LazyEvict and by GPU backends that evict on the host.
#pragma once

#include <cstdint>
#include <vector>

namespace recall::kernels::cpu {

// out[0 .. keep): the top keep - window of slots [0, len - window) by LazyScore(t, ts, mri)
// (ties: the older slot), then the last `window` slots; ascending. REQUIRES: window <= keep <
// len.
struct LazyKeepScratch {
  std::vector<int32_t> order;
  std::vector<double> score;
};
void LazyKeepList(const int32_t* ts, const int32_t* mri, int len, int keep, int window, int t,
                  LazyKeepScratch* scratch, int32_t* out);

// x[i] = x[keep[i]] for i < n (keep ascending, so in place).
void CompactInts(int32_t* x, const int32_t* keep, int n);

}  // namespace recall::kernels::cpu
