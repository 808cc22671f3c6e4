#include "coordinator/router.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace recall::coordinator {
namespace {

// 64-bit FNV-1a, mixed; deterministic across processes (std::hash is not required to be).
uint64_t Hash(const std::string& a, const std::string& b) {
  uint64_t h = 1469598103934665603ull;
  for (const std::string* s : {&a, &b}) {
    for (unsigned char c : *s) h = (h ^ c) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

}  // namespace

std::optional<RouteDecision> Route(const std::vector<WorkerView>& workers,
                                   const std::string& session_id, const std::string& bound,
                                   const std::vector<std::string>& exclude, double load_factor) {
  auto excluded = [&](const std::string& a) {
    return std::find(exclude.begin(), exclude.end(), a) != exclude.end();
  };
  // (A stopping worker takes no turn, its own sessions' included: LoadReport.stopping.)
  for (const WorkerView& w : workers) {
    if (w.address == bound && w.healthy && !w.load.stopping() && !excluded(w.address)) {
      return RouteDecision{w.address, true};
    }
  }
  std::vector<const WorkerView*> candidates;
  double total_load = 0;
  for (const WorkerView& w : workers) {
    if (!w.healthy || w.draining || w.load.stopping() || excluded(w.address)) continue;
    candidates.push_back(&w);
    total_load += w.load.active_turns() + w.load.queued_turns();
  }
  if (candidates.empty()) return std::nullopt;
  const double bound_load = load_factor * total_load / candidates.size() + 1;
  const WorkerView* best = nullptr;
  double best_score = -1;
  for (int pass = 0; pass < 2 && best == nullptr; ++pass) {
    for (const WorkerView* w : candidates) {
      const double load = w->load.active_turns() + w->load.queued_turns();
      if (pass == 0 && load > bound_load) continue;
      const double weight = (w->load.kv_blocks_free() + 1.0) / (w->load.kv_blocks_total() + 1.0) /
                            (1.0 + w->load.queued_turns());
      const double u = (static_cast<double>(Hash(session_id, w->address) >> 11) + 0.5) /
                       static_cast<double>(uint64_t{1} << 53);
      const double score = -weight / std::log(u);
      if (score > best_score) {
        best_score = score;
        best = w;
      }
    }
  }
  return RouteDecision{best->address, false};
}

std::vector<WorkerView> WorkersWithModel(const std::vector<WorkerView>& workers,
                                         const std::string& model) {
  if (model.empty()) return workers;
  std::vector<WorkerView> out;
  for (const WorkerView& w : workers) {
    if (w.info.model() == model) out.push_back(w);
  }
  return out;
}

std::vector<WorkerView> WorkersStoring(const std::vector<WorkerView>& workers,
                                       const std::string& kv_dtype) {
  if (kv_dtype.empty()) return workers;
  std::vector<WorkerView> out;
  for (const WorkerView& w : workers) {
    if (w.info.default_cache().kv_dtype() == kv_dtype) out.push_back(w);
  }
  return out;
}

std::vector<WorkerView> WorkersServing(const std::vector<WorkerView>& workers,
                                       const std::string& policy) {
  if (policy.empty()) return workers;
  std::vector<WorkerView> out;
  for (const WorkerView& w : workers) {
    const auto& p = w.info.policies();
    if (p.empty() || std::find(p.begin(), p.end(), policy) != p.end()) out.push_back(w);
  }
  return out;
}

}  // namespace recall::coordinator
