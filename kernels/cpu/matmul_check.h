// CheckMatMul: a quick check, run when a backend is created, of the ops a GPU backend runs
// through its own kernels on the decode path: MatMul of up to BatchInvariantRows() rows
// (within 1e-5 of the host reference for f32, bf16 and f16 weights, aligned and unaligned
// shapes; every row bit-identical whatever the row count), MatMulMany (each matrix the bits
// of its own MatMul) and AddRmsNorm (the bits of Add then RmsNorm). A backend whose kernels
// have never run on its hardware can then fall back to its vendor library and plain ops (the
// CUDA backend does) instead of computing wrong logits.
#pragma once

#include "absl/status/status.h"
#include "kernels/backend.h"

namespace recall::kernels {

// OK, or InternalError naming the op, the shape and what differs (or the backend's own
// error). Allocates a few MB of the backend's memory for the duration of the call.
absl::Status CheckMatMul(Backend& backend);

// Int8 weights (kernels/cpu/int8.h): MatMul of up to BatchInvariantRows() rows within 3e-2 of
// the f32 product with the dequantized weights (relative to each output row's largest value:
// the CPU quantizes the activations too, a GPU widens the weights only), every row
// bit-identical whatever the row count, and Embedding of an int8 table exactly q * scale.
// Catches a wrong layout, scale or offset, not rounding.
absl::Status CheckInt8MatMul(Backend& backend);

// FP8 weights (DType::kF8E4M3 with block scales; a backend whose RunsFp8Weights() is true):
// MatMul of up to BatchInvariantRows() rows within 1e-4 of the f32 product with the widened
// weights (e4m3 * scale, exact in f32: only the order of the sums may differ), blocks of 128
// and 16 columns over aligned and unaligned widths, every row bit-identical whatever the row
// count, and MatMulMany of two FP8 matrices with different blocks the bits of their own MatMul.
absl::Status CheckFp8MatMul(Backend& backend);

// FP8 weights over many rows (200, past any batch-invariant piece; a GPU backend may quantize
// the activations to E4M3 there, kernels/cuda/fp8_gemm.h): every output within 0.07 of
// sum |x_k w_k| of the f32 product with the widened weights, over weights and activations
// whose magnitudes differ by up to 2^12 between neighbouring rows and 128-column blocks (a
// scale read from the wrong row or block fails). OK at once when !RunsFp8Weights().
absl::Status CheckFp8ManyRows(Backend& backend);

}  // namespace recall::kernels
