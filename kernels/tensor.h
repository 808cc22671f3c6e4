// Plain data types shared by every backend: element types, read-only weight matrices and
// the paged KV layout. No ownership here: these are views over memory someone else owns.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace recall::kernels {

// Element types of weight matrices. kI8: symmetric int8 with one fp32 scale per row (per
// output channel of a linear layer): w[r, c] = q[r, c] * scales[r] (kernels/cpu/int8.h).
// kF8E4M3: an FP8 checkpoint's E4M3FN bytes (kernels/fp8.h) with one fp32 scale per row and
// block of scale_block columns: w[r, c] = e4m3(q[r, c]) * scales[r * ScaleColumns() +
// c / scale_block]. Only the CUDA backend multiplies them (Backend::RunsFp8Weights).
enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2, kI8 = 3, kF8E4M3 = 4 };

inline size_t DTypeSize(DType t) {
  return t == DType::kF32 ? 4 : (t == DType::kI8 || t == DType::kF8E4M3) ? 1 : 2;
}
inline const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kI8:
      return "int8";
    case DType::kF8E4M3:
      return "fp8";
  }
  return "?";
}

// A read-only row-major matrix [rows, cols]. For a linear layer, rows are the outputs:
// y[rows] = W[rows, cols] * x[cols]. A vector is a matrix with rows == 1.
struct Matrix {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  // kI8: [rows], one per row; kF8E4M3: [rows, ScaleColumns()]; null for the other types.
  const float* scales = nullptr;
  const int32_t* row_sums = nullptr;  // kI8: [rows], the sum of each row's integers
  int32_t scale_block = 0;            // kF8E4M3: columns per scale, a multiple of 8

  bool empty() const { return data == nullptr; }
  int64_t numel() const { return rows * cols; }
  size_t bytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype); }  // elements
  int64_t ScaleColumns() const {  // kF8E4M3: scales per row
    return scale_block > 0 ? (cols + scale_block - 1) / scale_block : 0;
  }
  size_t scale_bytes() const {  // kI8: the scales and the row sums; kF8E4M3: the scales
    if (dtype == DType::kF8E4M3) return static_cast<size_t>(rows * ScaleColumns()) * sizeof(float);
    return dtype == DType::kI8 ? static_cast<size_t>(rows) * (sizeof(float) + sizeof(int32_t)) : 0;
  }
  const float* f32() const { return static_cast<const float*>(data); }  // REQUIRES: kF32
};

// Host and device code (kernels/cuda/*.cu include this header).
#if defined(__CUDACC__)
#define RECALL_HOST_DEVICE __host__ __device__
#else
#define RECALL_HOST_DEVICE
#endif

enum class RopeStyle : uint8_t {
  kInterleaved = 0,  // llama2.c / Meta: rotate pairs (2i, 2i+1)
  kHalfSplit = 1,    // Hugging Face Llama: rotate pairs (i, i + head_dim/2)
};

// RoPE's frequency of pair i: theta^(-2i / head_dim), as every Rope computes it. Taken in
// double and rounded once, so the host and the device get the same float: their powf differ
// by an ulp or more for some pairs, and at position 20,000 an ulp of a frequency is 1e-5 of a
// rotated key (seen on an H100: the device's re-rotation failed its check against the host).
RECALL_HOST_DEVICE inline float RopeFreq(float theta, int i, int head_dim) {
  return static_cast<float>(
      1.0 / pow(static_cast<double>(theta), static_cast<double>(2 * i) / head_dim));
}

// How the KV cache stores one element. Attention reads every type and accumulates in fp32.
//   kF32  - exact;
//   kBF16 - bfloat16, rounded to nearest even (half the bytes);
//   kF16  - IEEE half, rounded to nearest even, saturating at +-65504;
//   kInt8 - symmetric int8 with one fp32 scale per row (one token of one KV head, K and V
//           apart): q = round(x / s), s = max|x| / 127 (a quarter of the bytes, plus 4 per
//           row). Rows are quantized independently, so no token's rounding depends on another.
enum class KvDType : uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2, kInt8 = 3 };
RECALL_HOST_DEVICE inline int KvElemBytes(KvDType t) {
  return t == KvDType::kF32 ? 4 : t == KvDType::kInt8 ? 1 : 2;
}
inline const char* KvDTypeName(KvDType t) {
  switch (t) {
    case KvDType::kF32:
      return "f32";
    case KvDType::kBF16:
      return "bf16";
    case KvDType::kF16:
      return "f16";
    case KvDType::kInt8:
      return "int8";
  }
  return "?";
}

// How a paged KV block is laid out. A block holds `block_tokens` token slots of ONE layer,
// for every KV head of this rank, K and V, as planes:
//   block[kv_head][0 = K, 1 = V] = plane: [block_tokens] fp32 scales (int8 only), then
//                                         [block_tokens][head_dim] elements of `dtype`
// so the K (or V) rows of one head inside one block are contiguous (for kF32 exactly the
// fp32 layout block[kv_head][K/V][slot][head_dim]). Every layer of a sequence has its own
// block table (PagedKv::block_tables), so each layer holds as many blocks as its own longest
// KV head needs. n_layers is the number of those tables. Offsets are in bytes.
struct PagedKvLayout {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int block_tokens = 16;
  KvDType dtype = KvDType::kF32;

  RECALL_HOST_DEVICE int64_t RowBytes() const {
    return static_cast<int64_t>(head_dim) * KvElemBytes(dtype);
  }
  RECALL_HOST_DEVICE int64_t ScaleBytes() const {
    return dtype == KvDType::kInt8 ? static_cast<int64_t>(block_tokens) * 4 : 0;
  }
  RECALL_HOST_DEVICE int64_t PlaneBytes() const { return ScaleBytes() + block_tokens * RowBytes(); }
  RECALL_HOST_DEVICE int64_t BlockBytes() const {
    return static_cast<int64_t>(n_kv_heads) * 2 * PlaneBytes();
  }
  // Bytes of one token in every layer (K and V of every KV head, scales included).
  int64_t TokenBytes() const { return BlockBytes() / block_tokens * n_layers; }
  // For kF32 layouts (fp32 code paths, checks and tests): a block in floats, and the float
  // offset of a row inside a block.
  int64_t BlockFloats() const { return BlockBytes() / 4; }
  int64_t Offset(int head, int is_v, int slot_in_block) const {
    return ((static_cast<int64_t>(head) * 2 + is_v) * block_tokens + slot_in_block) * head_dim;
  }
  // Offset, inside a block, of the plane of (head, K or V).
  RECALL_HOST_DEVICE int64_t PlaneOffset(int head, int is_v) const {
    return (static_cast<int64_t>(head) * 2 + is_v) * PlaneBytes();
  }
};

// The rows of one (layer, KV head) of one sequence, with the layer's block table looked up
// once: slot s lives in block block_table[s / block_tokens] at row s % block_tokens. The
// view the attention kernels walk.
struct PagedKvHead {
  uint8_t* base = nullptr;               // pool + PlaneOffset(head, 0)
  const int32_t* block_table = nullptr;  // the layer's block ids
  int64_t block_bytes = 0;
  int64_t plane_bytes = 0;
  int block_tokens = 0;
  int head_dim = 0;
  KvDType dtype = KvDType::kF32;

  int64_t row_bytes() const { return static_cast<int64_t>(head_dim) * KvElemBytes(dtype); }
  int64_t scale_bytes() const {
    return dtype == KvDType::kInt8 ? static_cast<int64_t>(block_tokens) * 4 : 0;
  }
  // The plane (scales, then rows) holding the K (is_v = 0) or V (is_v = 1) row of `slot`.
  uint8_t* Plane(int is_v, int slot) const {
    return base + static_cast<int64_t>(block_table[slot / block_tokens]) * block_bytes +
           static_cast<int64_t>(is_v) * plane_bytes;
  }
  // The elements of the row, in `dtype`.
  uint8_t* RowData(int is_v, int slot) const {
    return Plane(is_v, slot) + scale_bytes() + (slot % block_tokens) * row_bytes();
  }
  // The row's scale (kInt8 only).
  float* RowScale(int is_v, int slot) const {
    return reinterpret_cast<float*>(Plane(is_v, slot)) + slot % block_tokens;
  }
  // The row as floats. REQUIRES: dtype == kF32 (other types: kernels/kv_rows.h).
  float* Row(int is_v, int slot) const { return reinterpret_cast<float*>(RowData(is_v, slot)); }
  float* K(int slot) const { return Row(0, slot); }
  float* V(int slot) const { return Row(1, slot); }
};

// One sequence's view of the pool: layer l has block_counts[l] blocks, listed in
// block_tables[l]; slot s of (l, head) lives in block block_tables[l][s / block_tokens].
struct PagedKv {
  PagedKvLayout layout;
  void* pool = nullptr;                          // base of the block pool
  const int32_t* const* block_tables = nullptr;  // [n_layers] -> [block_counts[l]] block ids
  const int32_t* block_counts = nullptr;         // [n_layers]

  PagedKvHead Head(int layer, int head) const {
    return PagedKvHead{static_cast<uint8_t*>(pool) + layout.PlaneOffset(head, 0),
                       block_tables[layer],
                       layout.BlockBytes(),
                       layout.PlaneBytes(),
                       layout.block_tokens,
                       layout.head_dim,
                       layout.dtype};
  }
  // Slots layer `layer` has room for.
  int capacity(int layer) const { return block_counts[layer] * layout.block_tokens; }
  // f32 rows (REQUIRES: layout.dtype == kF32).
  float* Row(int layer, int head, int is_v, int slot) const {
    return Head(layer, head).Row(is_v, slot);
  }
  float* K(int layer, int head, int slot) const { return Row(layer, head, 0, slot); }
  float* V(int layer, int head, int slot) const { return Row(layer, head, 1, slot); }
};

}  // namespace recall::kernels
