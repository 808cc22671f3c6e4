// Decode's matmuls on a GPU (issue 31): our batch-invariant kernel at 1 to 4 rows on bf16,
// int8 and FP8 weights, under each count of chunks in flight
// (CudaBackendOptions::skinny_chunks_in_flight), in one run. Random weights of the linear shapes
// of Llama-3-8B and Qwen2.5-0.5B (FP8 with blocks of 128 columns); enough copies of each matrix
// are cycled through that they do not fit in L2, as a model's layers do not.
//
// Prints, per (shape, rows, type, chunks in flight): the time, the bytes read per second (the
// weights and their scales) and their fraction of the device-to-device copy bandwidth measured
// in the same run (read + write), and the ratio against bf16 with 1 chunk in flight (the named
// baseline: the kernel as it ran on the H200 on 2026-11-30). Every count's output is compared
// with 1's bit for bit; a difference is a failure (exit 1).
//
// Each case's matmuls run as one recorded CUDA graph, so launches do not set the time.
//
//   recall_gpu_matmul_bench [--rows 1,4] [--iters 50]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/gpu/device_buffers.h"
#include "common/flags.h"
#include "kernels/cuda_backend.h"
#include "worker/model/half.h"

namespace recall {
namespace {

using kernels::Backend;
using kernels::Buffer;
using kernels::DType;
using kernels::Matrix;

constexpr int kCounts[] = {1, 2, 4};           // chunks in flight measured
constexpr size_t kPastL2 = size_t{512} << 20;  // bytes cycled through per matrix, at least

struct Shape {
  const char* name;
  int64_t rows, cols;
};

// `copies` device copies of one matrix of `dtype`: random weights (bf16 from N(0, 0.02), int8
// and E4M3 random bytes), with their scales.
struct Copies {
  std::vector<Buffer> data, scales;
  std::vector<Matrix> m;
  size_t bytes = 0;  // read per matmul: the weights and their scales

  Copies(Backend& backend, DType dtype, const Shape& s, std::mt19937& rng) {
    Matrix proto{nullptr, dtype, s.rows, s.cols};
    if (dtype == DType::kF8E4M3) proto.scale_block = 128;
    const size_t count = static_cast<size_t>(s.rows * s.cols);
    std::vector<uint8_t> host(proto.bytes());
    if (dtype == DType::kBF16) {
      std::normal_distribution<float> normal(0.0f, 0.02f);
      auto* h = reinterpret_cast<uint16_t*>(host.data());
      for (size_t i = 0; i < count; ++i) h[i] = model::F32ToBf16(normal(rng));
    } else {  // int8 or E4M3 below 0x7F in magnitude (finite)
      for (uint8_t& b : host) b = static_cast<uint8_t>(rng() % 0x7F) | (rng() & 0x80);
    }
    const size_t scale_count = dtype == DType::kF8E4M3
                                   ? static_cast<size_t>(s.rows * proto.ScaleColumns())
                               : dtype == DType::kI8 ? static_cast<size_t>(s.rows)
                                                     : 0;
    std::vector<float> host_scales(scale_count);
    for (float& f : host_scales) f = std::ldexp(1.0f, -9 - static_cast<int>(rng() % 4));
    bytes = host.size() + host_scales.size() * sizeof(float);
    const size_t copies = std::max<size_t>(2, (kPastL2 + bytes - 1) / bytes);
    for (size_t c = 0; c < copies; ++c) {
      data.push_back(bench::AllocateOrExit(backend, host.size()));
      backend.memory().CopyIn(data.back().get(), host.data(), host.size());
      Matrix w = proto;
      w.data = data.back().get();
      if (scale_count > 0) {
        scales.push_back(bench::AllocateOrExit(backend, scale_count * sizeof(float)));
        backend.memory().CopyIn(scales.back().get(), host_scales.data(),
                                scale_count * sizeof(float));
        w.scales = scales.back().as<float>();
      }
      m.push_back(w);
    }
  }
};

// Seconds per matmul: `iters` matmuls, each on the next copy, recorded as one CUDA graph
// (Backend::Record; launched one by one, the smaller shapes' few microseconds would time
// their launches), replayed once to warm up and then timed between device-wide waits.
double Time(Backend& backend, const Copies& w, const float* x, int n, float* y, int iters) {
  const auto ops = [&] {
    for (int i = 0; i < iters; ++i) backend.MatMul(x, n, w.m[i % w.m.size()], y);
  };
  absl::StatusOr<std::unique_ptr<kernels::OpGraph>> graph = backend.Record(ops);
  if (!graph.ok() || *graph == nullptr) {
    std::fprintf(stderr, "FAIL: the matmuls could not be recorded as a graph: %s\n",
                 graph.ok() ? "not recordable" : graph.status().ToString().c_str());
    std::exit(1);
  }
  const auto replay = [&] {
    if (const absl::Status st = (*graph)->Replay(); !st.ok()) {
      std::fprintf(stderr, "FAIL: replay: %s\n", st.ToString().c_str());
      std::exit(1);
    }
  };
  replay();
  cudaDeviceSynchronize();
  const auto t0 = std::chrono::steady_clock::now();
  replay();
  cudaDeviceSynchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
}

// Device-to-device copy bandwidth (bytes read + written per second), median of 10 copies of
// 1 GiB.
double CopyBandwidth(Backend& backend) {
  const size_t bytes = size_t{1} << 30;
  const Buffer a = bench::AllocateOrExit(backend, bytes), b = bench::AllocateOrExit(backend, bytes);
  cudaMemset(a.get(), 0, bytes);
  std::vector<double> t;
  for (int i = 0; i < 12; ++i) {
    cudaDeviceSynchronize();
    const auto t0 = std::chrono::steady_clock::now();
    cudaMemcpy(i % 2 ? a.get() : b.get(), i % 2 ? b.get() : a.get(), bytes,
               cudaMemcpyDeviceToDevice);
    cudaDeviceSynchronize();
    if (i >= 2)
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return 2.0 * bytes / t[t.size() / 2];
}

int Run(const std::vector<int>& row_counts, int iters) {
  if (kernels::CudaDeviceCount() == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  std::vector<std::unique_ptr<Backend>> backends;  // one per count of chunks in flight
  for (const int count : kCounts) {
    kernels::CudaBackendOptions options;
    options.skinny_chunks_in_flight = count;
    auto made = kernels::CreateCudaBackend(options);
    if (!made.ok()) {
      std::fprintf(stderr, "cuda backend: %s\n", made.status().ToString().c_str());
      return 1;
    }
    if (!(*made)->RunsInt8Weights() || !(*made)->RunsFp8Weights() ||
        kernels::CudaMatMulsOnCublas(**made)) {
      std::fprintf(stderr,
                   "FAIL: with %d chunk(s) in flight a matmul failed its start-up check (the "
                   "log says which): it would time another path\n",
                   count);
      return 1;
    }
    backends.push_back(*std::move(made));
  }
  Backend& first = *backends[0];
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  const double bw = CopyBandwidth(first);
  std::printf(
      "device %s (sm_%d%d); device-to-device copy %.0f GB/s (read + write); baseline: "
      "bf16, 1 chunk in flight\n",
      prop.name, prop.major, prop.minor, bw / 1e9);
  const Shape shapes[] = {{"llama-3-8b q/o", 4096, 4096},
                          {"llama-3-8b gate/up", 14336, 4096},
                          {"llama-3-8b down", 4096, 14336},
                          {"qwen2.5-0.5b gate/up", 4864, 896},
                          {"qwen2.5-0.5b down", 896, 4864}};
  std::mt19937 rng(7);
  bool same = true;
  for (const Shape& s : shapes) {
    std::vector<Copies> weights;
    for (const DType dt : {DType::kBF16, DType::kI8, DType::kF8E4M3}) {
      weights.emplace_back(first, dt, s, rng);
    }
    cudaDeviceSynchronize();
    for (const int n : row_counts) {
      std::vector<float> x(static_cast<size_t>(n) * s.cols);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (float& v : x) v = normal(rng);
      const Buffer dx = bench::AllocateOrExit(first, x.size() * sizeof(float));
      first.memory().CopyIn(dx.get(), x.data(), x.size() * sizeof(float));
      const size_t out = static_cast<size_t>(n) * s.rows;
      const Buffer y = bench::AllocateOrExit(first, out * sizeof(float));
      double baseline = 0;
      for (const Copies& w : weights) {
        std::vector<float> reference;
        for (size_t u = 0; u < backends.size(); ++u) {
          Backend& backend = *backends[u];
          const double t = Time(backend, w, dx.as<float>(), n, y.as<float>(), iters);
          if (baseline == 0) baseline = t;
          backend.MatMul(dx.as<float>(), n, w.m[0], y.as<float>());
          const std::vector<float> got = bench::DownloadFloats(backend, y, out);
          const bool equal =
              u == 0 || std::memcmp(got.data(), reference.data(), out * sizeof(float)) == 0;
          if (u == 0) reference = got;
          same = same && equal;
          std::printf(
              "%-21s %5lldx%-5lld n %d %-6s in flight %d: %8.2f us %7.0f GB/s %5.1f%% of copy "
              "| %.2fx bf16 (1)%s\n",
              s.name, static_cast<long long>(s.rows), static_cast<long long>(s.cols), n,
              kernels::DTypeName(w.m[0].dtype), kCounts[u], t * 1e6, w.bytes / t / 1e9,
              100 * w.bytes / t / bw, baseline / t, equal ? "" : "  FAIL: bits differ from 1's");
        }
      }
      for (const auto& backend : backends) {
        if (const absl::Status h = backend->Health(); !h.ok()) {
          std::fprintf(stderr, "FAIL: %s\n", h.ToString().c_str());
          return 1;
        }
      }
      std::fflush(stdout);
    }
  }
  return same ? 0 : 1;
}

struct MatmulFlags {
  std::vector<int> rows = {1, 4};
  int iters = 50;
};

const flags::FlagSet<MatmulFlags>& Flags() {
  static const flags::FlagSet<MatmulFlags> f = [] {
    flags::FlagSet<MatmulFlags> s;
    s.Custom(
         "rows", "LIST", "rows of x per matmul, counts from 1 to 4 (default 1,4)",
         [](MatmulFlags& o, absl::string_view v) { return flags::ParseIntList(v, 1, 4, &o.rows); },
         [](const MatmulFlags&) { return std::vector<std::string>(); })
        .Int(
            "iters", "N", "matmuls per case, recorded as one graph (default 50)",
            [](auto& o) -> auto& { return o.iters; }, 1, 100000);
    return s;
  }();
  return f;
}

constexpr char kUsageHead[] =
    R"U(usage: recall_gpu_matmul_bench [--rows 1,4] [--iters 50]

Decode's matmuls on a CUDA device: our batch-invariant kernel at few rows on bf16, int8 and
FP8 weights under 1, 2 and 4 chunks in flight, on random weights of Llama-3-8B's and
Qwen2.5-0.5B's linear shapes (cycled through copies past the L2). Prints each one's time,
bytes read per second and their fraction of the device-to-device copy bandwidth, the ratio
against bf16 with 1 chunk in flight, and whether its bits equal 1's (exit 1 if not).

options:
)U";

}  // namespace
}  // namespace recall

int main(int argc, char** argv) {
  recall::MatmulFlags o;
  if (const int rc = recall::bench::ParseBenchFlags(argc, argv, "recall_gpu_matmul_bench",
                                                    recall::kUsageHead, recall::Flags(), &o);
      rc >= 0) {
    return rc;
  }
  return recall::Run(o.rows, o.iters);
}
