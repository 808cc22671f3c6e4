#include "common/args.h"

#include <cctype>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace recall {

absl::StatusOr<Args> Args::Parse(const std::vector<std::string>& argv,
                                 const std::vector<std::string>& known_flags,
                                 const std::vector<std::string>& switches) {
  Args args;
  auto known = [&](const std::string& n) {
    return std::find(known_flags.begin(), known_flags.end(), n) != known_flags.end();
  };
  auto is_switch = [&](const std::string& n) {
    return std::find(switches.begin(), switches.end(), n) != switches.end();
  };
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.rfind("--", 0) != 0 || a.size() == 2) {
      args.positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (!known(name) && !is_switch(name)) {
      std::vector<std::string> all = known_flags;
      all.insert(all.end(), switches.begin(), switches.end());
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, " (known: --", absl::StrJoin(all, ", --"), ")"));
    }
    if (is_switch(name)) {
      if (has_value) return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      args.values_[name].push_back("true");
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argv.size()) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      }
      value = argv[++i];
    }
    args.values_[name].push_back(value);
  }
  return args;
}

std::string Args::GetString(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second.back();
}

std::vector<std::string> Args::GetAll(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

absl::StatusOr<int64_t> Args::GetInt(const std::string& name, int64_t fallback, int64_t min,
                                     int64_t max) const {
  if (!Has(name)) return fallback;
  const std::string s = GetString(name);
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": '", s, "' is not an integer"));
  }
  if (v < min || v > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": ", v, " is outside [", min, ", ", max, "]"));
  }
  return v;
}

absl::StatusOr<double> Args::GetDouble(const std::string& name, double fallback, double min,
                                       double max) const {
  if (!Has(name)) return fallback;
  const std::string s = GetString(name);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !std::isfinite(v)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": '", s, "' is not a number"));
  }
  if (v < min || v > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": ", v, " is outside [", min, ", ", max, "]"));
  }
  return v;
}

absl::StatusOr<int64_t> Args::GetBytes(const std::string& name, int64_t fallback,
                                       int64_t min) const {
  if (!Has(name)) return fallback;
  const std::string s = GetString(name);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  std::string unit(end);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double scale = 0;
  if (unit.empty() || unit == "b") scale = 1;
  if (unit == "k" || unit == "kib") scale = 1024.0;
  if (unit == "m" || unit == "mib") scale = 1024.0 * 1024;
  if (unit == "g" || unit == "gib") scale = 1024.0 * 1024 * 1024;
  if (unit == "kb") scale = 1e3;
  if (unit == "mb") scale = 1e6;
  if (unit == "gb") scale = 1e9;
  if (s.empty() || end == s.c_str() || scale == 0 || !std::isfinite(v) || v < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", name, ": '", s, "' is not a size (bytes, or a number with K/M/G, KiB/MiB/GiB, "
        "KB/MB/GB)"));
  }
  const double bytes = v * scale;
  if (bytes < static_cast<double>(min) || bytes > 9e18) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": ", s, " is below the minimum of ", min, " bytes"));
  }
  return static_cast<int64_t>(bytes);
}

}  // namespace recall
