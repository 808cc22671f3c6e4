// What the endless-session tests share (tests/worker/serving/endless_test.cc on CPU ranks,
// tests/cuda/cuda_serving_test.cc on a GPU): a Scheduler whose sessions default to a compact
// lazy cache of kBudget + kWindow, prefilled in kChunk-token chunks; the most bytes such a
// session may hold; and the lines of a long conversation.
#pragma once

#include <memory>
#include <vector>

#include "cache/eviction/eviction_policy.h"
#include "gtest/gtest.h"
#include "worker/runtime/engine.h"
#include "worker/serving/scheduler.h"

namespace recall::testing {

inline constexpr int kCompactBudget = 64, kCompactWindow = 16, kCompactChunk = 64;

inline constexpr const char* kConversationLines[] = {
    "Tom went to the park with his red ball.", "What did Tom see near the big tree?",
    "Lily wanted to play with the ball too.",  "Why was the dog barking at the cat?",
    "Then the sun went down and it was late.", "Where did the bird fly after that?"};

// An engine of `tp` ranks on `device` (two compute threads, 32 MiB of KV cache), appended to
// `engines` (which must outlive its schedulers); null (with a test failure) on error.
inline runtime::Engine* AddEngine(const model::Model& model,
                                  std::vector<std::unique_ptr<runtime::Engine>>& engines,
                                  int tp = 1, runtime::Device device = runtime::Device::kCpu) {
  runtime::EngineOptions eo;
  eo.tp = tp;
  eo.device = device;
  eo.threads = 2;
  eo.kv_cache_bytes = int64_t{32} << 20;
  auto engine = runtime::Engine::Create(model, eo);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return nullptr;
  engines.push_back(*std::move(engine));
  return engines.back().get();
}

// The scheduler's options for compact lazy sessions.
inline serving::SchedulerOptions CompactLazyOptions() {
  serving::SchedulerOptions so;
  so.stop_token_ids = {2};
  so.prefill_chunk = kCompactChunk;
  so.cache.policy = "lazy";
  so.cache.budget_tokens = kCompactBudget;
  so.cache.window = kCompactWindow;
  return so;
}

// A scheduler over `engine` (which must outlive it); null (with a test failure) on error.
inline std::unique_ptr<serving::Scheduler> StartCompactLazy(
    runtime::Engine& engine, const model::Tokenizer& tok, metrics::Registry* metrics,
    const serving::SchedulerOptions& so = CompactLazyOptions()) {
  auto s = serving::Scheduler::Create(engine, tok, so, metrics);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

// The most KV bytes such a session may hold: budget + window + one chunk (+ the token being
// fed), in whole blocks, in every layer and rank, with lazy's ts and mri per slot of every
// (layer, KV head). on_backend: the evictor steps on a GPU, whose copy of ts and mri
// (LazyBackendState, beside the host's) has a power-of-two capacity of at least 64 slots.
inline int64_t CompactLazyBound(const model::ModelConfig& c, int64_t block_bytes, int tp,
                                bool on_backend = false) {
  const int tokens = kCompactBudget + kCompactWindow + kCompactChunk + 1;
  const int64_t rows = int64_t{c.n_layers} * c.n_kv_heads;
  int64_t state = rows * cache::eviction::HeadStateBytesBound(
                             cache::eviction::kTsArray | cache::eviction::kMriArray, tokens);
  if (on_backend) {
    int64_t cap = 64;
    while (cap < tokens) cap *= 2;
    state += 2 * rows * cap * static_cast<int64_t>(sizeof(int32_t));
  }
  return int64_t{(tokens + 15) / 16} * c.n_layers * block_bytes * tp + state;
}

}  // namespace recall::testing
