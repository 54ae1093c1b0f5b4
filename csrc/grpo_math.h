// Vectorisable exponentials and the softmax row's gradient shared by the CPU kernels (grpo_ops.cc, grpo_attention.cc),
// and the bf16 conversion of the bf16 weight copies (grpo_bf16.cc), the fused engine's bf16 KV cache (grpo_ops.cc) and
// the attention's bf16 operands.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace grpo {

// exp for x <= 0 (arguments are max-subtracted logits), vectorisable under `omp simd`: Cephes
// range reduction to 2^n * e^r with |r| <= ln2/2 and a degree-6 polynomial, relative error ~2e-7,
// about 0.5 ns an element on the build machine.
// Returns exactly 0 for x < -87 (and -inf), where expf underflows anyway.
#pragma omp declare simd
inline float exp_nonpos(float x) {
  const float xc = x < -87.0f ? -87.0f : x;
  // n = round(x / ln2) by the 1.5 * 2^23 trick, which vectorises where std::floor does not (8x here).
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t e = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &e, sizeof(scale));
  return x < -87.0f ? 0.0f : p * scale;
}

// x[i] = exp(x[i] - mx) in place for the n values of one softmax row, mx their max -> the sum.
inline float exp_shifted_sum(float* x, int64_t n, float mx) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) {
    x[i] = exp_nonpos(x[i] - mx);
    sum += x[i];
  }
  return sum;
}

// One softmax row's gradient: p the weights, dp the gradient of the loss by them (n each) -> out = scale p (dp -
// sum(p dp)), the gradient by the scaled scores. out may be dp itself (each element is read before it is written).
inline void softmax_grad_row(const float* p, const float* dp, float* out, int64_t n, float scale) {
  float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
  for (int64_t j = 0; j < n; ++j) dot += p[j] * dp[j];
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) out[j] = scale * p[j] * (dp[j] - dot);
}

// float32 -> bfloat16 bits, rounded to nearest even; float32 subnormals become a signed zero (as AVX512-BF16's
// conversion does, so every element converts alike wherever it is converted) and NaN stays a (quiet) NaN. Without
// branches, so that loops of it vectorise under `omp simd`.
#pragma omp declare simd
inline uint16_t bf16_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;  // to nearest, ties to even
  const uint32_t quiet_nan = (bits >> 16) | 0x40u, signed_zero = (bits >> 16) & 0x8000u;
  const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u, subnormal = (bits & 0x7F800000u) == 0;
  return static_cast<uint16_t>(nan ? quiet_nan : subnormal ? signed_zero : rounded);
}

inline float bf16_float(uint16_t bits) {
  const uint32_t widened = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &widened, sizeof value);
  return value;
}

// x rounded to the nearest bf16 value, as a float (the fused engine's attention rounds every weight of a query with it).
#pragma omp declare simd
inline float bf16_round(float x) { return bf16_float(bf16_bits(x)); }

// sigmoid from the exp of a non-positive argument, so the loops over it vectorise: e = exp(-|a|).
#pragma omp declare simd
inline float sigmoid(float a) {
  const float e = exp_nonpos(-std::fabs(a));
  return (a >= 0.0f ? 1.0f : e) / (1.0f + e);
}

// SwiGLU over one row of n gates a and their up-projections u: store(i, silu(a_i) u_i), silu(a) = a sigmoid(a).
// grpo_silu_mul stores float32, grpo_bf16_mlp the bf16 bits its next product reads: one expression for both, so
// that the two give the same values.
template <typename Store>
inline void silu_mul_row(const float* a, const float* u, int64_t n, Store store) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) store(i, a[i] * sigmoid(a[i]) * u[i]);
}

// Its gradient from dy (n): with s = sigmoid(a), d silu(a) / da = s (1 + a (1 - s)), so store(i, da_i, du_i) with
// da = dy u s (1 + a (1 - s)) and du = dy a s.
template <typename Store>
inline void silu_mul_grad_row(const float* a, const float* u, const float* dy, int64_t n, Store store) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float sg = sigmoid(a[i]);
    const float dys = dy[i] * sg;
    store(i, dys * u[i] * (1.0f + a[i] * (1.0f - sg)), dys * a[i]);
  }
}

}  // namespace grpo
