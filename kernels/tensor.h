// Plain data types shared by every backend: element types, read-only weight matrices and
// the paged KV layout. No ownership here: these are views over memory someone else owns.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace recall::kernels {

enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

inline size_t DTypeSize(DType t) { return t == DType::kF32 ? 4 : 2; }
inline const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
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

  bool empty() const { return data == nullptr; }
  int64_t numel() const { return rows * cols; }
  size_t bytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype); }
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

// RoPE's frequency of pair i: theta^(-2i / head_dim), as every Rope computes it.
RECALL_HOST_DEVICE inline float RopeFreq(float theta, int i, int head_dim) {
  return 1.0f / powf(theta, static_cast<float>(2 * i) / static_cast<float>(head_dim));
}

// How a paged KV block is laid out. A block holds `block_tokens` token slots of ONE layer,
// for every KV head of this rank, K and V, in fp32:
//   block[kv_head][0 = K, 1 = V][slot_in_block][head_dim]
// so the K (or V) rows of one head inside one block are contiguous. Every layer of a
// sequence has its own block table (PagedKv::block_tables), so each layer holds as many
// blocks as its own longest KV head needs. n_layers is the number of those tables.
struct PagedKvLayout {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int block_tokens = 16;

  int64_t BlockFloats() const {
    return static_cast<int64_t>(n_kv_heads) * 2 * block_tokens * head_dim;
  }
  // Offset in floats, inside a block, of the K row (is_v = 0) or V row (is_v = 1).
  int64_t Offset(int head, int is_v, int slot_in_block) const {
    return ((static_cast<int64_t>(head) * 2 + is_v) * block_tokens + slot_in_block) * head_dim;
  }
};

// The rows of one (layer, KV head) of one sequence, with the layer's block table looked up
// once: slot s lives in block block_table[s / block_tokens] at row s % block_tokens. The
// view the attention kernels walk.
struct PagedKvHead {
  float* base = nullptr;                 // pool + Offset(head, 0, 0)
  const int32_t* block_table = nullptr;  // the layer's block ids
  int64_t block_floats = 0;
  int block_tokens = 0;
  int head_dim = 0;

  // The K (is_v = 0) or V (is_v = 1) row of slot `slot`.
  float* Row(int is_v, int slot) const {
    return base + static_cast<int64_t>(block_table[slot / block_tokens]) * block_floats +
           (static_cast<int64_t>(is_v) * block_tokens + slot % block_tokens) * head_dim;
  }
  float* K(int slot) const { return Row(0, slot); }
  float* V(int slot) const { return Row(1, slot); }
};

// One sequence's view of the pool: layer l has block_counts[l] blocks, listed in
// block_tables[l]; slot s of (l, head) lives in block block_tables[l][s / block_tokens].
struct PagedKv {
  PagedKvLayout layout;
  float* pool = nullptr;                         // base of the block pool
  const int32_t* const* block_tables = nullptr;  // [n_layers] -> [block_counts[l]] block ids
  const int32_t* block_counts = nullptr;         // [n_layers]

  PagedKvHead Head(int layer, int head) const {
    return PagedKvHead{pool + layout.Offset(head, 0, 0), block_tables[layer], layout.BlockFloats(),
                       layout.block_tokens, layout.head_dim};
  }
  // Slots layer `layer` has room for.
  int capacity(int layer) const { return block_counts[layer] * layout.block_tokens; }
  float* Row(int layer, int head, int is_v, int slot) const {
    return Head(layer, head).Row(is_v, slot);
  }
  float* K(int layer, int head, int slot) const { return Row(layer, head, 0, slot); }
  float* V(int layer, int head, int slot) const { return Row(layer, head, 1, slot); }
};

}  // namespace recall::kernels
