#include "worker/serving/episode_builder.h"

#include <algorithm>

#include "common/logging.h"
#include "common/status.h"
#include "worker/runtime/device.h"
#include "worker/runtime/episodic/model_embedder.h"

namespace recall::serving {

EpisodeBuilder::EpisodeBuilder(const model::Model& model, const model::Tokenizer& tokenizer,
                               const kernels::PagedKvLayout& layout,
                               std::unique_ptr<kernels::Backend> backend)
    : model_(model), tokenizer_(tokenizer), layout_(layout), backend_(std::move(backend)) {}

absl::StatusOr<std::unique_ptr<EpisodeBuilder>> EpisodeBuilder::Create(
    const model::Model& model, const model::Tokenizer& tokenizer,
    const kernels::PagedKvLayout& layout, int threads) {
  // Its own CPU backend: builds run beside the serving thread's steps.
  RECALL_ASSIGN_OR_RETURN(
      std::unique_ptr<kernels::Backend> backend,
      runtime::MakeBackend({.device = runtime::Device::kCpu, .cpu_threads = std::max(1, threads)}));
  std::unique_ptr<EpisodeBuilder> b(
      new EpisodeBuilder(model, tokenizer, layout, std::move(backend)));
  b->forward_ =
      std::make_unique<runtime::ForwardPass>(model, *b->backend_, runtime::ForwardOptions{256});
  runtime::episodic::ModelEmbedderOptions eo;
  eo.add_bos = tokenizer.bos_id() >= 0;
  eo.max_tokens = std::min(256, model.config.max_seq_len - 1);
  RECALL_ASSIGN_OR_RETURN(b->model_embedder_, runtime::episodic::ModelEmbedder::Create(
                                                  model, *b->backend_, tokenizer, eo));
  b->thread_ = std::thread([p = b.get()] { p->Loop(); });
  return b;
}

EpisodeBuilder::~EpisodeBuilder() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    queue_.clear();
  }
  thread_.join();
}

void EpisodeBuilder::Submit(EpisodeJob job) {
  absl::MutexLock lock(&mu_);
  for (EpisodeJob& queued : queue_) {
    if (queued.session == job.session) {
      queued = std::move(job);
      return;
    }
  }
  queue_.push_back(std::move(job));
}

std::vector<EpisodeResult> EpisodeBuilder::TakeReady() {
  absl::MutexLock lock(&mu_);
  std::vector<EpisodeResult> out = std::move(ready_);
  ready_.clear();
  return out;
}

void EpisodeBuilder::Cancel(const std::string& session) {
  absl::MutexLock lock(&mu_);
  queue_.erase(std::remove_if(queue_.begin(), queue_.end(),
                              [&](const EpisodeJob& j) { return j.session == session; }),
               queue_.end());
  ready_.erase(std::remove_if(ready_.begin(), ready_.end(),
                              [&](const EpisodeResult& r) { return r.session == session; }),
               ready_.end());
  if (building_ == session) cancel_building_ = true;
}

int EpisodeBuilder::pending() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(queue_.size()) + (building_.empty() ? 0 : 1);
}

void EpisodeBuilder::WaitIdle() const {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](const EpisodeBuilder* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(b->mu_) {
        return b->queue_.empty() && b->building_.empty();
      },
      this));
}

void EpisodeBuilder::Loop() {
  while (true) {
    EpisodeJob job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](EpisodeBuilder* b)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(b->mu_) { return b->stop_ || !b->queue_.empty(); },
          this));
      if (stop_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      building_ = job.session;
      cancel_building_ = false;
    }
    EpisodeResult result = Build(job);
    if (!result.set.ok()) {
      RECALL_LOG(WARNING) << "episodes of session " << job.session
                          << " not built: " << result.set.status();
    }
    absl::MutexLock lock(&mu_);
    if (!cancel_building_ && !stop_) ready_.push_back(std::move(result));
    building_.clear();
  }
}

namespace {

int32_t LargestBudget(const EpisodeJob& job) {
  return job.budgets.empty() ? 0 : *std::max_element(job.budgets.begin(), job.budgets.end());
}

}  // namespace

int64_t EpisodeBuildPoolBlocksPerLayer(const EpisodeJob& job,
                                       const kernels::PagedKvLayout& layout) {
  const int64_t bt = layout.block_tokens;
  return (LargestBudget(job) + job.options.block.block_tokens + bt - 1) / bt + 1;
}

int64_t EpisodeBuildHostBytes(const EpisodeJob& job, const kernels::PagedKvLayout& layout) {
  const int64_t bt = layout.block_tokens;
  const int64_t episode_blocks = (LargestBudget(job) + bt - 1) / bt;
  const int64_t blocks_per_layer =
      EpisodeBuildPoolBlocksPerLayer(job, layout) + job.options.episodes * episode_blocks;
  return layout.n_layers * blocks_per_layer * layout.BlockBytes();
}

EpisodeResult EpisodeBuilder::Build(EpisodeJob& job) {
  EpisodeResult r;
  r.session = job.session;
  r.generation = job.generation;
  r.history_tokens = job.history.size();
  absl::StatusOr<std::unique_ptr<cache::BlockPool>> pool = cache::BlockPool::Create(
      layout_, layout_.n_layers * EpisodeBuildPoolBlocksPerLayer(job, layout_));
  if (!pool.ok()) {
    r.set = pool.status();
    return r;
  }
  r.pool = std::move(*pool);
  cache::episodic::Embedder* embedder = model_embedder_.get();
  if (job.embedder == "tfidf") {
    absl::StatusOr<std::unique_ptr<cache::episodic::HashedTfIdfEmbedder>> tfidf =
        cache::episodic::HashedTfIdfEmbedder::Create({});
    if (!tfidf.ok()) {
      r.set = tfidf.status();
      return r;
    }
    r.router = std::move(*tfidf);
    embedder = r.router.get();
  }
  job.options.block.chunk = std::min(job.options.block.chunk, forward_->max_batch_tokens());
  r.set = runtime::episodic::BuildEpisodeSet(*forward_, *r.pool, tokenizer_, *embedder, job.windows,
                                             job.history, job.budgets, job.options);
  return r;
}

}  // namespace recall::serving
