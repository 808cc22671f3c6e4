#include "cli/calibrate_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "cache/block_pool.h"
#include "cache/eviction/session_evictor.h"
#include "common/args.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "worker/model/load_from_flags.h"
#include "worker/runtime/forward.h"

namespace recall::cli {
namespace {

constexpr char kUsage[] =
    R"(usage: recall calibrate-window --model PATH [--tokenizer PATH] [options]

Generates a calibration sample with the full cache while tracking LazyEviction's per-token
state (no eviction), and prints the given percentile of the maximum recurrence intervals
(MRI) observed: the window W that covers that share of recurrences.

  --texts N          sampled texts (default 8)
  --tokens N         tokens per text including the prompt (default: the model's context,
                     at most 2048)
  --alpha A          importance threshold (default 1e-4)
  --percentile P     in (0, 100] (default 80)
  --prompt TEXT      prompt of every text (default "Once upon a time")
  --seed S           first sampling seed (default 1)
  --threads N        CPU threads (default: all cores)
)";

absl::Status Run(const Args& args) {
  if (!args.Has("model")) return absl::InvalidArgumentError("--model is required");
  RECALL_ASSIGN_OR_RETURN(const int64_t texts, args.GetInt("texts", 8, 1, 100000));
  RECALL_ASSIGN_OR_RETURN(const double alpha, args.GetDouble("alpha", 1e-4, 0, 1));
  RECALL_ASSIGN_OR_RETURN(const double pct, args.GetDouble("percentile", 80, 1e-9, 100));
  RECALL_ASSIGN_OR_RETURN(const int64_t seed, args.GetInt("seed", 1, 0, INT64_MAX));
  RECALL_ASSIGN_OR_RETURN(const int64_t threads, args.GetInt("threads", 0, 0, 1024));
  RECALL_ASSIGN_OR_RETURN(model::Loaded loaded, model::LoadAll(args));
  const model::ModelConfig& c = loaded.model->config;
  RECALL_ASSIGN_OR_RETURN(const int64_t tokens,
                          args.GetInt("tokens", std::min(c.max_seq_len, 2048), 2, c.max_seq_len));

  const std::vector<int32_t> prompt = loaded.tokenizer->Encode(
      args.GetString("prompt", "Once upon a time"), /*add_bos=*/!loaded.hf_tokenizer);
  if (prompt.empty() || static_cast<int64_t>(prompt.size()) >= tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prompt: ", prompt.size(), " tokens; must be in [1, --tokens)"));
  }
  std::unique_ptr<kernels::Backend> backend =
      kernels::CreateCpuBackend({static_cast<int>(threads)});
  const kernels::PagedKvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, 16};
  RECALL_ASSIGN_OR_RETURN(std::unique_ptr<cache::BlockPool> pool,
                          cache::BlockPool::Create(layout, c.n_layers * ((tokens + 15) / 16 + 1)));
  runtime::ForwardPass forward(*loaded.model, *backend, {static_cast<int>(prompt.size())});
  const int64_t stride = tokens;
  std::vector<float> probs(static_cast<size_t>(c.n_layers) * c.n_heads * stride);
  std::vector<float> logits(c.vocab_size);
  std::vector<int32_t> mris;

  for (int64_t text = 0; text < texts; ++text) {
    cache::SequenceCache seq(pool.get());
    cache::eviction::SessionEvictorOptions eo;
    eo.policy.name = "lazy";
    eo.policy.alpha = static_cast<float>(alpha);
    eo.policy.window = 1;
    eo.budget.budget = static_cast<double>(tokens);  // never over budget: observe only
    eo.n_heads = c.n_heads;
    RECALL_ASSIGN_OR_RETURN(std::unique_ptr<cache::eviction::SessionEvictor> evictor,
                            cache::eviction::SessionEvictor::Create(eo, &seq));
    runtime::BatchItem pre{&seq, prompt.data(), static_cast<int>(prompt.size())};
    RECALL_RETURN_IF_ERROR(forward.Run({&pre, 1}, logits.data()));
    kernels::SamplingParams sampling;
    sampling.temperature = 1.0f;
    sampling.top_p = 0.95f;
    kernels::Rng rng(static_cast<uint64_t>(seed + text));
    std::vector<int32_t> history = prompt;
    while (static_cast<int64_t>(history.size()) < tokens) {
      const int32_t next = backend->Sample(logits.data(), c.vocab_size, sampling, rng,
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
  absl::StatusOr<Args> args = Args::Parse(
      argv,
      {"model", "tokenizer", "texts", "tokens", "alpha", "percentile", "prompt", "seed", "threads"},
      {"help"});
  if (!args.ok()) {
    std::cerr << "recall calibrate-window: " << args.status().message() << "\n\n" << kUsage;
    return 2;
  }
  if (args->Has("help")) {
    std::cout << kUsage;
    return 0;
  }
  const absl::Status st = Run(*args);
  if (!st.ok()) {
    std::cerr << "recall calibrate-window: " << st.message() << "\n";
    return st.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}

}  // namespace recall::cli
