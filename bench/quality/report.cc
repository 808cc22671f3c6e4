#include "bench/quality/report.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"

namespace recall::bench {
namespace {

double Div(double a, double b) { return b > 0 ? a / b : std::nan(""); }

struct Means {
  double kl, top1, ppl, ppl_full, greedy, greedy_cap, recall, recall_full, first_evict;
  double peak, final_bytes, full_bytes;
};

Means MeansOf(const QualityStats& s) {
  Means m;
  m.kl = Div(s.kl_sum, s.positions);
  m.top1 = Div(s.top1_agree, s.positions);
  m.ppl = std::exp(Div(s.nll_sum, s.positions));
  m.ppl_full = std::exp(Div(s.nll_full_sum, s.positions));
  m.greedy = Div(s.greedy_tokens_sum, s.greedy_runs);
  m.greedy_cap = Div(s.greedy_cap_sum, s.greedy_runs);
  m.recall = Div(s.recall_prob_sum, s.probes);
  m.recall_full = Div(s.recall_prob_full_sum, s.probes);
  m.first_evict = Div(s.first_eviction_pos_sum, s.runs_evicted);
  m.peak = Div(s.peak_kv_bytes_sum, s.texts);
  m.final_bytes = Div(s.final_kv_bytes_sum, s.texts);
  m.full_bytes = Div(s.full_kv_bytes_sum, s.texts);
  return m;
}

// JSON has no NaN: write null.
nlohmann::json Num(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); }

}  // namespace

nlohmann::json ResultsJson(const std::vector<QualityConfig>& configs,
                           const std::vector<QualityStats>& stats) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < configs.size(); ++i) {
    const QualityStats& s = stats[i];
    const Means m = MeansOf(s);
    out.push_back({
        {"policy", configs[i].policy},
        {"budget_fraction", configs[i].budget_fraction},
        {"budget_tokens", configs[i].budget_tokens},
        {"kl_mean", Num(m.kl)},
        {"top1_agreement", Num(m.top1)},
        {"positions_counted", s.positions},
        {"first_counted_position_mean", Num(m.first_evict)},
        {"perplexity", Num(m.ppl)},
        {"perplexity_full_same_positions", Num(m.ppl_full)},
        {"greedy_tokens_to_divergence_mean", Num(m.greedy)},
        {"greedy_cap", Num(m.greedy_cap)},
        {"greedy_runs", s.greedy_runs},
        {"greedy_runs_never_diverged", s.greedy_full_matches},
        {"recall_prob_mean", Num(m.recall)},
        {"recall_prob_full_mean", Num(m.recall_full)},
        {"recall_prob_ratio", Num(Div(m.recall, m.recall_full))},
        {"recall_probes", s.probes},
        {"peak_kv_bytes_mean", Num(m.peak)},
        {"peak_kv_bytes_max", s.peak_kv_bytes_max},
        {"final_kv_bytes_mean", Num(m.final_bytes)},
        {"full_kv_bytes_mean", Num(m.full_bytes)},
        {"peak_kv_fraction_of_full", Num(Div(m.peak, m.full_bytes))},
        {"final_kv_fraction_of_full", Num(Div(m.final_bytes, m.full_bytes))},
        {"evictions", s.evictions},
        {"evicted_slots", s.evicted_slots},
        {"texts", s.texts},
    });
  }
  return out;
}

void PrintTable(const std::vector<QualityConfig>& configs,
                const std::vector<QualityStats>& stats) {
  std::printf("%-10s %6s %4s %10s %7s %6s %7s %7s %9s %8s %8s %6s %6s\n", "policy", "budget",
              "C", "KL", "top1", "npos", "ppl", "ppl_f", "greedy", "recall", "rec_f", "peak",
              "final");
  for (size_t i = 0; i < configs.size(); ++i) {
    const Means m = MeansOf(stats[i]);
    std::printf("%-10s %5.0f%% %4d %10.3e %6.2f%% %6lld %7.3f %7.3f %4.1f/%-4.0f %8.4f %8.4f "
                "%5.0f%% %5.0f%%\n",
                configs[i].policy.c_str(), 100 * configs[i].budget_fraction,
                configs[i].budget_tokens, m.kl, 100 * m.top1,
                static_cast<long long>(stats[i].positions), m.ppl, m.ppl_full, m.greedy,
                m.greedy_cap, m.recall, m.recall_full, 100 * Div(m.peak, m.full_bytes),
                100 * Div(m.final_bytes, m.full_bytes));
  }
}

absl::Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  if (!f) {
    const int err = errno;
    return absl::Status(err == ENOENT || err == ENOTDIR ? absl::StatusCode::kNotFound
                                                        : absl::StatusCode::kPermissionDenied,
                        absl::StrCat(path, ": cannot open for writing: ", std::strerror(err)));
  }
  f << text;
  if (!f) return absl::DataLossError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

absl::Status WriteJson(const std::string& path, const nlohmann::json& json) {
  return WriteText(path, json.dump(2) + "\n");
}

absl::Status WritePlot(const std::string& png_path, const std::string& title,
                       const std::vector<QualityConfig>& configs,
                       const std::vector<QualityStats>& stats) {
  RECALL_RETURN_IF_ERROR(RequireGnuplot());
  // One data block per policy (gnuplot "index"), budgets ascending as given.
  std::vector<std::string> policies;
  for (const QualityConfig& c : configs) {
    if (std::find(policies.begin(), policies.end(), c.policy) == policies.end()) {
      policies.push_back(c.policy);
    }
  }
  const std::string dat = png_path + ".dat", gp = png_path + ".gp";
  {
    std::ostringstream f;
    for (const std::string& p : policies) {
      // x: the peak KV held (column 6), so policies are compared at equal memory.
      f << "# " << p << ": budget% top1% kl greedy recall_ratio peak_kv%\n";
      for (size_t i = 0; i < configs.size(); ++i) {
        if (configs[i].policy != p) continue;
        const Means m = MeansOf(stats[i]);
        auto v = [](double x) { return std::isfinite(x) ? absl::StrCat(x) : std::string("NaN"); };
        f << 100 * configs[i].budget_fraction << " " << v(100 * m.top1) << " "
          << v(m.kl > 0 ? m.kl : std::nan("")) << " "  // log axis: KL 0 not drawn
          << v(m.greedy) << " "
          << v(Div(m.recall, m.recall_full)) << " " << v(100 * Div(m.peak, m.full_bytes))
          << "\n";
      }
      f << "\n\n";
    }
    RECALL_RETURN_IF_ERROR(WriteText(dat, f.str()));
  }
  {
    std::ostringstream f;
    f << "set terminal pngcairo size 1400,1000 font 'Sans,11'\n"
      << "set output '" << png_path << "'\n"
      << "names = \"" << absl::StrJoin(policies, " ") << "\"\n"
      << "set multiplot layout 2,2 title \"" << title << "\"\n"
      << "set grid\nset key bottom right\nset xlabel 'peak KV held (% of FullKV)'\n"
      << "set ylabel 'top-1 agreement with FullKV (%)'\n"
      << "plot for [i=0:" << policies.size() - 1 << "] '" << dat
      << "' index i using 6:2 with linespoints lw 2 title word(names, i+1)\n"
      << "set logscale y\nset key top right\nset ylabel 'mean KL(full || evicted) (nats; FullKV = "
         "0 not drawn)'\n"
      << "plot for [i=0:" << policies.size() - 1 << "] '" << dat
      << "' index i using 6:3 with linespoints lw 2 title word(names, i+1)\n"
      << "unset logscale y\nset key top left\n"
      << "set ylabel 'greedy tokens until first divergence'\n"
      << "plot for [i=0:" << policies.size() - 1 << "] '" << dat
      << "' index i using 6:4 with linespoints lw 2 title word(names, i+1)\n"
      << "set key bottom right\nset ylabel 'recall probe: p(evicted) / p(full)'\n"
      << "plot for [i=0:" << policies.size() - 1 << "] '" << dat
      << "' index i using 6:5 with linespoints lw 2 title word(names, i+1)\n"
      << "unset multiplot\n";
    RECALL_RETURN_IF_ERROR(WriteText(gp, f.str()));
  }
  return RunGnuplot(gp);
}

absl::Status RequireGnuplot() {
  if (std::system("command -v gnuplot > /dev/null 2>&1") != 0) {
    return absl::FailedPreconditionError(
        "gnuplot not found (apt-get install gnuplot-nox): no PNG written");
  }
  return absl::OkStatus();
}

absl::Status RunGnuplot(const std::string& gp_path) {
  const std::string cmd = absl::StrCat("gnuplot '", gp_path, "'");
  if (std::system(cmd.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("'", cmd, "' failed: no PNG written"));
  }
  return absl::OkStatus();
}

int ReportPlot(const absl::Status& plotted, const std::string& png_path) {
  if (plotted.ok()) {
    std::printf("wrote %s\n", png_path.c_str());
    return 0;
  }
  if (plotted.code() == absl::StatusCode::kFailedPrecondition) {  // no gnuplot, nothing to plot
    std::printf("WARNING: %s\n", std::string(plotted.message()).c_str());
    return 0;
  }
  std::fprintf(stderr, "error: %s: %s\n", png_path.c_str(), std::string(plotted.message()).c_str());
  return 1;
}

bool ParseFlagPairs(
    int argc, char** argv,
    const std::function<std::optional<bool>(const std::string& name, const char* value)>& handle,
    const std::string& hint) {
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc) {
      std::fprintf(stderr, "flag %s needs a value\n", argv[i]);
      return false;
    }
    const std::optional<bool> ok = handle(argv[i], argv[i + 1]);
    if (!ok.has_value()) {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return false;
    }
    if (!*ok) {
      std::fprintf(stderr, "bad value for %s: '%s'%s\n", argv[i], argv[i + 1],
                   hint.empty() ? "" : (" (" + hint + ")").c_str());
      return false;
    }
  }
  return true;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
  return 1;
}

int CheckStories260K(const std::string& model, const std::string& tokenizer,
                     const std::string& shared_dir) {
  std::error_code ec;
  const bool have_model = std::filesystem::exists(model, ec);
  const bool have_tokenizer = std::filesystem::exists(tokenizer, ec);
  if (have_model && have_tokenizer) return -1;
  const std::string default_model = shared_dir + "/models/stories260K/stories260K.bin";
  const std::string default_tokenizer = shared_dir + "/models/stories260K/tok512.bin";
  // A path the user gave that is not there is an error, not a skip.
  auto given_but_missing = [&](const char* flag, const std::string& path, bool have,
                               const std::string& def) {
    if (have || path == def) return false;
    std::fprintf(stderr, "%s: %s: no such file\n", flag, path.c_str());
    return true;
  };
  if (given_but_missing("--model", model, have_model, default_model) ||
      given_but_missing("--tokenizer", tokenizer, have_tokenizer, default_tokenizer)) {
    return 2;
  }
  std::string missing;
  for (const std::string* p : {&model, &tokenizer}) {
    if (!std::filesystem::exists(*p, ec)) {
      missing += (missing.empty() ? "" : ", ") + *p;
    }
  }
  std::printf("SKIP: stories260K not found (missing: %s)%s\n", missing.c_str(),
              std::filesystem::is_directory(shared_dir, ec)
                  ? ""
                  : ("; " + shared_dir + " is not set up").c_str());
  return 0;
}

}  // namespace recall::bench
