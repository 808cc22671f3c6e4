#include "kernels/cpu/pick_check.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cpu/sampling.h"

namespace recall::kernels {
namespace {

constexpr int kCols = 4099;  // not a multiple of any block size

// Probabilities 0.4, 0.3, 0.15, 0.1, 0.05 on five tokens spread over the row (every other
// token about 1e-9 of them). Cumulative in order of likelihood (top-k, top-p): 17: 0.4,
// 1000: 0.7, 2500: 0.85, 4098: 0.95, 3001: 1; in id order (neither): 17: 0.4, 1000: 0.7,
// 2500: 0.85, 3001: 0.9, 4098: 1.
constexpr int kTokens[5] = {17, 1000, 2500, 4098, 3001};
constexpr float kProbs[5] = {0.4f, 0.3f, 0.15f, 0.1f, 0.05f};

struct CheckRow {
  float temperature;
  int top_k;
  float top_p;
  float draw;
  bool ties;  // the row's maximum twice (greedy picks the lower id)
};

// Every draw is at least 0.025 (in probability) from a boundary of its row's intervals.
constexpr CheckRow kRows[] = {
    {0.0f, 0, 1.0f, 0.0f, true},    // greedy over equal maxima: id 700
    {0.0f, 0, 1.0f, 0.0f, false},   // greedy: 17
    {1.0f, 0, 1.0f, 0.2f, false},   // 17
    {1.0f, 0, 1.0f, 0.55f, false},  // 1000
    {1.0f, 0, 1.0f, 0.8f, false},   // 2500
    {1.0f, 0, 1.0f, 0.875f, false},  // 3001 (id order)
    {1.0f, 0, 1.0f, 0.96f, false},  // 4098
    {1.0f, 2, 1.0f, 0.5f, false},   // top 2 (0.4, 0.3): r = 0.35 -> 17
    {1.0f, 2, 1.0f, 0.7f, false},   // r = 0.49 -> 1000
    {1.0f, 0, 0.8f, 0.9f, false},   // nucleus 0.85: r = 0.765 -> 2500
    {1.0f, 3, 0.5f, 0.75f, false},  // top 3, nucleus (0.4, 0.3): r = 0.525 -> 1000
    {0.5f, 0, 1.0f, 0.3f, false},   // p^2: 0.561, 0.316, ...: 17
    {0.5f, 0, 1.0f, 0.7f, false},   // 1000
};

}  // namespace

absl::Status CheckPicks(Backend& backend) {
  const int rows = static_cast<int>(std::size(kRows));
  std::vector<float> x(static_cast<size_t>(rows) * kCols);
  std::vector<SamplingParams> params(rows);
  std::vector<float> draws(rows);
  for (int r = 0; r < rows; ++r) {
    float* row = x.data() + static_cast<size_t>(r) * kCols;
    for (int j = 0; j < kCols; ++j) row[j] = std::log(0.4f) - 20.0f;
    for (int t = 0; t < 5; ++t) row[kTokens[t]] = std::log(kProbs[t]);
    if (kRows[r].ties) row[700] = row[3500] = 3.0f;
    params[r].temperature = kRows[r].temperature;
    params[r].top_k = kRows[r].top_k;
    params[r].top_p = kRows[r].top_p;
    draws[r] = kRows[r].draw;
  }
  std::vector<int32_t> want(rows);
  cpu::Sampler sampler;
  for (int r = 0; r < rows; ++r) {
    std::vector<float> row(x.begin() + static_cast<size_t>(r) * kCols,
                           x.begin() + static_cast<size_t>(r + 1) * kCols);
    want[r] = sampler.Pick(row.data(), kCols, params[r], draws[r]);
  }

  Memory& memory = backend.memory();
  RECALL_ASSIGN_OR_RETURN(Buffer d_x, Buffer::Allocate(memory, x.size() * sizeof(float)));
  RECALL_ASSIGN_OR_RETURN(Buffer d_out, Buffer::Allocate(memory, 2 * rows * sizeof(int32_t)));
  memory.CopyIn(d_x.get(), x.data(), x.size() * sizeof(float));
  backend.SampleRows(d_x.as<float>(), rows, kCols, params.data(), draws.data(),
                     d_out.as<int32_t>());
  backend.ArgmaxRows(d_x.as<float>(), 2, kCols, d_out.as<int32_t>() + rows);
  std::vector<int32_t> got(2 * static_cast<size_t>(rows));
  memory.CopyOut(got.data(), d_out.get(), got.size() * sizeof(int32_t));
  RECALL_RETURN_IF_ERROR(backend.Health());
  for (int r = 0; r < rows + 2; ++r) {
    const int32_t expected = want[r < rows ? r : r - rows];
    if (got[r] != expected) {
      const int row = r < rows ? r : r - rows;
      return absl::InternalError(absl::StrCat(
          backend.Name(), " backend: ", r < rows ? "SampleRows" : "ArgmaxRows", " picked ",
          got[r], " where the host reference picks ", expected, " (check row ", row,
          ": temperature ", kRows[row].temperature, ", top_k ", kRows[row].top_k, ", top_p ",
          kRows[row].top_p, ", draw ", kRows[row].draw, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace recall::kernels
