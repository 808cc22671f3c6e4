// SessionEvictor: the tensor-parallel and shared-token-set parts (EVICTION.md section 5).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cache/eviction/session_evictor.h"
#include "common/logging.h"
#include "common/status.h"

namespace recall::cache::eviction {

absl::Status SessionEvictor::AgreeOnStep() {
  common_digest_.Reset();
  replica_digest_.Reset();
  if (options_.comm == nullptr) return absl::OkStatus();
  const int32_t next = step_ + 1;
  int32_t decided = next;
  RECALL_RETURN_IF_ERROR(options_.comm->Broadcast(&decided, 1, kernels::CommDType::kI32, 0));
  if (decided != next) {
    return absl::InternalError(absl::StrCat("tensor-parallel eviction: rank ",
                                            options_.comm->rank(), " is at step ", next,
                                            " but rank 0 is at step ", decided));
  }
  return absl::OkStatus();
}

absl::Status SessionEvictor::ReduceShared(const float* probs, int64_t stride, int len) {
  reduced_.resize(static_cast<size_t>(stride));
  const int n_heads = options_.n_heads;
  kernels::Communicator* comm = options_.comm;
  if (policy_->layer_shared()) {
    // The mean over every query head of the layer, summed in double so that the order in
    // which ranks add their heads does not change the float result.
    sums_.resize(static_cast<size_t>(len));
    SumOverHeads(probs, n_heads, stride, len, sums_.data());
    int total_heads = n_heads;
    if (comm != nullptr) {
      RECALL_RETURN_IF_ERROR(comm->AllReduce(sums_.data(), len, kernels::ReduceOp::kSum));
      total_heads *= comm->size();
    }
    const double inv = 1.0 / total_heads;
    for (int j = 0; j < len; ++j) {
      reduced_[static_cast<size_t>(j)] = static_cast<float>(sums_[static_cast<size_t>(j)] * inv);
    }
    return absl::OkStatus();
  }
  // The max over every query head of the layer: one group holding all of them.
  const int32_t lengths[1] = {len};
  ReduceGqaMax(probs, n_heads, 1, stride, lengths, reduced_.data());
  if (comm != nullptr) {
    RECALL_RETURN_IF_ERROR(comm->AllReduce(reduced_.data(), len, kernels::ReduceOp::kMax));
  }
  return absl::OkStatus();
}

absl::Status SessionEvictor::SelectAdaptive(int layer, int budget) {
  const double safeguard = options_.budget.head_safeguard;
  const std::vector<std::vector<int32_t>>* decided = &head_keeps_;
  if (options_.comm == nullptr) {
    SelectHeadAdaptive(candidates_.data(), n_kv_heads_, budget, safeguard, &adaptive_,
                       &head_keeps_);
  } else {
    RECALL_RETURN_IF_ERROR(GatherCandidates(*options_.comm, tp_heads_, candidates_.data(),
                                            &gather_, &global_candidates_));
    SelectHeadAdaptive(global_candidates_.data(), tp_heads_.n_total, budget, safeguard,
                       &adaptive_, &global_keeps_);
    for (int h = 0; h < n_kv_heads_; ++h) {
      head_keeps_[static_cast<size_t>(h)] =
          global_keeps_[static_cast<size_t>(tp_heads_.offset + h)];
    }
    decided = &global_keeps_;
  }
  if (options_.verify_keep) {
    common_digest_.Add(layer);
    for (const std::vector<int32_t>& keep : *decided) common_digest_.Add(keep);
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> SessionEvictor::LayerLength(int64_t local) {
  if (options_.comm == nullptr) return local;
  int64_t total = options_.comm->rank() % tp_heads_.replicas == 0 ? local : 0;
  RECALL_RETURN_IF_ERROR(options_.comm->AllReduce(&total, 1, kernels::ReduceOp::kSum));
  return total;
}

absl::Status SessionEvictor::VerifyStep(int t) {
  absl::Status status = absl::OkStatus();
  if (options_.verify_keep && options_.comm != nullptr) {
    common_digest_.Add(t);
    for (int32_t b : budgets_) common_digest_.Add(b);
    status = VerifyKeepDigests(*options_.comm, tp_heads_, t, common_digest_.value(),
                               replica_digest_.value());
    if (!status.ok()) {
      RECALL_LOG(ERROR) << "rank " << options_.comm->rank() << ": " << status.message();
    }
  }
  common_digest_.Reset();
  replica_digest_.Reset();
  return status;
}

}  // namespace recall::cache::eviction
