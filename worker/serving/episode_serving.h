// EpisodeServing: EpiCache for the scheduler's episodic sessions (policy "episodic",
// EVICTION.md section 2).
//
// Until a session's history first passes its budget it runs on one lazy cache. Then its
// episodes are built off the serving path by an EpisodeBuilder (a background thread), and
// between turns this class installs a finished build (the episodes' caches parked in host
// memory, counted against the host budget by SessionMemory), routes each turn to the episode
// closest to its last user message, swaps that episode's cache in (parking the one in use)
// and submits a rebuild every recluster_turns turns. The builder and the routing embedder
// are created on first use.
//
// Episodic sessions run on one rank whose pool the host can read (Supported()).
// Engine thread only, but for WaitIdle.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/block_pool.h"
#include "cache/episodic/embedder.h"
#include "cache/eviction/session_evictor.h"
#include "common/metrics/registry.h"
#include "kernels/backend.h"
#include "worker/model/model.h"
#include "worker/serving/session.h"
#include "worker/serving/session_memory.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::serving {

class EpisodeBuilder;

class EpisodeServing {
 public:
  struct Counters {
    metrics::Counter* installed = nullptr;  // episode sets installed
    metrics::Counter* failed = nullptr;     // builds that failed
    metrics::Counter* over_host = nullptr;  // builds not run or installed: over the host budget
    metrics::Counter* switches = nullptr;   // turns routed to another episode
  };

  // `pool`: the one rank's pool, or null when the scheduler has several ranks. Everything
  // passed must outlive this.
  EpisodeServing(const model::Model& model, const model::Tokenizer& tokenizer,
                 cache::BlockPool* pool, int threads, SessionMemory& memory, Counters counters);
  ~EpisodeServing();
  EpisodeServing(const EpisodeServing&) = delete;
  EpisodeServing& operator=(const EpisodeServing&) = delete;

  // One rank whose pool the host can read.
  bool Supported() const;
  // Creates the builder and the routing embedder (once). InvalidArgument when !Supported().
  absl::Status Start();
  // The lazy evictor options of an episodic session's cache.
  cache::eviction::SessionEvictorOptions EvictorOptions(const Session& s) const;

  // Takes finished builds for their sessions (installed at their next turn).
  void Collect();
  // For an episodic session's continuing turn, given its messages: installs a finished
  // build, routes the turn to its episode (swapping caches) and submits a rebuild when one
  // is due. Returns how many of the session's tokens the episode now in use holds: the rest
  // must be fed again before the turn's prompt (positions continue from its own).
  absl::StatusOr<size_t> BeginTurn(Session& s, const std::vector<model::ChatMessage>& messages);
  // After a completed turn: the active episode's cache holds every token of the session.
  void TurnDone(Session& s);
  // Forgets a dropped session's queued build and finished result.
  void Cancel(const std::string& session);
  // Blocks until the builder has nothing queued or building (at once when never started).
  // Thread safe.
  void WaitIdle() const;

 private:
  void Install(Session& s);
  // Makes `episode`'s cache the session's (parking the one in use), with a fresh evictor.
  absl::Status Switch(Session& s, int episode);
  // Submits a build of the session's history when one is due.
  void Submit(Session& s);

  const model::Model& model_;
  const model::Tokenizer& tokenizer_;
  cache::BlockPool* const pool_;
  const int threads_;
  SessionMemory& memory_;
  const Counters counters_;
  std::unique_ptr<EpisodeBuilder> builder_;
  std::atomic<EpisodeBuilder*> builder_ptr_{nullptr};  // for WaitIdle on other threads
  std::unique_ptr<kernels::Backend> route_backend_;
  std::unique_ptr<cache::episodic::Embedder> route_embedder_;
};

}  // namespace recall::serving
