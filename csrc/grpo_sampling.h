// The sampling definition shared by the CPU kernel (sample_rows below, which grpo_sample runs on CPU tensors) and
// the CUDA kernel (grpo_kernels.cuh): the same token for the same logits, seed, step and row key on every device,
// thread count and batch. Paddle-free, so the GPU harness (csrc/gpu_harness) compiles the CPU kernel too.
//
// One row, in this order (the filters are those of Hugging Face's warpers):
//   1. w = logit / repetition_penalty (present and > 0) or * repetition_penalty (present and <= 0), then * (1 / t);
//      eos ids are -inf before min_new_tokens. Greedy: the first index of the largest w.
//   2. top_k: every w below the k-th largest is removed (ties with it are kept; -0.0 equals +0.0).
//   3. top_p: tokens ranked by w descending, lower index first among equal w; rank r is kept while the mass ranked
//      above it is below top_p * the total mass (rank 0 always).
//   4. min_p: tokens with exp(w - max) below min_p are removed.
//   5. The draw: the first token, in index order, whose running mass exceeds floor(u * total), u = uniform_draw.
// Mass is exact: exp(w - max) in float by one fixed sequence of fused multiply-adds (sampling_exp), rounded to a
// multiple of 2^-40 (sampling_mass), and summed as 64-bit integers, so no order of additions changes a decision
// (tokens below 2^-41 of the top token's weight have no mass). The comparisons with top_p and u are made in double
// by the same operations on both devices.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#if defined(__CUDACC__)
#define GRPO_HD __host__ __device__
#else
#define GRPO_HD
#endif

namespace grpo {

// std::max(mx, x) (a NaN x leaves mx) in the form GCC 12 vectorises: a loop under `omp simd reduction(max : mx)` over
// std::max compiled to one scalar vmaxss a value (the training attention's softmax spent half its time there). The
// CPU kernels' max reductions all go through it; it lives here, not in grpo_math.h, because the CUDA build includes this
// header.
GRPO_HD inline float larger(float mx, float x) { return mx < x ? x : mx; }

// splitmix64: the counter-based generator behind sampling. The same (seed, step, row key) gives the same draw on
// every machine, thread count and device; the row key is the row's index in the global batch (grpo_sample's
// row_keys), so a row draws the same tokens whichever process, batch or compacted position it is in.
GRPO_HD inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Uniform double in [0, 1) for row `row` of decode step `step` under `seed`.
GRPO_HD inline double uniform_draw(int64_t seed, int64_t step, int64_t row) {
  uint64_t key = splitmix64(static_cast<uint64_t>(seed));
  key = splitmix64(key ^ (static_cast<uint64_t>(step) * 0xD1B54A32D192ED03ULL));
  const uint64_t x = splitmix64(key ^ (static_cast<uint64_t>(row) * 0x8CB92BA72F3D8DD7ULL));
  return static_cast<double>(x >> 11) * (1.0 / 9007199254740992.0);  // 53 random bits
}

// Masses are multiples of 2^-40 of the top token's weight; V of them fit in 63 bits while V <= 2^23.
constexpr int64_t kMaxSampleVocab = int64_t{1} << 23;
constexpr double kMassScale = 1099511627776.0;  // 2^40

// Float arithmetic that no compiler may contract or reorder (host compilers contract a * b + c into an fma under
// -ffp-contract=fast, nvcc by default): every step of the definition is spelled out.
GRPO_HD inline float fma_exact(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
GRPO_HD inline float mul_exact(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;  // on the host nothing in the definition adds to a product, so there is nothing to fuse
#endif
}
GRPO_HD inline float div_exact(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
GRPO_HD inline float sub_exact(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

// Step 1 for one token.
GRPO_HD inline float shaped_logit(float x, bool present, float repetition_penalty, float inv_t) {
  if (present && repetition_penalty != 1.0f)
    x = x > 0.0f ? div_exact(x, repetition_penalty) : mul_exact(x, repetition_penalty);
  return mul_exact(x, inv_t);
}

// exp(d) for d = w - max <= 0: Cephes' reduction to 2^n e^r and degree-6 polynomial (relative error ~2e-7), every
// multiply-add fused. 0 below -87 (and for -inf and NaN). Written as a clamp and a select so that it vectorises.
GRPO_HD inline float sampling_exp(float d) {
  const bool in_range = d >= -87.0f;
  const float x = in_range ? d : -87.0f;
  const float n = fma_exact(x, 1.44269504088896341f, 12582912.0f) - 12582912.0f;  // round(x / ln 2)
  const float r = fma_exact(n, 2.12194440e-4f, fma_exact(-n, 0.693359375f, x));
  float p = 1.9875691500e-4f;
  p = fma_exact(p, r, 1.3981999507e-3f);
  p = fma_exact(p, r, 8.3334519073e-3f);
  p = fma_exact(p, r, 4.1665795894e-2f);
  p = fma_exact(p, r, 1.6666665459e-1f);
  p = fma_exact(p, r, 5.0000001201e-1f);
  const float y = fma_exact(mul_exact(p, r), r, r) + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n, n in [-126, 0]
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return in_range ? mul_exact(y, scale) : 0.0f;
}

// The mass of a token: round(exp(d) * 2^40), halves up. On the GPU in double: d's exp times 2^40 is exact, and adding
// 0.5 rounds only below 2^-30, where the result truncates to 0 either way. On the CPU the same integer from float and
// int32 steps that vectorise without AVX-512 (x = hi 2^20 + rem exactly, rem = ri + frac exactly).
GRPO_HD inline uint64_t sampling_mass(float d) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__dadd_rn(__dmul_rn(static_cast<double>(sampling_exp(d)), kMassScale), 0.5));
#else
  const float x = sampling_exp(d) * 1099511627776.0f;  // * 2^40, exact
  const int32_t hi = static_cast<int32_t>(x * 9.5367431640625e-07f);  // trunc(x / 2^20) <= 2^20
  const float rem = x - static_cast<float>(hi) * 1048576.0f;           // exact, in [0, 2^20)
  const int32_t ri = static_cast<int32_t>(rem);
  const int32_t lo = ri + (rem - static_cast<float>(ri) >= 0.5f ? 1 : 0);
  return (static_cast<uint64_t>(hi) << 20) + static_cast<uint64_t>(lo);
#endif
}

// Order-preserving map of floats to unsigned keys (larger float -> larger key), -0.0 taken as +0.0.
GRPO_HD inline uint32_t sort_key(float w) {
  if (w == 0.0f) w = 0.0f;
  uint32_t u;
  std::memcpy(&u, &w, sizeof(u));
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Step 3's test: the mass ranked above a token has reached top_p of the total.
GRPO_HD inline bool past_nucleus(uint64_t above, uint64_t total, float top_p) {
  return static_cast<double>(above) >= static_cast<double>(top_p) * static_cast<double>(total);
}

// Step 5's target in [0, total).
GRPO_HD inline uint64_t draw_target(double u, uint64_t total) {
  const uint64_t target = static_cast<uint64_t>(u * static_cast<double>(total));
  return target < total ? target : total - 1;
}

struct SampleSettings {
  int64_t seed;
  int step, min_new_tokens;
  float temperature;
  int top_k;
  float top_p, min_p, repetition_penalty;
  bool greedy;
};

// The CPU kernel of one row: the token, and whether it was drawn from softmax(raw / t) itself (then `total` is that
// softmax's normaliser times 2^40 and `mx` its max, which the log-prob reuses).
struct RowDraw {
  int64_t token;
  bool unshaped;
  float mx;
  uint64_t total;
};

// Per-thread scratch: (V,) shaped logits, (V,) masses, (V,) candidate indices, block sums of the masses.
struct SampleScratch {
  std::vector<float> w, tmp;
  std::vector<uint64_t> mass, block;
  std::vector<int32_t> idx;
};

constexpr int64_t kSampleBlock = 1024;

inline int64_t first_argmax(const float* w, int64_t V) {
  int64_t best = 0;
  for (int64_t v = 1; v < V; ++v)
    if (w[v] > w[best]) best = v;  // strict: the first index among equal maxima
  return best;
}

// Step 3 on the CPU: a growing prefix of the candidates is sorted until the kept set closes (the nucleus is usually
// a few hundred tokens out of V).
inline void cut_nucleus(float* w, float mx, int64_t V, float top_p, bool sort_all, int32_t* idx) {
  uint64_t total = 0;
#pragma omp simd reduction(+ : total)
  for (int64_t v = 0; v < V; ++v) total += sampling_mass(sub_exact(w[v], mx));
  int64_t n = 0;
  for (int64_t v = 0; v < V; ++v)
    if (w[v] != -std::numeric_limits<float>::infinity()) idx[n++] = static_cast<int32_t>(v);
  const auto by_rank = [w](int32_t a, int32_t b) { return w[a] > w[b] || (w[a] == w[b] && a < b); };
  int64_t m = sort_all ? n : std::min<int64_t>(n, 512), cut = n;
  for (;;) {
    std::partial_sort(idx, idx + m, idx + n, by_rank);
    uint64_t above = 0;  // mass ranked strictly above rank r
    int64_t r = 0;
    for (; r < m; ++r) {
      if (r > 0 && past_nucleus(above, total, top_p)) break;
      above += sampling_mass(sub_exact(w[idx[r]], mx));
    }
    if (r < m || m == n) {
      cut = r;
      break;
    }
    m = std::min<int64_t>(n, m * 8);
  }
  for (int64_t r = cut; r < n; ++r) w[idx[r]] = -std::numeric_limits<float>::infinity();
}

// Step 5 on the CPU: block sums first, then one block.
inline int64_t draw_token(const float* w, float mx, int64_t V, double u, uint64_t* mass, uint64_t* block,
                          uint64_t* total_out) {
  uint64_t total = 0;
  for (int64_t k = 0, lo = 0; lo < V; ++k, lo += kSampleBlock) {
    const int64_t hi = std::min(V, lo + kSampleBlock);
    uint64_t sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t v = lo; v < hi; ++v) {
      mass[v] = sampling_mass(sub_exact(w[v], mx));
      sum += mass[v];
    }
    block[k] = sum;
    total += sum;
  }
  *total_out = total;
  const uint64_t target = draw_target(u, total);
  uint64_t cum = 0;
  int64_t lo = 0, k = 0;
  for (; cum + block[k] <= target; ++k, lo += kSampleBlock) cum += block[k];
  for (int64_t v = lo;; ++v) {
    cum += mass[v];
    if (cum > target) return v;
  }
}

inline RowDraw sample_row(const float* raw, const uint8_t* pres, const int64_t* eos, int64_t E, int64_t V,
                          const SampleSettings& s, int64_t row_key, SampleScratch& scratch) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float* w = scratch.w.data();
  const float inv_t = s.greedy ? 1.0f : div_exact(1.0f, s.temperature);
  if (s.repetition_penalty != 1.0f) {
#pragma omp simd
    for (int64_t v = 0; v < V; ++v) w[v] = shaped_logit(raw[v], pres[v] != 0, s.repetition_penalty, inv_t);
  } else {
#pragma omp simd
    for (int64_t v = 0; v < V; ++v) w[v] = mul_exact(raw[v], inv_t);
  }
  const bool eos_blocked = s.step < s.min_new_tokens && E > 0;
  if (eos_blocked)
    for (int64_t e = 0; e < E; ++e) w[eos[e]] = kNegInf;
  if (s.greedy) return {first_argmax(w, V), false, 0.0f, 0};

  const bool use_top_k = s.top_k > 0 && s.top_k < V;
  if (use_top_k) {
    float* tmp = scratch.tmp.data();
    std::memcpy(tmp, w, V * sizeof(float));
    std::nth_element(tmp, tmp + (s.top_k - 1), tmp + V, std::greater<float>());
    const float kth = tmp[s.top_k - 1];
#pragma omp simd
    for (int64_t v = 0; v < V; ++v)
      if (w[v] < kth) w[v] = kNegInf;
  }
  float mx = kNegInf;
#pragma omp simd reduction(max : mx)
  for (int64_t v = 0; v < V; ++v) mx = larger(mx, w[v]);
  if (mx == kNegInf) return {0, false, 0.0f, 0};  // every token blocked: the first (greedy's rule)
  if (s.top_p < 1.0f) cut_nucleus(w, mx, V, s.top_p, use_top_k, scratch.idx.data());
  if (s.min_p > 0.0f)
#pragma omp simd
    for (int64_t v = 0; v < V; ++v)
      if (sampling_exp(sub_exact(w[v], mx)) < s.min_p) w[v] = kNegInf;
  uint64_t total = 0;
  const int64_t token = draw_token(w, mx, V, uniform_draw(s.seed, s.step, row_key), scratch.mass.data(),
                                   scratch.block.data(), &total);
  const bool unshaped = s.repetition_penalty == 1.0f && !eos_blocked && !use_top_k && s.top_p >= 1.0f &&
                        s.min_p <= 0.0f;
  return {token, unshaped, mx, total};
}

// grpo_sample's CPU kernel over B rows (inputs already validated): tokens and log_softmax(raw / t)[token], the
// policy's log-prob without any shaping (t = 1 when greedy).
inline void sample_rows(const float* logits, const uint8_t* presence, const int64_t* eos, int64_t E, int64_t B,
                        int64_t V, const int64_t* row_keys, const SampleSettings& s, int64_t* tokens,
                        float* logprobs) {
  const float inv_t = s.greedy ? 1.0f : div_exact(1.0f, s.temperature);
#pragma omp parallel
  {
    thread_local SampleScratch scratch;
    if (static_cast<int64_t>(scratch.w.size()) < V) {
      scratch.w.resize(V), scratch.tmp.resize(V), scratch.mass.resize(V), scratch.idx.resize(V);
      scratch.block.resize((V + kSampleBlock - 1) / kSampleBlock);
    }
#pragma omp for schedule(static)  // not dynamic: see csrc/build.py's missing_openmp_entry_points
    for (int64_t b = 0; b < B; ++b) {
      const float* raw = logits + b * V;
      const RowDraw draw = sample_row(raw, presence + b * V, eos, E, V, s, row_keys[b], scratch);
      tokens[b] = draw.token;
      float mx = draw.mx;
      double z = static_cast<double>(draw.total) / kMassScale;
      if (!draw.unshaped) {  // float sums within blocks, double across
        mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
        for (int64_t v = 0; v < V; ++v) mx = larger(mx, mul_exact(raw[v], inv_t));
        z = 0.0;
        for (int64_t lo = 0; lo < V; lo += kSampleBlock) {
          const int64_t hi = std::min(V, lo + kSampleBlock);
          float zf = 0.0f;
#pragma omp simd reduction(+ : zf)
          for (int64_t v = lo; v < hi; ++v) zf += sampling_exp(sub_exact(mul_exact(raw[v], inv_t), mx));
          z += zf;
        }
      }
      logprobs[b] = static_cast<float>(static_cast<double>(sub_exact(mul_exact(raw[draw.token], inv_t), mx)) -
                                       std::log(z));
    }
  }
}

}  // namespace grpo
