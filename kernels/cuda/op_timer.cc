#include "kernels/cuda/op_timer.h"

#include <algorithm>
#include <cstdio>

namespace recall::kernels::cuda {

OpTimer::~OpTimer() {
  for (const Pending& p : pending_) {
    cudaEventDestroy(p.start);
    cudaEventDestroy(p.end);
  }
  for (cudaEvent_t e : free_) cudaEventDestroy(e);
}

cudaEvent_t OpTimer::Take() {
  if (!free_.empty()) {
    cudaEvent_t e = free_.back();
    free_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  if (cudaEventCreate(&e) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return e;
}

void OpTimer::Begin(cudaStream_t stream) {
  if (depth_++ > 0) return;
  start_ = Take();
  if (start_ != nullptr) cudaEventRecord(start_, stream);
}

void OpTimer::End(const std::string& key, cudaStream_t stream) {
  if (--depth_ > 0) return;
  cudaEvent_t end = Take();
  if (start_ == nullptr || end == nullptr) {
    if (start_ != nullptr) free_.push_back(start_);
    if (end != nullptr) free_.push_back(end);
    return;
  }
  cudaEventRecord(end, stream);
  pending_.push_back({key, start_, end});
  start_ = nullptr;
  if (pending_.size() >= 8192) Collect();  // bounds the events in flight
}

void OpTimer::Collect() {
  for (const Pending& p : pending_) {
    float ms = 0;
    if (cudaEventSynchronize(p.end) == cudaSuccess &&
        cudaEventElapsedTime(&ms, p.start, p.end) == cudaSuccess) {
      Total& t = totals_[p.key];
      t.ms += ms;
      ++t.calls;
    } else {
      cudaGetLastError();
    }
    free_.push_back(p.start);
    free_.push_back(p.end);
  }
  pending_.clear();
}

std::string OpTimer::Report(bool reset) {
  Collect();
  std::vector<std::pair<std::string, Total>> rows(totals_.begin(), totals_.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  double sum = 0;
  for (const auto& r : rows) sum += r.second.ms;
  std::string out;
  char line[256];
  std::snprintf(line, sizeof(line), "  %-40s %9s %11s %10s %7s\n", "op", "calls", "total ms",
                "mean us", "share");
  out += line;
  for (const auto& [key, t] : rows) {
    std::snprintf(line, sizeof(line), "  %-40s %9ld %11.3f %10.2f %6.1f%%\n", key.c_str(),
                  t.calls, t.ms, 1e3 * t.ms / std::max(1L, t.calls),
                  sum > 0 ? 100.0 * t.ms / sum : 0.0);
    out += line;
  }
  std::snprintf(line, sizeof(line), "  %-40s %9s %11.3f\n", "all ops (GPU time)", "", sum);
  out += line;
  if (reset) totals_.clear();
  return out;
}

}  // namespace recall::kernels::cuda
