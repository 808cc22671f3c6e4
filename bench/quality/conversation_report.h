// Output of the conversation benchmark: the table, the JSON rows and the plot (accuracy
// and agreement with FullKV against the budget, by gnuplot when installed).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bench/quality/conversation_eval.h"
#include "nlohmann/json.hpp"

namespace recall::bench {

// One result line: a method at one budget (or a FullKV reference).
struct ConvRow {
  std::string method;   // "full", "full-1q" (one question per prompt), a policy, "episodic-..."
  std::string budget;   // "10%", "512 tok" or "-"
  double fraction = 0;  // the budget's fraction setting (0 for token budgets and FullKV)
  ConvStats stats;
};

void PrintConvTable(const std::vector<ConvRow>& rows);
nlohmann::json ConvRowsJson(const std::vector<ConvRow>& rows);

// Writes png_path + ".dat" / ".gp" and runs gnuplot: accuracy and agreement with FullKV
// against the budget (rows with a fraction), FullKV's accuracy as a line.
// FailedPrecondition if gnuplot is absent, Internal if it fails.
absl::Status WriteConvPlot(const std::string& png_path, const std::string& title,
                           const std::vector<ConvRow>& rows);

}  // namespace recall::bench
