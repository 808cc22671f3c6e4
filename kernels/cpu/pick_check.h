// CheckPicks: a quick check, run when a backend is created, that its token picks
// (Backend::ArgmaxRows and Backend::SampleRows) agree with the host reference
// (cpu::ArgMax, cpu::Sampler::Pick) on rows built so that every answer lies far from any float
// rounding boundary: equal maxima, dominant tokens spread over a 4099-token row, temperature,
// top-k, top-p and draws at the middle of their tokens' intervals. A backend whose pick
// kernels have never run on its hardware can then fall back to picking on the host instead
// of sampling wrong tokens (the CUDA backend does).
#pragma once

#include "absl/status/status.h"
#include "kernels/backend.h"

namespace recall::kernels {

// OK, or InternalError naming the first row where the backend's pick differs from the
// reference's (or the backend's own error). Allocates a few small buffers in the backend's
// memory for the duration of the call.
absl::Status CheckPicks(Backend& backend);

}  // namespace recall::kernels
