// Device buffers for the GPU benchmarks (bench/gpu/*_bench.cc): allocated, filled from the
// host and read back through a backend's memory; a benchmark that cannot allocate says how
// much and exits 1 (it measures nothing without its buffers).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "kernels/backend.h"

namespace recall::bench {

inline kernels::Buffer AllocateOrExit(kernels::Backend& backend, size_t bytes) {
  auto b = kernels::Buffer::Allocate(backend.memory(), bytes);
  if (!b.ok()) {
    std::fprintf(stderr, "allocate %zu bytes: %s\n", bytes, b.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(b);
}

// A host buffer's copy in the backend's memory.
inline kernels::Buffer UploadOrExit(kernels::Backend& backend, const void* host, size_t bytes) {
  kernels::Buffer b = AllocateOrExit(backend, bytes);
  backend.memory().CopyIn(b.get(), host, bytes);
  return b;
}

// The first `count` floats of a device buffer.
inline std::vector<float> DownloadFloats(kernels::Backend& backend, const kernels::Buffer& b,
                                         size_t count) {
  std::vector<float> out(count);
  backend.memory().CopyOut(out.data(), b.get(), count * sizeof(float));
  return out;
}

}  // namespace recall::bench
