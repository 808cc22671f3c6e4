#include "common/flags.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace recall::flags {
namespace {

constexpr char kFieldPayload[] = "recall.field";
constexpr char kWhatPayload[] = "recall.field.what";

std::string Lower(absl::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// strtod and SimpleAtod read "0x10" as 16: a flag's number is decimal.
bool IsHex(absl::string_view text) { return text.find_first_of("xX") != absl::string_view::npos; }

}  // namespace

absl::Status ParseInt(absl::string_view text, int64_t lo, int64_t hi, int64_t* out) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(text, &v)) {
    // Digits past int64's range are an integer out of range, not "not an integer".
    absl::string_view digits = absl::StripPrefix(absl::StripPrefix(text, "-"), "+");
    if (!digits.empty() && std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit)) {
      return absl::InvalidArgumentError(
          absl::StrCat("must be in [", lo, ", ", hi, "], got ", text));
    }
    return absl::InvalidArgumentError(absl::StrCat("\"", text, "\" is not an integer"));
  }
  if (v < lo || v > hi) {
    return absl::InvalidArgumentError(absl::StrCat("must be in [", lo, ", ", hi, "], got ", v));
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status ParseDouble(absl::string_view text, double lo, double hi, double* out) {
  double v = 0;
  if (IsHex(text) || !absl::SimpleAtod(text, &v) || !std::isfinite(v)) {
    return absl::InvalidArgumentError(absl::StrCat("\"", text, "\" is not a finite number"));
  }
  if (v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("must be in ", lo == kAboveZero ? "(0" : "[" + FormatDouble(lo), ", ",
                     FormatDouble(hi), "], got ", FormatDouble(v)));
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status ParseBytes(absl::string_view text, int64_t lo, int64_t* out) {
  const std::string s(text);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  const std::string unit = Lower(end == nullptr ? "" : end);
  double scale = 0;
  if (unit.empty() || unit == "b") scale = 1;
  if (unit == "k" || unit == "kib") scale = 1024.0;
  if (unit == "m" || unit == "mib") scale = 1024.0 * 1024;
  if (unit == "g" || unit == "gib") scale = 1024.0 * 1024 * 1024;
  if (unit == "kb") scale = 1e3;
  if (unit == "mb") scale = 1e6;
  if (unit == "gb") scale = 1e9;
  if (s.empty() || end == s.c_str() || scale == 0 || !std::isfinite(v) || v < 0 || IsHex(text)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", text, "\" is not a size (bytes, or a number with K/M/G, KiB/MiB/GiB, KB/MB/GB)"));
  }
  const double bytes = v * scale;
  if (bytes > 9e18) return absl::InvalidArgumentError(absl::StrCat(text, " is too large"));
  if (bytes < static_cast<double>(lo)) {
    return absl::InvalidArgumentError(
        absl::StrCat(text, " is below the minimum of ", lo, " bytes"));
  }
  *out = static_cast<int64_t>(bytes);
  return absl::OkStatus();
}

absl::Status ParseIntList(absl::string_view text, int64_t lo, int64_t hi, std::vector<int>* out) {
  std::vector<int> values;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t v = 0;
    if (absl::Status st = ParseInt(part, lo, hi, &v); !st.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", text, "\": a comma-separated list of integers in [", lo, ", ", hi,
                       "], e.g. ", lo, ",", std::min(hi, lo + 1)));
    }
    values.push_back(static_cast<int>(v));
  }
  *out = std::move(values);
  return absl::OkStatus();
}

std::string FormatDouble(double v) {
  std::string s = absl::StrCat(v);
  double back = 0;
  if (absl::SimpleAtod(s, &back) && back == v) return s;
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

std::string Closest(absl::string_view name, const std::vector<std::string>& known) {
  std::string best;
  size_t best_d = std::max<size_t>(3, name.size() / 3) + 1;
  for (const std::string& k : known) {
    // Levenshtein distance.
    std::vector<size_t> prev(k.size() + 1), cur(k.size() + 1);
    for (size_t j = 0; j <= k.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= name.size(); ++i) {
      cur[0] = i;
      for (size_t j = 1; j <= k.size(); ++j) {
        cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (name[i - 1] != k[j - 1])});
      }
      std::swap(prev, cur);
    }
    size_t d = prev[k.size()];
    if (k.rfind(std::string(name), 0) == 0 && !name.empty()) d = std::min<size_t>(d, 1);
    if (d < best_d) {
      best_d = d;
      best = k;
    }
  }
  return best;
}

std::string FillFields(absl::string_view what,
                       const std::function<std::string(absl::string_view)>& name) {
  std::string out;
  size_t i = 0;
  while (i < what.size()) {
    const size_t open = what.find('{', i);
    const size_t close = open == absl::string_view::npos ? open : what.find('}', open);
    if (close == absl::string_view::npos) {
      absl::StrAppend(&out, what.substr(i));
      break;
    }
    absl::StrAppend(&out, what.substr(i, open - i));
    out.append(name(what.substr(open + 1, close - open - 1)));
    i = close + 1;
  }
  return out;
}

absl::Status FieldError(absl::string_view field, absl::string_view what, absl::StatusCode code) {
  const std::string plain = FillFields(what, [](absl::string_view f) { return std::string(f); });
  absl::Status st(code, absl::StrCat(field, ": ", plain));
  st.SetPayload(kFieldPayload, absl::Cord(std::string(field)));
  st.SetPayload(kWhatPayload, absl::Cord(std::string(what)));
  return st;
}

absl::StatusOr<std::pair<std::string, int>> SplitHostPort(absl::string_view field,
                                                          const std::string& value) {
  const size_t colon = value.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(value.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return FieldError(field,
                      absl::StrCat("expected HOST:PORT (port in [0, 65535]), got \"", value, "\""));
  }
  std::string host = value.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::make_pair(host, port);
}

std::string FieldWhat(const absl::Status& status) {
  const auto p = status.GetPayload(kWhatPayload);
  return p.has_value() ? std::string(*p) : std::string();
}

std::string FieldOf(const absl::Status& status) {
  const auto p = status.GetPayload(kFieldPayload);
  return p.has_value() ? std::string(*p) : std::string();
}

}  // namespace recall::flags
