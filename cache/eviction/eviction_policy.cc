#include "cache/eviction/eviction_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cache/eviction/full_policy.h"
#include "cache/eviction/h2o_policy.h"
#include "cache/eviction/lazy_plus_policy.h"
#include "cache/eviction/lazy_policy.h"
#include "cache/eviction/rkv_policy.h"
#include "cache/eviction/snapkv_policy.h"
#include "cache/eviction/streaming_policy.h"
#include "cache/eviction/tova_policy.h"
#include "cache/eviction/vase_policy.h"
#include "common/logging.h"

namespace recall::cache::eviction {

namespace {

// Room for `n` elements with a little slack, a 32nd and 4 more: appends of one slot then
// reallocate once in n / 32 steps (a copy of the state, as cheap as one Observe over it),
// and the capacity stays close to the size.
size_t Roomy(size_t n) { return n + n / 32 + 4; }

template <typename T>
void Append(std::vector<T>& v, int n, T value) {
  const size_t want = v.size() + static_cast<size_t>(n);
  if (want > v.capacity()) v.reserve(Roomy(want));
  v.insert(v.end(), static_cast<size_t>(n), value);
}

// Gives memory back when the capacity passes twice the slack over the size (after an
// eviction, or a long prompt compacted to its budget).
template <typename T>
void Fit(std::vector<T>& v, size_t floor) {
  if (v.capacity() <= std::max(floor, Roomy(Roomy(v.size())))) return;
  std::vector<T> fitted;
  fitted.reserve(std::max(floor, Roomy(v.size())));
  fitted.assign(v.begin(), v.end());
  v.swap(fitted);
}

template <typename T>
void CompactArray(std::vector<T>& v, const std::vector<int32_t>& keep, int32_t floor) {
  for (size_t i = 0; i < keep.size(); ++i) v[i] = v[static_cast<size_t>(keep[i])];
  v.resize(keep.size());
  Fit(v, static_cast<size_t>(floor));
}

}  // namespace

int64_t HeadState::bytes() const {
  return static_cast<int64_t>(ts.capacity() * sizeof(int32_t) + mri.capacity() * sizeof(int32_t) +
                              score.capacity() * sizeof(float) +
                              compact.capacity() * sizeof(CompactSlot));
}

int64_t HeadStateBytesBound(uint32_t arrays, int slots) {
  const int64_t per_slot =
      4 * ((arrays & kTsArray ? 1 : 0) + (arrays & kMriArray ? 1 : 0) +
           (arrays & kScoreArray ? 1 : 0)) +
      (arrays & kCompactSlotArray ? static_cast<int64_t>(sizeof(CompactSlot)) : 0);
  return per_slot * static_cast<int64_t>(Roomy(static_cast<size_t>(slots)));
}

void HeadState::Reserve(int n) {
  reserved = std::max(reserved, n);
  if (arrays & kTsArray) ts.reserve(static_cast<size_t>(n));
  if (arrays & kMriArray) mri.reserve(static_cast<size_t>(n));
  if (arrays & kScoreArray) score.reserve(static_cast<size_t>(n));
  if (arrays & kCompactSlotArray) compact.reserve(static_cast<size_t>(n));
}

void AppendSlots(HeadState* state, int n, int t) {
  RECALL_CHECK(n >= 0) << "AppendSlots: n = " << n;
  if (state->arrays & kTsArray) Append(state->ts, n, t - 1);
  if (state->arrays & kMriArray) Append(state->mri, n, 0);
  if (state->arrays & kScoreArray) Append(state->score, n, 0.0f);
  if (state->arrays & kCompactSlotArray) {
    Append(state->compact, n, CompactSlot{static_cast<uint16_t>(t - 1), 0, 0});
  }
  state->slots += n;
}

void CompactState(HeadState* state, const std::vector<int32_t>& keep) {
  const int len = state->size();
  int32_t prev = -1;
  for (const int32_t src : keep) {
    RECALL_CHECK(src > prev && src < len) << "CompactState: keep list must ascend within length";
    prev = src;
  }
  if (state->arrays & kTsArray) CompactArray(state->ts, keep, state->reserved);
  if (state->arrays & kMriArray) CompactArray(state->mri, keep, state->reserved);
  if (state->arrays & kScoreArray) CompactArray(state->score, keep, state->reserved);
  if (state->arrays & kCompactSlotArray) CompactArray(state->compact, keep, state->reserved);
  state->slots = static_cast<int32_t>(keep.size());
}

const std::vector<std::string>& PolicyNames() {
  static const std::vector<std::string>* const kNames = new std::vector<std::string>{
      "full", "streaming", "h2o", "tova", "lazy", "lazy+", "vase", "rkv", "snapkv"};
  return *kNames;
}

bool IsEvictingPolicy(const std::string& name) {
  const std::vector<std::string>& names = PolicyNames();
  return name != "full" && std::find(names.begin(), names.end(), name) != names.end();
}

std::string EvictingPolicyList() {
  std::string list;
  for (const std::string& n : PolicyNames()) {
    if (n != "full") absl::StrAppend(&list, list.empty() ? "" : ", ", n);
  }
  return list;
}

bool TakesCaote(const std::string& policy) {
  return policy == "h2o" || policy == "tova" || policy == "snapkv" || policy == "lazy" ||
         policy == "lazy+";
}

bool TakesAlpha(const std::string& policy) { return policy == "lazy" || policy == "lazy+"; }

absl::StatusOr<std::unique_ptr<EvictionPolicy>> CreatePolicy(const PolicyOptions& options) {
  if (options.window < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("eviction policy: window must be >= 1, got ", options.window));
  }
  if (!(options.alpha >= 0.0f && options.alpha <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("eviction policy: alpha must be in [0, 1], got ", options.alpha));
  }
  if (!(options.merge_threshold >= -1.0f && options.merge_threshold <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "eviction policy: merge_threshold must be in [-1, 1], got ", options.merge_threshold));
  }
  if (!(options.alpha_uniform >= 0.0f && options.alpha_uniform <= 1e6f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "eviction policy: alpha_uniform must be in [0, 1e6], got ", options.alpha_uniform));
  }
  if (options.alpha_uniform > 0.0f && options.name != "lazy+") {
    return absl::InvalidArgumentError(absl::StrCat(
        "eviction policy: alpha_uniform is lazy+'s threshold, not '", options.name, "''s"));
  }
  if (!(options.attention_decay >= 0.0f && options.attention_decay < 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "eviction policy: attention_decay must be in [0, 1), got ", options.attention_decay));
  }
  if (!(options.attention_weight >= 0.0f && options.attention_weight <= 1e6f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "eviction policy: attention_weight must be in [0, 1e6], got ", options.attention_weight));
  }
  if (options.sinks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("eviction policy: sinks must be >= 0, got ", options.sinks));
  }
  if (!(options.value_protection >= 0.0f && options.value_protection < 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "eviction policy: value_protection must be in [0, 1), got ", options.value_protection));
  }
  if (options.interval < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("eviction policy: interval must be >= 1, got ", options.interval));
  }
  if (options.query_window < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("eviction policy: query_window must be >= 1, got ", options.query_window));
  }
  if (!(options.lambda >= 0.0f && options.lambda <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("eviction policy: lambda must be in [0, 1], got ", options.lambda));
  }
  const std::string& n = options.name;
  if (options.meta_score == PolicyOptions::MetaScore::kCaote && !TakesCaote(n)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "eviction policy: meta_score caote needs a policy whose score is a non-negative "
        "attention estimate (h2o, tova, snapkv, lazy, lazy+), got '",
        n, "'"));
  }
  if (options.meta_score == PolicyOptions::MetaScore::kCaoteCurrentQuery && n == "snapkv") {
    return absl::InvalidArgumentError(
        "eviction policy: meta_score caote_current_query needs a decode-time policy; snapkv "
        "compresses at prefill (use meta_score caote)");
  }
  if (n == "full") return std::make_unique<FullKvPolicy>(options);
  if (n == "streaming") return std::make_unique<StreamingPolicy>(options);
  if (n == "h2o") return std::make_unique<H2oPolicy>(options);
  if (n == "tova") return std::make_unique<TovaPolicy>(options);
  if (n == "lazy") return std::make_unique<LazyPolicy>(options);
  if (n == "lazy+") return std::make_unique<LazyPlusPolicy>(options);
  if (n == "vase") return std::make_unique<VasePolicy>(options);
  if (n == "rkv") return std::make_unique<RkvPolicy>(options);
  if (n == "snapkv") return std::make_unique<SnapKvPolicy>(options);
  return absl::InvalidArgumentError(absl::StrCat("eviction policy: unknown name '", n,
                                                 "'; valid names: ",
                                                 absl::StrJoin(PolicyNames(), ", ")));
}

void ReduceGqaMax(const float* probs, int n_heads, int n_kv_heads, int64_t stride,
                  const int32_t* lengths, float* out) {
  RECALL_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0)
      << "ReduceGqaMax: n_heads " << n_heads << " not a multiple of n_kv_heads " << n_kv_heads;
  const int group = n_heads / n_kv_heads;
  for (int kh = 0; kh < n_kv_heads; ++kh) {
    const int len = lengths[kh];
    RECALL_CHECK(len >= 0 && len <= stride) << "ReduceGqaMax: length " << len << " > stride";
    float* o = out + kh * stride;
    const float* first = probs + static_cast<int64_t>(kh) * group * stride;
    std::copy(first, first + len, o);
    for (int g = 1; g < group; ++g) {
      const float* p = first + g * stride;
      for (int j = 0; j < len; ++j) o[j] = std::max(o[j], p[j]);
    }
  }
}

void SumOverHeads(const float* probs, int n_heads, int64_t stride, int len, double* sums) {
  RECALL_CHECK(n_heads > 0 && len <= stride) << "SumOverHeads: bad shape";
  std::fill(sums, sums + len, 0.0);
  for (int h = 0; h < n_heads; ++h) {
    const float* p = probs + h * stride;
    for (int j = 0; j < len; ++j) sums[j] += p[j];
  }
}

void AverageOverHeads(const float* probs, int n_heads, int64_t stride, int len, float* out) {
  RECALL_CHECK(n_heads > 0 && len <= stride) << "AverageOverHeads: bad shape";
  const double inv = 1.0 / n_heads;
  for (int j = 0; j < len; ++j) {
    double sum = 0.0;  // heads in SumOverHeads' order, so both give the same mean
    for (int h = 0; h < n_heads; ++h) sum += probs[h * stride + j];
    out[j] = static_cast<float>(sum * inv);
  }
}

float ValueRange(const float* v_row, int head_dim) {
  if (head_dim <= 0) return 0.0f;
  float lo = v_row[0], hi = v_row[0];
  for (int d = 1; d < head_dim; ++d) {
    lo = std::min(lo, v_row[d]);
    hi = std::max(hi, v_row[d]);
  }
  return hi - lo;
}

}  // namespace recall::cache::eviction
