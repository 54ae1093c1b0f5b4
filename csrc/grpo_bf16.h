// Shared by the bf16 operators: grpo_bf16.cc (dnnl_gemm_bf16bf16f32) and grpo_dnnl_matmul.cc (oneDNN's matmul
// primitive on prepacked weights). Defined in grpo_bf16.cc; both files build only with GRPO_WITH_DNNL.
#pragma once

#include "paddle/extension.h"

namespace grpo {

// t must be a CPU tensor of float32, or of bfloat16 where bf16_allowed; op and name go into the error.
void check_bf16_input(const paddle::Tensor& t, const char* op, const char* name, bool bf16_allowed);

// A dense bf16 view of t: t itself when it is bf16 already, else a converted copy (round to nearest even, float32
// subnormals to zero, NaN stays NaN).
paddle::Tensor as_bf16(const paddle::Tensor& t);

}  // namespace grpo
