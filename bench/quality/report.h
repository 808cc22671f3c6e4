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

// Writes `text` to `path` (NotFound when its directory is missing, PermissionDenied when it
// cannot be opened otherwise, DataLoss when the write fails); WriteJson writes the JSON
// indented.
absl::Status WriteText(const std::string& path, const std::string& text);
absl::Status WriteJson(const std::string& path, const nlohmann::json& json);

// The benchmarks' plotting and exit helpers. FailedPrecondition when gnuplot is not
// installed / Internal when `gnuplot GP_PATH` fails (no PNG written then).
absl::Status RequireGnuplot();
absl::Status RunGnuplot(const std::string& gp_path);
// Prints "wrote PNG" and returns 0; or, when gnuplot is not installed or there was nothing to
// plot (FailedPrecondition), a warning and 0 (the JSON is written); or, when the plot failed
// otherwise (its files or the PNG could not be written), an error on stderr and 1, the exit
// code.
[[nodiscard]] int ReportPlot(const absl::Status& plotted, const std::string& png_path);
// Prints "error: ..." to stderr; returns the exit code 1.
int Fail(const absl::Status& s);

// Whether the stories260K benchmarks can run: -1 when `model` and `tokenizer` both exist.
// Otherwise it prints why and returns the exit code: 2 (an error naming the flag) when a
// missing file was given with --model or --tokenizer, i.e. is not its default under
// `shared_dir`; 0 (a SKIP line naming what is missing) when only defaults are missing, as
// where ../shared is not set up (CI).
int CheckStories260K(const std::string& model, const std::string& tokenizer,
                     const std::string& shared_dir);

// Parses "--name value" pairs: handle(name, value) returns nullopt for an unknown flag, else
// whether the value was good. On a missing value, an unknown flag or a bad value it prints
// the error (with `hint` for bad values, when not empty) and returns false.
bool ParseFlagPairs(
    int argc, char** argv,
    const std::function<std::optional<bool>(const std::string& name, const char* value)>& handle,
    const std::string& hint);

// Writes path + ".dat" and path + ".gp" and runs gnuplot on them. FailedPrecondition if
// gnuplot is absent (the caller warns and goes on); Internal if it fails, the WriteText
// errors if a file cannot be written (see ReportPlot).
absl::Status WritePlot(const std::string& png_path, const std::string& title,
                       const std::vector<QualityConfig>& configs,
                       const std::vector<QualityStats>& stats);

}  // namespace recall::bench
