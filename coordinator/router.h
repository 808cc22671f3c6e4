// Router: which worker serves a session's turn.
//
// A session sticks to its bound worker while that worker is healthy (its KV cache lives
// there). A new (or orphaned) session goes by weighted rendezvous hashing, a consistent
// hash: every healthy, non-draining worker gets the score -w / ln(u), u = hash(session,
// worker) in (0, 1), with weight w = (free KV blocks + 1) / (total + 1) / (1 + queued turns);
// the highest score wins. Adding or losing a worker moves only the sessions that hashed to
// it. Bounded load: workers whose active + queued turns exceed `load_factor` times the mean
// (plus one) are skipped while any other worker is within the bound.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "coordinator/worker_registry.h"

namespace recall::coordinator {

struct RouteDecision {
  std::string worker;
  bool sticky = false;  // the session's bound worker
};

// `exclude`: workers that just failed this turn. nullopt when no worker can take it.
std::optional<RouteDecision> Route(const std::vector<WorkerView>& workers,
                                   const std::string& session_id, const std::string& bound,
                                   const std::vector<std::string>& exclude,
                                   double load_factor = 1.25);

// The workers that serve `model` (their Info's model); all of them when `model` is empty. A
// worker whose Info has not arrived yet is left out of a named model's choice.
std::vector<WorkerView> WorkersWithModel(const std::vector<WorkerView>& workers,
                                         const std::string& model);

// The workers whose KV cache stores `kv_dtype` (their Info's default_cache.kv_dtype); all of
// them when `kv_dtype` is empty (the session takes its worker's type). A worker whose Info
// has not arrived yet is left out of a typed choice.
std::vector<WorkerView> WorkersStoring(const std::vector<WorkerView>& workers,
                                       const std::string& kv_dtype);

// The workers that serve cache policy `policy` (their Info's policies; episodic only where
// a worker runs it); all of them when `policy` is empty. A worker whose Info has not
// arrived yet is kept (its turn says).
std::vector<WorkerView> WorkersServing(const std::vector<WorkerView>& workers,
                                       const std::string& policy);

}  // namespace recall::coordinator
