#include "bench/quality/equal_peak.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bench/quality/report.h"
#include "common/status.h"

namespace recall::bench {

std::vector<EqualPeakRow> EqualPeak(const std::vector<QualityConfig>& configs,
                                    const std::vector<QualityStats>& stats,
                                    const std::vector<double>& targets,
                                    const std::vector<QualityStats>* bytes_of,
                                    const std::string& suffix) {
  std::vector<EqualPeakRow> rows;
  for (size_t i = 0; i < configs.size(); ++i) {
    if (configs[i].policy == "full") continue;
    const std::string name = configs[i].policy + suffix;
    auto row = std::find_if(rows.begin(), rows.end(),
                            [&](const EqualPeakRow& r) { return r.policy == name; });
    if (row == rows.end()) {
      rows.push_back({name, true, {}, {}});
      row = rows.end() - 1;
    }
    const QualityStats& s = stats[i];
    if (s.evicted_slots > 0) row->never_evicts = false;
    const double full_bytes =
        bytes_of != nullptr ? (*bytes_of)[i].full_kv_bytes_sum : s.full_kv_bytes_sum;
    if (s.positions == 0 || full_bytes <= 0) continue;
    row->points.push_back({s.peak_kv_bytes_sum / full_bytes,
                           static_cast<double>(s.top1_agree) / static_cast<double>(s.positions),
                           s.kl_sum / static_cast<double>(s.positions)});
  }
  for (EqualPeakRow& row : rows) {
    std::stable_sort(row.points.begin(), row.points.end(),
                     [](const PeakPoint& a, const PeakPoint& b) { return a.peak < b.peak; });
    for (const double x : targets) {
      std::optional<PeakPoint> got;
      if (!row.never_evicts) {
        for (size_t k = 0; k < row.points.size() && !got; ++k) {
          const PeakPoint& a = row.points[k];
          if (a.peak == x) got = a;
          if (k + 1 < row.points.size()) {
            const PeakPoint& b = row.points[k + 1];
            if (a.peak < x && x < b.peak) {
              const double f = (x - a.peak) / (b.peak - a.peak);
              got = PeakPoint{x, a.top1 + f * (b.top1 - a.top1), a.kl + f * (b.kl - a.kl)};
            }
          }
        }
      }
      row.at.push_back(got);
    }
  }
  return rows;
}

std::vector<std::string> BestAtEachPeak(const std::vector<EqualPeakRow>& rows) {
  std::vector<std::string> best;
  const size_t n = rows.empty() ? 0 : rows[0].at.size();
  for (size_t k = 0; k < n; ++k) {
    const EqualPeakRow* top = nullptr;
    for (const EqualPeakRow& row : rows) {
      if (k >= row.at.size() || !row.at[k]) continue;
      const PeakPoint& p = *row.at[k];
      if (top == nullptr || p.top1 > top->at[k]->top1 ||
          (p.top1 == top->at[k]->top1 && p.kl < top->at[k]->kl)) {
        top = &row;
      }
    }
    best.push_back(top != nullptr ? top->policy : "");
  }
  return best;
}

void PrintEqualPeak(const std::string& label, const std::vector<EqualPeakRow>& rows,
                    const std::vector<double>& targets) {
  std::printf(
      "At equal peak KV memory, %s: top-1 agreement / mean KL (nats), interpolated "
      "over the budget sweep ('-': outside the peaks the sweep reached)\n",
      label.c_str());
  std::printf("%-12s", "peak held");
  for (const double x : targets) std::printf(" %17.0f%%", 100 * x);
  std::printf("\n");
  for (const EqualPeakRow& row : rows) {
    std::printf("%-12s", row.policy.c_str());
    if (row.never_evicts) {
      std::printf(" never evicts on these texts (holds everything: no equal-peak figure)\n");
      continue;
    }
    for (const std::optional<PeakPoint>& p : row.at) {
      if (p) {
        std::printf("  %6.2f%% / %7.4f", 100 * p->top1, p->kl);
      } else {
        std::printf(" %18s", "-");
      }
    }
    std::printf("\n");
  }
}

absl::Status WriteEqualPeakPlot(const std::string& png_path, const std::string& title,
                                const std::string& x_label, const std::vector<EqualPeakRow>& rows) {
  if (absl::Status s = RequireGnuplot(); !s.ok()) return s;
  std::vector<std::string> names;
  const std::string dat = png_path + ".dat", gp = png_path + ".gp";
  {
    std::ostringstream f;
    for (const EqualPeakRow& row : rows) {
      if (row.never_evicts || row.points.empty()) continue;
      std::string name = row.policy;
      std::replace(name.begin(), name.end(), ' ', '_');  // gnuplot's word() splits on spaces
      names.push_back(name);
      f << "# " << row.policy << ": peak% top1% kl\n";
      for (const PeakPoint& p : row.points) {
        f << 100 * p.peak << " " << 100 * p.top1 << " " << p.kl << "\n";
      }
      f << "\n\n";
    }
    RECALL_RETURN_IF_ERROR(WriteText(dat, f.str()));
  }
  if (names.empty()) return absl::FailedPreconditionError("no row has points to plot");
  {
    std::ostringstream f;
    f << "set terminal pngcairo size 1400,700 font 'Sans,11'\n"
      << "set output '" << png_path << "'\nset termoption noenhanced\n"
      << "names = \"" << absl::StrJoin(names, " ") << "\"\n"
      << "set multiplot layout 1,2 title \"" << title << "\"\n"
      << "set grid\nset key bottom right font ',9'\nset xlabel '" << x_label << "'\n"
      << "set xrange [0:60]\nset yrange [85:100]\n"
      << "set ylabel 'top-1 agreement with the f32 FullKV (%)'\n"
      << "plot for [i=0:" << names.size() - 1 << "] '" << dat
      << "' index i using 1:2 with linespoints lw 2 title word(names, i+1)\n"
      << "set logscale y\nset yrange [*:*]\nset key top right font ',9'\n"
      << "set ylabel 'mean KL(full || evicted), nats'\n"
      << "plot for [i=0:" << names.size() - 1 << "] '" << dat
      << "' index i using 1:3 with linespoints lw 2 title word(names, i+1)\n"
      << "unset multiplot\n";
    RECALL_RETURN_IF_ERROR(WriteText(gp, f.str()));
  }
  return RunGnuplot(gp);
}

nlohmann::json EqualPeakJson(const std::vector<EqualPeakRow>& rows,
                             const std::vector<double>& targets) {
  nlohmann::json out = nlohmann::json::object();
  for (const EqualPeakRow& row : rows) {
    nlohmann::json at = nlohmann::json::array();
    for (size_t k = 0; k < targets.size(); ++k) {
      const std::optional<PeakPoint>& p = row.at[k];
      at.push_back(p ? nlohmann::json{{"peak", targets[k]}, {"top1", p->top1}, {"kl", p->kl}}
                     : nlohmann::json{{"peak", targets[k]}, {"top1", nullptr}, {"kl", nullptr}});
    }
    nlohmann::json sweep = nlohmann::json::array();
    for (const PeakPoint& p : row.points) {
      sweep.push_back({{"peak", p.peak}, {"top1", p.top1}, {"kl", p.kl}});
    }
    out[row.policy] = {{"never_evicts", row.never_evicts}, {"at", at}, {"sweep", sweep}};
  }
  return out;
}

}  // namespace recall::bench
