// `recall calibrate`: EpiCache's per-layer sensitivity profile for a model (EVICTION.md §2).
// Runs offline::LayerSensitivity over a calibration text (--text FILE, or a built-in one)
// and writes the JSON profile (cache/eviction/sensitivity_profile.h) that
// `--layer-budgets FILE` turns into per-layer budgets.
#pragma once

#include <string>
#include <vector>

namespace recall::cli {

// Returns the process exit code (0 ok, 2 bad usage, 1 runtime failure).
int RunCalibrateLayers(const std::vector<std::string>& argv);

}  // namespace recall::cli
