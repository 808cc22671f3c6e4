#include "cli/calibrate_layers_command.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "cache/eviction/sensitivity_profile.h"
#include "cli/calibration_text.h"
#include "common/args.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "worker/model/load_from_flags.h"
#include "worker/offline/sensitivity.h"

namespace recall::cli {
namespace {

constexpr char kUsage[] =
    R"(usage: recall calibrate --model PATH [--tokenizer PATH] --out FILE [options]

Measures how much each layer's keys depend on distant context (EpiCache's layer
sensitivity): the mean cosine similarity between the keys of a full causal pass over a
calibration text and those of a block-masked pass (each block sees only the sink tokens,
the last half of the previous block and itself). Writes the JSON profile that
`recall generate --layer-budgets FILE` turns into per-layer budgets: less sensitive layers
(sigma near 1) get fewer tokens.

  --out FILE     where to write the profile (required)
  --text FILE    calibration text (default: a built-in text of simple stories); tokens
                 past the model's context length are dropped
  --block N      block length (default: a quarter of the tokens, even, at most 4096)
  --sinks N      sink tokens every block sees (default: min(128, block / 8))
  --window N     tokens per averaging window (default 100)
  --threads N    CPU threads (default: all cores)
)";

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--text: cannot read '", path, "'"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (out) out << text;
  if (out) out.close();
  if (!out) return absl::PermissionDeniedError(absl::StrCat("--out: cannot write '", path, "'"));
  return absl::OkStatus();
}

absl::Status Run(const Args& args) {
  RECALL_ASSIGN_OR_RETURN(const int64_t threads, args.GetInt("threads", 0, 0, 1024));
  RECALL_ASSIGN_OR_RETURN(const int64_t window, args.GetInt("window", 100, 1, 1 << 30));
  std::string text = DefaultCalibrationText();
  if (args.Has("text")) {
    RECALL_ASSIGN_OR_RETURN(text, ReadText(args.GetString("text")));
  }
  RECALL_ASSIGN_OR_RETURN(model::Loaded loaded, model::LoadAll(args));
  const model::ModelConfig& c = loaded.model->config;
  std::vector<int32_t> tokens = loaded.tokenizer->Encode(text, /*add_bos=*/!loaded.hf_tokenizer);
  if (static_cast<int64_t>(tokens.size()) > c.max_seq_len) tokens.resize(c.max_seq_len);
  const int n = static_cast<int>(tokens.size());
  const int default_block = std::min(4096, std::max(2, n / 4)) / 2 * 2;
  RECALL_ASSIGN_OR_RETURN(const int64_t block, args.GetInt("block", default_block, 2, 1 << 30));
  RECALL_ASSIGN_OR_RETURN(const int64_t sinks,
                          args.GetInt("sinks", std::min<int64_t>(128, block / 8), 0, block - 1));

  offline::SensitivityOptions so;
  so.block = static_cast<int>(block);
  so.sinks = static_cast<int>(sinks);
  so.window = static_cast<int>(window);
  std::unique_ptr<kernels::Backend> backend =
      kernels::CreateCpuBackend({static_cast<int>(threads)});
  RECALL_ASSIGN_OR_RETURN(std::vector<double> sigma,
                          offline::LayerSensitivity(*loaded.model, *backend, tokens, so));

  cache::eviction::SensitivityProfile profile;
  profile.model = args.GetString("model");
  profile.sigma = sigma;
  profile.block = so.block;
  profile.sinks = so.sinks;
  profile.window = so.window;
  profile.tokens = n;
  const std::string out = args.GetString("out");
  RECALL_RETURN_IF_ERROR(WriteFile(out, cache::eviction::SensitivityProfileJson(profile)));
  std::printf("tokens=%d block=%d sinks=%d window=%d\n", n, so.block, so.sinks, so.window);
  for (size_t l = 0; l < sigma.size(); ++l) std::printf("layer %zu: sigma=%.6f\n", l, sigma[l]);
  std::printf("wrote %s\n", out.c_str());
  return absl::OkStatus();
}

}  // namespace

int RunCalibrateLayers(const std::vector<std::string>& argv) {
  absl::StatusOr<Args> args = Args::Parse(
      argv, {"model", "tokenizer", "out", "text", "block", "sinks", "window", "threads"}, {"help"});
  if (args.ok() && args->Has("help")) {
    std::cout << kUsage;
    return 0;
  }
  absl::Status st = args.status();
  if (st.ok() && !args->Has("model")) st = absl::InvalidArgumentError("--model is required");
  if (st.ok() && args->GetString("out").empty()) {
    st = absl::InvalidArgumentError("--out is required");
  }
  if (!st.ok()) {
    std::cerr << "recall calibrate: " << st.message() << "\n\n" << kUsage;
    return 2;
  }
  st = Run(*args);
  if (!st.ok()) {
    std::cerr << "recall calibrate: " << st.message() << "\n";
    return st.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}

}  // namespace recall::cli
