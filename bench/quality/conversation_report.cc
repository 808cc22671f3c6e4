#include "bench/quality/conversation_report.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bench/quality/report.h"
#include "common/status.h"

namespace recall::bench {
namespace {

double Div(double a, double b) { return b > 0 ? a / b : 0.0; }

}  // namespace

void PrintConvTable(const std::vector<ConvRow>& rows) {
  std::printf("%-16s %8s %6s %7s %7s %7s %7s %7s %6s\n", "method", "budget", "n", "acc", "acc_far",
              "full", "agree", "tok_agr", "kv");
  for (const ConvRow& r : rows) {
    const ConvStats& s = r.stats;
    std::printf("%-16s %8s %6lld %6.1f%% %6.1f%% %6.1f%% %6.1f%% %6.1f%% %5.1f%%\n",
                r.method.c_str(), r.budget.c_str(), static_cast<long long>(s.questions),
                100 * Div(s.correct, s.questions), 100 * Div(s.far_correct, s.far),
                100 * Div(s.full_correct, s.questions), 100 * Div(s.agree, s.questions),
                100 * Div(s.token_agree, s.answer_tokens),
                100 * Div(s.kv_fraction_sum, s.kv_samples));
  }
}

nlohmann::json ConvRowsJson(const std::vector<ConvRow>& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const ConvRow& r : rows) {
    const ConvStats& s = r.stats;
    out.push_back({{"method", r.method},
                   {"budget", r.budget},
                   {"budget_fraction_setting", r.fraction},
                   {"budget_fraction_mean", Div(s.budget_fraction_sum, s.conversations)},
                   {"conversations", s.conversations},
                   {"questions", s.questions},
                   {"accuracy", Div(s.correct, s.questions)},
                   {"far_questions", s.far},
                   {"far_accuracy", Div(s.far_correct, s.far)},
                   {"full_accuracy_same_questions", Div(s.full_correct, s.questions)},
                   {"full_far_accuracy_same_questions", Div(s.far_full_correct, s.far)},
                   {"agreement_with_full", Div(s.agree, s.questions)},
                   {"token_agreement_with_full", Div(s.token_agree, s.answer_tokens)},
                   {"kv_fraction_of_full", Div(s.kv_fraction_sum, s.kv_samples)}});
  }
  return out;
}

absl::Status WriteConvPlot(const std::string& png_path, const std::string& title,
                           const std::vector<ConvRow>& rows) {
  RECALL_RETURN_IF_ERROR(RequireGnuplot());
  std::vector<std::string> methods;
  double full_acc = -1;
  for (const ConvRow& r : rows) {
    if (r.method == "full") full_acc = Div(r.stats.correct, r.stats.questions);
    if (r.fraction <= 0) continue;
    if (std::find(methods.begin(), methods.end(), r.method) == methods.end()) {
      methods.push_back(r.method);
    }
  }
  if (methods.empty()) return absl::FailedPreconditionError("no budget fractions to plot");
  const std::string dat = png_path + ".dat", gp = png_path + ".gp";
  {
    std::ofstream f(dat);
    if (!f) return absl::PermissionDeniedError(absl::StrCat(dat, ": cannot open for writing"));
    for (const std::string& m : methods) {
      f << "# " << m << ": budget% accuracy% agreement%\n";
      for (const ConvRow& r : rows) {
        if (r.method != m || r.fraction <= 0) continue;
        f << 100 * r.fraction << " " << 100 * Div(r.stats.correct, r.stats.questions) << " "
          << 100 * Div(r.stats.agree, r.stats.questions) << "\n";
      }
      f << "\n\n";
    }
  }
  {
    std::ofstream f(gp);
    if (!f) return absl::PermissionDeniedError(absl::StrCat(gp, ": cannot open for writing"));
    const size_t last = methods.size() - 1;
    f << "set terminal pngcairo size 1400,600 font 'Sans,11' noenhanced\n"
      << "set output '" << png_path << "'\n"
      << "names = \"" << absl::StrJoin(methods, " ") << "\"\n"
      << "set multiplot layout 1,2 title \"" << title << "\"\n"
      << "set grid\nset key bottom right\nset yrange [0:100]\n"
      << "set xlabel 'KV budget (% of the conversation, per layer and KV head)'\n"
      << "set ylabel 'answer accuracy (%)'\n"
      << "plot for [i=0:" << last << "] '" << dat
      << "' index i using 1:2 with linespoints lw 2 title word(names, i+1)";
    if (full_acc >= 0) f << ", " << 100 * full_acc << " with lines dt 2 lc 'black' title 'FullKV'";
    f << "\nset ylabel 'answers identical to FullKV (%)'\n"
      << "plot for [i=0:" << last << "] '" << dat
      << "' index i using 1:3 with linespoints lw 2 title word(names, i+1)\n"
      << "unset multiplot\n";
  }
  return RunGnuplot(gp);
}

}  // namespace recall::bench
