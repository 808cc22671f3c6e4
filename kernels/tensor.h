// Plain data types shared by every backend: element types, read-only weight matrices and
// the paged KV layout. No ownership here: these are views over memory someone else owns.
#pragma once

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

enum class RopeStyle : uint8_t {
  kInterleaved = 0,  // llama2.c / Meta: rotate pairs (2i, 2i+1)
  kHalfSplit = 1,    // Hugging Face Llama: rotate pairs (i, i + head_dim/2)
};

// How a paged KV block is laid out. A block holds `block_tokens` token slots for every layer
// and every KV head of this rank, K and V, in fp32:
//   block[layer][kv_head][0 = K, 1 = V][slot_in_block][head_dim]
// so the K (or V) rows of one (layer, head) inside one block are contiguous.
struct PagedKvLayout {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int block_tokens = 16;

  int64_t BlockFloats() const {
    return static_cast<int64_t>(n_layers) * n_kv_heads * 2 * block_tokens * head_dim;
  }
  // Offset in floats, inside a block, of the K row (is_v = 0) or V row (is_v = 1).
  int64_t Offset(int layer, int head, int is_v, int slot_in_block) const {
    return (((static_cast<int64_t>(layer) * n_kv_heads + head) * 2 + is_v) * block_tokens +
            slot_in_block) *
           head_dim;
  }
};

// One sequence's view of the pool: slot s of (layer, head) lives in block
// block_table[s / block_tokens] at row s % block_tokens.
struct PagedKv {
  PagedKvLayout layout;
  float* pool = nullptr;                 // base of the block pool
  const int32_t* block_table = nullptr;  // [num_blocks] block ids
  int num_blocks = 0;

  float* Row(int layer, int head, int is_v, int slot) const {
    const int b = slot / layout.block_tokens;
    return pool + static_cast<int64_t>(block_table[b]) * layout.BlockFloats() +
           layout.Offset(layer, head, is_v, slot % layout.block_tokens);
  }
  float* K(int layer, int head, int slot) const { return Row(layer, head, 0, slot); }
  float* V(int layer, int head, int slot) const { return Row(layer, head, 1, slot); }
};

}  // namespace recall::kernels
