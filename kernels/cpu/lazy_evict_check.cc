#include "kernels/cpu/lazy_evict_check.h"

#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace recall::kernels {
namespace {

constexpr PagedKvLayout kLayout{2, 2, 64, 16};  // 2 layers x 2 KV heads: rows 0-3
constexpr int kCap = 2112, kWindow = 32, kStep = 3000;
constexpr int kLens[4] = {2100, 600, 40, 1300};
constexpr int kKeeps[4] = {700, 64, kWindow, 1299};

// The first index where a and b differ, or -1.
int64_t FirstDifference(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace

absl::Status CheckLazyEvict(Backend& backend) {
  const int rows = kLayout.n_layers * kLayout.n_kv_heads;
  const int blocks_per_layer = (kCap + kLayout.block_tokens - 1) / kLayout.block_tokens;
  const int n_blocks = kLayout.n_layers * blocks_per_layer;
  // Layer l's blocks are every other block of the pool, in reverse, so a wrong table lookup
  // reads another layer's rows.
  std::vector<std::vector<int32_t>> tables(kLayout.n_layers);
  for (int l = 0; l < kLayout.n_layers; ++l) {
    for (int b = blocks_per_layer - 1; b >= 0; --b) tables[l].push_back(2 * b + l);
  }
  const int32_t* table_ptrs[2] = {tables[0].data(), tables[1].data()};
  const int32_t counts[2] = {blocks_per_layer, blocks_per_layer};
  // Every float of the pool distinct (exact integers below 2^24).
  std::vector<float> pool(static_cast<size_t>(n_blocks) * kLayout.BlockFloats());
  std::iota(pool.begin(), pool.end(), 0.0f);
  // Few distinct (ts, mri) pairs, so many slots score exactly alike: in rows 0, 1 and 3 the
  // last slot kept ties with 60 to 120 others, and the older ones must win.
  std::vector<int32_t> state(2 * static_cast<size_t>(rows) * kCap);
  uint32_t x = 12345;
  for (size_t i = 0; i < state.size() / 2; ++i) {
    x = x * 1664525u + 1013904223u;
    state[i] = kStep - static_cast<int32_t>((x >> 8) % 40) * 7;     // ts
    state[state.size() / 2 + i] = static_cast<int32_t>((x >> 20) % 9);  // mri
  }
  std::vector<int32_t> keeps(rows * static_cast<size_t>(kCap), -1);
  const std::vector<int32_t> row_ids = {0, 1, 2, 3};

  LazyEvictArgs a;
  a.kv.layout = kLayout;
  a.kv.block_tables = table_ptrs;
  a.kv.block_counts = counts;
  a.state_stride = kCap;
  a.n_rows = rows;
  a.rows = row_ids.data();
  a.lens = kLens;
  a.keeps = kKeeps;
  a.window = kWindow;
  a.t = kStep;
  a.keep_stride = kCap;

  // The reference, on host copies.
  std::vector<float> want_pool = pool;
  std::vector<int32_t> want_state = state, want_keeps = keeps;
  LazyEvictArgs h = a;
  h.kv.pool = want_pool.data();
  h.ts = want_state.data();
  h.mri = want_state.data() + want_state.size() / 2;
  h.keep_out = want_keeps.data();
  CpuBackendOptions one_thread;
  one_thread.num_threads = 1;
  CreateCpuBackend(one_thread)->LazyEvict(h);

  Memory& memory = backend.memory();
  RECALL_ASSIGN_OR_RETURN(Buffer d_pool, Buffer::Allocate(memory, pool.size() * sizeof(float)));
  RECALL_ASSIGN_OR_RETURN(Buffer d_state,
                          Buffer::Allocate(memory, state.size() * sizeof(int32_t)));
  RECALL_ASSIGN_OR_RETURN(Buffer d_keeps,
                          Buffer::Allocate(memory, keeps.size() * sizeof(int32_t)));
  memory.CopyIn(d_pool.get(), pool.data(), pool.size() * sizeof(float));
  memory.CopyIn(d_state.get(), state.data(), state.size() * sizeof(int32_t));
  memory.CopyIn(d_keeps.get(), keeps.data(), keeps.size() * sizeof(int32_t));
  LazyEvictArgs d = a;
  d.kv.pool = d_pool.as<float>();
  d.ts = d_state.as<int32_t>();
  d.mri = d.ts + state.size() / 2;
  d.keep_out = d_keeps.as<int32_t>();
  backend.LazyEvict(d);
  memory.CopyOut(pool.data(), d_pool.get(), pool.size() * sizeof(float));
  memory.CopyOut(state.data(), d_state.get(), state.size() * sizeof(int32_t));
  memory.CopyOut(keeps.data(), d_keeps.get(), keeps.size() * sizeof(int32_t));
  RECALL_RETURN_IF_ERROR(backend.Health());

  const std::string who = absl::StrCat(backend.Name(), " backend: LazyEvict ");
  for (int r = 0; r < rows; ++r) {
    const size_t begin = static_cast<size_t>(r) * kCap;
    for (int i = 0; i < kKeeps[r]; ++i) {
      if (keeps[begin + i] != want_keeps[begin + i]) {
        return absl::InternalError(absl::StrCat(
            who, "kept slot ", keeps[begin + i], " as entry ", i, " of row ", r, " (", kLens[r],
            " slots, keep ", kKeeps[r], ") where the host reference keeps ",
            want_keeps[begin + i]));
      }
    }
  }
  if (const int64_t i = FirstDifference(state, want_state); i >= 0) {
    const bool mri = i >= static_cast<int64_t>(state.size() / 2);
    const int64_t j = i % (static_cast<int64_t>(rows) * kCap);
    return absl::InternalError(absl::StrCat(who, "left ", mri ? "mri" : "ts", " ", state[i],
                                            " at row ", j / kCap, " slot ", j % kCap,
                                            " where the host reference has ", want_state[i]));
  }
  for (size_t i = 0; i < pool.size(); ++i) {
    if (pool[i] != want_pool[i]) {
      return absl::InternalError(absl::StrCat(who, "left ", pool[i], " at pool float ", i,
                                              " where the host reference has ", want_pool[i]));
    }
  }
  return absl::OkStatus();
}

}  // namespace recall::kernels
