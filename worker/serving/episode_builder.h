// EpisodeBuilder: builds sessions' episodes off the serving path. One background thread
// with its own CPU backend, forward pass and (per job) KV pool runs BuildEpisodeSet for
// queued jobs; the serving thread takes finished results between turns and moves the
// (offloaded) caches to its own pool (SequenceCache::Rebind).
//
// A job is a snapshot of a session's history (its tokens and transcript windows); while it
// builds, the session keeps serving from what it had. A newer job of the same session
// replaces a queued one; Cancel forgets a session's queued job and finished result (a build
// in progress finishes and is then discarded).
//
// The model's weights must be in host memory (the CPU engine's). Thread safe.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cache/episodic/embedder.h"
#include "kernels/backend.h"
#include "worker/model/model.h"
#include "worker/runtime/episodic/episode_set.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::serving {

struct EpisodeJob {
  std::string session;
  uint64_t generation = 0;  // the caller's tag, returned with the result
  std::vector<int32_t> history;
  std::vector<cache::episodic::Window> windows;
  std::vector<int32_t> budgets;    // per layer
  std::string embedder = "model";  // "model" or "tfidf"
  runtime::episodic::EpisodeBuildOptions options;
};

struct EpisodeResult {
  std::string session;
  uint64_t generation = 0;
  size_t history_tokens = 0;  // the job's history length: what every cache holds
  // The pool the caches were built in (they hold no blocks of it); keep it until they are
  // rebound. Declared before `set` so it outlives the caches.
  std::unique_ptr<cache::BlockPool> pool;
  absl::StatusOr<runtime::episodic::EpisodeSet> set = absl::UnknownError("not built");
  // For routing turns: the TF-IDF embedder fitted on the job's windows (null for "model").
  std::unique_ptr<cache::episodic::Embedder> router;
};

// The KV blocks per layer of the pool a build of `job` uses: its largest layer budget plus
// one block of the block-wise prefill, and one more.
int64_t EpisodeBuildPoolBlocksPerLayer(const EpisodeJob& job, const kernels::PagedKvLayout& layout);
// At most the host bytes a build of `job` holds: its pool, and the host copies of its
// episodes (each at most the largest layer budget in every layer).
int64_t EpisodeBuildHostBytes(const EpisodeJob& job, const kernels::PagedKvLayout& layout);

class EpisodeBuilder {
 public:
  // layout: the serving pool's (the built caches must fit it). threads: CPU threads of the
  // builder's backend. The model and tokenizer must outlive the builder.
  static absl::StatusOr<std::unique_ptr<EpisodeBuilder>> Create(
      const model::Model& model, const model::Tokenizer& tokenizer,
      const kernels::PagedKvLayout& layout, int threads = 1);
  ~EpisodeBuilder();  // waits for a build in progress, drops queued jobs
  EpisodeBuilder(const EpisodeBuilder&) = delete;
  EpisodeBuilder& operator=(const EpisodeBuilder&) = delete;

  void Submit(EpisodeJob job);
  // Finished results (successful or not), oldest first.
  std::vector<EpisodeResult> TakeReady();
  void Cancel(const std::string& session);
  // Jobs queued or building.
  int pending() const;
  // Blocks until nothing is queued or building (tests, benchmarks).
  void WaitIdle() const;

 private:
  EpisodeBuilder(const model::Model& model, const model::Tokenizer& tokenizer,
                 const kernels::PagedKvLayout& layout, std::unique_ptr<kernels::Backend> backend);
  void Loop();
  EpisodeResult Build(EpisodeJob& job);

  const model::Model& model_;
  const model::Tokenizer& tokenizer_;
  const kernels::PagedKvLayout layout_;
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<runtime::ForwardPass> forward_;              // builder thread only
  std::unique_ptr<cache::episodic::Embedder> model_embedder_;  // builder thread only

  mutable absl::Mutex mu_;
  std::deque<EpisodeJob> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<EpisodeResult> ready_ ABSL_GUARDED_BY(mu_);
  std::string building_ ABSL_GUARDED_BY(mu_);  // the session being built, empty when idle
  bool cancel_building_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace recall::serving
