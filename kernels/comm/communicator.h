// Communicator: the collectives of one tensor-parallel group (EVICTION.md section 5,
// ARCHITECTURE.md "Tensor parallel").
//
// Contract:
// - SPMD: every rank of the group calls the same collectives in the same order with the same
//   count, dtype and root. An implementation that can see a mismatch (the in-process one)
//   returns Internal on every rank, naming the calls, instead of pairing unrelated calls.
// - Results are bitwise identical on every rank (AllReduce reduces in rank order), so ranks
//   that feed the result to the same deterministic code take the same decisions.
// - Blocking: a call returns when this rank's result is complete and its buffers may be
//   reused. Buffers are host memory for the in-process implementation and device memory for
//   NCCL.
// - Threads: one thread per rank; a Communicator object is used by its rank's thread only.
// - A failed group (a rank timed out, a mismatch) stays failed: every later call returns an
//   error at once, so no rank hangs on a peer that has given up.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace recall::kernels {

class Memory;  // kernels/memory.h

enum class CommDType : uint8_t { kF32 = 0, kF64 = 1, kI32 = 2, kI64 = 3, kU64 = 4 };
enum class ReduceOp : uint8_t { kSum = 0, kMax = 1, kMin = 2 };

size_t CommDTypeSize(CommDType t);
const char* CommDTypeName(CommDType t);
const char* ReduceOpName(ReduceOp op);

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual const char* Name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place: data[i] = op over the ranks r = 0, 1, ... of rank r's data[i].
  // data: [count].
  virtual absl::Status AllReduce(void* data, int64_t count, CommDType dtype, ReduceOp op) = 0;

  // recv[r * count + i] = rank r's send[i].  send: [count]; recv: [size() * count] (must not
  // overlap send).
  virtual absl::Status AllGather(const void* send, void* recv, int64_t count,
                                 CommDType dtype) = 0;

  // data = rank `root`'s data on every rank.  data: [count].
  virtual absl::Status Broadcast(void* data, int64_t count, CommDType dtype, int root) = 0;

  // Returns when every rank has called Barrier.
  virtual absl::Status Barrier() = 0;

  // Typed conveniences.
  absl::Status AllReduce(float* d, int64_t n, ReduceOp op) {
    return AllReduce(d, n, CommDType::kF32, op);
  }
  absl::Status AllReduce(double* d, int64_t n, ReduceOp op) {
    return AllReduce(d, n, CommDType::kF64, op);
  }
  absl::Status AllReduce(int32_t* d, int64_t n, ReduceOp op) {
    return AllReduce(d, n, CommDType::kI32, op);
  }
  absl::Status AllReduce(int64_t* d, int64_t n, ReduceOp op) {
    return AllReduce(d, n, CommDType::kI64, op);
  }
};

struct InProcessGroupOptions {
  // A rank that waits longer than this for its peers fails the whole group
  // (DeadlineExceeded, naming the ranks that had not arrived).
  absl::Duration timeout = absl::Seconds(120);
};

// `n` communicators, rank 0..n-1, for CPU ranks that are threads of one process. They share
// memory through a group object they keep alive together. InvalidArgument unless n >= 1.
absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateInProcessGroup(
    int n, const InProcessGroupOptions& options = {});

// `memories.size()` communicators for ranks whose buffers live in backend memory the host
// cannot read (a GPU's device memory), joined through the host: each call copies the rank's
// buffer out to a host staging buffer, runs the in-process collective on it and copies the
// result back. Memory::CopyOut synchronizes the backend's stream, so the collective sees every
// op queued before it, and ops queued after it see the result. For memory the host can read
// (the CPU backend) the calls go straight to the in-process group. This is how several ranks
// share one GPU (NCCL refuses two ranks on one device): correct, at the cost of two copies and
// a stream synchronization per call. memories[r] must outlive the communicators.
absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateStagedGroup(
    const std::vector<Memory*>& memories, const InProcessGroupOptions& options = {});

// One NCCL communicator per CUDA device in `devices` (ncclCommInitAll: one process, one
// thread per device; the devices must be distinct). Each rank's collectives are queued on
// streams[r] (a cudaStream_t of devices[r], borrowed) when given, so they are ordered after
// the ops already queued there, e.g. the rank's backend stream; otherwise on a stream of
// their own. Either way a call synchronizes that stream before returning. Unimplemented when
// the build has no NCCL; InvalidArgument for repeated devices or a streams list of the wrong
// length; the CUDA error otherwise (no device, bad ordinal). Buffers are device memory.
absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateNcclGroup(
    const std::vector<int>& devices, const std::vector<void*>& streams = {});

}  // namespace recall::kernels
