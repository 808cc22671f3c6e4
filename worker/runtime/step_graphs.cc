#include "worker/runtime/step_graphs.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace recall::runtime {

StepGraphs::StepGraphs(kernels::Backend& backend, int capacity)
    : backend_(backend), capacity_(std::max(1, capacity)) {}

int StepGraphs::BucketLength(int len) {
  if (len <= 0) return 0;
  const int quarter = static_cast<int>(std::bit_floor(static_cast<unsigned>(len))) / 4;
  const int step = std::max(64, quarter);
  return (len + step - 1) / step * step;
}

StepGraphs::Entry& StepGraphs::Find(const StepKey& key, bool* seen_before) {
  ++clock_;
  for (Entry& e : entries_) {
    if (e.key == key) {
      e.last_use = clock_;
      *seen_before = true;
      return e;
    }
  }
  *seen_before = false;
  if (static_cast<int>(entries_.size()) >= capacity_) {
    auto oldest =
        std::min_element(entries_.begin(), entries_.end(),
                         [](const Entry& a, const Entry& b) { return a.last_use < b.last_use; });
    entries_.erase(oldest);
  }
  entries_.push_back(Entry{key, nullptr, false, clock_});
  return entries_.back();
}

void StepGraphs::Disable(const absl::Status& why) {
  RECALL_LOG(WARNING) << "decode step graphs are off for this forward pass (" << backend_.Name()
                      << "): " << why << "; every step launches its ops directly";
  enabled_ = false;
  entries_.clear();
}

absl::Status StepGraphs::CheckFirst(kernels::OpGraph& graph, absl::FunctionRef<absl::Status()> ops,
                                    const void* out, size_t out_bytes) {
  checked_ = true;
  kernels::Memory& memory = backend_.memory();
  // The graph first, the ops last: whatever the graph wrote, the direct run's results stand.
  absl::Status replayed = graph.Replay();
  check_a_.resize(out_bytes);
  if (replayed.ok()) memory.CopyOut(check_a_.data(), out, out_bytes);
  const absl::Status direct = ops();
  if (!direct.ok()) return direct;
  check_b_.resize(out_bytes);
  memory.CopyOut(check_b_.data(), out, out_bytes);
  if (replayed.ok()) replayed = backend_.Health();
  if (replayed.ok() && std::memcmp(check_a_.data(), check_b_.data(), out_bytes) != 0) {
    replayed = absl::InternalError(
        absl::StrCat("the first recorded step differs from the same ops run directly (", out_bytes,
                     " bytes compared)"));
  }
  if (!replayed.ok()) Disable(replayed);
  return absl::OkStatus();
}

absl::Status StepGraphs::Run(const StepKey& key, absl::FunctionRef<absl::Status()> ops,
                             const void* out, size_t out_bytes) {
  if (!enabled_) return ops();
  bool seen_before = false;
  Entry& e = Find(key, &seen_before);
  if (!seen_before || e.unrecordable) return ops();
  if (e.graph == nullptr) {
    absl::Status inner = absl::OkStatus();
    absl::StatusOr<std::unique_ptr<kernels::OpGraph>> graph =
        backend_.Record([&] { inner = ops(); });
    if (graph.ok() && !inner.ok()) graph = inner;
    if (!graph.ok()) {
      Disable(graph.status());
      return ops();
    }
    if (*graph == nullptr) {
      e.unrecordable = true;
      return ops();
    }
    e.graph = *std::move(graph);
    ++recorded_;
    if (!checked_) return CheckFirst(*e.graph, ops, out, out_bytes);
  }
  const absl::Status st = e.graph->Replay();
  if (absl::IsFailedPrecondition(st)) {  // stale: recorded again at the key's next step
    e.graph.reset();
    return ops();
  }
  if (st.ok()) ++replays_;
  return st;
}

}  // namespace recall::runtime
