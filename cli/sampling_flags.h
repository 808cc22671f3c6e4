// The sampling flags `recall generate` and `recall chat` share. An unset flag leaves the
// default of whoever samples: the engine's for generate (kernels::SamplingParams), the
// server's for chat (worker.proto's SamplingParams).
#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "common/flags.h"
#include "kernels/sampling_params.h"
#include "recall/v1/worker.pb.h"

namespace recall::cli {

struct SamplingFlags {
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int> top_k;
  std::optional<double> repetition_penalty;
  std::optional<double> frequency_penalty;
  std::optional<double> presence_penalty;
  std::optional<int64_t> seed;
};

// --temperature, --top-p, --top-k, --repetition-penalty, --frequency-penalty,
// --presence-penalty, --seed, with the ranges the worker checks.
const flags::FlagSet<SamplingFlags>& SamplingFlagSet();

// The flags given, onto `out` (the other fields are left as they are).
void ApplySampling(const SamplingFlags& f, kernels::SamplingParams* out);
void ApplySampling(const SamplingFlags& f, v1::SamplingParams* out);

// An error in the terms of a command's flags: a leading request field a flag sets
// ("sampling.max_tokens: ...", "cache.budget_tokens: ...", "sampling.stop[2]: ...") becomes
// the flag ("--max-tokens: ...", "--budget: ...", "--stop #3: ..."), so the user knows what
// to change. Other errors are returned as they are.
absl::Status InFlagTerms(const absl::Status& st);

}  // namespace recall::cli
