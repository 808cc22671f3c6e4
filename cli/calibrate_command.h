// `recall calibrate-window`: LazyEviction's window W for a model (EVICTION.md §1): the
// percentile (default 80th) of the maximum recurrence intervals observed while the model
// generates a small calibration sample with its full cache.
#pragma once

#include <string>
#include <vector>

namespace recall::cli {

// Returns the process exit code (0 ok, 2 bad usage, 1 runtime failure).
int RunCalibrateWindow(const std::vector<std::string>& argv);

}  // namespace recall::cli
