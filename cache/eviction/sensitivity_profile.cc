#include "cache/eviction/sensitivity_profile.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace recall::cache::eviction {
namespace {

using nlohmann::json;

absl::Status Bad(absl::string_view source, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", problem));
}

}  // namespace

std::string SensitivityProfileJson(const SensitivityProfile& profile) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();  // fields in the documented order
  j["format"] = kSensitivityFormat;
  j["version"] = kSensitivityVersion;
  j["model"] = profile.model;
  j["n_layers"] = profile.sigma.size();
  j["sigma"] = profile.sigma;
  j["block"] = profile.block;
  j["sinks"] = profile.sinks;
  j["window"] = profile.window;
  j["tokens"] = profile.tokens;
  // Invalid UTF-8 in the model path is replaced rather than thrown on.
  return j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

absl::StatusOr<std::vector<double>> ParseSensitivityProfile(absl::string_view text,
                                                            absl::string_view source,
                                                            int n_layers) {
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    return Bad(source, absl::StrCat("not JSON: ", e.what()));
  }
  if (!j.is_object()) return Bad(source, "not a JSON object");
  auto format = j.find("format");
  if (format == j.end() || !format->is_string() ||
      format->get<std::string>() != kSensitivityFormat) {
    return Bad(source,
               absl::StrCat("\"format\" is ", format == j.end() ? "missing" : format->dump(),
                            ", expected \"", kSensitivityFormat, "\""));
  }
  auto version = j.find("version");
  if (version == j.end() || !version->is_number_integer() ||
      version->get<int64_t>() != kSensitivityVersion) {
    return Bad(source,
               absl::StrCat("\"version\" is ", version == j.end() ? "missing" : version->dump(),
                            ", expected ", kSensitivityVersion));
  }
  auto layers = j.find("n_layers");
  if (layers == j.end() || !layers->is_number_integer()) {
    return Bad(source, "\"n_layers\" is missing or not an integer");
  }
  if (layers->get<int64_t>() != n_layers) {
    return Bad(source,
               absl::StrCat("expected ", n_layers, " layers, profile has ", layers->dump()));
  }
  auto sigma = j.find("sigma");
  if (sigma == j.end() || !sigma->is_array()) {
    return Bad(source, "\"sigma\" is missing or not an array");
  }
  std::vector<double> out;
  out.reserve(sigma->size());
  for (size_t i = 0; i < sigma->size(); ++i) {
    const json& v = (*sigma)[i];
    if (!v.is_number()) {
      return Bad(source, absl::StrCat("sigma[", i, "] = ", v.dump(), " is not a number"));
    }
    const double x = v.get<double>();
    if (!std::isfinite(x)) return Bad(source, absl::StrCat("sigma[", i, "] is not finite"));
    out.push_back(x);
  }
  if (static_cast<int64_t>(out.size()) != n_layers) {
    return Bad(source, absl::StrCat("\"sigma\" has ", out.size(), " values, expected ", n_layers,
                                    " (one per layer)"));
  }
  return out;
}

std::vector<double> SensitivityWeights(const std::vector<double>& sigma, double alpha) {
  const auto [lo, hi] = std::minmax_element(sigma.begin(), sigma.end());
  std::vector<double> w(sigma.size(), 1.0);
  const double range = *hi - *lo;
  if (!(range > 0.0)) return w;  // all equal: uniform
  for (size_t l = 0; l < sigma.size(); ++l) {
    const double hat = (sigma[l] - *lo) / range;
    w[l] = std::pow(std::max(0.0, 1.0 - hat), alpha);
  }
  return w;
}

}  // namespace recall::cache::eviction
