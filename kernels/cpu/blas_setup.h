// One-time OpenBLAS setup for the CPU backend.
//
// Debian's OpenBLAS is a DYNAMIC_ARCH build that picks its kernels from the CPU model at
// load time. A CPU newer than the library (e.g. Emerald Rapids, family 6 model 0xCF, with
// OpenBLAS 0.3.21) is not recognised and falls back to the SSE3 "Prescott" kernels: ~7x
// slower sgemm. When OPENBLAS_CORETYPE is not set and the selected core lacks AVX2 although
// the CPU has it, ConfigureBlas re-selects the kernels for the CPU's real instruction set
// (SkylakeX for AVX-512, Haswell for AVX2) through OpenBLAS's exported
// gotoblas_dynamic_quit / gotoblas_dynamic_init, the same path that reads
// OPENBLAS_CORETYPE at load time. With a non-dynamic OpenBLAS those symbols are absent
// (weak references) and nothing is changed.
#pragma once

#include <string>

namespace recall::kernels::cpu {

// Once per process: repairs a fallback core selection as described above, and makes
// OpenBLAS single-threaded (process wide): the CPU backend splits each product across its
// own thread pool instead, so OpenBLAS's workers never spin (sched_yield) against it.
// REQUIRES: no BLAS call in flight on another thread.
void ConfigureBlas();

// The OpenBLAS kernel set in use, e.g. "SkylakeX" (for logs and benchmarks).
std::string BlasCoreName();

}  // namespace recall::kernels::cpu
