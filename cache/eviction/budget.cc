#include "cache/eviction/budget.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cache/eviction/sensitivity_profile.h"
#include "common/files.h"
#include "common/logging.h"

namespace recall::cache::eviction {
namespace {

// kProfile: the layer weights from the file, text or JSON (then *json = true).
absl::StatusOr<std::vector<double>> ReadProfile(const BudgetOptions& options, int n_layers,
                                                bool* json) {
  if (absl::Status st = CheckRegularFile(options.profile_path); !st.ok()) {
    return absl::Status(st.code(),
                        absl::StrCat("budget: cannot read the profile file (", st.message(), ")"));
  }
  std::ifstream in(options.profile_path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("budget: cannot read profile file '", options.profile_path, "'"));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  const absl::string_view body = absl::StripLeadingAsciiWhitespace(text);
  *json = !body.empty() && body.front() == '{';
  if (!*json) return ParseBudgetProfile(text, options.profile_path, n_layers);
  absl::StatusOr<std::vector<double>> sigma =
      ParseSensitivityProfile(text, options.profile_path, n_layers);
  if (!sigma.ok()) return sigma.status();
  return SensitivityWeights(*sigma, options.sensitivity_alpha);
}

}  // namespace

absl::StatusOr<std::vector<double>> ParseBudgetProfile(absl::string_view text,
                                                       absl::string_view source, int n_layers) {
  std::vector<double> weights;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    const size_t hash = line.find('#');
    if (hash != absl::string_view::npos) line = line.substr(0, hash);
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    const std::string token(line);
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(token.c_str(), &end);
    if (end != token.c_str() + token.size() || errno == ERANGE || !std::isfinite(v)) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ":", line_no, ": '",
                       absl::CHexEscape(token.size() > 40 ? token.substr(0, 40) + "..." : token),
                       "' is not a number"));
    }
    if (v <= 0.0) {
      return absl::InvalidArgumentError(absl::StrCat(source, ":", line_no, ": layer weight ",
                                                     token, " must be positive"));
    }
    weights.push_back(v);
  }
  if (static_cast<int>(weights.size()) != n_layers) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": expected ", n_layers,
                                                   " layer weights, found ", weights.size()));
  }
  return weights;
}

void ApplyLayerBudgets(const std::string& spec, double alpha, BudgetOptions* options) {
  options->sensitivity_alpha = alpha;
  if (spec == "uniform") {
    options->kind = BudgetOptions::Kind::kUniform;
  } else if (spec == "pyramid") {
    options->kind = BudgetOptions::Kind::kPyramid;
  } else {
    options->kind = BudgetOptions::Kind::kProfile;
    options->profile_path = spec;
  }
}

absl::Status LoadProfile(int n_layers, BudgetOptions* options) {
  if (options->kind != BudgetOptions::Kind::kProfile || !options->profile_weights.empty()) {
    return absl::OkStatus();
  }
  bool json = false;
  absl::StatusOr<std::vector<double>> parsed = ReadProfile(*options, n_layers, &json);
  if (!parsed.ok()) return parsed.status();
  options->profile_weights = std::move(*parsed);
  options->profile_json = json;
  return absl::OkStatus();
}

absl::StatusOr<BudgetAllocator> BudgetAllocator::Create(const BudgetOptions& options,
                                                        int n_layers) {
  if (n_layers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("budget: n_layers must be >= 1, got ", n_layers));
  }
  if (options.reserved < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("budget: reserved must be >= 0, got ", options.reserved));
  }
  if (!(options.head_safeguard >= 0.0 && options.head_safeguard <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "budget: head_safeguard must be in [0, 1], got ", options.head_safeguard));
  }
  if (options.unit == BudgetOptions::Unit::kTokens &&
      !(options.budget >= 1.0 && options.budget <= 2147483647.0 &&
        options.budget == std::floor(options.budget))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "budget: budget in tokens must be an integer in [1, 2^31-1], got ", options.budget));
  }
  if (options.unit == BudgetOptions::Unit::kFraction &&
      !(options.budget > 0.0 && options.budget <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("budget: budget as a fraction must be in (0, 1], got ", options.budget));
  }
  if (!(options.sensitivity_alpha >= 0.5 && options.sensitivity_alpha <= 3.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "budget: sensitivity_alpha must be in [0.5, 3], got ", options.sensitivity_alpha));
  }
  std::vector<double> w(static_cast<size_t>(n_layers), 1.0);
  bool json = false;
  switch (options.kind) {
    case BudgetOptions::Kind::kUniform:
      break;
    case BudgetOptions::Kind::kPyramid: {
      if (!(options.beta > 1.0) || !std::isfinite(options.beta)) {
        return absl::InvalidArgumentError(
            absl::StrCat("budget: pyramid beta must be > 1, got ", options.beta));
      }
      if (n_layers > 1) {
        const double lo = 1.0 / options.beta;
        const double hi = 2.0 - lo;
        for (int l = 0; l < n_layers; ++l) w[static_cast<size_t>(l)] = hi - l * (hi - lo) / (n_layers - 1);
      }
      break;
    }
    case BudgetOptions::Kind::kProfile: {
      if (!options.profile_weights.empty()) {
        if (static_cast<int>(options.profile_weights.size()) != n_layers) {
          return absl::InvalidArgumentError(absl::StrCat(options.profile_path, ": expected ",
                                                         n_layers, " layer weights, found ",
                                                         options.profile_weights.size()));
        }
        w = options.profile_weights;
        json = options.profile_json;
        break;
      }
      absl::StatusOr<std::vector<double>> parsed = ReadProfile(options, n_layers, &json);
      if (!parsed.ok()) return parsed.status();
      w = std::move(*parsed);
      break;
    }
  }
  double sum = 0.0;
  for (double x : w) sum += x;
  for (double& x : w) x *= n_layers / sum;
  return BudgetAllocator(options, std::move(w), json);
}

BudgetAllocator::BudgetAllocator(const BudgetOptions& options, std::vector<double> weights,
                                 bool quarter_floor)
    : options_(options),
      weights_(std::move(weights)),
      quarter_floor_(quarter_floor),
      remainder_(weights_.size()),
      order_(weights_.size()),
      last_(weights_.size()) {}

int64_t BudgetAllocator::Total(int64_t seq_len) const {
  int64_t c = options_.unit == BudgetOptions::Unit::kTokens
                  ? static_cast<int64_t>(options_.budget)
                  : static_cast<int64_t>(std::ceil(options_.budget * static_cast<double>(seq_len)));
  return std::max<int64_t>(c, options_.reserved);
}

void BudgetAllocator::Allocate(int64_t seq_len, int32_t* out) {
  const int64_t total = Total(seq_len);
  const int n = n_layers();
  if (total != last_total_) {
    const int64_t reserved =
        quarter_floor_ ? std::max<int64_t>(options_.reserved, (total + 3) / 4) : options_.reserved;
    const int64_t pool = static_cast<int64_t>(n) * (total - reserved);
    int64_t given = 0;
    for (int l = 0; l < n; ++l) {
      const double exact = static_cast<double>(pool) * weights_[static_cast<size_t>(l)] / n;
      const int64_t base = static_cast<int64_t>(std::floor(exact));
      last_[static_cast<size_t>(l)] = static_cast<int32_t>(base);
      remainder_[static_cast<size_t>(l)] = exact - static_cast<double>(base);
      order_[static_cast<size_t>(l)] = l;
      given += base;
    }
    const double* rem = remainder_.data();
    std::sort(order_.begin(), order_.end(), [rem](int32_t a, int32_t b) {
      return rem[a] > rem[b] || (rem[a] == rem[b] && a < b);
    });
    // Largest remainders first get the tokens left over. Floating point can leave `left`
    // slightly outside [0, L): go round again, or take back from the smallest remainders
    // (some layer has b > 0 whenever left < 0, since the floors sum to more than pool >= 0).
    int64_t left = pool - given;
    for (int i = 0; left > 0; i = (i + 1) % n, --left) {
      ++last_[static_cast<size_t>(order_[static_cast<size_t>(i)])];
    }
    for (int i = n - 1; left < 0; i = (i + n - 1) % n) {
      int32_t& b = last_[static_cast<size_t>(order_[static_cast<size_t>(i)])];
      if (b > 0) {
        --b;
        ++left;
      }
    }
    for (int l = 0; l < n; ++l) last_[static_cast<size_t>(l)] += static_cast<int32_t>(reserved);
    last_total_ = total;
  }
  std::copy(last_.begin(), last_.end(), out);
}

}  // namespace recall::cache::eviction
