#include "bench/quality/episodic_report.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/quality/report.h"
#include "common/status.h"

namespace recall::bench {
namespace {

double Div(double a, double b) { return b > 0 ? a / b : std::nan(""); }

// JSON has no NaN: write null.
nlohmann::json Num(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); }

// Tokens equal (stop token included, "ended" equal to "ended") before the first difference,
// capped at `cap`; and the equal positions among the first `first`.
void Agreement(const std::vector<int32_t>& a, const std::vector<int32_t>& b, int cap, int first,
               int* prefix, int* matches) {
  const auto at = [](const std::vector<int32_t>& v, int i) {
    return i < static_cast<int>(v.size()) ? v[static_cast<size_t>(i)] : -1;
  };
  *prefix = 0;
  while (*prefix < cap && at(a, *prefix) == at(b, *prefix)) ++*prefix;
  *matches = 0;
  for (int i = 0; i < first; ++i) *matches += at(a, i) == at(b, i) ? 1 : 0;
}

// Adds exp(sum of logp over the name's tokens) at each occurrence.
void NameProbs(const std::vector<int>& at, size_t n_tokens, const std::vector<double>& logp,
               double* sum, int64_t* count) {
  for (int pos : at) {
    double lp = 0;
    for (size_t j = 0; j < n_tokens; ++j) lp += logp[static_cast<size_t>(pos) + j];
    *sum += std::exp(lp);
    ++*count;
  }
}

bool NamesAny(const std::string& text, const std::vector<std::string>& names) {
  for (const std::string& n : names) {
    if (ContainsWord(text, n)) return true;
  }
  return false;
}

}  // namespace

struct Report::Means {
  double prefix, match, kl, top1, p_name, p_comp, p_own_name, p_own_comp, has_name, has_comp, wrong,
      target_share;
  double prefill_ms, peak, final_bytes, tf_final, total;
  double routed_target_window, overlap;
  double routed_best, active_share, best_share, embed_ms, build_ms, ref_prefill_ms, build_peak,
      ref_prefill_bytes;
};

Report::Means Report::MeansOf(const Agg& a) const {
  Means m;
  m.prefix = Div(a.prefix_sum, a.runs);
  m.match = Div(a.match_sum, a.runs * match_tokens_);
  m.kl = Div(a.kl_sum, a.positions);
  m.top1 = Div(a.top1, a.positions);
  m.p_name = Div(a.p_name_sum, a.n_name);
  m.p_comp = Div(a.p_comp_sum, a.n_comp);
  m.p_own_name = Div(a.p_own_name_sum, a.n_own_name);
  m.p_own_comp = Div(a.p_own_comp_sum, a.n_own_comp);
  m.has_name = Div(a.has_name, a.runs);
  m.has_comp = Div(a.has_comp, a.runs);
  m.wrong = Div(a.wrong, a.runs);
  m.target_share = Div(a.target_share_sum, a.runs);
  m.prefill_ms = 1e3 * Div(a.prefill_seconds_sum, a.runs);
  m.peak = Div(a.peak_sum, a.runs);
  m.final_bytes = Div(a.final_sum, a.runs);
  m.tf_final = Div(a.tf_final_sum, a.runs);
  m.routed_target_window = Div(a.routed_target_window, a.clustered);
  m.overlap = Div(a.overlap_sum, a.clustered);
  m.total = Div(a.total_sum, a.runs);
  m.routed_best = Div(a.routed_best, a.clustered);
  m.active_share = Div(a.active_share_sum, a.clustered);
  m.best_share = Div(a.best_share_sum, a.clustered);
  m.embed_ms = 1e3 * Div(a.embed_sum, a.clustered);
  m.build_ms = 1e3 * Div(a.build_sum, a.clustered);
  m.ref_prefill_ms = 1e3 * Div(a.ref_prefill_seconds_sum, a.runs);
  m.build_peak = Div(a.build_peak_sum, a.clustered);
  m.ref_prefill_bytes = Div(a.ref_prefill_bytes_sum, a.runs);
  return m;
}

Report::Report(std::vector<int> budgets, const std::vector<Method>& methods,
               const EvalSettings& settings, int recent, int match_tokens, bool details)
    : budgets_(std::move(budgets)),
      settings_(settings),
      recent_(recent),
      match_tokens_(match_tokens),
      details_(details) {
  for (const Method& m : methods) {
    labels_.push_back(m.label);
    episodic_.push_back(m.kind == "episodic");
  }
}

void Report::AddRun(const ConversationResult& r, const MethodRun& run, int budget, Agg* a) {
  const StoryPrompt& p = *r.prompt;
  const Reference& ref = r.reference;
  int prefix = 0, matches = 0;
  Agreement(run.tokens, ref.tokens, settings_.max_new, match_tokens_, &prefix, &matches);
  ++a->runs;
  a->prefix_sum += prefix;
  a->never_diverged += prefix == settings_.max_new ? 1 : 0;
  a->match_sum += matches;
  a->kl_sum += run.kl_sum;
  a->top1 += run.top1;
  a->positions += run.positions;
  NameProbs(ref.name_at, p.name_ids.size(), run.ref_logp, &a->p_name_sum, &a->n_name);
  NameProbs(ref.companion_at, p.companion_ids.size(), run.ref_logp, &a->p_comp_sum, &a->n_comp);
  NameProbs(p.original_name_at, p.name_ids.size(), run.original_logp, &a->p_own_name_sum,
            &a->n_own_name);
  NameProbs(p.original_companion_at, p.companion_ids.size(), run.original_logp, &a->p_own_comp_sum,
            &a->n_own_comp);
  a->has_name += ContainsWord(run.text, p.name) ? 1 : 0;
  a->has_comp += ContainsWord(run.text, p.companion) ? 1 : 0;
  a->wrong += NamesAny(run.text, p.other_names) ? 1 : 0;
  a->target_share_sum += run.target_share_end;
  a->prefill_seconds_sum += run.prefill_seconds;
  a->peak_sum += static_cast<double>(run.peak_kv_bytes);
  a->final_sum += static_cast<double>(run.final_kv_bytes);
  a->tf_final_sum += static_cast<double>(run.tf_final_kv_bytes);
  a->total_sum += static_cast<double>(run.total_kv_bytes);
  a->prefix_by_target.resize(std::max<size_t>(a->prefix_by_target.size(), stories_), 0);
  a->runs_by_target.resize(a->prefix_by_target.size(), 0);
  a->prefix_by_target[static_cast<size_t>(p.target)] += prefix;
  ++a->runs_by_target[static_cast<size_t>(p.target)];
  a->ref_prefill_seconds_sum += ref.prefill_seconds;
  a->ref_prefill_bytes_sum += static_cast<double>(ref.prefill_kv_bytes);
  if (!run.clustered) return;
  ++a->clustered;
  a->fallback += run.routed_by_fallback ? 1 : 0;
  a->routed_target_window += run.routed_to_target_window ? 1 : 0;
  a->replica_mismatch += run.replica_active != run.active ? 1 : 0;
  a->overlap_sum += run.episode_overlap;
  int best = 0;
  for (size_t e = 0; e < run.episodes.size(); ++e) {
    const EpisodeCheck& c = run.episodes[e];
    if (c.target_share > run.episodes[static_cast<size_t>(best)].target_share) {
      best = static_cast<int>(e);
    }
    ++a->episodes;
    a->over_budget += c.max_history_slots > budget ? 1 : 0;
    a->max_history_slots = std::max(a->max_history_slots, c.max_history_slots);
  }
  const double active = run.episodes[static_cast<size_t>(run.active)].target_share;
  const double top = run.episodes[static_cast<size_t>(best)].target_share;
  a->routed_best += active >= top ? 1 : 0;
  a->active_share_sum += active;
  a->best_share_sum += top;
  a->embed_sum += run.embed_seconds;
  a->build_sum += run.build_seconds;
  a->build_peak_sum += static_cast<double>(run.build_peak_bytes);
}

void Report::Add(const ConversationResult& r) {
  const StoryPrompt& p = *r.prompt;
  const Reference& ref = r.reference;
  stories_ = std::max(stories_, static_cast<int>(p.stories.size()));
  min_prompt_ = std::min(min_prompt_, static_cast<int>(p.tokens.size()));
  max_prompt_ = std::max(max_prompt_, static_cast<int>(p.tokens.size()));
  ++conversations_n_;
  ref_tokens_sum_ += static_cast<int64_t>(ref.tokens.size());
  ref_stopped_ += static_cast<int>(ref.tokens.size()) < settings_.max_new ? 1 : 0;
  {
    // FullKV against itself: the reference run.
    MethodRun self;
    self.tokens = ref.tokens;
    self.text = ref.text;
    self.ref_logp = r.reference_logp;
    self.original_logp = ref.original_logp;
    self.top1 = static_cast<int>(ref.tokens.size());
    self.positions = static_cast<int>(ref.tokens.size());
    self.prefill_seconds = ref.prefill_seconds;
    self.peak_kv_bytes = self.final_kv_bytes = ref.final_kv_bytes;
    self.tf_final_kv_bytes = self.total_kv_bytes = ref.final_kv_bytes;
    self.target_share_end = Div(p.stories[static_cast<size_t>(p.target)].end -
                                    p.stories[static_cast<size_t>(p.target)].begin,
                                p.stories.back().end - p.stories.front().begin);
    AddRun(r, self, 0, &full_);
  }
  nlohmann::json runs = nlohmann::json::array();
  for (const RunRecord& rec : r.runs) {
    AddRun(r, rec.run, rec.budget, &aggs_[{rec.method, rec.budget}]);
    if (!details_) continue;
    int prefix = 0, matches = 0;
    Agreement(rec.run.tokens, ref.tokens, settings_.max_new, match_tokens_, &prefix, &matches);
    nlohmann::json j = {{"method", rec.method},
                        {"budget", rec.budget},
                        {"continuation", rec.run.text},
                        {"tokens_to_divergence", prefix},
                        {"target_share_end", rec.run.target_share_end},
                        {"final_kv_bytes", rec.run.final_kv_bytes}};
    if (rec.run.clustered) {
      nlohmann::json eps = nlohmann::json::array();
      for (const EpisodeCheck& c : rec.run.episodes) {
        eps.push_back({{"target_share", c.target_share},
                       {"dominant_story", c.dominant_story},
                       {"story_shares", c.story_shares},
                       {"windows", c.windows},
                       {"has_target_window", c.has_target_window},
                       {"max_history_slots", c.max_history_slots},
                       {"kv_bytes", c.kv_bytes},
                       {"resident", c.resident}});
      }
      j["episodic"] = {{"active", rec.run.active},
                       {"routed_by_fallback", rec.run.routed_by_fallback},
                       {"history_tokens", rec.run.history_tokens},
                       {"recent_tokens", rec.run.recent_tokens},
                       {"replica_active", rec.run.replica_active},
                       {"routed_to_target_window", rec.run.routed_to_target_window},
                       {"episode_overlap", rec.run.episode_overlap},
                       {"embed_seconds", rec.run.embed_seconds},
                       {"build_seconds", rec.run.build_seconds},
                       {"build_peak_bytes", rec.run.build_peak_bytes},
                       {"episodes", eps}};
    }
    runs.push_back(j);
  }
  const std::vector<Story>& pool = StoryPool();
  std::vector<std::string> names;
  for (int s : r.conversation->stories) names.push_back(pool[static_cast<size_t>(s)].name);
  conversations_.push_back({{"stories", names},
                            {"target", p.target},
                            {"name", p.name},
                            {"companion", p.companion},
                            {"prompt_tokens", p.tokens.size()},
                            {"query", r.conversation->query},
                            {"full_continuation", ref.text},
                            {"full_prefill_seconds", ref.prefill_seconds},
                            {"full_prefill_kv_bytes", ref.prefill_kv_bytes},
                            {"name_occurrences", ref.name_at.size()},
                            {"companion_occurrences", ref.companion_at.size()},
                            {"full_continuation_tokens", ref.tokens.size()},
                            {"runs", runs}});
  if (!details_) conversations_.back().erase("runs");
}

std::string Report::Table() const {
  std::string out = absl::StrFormat(
      "FullKV's greedy continuations: %.1f tokens on average (stop token included); %lld of "
      "%lld ended at BOS/EOS before %d tokens.\n\n",
      Div(ref_tokens_sum_, conversations_n_), static_cast<long long>(ref_stopped_),
      static_cast<long long>(conversations_n_), settings_.max_new);
  const auto row = [&](const std::string& label, const std::string& c, const Agg& a) {
    const Means m = MeansOf(a);
    absl::StrAppendFormat(&out,
                          "%-18s %4s %5.1f/%-3d %6.1f%% %7.4f %6.1f%% %7.4f %7.4f %7.4f "
                          "%5.0f%% %5.0f%% %5.0f%% %5.0f%% %6.1f %6.1f %6.1f\n",
                          label, c, m.prefix, settings_.max_new, 100 * m.match, m.kl, 100 * m.top1,
                          m.p_name, m.p_own_name, m.p_own_comp, 100 * m.has_name, 100 * m.has_comp,
                          100 * m.wrong, 100 * m.target_share, m.peak / 1024, m.tf_final / 1024,
                          m.total / 1024);
  };
  absl::StrAppendFormat(&out, "%-18s %4s %9s %7s %7s %7s %7s %7s %7s %6s %6s %6s %6s %6s %6s %6s\n",
                        "method", "C", "diverge", absl::StrCat("match", match_tokens_), "KL",
                        "top1", "p(name)", "o:name", "o:comp", "name", "comp", "wrong", "tgt",
                        "peakK", "finalK", "totalK");
  row("full", "-", full_);
  for (int b : budgets_) {
    for (const std::string& l : labels_) {
      auto it = aggs_.find({l, b});
      if (it != aggs_.end()) row(l, absl::StrCat(b), it->second);
    }
  }
  absl::StrAppendFormat(
      &out,
      "\ndiverge: greedy tokens equal to FullKV's before the first difference / cap; match%d: "
      "positions equal among the first %d; KL: mean KL(full || method) and top1: argmax == "
      "FullKV's token, teacher-forced along FullKV's continuation; p(name): mean "
      "teacher-forced probability of the restarted story's main character where FullKV's "
      "continuation says it (%lld occurrences; its companion, named only inside the story: "
      "%lld occurrences, p_companion_mean in the JSON); o:name/o:comp: the probability of the "
      "main character's / the companion's name along the story's own text after its first "
      "sentence (%lld / %lld occurrences); name/comp/wrong: free-running continuations naming the "
      "main character / the "
      "companion / any character of another story; tgt: of the story slots a method still "
      "holds at the end of its free-running continuation, the restarted story's share (full: "
      "the story's share of the prompt); peakK: device KV KiB at the most (free-running); "
      "finalK: device KV KiB after the teacher-forced continuation (the same tokens for "
      "every method); totalK: finalK plus EpiCache's other episodes on the host.\n",
      match_tokens_, match_tokens_, static_cast<long long>(full_.n_name),
      static_cast<long long>(full_.n_comp), static_cast<long long>(full_.n_own_name),
      static_cast<long long>(full_.n_own_comp));

  absl::StrAppend(&out, "\ndiverge by the restarted story's place in the conversation:\n");
  absl::StrAppendFormat(&out, "%-18s %4s", "method", "C");
  for (int t = 0; t < stories_; ++t)
    absl::StrAppendFormat(&out, " %8s", absl::StrCat("story", t + 1));
  absl::StrAppend(&out, "\n");
  const auto by_target = [&](const std::string& label, const std::string& c, const Agg& a) {
    absl::StrAppendFormat(&out, "%-18s %4s", label, c);
    for (size_t t = 0; t < a.prefix_by_target.size(); ++t) {
      absl::StrAppendFormat(&out, " %8.1f", Div(a.prefix_by_target[t], a.runs_by_target[t]));
    }
    absl::StrAppend(&out, "\n");
  };
  by_target("full", "-", full_);
  for (int b : budgets_) {
    for (const std::string& l : labels_) {
      auto it = aggs_.find({l, b});
      if (it != aggs_.end()) by_target(l, absl::StrCat(b), it->second);
    }
  }

  absl::StrAppend(&out, "\nEpiCache cost and checks:\n");
  absl::StrAppendFormat(&out,
                        "%-18s %4s %5s %6s %5s %5s %6s %6s %6s %6s %7s %8s %8s %7s %7s %8s %8s "
                        "%6s\n",
                        "method", "C", "clust", "rt-win", "mism", "fallb", "routed", "share",
                        "best", "over", "embedms", "buildms", "fullpfms", "(e+b)/f", "pf/f",
                        "peakbK", "fullK", "pk/f");
  for (int b : budgets_) {
    for (size_t i = 0; i < labels_.size(); ++i) {
      if (!episodic_[i]) continue;
      auto it = aggs_.find({labels_[i], b});
      if (it == aggs_.end()) continue;
      const Agg& a = it->second;
      const Means m = MeansOf(a);
      absl::StrAppendFormat(
          &out,
          "%-18s %4d %2lld/%-2lld %5.0f%% %5lld %5lld %5.0f%% %5.0f%% %5.0f%% %2lld/%-3lld "
          "%7.2f %8.2f %8.2f %7.2f %7.2f %8.1f %8.1f %6.2f   overlap %.2f\n",
          labels_[i], b, static_cast<long long>(a.clustered), static_cast<long long>(a.runs),
          100 * m.routed_target_window, static_cast<long long>(a.replica_mismatch),
          static_cast<long long>(a.fallback), 100 * m.routed_best, 100 * m.active_share,
          100 * m.best_share, static_cast<long long>(a.over_budget),
          static_cast<long long>(a.episodes), m.embed_ms, m.build_ms, m.ref_prefill_ms,
          (m.embed_ms + m.build_ms) / m.ref_prefill_ms, m.prefill_ms / m.ref_prefill_ms,
          m.build_peak / 1024, m.ref_prefill_bytes / 1024, m.build_peak / m.ref_prefill_bytes,
          m.overlap);
    }
  }
  absl::StrAppendFormat(
      &out,
      "\nclust: runs whose history was clustered into episodes; rt-win: the query was routed to "
      "an episode whose windows include a sentence of the restarted story (episodes replayed "
      "outside the engine; mism: runs where the replay routed differently from the engine); "
      "routed: the query went to the "
      "episode keeping the largest share of the restarted story; fallb: routed by the "
      "fallback (no embedding answer); share/best: that share in the routed / the best "
      "episode; over: episodes keeping more than C history slots in some (layer, head); "
      "embedms/buildms: embedding + k-means / block-wise build of all episodes, ms per turn; "
      "fullpfms: one-shot FullKV prefill of the same prompt (median of 3); (e+b)/f and pf/f: "
      "embed+build and EpiCache's whole prefill against it; peakbK: device KV KiB while "
      "building, fullK: KV KiB of the one-shot prefill, pk/f their ratio; overlap: mean "
      "Jaccard similarity of the (layer, head, position) history slots two episodes keep (1: "
      "all episodes kept the same tokens).\n");
  return out;
}

nlohmann::json Report::Json() const {
  nlohmann::json results = nlohmann::json::array();
  const auto entry = [&](const std::string& label, int budget, const Agg& a, bool episodic) {
    const Means m = MeansOf(a);
    nlohmann::json j = {
        {"method", label},
        {"budget_tokens", budget > 0 ? nlohmann::json(budget) : nlohmann::json()},
        {"runs", a.runs},
        {"tokens_to_divergence_mean", Num(m.prefix)},
        {"tokens_to_divergence_cap", settings_.max_new},
        {"runs_never_diverged", a.never_diverged},
        {"match_rate_first", match_tokens_},
        {"match_rate", Num(m.match)},
        {"teacher_forced_kl_mean", Num(m.kl)},
        {"teacher_forced_top1", Num(m.top1)},
        {"teacher_forced_positions", a.positions},
        {"p_name_mean", Num(m.p_name)},
        {"name_occurrences", a.n_name},
        {"p_companion_mean", Num(m.p_comp)},
        {"companion_occurrences", a.n_comp},
        {"p_name_own_story_mean", Num(m.p_own_name)},
        {"name_occurrences_own_story", a.n_own_name},
        {"p_companion_own_story_mean", Num(m.p_own_comp)},
        {"companion_occurrences_own_story", a.n_own_comp},
        {"continuations_naming_main", Num(m.has_name)},
        {"continuations_naming_companion", Num(m.has_comp)},
        {"continuations_naming_other_story", Num(m.wrong)},
        {"target_share_of_kept_story_slots", Num(m.target_share)},
        {"prefill_seconds_mean", Num(m.prefill_ms / 1e3)},
        {"peak_device_kv_bytes_mean", Num(m.peak)},
        {"final_device_kv_bytes_mean", Num(m.final_bytes)},
        {"teacher_forced_final_device_kv_bytes_mean", Num(m.tf_final)},
        {"final_total_kv_bytes_mean", Num(m.total)},
    };
    nlohmann::json by_target = nlohmann::json::array();
    for (size_t t = 0; t < a.prefix_by_target.size(); ++t) {
      by_target.push_back(Num(Div(a.prefix_by_target[t], a.runs_by_target[t])));
    }
    j["tokens_to_divergence_by_target_story"] = by_target;
    if (episodic) {
      j["episodic"] = {
          {"runs_clustered", a.clustered},
          {"routed_to_episode_with_target_window", Num(m.routed_target_window)},
          {"replica_routing_mismatches", a.replica_mismatch},
          {"episode_overlap_jaccard_mean", Num(m.overlap)},
          {"routed_to_best_episode", Num(m.routed_best)},
          {"routed_by_fallback", a.fallback},
          {"target_share_routed_episode", Num(m.active_share)},
          {"target_share_best_episode", Num(m.best_share)},
          {"episodes_over_budget", a.over_budget},
          {"episodes", a.episodes},
          {"max_history_slots_any_head", a.max_history_slots},
          {"embed_seconds_mean", Num(m.embed_ms / 1e3)},
          {"build_seconds_mean", Num(m.build_ms / 1e3)},
          {"full_prefill_seconds_mean", Num(m.ref_prefill_ms / 1e3)},
          {"embed_build_over_full_prefill", Num((m.embed_ms + m.build_ms) / m.ref_prefill_ms)},
          {"prefill_over_full_prefill", Num(m.prefill_ms / m.ref_prefill_ms)},
          {"build_peak_kv_bytes_mean", Num(m.build_peak)},
          {"full_prefill_kv_bytes_mean", Num(m.ref_prefill_bytes)},
          {"build_peak_over_full_prefill_kv", Num(m.build_peak / m.ref_prefill_bytes)},
      };
    }
    results.push_back(j);
  };
  entry("full", 0, full_, false);
  for (int b : budgets_) {
    for (size_t i = 0; i < labels_.size(); ++i) {
      auto it = aggs_.find({labels_[i], b});
      if (it != aggs_.end()) entry(labels_[i], b, it->second, episodic_[i]);
    }
  }
  nlohmann::json j;
  j["settings"] = {{"budgets", budgets_},
                   {"budget_unit", "tokens per (layer, KV head) on the device, per sequence"},
                   {"methods", labels_},
                   {"window", settings_.window},
                   {"alpha", settings_.alpha},
                   {"sinks", settings_.sinks},
                   {"episodes", settings_.episodes},
                   {"block_tokens", settings_.block_tokens},
                   {"recent_utterances", recent_},
                   {"max_new_tokens", settings_.max_new},
                   {"match_tokens", match_tokens_},
                   {"episodic_decode_policy", "lazy"}};
  j["results"] = results;
  j["full_continuation_tokens_mean"] = Num(Div(ref_tokens_sum_, conversations_n_));
  j["full_continuations_stopped_early"] = ref_stopped_;
  j["conversations"] = conversations_;
  return j;
}

absl::Status Report::WritePlot(const std::string& png_path, const std::string& title) const {
  RECALL_RETURN_IF_ERROR(RequireGnuplot());
  std::vector<std::string> names = {"full"};
  names.insert(names.end(), labels_.begin(), labels_.end());
  const std::string dat = png_path + ".dat", gp = png_path + ".gp";
  {
    std::ofstream f(dat);
    if (!f) return absl::PermissionDeniedError(absl::StrCat(dat, ": cannot open for writing"));
    const auto v = [](double x) { return std::isfinite(x) ? absl::StrCat(x) : std::string("NaN"); };
    for (const std::string& name : names) {
      f << "# " << name
        << ": budget diverge match% p_name p_comp wrong% kl top1% p_own_name "
           "p_own_comp\n";
      for (int b : budgets_) {
        const Agg* a = &full_;
        if (name != "full") {
          auto it = aggs_.find({name, b});
          if (it == aggs_.end()) continue;
          a = &it->second;
        }
        const Means m = MeansOf(*a);
        f << b << " " << v(m.prefix) << " " << v(100 * m.match) << " " << v(m.p_name) << " "
          << v(m.p_comp) << " " << v(100 * m.wrong) << " " << v(m.kl) << " " << v(100 * m.top1)
          << " " << v(m.p_own_name) << " " << v(m.p_own_comp) << "\n";
      }
      f << "\n\n";
    }
  }
  {
    std::ofstream f(gp);
    if (!f) return absl::PermissionDeniedError(absl::StrCat(gp, ": cannot open for writing"));
    const size_t last = names.size() - 1;
    // One legend for all panels, in a row below them (drawn with the first panel).
    bool first = true;
    const auto plot = [&](int column, const std::string& ylabel) {
      f << "set ylabel '" << ylabel << "'\n";
      // (gnuplot keeps a key within one panel's width, so the legend is a row of labels.)
      if (first) {
        f << "unset key\n"
          << "step = 0.92 / " << names.size() << "\n"
          << "do for [i=0:" << last << "] { set label (i+1) word(names, i+1) at screen "
          << "0.04 + i*step, 0.03 point lt i+1 pt i+4 ps 1.5 offset 1.5,0 }\n";
      }
      f << "plot for [i=0:" << last << "] '" << dat << "' index i using 1:" << column
        << " with linespoints lw 2 pt i+4 title word(names, i+1)\n";
      if (first) f << "unset label\n";
      first = false;
    };
    f << "set terminal pngcairo size 1500,1000 font 'Sans,10'\n"
      << "set output '" << png_path << "'\n"
      << "names = \"" << absl::StrJoin(names, " ") << "\"\n"
      << "set multiplot layout 2,3 title \"" << title
      << "\" margins 0.06,0.98,0.12,0.93 spacing 0.07,0.1\n"
      << "set grid\nset xlabel 'KV budget C (tokens per layer and KV head)'\n"
      << "set xtics (" << absl::StrJoin(budgets_, ",") << ")\n"
      << "set xrange [" << budgets_.front() - 8 << ":" << budgets_.back() + 8 << "]\n";
    plot(2, absl::StrCat("greedy tokens equal to FullKV before divergence (of ", settings_.max_new,
                         ")"));
    plot(3, absl::StrCat("positional match with FullKV, first ", match_tokens_, " tokens (%)"));
    plot(8, "teacher-forced top-1 agreement (%)");
    plot(9, "p(main character name) along the story text");
    plot(10, "p(companion name) along the story text");
    plot(6, "continuations naming a character of another story (%)");
    f << "unset multiplot\n";
  }
  return RunGnuplot(gp);
}

}  // namespace recall::bench
