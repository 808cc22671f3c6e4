// The int8 kernels behind GemvInt8 (kernels/cpu/int8.h), one per instruction set; internal to
// kernels/cpu. Each takes the activations already quantized (qx [n, stride], scales sx [n])
// and writes y [n, w.rows] with the same formula, so every kernel gives the same bits.
#pragma once

#include <cstdint>

#include "kernels/cpu/thread_pool.h"
#include "kernels/tensor.h"

namespace recall::kernels::cpu::int8_internal {

// Whether this CPU runs the AVX-512 VNNI kernels (checked once, at run time).
bool CpuHasVnni();

// AVX-512 VNNI, weights read in place: each thread takes rows and runs every input against
// them (the horizontal sums make it the decode kernel). xu: qx + 128 as bytes, stride w.cols.
void VnniRows(ThreadPool& pool, const uint8_t* xu, const float* sx, int n, const Matrix& w,
              float* y);

// AVX-512 VNNI for many inputs (prefill): each thread packs 32 weight rows into a panel of
// 4-byte column groups, 16 rows per vector, and runs 12 inputs at a time against it, so one
// weight load feeds 12 vpdpbusd and no horizontal sum is needed. xu: qx + 128 as bytes, stride
// `stride` >= w.cols rounded up to 4 (the bytes past w.cols are read and meet zero weights).
void VnniPanels(ThreadPool& pool, const uint8_t* xu, int64_t stride, const float* sx, int n,
                const Matrix& w, float* y);

// Plain loops (any CPU). qx: stride w.cols.
void GenericRows(ThreadPool& pool, const int8_t* qx, const float* sx, int n, const Matrix& w,
                 float* y);

}  // namespace recall::kernels::cpu::int8_internal
