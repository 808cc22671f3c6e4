#include "cli/calibrate_layers_command.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "cache/eviction/sensitivity_profile.h"
#include "cli/calibration_text.h"
#include "common/files.h"
#include "common/flags.h"
#include "common/status.h"
#include "common/utf8.h"
#include "kernels/backend.h"
#include "worker/model/load.h"
#include "worker/offline/sensitivity.h"
#include "worker/runtime/device.h"
#include "worker/service/worker_options.h"

namespace recall::cli {
namespace {

constexpr char kUsageHead[] =
    R"(usage: recall calibrate --model PATH [--tokenizer PATH] --out FILE [options]

Measures how much each layer's keys depend on distant context (EpiCache's layer
sensitivity): the mean cosine similarity between the keys of a full causal pass over a
calibration text and those of a block-masked pass (each block sees only the sink tokens,
the last half of the previous block and itself). Writes the JSON profile that
`--layer-budgets FILE` (recall generate, recall serve, recall-worker) turns into per-layer
budgets: less sensitive layers (sigma near 1) get fewer tokens.

)";

struct LayersOptions {
  model::LoadOptions model;
  std::string out;
  std::string text;          // default: the built-in text
  std::optional<int> block;  // default: a quarter of the tokens, even, at most 4096
  std::optional<int> sinks;  // default: min(128, block / 8)
  int window = 100;
  int threads = 0;
};

const flags::FlagSet<LayersOptions>& LayersFlags() {
  static const flags::FlagSet<LayersOptions>* const kFlags = [] {
    auto* f = new flags::FlagSet<LayersOptions>();
    f->Include(
         service::ModelFlags(), [](auto& o) -> auto& { return o.model; })
        .Section("calibration")
        .String(
            "out", "FILE", "where to write the profile (required)",
            [](auto& o) -> auto& { return o.out; })
        .String(
            "text", "FILE",
            "calibration text (default: a built-in text of simple stories); tokens past the\n"
            "model's context length are dropped",
            [](auto& o) -> auto& { return o.text; })
        .Int(
            "block", "N", "block length (default: a quarter of the tokens, even, at most 4096)",
            [](auto& o) -> auto& { return o.block; }, 2, 1 << 30)
        .Int(
            "sinks", "N", "sink tokens every block sees (default: min(128, block / 8))",
            [](auto& o) -> auto& { return o.sinks; }, 0, 1 << 30)
        .Int(
            "window", "N", "tokens per averaging window (default 100)",
            [](auto& o) -> auto& { return o.window; }, 1, 1 << 30)
        .Int(
            "threads", "N", "CPU threads (default: all cores)",
            [](auto& o) -> auto& { return o.threads; }, 0, 1024)
        .Short('m', "model")
        .Short('t', "threads");
    return f;
  }();
  return *kFlags;
}

absl::StatusOr<std::string> ReadText(const std::string& path) {
  if (absl::Status st = CheckRegularFile(path); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat("--text: ", st.message()));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--text: cannot read '", path, "'"));
  std::stringstream ss;
  ss << in.rdbuf();
  // Text, as a session's messages are (a binary file gave a profile of its bytes' fallbacks).
  if (!utf8::IsValid(ss.str())) {
    return absl::InvalidArgumentError(absl::StrCat("--text: ", path, " is not UTF-8 text"));
  }
  return ss.str();
}

absl::Status Run(const LayersOptions& o) {
  RECALL_RETURN_IF_ERROR(CheckOutputFile("--out", o.out));
  std::string text = DefaultCalibrationText();
  if (!o.text.empty()) {
    RECALL_ASSIGN_OR_RETURN(text, ReadText(o.text));
  }
  absl::StatusOr<model::Loaded> loaded_or = model::LoadAll(o.model);
  if (!loaded_or.ok()) return LayersFlags().Explain(loaded_or.status());
  model::Loaded& loaded = *loaded_or;
  const model::ModelConfig& c = loaded.model->config;
  std::vector<int32_t> tokens = loaded.tokenizer->Encode(text, /*add_bos=*/!loaded.hf_tokenizer);
  if (static_cast<int64_t>(tokens.size()) > c.max_seq_len) tokens.resize(c.max_seq_len);
  const int n = static_cast<int>(tokens.size());
  if (n < 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("--text: ", o.text, " holds ", n,
                     " token(s); the profile compares blocks past the "
                     "first, so it needs at least 3 (a few paragraphs give a useful one)"));
  }
  const int block = o.block.value_or(std::min(4096, std::max(2, n / 4)) / 2 * 2);
  const int sinks = o.sinks.value_or(std::min(128, block / 8));
  if (sinks >= block) {
    return absl::InvalidArgumentError(
        absl::StrCat("--sinks: ", sinks, " must be less than the block (", block, ")"));
  }

  offline::SensitivityOptions so;
  so.block = block;
  so.sinks = sinks;
  so.window = o.window;
  RECALL_ASSIGN_OR_RETURN(
      std::unique_ptr<kernels::Backend> backend,
      runtime::MakeBackend({.device = runtime::Device::kCpu, .cpu_threads = o.threads}));
  absl::StatusOr<std::vector<double>> sigma_or =
      offline::LayerSensitivity(*loaded.model, *backend, tokens, so);
  if (!sigma_or.ok()) return LayersFlags().Explain(sigma_or.status());  // names the flag
  const std::vector<double>& sigma = *sigma_or;

  cache::eviction::SensitivityProfile profile;
  profile.model = o.model.model;
  profile.sigma = sigma;
  profile.block = so.block;
  profile.sinks = so.sinks;
  profile.window = so.window;
  profile.tokens = n;
  const std::string& out = o.out;
  RECALL_RETURN_IF_ERROR(
      WriteFileWhole("--out", out, cache::eviction::SensitivityProfileJson(profile)));
  std::printf("tokens=%d block=%d sinks=%d window=%d\n", n, so.block, so.sinks, so.window);
  for (size_t l = 0; l < sigma.size(); ++l) std::printf("layer %zu: sigma=%.6f\n", l, sigma[l]);
  std::printf("wrote %s\n", out.c_str());
  return absl::OkStatus();
}

}  // namespace

int RunCalibrateLayers(const std::vector<std::string>& argv) {
  for (const std::string& a : argv) {
    if (a == "--help" || a == "-h") {
      std::cout << kUsageHead << LayersFlags().Help();
      return 0;
    }
  }
  LayersOptions options;
  absl::Status st = LayersFlags().Parse(argv, &options);
  if (st.ok() && options.model.model.empty())
    st = absl::InvalidArgumentError("--model is required");
  if (st.ok() && options.out.empty()) st = absl::InvalidArgumentError("--out is required");
  if (!st.ok()) {
    std::cerr << "recall calibrate: " << st.message()
              << " (recall calibrate --help lists the flags)\n";
    return 2;
  }
  st = Run(options);
  if (!st.ok()) {
    std::cerr << "recall calibrate: " << st.message() << "\n";
    return st.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}

}  // namespace recall::cli
