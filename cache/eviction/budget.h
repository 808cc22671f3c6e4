// BudgetAllocator: per-layer KV budgets (tokens per KV head) for one sequence.
//
// A total budget C (per layer on average) is split over the L layers by per-layer weights:
//   budget_l = reserved + share_l,  sum_l share_l = L * (C - reserved) exactly,
// where share_l is proportional to weight_l and rounded by the largest-remainder method
// (ties to the lower layer), so the budgets always sum to L * C. `reserved` is the floor
// every layer gets (SessionEvictor sets it to the policy's min_budget(), e.g. the window W).
//
// Kinds:
//  - kUniform: weight_l = 1, so every layer gets exactly C.
//  - kPyramid (PyramidKV): linearly decreasing from layer 0 to layer L-1 with beta:
//      min = 1 / beta,  max = 2 - min,  weight_l = max - l * (max - min) / (L - 1)
//    (weights average 1). This is the continuous form of PyramidKV's integer code
//    (min_num = (C - W) / beta, max_num = 2 (C - W) - min_num, step = (max - min) / (L - 1),
//    budget_l = max_num - l * step + W), with `reserved` playing W; the largest-remainder
//    rounding makes the sum exact where PyramidKV's integer step loses up to L - 1 tokens.
//    L = 1 gives uniform.
//  - kProfile: weights read from a file, in one of two formats (told apart by the first
//    non-space character being '{'):
//    * text: one positive number per layer (see ParseBudgetProfile), used as the weights.
//    * JSON: a layer sensitivity profile written by `recall calibrate`
//      (sensitivity_profile.h). EpiCache's released allocation: sigma min-max normalised,
//      weight_l = (1 - sigma_hat_l)^sensitivity_alpha, floor M/4 of the mean budget M = C.
//      The floor is applied by raising `reserved` to max(reserved, ceil(C / 4)) for this
//      allocator, so budget_l = reserved + share_l still sums to L * C exactly and no layer
//      (not even the least sensitive, whose weight is 0) gets less than C / 4. The
//      reference clamps each budget to the floor instead, which can push the sum above
//      L * C.
//
// C is given in tokens, or as a fraction of the sequence length (then C = ceil(fraction *
// seq_len), recomputed on every Allocate call). C below `reserved` is raised to it.
//
// Not thread safe (Allocate reuses scratch); one allocator per sequence or per thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace recall::cache::eviction {

struct BudgetOptions {
  enum class Kind { kUniform, kPyramid, kProfile };
  enum class Unit { kTokens, kFraction };

  Kind kind = Kind::kUniform;
  Unit unit = Unit::kTokens;
  // C: tokens (>= 1) for kTokens; a fraction in (0, 1] of the sequence length for kFraction.
  double budget = 1024;
  // PyramidKV's beta (> 1).
  double beta = 20.0;
  // kProfile: path of the profile file.
  std::string profile_path;
  // kProfile: the profile's weights once read (LoadProfile), so that allocators made from
  // these options do not read the file again; profile_json: it was a JSON sensitivity
  // profile (its budgets get EpiCache's floor of a quarter).
  std::vector<double> profile_weights;
  bool profile_json = false;
  // kProfile with a JSON sensitivity profile: alpha of weight_l = (1 - sigma_hat_l)^alpha,
  // in [0.5, 3] (EpiCache uses 1.1 to 1.3).
  double sensitivity_alpha = 1.2;
  // Tokens every layer gets before the weighted split (>= 0).
  int reserved = 0;
  // Ada-KV (head_adaptive.h): each layer keeps budget_l * n_kv_heads slots chosen across its
  // KV heads instead of budget_l per head, every head keeping at least `head_safeguard` (in
  // [0, 1]) of its own selection budget. Applied by SessionEvictor; the allocator itself
  // still returns per-head budgets. Not for layer-shared policies (TOVA).
  bool head_adaptive = false;
  double head_safeguard = 0.2;  // kAdaKvSafeguard
};

// Parses a profile: one positive finite number per non-empty line; '#' starts a comment.
// `source` names the file in messages. InvalidArgument naming source, line and problem:
// "<source>:<line>: '<text>' is not a number" / "... must be positive", or
// "<source>: expected <n_layers> layer weights, found <k>".
absl::StatusOr<std::vector<double>> ParseBudgetProfile(absl::string_view text,
                                                       absl::string_view source, int n_layers);

// Sets the per-layer split from a spec: "uniform", "pyramid", or the path of a profile (a
// weight file or a `recall calibrate` JSON; alpha is the JSON's sensitivity_alpha). The
// profile itself is read by BudgetAllocator::Create.
void ApplyLayerBudgets(const std::string& spec, double alpha, BudgetOptions* options);

// For kProfile options whose file is not read yet: reads it for `n_layers` layers into
// profile_weights (errors as BudgetAllocator::Create). Other kinds: nothing.
absl::Status LoadProfile(int n_layers, BudgetOptions* options);

class BudgetAllocator {
 public:
  // InvalidArgument on a bad option (message names the field) or profile (message names
  // the file); NotFound if the profile file cannot be read (message names the file).
  static absl::StatusOr<BudgetAllocator> Create(const BudgetOptions& options, int n_layers);

  // Writes the L per-layer budgets for a sequence of `seq_len` tokens into out[0..L).
  void Allocate(int64_t seq_len, int32_t* out);

  // C for a sequence of `seq_len` tokens (before the per-layer split), >= reserved.
  int64_t Total(int64_t seq_len) const;

  int n_layers() const { return static_cast<int>(weights_.size()); }
  const std::vector<double>& weights() const { return weights_; }
  const BudgetOptions& options() const { return options_; }

 private:
  BudgetAllocator(const BudgetOptions& options, std::vector<double> weights,
                  bool quarter_floor);

  BudgetOptions options_;
  std::vector<double> weights_;  // [L], normalised to sum L
  bool quarter_floor_;           // JSON profile: reserved is at least ceil(C / 4)
  // Scratch, and the last result (recomputed only when C changes).
  std::vector<double> remainder_;
  std::vector<int32_t> order_;
  std::vector<int32_t> last_;
  int64_t last_total_ = -1;
};

}  // namespace recall::cache::eviction
