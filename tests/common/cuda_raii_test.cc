// CUDA RAII types: allocation, move semantics and error conversion. Skips without a GPU.
#include "common/cuda/cuda_raii.h"

#include <utility>

#include "gtest/gtest.h"

namespace recall::cuda {
namespace {

bool HaveGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

TEST(CudaStatus, ConvertsErrorsWithNameAndCall) {
  EXPECT_TRUE(CudaStatus(cudaSuccess, "x").ok());
  const absl::Status oom = CudaStatus(cudaErrorMemoryAllocation, "cudaMalloc(&p, 1)");
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(oom.message().find("cudaMalloc(&p, 1)"), std::string::npos);
  EXPECT_NE(oom.message().find("cudaErrorMemoryAllocation"), std::string::npos);
  EXPECT_EQ(CudaStatus(cudaErrorInvalidValue, "f").code(), absl::StatusCode::kInternal);
}

TEST(DeviceBuffer, AllocatesMovesAndCopiesRoundTrip) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  auto buffer = DeviceBuffer::Allocate(1024 * sizeof(float));
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  std::vector<float> host(1024), back(1024, 0.0f);
  for (int i = 0; i < 1024; ++i) host[i] = i * 0.5f;
  ASSERT_EQ(cudaMemcpy(buffer->get(), host.data(), 4096, cudaMemcpyHostToDevice), cudaSuccess);
  DeviceBuffer moved = std::move(*buffer);
  EXPECT_EQ(buffer->get(), nullptr);
  EXPECT_EQ(moved.bytes(), 4096u);
  ASSERT_EQ(cudaMemcpy(back.data(), moved.get(), 4096, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, host);
}

TEST(DeviceBuffer, ImpossibleAllocationIsAStatusNotACrash) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  auto huge = DeviceBuffer::Allocate(size_t{1} << 62);
  EXPECT_FALSE(huge.ok());
}

TEST(Stream, CreatesSynchronizesAndMoves) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  auto stream = Stream::Create();
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_NE(stream->get(), nullptr);
  Stream other = std::move(*stream);
  EXPECT_TRUE(other.Synchronize().ok());
  auto event = Event::Create();
  ASSERT_TRUE(event.ok());
  EXPECT_EQ(cudaEventRecord(event->get(), other.get()), cudaSuccess);
}

}  // namespace
}  // namespace recall::cuda
