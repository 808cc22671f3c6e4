// A model's calibrated eviction settings, as `recall calibrate-window --out FILE` writes them
// and `recall-worker --calibration FILE` (and so `recall serve`) takes them as the session
// defaults (flags given beside it still win):
//   {"format": "recall-eviction-calibration", "version": 1, "policy": "lazy+",
//    "budget_fraction": 0.2, "window": 32, "alpha": 0.03, "alpha_uniform": 3,
//    "value_protection": 0.1, "meta_score": "caote", "layer_budgets": "uniform"}
// `policy` and `budget_fraction` are what the alpha was measured with (the policy's cache at
// that fraction of the text, against the full cache); all four become the worker's session
// defaults. Both are optional in the file (a missing policy or fraction leaves the worker's;
// the worker warns when that policy is full, which does not use the rest),
// as are the last four (lazy+'s relative threshold when it won the search, and the value
// protection, meta score and layer budgets the search ran with; missing: 0, 0, "none",
// "uniform"). A layer-budget profile path that is not absolute is taken relative to the
// calibration file's folder.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace recall::serving {

struct EvictionCalibration {
  std::string policy;
  double budget_fraction = 0;
  int window = 0;
  double alpha = 0;
  double alpha_uniform = 0;  // > 0: lazy+'s threshold alpha_uniform / len won the search
  double value_protection = 0;
  std::string meta_score = "none";
  std::string layer_budgets = "uniform";  // recall serve's --layer-budgets
};

// NotFound when the file cannot be read; InvalidArgument naming the file and the field when it
// is not such a JSON object (any content, however broken, is an error, never a crash).
absl::StatusOr<EvictionCalibration> ReadEvictionCalibration(const std::string& path);

// The file's text (written whole by recall calibrate-window --out).
std::string EvictionCalibrationJson(const EvictionCalibration& c);

}  // namespace recall::serving
