#include "kernels/cpu/rerotate_check.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace recall::kernels {

absl::Status CompareRerotate(Backend& backend, const RerotateCase& c) {
  std::vector<const int32_t*> tables;
  std::vector<int32_t> counts;
  for (const std::vector<int32_t>& t : c.tables) {
    tables.push_back(t.data());
    counts.push_back(static_cast<int32_t>(t.size()));
  }
  RerotateArgs a;
  a.kv.layout = c.layout;
  a.kv.block_tables = tables.data();
  a.kv.block_counts = counts.data();
  a.lens = c.lens.data();
  a.from = c.from.data();
  a.to = c.to.data();
  a.stride = c.stride;
  a.theta = c.theta;
  a.style = c.style;

  std::vector<float> want = c.pool;
  RerotateArgs h = a;
  h.kv.pool = want.data();
  CreateCpuBackend(CpuBackendOptions{1, false})->RerotateKeys(h);

  std::vector<float> got = c.pool;
  Memory& memory = backend.memory();
  RECALL_ASSIGN_OR_RETURN(Buffer d_pool, Buffer::Allocate(memory, got.size() * sizeof(float)));
  memory.CopyIn(d_pool.get(), got.data(), got.size() * sizeof(float));
  RerotateArgs d = a;
  d.kv.pool = d_pool.as<float>();
  backend.RerotateKeys(d);
  memory.CopyOut(got.data(), d_pool.get(), got.size() * sizeof(float));
  RECALL_RETURN_IF_ERROR(backend.Health());

  const std::string who = absl::StrCat(backend.Name(), " backend: RerotateKeys ");
  const int hd = c.layout.head_dim;
  std::vector<bool> moved(got.size(), false);
  const PagedKv host{c.layout, want.data(), tables.data(), counts.data()};
  for (int r = 0; r < c.layout.n_layers * c.layout.n_kv_heads; ++r) {
    const PagedKvHead head = host.Head(r / c.layout.n_kv_heads, r % c.layout.n_kv_heads);
    for (int s = 0; s < c.lens[r]; ++s) {
      const int64_t at = head.K(s) - want.data();
      double err = 0, norm = 0;
      for (int i = 0; i < hd; ++i) {
        err += std::pow(double(got[at + i]) - want[at + i], 2);
        norm += std::pow(double(want[at + i]), 2);
        moved[at + i] = true;
      }
      if (!(std::sqrt(err) <= 1e-5 * std::sqrt(norm) + 1e-30)) {
        return absl::InternalError(absl::StrCat(
            who, "moved the key of row ", r, " slot ", s, " from ", c.from[r * c.stride + s],
            " to ", c.to[r * c.stride + s], " with relative error ",
            std::sqrt(err / std::max(norm, 1e-30)), " against the host reference"));
      }
    }
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (!moved[i] && got[i] != c.pool[i]) {
      return absl::InternalError(absl::StrCat(who, "changed pool float ", i, " (", c.pool[i],
                                              " -> ", got[i], "), which no moved key holds"));
    }
  }
  return absl::OkStatus();
}

RerotateCase MakeRerotateCase(int head_dim, RopeStyle style, int max_len, uint32_t seed) {
  RerotateCase c;
  c.layout = PagedKvLayout{2, 2, head_dim, 16};
  c.style = style;
  c.stride = max_len;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  c.lens = {max_len, max_len / 3, 0, max_len - 5};
  const int per_layer = (max_len + c.layout.block_tokens - 1) / c.layout.block_tokens;
  // Layer l's blocks are every other block of the pool, in reverse, so a wrong table lookup
  // touches another layer's rows.
  c.tables.resize(2);
  for (int l = 0; l < 2; ++l) {
    for (int b = per_layer - 1; b >= 0; --b) c.tables[l].push_back(2 * b + l);
  }
  c.pool.resize(static_cast<size_t>(2 * per_layer) * c.layout.BlockFloats());
  for (float& x : c.pool) x = uni(rng);
  c.from.assign(4 * c.stride, 0);
  c.to.assign(4 * c.stride, 0);
  for (int r = 0; r < 4; ++r) {
    int32_t p = r == 3 ? 7 : 20000;
    for (int s = 0; s < c.lens[r]; ++s) {
      p += 1 + static_cast<int32_t>(rng() % 50);
      c.from[r * c.stride + s] = p;
      c.to[r * c.stride + s] = r == 3 ? p + 300 : 4096 - c.lens[r] + s;
      if (s % 17 == 5) c.to[r * c.stride + s] = p;  // some keys stay where they are
    }
  }
  return c;
}

absl::Status CheckRerotate(Backend& backend) {
  RECALL_RETURN_IF_ERROR(
      CompareRerotate(backend, MakeRerotateCase(64, RopeStyle::kInterleaved, 300, 1)));
  return CompareRerotate(backend, MakeRerotateCase(128, RopeStyle::kHalfSplit, 200, 2));
}

}  // namespace recall::kernels
