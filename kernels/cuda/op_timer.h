// OpTimer: GPU time per op of a CUDA backend (CudaBackendOptions::time_ops), from a pair of
// CUDA events around each op on the backend's stream. For finding where a decode step's time
// goes: the report sets the ops' summed GPU time beside the wall time the caller measured, so
// what is left is launch and host overhead. Costs two event records per op while enabled.
#pragma once

#include <cuda_runtime_api.h>

#include <map>
#include <string>
#include <vector>

namespace recall::kernels::cuda {

class OpTimer {
 public:
  OpTimer() = default;
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;
  ~OpTimer();

  // Brackets one op queued on `stream`; nested Begin/End pairs count once (the outer one).
  void Begin(cudaStream_t stream);
  void End(const std::string& key, cudaStream_t stream);
  // Per key: calls, total and mean GPU time, share of the total, largest first. Waits for the
  // recorded events. `reset` clears the totals.
  std::string Report(bool reset);

 private:
  struct Pending {
    std::string key;
    cudaEvent_t start, end;
  };
  struct Total {
    double ms = 0;
    long calls = 0;
  };
  cudaEvent_t Take();
  void Collect();

  int depth_ = 0;
  cudaEvent_t start_ = nullptr;
  std::vector<cudaEvent_t> free_;
  std::vector<Pending> pending_;
  std::map<std::string, Total> totals_;
};

}  // namespace recall::kernels::cuda
