// Tensor-parallel agreement for SessionEvictor (EVICTION.md section 5): the collectives that
// make every rank of a group keep the same tokens.
//
// - GatherCandidates: head-adaptive budgets across ranks. Each rank scored its own KV heads;
//   the candidate sets of all model-global KV heads are all-gathered so that every rank runs
//   the same exact global top-k (SelectHeadAdaptive) and then applies its own heads' part.
// - KeepDigest + VerifyKeepDigests: the debug check. Each rank hashes the decisions of a step;
//   the hashes are all-gathered and compared; a mismatch is Internal, naming the ranks.
//
// Every function here is a collective: all ranks must call it at the same point.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "cache/eviction/candidate_set.h"
#include "kernels/comm/communicator.h"

namespace recall::cache::eviction {

// Where this rank's KV heads sit among the model's.
struct TpHeads {
  int n_local = 0;      // KV heads on this rank
  int offset = 0;       // model-global index of local head 0
  int n_total = 0;      // KV heads of the model
  // Ranks holding the same KV heads (tp / n_total when tp > n_total, else 1). Replicas are
  // consecutive ranks; the first of them speaks for the heads.
  int replicas = 1;
};

// Scratch reused by GatherCandidates (no allocation once grown).
struct GatherScratch {
  std::vector<double> send, recv;
  std::vector<int64_t> sizes;
  std::vector<bool> seen;  // [n_total] a rank already spoke for this KV head
  CandidateSet replica;    // where a replicated head's second copy is decoded
};

// local[0..heads.n_local): this rank's candidate sets; on return (*global)[g] for every
// model-global KV head g (resized to heads.n_total) holds head g's set, identical on every
// rank.
absl::Status GatherCandidates(kernels::Communicator& comm, const TpHeads& heads,
                              const CandidateSet* local, GatherScratch* scratch,
                              std::vector<CandidateSet>* global);

// An order-dependent 64-bit hash (FNV-1a over 32-bit words).
class KeepDigest {
 public:
  void Add(int64_t v) {
    for (int i = 0; i < 2; ++i) {
      h_ ^= static_cast<uint32_t>(v >> (32 * i));
      h_ *= 1099511628211ull;
    }
  }
  void Add(const std::vector<int32_t>& keep) {
    Add(static_cast<int64_t>(keep.size()));
    for (int32_t s : keep) Add(s);
  }
  uint64_t value() const { return h_; }
  void Reset() { h_ = 14695981039346656037ull; }

 private:
  uint64_t h_ = 14695981039346656037ull;
};

// All-gathers (common, heads.offset, replica) of every rank. Internal, naming the step and
// the ranks, unless every rank's `common` is the same and ranks holding the same heads have
// the same `replica`.
absl::Status VerifyKeepDigests(kernels::Communicator& comm, const TpHeads& heads, int step,
                               uint64_t common, uint64_t replica);

}  // namespace recall::cache::eviction
