#include "cli/calibrate_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "cache/block_pool.h"
#include "cache/eviction/session_evictor.h"
#include "common/flags.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "worker/model/load.h"
#include "worker/runtime/engine.h"
#include "worker/service/worker_options.h"

namespace recall::cli {
namespace {

constexpr char kUsageHead[] =
    R"(usage: recall calibrate-window --model PATH [--tokenizer PATH] [options]

Generates a calibration sample with the full cache while tracking LazyEviction's per-token
state (no eviction), and prints the given percentile of the maximum recurrence intervals
(MRI) observed: the window W that covers that share of recurrences.

)";

struct WindowOptions {
  model::LoadOptions model;
  int texts = 8;
  std::optional<int> tokens;  // default: the model's context, at most 2048
  double alpha = 1e-4;
  double percentile = 80;
  std::string prompt = "Once upon a time";
  int64_t seed = 1;
  int threads = 0;
};

const flags::FlagSet<WindowOptions>& WindowFlags() {
  static const flags::FlagSet<WindowOptions>* const kFlags = [] {
    auto* f = new flags::FlagSet<WindowOptions>();
    f->Include(
         service::ModelFlags(), [](auto& o) -> auto& { return o.model; })
        .Section("calibration")
        .Int(
            "texts", "N", "sampled texts (default 8)", [](auto& o) -> auto& { return o.texts; }, 1,
            100000)
        .Int(
            "tokens", "N",
            "tokens per text including the prompt (default: the model's context, at most 2048)",
            [](auto& o) -> auto& { return o.tokens; }, 2, 1 << 24)
        .Double(
            "alpha", "A", "importance threshold (default 1e-4)",
            [](auto& o) -> auto& { return o.alpha; }, 1e-12, 0.999999)
        .Double(
            "percentile", "P", "in (0, 100] (default 80)",
            [](auto& o) -> auto& { return o.percentile; }, 1e-9, 100)
        .String(
            "prompt", "TEXT", "prompt of every text (default \"Once upon a time\")",
            [](auto& o) -> auto& { return o.prompt; })
        .Int(
            "seed", "S", "first sampling seed (default 1)", [](auto& o) -> auto& { return o.seed; },
            0, INT64_MAX)
        .Int(
            "threads", "N", "CPU threads (default: all cores)",
            [](auto& o) -> auto& { return o.threads; }, 0, 1024);
    return f;
  }();
  return *kFlags;
}

absl::Status Run(const WindowOptions& o) {
  absl::StatusOr<model::Loaded> loaded_or = model::LoadAll(o.model);
  if (!loaded_or.ok()) return WindowFlags().Explain(loaded_or.status());
  model::Loaded& loaded = *loaded_or;
  const model::ModelConfig& c = loaded.model->config;
  const int64_t tokens = o.tokens.value_or(std::min(c.max_seq_len, 2048));
  if (tokens > c.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tokens: ", tokens, " is more than the model's context (", c.max_seq_len, ")"));
  }
  const std::vector<int32_t> prompt =
      loaded.tokenizer->Encode(o.prompt, /*add_bos=*/!loaded.hf_tokenizer);
  if (prompt.empty() || static_cast<int64_t>(prompt.size()) >= tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prompt: ", prompt.size(), " tokens; must be in [1, --tokens)"));
  }
  runtime::EngineOptions eo;
  eo.threads = o.threads;
  eo.kv_cache_bytes =
      runtime::KvBytesFor(c, static_cast<int>(tokens) + 16, eo.block_tokens, eo.kv_dtype);
  eo.forward.max_batch_tokens = static_cast<int>(prompt.size());
  eo.forward.batch_invariant = false;
  RECALL_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Engine> engine,
                          runtime::Engine::Create(*loaded.model, eo));
  runtime::ForwardPass& forward = engine->forward(0);
  kernels::Backend& backend = engine->backend(0);
  const int64_t stride = tokens;
  std::vector<float> probs(static_cast<size_t>(c.n_layers) * c.n_heads * stride);
  std::vector<float> logits(c.vocab_size);
  std::vector<int32_t> mris;
  const int64_t texts = o.texts;
  const double alpha = o.alpha, pct = o.percentile;

  for (int64_t text = 0; text < texts; ++text) {
    cache::SequenceCache seq(&engine->pool(0));
    cache::eviction::SessionEvictorOptions so;
    so.policy.name = "lazy";
    so.policy.alpha = static_cast<float>(alpha);
    so.policy.window = 1;
    so.budget.budget = static_cast<double>(tokens);  // never over budget: observe only
    so.n_heads = c.n_heads;
    RECALL_ASSIGN_OR_RETURN(std::unique_ptr<cache::eviction::SessionEvictor> evictor,
                            cache::eviction::SessionEvictor::Create(so, &seq));
    runtime::BatchItem pre{&seq, prompt.data(), static_cast<int>(prompt.size())};
    RECALL_RETURN_IF_ERROR(forward.Run({&pre, 1}, logits.data()));
    kernels::SamplingParams sampling;
    sampling.temperature = 1.0f;
    sampling.top_p = 0.95f;
    kernels::Rng rng(static_cast<uint64_t>(o.seed + text));
    std::vector<int32_t> history = prompt;
    while (static_cast<int64_t>(history.size()) < tokens) {
      const int32_t next = backend.Sample(logits.data(), c.vocab_size, sampling, rng,
                                          history.data(), static_cast<int>(history.size()));
      history.push_back(next);
      runtime::BatchItem item{&seq, &history.back(), 1, true, probs.data(), stride};
      RECALL_RETURN_IF_ERROR(forward.Run({&item, 1}, logits.data()));
      RECALL_RETURN_IF_ERROR(evictor->Step(probs.data(), stride));
    }
    for (int l = 0; l < c.n_layers; ++l) {
      for (int h = 0; h < c.n_kv_heads; ++h) {
        for (int32_t m : evictor->state(l, h).mri) {
          if (m > 0) mris.push_back(m);
        }
      }
    }
  }
  if (mris.empty()) {
    return absl::FailedPreconditionError(
        "no token was important twice: lower --alpha or generate more --tokens");
  }
  std::sort(mris.begin(), mris.end());
  const size_t rank = static_cast<size_t>(std::ceil(pct / 100.0 * mris.size())) - 1;
  std::printf("texts=%lld tokens=%lld alpha=%g recurrences=%zu median_mri=%d p%g_mri=%d\n",
              static_cast<long long>(texts), static_cast<long long>(tokens), alpha, mris.size(),
              mris[(mris.size() - 1) / 2], pct, mris[std::min(rank, mris.size() - 1)]);
  std::printf("suggested --window %d\n", mris[std::min(rank, mris.size() - 1)]);
  return absl::OkStatus();
}

}  // namespace

int RunCalibrateWindow(const std::vector<std::string>& argv) {
  for (const std::string& a : argv) {
    if (a == "--help" || a == "-h") {
      std::cout << kUsageHead << WindowFlags().Help();
      return 0;
    }
  }
  WindowOptions options;
  absl::Status st = WindowFlags().Parse(argv, &options);
  if (st.ok() && options.model.model.empty())
    st = absl::InvalidArgumentError("--model is required");
  if (!st.ok()) {
    std::cerr << "recall calibrate-window: " << st.message()
              << " (recall calibrate-window --help lists the flags)\n";
    return 2;
  }
  st = Run(options);
  if (!st.ok()) {
    std::cerr << "recall calibrate-window: " << st.message() << "\n";
    return st.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}

}  // namespace recall::cli
