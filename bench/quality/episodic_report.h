// The episodic benchmark's aggregation and output: means over conversations per (method,
// budget), the text tables, the JSON (with every run's continuation and EpiCache's routing)
// and the gnuplot PNG.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "bench/quality/episodic_eval.h"
#include "bench/quality/story_set.h"
#include "nlohmann/json.hpp"

namespace recall::bench {

struct RunRecord {
  std::string method;
  int budget = 0;
  MethodRun run;
};

struct ConversationResult {
  const Conversation* conversation = nullptr;
  const StoryPrompt* prompt = nullptr;
  Reference reference;
  std::vector<double> reference_logp;  // log p_full(reference token i)
  std::vector<RunRecord> runs;
};

class Report {
 public:
  // details: keep every run's continuation and EpiCache's per-episode checks for the JSON.
  Report(std::vector<int> budgets, const std::vector<Method>& methods, const EvalSettings& settings,
         int recent, int match_tokens, bool details);

  void Add(const ConversationResult& result);

  std::string Table() const;
  nlohmann::json Json() const;
  // Writes png_path + ".dat" / ".gp" and runs gnuplot; FailedPrecondition without gnuplot.
  absl::Status WritePlot(const std::string& png_path, const std::string& title) const;

  int min_prompt_tokens() const { return min_prompt_; }
  int max_prompt_tokens() const { return max_prompt_; }

 private:
  // Sums over conversations (and name occurrences); divided out when printed.
  struct Agg {
    int64_t runs = 0;
    int64_t prefix_sum = 0, never_diverged = 0, match_sum = 0;
    double kl_sum = 0;
    int64_t top1 = 0, positions = 0;
    double p_name_sum = 0, p_comp_sum = 0;
    int64_t n_name = 0, n_comp = 0;
    double p_own_name_sum = 0, p_own_comp_sum = 0;  // along the story's own text
    int64_t n_own_name = 0, n_own_comp = 0;
    int64_t has_name = 0, has_comp = 0, wrong = 0;
    double target_share_sum = 0;
    double prefill_seconds_sum = 0;
    double peak_sum = 0, final_sum = 0, tf_final_sum = 0, total_sum = 0;
    std::vector<int64_t> prefix_by_target, runs_by_target;
    // EpiCache.
    int64_t clustered = 0, fallback = 0, routed_best = 0, over_budget = 0, episodes = 0;
    int64_t routed_target_window = 0, replica_mismatch = 0;
    double overlap_sum = 0;
    int max_history_slots = 0;
    double active_share_sum = 0, best_share_sum = 0;
    double embed_sum = 0, build_sum = 0, build_peak_sum = 0;
    double ref_prefill_seconds_sum = 0, ref_prefill_bytes_sum = 0;
  };
  struct Means;
  Means MeansOf(const Agg& a) const;
  void AddRun(const ConversationResult& r, const MethodRun& run, int budget, Agg* agg);

  std::vector<int> budgets_;
  std::vector<std::string> labels_;  // non-full methods, in order
  std::vector<bool> episodic_;
  EvalSettings settings_;
  int recent_ = 0;
  int match_tokens_ = 0;
  bool details_ = false;
  int stories_ = 0;
  Agg full_;
  std::map<std::pair<std::string, int>, Agg> aggs_;
  nlohmann::json conversations_ = nlohmann::json::array();
  int min_prompt_ = 1 << 30, max_prompt_ = 0;
  int64_t ref_tokens_sum_ = 0, ref_stopped_ = 0, conversations_n_ = 0;
};

}  // namespace recall::bench
