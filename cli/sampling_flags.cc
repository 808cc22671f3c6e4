#include "cli/sampling_flags.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace recall::cli {

const flags::FlagSet<SamplingFlags>& SamplingFlagSet() {
  static const flags::FlagSet<SamplingFlags>* const kFlags = [] {
    auto* f = new flags::FlagSet<SamplingFlags>();
    f->Section("sampling")
        .Double(
            "temperature", "T", "0 = greedy (default 1.0)",
            [](auto& o) -> auto& { return o.temperature; }, 0, 100)
        .Double(
            "top-p", "P", "nucleus sampling mass in (0, 1] (default 1.0: off)",
            [](auto& o) -> auto& { return o.top_p; }, flags::kAboveZero, 1)
        .Int(
            "top-k", "K", "keep the K most likely tokens, 0 = off (default 0)",
            [](auto& o) -> auto& { return o.top_k; }, 0, 1 << 20)
        .Double(
            "repetition-penalty", "R", "> 1 discourages repeats (default 1.0)",
            [](auto& o) -> auto& { return o.repetition_penalty; }, 1e-3, 100)
        .Double(
            "frequency-penalty", "X",
            "subtract X x (times a token occurred in the reply) from its logit (default 0)",
            [](auto& o) -> auto& { return o.frequency_penalty; }, -2, 2)
        .Double(
            "presence-penalty", "X",
            "subtract X from the logit of a token that occurred in the reply (default 0)",
            [](auto& o) -> auto& { return o.presence_penalty; }, -2, 2)
        .Int(
            "seed", "S", "sampling seed (default: a fresh one)",
            [](auto& o) -> auto& { return o.seed; }, 0, INT64_MAX);
    return f;
  }();
  return *kFlags;
}

void ApplySampling(const SamplingFlags& f, kernels::SamplingParams* out) {
  if (f.temperature.has_value()) out->temperature = static_cast<float>(*f.temperature);
  if (f.top_p.has_value()) out->top_p = static_cast<float>(*f.top_p);
  if (f.top_k.has_value()) out->top_k = *f.top_k;
  if (f.repetition_penalty.has_value()) {
    out->repetition_penalty = static_cast<float>(*f.repetition_penalty);
  }
  if (f.frequency_penalty.has_value()) {
    out->frequency_penalty = static_cast<float>(*f.frequency_penalty);
  }
  if (f.presence_penalty.has_value()) {
    out->presence_penalty = static_cast<float>(*f.presence_penalty);
  }
  if (f.seed.has_value()) out->seed = static_cast<uint64_t>(*f.seed);
}

void ApplySampling(const SamplingFlags& f, v1::SamplingParams* out) {
  if (f.temperature.has_value()) out->set_temperature(static_cast<float>(*f.temperature));
  if (f.top_p.has_value()) out->set_top_p(static_cast<float>(*f.top_p));
  if (f.top_k.has_value()) out->set_top_k(*f.top_k);
  if (f.repetition_penalty.has_value()) {
    out->set_repetition_penalty(static_cast<float>(*f.repetition_penalty));
  }
  if (f.frequency_penalty.has_value()) {
    out->set_frequency_penalty(static_cast<float>(*f.frequency_penalty));
  }
  if (f.presence_penalty.has_value()) {
    out->set_presence_penalty(static_cast<float>(*f.presence_penalty));
  }
  if (f.seed.has_value()) out->set_seed(static_cast<uint64_t>(*f.seed));
}

absl::Status InFlagTerms(const absl::Status& st) {
  const absl::string_view message = st.message();
  const size_t colon = message.find(": ");
  if (colon == absl::string_view::npos) return st;
  absl::string_view field = message.substr(0, colon);
  if (!absl::ConsumePrefix(&field, "sampling.") && !absl::ConsumePrefix(&field, "cache.")) {
    return st;
  }
  // "stop[2]": the third --stop.
  int stop_index = 0;
  if (absl::ConsumePrefix(&field, "stop[") && absl::ConsumeSuffix(&field, "]") &&
      absl::SimpleAtoi(field, &stop_index)) {
    return absl::Status(st.code(), absl::StrCat("--stop #", stop_index + 1, message.substr(colon)));
  }
  if (field.find_first_of(".[") != absl::string_view::npos) return st;
  std::string flag = field == "budget_tokens"     ? "budget"
                     : field == "budget_fraction" ? "budget-frac"
                                                  : std::string(field);
  std::replace(flag.begin(), flag.end(), '_', '-');
  return absl::Status(st.code(), absl::StrCat("--", flag, message.substr(colon)));
}

}  // namespace recall::cli
