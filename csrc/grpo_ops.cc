// Fused operators of the rollout engine (alignment/rollout): RMSNorm with the residual add, rotary
// embedding fused with the KV-cache write, attention over the static cache, SwiGLU, sampling with
// logit shaping, stop bookkeeping and in-place row compaction of the cache. And the training
// operators of the actor's forward and backward (alignment/fused_train.py, 8-10, 13 and 14 below, and
// grpo_silu_mul's backward), and of its log-prob head (11-12, alignment/algo.py).
//
// CPU kernels are float32, OpenMP-parallel over rows/heads, with vectorisable inner loops. Every op
// validates its inputs here; tensors on a GPU then go to the launchers of grpo_ops.cu (the training
// operators have CPU kernels only).
//
// Cache layout used by all attention ops: [L, 2, Bcap, S, KVH, D], one buffer for every layer;
// cache[layer, 0] holds rotated keys and cache[layer, 1] values; slot s of row b holds token s. On the CPU the cache
// may be bfloat16 (the fused engine's with bf16 matmuls): keys and values are computed in float32, rounded to bf16
// when written and widened back when read, which halves what a decode step reads from memory.

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "grpo_math.h"
#include "grpo_ops.h"

namespace {

using grpo::dense;
using grpo::shape_str;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void check_place(const paddle::Tensor& t, const paddle::Tensor& ref, const char* op, const char* name) {
  PD_CHECK(t.place() == ref.place(), op, ": input ", name, " is on ", t.place().DebugString(),
           " but the other inputs are on ", ref.place().DebugString());
}

void check_dtype(const paddle::Tensor& t, paddle::DataType dtype, const char* op, const char* name) {
  PD_CHECK(t.dtype() == dtype, op, ": input ", name, " must be ", phi::DataTypeToString(dtype), ", got ",
           phi::DataTypeToString(t.dtype()), " with shape ", shape_str(t.shape()));
}

bool on_gpu(const paddle::Tensor& t, const char* op) {
  if (t.is_cpu()) return false;
  PD_CHECK(t.is_gpu(), op, ": only CPU and GPU tensors are supported, got ", t.place().DebugString());
#ifndef GRPO_WITH_CUDA
  PD_THROW(op, ": got GPU tensors but the ops were built without CUDA (rerun `make ops` with paddlepaddle-gpu)");
#endif
  return true;
}

// The training operators (8-10, 13 and the backward of 4) have CPU kernels only: on a GPU, paddle's own
// fused kernels serve training.
void cpu_only(const paddle::Tensor& t, const char* op) {
  PD_CHECK(t.is_cpu(), op, ": CPU kernels only (a training operator), got a tensor on ", t.place().DebugString());
}


using grpo::exp_nonpos;
using grpo::exp_shifted_sum;

// ---------------------------------------------------------------------------------------------
// 1. grpo_add_rms_norm

// 1 / sqrt(mean(h^2) + eps) of one row h (hd,).
inline float rms_inverse(const float* h, int64_t hd, float eps) {
  float sumsq = 0.0f;
#pragma omp simd reduction(+ : sumsq)
  for (int64_t j = 0; j < hd; ++j) sumsq += h[j] * h[j];
  return 1.0f / std::sqrt(sumsq / static_cast<float>(hd) + eps);
}

// out = weight * (h * inv), in the order of Qwen2RMSNorm: rsqrt(mean(h^2) + eps) * h, then weight * that.
inline void rms_norm_row(const float* h, const float* w, float* out, int64_t hd, float eps) {
  const float inv = rms_inverse(h, hd, eps);
#pragma omp simd
  for (int64_t j = 0; j < hd; ++j) out[j] = w[j] * (h[j] * inv);
}

std::vector<paddle::Tensor> AddRmsNorm(const paddle::Tensor& x_in, const paddle::optional<paddle::Tensor>& residual_in,
                                       const paddle::Tensor& weight_in, float eps) {
  const char* op = "grpo_add_rms_norm";
  check_dtype(x_in, paddle::DataType::FLOAT32, op, "x");
  check_dtype(weight_in, paddle::DataType::FLOAT32, op, "weight");
  check_place(weight_in, x_in, op, "weight");
  const auto shape = x_in.shape();
  PD_CHECK(shape.size() >= 2, op, ": x must have rank >= 2 ([..., Hd]), got ", shape_str(shape));
  const int64_t hd = shape.back();
  PD_CHECK(weight_in.shape() == std::vector<int64_t>{hd}, op, ": weight must be [Hd] = [", hd, "], got ",
           shape_str(weight_in.shape()), " for x ", shape_str(shape));
  if (residual_in) {
    check_dtype(*residual_in, paddle::DataType::FLOAT32, op, "residual");
    check_place(*residual_in, x_in, op, "residual");
    PD_CHECK(residual_in->shape() == shape, op, ": residual ", shape_str(residual_in->shape()),
             " must have the shape of x ", shape_str(shape));
  }
  const int64_t rows = hd ? x_in.numel() / hd : 0;
  auto out = paddle::empty(shape, paddle::DataType::FLOAT32, x_in.place());
  auto residual_out = paddle::empty(shape, paddle::DataType::FLOAT32, x_in.place());
  if (on_gpu(x_in, op)) {
#ifdef GRPO_WITH_CUDA
    paddle::optional<paddle::Tensor> res;
    if (residual_in) res = dense(*residual_in);
    grpo::add_rms_norm_cuda(dense(x_in), res, dense(weight_in), eps, rows, hd, out, residual_out);
#endif
    return {out, residual_out};
  }
  const auto x_t = dense(x_in);
  const auto w_t = dense(weight_in);
  paddle::Tensor r_t;
  if (residual_in) r_t = dense(*residual_in);
  const float* x = x_t.data<float>();
  const float* r = residual_in ? r_t.data<float>() : nullptr;
  const float* w = w_t.data<float>();
  float* o = out.data<float>();
  float* ro = residual_out.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    const float* xi = x + i * hd;
    float* roi = ro + i * hd;
    if (r) {
      const float* ri = r + i * hd;
#pragma omp simd
      for (int64_t j = 0; j < hd; ++j) roi[j] = xi[j] + ri[j];
    } else {
      std::memcpy(roi, xi, hd * sizeof(float));
    }
    rms_norm_row(roi, w, o + i * hd, hd, eps);
  }
  return {out, residual_out};
}

std::vector<std::vector<int64_t>> AddRmsNormShape(const std::vector<int64_t>& x,
                                                  const paddle::optional<std::vector<int64_t>>&,
                                                  const std::vector<int64_t>&) {
  return {x, x};
}

std::vector<paddle::DataType> AddRmsNormDtype(const paddle::DataType& x, const paddle::optional<paddle::DataType>&,
                                              const paddle::DataType&) {
  return {x, x};
}

// ---------------------------------------------------------------------------------------------
// 2. grpo_rope_kv_write

struct CacheDims {
  int64_t L, Bcap, S, KVH, D;
};

CacheDims cache_dims(const paddle::Tensor& cache, const char* op) {
  const auto c = cache.shape();
  PD_CHECK(c.size() == 6 && c[1] == 2, op, ": cache must be [L, 2, Bcap, S, KVH, D], got ", shape_str(c));
  return {c[0], c[2], c[3], c[4], c[5]};
}

// y = x * cos + rotate_half(x) * sin with rotate_half(x) = concat(-x[D/2:], x[:D/2]).
inline void rotate(const float* x, const float* c, const float* s, float* y, int64_t D) {
  const int64_t half = D / 2;
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    y[i] = x[i] * c[i] - x[i + half] * s[i];
    y[i + half] = x[i + half] * c[i + half] + x[i] * s[i + half];
  }
}

// The cache may be float32 (either device) or bfloat16 (CPU only).
void check_cache_dtype(const paddle::Tensor& cache, const char* op) {
  const bool bf16 = cache.dtype() == paddle::DataType::BFLOAT16;
  PD_CHECK(cache.dtype() == paddle::DataType::FLOAT32 || (bf16 && cache.is_cpu()), op,
           ": cache must be float32 (or bfloat16 on the CPU), got ", phi::DataTypeToString(cache.dtype()), " on ",
           cache.place().DebugString());
}

// n floats into the cache: as they are, or rounded to bf16.
inline void store(const float* x, float* to, int64_t n) { std::memcpy(to, x, n * sizeof(float)); }
inline void store(const float* x, uint16_t* to, int64_t n) {
  for (int64_t i = 0; i < n; ++i) to[i] = grpo::bf16_bits(x[i]);
}

struct RopeRows {  // grpo_rope_kv_write's checked inputs and q output
  const float* qkv;  // (B, T, (H + 2 KVH) D)
  const int64_t* pos;  // (B, T)
  const float *cos, *sin;  // (P, D)
  float* q;  // (B, T, H, D)
  int64_t B, T, H, KVH, D, S, start;
};

// Rotates q and k of every token, writes k and v into cache slot start + t of its row; kc: the layer's keys (Bcap, S,
// KVH, D), its values follow at kc + Bcap S KVH D.
template <typename Elem>
void write_rope_rows(const RopeRows& r, Elem* kc, int64_t Bcap) {
  Elem* vc = kc + Bcap * r.S * r.KVH * r.D;
  const int64_t width = (r.H + 2 * r.KVH) * r.D, D = r.D;
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < r.B * r.T; ++bt) {
    const int64_t b = bt / r.T, t = bt % r.T;
    const float* row = r.qkv + bt * width;
    const float* c = r.cos + r.pos[bt] * D;
    const float* s = r.sin + r.pos[bt] * D;
    for (int64_t h = 0; h < r.H; ++h) rotate(row + h * D, c, s, r.q + (bt * r.H + h) * D, D);
    const int64_t slot = ((b * r.S) + r.start + t) * r.KVH * D;
    for (int64_t g = 0; g < r.KVH; ++g) {
      if constexpr (std::is_same_v<Elem, float>) {
        rotate(row + (r.H + g) * D, c, s, kc + slot + g * D, D);
      } else {  // rotated in fp32, then rounded
        thread_local std::vector<float> rotated;
        rotated.resize(D);
        rotate(row + (r.H + g) * D, c, s, rotated.data(), D);
        store(rotated.data(), kc + slot + g * D, D);
      }
      store(row + (r.H + r.KVH + g) * D, vc + slot + g * D, D);
    }
  }
}

std::vector<paddle::Tensor> RopeKvWrite(const paddle::Tensor& qkv_in, const paddle::Tensor& positions_in,
                                        const paddle::Tensor& cos_in, const paddle::Tensor& sin_in,
                                        paddle::Tensor& cache, int layer, int start, int num_heads,
                                        int num_kv_heads) {
  const char* op = "grpo_rope_kv_write";
  check_dtype(qkv_in, paddle::DataType::FLOAT32, op, "qkv");
  check_dtype(positions_in, paddle::DataType::INT64, op, "positions");
  check_dtype(cos_in, paddle::DataType::FLOAT32, op, "cos");
  check_dtype(sin_in, paddle::DataType::FLOAT32, op, "sin");
  check_cache_dtype(cache, op);
  for (const paddle::Tensor* t : {&positions_in, &cos_in, &sin_in, static_cast<const paddle::Tensor*>(&cache)})
    check_place(*t, qkv_in, op, "positions/cos/sin/cache");
  PD_CHECK(cache.is_contiguous(), op, ": cache is written in place and must be contiguous");
  const auto cd = cache_dims(cache, op);
  const int64_t H = num_heads, KVH = num_kv_heads, D = cd.D;
  PD_CHECK(H > 0 && KVH > 0 && H % KVH == 0, op, ": num_heads (", H, ") must be a positive multiple of num_kv_heads (",
           KVH, ")");
  PD_CHECK(KVH == cd.KVH, op, ": num_kv_heads = ", KVH, " but cache ", shape_str(cache.shape()), " has KVH = ", cd.KVH);
  PD_CHECK(D % 2 == 0, op, ": head dim D = ", D, " must be even for rotate_half");
  const auto qs = qkv_in.shape();
  PD_CHECK(qs.size() == 3 && qs[2] == (H + 2 * KVH) * D, op, ": qkv must be [B, T, (H + 2*KVH) * D] = [B, T, ",
           (H + 2 * KVH) * D, "] with H=", H, " KVH=", KVH, " D=", D, ", got ", shape_str(qs));
  const int64_t B = qs[0], T = qs[1];
  PD_CHECK(positions_in.shape() == (std::vector<int64_t>{B, T}), op, ": positions must be [B, T] = [", B, ", ", T,
           "], got ", shape_str(positions_in.shape()));
  const auto cs = cos_in.shape();
  PD_CHECK(cs.size() == 2 && cs[1] == D && sin_in.shape() == cs, op, ": cos and sin must both be [P, D=", D,
           "], got cos ", shape_str(cs), " sin ", shape_str(sin_in.shape()));
  PD_CHECK(layer >= 0 && layer < cd.L, op, ": layer ", layer, " out of range for cache ", shape_str(cache.shape()));
  PD_CHECK(B <= cd.Bcap, op, ": batch B = ", B, " exceeds cache capacity Bcap = ", cd.Bcap);
  PD_CHECK(start >= 0 && start + T <= cd.S, op, ": slots [", start, ", ", start + T, ") do not fit the cache's S = ",
           cd.S, " (cache ", shape_str(cache.shape()), ")");
  auto q = paddle::empty({B, T, H, D}, paddle::DataType::FLOAT32, qkv_in.place());
  if (on_gpu(qkv_in, op)) {
#ifdef GRPO_WITH_CUDA
    grpo::rope_kv_write_cuda(dense(qkv_in), dense(positions_in), dense(cos_in), dense(sin_in), cache, layer, start,
                             num_heads, num_kv_heads, q);
#endif
    return {q};
  }
  const auto qkv_t = dense(qkv_in), pos_t = dense(positions_in), cos_t = dense(cos_in), sin_t = dense(sin_in);
  const float* qkv = qkv_t.data<float>();
  const int64_t* pos = pos_t.data<int64_t>();
  const float* cosp = cos_t.data<float>();
  const float* sinp = sin_t.data<float>();
  const int64_t P = cs[0];
  for (int64_t i = 0; i < B * T; ++i)
    PD_CHECK(pos[i] >= 0 && pos[i] < P, op, ": positions[", i / T, ", ", i % T, "] = ", pos[i],
             " is outside the rotary table of ", P, " rows");
  const RopeRows rows{qkv, pos, cosp, sinp, q.data<float>(), B, T, H, KVH, D, cd.S, start};
  const int64_t layer_offset = static_cast<int64_t>(layer) * 2 * cd.Bcap * cd.S * KVH * D;  // to its [2, Bcap, S, KVH, D]
  if (cache.dtype() == paddle::DataType::BFLOAT16) {
    write_rope_rows(rows, static_cast<uint16_t*>(cache.data()) + layer_offset, cd.Bcap);
  } else {
    write_rope_rows(rows, cache.data<float>() + layer_offset, cd.Bcap);
  }
  return {q};
}

std::vector<std::vector<int64_t>> RopeKvWriteShape(const std::vector<int64_t>& qkv, const std::vector<int64_t>&,
                                                   const std::vector<int64_t>&, const std::vector<int64_t>&,
                                                   const std::vector<int64_t>& cache, int, int, int num_heads, int) {
  return {{qkv[0], qkv[1], num_heads, cache.back()}, cache};
}

std::vector<paddle::DataType> RopeKvWriteDtype(const paddle::DataType& qkv, const paddle::DataType&,
                                               const paddle::DataType&, const paddle::DataType&,
                                               const paddle::DataType& cache) {
  return {qkv, cache};
}

// ---------------------------------------------------------------------------------------------
// 3. grpo_cache_attention
//
// One query against its row's cached keys and values, slots lo..hi. A dot product of D floats per key, summed
// horizontally one key at a time, kept the loop waiting on each sum (the kernel took half of a SmolLM2-135M
// rollout at 64 rows); with AVX-512 and D = 64 or 128 (the head size of the models served), 16 keys' products are
// summed together by a tree of shuffles, and the values are accumulated in registers over two alternating sets
// of slots.
//
// round_bf16 rounds the query and the normalised weights to bf16 before their products, as the actor's bf16 attention
// does (grpo_attention with bf16, csrc/grpo_attention_bf16.h): with a bfloat16 cache, whose keys and values are rounded
// already, the engine's attention then sees the operands the actor's does.

// Where one KV head's cached keys (or values) of a row are: slot s at (s < split ? shared : own) + s * stride. A group's
// rows read the slots of their shared prompt from one copy (the prompt cache, split = its slots), where a decode step
// would otherwise read the same prompt from memory once per row; split 0: every slot from the row's own cache. The
// products see the same values in the same order either way.
template <typename Elem>
struct Slots {
  const Elem* shared;
  const Elem* own;
  int64_t split, stride;
  const Elem* at(int64_t s) const { return (s < split ? shared : own) + s * stride; }
};

#ifdef __AVX512F__
// sums[j] (16 lanes each) -> one register whose lane j is the sum of sums[j]'s lanes. Each level adds pairs of
// registers after shuffling them so that every lane keeps a partial sum of one key: 16 -> 8 -> 4 -> 2 -> 1.
inline __m512 lane_sums(__m512* sums) {
  __m512 halves[8], quarters[4], eighths[2];
  for (int j = 0; j < 8; ++j)  // 128-bit lanes: [j.0 + j.2, j.1 + j.3, (j+8).0 + (j+8).2, (j+8).1 + (j+8).3]
    halves[j] = _mm512_add_ps(_mm512_shuffle_f32x4(sums[j], sums[j + 8], 0x44), _mm512_shuffle_f32x4(sums[j], sums[j + 8], 0xEE));
  for (int j = 0; j < 4; ++j)  // 128-bit lanes: keys j, j + 8, j + 4, j + 12
    quarters[j] = _mm512_add_ps(_mm512_shuffle_f32x4(halves[j], halves[j + 4], 0x88),
                                _mm512_shuffle_f32x4(halves[j], halves[j + 4], 0xDD));
  for (int j = 0; j < 2; ++j)  // in each 128-bit lane: pairs of quarters[j] and quarters[j + 2]
    eighths[j] = _mm512_add_ps(_mm512_shuffle_ps(quarters[j], quarters[j + 2], 0x44), _mm512_shuffle_ps(quarters[j], quarters[j + 2], 0xEE));
  const __m512 sums_shuffled = _mm512_add_ps(_mm512_shuffle_ps(eighths[0], eighths[1], 0x88), _mm512_shuffle_ps(eighths[0], eighths[1], 0xDD));
  // lane 4 L + e holds key m(e) + o(L), m = (0, 2, 1, 3), o = (0, 8, 4, 12): put key j in lane j
  const __m512i where = _mm512_setr_epi32(0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15);
  return _mm512_permutexvar_ps(where, sums_shuffled);
}

// 16 cached floats, or 16 cached bf16 values widened to float (their bits shifted into the high half).
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) {
  const __m512i widened = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(widened, 16));
}

// scores[s] = scale * dot(s) for s in lo..hi, where dot(s) is a register whose lanes sum to key s's dot product with
// the query: 16 keys' registers summed together by lane_sums -> the scores' max.
template <typename Dot>
float scores_in_sixteens(Dot dot, int64_t lo, int64_t hi, float scale, float* scores) {
  __m512 block_max = _mm512_set1_ps(kNegInf);
  int64_t s = lo;
  for (; s + 16 <= hi + 1; s += 16) {
    __m512 sums[16];
    for (int j = 0; j < 16; ++j) sums[j] = dot(s + j);
    const __m512 block = _mm512_mul_ps(lane_sums(sums), _mm512_set1_ps(scale));
    _mm512_storeu_ps(scores + s, block);
    block_max = _mm512_max_ps(block_max, block);
  }
  float mx = _mm512_reduce_max_ps(block_max);
  for (; s <= hi; ++s) {
    scores[s] = _mm512_reduce_add_ps(dot(s)) * scale;
    mx = std::max(mx, scores[s]);
  }
  return mx;
}

// N = D / 16 registers per key or value.
template <int N, typename Elem>
float key_scores_avx512(const float* q, const Slots<Elem>& k, int64_t lo, int64_t hi, float scale, float* scores) {
  __m512 qv[N];
  for (int i = 0; i < N; ++i) qv[i] = _mm512_loadu_ps(q + 16 * i);
  const auto dot = [&](int64_t s) {
    const Elem* key = k.at(s);
    __m512 sum = _mm512_mul_ps(qv[0], load16(key));
    for (int i = 1; i < N; ++i) sum = _mm512_fmadd_ps(qv[i], load16(key + 16 * i), sum);
    return sum;
  };
  return scores_in_sixteens(dot, lo, hi, scale, scores);
}

template <int N, typename Elem>
void weighted_values_avx512(const float* p, const Slots<Elem>& v, int64_t lo, int64_t hi, float inv, float* out) {
  __m512 even[N], odd[N];  // two sets of sums, so consecutive slots' FMAs do not wait on each other
  for (int i = 0; i < N; ++i) even[i] = odd[i] = _mm512_setzero_ps();
  int64_t s = lo;
  for (; s + 1 <= hi; s += 2) {
    const __m512 p0 = _mm512_set1_ps(p[s]), p1 = _mm512_set1_ps(p[s + 1]);
    const Elem* v0 = v.at(s);
    const Elem* v1 = v.at(s + 1);
    for (int i = 0; i < N; ++i) {
      even[i] = _mm512_fmadd_ps(p0, load16(v0 + 16 * i), even[i]);
      odd[i] = _mm512_fmadd_ps(p1, load16(v1 + 16 * i), odd[i]);
    }
  }
  if (s <= hi)
    for (int i = 0; i < N; ++i) even[i] = _mm512_fmadd_ps(_mm512_set1_ps(p[s]), load16(v.at(s) + 16 * i), even[i]);
  for (int i = 0; i < N; ++i) _mm512_storeu_ps(out + 16 * i, _mm512_mul_ps(_mm512_add_ps(even[i], odd[i]), _mm512_set1_ps(inv)));
}
#endif

#ifdef __AVX512BF16__
// With round_bf16 over a bfloat16 cache every operand of the products is a bf16 value: vdpbf16ps multiplies them in
// pairs, 32 products an instruction, on the cache's values as they are instead of widening each to float first (the
// query rounded as round_bf16 asks, the weights rounded already). NP = D / 32 registers of pairs a key or value.
inline __m512bh load_pairs(const uint16_t* p) { return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p)); }

template <int NP>
float key_scores_pairs(const float* q, const Slots<uint16_t>& k, int64_t lo, int64_t hi, float scale, float* scores) {
  __m512bh qv[NP];  // the query rounded to bf16, in order (the second operand fills the low half)
  for (int i = 0; i < NP; ++i) qv[i] = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(q + 32 * i + 16), _mm512_loadu_ps(q + 32 * i));
  const auto dot = [&](int64_t s) {
    const uint16_t* key = k.at(s);
    __m512 sum = _mm512_dpbf16_ps(_mm512_setzero_ps(), qv[0], load_pairs(key));
    for (int i = 1; i < NP; ++i) sum = _mm512_dpbf16_ps(sum, qv[i], load_pairs(key + 32 * i));
    return sum;
  };
  return scores_in_sixteens(dot, lo, hi, scale, scores);
}

// out (D,) = sum over s in lo..hi of p[s] value(s), the weights p bf16 values: two slots a product, their values
// interleaved into pairs by unpacklo / unpackhi, which work within each 128-bit lane, so the sums hold the columns in
// that order (lane l of the low one: columns 8l .. 8l + 3 of its 32, of the high one 8l + 4 .. 8l + 7) until they are
// stored; two sets of sums, for slots s, s + 1 and s + 2, s + 3, so that consecutive products do not wait on each other.
// The weights come as pairs: pair k holds slots lo + 2k and lo + 2k + 1 (0 past hi), converted 32 at a time rather than
// two scalars a pair (the weights are bf16 values already, so the conversion only moves their bits).
inline const uint32_t* weight_pairs(const float* p, int64_t lo, int64_t hi) {
  thread_local std::vector<uint32_t> pairs;
  const int64_t n = hi - lo + 1;
  pairs.resize((n + 31) / 32 * 16);
  for (int64_t i = 0; i < n; i += 32) {
    const auto first = static_cast<__mmask16>((1u << std::min<int64_t>(16, n - i)) - 1);
    const auto second = static_cast<__mmask16>((1u << std::clamp<int64_t>(n - i - 16, 0, 16)) - 1);
    const __m512bh both = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(second, p + lo + i + 16), _mm512_maskz_loadu_ps(first, p + lo + i));
    _mm512_storeu_si512(pairs.data() + i / 2, reinterpret_cast<__m512i>(both));
  }
  return pairs.data();
}

inline __m512bh weight_pair(const uint32_t* pairs, int64_t k) {
  return reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(pairs[k])));
}

template <int NP>
void add_value_pairs(__m512bh w, const uint16_t* v0, const uint16_t* v1, __m512* low, __m512* high) {
  for (int i = 0; i < NP; ++i) {
    const __m512i even = _mm512_loadu_si512(v0 + 32 * i);
    const __m512i odd = v1 ? _mm512_loadu_si512(v1 + 32 * i) : _mm512_setzero_si512();
    low[i] = _mm512_dpbf16_ps(low[i], w, reinterpret_cast<__m512bh>(_mm512_unpacklo_epi16(even, odd)));
    high[i] = _mm512_dpbf16_ps(high[i], w, reinterpret_cast<__m512bh>(_mm512_unpackhi_epi16(even, odd)));
  }
}

template <int NP>
void weighted_values_pairs(const float* p, const Slots<uint16_t>& v, int64_t lo, int64_t hi, float* out) {
  __m512 low[2][NP], high[2][NP];
  for (int i = 0; i < NP; ++i) low[0][i] = high[0][i] = low[1][i] = high[1][i] = _mm512_setzero_ps();
  const uint32_t* pairs = weight_pairs(p, lo, hi);
  int64_t s = lo;
  for (; s + 3 <= hi; s += 4) {
    add_value_pairs<NP>(weight_pair(pairs, (s - lo) / 2), v.at(s), v.at(s + 1), low[0], high[0]);
    add_value_pairs<NP>(weight_pair(pairs, (s - lo) / 2 + 1), v.at(s + 2), v.at(s + 3), low[1], high[1]);
  }
  for (; s <= hi; s += 2) {
    add_value_pairs<NP>(weight_pair(pairs, (s - lo) / 2), v.at(s), s + 1 <= hi ? v.at(s + 1) : nullptr, low[0], high[0]);
  }
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int i = 0; i < NP; ++i) {
    const __m512 lows = _mm512_add_ps(low[0][i], low[1][i]), highs = _mm512_add_ps(high[0][i], high[1][i]);
    _mm512_storeu_ps(out + 32 * i, _mm512_permutex2var_ps(lows, first, highs));
    _mm512_storeu_ps(out + 32 * i + 16, _mm512_permutex2var_ps(lows, second, highs));
  }
}
#endif

inline float widen(float x) { return x; }
inline float widen(uint16_t x) { return grpo::bf16_float(x); }

// scores[s] = scale * q . key(s) for s in lo..hi, key(s) = k.at(s), D elements each -> their max. bf16: the
// query is to be rounded to bf16 (round_bf16), so over a bfloat16 cache with D = 64 or 128 the products run on pairs.
template <typename Elem>
float key_scores(const float* q, const Slots<Elem>& k, int64_t lo, int64_t hi, int64_t D, float scale, float* scores, bool bf16) {
#ifdef __AVX512BF16__
  if constexpr (std::is_same_v<Elem, uint16_t>) {
    if (bf16 && D == 64) return key_scores_pairs<2>(q, k, lo, hi, scale, scores);
    if (bf16 && D == 128) return key_scores_pairs<4>(q, k, lo, hi, scale, scores);
  }
#endif
#ifdef __AVX512F__
  if (D == 64) return key_scores_avx512<4>(q, k, lo, hi, scale, scores);
  if (D == 128) return key_scores_avx512<8>(q, k, lo, hi, scale, scores);
#endif
  float mx = kNegInf;
  for (int64_t s = lo; s <= hi; ++s) {
    const Elem* key = k.at(s);
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t i = 0; i < D; ++i) dot += q[i] * widen(key[i]);
    scores[s] = dot * scale;
    mx = std::max(mx, scores[s]);
  }
  return mx;
}

// out (D,) = inv * sum over s in lo..hi of p[s] value(s), value(s) = v.at(s). bf16: the weights are bf16 values
// and inv is 1 (round_bf16), so over a bfloat16 cache with D = 64 or 128 the products run on pairs.
template <typename Elem>
void weighted_values(const float* p, const Slots<Elem>& v, int64_t lo, int64_t hi, int64_t D, float inv, float* out, bool bf16) {
#ifdef __AVX512BF16__
  if constexpr (std::is_same_v<Elem, uint16_t>) {
    if (bf16 && D == 64) return weighted_values_pairs<2>(p, v, lo, hi, out);
    if (bf16 && D == 128) return weighted_values_pairs<4>(p, v, lo, hi, out);
  }
#endif
#ifdef __AVX512F__
  if (D == 64) return weighted_values_avx512<4>(p, v, lo, hi, inv, out);
  if (D == 128) return weighted_values_avx512<8>(p, v, lo, hi, inv, out);
#endif
  std::fill(out, out + D, 0.0f);
  for (int64_t s = lo; s <= hi; ++s) {
    const Elem* value = v.at(s);
#pragma omp simd
    for (int64_t i = 0; i < D; ++i) out[i] += p[s] * widen(value[i]);
  }
#pragma omp simd
  for (int64_t i = 0; i < D; ++i) out[i] *= inv;
}

// Prefetches into L2 the keys and values of slots lo..hi of a cache row (k, v: its first KV head's), `width`
// values of each slot from there (the KV heads an item reads): the next item's, while this one computes. A decode
// step's caches do not fit in the CPU's caches (30 layers of them), and one item's reading them from memory alone, then
// computing, used half of the memory's speed (bench/RESULTS.md).
template <typename Elem>
void prefetch_slots(const Slots<Elem>& keys, const Slots<Elem>& values, int64_t lo, int64_t hi, int64_t width) {
  for (int64_t s = lo; s <= hi; ++s) {
    const char* k = reinterpret_cast<const char*>(keys.at(s));
    const char* v = reinterpret_cast<const char*>(values.at(s));
    for (int64_t byte = 0; byte < width * static_cast<int64_t>(sizeof(Elem)); byte += 64) {
      _mm_prefetch(k + byte, _MM_HINT_T1);
      _mm_prefetch(v + byte, _MM_HINT_T1);
    }
  }
}

// kc: the layer's keys (Bcap, S, KVH, D), its values at kc + Bcap S KVH D; pc: the layer's prompt keys (U, W, KVH, D)
// and values after them, where r.prompt_of_row says the rows share prompts (else unused).
template <typename Elem>
void attend_rows(const grpo::CacheQueries& r, const Elem* kc, int64_t Bcap, const Elem* pc) {
  const int64_t B = r.B, T = r.T, H = r.H, KVH = r.KVH, D = r.D, S = r.S, start = r.start;
  const int64_t row_stride = S * KVH * D;  // one batch row of keys or values: [S, KVH, D]
  const int64_t prompt_stride = r.prompt_slots * KVH * D;  // one prompt's: [W, KVH, D]
  const Elem* vc = kc + Bcap * row_stride;
  const Elem* pv = pc + r.prompt_rows * prompt_stride;
  const float* q = r.q;
  const int64_t* first = r.first;
  float* o = r.out;
  const int64_t group = H / KVH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t key_stride = KVH * D;
  // The keys and the values of row b's KV head g
  const auto slots = [&](int64_t b, int64_t g) {
    Slots<Elem> keys{nullptr, kc + b * row_stride + g * D, 0, key_stride}, values{nullptr, vc + b * row_stride + g * D, 0, key_stride};
    if (r.prompt_of_row != nullptr) {
      const int64_t prompt = r.prompt_of_row[b] * prompt_stride + g * D;
      keys.shared = pc + prompt, values.shared = pv + prompt;
      keys.split = values.split = r.prompt_slots;
    }
    return std::make_pair(keys, values);
  };
  // A work item is a query's heads, so that its row's keys and values come into the core's cache once for all of
  // them: all H where there are two queries a thread or more (the row's slots then one run of memory), the G heads
  // that share a KV head where that would leave threads idle, single heads for a row or two of decode.
  const int64_t threads = omp_get_max_threads();
  const int64_t heads_per_item = B * T >= 2 * threads ? H : B * T * KVH >= 2 * threads ? group : 1;
  const int64_t items_per_query = H / heads_per_item, items = B * T * items_per_query;
  const int64_t item_width = (heads_per_item + group - 1) / group * D;  // the values of a slot an item reads
#pragma omp parallel
  {
    std::vector<float> scores(S), rounded_q(D);  // (S,) softmax weights of one query
#pragma omp for schedule(static)  // not dynamic: see csrc/build.py's missing_openmp_entry_points
    for (int64_t item = 0; item < items; ++item) {
      const int64_t bt = item / items_per_query, b = bt / T, t = bt % T;
      const int64_t lo = first[b], hi = start + t;  // inclusive slot range
      // the next item's slots next_lo..next_hi, prefetched a share before each of this item's heads where it reads
      // another row (a decode step's items; a prefill's next query reads this one's slots, in cache already)
      const int64_t next_bt = (item + 1) / items_per_query, nb = std::min(next_bt / T, B - 1);
      const int64_t next_lo = first[nb], next_hi = start + next_bt % T, share = (next_hi - next_lo + heads_per_item) / heads_per_item;
      const auto [next_keys, next_values] = slots(nb, (item + 1) % items_per_query * heads_per_item / group);
      for (int64_t h = item % items_per_query * heads_per_item; h < (item % items_per_query + 1) * heads_per_item; ++h) {
        if (const int64_t from = next_lo + h % heads_per_item * share; item + 1 < items && nb != b) {
          prefetch_slots(next_keys, next_values, from, std::min(from + share - 1, next_hi), item_width);
        }
        const float* qv = q + (bt * H + h) * D;
        float* ov = o + bt * H * D + h * D;
        if (lo > hi) {
          std::fill(ov, ov + D, 0.0f);  // padding query: no visible keys
          continue;
        }
        if (r.round_bf16) {
          float* rq = rounded_q.data();
#pragma omp simd
          for (int64_t i = 0; i < D; ++i) rq[i] = grpo::bf16_round(qv[i]);
          qv = rq;
        }
        const auto [keys, values] = slots(b, h / group);
        float* p = scores.data();
        const float mx = key_scores(qv, keys, lo, hi, D, scale, p, r.round_bf16);
        float inv = 1.0f / exp_shifted_sum(p + lo, hi - lo + 1, mx);
        if (r.round_bf16) {  // the weights normalised, then rounded, as grpo_attention's are
#pragma omp simd
          for (int64_t s = lo; s <= hi; ++s) p[s] = grpo::bf16_round(p[s] * inv);
          inv = 1.0f;
        }
        weighted_values(p, values, lo, hi, D, inv, ov, r.round_bf16);
      }
    }
  }
}

// A long prefill's queries in blocks through GEMMs where the operators have oneDNN (grpo_attention.cc); a decode
// step's (over shared prompts too) and a short prefill's one query at a time.
template <typename Elem>
void attend(const grpo::CacheQueries& r, const Elem* kc, int64_t Bcap, const Elem* pc) {
#ifdef GRPO_WITH_DNNL
  if (r.prompt_of_row == nullptr && grpo::prefill_in_blocks(r, std::is_same_v<Elem, uint16_t>)) {
    return grpo::prefill_attention(r, kc, Bcap);
  }
#endif
  attend_rows(r, kc, Bcap, pc);
}

// The shared prompts' cache and each row's prompt: on the CPU, beside a cache of the same layout and dtype, before the
// queries' slots -> (U, W), or (0, 0) without them.
std::pair<int64_t, int64_t> check_prompt_cache(const paddle::optional<paddle::Tensor>& prompt_cache,
                                               const paddle::optional<paddle::Tensor>& prompt_of_row,
                                               const paddle::Tensor& cache, const CacheDims& cd, int64_t B, int64_t start) {
  const char* op = "grpo_cache_attention";
  PD_CHECK(prompt_cache.is_initialized() == prompt_of_row.is_initialized(), op,
           ": prompt_cache and prompt_of_row come together (rows that share prompts) or not at all");
  if (!prompt_cache) return {0, 0};
  PD_CHECK(cache.is_cpu(), op, ": shared prompts are the CPU kernel's (the GPU's cache holds each row's prompt)");
  check_place(*prompt_cache, cache, op, "prompt_cache");
  check_place(*prompt_of_row, cache, op, "prompt_of_row");
  check_dtype(*prompt_of_row, paddle::DataType::INT64, op, "prompt_of_row");
  PD_CHECK(prompt_cache->dtype() == cache.dtype(), op, ": prompt_cache is ", phi::DataTypeToString(prompt_cache->dtype()),
           ", cache ", phi::DataTypeToString(cache.dtype()));
  const auto pd = cache_dims(*prompt_cache, op);
  PD_CHECK(pd.L == cd.L && pd.KVH == cd.KVH && pd.D == cd.D && pd.S <= start, op, ": prompt_cache ",
           shape_str(prompt_cache->shape()), " does not go with cache ", shape_str(cache.shape()), " at start ", start,
           " (its L, KVH, D must match, its slots come before the queries')");
  PD_CHECK(prompt_of_row->shape() == std::vector<int64_t>{B}, op, ": prompt_of_row must be [B] = [", B, "], got ",
           shape_str(prompt_of_row->shape()));
  const auto rows_t = dense(*prompt_of_row);
  const int64_t* rows = rows_t.data<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    PD_CHECK(rows[b] >= 0 && rows[b] < pd.Bcap, op, ": prompt_of_row[", b, "] = ", rows[b], " is not one of the ",
             pd.Bcap, " prompts");
  return {pd.Bcap, pd.S};
}

std::vector<paddle::Tensor> CacheAttention(const paddle::Tensor& q_in, const paddle::Tensor& cache_in,
                                           const paddle::Tensor& first_slot_in,
                                           const paddle::optional<paddle::Tensor>& prompt_cache_in,
                                           const paddle::optional<paddle::Tensor>& prompt_of_row_in, int layer, int start,
                                           bool round_bf16) {
  const char* op = "grpo_cache_attention";
  check_dtype(q_in, paddle::DataType::FLOAT32, op, "q");
  check_cache_dtype(cache_in, op);
  check_dtype(first_slot_in, paddle::DataType::INT64, op, "first_slot");
  check_place(cache_in, q_in, op, "cache");
  check_place(first_slot_in, q_in, op, "first_slot");
  const auto cd = cache_dims(cache_in, op);
  const auto qs = q_in.shape();
  PD_CHECK(qs.size() == 4 && qs[3] == cd.D, op, ": q must be [B, T, H, D] with D = ", cd.D, " from cache ",
           shape_str(cache_in.shape()), ", got ", shape_str(qs));
  const int64_t B = qs[0], T = qs[1], H = qs[2], D = qs[3], KVH = cd.KVH;
  PD_CHECK(H % KVH == 0, op, ": q has H = ", H, " heads, not a multiple of the cache's KVH = ", KVH);
  PD_CHECK(first_slot_in.shape() == std::vector<int64_t>{B}, op, ": first_slot must be [B] = [", B, "], got ",
           shape_str(first_slot_in.shape()));
  PD_CHECK(layer >= 0 && layer < cd.L, op, ": layer ", layer, " out of range for cache ", shape_str(cache_in.shape()));
  PD_CHECK(B <= cd.Bcap, op, ": batch B = ", B, " exceeds cache capacity Bcap = ", cd.Bcap);
  PD_CHECK(start >= 0 && start + T <= cd.S, op, ": query slots [", start, ", ", start + T,
           ") do not fit the cache's S = ", cd.S);
  const auto [prompt_rows, prompt_slots] = check_prompt_cache(prompt_cache_in, prompt_of_row_in, cache_in, cd, B, start);
  auto out = paddle::empty({B, T, H * D}, paddle::DataType::FLOAT32, q_in.place());
  if (on_gpu(q_in, op)) {
    PD_CHECK(!round_bf16, op, ": round_bf16 is the CPU's (the GPU's bf16 is paddle's AMP)");
#ifdef GRPO_WITH_CUDA
    grpo::cache_attention_cuda(dense(q_in), cache_in, dense(first_slot_in), layer, start, static_cast<int>(KVH), out);
#endif
    return {out};
  }
  const auto q_t = dense(q_in), c_t = dense(cache_in), f_t = dense(first_slot_in);
  const int64_t* first = f_t.data<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    PD_CHECK(first[b] >= 0, op, ": first_slot[", b, "] = ", first[b], " is negative");
  const auto p_t = prompt_cache_in ? dense(*prompt_cache_in) : c_t, r_t = prompt_of_row_in ? dense(*prompt_of_row_in) : f_t;
  const grpo::CacheQueries rows{q_t.data<float>(), first, out.data<float>(), B, T, H, KVH, D, cd.S, start, round_bf16,
                                prompt_of_row_in ? r_t.data<int64_t>() : nullptr, prompt_rows, prompt_slots};
  // to the layer's [2, Bcap, S, KVH, D], and its [2, U, W, KVH, D] in the prompt cache
  const int64_t layer_offset = static_cast<int64_t>(layer) * 2 * cd.Bcap * cd.S * KVH * D;
  const int64_t prompt_offset = static_cast<int64_t>(layer) * 2 * prompt_rows * prompt_slots * KVH * D;  // 0 without one
  if (c_t.dtype() == paddle::DataType::BFLOAT16) {
    attend(rows, static_cast<const uint16_t*>(c_t.data()) + layer_offset, cd.Bcap,
           static_cast<const uint16_t*>(p_t.data()) + prompt_offset);
  } else {
    attend(rows, c_t.data<float>() + layer_offset, cd.Bcap, p_t.data<float>() + prompt_offset);
  }
  return {out};
}

std::vector<std::vector<int64_t>> CacheAttentionShape(const std::vector<int64_t>& q, const std::vector<int64_t>&,
                                                      const std::vector<int64_t>&,
                                                      const paddle::optional<std::vector<int64_t>>&,
                                                      const paddle::optional<std::vector<int64_t>>&, int, int) {
  return {{q[0], q[1], q[2] * q[3]}};
}

std::vector<paddle::DataType> CacheAttentionDtype(const paddle::DataType& q, const paddle::DataType&,
                                                  const paddle::DataType&, const paddle::optional<paddle::DataType>&,
                                                  const paddle::optional<paddle::DataType>&) {
  return {q};
}

// ---------------------------------------------------------------------------------------------
// 4. grpo_silu_mul

std::vector<paddle::Tensor> SiluMul(const paddle::Tensor& x_in) {
  const char* op = "grpo_silu_mul";
  check_dtype(x_in, paddle::DataType::FLOAT32, op, "x");
  auto shape = x_in.shape();
  PD_CHECK(!shape.empty() && shape.back() % 2 == 0, op, ": x must be [..., 2I], got ", shape_str(shape));
  const int64_t inter = shape.back() / 2;
  shape.back() = inter;
  auto out = paddle::empty(shape, paddle::DataType::FLOAT32, x_in.place());
  const int64_t rows = inter ? x_in.numel() / (2 * inter) : 0;
  if (on_gpu(x_in, op)) {
#ifdef GRPO_WITH_CUDA
    grpo::silu_mul_cuda(dense(x_in), rows, inter, out);
#endif
    return {out};
  }
  const auto x_t = dense(x_in);
  const float* x = x_t.data<float>();
  float* o = out.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = x + r * 2 * inter;
    float* orow = o + r * inter;
    grpo::silu_mul_row(a, a + inter, inter, [orow](int64_t i, float value) { orow[i] = value; });
  }
  return {out};
}

// x@GRAD = [da | du] (grpo::silu_mul_grad_row).
std::vector<paddle::Tensor> SiluMulGrad(const paddle::Tensor& x_in, const paddle::Tensor& dout_in) {
  cpu_only(x_in, "grpo_silu_mul (backward)");
  const int64_t inter = x_in.shape().back() / 2;
  const int64_t rows = inter ? x_in.numel() / (2 * inter) : 0;
  auto dx = paddle::empty(x_in.shape(), paddle::DataType::FLOAT32, x_in.place());
  const auto x_t = dense(x_in), d_t = dense(dout_in);
  const float* x = x_t.data<float>();
  const float* dout = d_t.data<float>();
  float* g = dx.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = x + r * 2 * inter;
    float* da = g + r * 2 * inter;
    float* du = da + inter;
    grpo::silu_mul_grad_row(a, a + inter, dout + r * inter, inter, [da, du](int64_t i, float gate, float up) {
      da[i] = gate;
      du[i] = up;
    });
  }
  return {dx};
}

std::vector<std::vector<int64_t>> SiluMulShape(const std::vector<int64_t>& x) {
  auto s = x;
  s.back() /= 2;
  return {s};
}

std::vector<paddle::DataType> SiluMulDtype(const paddle::DataType& x) { return {x}; }

// ---------------------------------------------------------------------------------------------
// 5. grpo_sample

// Long float sums run in blocks of kBlock added in double: the log-prob head's rows (11) sum a row that way.
constexpr int64_t kBlock = 1024;

// The kernel is grpo::sample_rows (grpo_sampling.h), the definition the CUDA kernel shares.
std::vector<paddle::Tensor> Sample(const paddle::Tensor& logits_in, const paddle::Tensor& presence_in,
                                   const paddle::Tensor& eos_in, const paddle::Tensor& row_keys_in, int64_t seed,
                                   int step, int min_new_tokens,
                                   float temperature, int top_k, float top_p, float min_p, float repetition_penalty,
                                   bool greedy) {
  const char* op = "grpo_sample";
  check_dtype(logits_in, paddle::DataType::FLOAT32, op, "logits");
  check_dtype(presence_in, paddle::DataType::UINT8, op, "presence");
  check_dtype(eos_in, paddle::DataType::INT64, op, "eos_ids");
  check_dtype(row_keys_in, paddle::DataType::INT64, op, "row_keys");
  check_place(presence_in, logits_in, op, "presence");
  check_place(eos_in, logits_in, op, "eos_ids");
  check_place(row_keys_in, logits_in, op, "row_keys");
  const auto ls = logits_in.shape();
  PD_CHECK(ls.size() == 2 && ls[1] > 0, op, ": logits must be [B, V], got ", shape_str(ls));
  const int64_t B = ls[0], V = ls[1];
  PD_CHECK(V <= grpo::kMaxSampleVocab, op, ": vocabulary of ", V, " tokens is larger than the ",
           grpo::kMaxSampleVocab, " whose masses fit the sampler's 64-bit sums");
  const auto ps = presence_in.shape();
  PD_CHECK(ps.size() == 2 && ps[0] >= B && ps[1] == V, op, ": presence must be [Bcap >= B, V] with B = ", B,
           ", V = ", V, ", got ", shape_str(ps));
  PD_CHECK(eos_in.shape().size() == 1, op, ": eos_ids must be [E], got ", shape_str(eos_in.shape()));
  const int64_t E = eos_in.shape()[0];
  PD_CHECK(row_keys_in.shape() == std::vector<int64_t>{B}, op, ": row_keys must be [B] with B = ", B, ", got ",
           shape_str(row_keys_in.shape()));
  PD_CHECK(greedy || temperature > 0.0f, op, ": temperature must be > 0 when sampling, got ", temperature);
  PD_CHECK(repetition_penalty > 0.0f, op, ": repetition_penalty must be > 0, got ", repetition_penalty);
  PD_CHECK(top_p > 0.0f, op, ": top_p must be > 0, got ", top_p);
  PD_CHECK(min_p <= 1.0f, op, ": min_p must be <= 1 (a share of the top token's probability), got ", min_p);
  auto tokens = paddle::empty({B}, paddle::DataType::INT64, logits_in.place());
  auto logprobs = paddle::empty({B}, paddle::DataType::FLOAT32, logits_in.place());
  // eos ids index every row: checked on the host for both devices (E is a handful of ids, copied from a GPU).
  const auto e_t = eos_in.is_cpu() ? dense(eos_in) : dense(eos_in).copy_to(phi::CPUPlace(), true);
  const int64_t* eos = e_t.data<int64_t>();
  for (int64_t e = 0; e < E; ++e)
    PD_CHECK(eos[e] >= 0 && eos[e] < V, op, ": eos_ids[", e, "] = ", eos[e], " is outside the vocabulary of ", V);
  const grpo::SampleSettings settings{seed, step, min_new_tokens, temperature, top_k, top_p, min_p,
                                      repetition_penalty, greedy};
  if (on_gpu(logits_in, op)) {
#ifdef GRPO_WITH_CUDA
    grpo::sample_cuda(dense(logits_in), dense(presence_in), dense(eos_in), dense(row_keys_in), settings, tokens,
                      logprobs);
#endif
    return {tokens, logprobs};
  }
  const auto l_t = dense(logits_in), p_t = dense(presence_in), k_t = dense(row_keys_in);
  grpo::sample_rows(l_t.data<float>(), p_t.data<uint8_t>(), eos, E, B, V, k_t.data<int64_t>(), settings,
                    tokens.data<int64_t>(), logprobs.data<float>());
  return {tokens, logprobs};
}

std::vector<std::vector<int64_t>> SampleShape(const std::vector<int64_t>& logits, const std::vector<int64_t>&,
                                              const std::vector<int64_t>&, const std::vector<int64_t>&) {
  return {{logits[0]}, {logits[0]}};
}

std::vector<paddle::DataType> SampleDtype(const paddle::DataType&, const paddle::DataType&, const paddle::DataType&,
                                          const paddle::DataType&) {
  return {paddle::DataType::INT64, paddle::DataType::FLOAT32};
}

// ---------------------------------------------------------------------------------------------
// 6. grpo_stop_update

std::vector<paddle::Tensor> StopUpdate(const paddle::Tensor& tokens_in, paddle::Tensor& presence,
                                       const paddle::Tensor& eos_in) {
  const char* op = "grpo_stop_update";
  check_dtype(tokens_in, paddle::DataType::INT64, op, "tokens");
  check_dtype(presence, paddle::DataType::UINT8, op, "presence");
  check_dtype(eos_in, paddle::DataType::INT64, op, "eos_ids");
  check_place(presence, tokens_in, op, "presence");
  check_place(eos_in, tokens_in, op, "eos_ids");
  PD_CHECK(presence.is_contiguous(), op, ": presence is updated in place and must be contiguous");
  PD_CHECK(tokens_in.shape().size() == 1, op, ": tokens must be [B], got ", shape_str(tokens_in.shape()));
  PD_CHECK(eos_in.shape().size() == 1, op, ": eos_ids must be [E], got ", shape_str(eos_in.shape()));
  const int64_t B = tokens_in.shape()[0], E = eos_in.shape()[0];
  const auto ps = presence.shape();
  PD_CHECK(ps.size() == 2 && ps[0] >= B, op, ": presence must be [Bcap >= B = ", B, ", V], got ", shape_str(ps));
  const int64_t V = ps[1];
  auto done = paddle::empty({B}, paddle::DataType::BOOL, tokens_in.place());
  if (on_gpu(tokens_in, op)) {
#ifdef GRPO_WITH_CUDA
    grpo::stop_update_cuda(dense(tokens_in), presence, dense(eos_in), done);
#endif
    return {done};
  }
  const auto t_t = dense(tokens_in), e_t = dense(eos_in);
  const int64_t* tok = t_t.data<int64_t>();
  const int64_t* eos = e_t.data<int64_t>();
  uint8_t* pres = presence.data<uint8_t>();
  bool* d = done.data<bool>();
  for (int64_t b = 0; b < B; ++b) {
    PD_CHECK(tok[b] >= 0 && tok[b] < V, op, ": tokens[", b, "] = ", tok[b], " is outside the vocabulary of ", V);
    bool hit = false;
    for (int64_t e = 0; e < E; ++e) hit |= tok[b] == eos[e];
    d[b] = hit;
    pres[b * V + tok[b]] = 1;
  }
  return {done};
}

std::vector<std::vector<int64_t>> StopUpdateShape(const std::vector<int64_t>& tokens,
                                                  const std::vector<int64_t>& presence, const std::vector<int64_t>&) {
  return {tokens, presence};
}

std::vector<paddle::DataType> StopUpdateDtype(const paddle::DataType&, const paddle::DataType& presence,
                                              const paddle::DataType&) {
  return {paddle::DataType::BOOL, presence};
}

// ---------------------------------------------------------------------------------------------
// 7. grpo_compact_rows

int64_t element_size(paddle::DataType dtype, const char* op) {
  switch (dtype) {
    case paddle::DataType::BOOL:
    case paddle::DataType::UINT8:
    case paddle::DataType::INT8:
      return 1;
    case paddle::DataType::FLOAT16:
    case paddle::DataType::BFLOAT16:
    case paddle::DataType::INT16:
      return 2;
    case paddle::DataType::FLOAT32:
    case paddle::DataType::INT32:
      return 4;
    case paddle::DataType::FLOAT64:
    case paddle::DataType::INT64:
      return 8;
    default:
      PD_THROW(op, ": unsupported dtype ", phi::DataTypeToString(dtype));
  }
}

void CompactRows(paddle::Tensor& x, const paddle::Tensor& keep_in, int batch_axis, int prefix) {
  const char* op = "grpo_compact_rows";
  check_dtype(keep_in, paddle::DataType::INT64, op, "keep");
  PD_CHECK(x.is_contiguous(), op, ": x is compacted in place and must be contiguous");
  const auto s = x.shape();
  const int64_t nd = static_cast<int64_t>(s.size());
  PD_CHECK(batch_axis >= 0 && batch_axis < nd, op, ": batch_axis ", batch_axis, " out of range for x ", shape_str(s));
  PD_CHECK(prefix == -1 || (prefix >= 0 && batch_axis + 1 < nd && prefix <= s[batch_axis + 1]), op, ": prefix ",
           prefix, " must be -1 or in [0, x.shape[batch_axis + 1]] for x ", shape_str(s), " and batch_axis ",
           batch_axis);
  PD_CHECK(keep_in.shape().size() == 1 && keep_in.shape()[0] <= s[batch_axis], op, ": keep must be [n] with n <= ",
           s[batch_axis], ", got ", shape_str(keep_in.shape()));
  const int64_t n = keep_in.shape()[0];
  const int64_t esize = element_size(x.dtype(), op);
  int64_t outer = 1, inner = esize;  // inner: bytes of one row along batch_axis
  for (int64_t i = 0; i < batch_axis; ++i) outer *= s[i];
  for (int64_t i = batch_axis + 1; i < nd; ++i) inner *= s[i];
  const int64_t move = prefix < 0 ? inner : inner / s[batch_axis + 1] * prefix;  // bytes moved per row
  // keep is small and read on the host for validation (a device copy when x lives on a GPU).
  const auto keep_host = keep_in.is_cpu() ? dense(keep_in) : keep_in.copy_to(phi::CPUPlace(), true);
  const int64_t* keep = keep_host.data<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    PD_CHECK(keep[i] < s[batch_axis] && (i == 0 ? keep[i] >= 0 : keep[i] > keep[i - 1]), op,
             ": keep must be strictly ascending row indices below ", s[batch_axis], "; keep[", i, "] = ", keep[i]);
  if (n == 0 || move == 0) return;
  if (on_gpu(x, op)) {
#ifdef GRPO_WITH_CUDA
    const auto keep_dev = keep_in.place() == x.place() ? dense(keep_in) : keep_in.copy_to(x.place(), true);
    grpo::compact_rows_cuda(x, keep_dev, outer, s[batch_axis], inner, move);
#endif
    return;
  }
  uint8_t* base = reinterpret_cast<uint8_t*>(x.data());
  // Rows of one outer index move in order i = 0..n-1: keep[i] >= i, so a row is always read before
  // any later move could overwrite it. Outer indices are independent.
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < outer; ++o) {
    uint8_t* blk = base + o * s[batch_axis] * inner;
    for (int64_t i = 0; i < n; ++i)
      if (keep[i] != i) std::memcpy(blk + i * inner, blk + keep[i] * inner, move);
  }
}

std::vector<std::vector<int64_t>> CompactRowsShape(const std::vector<int64_t>& x, const std::vector<int64_t>&, int,
                                                   int) {
  return {x};
}

std::vector<paddle::DataType> CompactRowsDtype(const paddle::DataType& x, const paddle::DataType&) { return {x}; }

// ---------------------------------------------------------------------------------------------
// Training operators (alignment/fused_train.py): the actor's RMSNorm, rotary embedding and masked
// softmax with their backward kernels, in place of paddle's chains of broadcast elementwise ops.
// Backward kernels get their inputs from autograd, shaped as the forward validated them.

// The gradient of a parameter broadcast over rows (a norm's weight, a bias) [n]: each thread sums its rows
// into its own [n] partial, and total() adds the partials up in thread order, so the result is the same
// on every run with the same thread count.
class ThreadSums {
 public:
  explicit ThreadSums(int64_t n) : n_(n), threads_(omp_get_max_threads()), partial_(threads_ * n, 0.0f) {}
  int threads() const { return threads_; }
  float* mine() { return partial_.data() + omp_get_thread_num() * n_; }  // inside the parallel region
  void total(float* out) const {
    std::fill(out, out + n_, 0.0f);
    for (int t = 0; t < threads_; ++t)
#pragma omp simd
      for (int64_t j = 0; j < n_; ++j) out[j] += partial_[t * n_ + j];
  }

 private:
  int64_t n_;
  int threads_;
  std::vector<float> partial_;  // [threads, n]
};

// 8. grpo_rms_norm: weight * x / sqrt(mean(x^2) + eps) over the last axis.

std::vector<paddle::Tensor> RmsNorm(const paddle::Tensor& x_in, const paddle::Tensor& weight_in, float eps) {
  const char* op = "grpo_rms_norm";
  check_dtype(x_in, paddle::DataType::FLOAT32, op, "x");
  check_dtype(weight_in, paddle::DataType::FLOAT32, op, "weight");
  check_place(weight_in, x_in, op, "weight");
  cpu_only(x_in, op);
  const auto shape = x_in.shape();
  PD_CHECK(!shape.empty(), op, ": x must be [..., Hd], got a scalar");
  const int64_t hd = shape.back();
  PD_CHECK(weight_in.shape() == std::vector<int64_t>{hd}, op, ": weight must be [Hd] = [", hd, "], got ",
           shape_str(weight_in.shape()), " for x ", shape_str(shape));
  const int64_t rows = hd ? x_in.numel() / hd : 0;
  auto out = paddle::empty(shape, paddle::DataType::FLOAT32, x_in.place());
  const auto x_t = dense(x_in), w_t = dense(weight_in);
  const float* x = x_t.data<float>();
  const float* w = w_t.data<float>();
  float* o = out.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows; ++i) rms_norm_row(x + i * hd, w, o + i * hd, hd, eps);
  return {out};
}

// Per row, with inv = 1 / rms(x) and g = dy * w: dx = inv g - x inv^3 mean(g x); dw = sum over rows of dy x inv.
std::vector<paddle::Tensor> RmsNormGrad(const paddle::Tensor& x_in, const paddle::Tensor& weight_in,
                                        const paddle::Tensor& dout_in, float eps) {
  cpu_only(x_in, "grpo_rms_norm (backward)");
  const int64_t hd = x_in.shape().back();
  const int64_t rows = hd ? x_in.numel() / hd : 0;
  auto dx = paddle::empty(x_in.shape(), paddle::DataType::FLOAT32, x_in.place());
  auto dw = paddle::empty({hd}, paddle::DataType::FLOAT32, x_in.place());
  const auto x_t = dense(x_in), w_t = dense(weight_in), d_t = dense(dout_in);
  const float* x = x_t.data<float>();
  const float* w = w_t.data<float>();
  const float* dout = d_t.data<float>();
  float* dxp = dx.data<float>();
  ThreadSums sums(hd);
#pragma omp parallel num_threads(sums.threads())
  {
    float* acc = sums.mine();
#pragma omp for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      const float* xi = x + i * hd;
      const float* dy = dout + i * hd;
      float* dxi = dxp + i * hd;
      const float inv = rms_inverse(xi, hd, eps);
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < hd; ++j) dot += dy[j] * w[j] * xi[j];
      const float c = inv * inv * dot / static_cast<float>(hd);
#pragma omp simd
      for (int64_t j = 0; j < hd; ++j) {
        dxi[j] = inv * (dy[j] * w[j] - xi[j] * c);
        acc[j] += dy[j] * xi[j] * inv;
      }
    }
  }
  sums.total(dw.data<float>());
  return {dx, dw};
}

std::vector<std::vector<int64_t>> RmsNormShape(const std::vector<int64_t>& x, const std::vector<int64_t>&) {
  return {x};
}

std::vector<paddle::DataType> RmsNormDtype(const paddle::DataType& x, const paddle::DataType&) { return {x}; }

// ---------------------------------------------------------------------------------------------
// 9. grpo_rope_qkv: the q|k|v projections of every token plus their bias -> rotary-embedded q and k, and
// v, head-major for the attention matmuls (the bias add, reshape, transpose and rotate_half chain of the
// model's forward; paddle's CPU backward of a broadcast bias add alone took longer than the projection's
// matmul). qkv [B, T, (H + 2 KVH) D], bias [(H + 2 KVH) D] or none, cos and sin [B, T, D] (the model's
// rotary embedding at each token's position) -> q [B, H, T, D], k [B, KVH, T, D], v [B, KVH, T, D].

// The transpose of rotate: dx = dy * cos + rotate_half^T(dy) * sin, rotate_half^T(y) = concat(y[D/2:], -y[:D/2]).
inline void rotate_back(const float* dy, const float* c, const float* s, float* dx, int64_t D) {
  const int64_t half = D / 2;
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    dx[i] = dy[i] * c[i] + dy[i + half] * s[i + half];
    dx[i + half] = dy[i + half] * c[i + half] - dy[i] * s[i];
  }
}

struct HeadMajor {
  int64_t T, H, KVH, D;
  // Head n of token (b, t), n counting q heads, then k heads, then v heads, in the [B, heads, T, D] outputs.
  template <typename P>
  P at(P q, P k, P v, int64_t b, int64_t t, int64_t n) const {
    if (n < H) return q + ((b * H + n) * T + t) * D;
    if (n < H + KVH) return k + ((b * KVH + n - H) * T + t) * D;
    return v + ((b * KVH + n - H - KVH) * T + t) * D;
  }
};

std::vector<paddle::Tensor> RopeQkv(const paddle::Tensor& qkv_in, const paddle::optional<paddle::Tensor>& bias_in,
                                    const paddle::Tensor& cos_in, const paddle::Tensor& sin_in, int num_heads,
                                    int num_kv_heads) {
  const char* op = "grpo_rope_qkv";
  check_dtype(qkv_in, paddle::DataType::FLOAT32, op, "qkv");
  check_dtype(cos_in, paddle::DataType::FLOAT32, op, "cos");
  check_dtype(sin_in, paddle::DataType::FLOAT32, op, "sin");
  check_place(cos_in, qkv_in, op, "cos");
  check_place(sin_in, qkv_in, op, "sin");
  cpu_only(qkv_in, op);
  const int64_t H = num_heads, KVH = num_kv_heads;
  PD_CHECK(H > 0 && KVH > 0 && H % KVH == 0, op, ": num_heads (", H, ") must be a positive multiple of num_kv_heads (",
           KVH, ")");
  const auto cs = cos_in.shape();
  PD_CHECK(cs.size() == 3 && cs[2] % 2 == 0 && sin_in.shape() == cs, op,
           ": cos and sin must both be [B, T, D] with D even, got cos ", shape_str(cs), " sin ",
           shape_str(sin_in.shape()));
  const int64_t B = cs[0], T = cs[1], D = cs[2], width = (H + 2 * KVH) * D;
  PD_CHECK(qkv_in.shape() == (std::vector<int64_t>{B, T, width}), op, ": qkv must be [B, T, (H + 2*KVH) * D] = [", B,
           ", ", T, ", ", width, "] with H=", H, " KVH=", KVH, " and cos ", shape_str(cs), ", got ",
           shape_str(qkv_in.shape()));
  if (bias_in) {
    check_dtype(*bias_in, paddle::DataType::FLOAT32, op, "bias");
    check_place(*bias_in, qkv_in, op, "bias");
    PD_CHECK(bias_in->shape() == std::vector<int64_t>{width}, op, ": bias must be [(H + 2*KVH) * D] = [", width,
             "], got ", shape_str(bias_in->shape()));
  }
  auto q = paddle::empty({B, H, T, D}, paddle::DataType::FLOAT32, qkv_in.place());
  auto k = paddle::empty({B, KVH, T, D}, paddle::DataType::FLOAT32, qkv_in.place());
  auto v = paddle::empty({B, KVH, T, D}, paddle::DataType::FLOAT32, qkv_in.place());
  const auto qkv_t = dense(qkv_in), cos_t = dense(cos_in), sin_t = dense(sin_in);
  paddle::Tensor bias_t;
  if (bias_in) bias_t = dense(*bias_in);
  const float* qkv = qkv_t.data<float>();
  const float* bias = bias_in ? bias_t.data<float>() : nullptr;
  const float* cosp = cos_t.data<float>();
  const float* sinp = sin_t.data<float>();
  float *qo = q.data<float>(), *ko = k.data<float>(), *vo = v.data<float>();
  const HeadMajor layout{T, H, KVH, D};
#pragma omp parallel
  {
    std::vector<float> biased(width);  // (width,) one token's projections plus the bias
#pragma omp for schedule(static)
    for (int64_t bt = 0; bt < B * T; ++bt) {
      const int64_t b = bt / T, t = bt % T;
      const float* row = qkv + bt * width;
      if (bias) {
        float* x = biased.data();
#pragma omp simd
        for (int64_t j = 0; j < width; ++j) x[j] = row[j] + bias[j];
        row = x;
      }
      for (int64_t n = 0; n < H + 2 * KVH; ++n) {
        float* dst = layout.at(qo, ko, vo, b, t, n);
        if (n < H + KVH)
          rotate(row + n * D, cosp + bt * D, sinp + bt * D, dst, D);
        else
          std::memcpy(dst, row + n * D, D * sizeof(float));
      }
    }
  }
  return {q, k, v};
}

// qkv@GRAD [B, T, width] and bias@GRAD [width], its sum over tokens.
std::vector<paddle::Tensor> RopeQkvGrad(const paddle::Tensor& cos_in, const paddle::Tensor& sin_in,
                                        const paddle::Tensor& dq_in, const paddle::Tensor& dk_in,
                                        const paddle::Tensor& dv_in, int num_heads, int num_kv_heads) {
  cpu_only(dq_in, "grpo_rope_qkv (backward)");
  const auto cs = cos_in.shape();
  const int64_t B = cs[0], T = cs[1], D = cs[2], H = num_heads, KVH = num_kv_heads, width = (H + 2 * KVH) * D;
  auto dqkv = paddle::empty({B, T, width}, paddle::DataType::FLOAT32, dq_in.place());
  auto dbias = paddle::empty({width}, paddle::DataType::FLOAT32, dq_in.place());
  const auto cos_t = dense(cos_in), sin_t = dense(sin_in), dq_t = dense(dq_in), dk_t = dense(dk_in),
             dv_t = dense(dv_in);
  const float* cosp = cos_t.data<float>();
  const float* sinp = sin_t.data<float>();
  const float *dq = dq_t.data<float>(), *dk = dk_t.data<float>(), *dv = dv_t.data<float>();
  float* g = dqkv.data<float>();
  const HeadMajor layout{T, H, KVH, D};
  ThreadSums sums(width);
#pragma omp parallel num_threads(sums.threads())
  {
    float* acc = sums.mine();
#pragma omp for schedule(static)
    for (int64_t bt = 0; bt < B * T; ++bt) {
      const int64_t b = bt / T, t = bt % T;
      float* row = g + bt * width;
      for (int64_t n = 0; n < H + 2 * KVH; ++n) {
        const float* src = layout.at(dq, dk, dv, b, t, n);
        if (n < H + KVH)
          rotate_back(src, cosp + bt * D, sinp + bt * D, row + n * D, D);
        else
          std::memcpy(row + n * D, src, D * sizeof(float));
      }
#pragma omp simd
      for (int64_t j = 0; j < width; ++j) acc[j] += row[j];
    }
  }
  sums.total(dbias.data<float>());
  return {dqkv, dbias};
}

std::vector<std::vector<int64_t>> RopeQkvShape(const std::vector<int64_t>&, const paddle::optional<std::vector<int64_t>>&,
                                               const std::vector<int64_t>& cos, const std::vector<int64_t>&,
                                               int num_heads, int num_kv_heads) {
  const int64_t B = cos[0], T = cos[1], D = cos[2];
  return {{B, num_heads, T, D}, {B, num_kv_heads, T, D}, {B, num_kv_heads, T, D}};
}

std::vector<paddle::DataType> RopeQkvDtype(const paddle::DataType& qkv, const paddle::optional<paddle::DataType>&,
                                           const paddle::DataType&, const paddle::DataType&) {
  return {qkv, qkv, qkv};
}

// ---------------------------------------------------------------------------------------------
// 10. grpo_masked_softmax: softmax(scale * scores + mask) over the last axis, the attention weights.
// scores [B, N, R, L]: N heads or KV-head groups of R query rows each, row r being query r % Lq (a group
// of G heads sharing one KV head stacks its G x Lq rows, so grouped heads need no repeated keys);
// mask [B, 1, Lq, L] additive, 0 where a key is visible and a large negative number where not (the
// mask paddleformers builds). A row whose keys are all masked comes out uniform, as in paddle's softmax.

std::vector<paddle::Tensor> MaskedSoftmax(const paddle::Tensor& scores_in, const paddle::Tensor& mask_in, float scale) {
  const char* op = "grpo_masked_softmax";
  check_dtype(scores_in, paddle::DataType::FLOAT32, op, "scores");
  check_dtype(mask_in, paddle::DataType::FLOAT32, op, "mask");
  check_place(mask_in, scores_in, op, "mask");
  cpu_only(scores_in, op);
  const auto ss = scores_in.shape(), ms = mask_in.shape();
  PD_CHECK(ss.size() == 4, op, ": scores must be [B, N, R, L], got ", shape_str(ss));
  const int64_t B = ss[0], N = ss[1], R = ss[2], L = ss[3];
  PD_CHECK(ms.size() == 4 && ms[0] == B && ms[1] == 1 && ms[2] > 0 && R % ms[2] == 0 && ms[3] == L, op,
           ": mask must be [B, 1, Lq, L] with R a multiple of Lq for scores ", shape_str(ss), ", got ", shape_str(ms));
  const int64_t Lq = ms[2];
  auto out = paddle::empty(ss, paddle::DataType::FLOAT32, scores_in.place());
  const auto s_t = dense(scores_in), m_t = dense(mask_in);
  const float* s = s_t.data<float>();
  const float* mask = m_t.data<float>();
  float* p = out.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < B * N * R; ++row) {
    const float* si = s + row * L;
    const float* mi = mask + ((row / (N * R)) * Lq + row % R % Lq) * L;
    float* pi = p + row * L;
    float mx = kNegInf;
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < L; ++j) {
      pi[j] = si[j] * scale + mi[j];
      mx = grpo::larger(mx, pi[j]);
    }
    const float inv = 1.0f / exp_shifted_sum(pi, L, mx);
#pragma omp simd
    for (int64_t j = 0; j < L; ++j) pi[j] *= inv;
  }
  return {out};
}

// d scores = scale * p * (dp - sum(dp * p)) per row.
std::vector<paddle::Tensor> MaskedSoftmaxGrad(const paddle::Tensor& out_in, const paddle::Tensor& dout_in, float scale) {
  cpu_only(out_in, "grpo_masked_softmax (backward)");
  const int64_t L = out_in.shape().back();
  const int64_t rows = L ? out_in.numel() / L : 0;
  auto ds = paddle::empty(out_in.shape(), paddle::DataType::FLOAT32, out_in.place());
  const auto p_t = dense(out_in), d_t = dense(dout_in);
  const float* p = p_t.data<float>();
  const float* dp = d_t.data<float>();
  float* g = ds.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < rows; ++row) grpo::softmax_grad_row(p + row * L, dp + row * L, g + row * L, L, scale);
  return {ds};
}

std::vector<std::vector<int64_t>> MaskedSoftmaxShape(const std::vector<int64_t>& scores, const std::vector<int64_t>&) {
  return {scores};
}

std::vector<paddle::DataType> MaskedSoftmaxDtype(const paddle::DataType& scores, const paddle::DataType&) {
  return {scores};
}

// ---------------------------------------------------------------------------------------------
// 11. grpo_logprob_rows: what the log-prob head (alignment/algo.py, _ChunkedLogprobs) needs of each row of a chunk
// of raw logits, in two passes over the row: paddle computes it as a chain of whole-chunk kernels (divide,
// logsumexp, subtract, gather, exp, multiply, sum), each a pass over c x V floats, some single-threaded, and at a
// real model's vocabulary they took longer than the head's matmuls (bench/RESULTS.md). With s = logits / t,
// m = max s and S = sum exp(s - m): normaliser N = m + log S, log-prob s[target] - N, and entropy
// H = -sum p log p = log S - sum exp(s - m) (s - m) / S. A NaN logit makes the row's three values NaN.
// logits (c, V) float32, targets (c, 1) int64 -> log-probs, entropies, normalisers, each (c, 1) float32.

void check_head_rows(const paddle::Tensor& logits, const paddle::Tensor& targets, const char* op) {
  check_dtype(logits, paddle::DataType::FLOAT32, op, "logits");
  check_dtype(targets, paddle::DataType::INT64, op, "targets");
  cpu_only(logits, op);
  check_place(targets, logits, op, "targets");
  const auto ls = logits.shape();
  const std::vector<int64_t> column{ls.empty() ? 0 : ls[0], 1};
  PD_CHECK(ls.size() == 2 && targets.shape() == column, op,
           ": logits must be [c, V] and targets [c, 1], got ", shape_str(ls), " and ", shape_str(targets.shape()));
}

// targets[r] must index the vocabulary: an id outside it would read another row's logits.
void check_target(int64_t target, int64_t vocab, const char* op) {
  PD_CHECK(target >= 0 && target < vocab, op, ": target token ", target, " is outside the vocabulary [0, ", vocab, ")");
}

std::vector<paddle::Tensor> LogprobRows(const paddle::Tensor& logits_in, const paddle::Tensor& targets_in,
                                        float temperature) {
  const char* op = "grpo_logprob_rows";
  check_head_rows(logits_in, targets_in, op);
  const int64_t rows = logits_in.shape()[0], vocab = logits_in.shape()[1];
  PD_CHECK(vocab > 0 && temperature > 0.0f, op, ": needs a vocabulary and a positive temperature, got V = ", vocab,
           " and t = ", temperature);
  const auto l_t = dense(logits_in), t_t = dense(targets_in);
  const float* logits = l_t.data<float>();
  const int64_t* targets = t_t.data<int64_t>();
  for (int64_t r = 0; r < rows; ++r) check_target(targets[r], vocab, op);
  auto logprob = paddle::empty({rows, 1}, paddle::DataType::FLOAT32, logits_in.place());
  auto entropy = paddle::empty({rows, 1}, paddle::DataType::FLOAT32, logits_in.place());
  auto normaliser = paddle::empty({rows, 1}, paddle::DataType::FLOAT32, logits_in.place());
  float* lp = logprob.data<float>();
  float* ent = entropy.data<float>();
  float* norm = normaliser.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = logits + r * vocab;
    float mx = kNegInf;
    int nans = 0;  // a count, not a bool: GCC 12 does not vectorise a reduction(||)
#pragma omp simd reduction(max : mx) reduction(+ : nans)
    for (int64_t v = 0; v < vocab; ++v) {
      const float s = x[v] / temperature;
      mx = grpo::larger(mx, s);
      nans += s != s;
    }
    const bool nan = nans > 0;
    // S and sum exp(s - m) (s - m): float sums inside a block, double across blocks, so the rounding error does
    // not grow with the vocabulary (one float sum over 49,152 terms drifted 5e-5 in log S where it did not vectorise)
    double sum = 0.0, weighted = 0.0;
    for (int64_t lo = 0; lo < vocab; lo += kBlock) {
      const int64_t hi = std::min(vocab, lo + kBlock);
      float block_sum = 0.0f, block_weighted = 0.0f;
#pragma omp simd reduction(+ : block_sum, block_weighted)
      for (int64_t v = lo; v < hi; ++v) {
        const float shifted = x[v] / temperature - mx;
        const float e = exp_nonpos(shifted);
        block_sum += e;
        block_weighted += e * shifted;
      }
      sum += block_sum;
      weighted += block_weighted;
    }
    const double log_sum = std::log(sum);
    const float n = nan ? std::numeric_limits<float>::quiet_NaN() : mx + static_cast<float>(log_sum);
    norm[r] = n;
    lp[r] = x[targets[r]] / temperature - n;
    ent[r] = nan ? n : static_cast<float>(log_sum - weighted / sum);
  }
  return {logprob, entropy, normaliser};
}

std::vector<std::vector<int64_t>> LogprobRowsShape(const std::vector<int64_t>& logits, const std::vector<int64_t>&) {
  return {{logits[0], 1}, {logits[0], 1}, {logits[0], 1}};
}

std::vector<paddle::DataType> LogprobRowsDtype(const paddle::DataType&, const paddle::DataType&) {
  return {paddle::DataType::FLOAT32, paddle::DataType::FLOAT32, paddle::DataType::FLOAT32};
}

// ---------------------------------------------------------------------------------------------
// 12. grpo_logprob_rows_grad: the gradient of a chunk's raw logits, in place of them, in one pass per row. With
// p = exp(s - N) and the incoming gradients of the log-probs (scale = g / t) and, where an entropy bonus trains,
// of the entropies (entropy_scale = e / t):
//   G = scale onehot(target) - p (scale + entropy_scale (log p + H)).
// logits (c, V) float32 (overwritten), targets, normalisers, entropies, scale, entropy_scale (c, 1) -> G (c, V).

std::vector<paddle::Tensor> LogprobRowsGrad(const paddle::Tensor& logits_in, const paddle::Tensor& targets_in,
                                            const paddle::Tensor& normaliser_in, const paddle::Tensor& entropy_in,
                                            const paddle::Tensor& scale_in,
                                            const paddle::optional<paddle::Tensor>& entropy_scale_in,
                                            float temperature) {
  const char* op = "grpo_logprob_rows_grad";
  check_head_rows(logits_in, targets_in, op);
  PD_CHECK(logits_in.is_contiguous(), op, ": logits must be contiguous (the gradient is written in their place)");
  const int64_t rows = logits_in.shape()[0], vocab = logits_in.shape()[1];
  const std::vector<int64_t> column{rows, 1};
  std::vector<std::pair<const paddle::Tensor*, const char*>> columns{
      {&normaliser_in, "normaliser"}, {&entropy_in, "entropy"}, {&scale_in, "scale"}};
  if (entropy_scale_in) columns.emplace_back(&*entropy_scale_in, "entropy_scale");
  for (const auto& [t, name] : columns) {
    check_dtype(*t, paddle::DataType::FLOAT32, op, name);
    check_place(*t, logits_in, op, name);
    PD_CHECK(t->shape() == column, op, ": ", name, " must be [c, 1] = ", shape_str(column), ", got ",
             shape_str(t->shape()));
  }
  const auto t_t = dense(targets_in), n_t = dense(normaliser_in), h_t = dense(entropy_in), g_t = dense(scale_in);
  const int64_t* targets = t_t.data<int64_t>();
  for (int64_t r = 0; r < rows; ++r) check_target(targets[r], vocab, op);
  paddle::Tensor e_t;
  if (entropy_scale_in) e_t = dense(*entropy_scale_in);
  const float* norm = n_t.data<float>();
  const float* ent = h_t.data<float>();
  const float* scale = g_t.data<float>();
  const float* entropy_scale = entropy_scale_in ? e_t.data<float>() : nullptr;
  auto grad = logits_in;  // the same buffer
  float* x = grad.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * vocab;
    const float n = norm[r], g = scale[r], e = entropy_scale ? entropy_scale[r] : 0.0f, h = ent[r];
    if (entropy_scale) {
#pragma omp simd
      for (int64_t v = 0; v < vocab; ++v) {
        const float logp = row[v] / temperature - n;
        row[v] = exp_nonpos(logp) * (-(e * (logp + h)) - g);
      }
    } else {
#pragma omp simd
      for (int64_t v = 0; v < vocab; ++v) row[v] = exp_nonpos(row[v] / temperature - n) * -g;
    }
    row[targets[r]] += g;
  }
  return {grad};
}

std::vector<std::vector<int64_t>> LogprobRowsGradShape(const std::vector<int64_t>& logits,
                                                       const std::vector<int64_t>&, const std::vector<int64_t>&,
                                                       const std::vector<int64_t>&, const std::vector<int64_t>&,
                                                       const paddle::optional<std::vector<int64_t>>&) {
  return {logits};
}

std::vector<paddle::DataType> LogprobRowsGradDtype(const paddle::DataType& logits, const paddle::DataType&,
                                                   const paddle::DataType&, const paddle::DataType&,
                                                   const paddle::DataType&, const paddle::optional<paddle::DataType>&) {
  return {logits};
}

// ---------------------------------------------------------------------------------------------
// 13. grpo_heads_to_tokens: the training attention's output, head-major [B, H, T, D], in the token-major layout
// the output projection multiplies, [B, T, H D]; the backward moves the gradient back. paddle's transpose
// leaves a strided view, and the reshape after it copied element by element (1.66 s forward and 1.29 s backward of
// a bf16 SmolLM2-135M update at 64 rows: bench/RESULTS.md); here each head's D floats move as one block.

void move_head_blocks(const float* from, float* to, int64_t B, int64_t H, int64_t T, int64_t D, bool to_tokens) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t heads = ((b * H + h) * T + t) * D, tokens = ((b * T + t) * H + h) * D;
        std::memcpy(to + (to_tokens ? tokens : heads), from + (to_tokens ? heads : tokens), D * sizeof(float));
      }
}

std::vector<paddle::Tensor> HeadsToTokens(const paddle::Tensor& x_in, int num_heads) {
  const char* op = "grpo_heads_to_tokens";
  check_dtype(x_in, paddle::DataType::FLOAT32, op, "x");
  cpu_only(x_in, op);
  const auto xs = x_in.shape();
  PD_CHECK(xs.size() == 4 && xs[1] == num_heads, op, ": x must be [B, H, T, D] with H = num_heads = ", num_heads,
           ", got ", shape_str(xs));
  const int64_t B = xs[0], H = xs[1], T = xs[2], D = xs[3];
  auto out = paddle::empty({B, T, H * D}, paddle::DataType::FLOAT32, x_in.place());
  const auto x_t = dense(x_in);
  move_head_blocks(x_t.data<float>(), out.data<float>(), B, H, T, D, true);
  return {out};
}

std::vector<paddle::Tensor> HeadsToTokensGrad(const paddle::Tensor& dout_in, int num_heads) {
  cpu_only(dout_in, "grpo_heads_to_tokens (backward)");
  const auto ds = dout_in.shape();
  const int64_t B = ds[0], T = ds[1], H = num_heads, D = ds[2] / num_heads;
  auto dx = paddle::empty({B, H, T, D}, paddle::DataType::FLOAT32, dout_in.place());
  const auto d_t = dense(dout_in);
  move_head_blocks(d_t.data<float>(), dx.data<float>(), B, H, T, D, false);
  return {dx};
}

std::vector<std::vector<int64_t>> HeadsToTokensShape(const std::vector<int64_t>& x) {
  return {{x[0], x[2], x[1] * x[3]}};
}

std::vector<paddle::DataType> HeadsToTokensDtype(const paddle::DataType& x) { return {x}; }

// ---------------------------------------------------------------------------------------------
// 14. grpo_prompt_keys: the prefix grouper's keys (or values) of every row, its prompt's before its own
// (alignment/models/prefix_grouper.py): prompt [U, KVH, W, D], own [B, KVH, T, D], prompt_of_row [B] -> [B, KVH, W + T, D].
// The backward gives own its rows' gradients and sums each prompt's over its rows, in row order (as index_select's
// gradient does). paddle's index_select, concat and their gradients ran one thread each and copied twice: 1.1 s of
// a 47 s update at 512 completion tokens (bench/RESULTS.md).

std::vector<paddle::Tensor> PromptKeys(const paddle::Tensor& prompt_in, const paddle::Tensor& own_in,
                                       const paddle::Tensor& prompt_of_row_in) {
  const char* op = "grpo_prompt_keys";
  check_dtype(prompt_in, paddle::DataType::FLOAT32, op, "prompt");
  check_dtype(own_in, paddle::DataType::FLOAT32, op, "own");
  check_dtype(prompt_of_row_in, paddle::DataType::INT64, op, "prompt_of_row");
  cpu_only(own_in, op);
  const auto ps = prompt_in.shape(), os = own_in.shape();
  PD_CHECK(ps.size() == 4 && os.size() == 4 && ps[1] == os[1] && ps[3] == os[3] &&
               prompt_of_row_in.shape() == std::vector<int64_t>{os[0]},
           op, ": expected prompt [U, KVH, W, D], own [B, KVH, T, D] and prompt_of_row [B], got ", shape_str(ps), ", ",
           shape_str(os), " and ", shape_str(prompt_of_row_in.shape()));
  const int64_t U = ps[0], KVH = ps[1], W = ps[2], B = os[0], T = os[2], D = os[3];
  const auto p_t = dense(prompt_in), o_t = dense(own_in), r_t = dense(prompt_of_row_in);
  const int64_t* prompt_of_row = r_t.data<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    PD_CHECK(prompt_of_row[b] >= 0 && prompt_of_row[b] < U, op, ": prompt_of_row[", b, "] = ", prompt_of_row[b],
             " is not one of the ", U, " prompts");
  }
  auto out = paddle::empty({B, KVH, W + T, D}, paddle::DataType::FLOAT32, own_in.place());
  const float *prompt = p_t.data<float>(), *own = o_t.data<float>();
  float* o = out.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < B * KVH; ++bh) {
    const int64_t u = prompt_of_row[bh / KVH], h = bh % KVH;
    std::memcpy(o + bh * (W + T) * D, prompt + (u * KVH + h) * W * D, W * D * sizeof(float));
    std::memcpy(o + (bh * (W + T) + W) * D, own + bh * T * D, T * D * sizeof(float));
  }
  return {out};
}

std::vector<paddle::Tensor> PromptKeysGrad(const paddle::Tensor& prompt_in, const paddle::Tensor& prompt_of_row_in,
                                           const paddle::Tensor& dout_in) {
  cpu_only(dout_in, "grpo_prompt_keys (backward)");
  const auto ps = prompt_in.shape(), ds = dout_in.shape();
  const int64_t U = ps[0], KVH = ps[1], W = ps[2], B = ds[0], T = ds[2] - W, D = ds[3];
  auto dprompt = paddle::zeros(ps, paddle::DataType::FLOAT32, dout_in.place());
  auto down = paddle::empty({B, KVH, T, D}, paddle::DataType::FLOAT32, dout_in.place());
  const auto d_t = dense(dout_in), r_t = dense(prompt_of_row_in);
  const int64_t* prompt_of_row = r_t.data<int64_t>();
  const float* dout = d_t.data<float>();
  float *dp = dprompt.data<float>(), *dn = down.data<float>();
#pragma omp parallel
  {
#pragma omp for schedule(static) nowait
    for (int64_t bh = 0; bh < B * KVH; ++bh) {
      std::memcpy(dn + bh * T * D, dout + (bh * (W + T) + W) * D, T * D * sizeof(float));
    }
#pragma omp for schedule(static)  // each prompt's (KV head's) sum on one thread, its rows added in order
    for (int64_t uh = 0; uh < U * KVH; ++uh) {
      const int64_t u = uh / KVH, h = uh % KVH;
      float* sum = dp + uh * W * D;
      for (int64_t b = 0; b < B; ++b) {
        if (prompt_of_row[b] != u) continue;
        const float* row = dout + (b * KVH + h) * (W + T) * D;
#pragma omp simd
        for (int64_t i = 0; i < W * D; ++i) sum[i] += row[i];
      }
    }
  }
  return {dprompt, down};
}

std::vector<std::vector<int64_t>> PromptKeysShape(const std::vector<int64_t>& prompt, const std::vector<int64_t>& own,
                                                  const std::vector<int64_t>&) {
  return {{own[0], own[1], prompt[2] + own[2], own[3]}};
}

std::vector<paddle::DataType> PromptKeysDtype(const paddle::DataType& prompt, const paddle::DataType&,
                                              const paddle::DataType&) {
  return {prompt};
}

}  // namespace

PD_BUILD_OP(grpo_add_rms_norm)
    .Inputs({"X", paddle::Optional("Residual"), "Weight"})
    .Outputs({"Out", "ResidualOut"})
    .Attrs({"eps: float"})
    .SetKernelFn(PD_KERNEL(AddRmsNorm))
    .SetInferShapeFn(PD_INFER_SHAPE(AddRmsNormShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(AddRmsNormDtype));

PD_BUILD_OP(grpo_rope_kv_write)
    .Inputs({"Qkv", "Positions", "Cos", "Sin", "Cache"})
    .Outputs({"Q", "CacheOut"})
    .Attrs({"layer: int", "start: int", "num_heads: int", "num_kv_heads: int"})
    .SetInplaceMap({{"Cache", "CacheOut"}})
    .SetKernelFn(PD_KERNEL(RopeKvWrite))
    .SetInferShapeFn(PD_INFER_SHAPE(RopeKvWriteShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(RopeKvWriteDtype));

PD_BUILD_OP(grpo_cache_attention)
    .Inputs({"Q", "Cache", "FirstSlot", paddle::Optional("PromptCache"), paddle::Optional("PromptOfRow")})
    .Outputs({"Out"})
    .Attrs({"layer: int", "start: int", "round_bf16: bool"})
    .SetKernelFn(PD_KERNEL(CacheAttention))
    .SetInferShapeFn(PD_INFER_SHAPE(CacheAttentionShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(CacheAttentionDtype));

PD_BUILD_OP(grpo_silu_mul)
    .Inputs({"X"})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(SiluMul))
    .SetInferShapeFn(PD_INFER_SHAPE(SiluMulShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(SiluMulDtype));

PD_BUILD_GRAD_OP(grpo_silu_mul)
    .Inputs({"X", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X")})
    .SetKernelFn(PD_KERNEL(SiluMulGrad));

PD_BUILD_OP(grpo_sample)
    .Inputs({"Logits", "Presence", "EosIds", "RowKeys"})
    .Outputs({"Tokens", "Logprobs"})
    .Attrs({"seed: int64_t", "step: int", "min_new_tokens: int", "temperature: float", "top_k: int", "top_p: float",
            "min_p: float", "repetition_penalty: float", "greedy: bool"})
    .SetKernelFn(PD_KERNEL(Sample))
    .SetInferShapeFn(PD_INFER_SHAPE(SampleShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(SampleDtype));

PD_BUILD_OP(grpo_stop_update)
    .Inputs({"Tokens", "Presence", "EosIds"})
    .Outputs({"Done", "PresenceOut"})
    .SetInplaceMap({{"Presence", "PresenceOut"}})
    .SetKernelFn(PD_KERNEL(StopUpdate))
    .SetInferShapeFn(PD_INFER_SHAPE(StopUpdateShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(StopUpdateDtype));

PD_BUILD_OP(grpo_compact_rows)
    .Inputs({"X", "Keep"})
    .Outputs({"XOut"})
    .Attrs({"batch_axis: int", "prefix: int"})
    .SetInplaceMap({{"X", "XOut"}})
    .SetKernelFn(PD_KERNEL(CompactRows))
    .SetInferShapeFn(PD_INFER_SHAPE(CompactRowsShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(CompactRowsDtype));

PD_BUILD_OP(grpo_rms_norm)
    .Inputs({"X", "Weight"})
    .Outputs({"Out"})
    .Attrs({"eps: float"})
    .SetKernelFn(PD_KERNEL(RmsNorm))
    .SetInferShapeFn(PD_INFER_SHAPE(RmsNormShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(RmsNormDtype));

PD_BUILD_GRAD_OP(grpo_rms_norm)
    .Inputs({"X", "Weight", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X"), paddle::Grad("Weight")})
    .Attrs({"eps: float"})
    .SetKernelFn(PD_KERNEL(RmsNormGrad));

PD_BUILD_OP(grpo_rope_qkv)
    .Inputs({"Qkv", paddle::Optional("Bias"), "Cos", "Sin"})
    .Outputs({"Q", "K", "V"})
    .Attrs({"num_heads: int", "num_kv_heads: int"})
    .SetKernelFn(PD_KERNEL(RopeQkv))
    .SetInferShapeFn(PD_INFER_SHAPE(RopeQkvShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(RopeQkvDtype));

PD_BUILD_GRAD_OP(grpo_rope_qkv)
    .Inputs({"Cos", "Sin", paddle::Grad("Q"), paddle::Grad("K"), paddle::Grad("V")})
    .Outputs({paddle::Grad("Qkv"), paddle::Grad(paddle::Optional("Bias"))})
    .Attrs({"num_heads: int", "num_kv_heads: int"})
    .SetKernelFn(PD_KERNEL(RopeQkvGrad));

PD_BUILD_OP(grpo_masked_softmax)
    .Inputs({"Scores", "Mask"})
    .Outputs({"Out"})
    .Attrs({"scale: float"})
    .SetKernelFn(PD_KERNEL(MaskedSoftmax))
    .SetInferShapeFn(PD_INFER_SHAPE(MaskedSoftmaxShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(MaskedSoftmaxDtype));

PD_BUILD_GRAD_OP(grpo_masked_softmax)
    .Inputs({"Out", paddle::Grad("Out")})
    .Outputs({paddle::Grad("Scores")})
    .Attrs({"scale: float"})
    .SetKernelFn(PD_KERNEL(MaskedSoftmaxGrad));

PD_BUILD_OP(grpo_logprob_rows)
    .Inputs({"Logits", "Targets"})
    .Outputs({"Logprob", "Entropy", "Normaliser"})
    .Attrs({"temperature: float"})
    .SetKernelFn(PD_KERNEL(LogprobRows))
    .SetInferShapeFn(PD_INFER_SHAPE(LogprobRowsShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(LogprobRowsDtype));

PD_BUILD_OP(grpo_logprob_rows_grad)
    .Inputs({"Logits", "Targets", "Normaliser", "Entropy", "Scale", paddle::Optional("EntropyScale")})
    .Outputs({"Grad"})
    .Attrs({"temperature: float"})
    .SetInplaceMap({{"Logits", "Grad"}})
    .SetKernelFn(PD_KERNEL(LogprobRowsGrad))
    .SetInferShapeFn(PD_INFER_SHAPE(LogprobRowsGradShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(LogprobRowsGradDtype));

PD_BUILD_OP(grpo_heads_to_tokens)
    .Inputs({"X"})
    .Outputs({"Out"})
    .Attrs({"num_heads: int"})
    .SetKernelFn(PD_KERNEL(HeadsToTokens))
    .SetInferShapeFn(PD_INFER_SHAPE(HeadsToTokensShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(HeadsToTokensDtype));

PD_BUILD_GRAD_OP(grpo_heads_to_tokens)
    .Inputs({paddle::Grad("Out")})
    .Outputs({paddle::Grad("X")})
    .Attrs({"num_heads: int"})
    .SetKernelFn(PD_KERNEL(HeadsToTokensGrad));

PD_BUILD_OP(grpo_prompt_keys)
    .Inputs({"Prompt", "Own", "PromptOfRow"})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(PromptKeys))
    .SetInferShapeFn(PD_INFER_SHAPE(PromptKeysShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(PromptKeysDtype));

PD_BUILD_GRAD_OP(grpo_prompt_keys)
    .Inputs({"Prompt", "PromptOfRow", paddle::Grad("Out")})
    .Outputs({paddle::Grad("Prompt"), paddle::Grad("Own")})
    .SetKernelFn(PD_KERNEL(PromptKeysGrad));
