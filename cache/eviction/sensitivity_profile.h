// Layer sensitivity profiles (EpiCache, EVICTION.md §2): what `recall calibrate` writes and
// what BudgetOptions::Kind::kProfile reads when the file is JSON.
//
// A profile holds sigma_l per layer: the mean cosine similarity between the layer's keys
// under a full causal pass and under a block-masked pass (offline::LayerSensitivity). A layer
// whose keys barely change when the context is cut to blocks (sigma near 1) is insensitive
// and gets a smaller share of the KV budget. The file:
//
//   {"format": "recall-layer-sensitivity", "version": 1, "model": "<path or name>",
//    "n_layers": L, "sigma": [L numbers], "block": B, "sinks": S, "window": W, "tokens": N}
//
// Pure functions; thread safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace recall::cache::eviction {

inline constexpr char kSensitivityFormat[] = "recall-layer-sensitivity";
inline constexpr int kSensitivityVersion = 1;

struct SensitivityProfile {
  std::string model;          // the model's path or name
  std::vector<double> sigma;  // [n_layers], finite; n_layers is sigma.size()
  int block = 0;              // calibration block length (tokens)
  int sinks = 0;              // sink tokens every block saw
  int window = 0;             // tokens per averaging window
  int64_t tokens = 0;         // calibration text length (tokens)
};

// The profile as pretty-printed JSON (ends with a newline). Doubles round-trip exactly.
// REQUIRES: every sigma is finite.
std::string SensitivityProfileJson(const SensitivityProfile& profile);

// Reads sigma from a profile's JSON text. `source` names the file in messages.
// InvalidArgument "<source>: <problem>": not JSON, not an object, "format" other than
// kSensitivityFormat, "version" other than 1, "n_layers" missing or not an integer,
// "expected <n_layers> layers, profile has <k>", "sigma" missing or not an array, a sigma
// that is not a number or not finite, or a sigma count other than "n_layers". Other fields
// are informational and not checked.
absl::StatusOr<std::vector<double>> ParseSensitivityProfile(absl::string_view text,
                                                            absl::string_view source, int n_layers);

// EpiCache's allocation weights (unnormalised): sigma_hat = min-max normalised sigma,
// w_l = (1 - sigma_hat_l)^alpha. The least sensitive layer (highest sigma) gets 0, the most
// sensitive 1; all sigma equal gives 1 for every layer. REQUIRES: sigma non-empty and
// finite, alpha > 0.
std::vector<double> SensitivityWeights(const std::vector<double>& sigma, double alpha);

}  // namespace recall::cache::eviction
