#include "kernels/cpu/lazy_evict_check.h"

#include <memory>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace recall::kernels {
namespace {

// The first index where a and b differ, or -1.
template <typename T>
int64_t FirstDifference(const std::vector<T>& a, const std::vector<T>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  }
  return -1;
}

// What one LazyEvict call changed: its keep lists ([rows, cap]), state and pool.
struct EvictResult {
  std::vector<int32_t> keeps, state;
  std::vector<float> pool;
};

LazyEvictArgs ArgsOf(const LazyEvictCase& c, const std::vector<const int32_t*>& tables,
                     const std::vector<int32_t>& counts) {
  LazyEvictArgs a;
  a.kv.layout = c.layout;
  a.kv.block_tables = tables.data();
  a.kv.block_counts = counts.data();
  a.state_stride = c.cap;
  a.n_rows = static_cast<int>(c.rows.size());
  a.rows = c.rows.data();
  a.lens = c.lens.data();
  a.keeps = c.keeps.data();
  a.window = c.window;
  a.t = c.t;
  a.keep_stride = c.cap;
  return a;
}

}  // namespace

absl::Status CompareLazyEvict(Backend& backend, const LazyEvictCase& c) {
  std::vector<const int32_t*> tables;
  std::vector<int32_t> counts;
  for (const std::vector<int32_t>& t : c.tables) {
    tables.push_back(t.data());
    counts.push_back(static_cast<int32_t>(t.size()));
  }
  const LazyEvictArgs a = ArgsOf(c, tables, counts);
  const size_t plane = c.state.size() / 2;

  // The reference, on host copies.
  EvictResult want{std::vector<int32_t>(c.rows.size() * c.cap, -1), c.state, c.pool};
  LazyEvictArgs h = a;
  h.kv.pool = want.pool.data();
  h.ts = want.state.data();
  h.mri = want.state.data() + plane;
  h.keep_out = want.keeps.data();
  CpuBackendOptions one_thread;
  one_thread.num_threads = 1;
  CreateCpuBackend(one_thread)->LazyEvict(h);

  EvictResult got{std::vector<int32_t>(want.keeps.size(), -1), c.state, c.pool};
  Memory& memory = backend.memory();
  RECALL_ASSIGN_OR_RETURN(Buffer d_pool, Buffer::Allocate(memory, got.pool.size() * sizeof(float)));
  RECALL_ASSIGN_OR_RETURN(Buffer d_state,
                          Buffer::Allocate(memory, got.state.size() * sizeof(int32_t)));
  RECALL_ASSIGN_OR_RETURN(Buffer d_keeps,
                          Buffer::Allocate(memory, got.keeps.size() * sizeof(int32_t)));
  memory.CopyIn(d_pool.get(), got.pool.data(), got.pool.size() * sizeof(float));
  memory.CopyIn(d_state.get(), got.state.data(), got.state.size() * sizeof(int32_t));
  memory.CopyIn(d_keeps.get(), got.keeps.data(), got.keeps.size() * sizeof(int32_t));
  LazyEvictArgs d = a;
  d.kv.pool = d_pool.as<float>();
  d.ts = d_state.as<int32_t>();
  d.mri = d.ts + plane;
  d.keep_out = d_keeps.as<int32_t>();
  backend.LazyEvict(d);
  memory.CopyOut(got.pool.data(), d_pool.get(), got.pool.size() * sizeof(float));
  memory.CopyOut(got.state.data(), d_state.get(), got.state.size() * sizeof(int32_t));
  memory.CopyOut(got.keeps.data(), d_keeps.get(), got.keeps.size() * sizeof(int32_t));
  RECALL_RETURN_IF_ERROR(backend.Health());

  const std::string who = absl::StrCat(backend.Name(), " backend: LazyEvict ");
  for (size_t i = 0; i < c.rows.size(); ++i) {
    const size_t begin = i * c.cap;
    for (int k = 0; k < c.keeps[i]; ++k) {
      if (got.keeps[begin + k] != want.keeps[begin + k]) {
        return absl::InternalError(
            absl::StrCat(who, "kept slot ", got.keeps[begin + k], " as entry ", k, " of row ",
                         c.rows[i], " (", c.lens[i], " slots, keep ", c.keeps[i],
                         ") where the host reference keeps ", want.keeps[begin + k]));
      }
    }
  }
  if (const int64_t i = FirstDifference(got.state, want.state); i >= 0) {
    const bool mri = i >= static_cast<int64_t>(plane);
    const int64_t j = i % static_cast<int64_t>(plane);
    return absl::InternalError(absl::StrCat(who, "left ", mri ? "mri" : "ts", " ", got.state[i],
                                            " at row ", j / c.cap, " slot ", j % c.cap,
                                            " where the host reference has ", want.state[i]));
  }
  if (const int64_t i = FirstDifference(got.pool, want.pool); i >= 0) {
    return absl::InternalError(absl::StrCat(who, "left ", got.pool[i], " at pool float ", i,
                                            " where the host reference has ", want.pool[i]));
  }
  return absl::OkStatus();
}

absl::Status CheckLazyEvict(Backend& backend) {
  LazyEvictCase c;
  c.layout = PagedKvLayout{2, 2, 64, 16};  // 2 layers x 2 KV heads: rows 0-3
  c.cap = 2112;
  c.window = 32;
  c.t = 3000;
  c.rows = {0, 1, 2, 3};
  c.lens = {2100, 600, 40, 1300};
  c.keeps = {700, 64, 32, 1299};
  const int per_layer = (c.cap + c.layout.block_tokens - 1) / c.layout.block_tokens;
  // Layer l's blocks are every other block of the pool, in reverse, so a wrong table lookup
  // reads another layer's rows.
  c.tables.resize(2);
  for (int l = 0; l < 2; ++l) {
    for (int b = per_layer - 1; b >= 0; --b) c.tables[l].push_back(2 * b + l);
  }
  // Every float of the pool distinct (exact integers below 2^24).
  c.pool.resize(static_cast<size_t>(2 * per_layer) * c.layout.BlockFloats());
  std::iota(c.pool.begin(), c.pool.end(), 0.0f);
  // Few distinct (ts, mri) pairs, so many slots score exactly alike: in rows 0, 1 and 3 the
  // last slot kept ties with 60 to 120 others, and the older ones must win.
  c.state.resize(2 * 4 * static_cast<size_t>(c.cap));
  const size_t plane = c.state.size() / 2;
  uint32_t x = 12345;
  for (size_t i = 0; i < plane; ++i) {
    x = x * 1664525u + 1013904223u;
    c.state[i] = c.t - static_cast<int32_t>((x >> 8) % 40) * 7;  // ts
    c.state[plane + i] = static_cast<int32_t>((x >> 20) % 9);    // mri
  }
  return CompareLazyEvict(backend, c);
}

}  // namespace recall::kernels
