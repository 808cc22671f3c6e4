#include "kernels/cpu/matmul_check.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cpu/int8.h"
#include "kernels/fp8.h"

namespace recall::kernels {
namespace {

// Deterministic values in [-1, 1).
std::vector<float> Values(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (float& f : v) {
    x = x * 1664525u + 1013904223u;
    f = static_cast<float>(x >> 8) / static_cast<float>(1u << 23) - 1.0f;
  }
  return v;
}

// A host vector copied to the backend's memory, and back.
class Staged {
 public:
  static absl::StatusOr<Staged> Of(Memory& memory, const void* host, size_t bytes) {
    Staged s;
    RECALL_ASSIGN_OR_RETURN(s.buffer_, Buffer::Allocate(memory, bytes));
    memory.CopyIn(s.buffer_.get(), host, bytes);
    s.bytes_ = bytes;
    return s;
  }
  float* f() const { return buffer_.as<float>(); }
  const void* get() const { return buffer_.get(); }
  std::vector<float> Download() const {
    std::vector<float> out(bytes_ / sizeof(float));
    buffer_.memory()->CopyOut(out.data(), buffer_.get(), bytes_);
    return out;
  }

 private:
  Buffer buffer_;
  size_t bytes_ = 0;
};

// max |got - want| / max(1, ||want row||_inf) over the rows.
double RowError(const std::vector<float>& got, const std::vector<float>& want, int64_t cols) {
  double worst = 0;
  for (size_t r = 0; r * cols < want.size(); ++r) {
    double scale = 1, diff = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = r * cols + c;
      scale = std::max(scale, static_cast<double>(std::fabs(want[i])));
      diff = std::max(diff, std::fabs(static_cast<double>(got[i]) - want[i]));
      if (!std::isfinite(got[i])) return INFINITY;
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

struct Shape {
  int64_t rows, cols;
};

// MatMul against the reference and across row counts, for one weight matrix.
absl::Status CheckOne(Backend& backend, Backend& cpu, DType dtype, Shape s, const char* who) {
  Memory& memory = backend.memory();
  const int most = std::max(1, std::min(backend.BatchInvariantRows(), 64));
  const std::vector<float> wf = Values(static_cast<size_t>(s.rows * s.cols), s.rows + s.cols);
  std::vector<uint16_t> half;
  Matrix host{wf.data(), DType::kF32, s.rows, s.cols};
  if (dtype != DType::kF32) {
    // Random signs and mantissas, exponents for magnitudes in [2^-7, 2) (bf16) or
    // [2^-5, 2) (f16): normal numbers, built from their bits.
    half.resize(wf.size());
    uint32_t x = static_cast<uint32_t>(s.rows * 31 + s.cols);
    for (uint16_t& h : half) {
      x = x * 1664525u + 1013904223u;
      const uint32_t sign = (x >> 31) << 15;
      h = static_cast<uint16_t>(dtype == DType::kBF16
                                    ? sign | (120 + (x >> 20) % 8) << 7 | ((x >> 8) & 0x7F)
                                    : sign | (10 + (x >> 20) % 6) << 10 | ((x >> 4) & 0x3FF));
    }
    host = Matrix{half.data(), dtype, s.rows, s.cols};
  }
  RECALL_ASSIGN_OR_RETURN(Staged w, Staged::Of(memory, host.data, host.bytes()));
  const Matrix device{w.get(), dtype, s.rows, s.cols};
  const std::vector<float> x = Values(static_cast<size_t>(most * s.cols), 7);
  RECALL_ASSIGN_OR_RETURN(Staged dx, Staged::Of(memory, x.data(), x.size() * sizeof(float)));
  std::vector<float> want(static_cast<size_t>(most * s.rows));
  cpu.MatMul(x.data(), most, host, want.data());
  const std::vector<float> nan(want.size(), NAN);
  RECALL_ASSIGN_OR_RETURN(Staged all, Staged::Of(memory, nan.data(), nan.size() * sizeof(float)));
  backend.MatMul(dx.f(), most, device, all.f());
  const std::vector<float> got = all.Download();
  RECALL_RETURN_IF_ERROR(backend.Health());
  const std::string shape = absl::StrCat(DTypeName(dtype), " ", s.rows, "x", s.cols);
  if (const double err = RowError(got, want, s.rows); !(err <= 1e-5)) {
    return absl::InternalError(absl::StrCat(who, "MatMul of ", most, " rows of ", shape,
                                            " is off the host reference by ", err,
                                            " (relative; the limit is 1e-5)"));
  }
  // Rows [3, 3 + n) alone must give the same bits as within all `most` rows.
  for (const int n : {1, std::min(most - 3, 13)}) {
    if (most < 4 || n <= 0) continue;
    RECALL_ASSIGN_OR_RETURN(Staged part,
                            Staged::Of(memory, nan.data(), n * s.rows * sizeof(float)));
    backend.MatMul(dx.f() + 3 * s.cols, n, device, part.f());
    const std::vector<float> p = part.Download();
    if (!std::equal(p.begin(), p.end(), got.begin() + 3 * s.rows)) {
      return absl::InternalError(
          absl::StrCat(who, "MatMul of ", shape, " is not batch-invariant: ", n,
                       " rows alone differ from the same rows among ", most));
    }
  }
  // The same matrix three times in one MatMulMany: each the bits of the MatMul above.
  RECALL_ASSIGN_OR_RETURN(Staged many, Staged::Of(memory, nan.data(), nan.size() * sizeof(float)));
  const Matrix three[3] = {device, device, device};
  float* outs[3] = {many.f(), many.f(), many.f()};
  RECALL_ASSIGN_OR_RETURN(Staged other,
                          Staged::Of(memory, nan.data(), 2 * nan.size() * sizeof(float)));
  outs[1] = other.f();
  outs[2] = other.f() + nan.size();
  backend.MatMulMany(dx.f(), most, three, outs, 3);
  const std::vector<float> m0 = many.Download(), m12 = other.Download();
  RECALL_RETURN_IF_ERROR(backend.Health());
  if (m0 != got || !std::equal(m12.begin(), m12.begin() + got.size(), got.begin()) ||
      !std::equal(m12.begin() + got.size(), m12.end(), got.begin())) {
    return absl::InternalError(
        absl::StrCat(who, "MatMulMany of ", shape, " differs from one MatMul per matrix"));
  }
  return absl::OkStatus();
}

absl::Status CheckAddRmsNorm(Backend& backend, const char* who) {
  Memory& memory = backend.memory();
  const int n = 3, dim = 576;
  const std::vector<float> x = Values(n * dim, 11), y = Values(n * dim, 12);
  std::vector<float> w = Values(dim, 13);
  for (float& v : w) v += 1.5f;
  RECALL_ASSIGN_OR_RETURN(Staged dw, Staged::Of(memory, w.data(), w.size() * sizeof(float)));
  RECALL_ASSIGN_OR_RETURN(Staged x1, Staged::Of(memory, x.data(), x.size() * sizeof(float)));
  RECALL_ASSIGN_OR_RETURN(Staged y1, Staged::Of(memory, y.data(), y.size() * sizeof(float)));
  RECALL_ASSIGN_OR_RETURN(Staged o1, Staged::Of(memory, y.data(), y.size() * sizeof(float)));
  RECALL_ASSIGN_OR_RETURN(Staged x2, Staged::Of(memory, x.data(), x.size() * sizeof(float)));
  RECALL_ASSIGN_OR_RETURN(Staged y2, Staged::Of(memory, y.data(), y.size() * sizeof(float)));
  backend.Add(x1.f(), y1.f(), n * dim);
  backend.RmsNorm(x1.f(), dw.f(), n, dim, 1e-5f, o1.f());
  backend.AddRmsNorm(x2.f(), y2.f(), dw.f(), n, dim, 1e-5f, y2.f());
  const bool same = x2.Download() == x1.Download() && y2.Download() == o1.Download();
  RECALL_RETURN_IF_ERROR(backend.Health());
  if (!same) {
    return absl::InternalError(absl::StrCat(who, "AddRmsNorm differs from Add then RmsNorm"));
  }
  return absl::OkStatus();
}

}  // namespace

// 2^(e - half), e cycling through 0 .. 2 * half over (row, block): magnitudes that differ by
// up to 2^(2 * half) between neighbouring rows and blocks, so a scale read from the wrong
// row or block is far off.
float Spread(int64_t row, int64_t block, int half) {
  return half == 0
             ? 1.0f
             : std::ldexp(1.0f, static_cast<int>((row * 7 + block * 3) % (2 * half + 1)) - half);
}

// MatMul of up to BatchInvariantRows() rows of x (Values(..., x_seed)) by `device` (a
// quantized matrix in the backend's memory) against the CPU's f32 product with `widened`,
// within `limit` (RowError), and one row alone the bits of the same row among the others.
absl::Status CheckAgainstWidened(Backend& backend, Backend& cpu, const Matrix& device,
                                 const std::vector<float>& widened, const std::string& shape,
                                 double limit, uint32_t x_seed, const std::string& who) {
  Memory& memory = backend.memory();
  const int most = std::max(1, std::min(backend.BatchInvariantRows(), 64));
  const int64_t rows = device.rows, cols = device.cols;
  // The product of n rows of x (Values(..., seed), staged into *dx) into *got, within `limit`.
  const auto product = [&](int n, uint32_t seed, std::optional<Staged>* dx,
                           std::vector<float>* got) -> absl::Status {
    const std::vector<float> x = Values(static_cast<size_t>(n * cols), seed);
    RECALL_ASSIGN_OR_RETURN(*dx, Staged::Of(memory, x.data(), x.size() * sizeof(float)));
    std::vector<float> want(static_cast<size_t>(n * rows));
    cpu.MatMul(x.data(), n, Matrix{widened.data(), DType::kF32, rows, cols}, want.data());
    const std::vector<float> nan(want.size(), NAN);
    RECALL_ASSIGN_OR_RETURN(Staged all, Staged::Of(memory, nan.data(), nan.size() * sizeof(float)));
    backend.MatMul((*dx)->f(), n, device, all.f());
    *got = all.Download();
    RECALL_RETURN_IF_ERROR(backend.Health());
    if (const double err = RowError(*got, want, rows); !(err <= limit)) {
      return absl::InternalError(absl::StrCat(who, "MatMul of ", n, " rows of ", shape,
                                              " is off the widened weights' product by ", err,
                                              " (relative; the limit is ", limit, ")"));
    }
    return absl::OkStatus();
  };
  std::optional<Staged> dx;
  std::vector<float> got;
  RECALL_RETURN_IF_ERROR(product(most, x_seed, &dx, &got));
  // Quantized weights take the backend's own kernels at any row count (prefill too), also
  // where its f32 matmuls fell back to a library and it has no batch-invariant rows: check
  // the product of 64 rows as well.
  if (most < 64) {
    std::optional<Staged> dx64;
    std::vector<float> got64;
    RECALL_RETURN_IF_ERROR(product(64, x_seed + 1, &dx64, &got64));
  }
  if (most >= 4) {
    const std::vector<float> nan(static_cast<size_t>(rows), NAN);
    RECALL_ASSIGN_OR_RETURN(Staged one, Staged::Of(memory, nan.data(), rows * sizeof(float)));
    backend.MatMul(dx->f() + 3 * cols, 1, device, one.f());
    const std::vector<float> p = one.Download();
    if (!std::equal(p.begin(), p.end(), got.begin() + 3 * rows)) {
      return absl::InternalError(absl::StrCat(who, "MatMul of ", shape,
                                              " is not batch-invariant: 1 row alone differs "
                                              "from the same row among ",
                                              most));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckInt8MatMul(Backend& backend) {
  CpuBackendOptions one_thread;
  one_thread.num_threads = 1;
  const std::unique_ptr<Backend> cpu = CreateCpuBackend(one_thread);
  const std::string who = absl::StrCat(backend.Name(), " backend: ");
  Memory& memory = backend.memory();
  for (const Shape s : {Shape{300, 512}, Shape{101, 77}}) {
    std::vector<float> wf = Values(static_cast<size_t>(s.rows * s.cols), s.rows * s.cols);
    // Rows of magnitudes 2^-6 .. 2^6 (neighbours 2^7 apart): a scale read from another row
    // is far off, not within the limit, which the x quantization of some backends needs.
    for (int64_t r = 0; r < s.rows; ++r) {
      for (int64_t c = 0; c < s.cols; ++c) wf[r * s.cols + c] *= Spread(r, 0, 6);
    }
    // The integers, then the scales and the row sums, in one staged buffer (as UploadModel).
    const size_t q_bytes = static_cast<size_t>(s.rows * s.cols), at = (q_bytes + 63) / 64 * 64;
    std::vector<char> packed(at + static_cast<size_t>(s.rows) * 8);
    auto* q = reinterpret_cast<int8_t*>(packed.data());
    auto* scales = reinterpret_cast<float*>(packed.data() + at);
    auto* sums = reinterpret_cast<int32_t*>(scales + s.rows);
    cpu::QuantizeRowsInt8(wf.data(), s.rows, s.cols, q, scales, sums);
    Matrix host{q, DType::kI8, s.rows, s.cols, scales, sums};
    std::vector<float> widened(wf.size());
    cpu::DequantizeRowsInt8(host, 0, s.rows, widened.data());
    RECALL_ASSIGN_OR_RETURN(Staged w, Staged::Of(memory, packed.data(), packed.size()));
    const char* base = static_cast<const char*>(w.get());
    const Matrix device{base,
                        DType::kI8,
                        s.rows,
                        s.cols,
                        reinterpret_cast<const float*>(base + at),
                        reinterpret_cast<const int32_t*>(base + at + s.rows * sizeof(float))};
    const std::string shape = absl::StrCat("int8 ", s.rows, "x", s.cols);
    RECALL_RETURN_IF_ERROR(
        CheckAgainstWidened(backend, *cpu, device, widened, shape, 3e-2, 9, who));
    // Embedding: rows of the int8 table, exactly q * scale.
    const std::vector<int32_t> tokens = {0, static_cast<int32_t>(s.rows - 1), 7};
    RECALL_ASSIGN_OR_RETURN(Staged dt, Staged::Of(memory, tokens.data(), tokens.size() * 4));
    const std::vector<float> e_nan(tokens.size() * s.cols, NAN);
    RECALL_ASSIGN_OR_RETURN(Staged de, Staged::Of(memory, e_nan.data(), e_nan.size() * 4));
    backend.Embedding(device, static_cast<const int32_t*>(dt.get()),
                      static_cast<int>(tokens.size()), de.f());
    const std::vector<float> e = de.Download();
    RECALL_RETURN_IF_ERROR(backend.Health());
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (!std::equal(e.begin() + i * s.cols, e.begin() + (i + 1) * s.cols,
                      widened.begin() + tokens[i] * s.cols)) {
        return absl::InternalError(absl::StrCat(
            who, "Embedding of an ", shape, " table differs from q * scale at row ", tokens[i]));
      }
    }
  }
  return absl::OkStatus();
}

// An FP8 matrix of Values(rows * cols, seed) (times Spread(row, block, spread)) with one
// scale per row and block of `block` columns (scale = the block's largest |w| / 448), and the
// same weights widened to f32: the bytes first, then the scales from offset `at`, as
// UploadModel stages them.
struct Fp8Host {
  std::vector<char> packed;
  size_t at = 0;
  std::vector<float> widened;
  Matrix host;
};

Fp8Host MakeFp8(int64_t rows, int64_t cols, int block, uint32_t seed, int spread = 0) {
  Fp8Host f;
  f.host = Matrix{nullptr, DType::kF8E4M3, rows, cols};
  f.host.scale_block = block;
  const int64_t per_row = f.host.ScaleColumns();
  f.at = (static_cast<size_t>(rows * cols) + 63) / 64 * 64;
  f.packed.resize(f.at + f.host.scale_bytes());
  auto* q = reinterpret_cast<uint8_t*>(f.packed.data());
  auto* scales = reinterpret_cast<float*>(f.packed.data() + f.at);
  std::vector<float> w = Values(static_cast<size_t>(rows * cols), seed);
  f.widened.resize(w.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < per_row; ++b) {
      const int64_t c0 = b * block, c1 = std::min(cols, c0 + block);
      for (int64_t c = c0; c < c1; ++c) w[r * cols + c] *= Spread(r, b, spread);
      float most = 0;
      for (int64_t c = c0; c < c1; ++c) most = std::max(most, std::fabs(w[r * cols + c]));
      const float s = most > 0 ? most / 448.0f : 1.0f;
      scales[r * per_row + b] = s;
      for (int64_t c = c0; c < c1; ++c) {
        q[r * cols + c] = F32ToE4M3(w[r * cols + c] / s);
        f.widened[r * cols + c] = E4M3ToF32(q[r * cols + c]) * s;
      }
    }
  }
  f.host.data = q;
  f.host.scales = scales;
  return f;
}

absl::Status CheckFp8MatMul(Backend& backend) {
  CpuBackendOptions one_thread;
  one_thread.num_threads = 1;
  const std::unique_ptr<Backend> cpu = CreateCpuBackend(one_thread);
  const std::string who = absl::StrCat(backend.Name(), " backend: ");
  Memory& memory = backend.memory();
  const int most = std::max(1, std::min(backend.BatchInvariantRows(), 64));
  struct Case {
    Shape s;
    int block;
  };
  for (const Case k : {Case{{300, 512}, 128}, Case{{101, 77}, 16}}) {
    const Shape s = k.s;
    Fp8Host f = MakeFp8(s.rows, s.cols, k.block, static_cast<uint32_t>(s.rows * s.cols));
    RECALL_ASSIGN_OR_RETURN(Staged w, Staged::Of(memory, f.packed.data(), f.packed.size()));
    Matrix device = f.host;
    device.data = w.get();
    device.scales = reinterpret_cast<const float*>(static_cast<const char*>(w.get()) + f.at);
    const std::string shape =
        absl::StrCat("fp8 ", s.rows, "x", s.cols, " (blocks of ", k.block, " columns)");
    RECALL_RETURN_IF_ERROR(
        CheckAgainstWidened(backend, *cpu, device, f.widened, shape, 1e-4, 11, who));
  }
  // Two matrices of one input with different blocks in one MatMulMany.
  Fp8Host a = MakeFp8(96, 512, 128, 5), b = MakeFp8(40, 512, 64, 6);
  RECALL_ASSIGN_OR_RETURN(Staged wa, Staged::Of(memory, a.packed.data(), a.packed.size()));
  RECALL_ASSIGN_OR_RETURN(Staged wb, Staged::Of(memory, b.packed.data(), b.packed.size()));
  Matrix m[2] = {a.host, b.host};
  m[0].data = wa.get();
  m[0].scales = reinterpret_cast<const float*>(static_cast<const char*>(wa.get()) + a.at);
  m[1].data = wb.get();
  m[1].scales = reinterpret_cast<const float*>(static_cast<const char*>(wb.get()) + b.at);
  const int n = most;  // past 4 rows, the kernel that stages rows (not the few-rows one)
  const std::vector<float> x = Values(static_cast<size_t>(n * 512), 13);
  RECALL_ASSIGN_OR_RETURN(Staged dx, Staged::Of(memory, x.data(), x.size() * sizeof(float)));
  std::vector<std::vector<float>> alone;
  std::vector<Staged> together;
  together.reserve(2);
  float* y[2];
  for (int i = 0; i < 2; ++i) {
    const std::vector<float> nan(static_cast<size_t>(n * m[i].rows), NAN);
    RECALL_ASSIGN_OR_RETURN(Staged one, Staged::Of(memory, nan.data(), nan.size() * 4));
    backend.MatMul(dx.f(), n, m[i], one.f());
    alone.push_back(one.Download());
    RECALL_ASSIGN_OR_RETURN(Staged many, Staged::Of(memory, nan.data(), nan.size() * 4));
    together.push_back(std::move(many));
    y[i] = together.back().f();
  }
  backend.MatMulMany(dx.f(), n, m, y, 2);
  RECALL_RETURN_IF_ERROR(backend.Health());
  for (int i = 0; i < 2; ++i) {
    if (together[static_cast<size_t>(i)].Download() != alone[static_cast<size_t>(i)]) {
      return absl::InternalError(absl::StrCat(who, "MatMulMany of two FP8 matrices: matrix ", i,
                                              " differs from its own MatMul"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckFp8ManyRows(Backend& backend) {
  if (!backend.RunsFp8Weights()) return absl::OkStatus();
  CpuBackendOptions one_thread;
  one_thread.num_threads = 1;
  const std::unique_ptr<Backend> cpu = CreateCpuBackend(one_thread);
  const std::string who = absl::StrCat(backend.Name(), " backend: ");
  Memory& memory = backend.memory();
  // 200 rows: past any batch-invariant piece, and not a multiple of 16.
  constexpr int64_t kRows = 384, kCols = 512, kBlock = 128;
  constexpr int n = 200;
  Fp8Host f = MakeFp8(kRows, kCols, kBlock, 17, /*spread=*/6);
  RECALL_ASSIGN_OR_RETURN(Staged w, Staged::Of(memory, f.packed.data(), f.packed.size()));
  Matrix device = f.host;
  device.data = w.get();
  device.scales = reinterpret_cast<const float*>(static_cast<const char*>(w.get()) + f.at);
  std::vector<float> x = Values(static_cast<size_t>(n * kCols), 19);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < kCols; ++c) x[r * kCols + c] *= Spread(r + 5, c / kBlock, 4);
  }
  RECALL_ASSIGN_OR_RETURN(Staged dx, Staged::Of(memory, x.data(), x.size() * sizeof(float)));
  const std::vector<float> nan(static_cast<size_t>(n * kRows), NAN);
  RECALL_ASSIGN_OR_RETURN(Staged dy, Staged::Of(memory, nan.data(), nan.size() * sizeof(float)));
  backend.MatMul(dx.f(), n, device, dy.f());
  const std::vector<float> got = dy.Download();
  RECALL_RETURN_IF_ERROR(backend.Health());
  // The widened weights' product, and sum |x_k w_k| per output: quantizing x to E4M3 moves
  // each term by at most 2^-4 of itself.
  std::vector<float> want(got.size()), bound(got.size());
  cpu->MatMul(x.data(), n, Matrix{f.widened.data(), DType::kF32, kRows, kCols}, want.data());
  std::vector<float> ax(x.size()), aw(f.widened.size());
  std::transform(x.begin(), x.end(), ax.begin(), [](float v) { return std::fabs(v); });
  std::transform(f.widened.begin(), f.widened.end(), aw.begin(),
                 [](float v) { return std::fabs(v); });
  cpu->MatMul(ax.data(), n, Matrix{aw.data(), DType::kF32, kRows, kCols}, bound.data());
  constexpr double kLimit = 0.07;
  for (size_t i = 0; i < got.size(); ++i) {
    const double off = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(off <= kLimit * bound[i])) {
      return absl::InternalError(absl::StrCat(
          who, "MatMul of ", n, " rows of fp8 ", kRows, "x", kCols, " (blocks of ", kBlock,
          " columns) is off the widened weights' product at row ", i / kRows, ", output ",
          i % kRows, " by ", off / bound[i], " of sum |x w| (the limit is ", kLimit, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckMatMul(Backend& backend) {
  CpuBackendOptions one_thread;
  one_thread.num_threads = 1;
  const std::unique_ptr<Backend> cpu = CreateCpuBackend(one_thread);
  const std::string who = absl::StrCat(backend.Name(), " backend: ");
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    // 512 columns: the vector loads; 77: one element at a time.
    for (const Shape s : {Shape{300, 512}, Shape{101, 77}}) {
      RECALL_RETURN_IF_ERROR(CheckOne(backend, *cpu, dtype, s, who.c_str()));
    }
  }
  return CheckAddRmsNorm(backend, who.c_str());
}

}  // namespace recall::kernels
