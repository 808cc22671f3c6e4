// StepGraphs: a forward pass's decode steps as recorded graphs (Backend::Record; CUDA graphs on
// a GPU), replayed instead of launching every op of every layer again. A small model's decode
// step is hundreds of short kernels; one graph launch replaces them.
//
// A graph replays the arguments it was recorded with, so a step may reuse one only when
// everything baked into it is the same: the batch's item count, the pool and its layout, the metadata buffer (its
// contents are read anew: tokens, positions, lengths and block tables change every step), the
// probability pointers, and the longest cache length the attention grid covers. The forward
// pass rounds that length up to a bucket (BucketLength), so one graph serves many steps.
//
// A key's graph is recorded the second time the key is seen (a one-off batch shape costs no
// recording) and kept until the capacity is reached (then the least recently used goes). The
// first graph is checked: its result must equal, bit for bit, the same ops run directly; if
// not, or if recording fails, graphs are turned off for this pass with a warning and every
// step runs directly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "kernels/backend.h"

namespace recall::runtime {

struct StepKey {
  int n_items = 0;
  int max_kv_len = 0;           // as the attention grid covers it (bucketed)
  const void* meta = nullptr;   // the metadata the ops read (tokens first)
  const void* pool = nullptr;   // the KV block pool
  // The pool's layout: a freed pool's memory may come back as another pool's, typed otherwise.
  kernels::KvDType kv_dtype = kernels::KvDType::kF32;
  int block_tokens = 0;
  const void* probs = nullptr;  // KvBatch::probs (null: no item wants them)
  const void* probs_stride = nullptr;
  bool operator==(const StepKey&) const = default;
};

class StepGraphs {
 public:
  static constexpr int kDefaultCapacity = 32;
  explicit StepGraphs(kernels::Backend& backend, int capacity = kDefaultCapacity);

  // The cache length an attention grid covers for a longest head of `len` slots: `len` rounded
  // up to a multiple of max(64, the power of two at most len / 4), so at most a quarter
  // (or 63 slots) of the grid idles, with four buckets per doubling of the context.
  static int BucketLength(int len);

  // Runs one step's ops (`ops`: the same ops for every step of a key): replayed from the key's
  // graph, recorded, or run directly (see above). `out` [out_bytes] (backend memory) is the
  // ops' result that the check of the first graph compares.
  absl::Status Run(const StepKey& key, absl::FunctionRef<absl::Status()> ops, const void* out,
                   size_t out_bytes);

  bool enabled() const { return enabled_; }
  int64_t recorded() const { return recorded_; }  // graphs recorded so far
  int64_t replays() const { return replays_; }    // steps run by replaying a graph

 private:
  struct Entry {
    StepKey key;
    std::unique_ptr<kernels::OpGraph> graph;  // null until recorded (or when stale)
    bool unrecordable = false;                // Record returned null: always run directly
    int64_t last_use = 0;
  };
  Entry& Find(const StepKey& key, bool* seen_before);
  // Replays `graph`, then runs `ops` directly, and compares their `out`.
  absl::Status CheckFirst(kernels::OpGraph& graph, absl::FunctionRef<absl::Status()> ops,
                          const void* out, size_t out_bytes);
  void Disable(const absl::Status& why);

  kernels::Backend& backend_;
  int capacity_;
  bool enabled_ = true;
  bool checked_ = false;
  std::vector<Entry> entries_;
  int64_t clock_ = 0, recorded_ = 0, replays_ = 0;
  std::vector<char> check_a_, check_b_;
};

}  // namespace recall::runtime
