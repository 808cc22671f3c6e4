// The scalar fp32 <-> f16 / bf16 conversions (kernels/half.h), under the names the model
// loaders use.
#pragma once

#include "kernels/half.h"

namespace recall::model {

using kernels::Bf16ToF32;
using kernels::BitsFloat;
using kernels::F16ToF32;
using kernels::F32ToBf16;
using kernels::F32ToF16;
using kernels::FloatBits;
using kernels::LoadAsF32;

}  // namespace recall::model
