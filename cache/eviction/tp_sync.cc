#include "cache/eviction/tp_sync.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace recall::cache::eviction {
namespace {

// One candidate set as doubles (exact for slot indices and float value ranges):
// [n_always, begin, end, value_protection, always..., score[begin, end),
//  value_range[begin, end) if value_protection > 0].
void Encode(const CandidateSet& c, std::vector<double>* out) {
  out->push_back(static_cast<double>(c.always.size()));
  out->push_back(c.begin);
  out->push_back(c.end);
  out->push_back(c.value_protection);
  for (int32_t s : c.always) out->push_back(s);
  for (int s = c.begin; s < c.end; ++s) out->push_back(c.score[static_cast<size_t>(s)]);
  if (c.value_protection > 0.0f) {
    for (int s = c.begin; s < c.end; ++s) out->push_back(c.value_range[static_cast<size_t>(s)]);
  }
}

// Reads one set from `in`; returns the number of doubles it used.
size_t Decode(const double* in, CandidateSet* c) {
  size_t i = 0;
  const int n_always = static_cast<int>(in[i++]);
  c->begin = static_cast<int>(in[i++]);
  c->end = static_cast<int>(in[i++]);
  c->value_protection = static_cast<float>(in[i++]);
  c->always.resize(static_cast<size_t>(n_always));
  for (int k = 0; k < n_always; ++k) c->always[static_cast<size_t>(k)] = static_cast<int32_t>(in[i++]);
  c->score.resize(static_cast<size_t>(std::max(c->end, 0)));
  for (int s = c->begin; s < c->end; ++s) c->score[static_cast<size_t>(s)] = in[i++];
  c->value_range.clear();
  if (c->value_protection > 0.0f) {
    c->value_range.resize(static_cast<size_t>(c->end));
    for (int s = c->begin; s < c->end; ++s) {
      c->value_range[static_cast<size_t>(s)] = static_cast<float>(in[i++]);
    }
  }
  c->captured = c->end > c->begin;
  return i;
}

}  // namespace

absl::Status GatherCandidates(kernels::Communicator& comm, const TpHeads& heads,
                              const CandidateSet* local, GatherScratch* scratch,
                              std::vector<CandidateSet>* global) {
  const int n = comm.size();
  scratch->send.clear();
  scratch->send.push_back(heads.offset);
  scratch->send.push_back(heads.n_local);
  for (int h = 0; h < heads.n_local; ++h) Encode(local[h], &scratch->send);
  int64_t size = static_cast<int64_t>(scratch->send.size());
  scratch->sizes.resize(static_cast<size_t>(n));
  RECALL_RETURN_IF_ERROR(comm.AllGather(&size, scratch->sizes.data(), 1, kernels::CommDType::kI64));
  const int64_t max_size = *std::max_element(scratch->sizes.begin(), scratch->sizes.end());
  scratch->send.resize(static_cast<size_t>(max_size), 0.0);
  scratch->recv.resize(static_cast<size_t>(max_size) * n);
  RECALL_RETURN_IF_ERROR(comm.AllGather(scratch->send.data(), scratch->recv.data(), max_size,
                                        kernels::CommDType::kF64));
  global->resize(static_cast<size_t>(heads.n_total));
  std::vector<bool>& seen = scratch->seen;
  seen.assign(static_cast<size_t>(heads.n_total), false);
  for (int r = 0; r < n; ++r) {
    const double* in = scratch->recv.data() + static_cast<int64_t>(r) * max_size;
    const int offset = static_cast<int>(in[0]), n_local = static_cast<int>(in[1]);
    size_t i = 2;
    for (int h = 0; h < n_local; ++h) {
      const int g = offset + h;
      if (g < 0 || g >= heads.n_total) {
        return absl::InternalError(absl::StrCat("tensor-parallel eviction: rank ", r,
                                                " reports KV head ", g, " outside [0, ",
                                                heads.n_total, ")"));
      }
      CandidateSet* target = &(*global)[static_cast<size_t>(g)];
      if (seen[static_cast<size_t>(g)]) {
        // A replicated head: the first rank holding it speaks for it.
        i += Decode(in + i, &scratch->replica);
        continue;
      }
      seen[static_cast<size_t>(g)] = true;
      i += Decode(in + i, target);
    }
  }
  for (int g = 0; g < heads.n_total; ++g) {
    if (!seen[static_cast<size_t>(g)]) {
      return absl::InternalError(
          absl::StrCat("tensor-parallel eviction: no rank holds KV head ", g));
    }
  }
  return absl::OkStatus();
}

absl::Status VerifyKeepDigests(kernels::Communicator& comm, const TpHeads& heads, int step,
                               uint64_t common, uint64_t replica) {
  const int n = comm.size();
  const uint64_t mine[3] = {common, static_cast<uint64_t>(heads.offset), replica};
  std::vector<uint64_t> all(static_cast<size_t>(3 * n));
  RECALL_RETURN_IF_ERROR(comm.AllGather(mine, all.data(), 3, kernels::CommDType::kU64));
  for (int r = 1; r < n; ++r) {
    if (all[3 * r] != all[0]) {
      return absl::InternalError(absl::StrCat(
          "tensor-parallel eviction diverged at step ", step, ": rank ", r,
          " took different eviction decisions than rank 0 (kept-index checksum ",
          absl::Hex(all[3 * r]), " vs ", absl::Hex(all[0]), ")"));
    }
  }
  for (int r = 1; r < n; ++r) {
    for (int q = 0; q < r; ++q) {
      if (all[3 * r + 1] == all[3 * q + 1] && all[3 * r + 2] != all[3 * q + 2]) {
        return absl::InternalError(absl::StrCat(
            "tensor-parallel eviction diverged at step ", step, ": ranks ", q, " and ", r,
            " hold the same KV heads (from ", all[3 * r + 1], ") but kept different slots"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace recall::cache::eviction
