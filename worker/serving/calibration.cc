#include "worker/serving/calibration.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "cache/eviction/eviction_policy.h"
#include "common/files.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace recall::serving {
namespace {

constexpr char kFormat[] = "recall-eviction-calibration";

absl::Status Bad(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

}  // namespace

absl::StatusOr<EvictionCalibration> ReadEvictionCalibration(const std::string& path) {
  RECALL_RETURN_IF_ERROR(CheckRegularFile(path));
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot read the calibration file"));
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::parse_error& e) {
    return Bad(path, absl::StrCat("not valid JSON (", e.what(), ")"));
  }
  if (!j.is_object()) return Bad(path, "not a JSON object");
  const auto field = [&](const char* name) -> const nlohmann::json* {
    auto it = j.find(name);
    return it == j.end() ? nullptr : &*it;
  };
  const nlohmann::json* format = field("format");
  if (format == nullptr || !format->is_string() || format->get<std::string>() != kFormat) {
    return Bad(path, absl::StrCat("\"format\" must be \"", kFormat, "\""));
  }
  const nlohmann::json* version = field("version");
  if (version == nullptr || !version->is_number_integer() || version->get<int64_t>() != 1) {
    return Bad(path, "\"version\" must be 1");
  }
  EvictionCalibration c;
  const nlohmann::json* window = field("window");
  if (window == nullptr || !window->is_number_integer() || window->get<int64_t>() < 1 ||
      window->get<int64_t>() > (1 << 20)) {
    return Bad(path, "\"window\" must be an integer in [1, 1048576]");
  }
  c.window = static_cast<int>(window->get<int64_t>());
  const nlohmann::json* alpha = field("alpha");
  if (alpha == nullptr || !alpha->is_number() || !(alpha->get<double>() > 0) ||
      !(alpha->get<double>() < 1)) {
    return Bad(path, "\"alpha\" must be a number in (0, 1)");
  }
  c.alpha = alpha->get<double>();
  if (const nlohmann::json* p = field("policy"); p != nullptr) {
    if (!p->is_string() || !cache::eviction::IsEvictingPolicy(p->get<std::string>())) {
      return Bad(path, absl::StrCat("\"policy\" must be an evicting policy (",
                                    cache::eviction::EvictingPolicyList(), ")"));
    }
    c.policy = p->get<std::string>();
  }
  if (const nlohmann::json* k = field("alpha_uniform"); k != nullptr) {
    if (!k->is_number() || !(k->get<double>() >= 0) || !(k->get<double>() <= 1e6)) {
      return Bad(path, "\"alpha_uniform\" must be a number in [0, 1e6]");
    }
    c.alpha_uniform = k->get<double>();
  }
  if (const nlohmann::json* v = field("value_protection"); v != nullptr) {
    if (!v->is_number() || !(v->get<double>() >= 0) || !(v->get<double>() < 1)) {
      return Bad(path, "\"value_protection\" must be a number in [0, 1)");
    }
    c.value_protection = v->get<double>();
  }
  if (const nlohmann::json* m = field("meta_score"); m != nullptr) {
    if (!m->is_string() || (m->get<std::string>() != "none" && m->get<std::string>() != "caote")) {
      return Bad(path, "\"meta_score\" must be \"none\" or \"caote\"");
    }
    c.meta_score = m->get<std::string>();
  }
  if (const nlohmann::json* l = field("layer_budgets"); l != nullptr) {
    if (!l->is_string() || l->get<std::string>().empty()) {
      return Bad(path, "\"layer_budgets\" must be uniform, pyramid or a profile's path");
    }
    c.layer_budgets = l->get<std::string>();
    if (c.layer_budgets != "uniform" && c.layer_budgets != "pyramid") {
      if (c.layer_budgets[0] != '/') {
        const size_t slash = path.rfind('/');
        if (slash != std::string::npos) {
          c.layer_budgets = path.substr(0, slash + 1) + c.layer_budgets;
        }
      }
      if (absl::Status st = CheckRegularFile(c.layer_budgets); !st.ok()) {
        return Bad(path, absl::StrCat("\"layer_budgets\": cannot read the profile (", st.message(),
                                      "; uniform, pyramid or a profile's path, "
                                      "relative to this file)"));
      }
    }
  }
  if (const nlohmann::json* f = field("budget_fraction"); f != nullptr) {
    if (!f->is_number() || !(f->get<double>() > 0) || !(f->get<double>() <= 1)) {
      return Bad(path, "\"budget_fraction\" must be a number in (0, 1]");
    }
    c.budget_fraction = f->get<double>();
  }
  return c;
}

std::string EvictionCalibrationJson(const EvictionCalibration& c) {
  const nlohmann::json j = {{"format", kFormat},
                            {"version", 1},
                            {"policy", c.policy},
                            {"budget_fraction", c.budget_fraction},
                            {"window", c.window},
                            {"alpha", c.alpha},
                            {"alpha_uniform", c.alpha_uniform},
                            {"value_protection", c.value_protection},
                            {"meta_score", c.meta_score},
                            {"layer_budgets", c.layer_budgets}};
  return j.dump(2) + "\n";
}

}  // namespace recall::serving
