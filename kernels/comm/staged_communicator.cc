// The staged Communicator: ranks whose buffers are in backend memory (a GPU's) joined by the
// in-process group through host staging buffers (communicator.h, CreateStagedGroup).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/comm/communicator.h"
#include "kernels/memory.h"

namespace recall::kernels {
namespace {

class StagedCommunicator final : public Communicator {
 public:
  StagedCommunicator(std::unique_ptr<Communicator> host, Memory& memory)
      : host_(std::move(host)), memory_(memory), direct_(memory.host_accessible()) {}

  const char* Name() const override { return "staged"; }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }

  absl::Status AllReduce(void* data, int64_t count, CommDType dtype, ReduceOp op) override {
    if (direct_) return host_->AllReduce(data, count, dtype, op);
    const size_t bytes = Bytes(count, dtype);
    void* staged = Stage(send_, bytes);
    if (bytes > 0) memory_.CopyOut(staged, data, bytes);
    absl::Status st = host_->AllReduce(staged, count, dtype, op);
    if (st.ok() && bytes > 0) memory_.CopyIn(data, staged, bytes);
    return st;
  }

  absl::Status AllGather(const void* send, void* recv, int64_t count, CommDType dtype) override {
    if (direct_) return host_->AllGather(send, recv, count, dtype);
    const size_t bytes = Bytes(count, dtype);
    void* staged_send = Stage(send_, bytes);
    void* staged_recv = Stage(recv_, bytes * static_cast<size_t>(size()));
    if (bytes > 0) memory_.CopyOut(staged_send, send, bytes);
    absl::Status st = host_->AllGather(staged_send, staged_recv, count, dtype);
    if (st.ok() && bytes > 0) memory_.CopyIn(recv, staged_recv, bytes * size());
    return st;
  }

  absl::Status Broadcast(void* data, int64_t count, CommDType dtype, int root) override {
    if (direct_) return host_->Broadcast(data, count, dtype, root);
    const size_t bytes = Bytes(count, dtype);
    void* staged = Stage(send_, bytes);
    if (bytes > 0 && rank() == root) memory_.CopyOut(staged, data, bytes);
    absl::Status st = host_->Broadcast(staged, count, dtype, root);
    if (st.ok() && bytes > 0 && rank() != root) memory_.CopyIn(data, staged, bytes);
    return st;
  }

  absl::Status Barrier() override { return host_->Barrier(); }

 private:
  // A negative count is the in-process group's to refuse (with its message): stage nothing.
  static size_t Bytes(int64_t count, CommDType dtype) {
    return count > 0 ? static_cast<size_t>(count) * CommDTypeSize(dtype) : 0;
  }
  static void* Stage(std::vector<unsigned char>& buffer, size_t bytes) {
    if (buffer.size() < bytes) buffer.resize(bytes);
    return buffer.data();
  }

  std::unique_ptr<Communicator> host_;
  Memory& memory_;
  const bool direct_;
  std::vector<unsigned char> send_;  // grows to the largest call, then is reused
  std::vector<unsigned char> recv_;
};

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateStagedGroup(
    const std::vector<Memory*>& memories, const InProcessGroupOptions& options) {
  for (size_t r = 0; r < memories.size(); ++r) {
    if (memories[r] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("staged group: memories[", r, "] is null"));
    }
  }
  absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> host =
      CreateInProcessGroup(static_cast<int>(memories.size()), options);
  if (!host.ok()) return host.status();
  std::vector<std::unique_ptr<Communicator>> out;
  for (size_t r = 0; r < memories.size(); ++r) {
    out.push_back(std::make_unique<StagedCommunicator>(std::move((*host)[r]), *memories[r]));
  }
  return out;
}

}  // namespace recall::kernels
