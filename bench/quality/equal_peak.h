// Policies compared at equal peak memory (EVICTION.md section 6): a server reserves the peak
// bytes a session holds, not its nominal budget, and policies with a buffer or a lag window
// (lazy and VaSE hold C + W, R-KV C + its interval) hold more than their budget. From a budget
// sweep, each policy's (peak KV fraction, top-1, KL) points are interpolated linearly at
// target peak fractions; a target outside a policy's swept peaks is not reported (no
// extrapolation), and a policy that never evicted on the texts says so.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bench/quality/quality_eval.h"
#include "nlohmann/json.hpp"

namespace recall::bench {

struct PeakPoint {
  double peak = 0;  // mean peak KV bytes held / mean FullKV bytes, over the texts
  double top1 = 0;  // top-1 agreement with FullKV
  double kl = 0;    // mean KL(full || evicted), nats
};

struct EqualPeakRow {
  std::string policy;
  bool never_evicts = false;                 // no run of any budget evicted a slot
  std::vector<PeakPoint> points;             // the sweep, peak ascending
  std::vector<std::optional<PeakPoint>> at;  // per target, interpolated
};

// One row per policy (in first-seen order; "full" left out), from the per-configuration
// stats of one text set. Peaks are fractions of each configuration's own FullKV bytes, or,
// when `bytes_of` is given, of bytes_of[i]'s (the fp32 run of the same texts and
// configurations), so that runs on KV types of other widths are placed at the bytes they
// really hold; `suffix` is appended to the policy names (" f16").
std::vector<EqualPeakRow> EqualPeak(const std::vector<QualityConfig>& configs,
                                    const std::vector<QualityStats>& stats,
                                    const std::vector<double>& targets,
                                    const std::vector<QualityStats>* bytes_of = nullptr,
                                    const std::string& suffix = "");

// Per target, the row with the highest top-1 there (ties: lower KL), or "" where no row has
// a figure.
std::vector<std::string> BestAtEachPeak(const std::vector<EqualPeakRow>& rows);

// Prints the rows as "top-1 / KL" at each target peak, `label` naming the text set.
void PrintEqualPeak(const std::string& label, const std::vector<EqualPeakRow>& rows,
                    const std::vector<double>& targets);

// A plot of the rows' swept points (top-1 and KL against the peak held), one line per row:
// png_path + ".dat" / ".gp", then gnuplot. FailedPrecondition without gnuplot.
absl::Status WriteEqualPeakPlot(const std::string& png_path, const std::string& title,
                                const std::string& x_label, const std::vector<EqualPeakRow>& rows);

// The rows as {policy: {"never_evicts", "at": [{peak, top1, kl} or null]}}.
nlohmann::json EqualPeakJson(const std::vector<EqualPeakRow>& rows,
                             const std::vector<double>& targets);

}  // namespace recall::bench
