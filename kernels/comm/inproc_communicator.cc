// The in-process Communicator: CPU ranks are threads of one process sharing memory.
//
// Every collective is two rendezvous of all ranks. At the first, each rank publishes its call
// (kind, dtype, op, count, root, buffers) and the last to arrive checks that the calls agree.
// Between the two, each rank reads its peers' buffers (AllReduce: rank r reduces the r-th
// chunk into a shared buffer, in rank order, so every rank gets the same bits); after the
// second, nobody reads any more and each rank may write its own buffer.
#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "kernels/comm/communicator.h"

namespace recall::kernels {

size_t CommDTypeSize(CommDType t) {
  switch (t) {
    case CommDType::kF32: return 4;
    case CommDType::kI32: return 4;
    case CommDType::kF64: return 8;
    case CommDType::kI64: return 8;
    case CommDType::kU64: return 8;
  }
  return 0;
}

const char* CommDTypeName(CommDType t) {
  switch (t) {
    case CommDType::kF32: return "f32";
    case CommDType::kF64: return "f64";
    case CommDType::kI32: return "i32";
    case CommDType::kI64: return "i64";
    case CommDType::kU64: return "u64";
  }
  return "?";
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

namespace {

enum class Kind : uint8_t { kAllReduce, kAllGather, kBroadcast, kBarrier };

struct Call {
  Kind kind = Kind::kBarrier;
  CommDType dtype = CommDType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int64_t count = 0;
  int root = 0;
  const void* send = nullptr;
  void* recv = nullptr;

  bool SameShape(const Call& o) const {
    return kind == o.kind && dtype == o.dtype && count == o.count &&
           (kind != Kind::kAllReduce || op == o.op) && (kind != Kind::kBroadcast || root == o.root);
  }
  std::string Describe() const {
    switch (kind) {
      case Kind::kAllReduce:
        return absl::StrCat("AllReduce(", count, " ", CommDTypeName(dtype), ", ",
                            ReduceOpName(op), ")");
      case Kind::kAllGather:
        return absl::StrCat("AllGather(", count, " ", CommDTypeName(dtype), ")");
      case Kind::kBroadcast:
        return absl::StrCat("Broadcast(", count, " ", CommDTypeName(dtype), ", root ", root, ")");
      case Kind::kBarrier: return "Barrier()";
    }
    return "?";
  }
};

// State shared by the ranks of one group.
class Group {
 public:
  Group(int n, const InProcessGroupOptions& options)
      : n_(n), options_(options), calls_(static_cast<size_t>(n)), arrived_(static_cast<size_t>(n)) {}

  int size() const { return n_; }

  // Rendezvous of all ranks. With `call`, publishes it first, and the last rank to arrive
  // checks that all calls agree and sizes the shared buffer for it.
  absl::Status Rendezvous(int rank, const Call* call) {
    absl::MutexLock lock(&mu_);
    if (!failed_.ok()) return failed_;
    if (call != nullptr) calls_[static_cast<size_t>(rank)] = *call;
    arrived_[static_cast<size_t>(rank)] = true;
    const uint64_t generation = generation_;
    if (++num_arrived_ == n_) {
      if (call != nullptr) CheckCallsLocked();
      num_arrived_ = 0;
      std::fill(arrived_.begin(), arrived_.end(), false);
      ++generation_;
      cv_.SignalAll();
      return failed_;
    }
    const absl::Time deadline = absl::Now() + options_.timeout;
    while (generation_ == generation && failed_.ok()) {
      if (cv_.WaitWithDeadline(&mu_, deadline) && generation_ == generation && failed_.ok()) {
        std::vector<int> missing;
        for (int r = 0; r < n_; ++r) {
          if (!arrived_[static_cast<size_t>(r)]) missing.push_back(r);
        }
        failed_ = absl::DeadlineExceededError(absl::StrCat(
            "tensor-parallel group: rank ", rank, " waited ",
            absl::FormatDuration(options_.timeout), " for rank(s) ", absl::StrJoin(missing, ", "),
            " to join the collective; the group is now failed"));
        cv_.SignalAll();
      }
    }
    return failed_;
  }

  const Call& call(int rank) const { return calls_[static_cast<size_t>(rank)]; }
  // Valid between the two rendezvous of an AllReduce.
  uint8_t* shared() { return shared_.data(); }

 private:
  void CheckCallsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (int r = 1; r < n_; ++r) {
      if (!calls_[static_cast<size_t>(r)].SameShape(calls_[0])) {
        std::vector<std::string> calls;
        for (int q = 0; q < n_; ++q) {
          calls.push_back(absl::StrCat("rank ", q, ": ", calls_[static_cast<size_t>(q)].Describe()));
        }
        failed_ = absl::InternalError(
            absl::StrCat("tensor-parallel group: ranks called different collectives (",
                         absl::StrJoin(calls, "; "), "); the group is now failed"));
        return;
      }
    }
    const Call& c = calls_[0];
    if (c.kind == Kind::kAllReduce) {
      const size_t bytes = static_cast<size_t>(c.count) * CommDTypeSize(c.dtype);
      if (shared_.size() < bytes) shared_.resize(bytes);
    }
  }

  const int n_;
  const InProcessGroupOptions options_;
  absl::Mutex mu_;
  absl::CondVar cv_;
  std::vector<Call> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> arrived_ ABSL_GUARDED_BY(mu_);
  int num_arrived_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
  // Written only between the rendezvous of an AllReduce (each rank its own chunk), resized
  // only by the last rank to arrive at the first one.
  std::vector<uint8_t> shared_;
};

template <typename T>
void ReduceChunk(const Group& g, int64_t begin, int64_t end, ReduceOp op, T* out) {
  const T* first = static_cast<const T*>(g.call(0).send);
  for (int64_t i = begin; i < end; ++i) out[i] = first[i];
  for (int r = 1; r < g.size(); ++r) {
    const T* in = static_cast<const T*>(g.call(r).send);
    switch (op) {
      case ReduceOp::kSum:
        for (int64_t i = begin; i < end; ++i) out[i] += in[i];
        break;
      case ReduceOp::kMax:
        for (int64_t i = begin; i < end; ++i) out[i] = std::max(out[i], in[i]);
        break;
      case ReduceOp::kMin:
        for (int64_t i = begin; i < end; ++i) out[i] = std::min(out[i], in[i]);
        break;
    }
  }
}

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<Group> group, int rank)
      : group_(std::move(group)), rank_(rank) {}

  const char* Name() const override { return "in-process"; }
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }

  absl::Status AllReduce(void* data, int64_t count, CommDType dtype, ReduceOp op) override {
    Call call{Kind::kAllReduce, dtype, op, count, 0, data, data};
    absl::Status st = group_->Rendezvous(rank_, &call);
    if (!st.ok()) return st;
    const int n = size();
    const int64_t begin = count * rank_ / n, end = count * (rank_ + 1) / n;
    uint8_t* shared = group_->shared();
    switch (dtype) {
      case CommDType::kF32: ReduceChunk(*group_, begin, end, op, reinterpret_cast<float*>(shared)); break;
      case CommDType::kF64: ReduceChunk(*group_, begin, end, op, reinterpret_cast<double*>(shared)); break;
      case CommDType::kI32: ReduceChunk(*group_, begin, end, op, reinterpret_cast<int32_t*>(shared)); break;
      case CommDType::kI64: ReduceChunk(*group_, begin, end, op, reinterpret_cast<int64_t*>(shared)); break;
      case CommDType::kU64: ReduceChunk(*group_, begin, end, op, reinterpret_cast<uint64_t*>(shared)); break;
    }
    st = group_->Rendezvous(rank_, nullptr);
    if (!st.ok()) return st;
    if (count > 0) std::memcpy(data, shared, static_cast<size_t>(count) * CommDTypeSize(dtype));
    return absl::OkStatus();
  }

  absl::Status AllGather(const void* send, void* recv, int64_t count, CommDType dtype) override {
    Call call{Kind::kAllGather, dtype, ReduceOp::kSum, count, 0, send, recv};
    absl::Status st = group_->Rendezvous(rank_, &call);
    if (!st.ok()) return st;
    const size_t bytes = static_cast<size_t>(count) * CommDTypeSize(dtype);
    for (int r = 0; r < size() && bytes > 0; ++r) {
      std::memcpy(static_cast<uint8_t*>(recv) + bytes * r, group_->call(r).send, bytes);
    }
    return group_->Rendezvous(rank_, nullptr);
  }

  absl::Status Broadcast(void* data, int64_t count, CommDType dtype, int root) override {
    if (root < 0 || root >= size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Broadcast: root ", root, " outside [0, ", size(), ")"));
    }
    Call call{Kind::kBroadcast, dtype, ReduceOp::kSum, count, root, data, data};
    absl::Status st = group_->Rendezvous(rank_, &call);
    if (!st.ok()) return st;
    if (rank_ != root && count > 0) {
      std::memcpy(data, group_->call(root).send, static_cast<size_t>(count) * CommDTypeSize(dtype));
    }
    return group_->Rendezvous(rank_, nullptr);
  }

  absl::Status Barrier() override {
    Call call;
    return group_->Rendezvous(rank_, &call);
  }

 private:
  std::shared_ptr<Group> group_;
  const int rank_;
};

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateInProcessGroup(
    int n, const InProcessGroupOptions& options) {
  if (n < 1) {
    return absl::InvalidArgumentError(absl::StrCat("in-process group: size ", n, " must be >= 1"));
  }
  auto group = std::make_shared<Group>(n, options);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<InProcessCommunicator>(group, r));
  return out;
}

}  // namespace recall::kernels
