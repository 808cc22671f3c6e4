// Output of the quality benchmark: the table, the JSON with every figure, and the PNG plot
// (drawn by gnuplot, when installed, from a data file written beside the PNG).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bench/quality/quality_eval.h"
#include "nlohmann/json.hpp"

namespace recall::bench {

// The per-configuration figures as JSON objects (means over texts and positions).
nlohmann::json ResultsJson(const std::vector<QualityConfig>& configs,
                           const std::vector<QualityStats>& stats);

// Prints one row per configuration.
void PrintTable(const std::vector<QualityConfig>& configs,
                const std::vector<QualityStats>& stats);

// Writes `text` to `path` (PermissionDenied when it cannot be opened, DataLoss when the write
// fails); WriteJson writes the JSON indented.
absl::Status WriteText(const std::string& path, const std::string& text);
absl::Status WriteJson(const std::string& path, const nlohmann::json& json);

// The benchmarks' plotting and exit helpers. FailedPrecondition when gnuplot is not
// installed / when `gnuplot GP_PATH` fails (no PNG written then).
absl::Status RequireGnuplot();
absl::Status RunGnuplot(const std::string& gp_path);
// Prints "wrote PNG" or, when the plot could not be drawn, a warning (the JSON is written).
void ReportPlot(const absl::Status& plotted, const std::string& png_path);
// Prints "error: ..." to stderr; returns the exit code 1.
int Fail(const absl::Status& s);

// True (after printing a SKIP line) when the stories260K model or tokenizer is missing, i.e.
// ../shared is absent: the benchmarks on it then exit 0.
bool SkipWithoutStories260K(const std::string& model, const std::string& tokenizer);

// Parses "--name value" pairs: handle(name, value) returns nullopt for an unknown flag, else
// whether the value was good. On a missing value, an unknown flag or a bad value it prints
// the error (with `hint` for bad values, when not empty) and returns false.
bool ParseFlagPairs(
    int argc, char** argv,
    const std::function<std::optional<bool>(const std::string& name, const char* value)>& handle,
    const std::string& hint);

// Writes path + ".dat" and path + ".gp" and runs gnuplot on them. FailedPrecondition if
// gnuplot is absent or fails (the caller warns and goes on).
absl::Status WritePlot(const std::string& png_path, const std::string& title,
                       const std::vector<QualityConfig>& configs,
                       const std::vector<QualityStats>& stats);

}  // namespace recall::bench
