// CUDA kernels and launchers of the fused rollout operators (float32). grpo_ops.cc validates every
// input and calls these for GPU tensors; semantics are those of the CPU kernels there. Compiled only
// into a CUDA build of paddle (csrc/build.py), which defines GRPO_WITH_CUDA.

#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>

#include "grpo_ops.h"

namespace grpo {
namespace {

constexpr int kWarp = 32;

struct Sum {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <typename Op>
__device__ __forceinline__ float warp_reduce(float v, Op op) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide reduction; every thread gets the result. `scratch` holds one value per warp.
template <typename Op>
__device__ float block_reduce(float v, float* scratch, Op op, float identity) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = (blockDim.x + kWarp - 1) / kWarp;
  v = warp_reduce(v, op);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = threadIdx.x < warps ? scratch[threadIdx.x] : identity;
  if (warp == 0) v = warp_reduce(v, op);
  if (threadIdx.x == 0) scratch[0] = v;
  __syncthreads();
  return scratch[0];
}

__device__ float block_sum(float v, float* scratch) { return block_reduce(v, scratch, Sum{}, 0.0f); }
__device__ float block_max(float v, float* scratch) { return block_reduce(v, scratch, Max{}, -INFINITY); }

// Largest value, lowest index among equals (the CPU's first-maximum argmax).
__device__ int64_t block_argmax(float v, int64_t i, float* fscratch, int64_t* iscratch) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = (blockDim.x + kWarp - 1) / kWarp;
  for (int o = kWarp / 2; o > 0; o /= 2) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (ov > v || (ov == v && oi < i)) v = ov, i = oi;
  }
  __syncthreads();
  if (lane == 0) fscratch[warp] = v, iscratch[warp] = i;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < warps; ++w)
      if (fscratch[w] > v || (fscratch[w] == v && iscratch[w] < i)) v = fscratch[w], i = iscratch[w];
    iscratch[0] = i;
  }
  __syncthreads();
  return iscratch[0];
}

// Order-preserving map of floats to unsigned keys (larger float -> larger key), for radix selection.
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// ------------------------------------------------------------------------------------------- kernels

__global__ void add_rms_norm_kernel(const float* x, const float* r, const float* w, float eps, int64_t hd, float* out,
                                    float* res_out) {
  __shared__ float scratch[kWarp];
  const int64_t row = blockIdx.x;
  const float* xi = x + row * hd;
  float* roi = res_out + row * hd;
  float sumsq = 0.0f;
  for (int64_t j = threadIdx.x; j < hd; j += blockDim.x) {
    const float h = r ? xi[j] + r[row * hd + j] : xi[j];
    roi[j] = h;
    sumsq += h * h;
  }
  sumsq = block_sum(sumsq, scratch);
  const float inv = 1.0f / sqrtf(sumsq / static_cast<float>(hd) + eps);
  for (int64_t j = threadIdx.x; j < hd; j += blockDim.x) out[row * hd + j] = w[j] * (roi[j] * inv);
}

// One block per token (b, t): rotate its H query heads and KVH key heads, copy its KVH value heads.
__global__ void rope_kv_write_kernel(const float* qkv, const int64_t* pos, const float* cosp, const float* sinp,
                                     float* kc, float* vc, float* q, int64_t T, int64_t S, int start, int H, int KVH,
                                     int D) {
  const int64_t bt = blockIdx.x, b = bt / T, t = bt % T;
  const int half = D / 2;
  const float* row = qkv + bt * (H + 2 * KVH) * D;
  const float* c = cosp + pos[bt] * D;
  const float* s = sinp + pos[bt] * D;
  const int64_t slot = (b * S + start + t) * KVH * D;
  for (int idx = threadIdx.x; idx < (H + KVH) * half; idx += blockDim.x) {
    const int head = idx / half, i = idx % half;
    const float* x = row + head * D;
    float* y = head < H ? q + (bt * H + head) * D : kc + slot + (head - H) * D;
    const float lo = x[i], hi = x[i + half];
    y[i] = lo * c[i] - hi * s[i];
    y[i + half] = hi * c[i + half] + lo * s[i + half];
  }
  for (int idx = threadIdx.x; idx < KVH * D; idx += blockDim.x) vc[slot + idx] = row[(H + KVH) * D + idx];
}

// One warp per query (b, t, h), online softmax over its slots; lane l holds dims l, l + 32, ... (D <= 256).
constexpr int kMaxDimsPerLane = 8;
__global__ void cache_attention_kernel(const float* q, const float* kc, const float* vc, const int64_t* first,
                                       float* out, int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D, int64_t S,
                                       int start, float scale) {
  const int64_t query = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (query >= B * T * H) return;
  const int64_t h = query % H, t = (query / H) % T, b = query / (H * T);
  const float* qv = q + query * D;
  float* ov = out + query * D;  // out is [B, T, H * D]: the same offset as q's [B, T, H, D]
  const int64_t lo = first[b], hi = start + t;
  float qr[kMaxDimsPerLane], acc[kMaxDimsPerLane];
#pragma unroll
  for (int k = 0; k < kMaxDimsPerLane; ++k) {
    const int64_t i = lane + k * kWarp;
    qr[k] = i < D ? qv[i] * scale : 0.0f;
    acc[k] = 0.0f;
  }
  const int64_t g = h / (H / KVH);
  const float* kb = kc + b * S * KVH * D + g * D;
  const float* vb = vc + b * S * KVH * D + g * D;
  float m = -INFINITY, l = 0.0f;
  for (int64_t s = lo; s <= hi; ++s) {
    const float* kv = kb + s * KVH * D;
    float dot = 0.0f;
#pragma unroll
    for (int k = 0; k < kMaxDimsPerLane; ++k) {
      const int64_t i = lane + k * kWarp;
      if (i < D) dot += qr[k] * kv[i];
    }
    dot = warp_reduce(dot, Sum{});
    const float m_new = fmaxf(m, dot);
    const float corr = __expf(m - m_new);  // 0 on the first slot (m = -inf)
    const float p = __expf(dot - m_new);
    l = l * corr + p;
    const float* vv = vb + s * KVH * D;
#pragma unroll
    for (int k = 0; k < kMaxDimsPerLane; ++k) {
      const int64_t i = lane + k * kWarp;
      if (i < D) acc[k] = acc[k] * corr + p * vv[i];
    }
    m = m_new;
  }
  const float inv = lo <= hi ? 1.0f / l : 0.0f;  // an empty range (padding query) gives zeros
#pragma unroll
  for (int k = 0; k < kMaxDimsPerLane; ++k) {
    const int64_t i = lane + k * kWarp;
    if (i < D) ov[i] = acc[k] * inv;
  }
}

__global__ void silu_mul_kernel(const float* x, float* out, int64_t rows, int64_t inter) {
  const int64_t n = rows * inter;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = k / inter, i = k % inter;
    const float a = x[r * 2 * inter + i], u = x[r * 2 * inter + inter + i];
    out[k] = a / (1.0f + expf(-a)) * u;
  }
}

// Radix selection over the keys of the finite entries of w (4 passes of 8 bits). With by_mass false it
// finds the key of the `target`-th largest entry; with by_mass true the key at which the mass exp(w - mx),
// accumulated from the largest down, first reaches `target`.
__device__ uint32_t radix_select(const float* w, int64_t V, float mx, float target, bool by_mass, float* hist) {
  __shared__ uint32_t s_prefix;
  __shared__ float s_remaining;
  if (threadIdx.x == 0) s_prefix = 0, s_remaining = target;
  uint32_t mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0.0f;
    __syncthreads();
    const uint32_t prefix = s_prefix;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
      if (w[v] == -INFINITY) continue;
      const uint32_t key = order_key(w[v]);
      if ((key & mask) != prefix) continue;
      atomicAdd(&hist[(key >> shift) & 255u], by_mass ? __expf(w[v] - mx) : 1.0f);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float remaining = s_remaining;
      int chosen = -1, lowest = -1;
      for (int bin = 255; bin >= 0; --bin) {
        if (hist[bin] <= 0.0f) continue;
        lowest = bin;
        if (hist[bin] >= remaining) {
          chosen = bin;
          break;
        }
        remaining -= hist[bin];
      }
      if (chosen < 0) chosen = lowest < 0 ? 0 : lowest;  // rounding: take the smallest bin left
      s_prefix = prefix | (static_cast<uint32_t>(chosen) << shift);
      s_remaining = remaining;
    }
    mask |= 255u << shift;
    __syncthreads();
  }
  return s_prefix;
}

// One block per row: shaping, filters and the inverse-CDF draw, then the raw log-prob.
__global__ void sample_kernel(const float* logits, const uint8_t* presence, const int64_t* eos, int64_t E, int64_t V,
                              const int64_t* row_keys, float* work, int64_t seed, int step, int min_new_tokens, float temperature, int top_k,
                              float top_p, float min_p, float rp, bool greedy, int64_t* tokens, float* logprobs) {
  __shared__ float fscratch[kWarp];
  __shared__ int64_t iscratch[kWarp];
  __shared__ float hist[256];
  __shared__ float chunk_prefix[1024];
  __shared__ int64_t s_token;
  const int64_t b = blockIdx.x;
  const float* raw = logits + b * V;
  const uint8_t* pres = presence + b * V;
  float* w = work + b * V;
  const float inv_t = greedy ? 1.0f : 1.0f / temperature;

  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    float x = raw[v];
    if (rp != 1.0f && pres[v]) x = x > 0.0f ? x / rp : x * rp;
    w[v] = x;
  }
  __syncthreads();
  if (step < min_new_tokens)
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x) w[eos[e]] = -INFINITY;
  __syncthreads();

  int64_t token;
  if (greedy) {
    float bv = -INFINITY;
    int64_t bi = V;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
      if (w[v] > bv || bi == V) bv = w[v], bi = v;
    token = block_argmax(bv, bi, fscratch, iscratch);
  } else {
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) w[v] *= inv_t;
    __syncthreads();
    float mx = -INFINITY;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, w[v]);
    mx = block_max(mx, fscratch);
    if (top_k > 0 && top_k < V) {
      const uint32_t kth = radix_select(w, V, mx, static_cast<float>(top_k), false, hist);
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
        if (w[v] != -INFINITY && order_key(w[v]) < kth) w[v] = -INFINITY;
      __syncthreads();
    }
    if (top_p < 1.0f) {
      float z = 0.0f;
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x) z += __expf(w[v] - mx);
      z = block_sum(z, fscratch);
      // Keep every token down to the one where the mass from the top reaches top_p (ties at the cut kept).
      const uint32_t cut = radix_select(w, V, mx, top_p * z, true, hist);
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
        if (w[v] != -INFINITY && order_key(w[v]) < cut) w[v] = -INFINITY;
      __syncthreads();
    }
    if (min_p > 0.0f) {
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
        if (__expf(w[v] - mx) < min_p) w[v] = -INFINITY;
      __syncthreads();
    }
    // Inverse CDF in index order: each thread owns a contiguous chunk; a scan of the chunk sums says
    // which chunk holds the draw.
    const int64_t chunk = (V + blockDim.x - 1) / blockDim.x;
    const int64_t begin = threadIdx.x * chunk, end = min(V, begin + chunk);
    float local = 0.0f;
    int64_t last = -1;
    for (int64_t v = begin; v < end; ++v) {
      const float p = w[v] == -INFINITY ? 0.0f : __expf(w[v] - mx);
      local += p;
      if (p > 0.0f) last = v;
    }
    chunk_prefix[threadIdx.x] = local;
    if (threadIdx.x == 0) s_token = -1;
    __syncthreads();
    if (threadIdx.x == 0) {
      float run = 0.0f;
      for (int i = 0; i < blockDim.x; ++i) {
        const float c = chunk_prefix[i];
        chunk_prefix[i] = run;
        run += c;
      }
      fscratch[0] = run;
    }
    __syncthreads();
    const float total = fscratch[0];
    const float target = static_cast<float>(uniform_draw(seed, step, row_keys[b])) * total;
    const float lo = chunk_prefix[threadIdx.x];
    if (local > 0.0f && target >= lo && target < lo + local) {
      float cum = lo;
      int64_t pick = last;
      for (int64_t v = begin; v < end; ++v) {
        if (w[v] == -INFINITY) continue;
        cum += __expf(w[v] - mx);
        if (cum > target) {
          pick = v;
          break;
        }
      }
      s_token = pick;
    }
    __syncthreads();
    token = s_token;
    if (token < 0) {  // rounding put the draw past the last chunk: the last token with mass
      float lv = last >= 0 ? static_cast<float>(last) : -1.0f;
      lv = block_max(lv, fscratch);
      token = lv >= 0.0f ? static_cast<int64_t>(lv) : 0;
    }
  }

  // log_softmax(raw / t)[token] of the unshaped logits.
  float mx = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, raw[v] * inv_t);
  mx = block_max(mx, fscratch);
  float z = 0.0f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) z += expf(raw[v] * inv_t - mx);
  z = block_sum(z, fscratch);
  if (threadIdx.x == 0) {
    tokens[b] = token;
    logprobs[b] = raw[token] * inv_t - mx - logf(z);
  }
}

__global__ void stop_update_kernel(const int64_t* tokens, uint8_t* presence, const int64_t* eos, int64_t B, int64_t E,
                                   int64_t V, bool* done) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= B) return;
  const int64_t tok = tokens[b];
  bool hit = false;
  for (int64_t e = 0; e < E; ++e) hit |= tok == eos[e];
  done[b] = hit;
  if (tok >= 0 && tok < V) presence[b * V + tok] = 1;
}

// Thread (o, j) moves word j of rows keep[0..n) to rows 0..n-1 under outer index o, in order: each
// column is owned by one thread, so the in-order rule of the CPU kernel holds without synchronisation.
template <typename Word>
__global__ void compact_rows_kernel(Word* x, const int64_t* keep, int64_t n, int64_t outer, int64_t rows,
                                    int64_t row_words, int64_t move_words) {
  const int64_t total = outer * move_words;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < total;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t o = k / move_words, j = k % move_words;
    Word* blk = x + o * rows * row_words + j;
    for (int64_t i = 0; i < n; ++i)
      if (keep[i] != i) blk[i * row_words] = blk[keep[i] * row_words];
  }
}

int grid_for(int64_t n, int threads) {
  return static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 65535 * 8));
}

void check_launch(const char* op) {
  const cudaError_t err = cudaGetLastError();
  PD_CHECK(err == cudaSuccess, op, ": CUDA kernel launch failed: ", cudaGetErrorString(err));
}

}  // namespace

// ------------------------------------------------------------------------------------------- launchers

void add_rms_norm_cuda(const paddle::Tensor& x, const paddle::optional<paddle::Tensor>& residual,
                       const paddle::Tensor& weight, float eps, int64_t rows, int64_t hd, paddle::Tensor& out,
                       paddle::Tensor& residual_out) {
  if (rows == 0) return;
  add_rms_norm_kernel<<<rows, 256, 0, x.stream()>>>(x.data<float>(), residual ? residual->data<float>() : nullptr,
                                                    weight.data<float>(), eps, hd, out.data<float>(),
                                                    residual_out.data<float>());
  check_launch("grpo_add_rms_norm");
}

void rope_kv_write_cuda(const paddle::Tensor& qkv, const paddle::Tensor& positions, const paddle::Tensor& cos,
                        const paddle::Tensor& sin, paddle::Tensor& cache, int layer, int start, int num_heads,
                        int num_kv_heads, paddle::Tensor& q) {
  const auto qs = qkv.shape(), cs = cache.shape();  // cache [L, 2, Bcap, S, KVH, D]
  const int64_t B = qs[0], T = qs[1], Bcap = cs[2], S = cs[3], D = cs[5];
  if (B * T == 0) return;
  float* kc = cache.data<float>() + static_cast<int64_t>(layer) * 2 * Bcap * S * num_kv_heads * D;
  float* vc = kc + Bcap * S * num_kv_heads * D;
  // Positions index the rotary tables; out-of-range values are rejected here on the host.
  const auto pos_host = positions.copy_to(phi::CPUPlace(), true);
  const int64_t P = cos.shape()[0];
  const int64_t* p = pos_host.data<int64_t>();
  for (int64_t i = 0; i < B * T; ++i)
    PD_CHECK(p[i] >= 0 && p[i] < P, "grpo_rope_kv_write: positions[", i / T, ", ", i % T, "] = ", p[i],
             " is outside the rotary table of ", P, " rows");
  rope_kv_write_kernel<<<B * T, 128, 0, qkv.stream()>>>(qkv.data<float>(), positions.data<int64_t>(), cos.data<float>(),
                                                       sin.data<float>(), kc, vc, q.data<float>(), T, S, start,
                                                       num_heads, num_kv_heads, static_cast<int>(D));
  check_launch("grpo_rope_kv_write");
}

void cache_attention_cuda(const paddle::Tensor& q, const paddle::Tensor& cache, const paddle::Tensor& first_slot,
                          int layer, int start, int num_kv_heads, paddle::Tensor& out) {
  const auto qs = q.shape(), cs = cache.shape();
  const int64_t B = qs[0], T = qs[1], H = qs[2], D = qs[3], Bcap = cs[2], S = cs[3];
  PD_CHECK(D <= kWarp * kMaxDimsPerLane, "grpo_cache_attention: the CUDA kernel supports head dim D <= ",
           kWarp * kMaxDimsPerLane, ", got ", D);
  if (B * T * H == 0) return;
  const float* kc = cache.data<float>() + static_cast<int64_t>(layer) * 2 * Bcap * S * num_kv_heads * D;
  const float* vc = kc + Bcap * S * num_kv_heads * D;
  constexpr int kThreads = 4 * kWarp;  // four queries per block
  const int64_t blocks = (B * T * H * kWarp + kThreads - 1) / kThreads;
  cache_attention_kernel<<<blocks, kThreads, 0, q.stream()>>>(q.data<float>(), kc, vc, first_slot.data<int64_t>(),
                                                              out.data<float>(), B, T, H, num_kv_heads, D, S, start,
                                                              1.0f / sqrtf(static_cast<float>(D)));
  check_launch("grpo_cache_attention");
}

void silu_mul_cuda(const paddle::Tensor& x, int64_t rows, int64_t inter, paddle::Tensor& out) {
  if (rows * inter == 0) return;
  silu_mul_kernel<<<grid_for(rows * inter, 256), 256, 0, x.stream()>>>(x.data<float>(), out.data<float>(), rows,
                                                                      inter);
  check_launch("grpo_silu_mul");
}

void sample_cuda(const paddle::Tensor& logits, const paddle::Tensor& presence, const paddle::Tensor& eos_ids,
                 const paddle::Tensor& row_keys, int64_t seed, int step, int min_new_tokens, float temperature, int top_k, float top_p, float min_p,
                 float repetition_penalty, bool greedy, paddle::Tensor& tokens, paddle::Tensor& logprobs) {
  const int64_t B = logits.shape()[0], V = logits.shape()[1], E = eos_ids.shape()[0];
  if (B == 0) return;
  auto work = paddle::empty({B, V}, paddle::DataType::FLOAT32, logits.place());  // shaped logits per row
  sample_kernel<<<B, 1024, 0, logits.stream()>>>(logits.data<float>(), presence.data<uint8_t>(),
                                                 eos_ids.data<int64_t>(), E, V, row_keys.data<int64_t>(),
                                                 work.data<float>(), seed, step,
                                                 min_new_tokens, temperature, top_k, top_p, min_p, repetition_penalty,
                                                 greedy, tokens.data<int64_t>(), logprobs.data<float>());
  check_launch("grpo_sample");
}

void stop_update_cuda(const paddle::Tensor& tokens, paddle::Tensor& presence, const paddle::Tensor& eos_ids,
                      paddle::Tensor& done) {
  const int64_t B = tokens.shape()[0], E = eos_ids.shape()[0], V = presence.shape()[1];
  if (B == 0) return;
  stop_update_kernel<<<grid_for(B, 128), 128, 0, tokens.stream()>>>(tokens.data<int64_t>(), presence.data<uint8_t>(),
                                                                   eos_ids.data<int64_t>(), B, E, V, done.data<bool>());
  check_launch("grpo_stop_update");
}

void compact_rows_cuda(paddle::Tensor& x, const paddle::Tensor& keep, int64_t outer, int64_t rows, int64_t row_bytes,
                       int64_t move_bytes) {
  const int64_t n = keep.shape()[0];
  if (row_bytes % 4 == 0 && move_bytes % 4 == 0) {
    compact_rows_kernel<uint32_t><<<grid_for(outer * move_bytes / 4, 256), 256, 0, x.stream()>>>(
        reinterpret_cast<uint32_t*>(x.data()), keep.data<int64_t>(), n, outer, rows, row_bytes / 4,
        move_bytes / 4);
  } else {
    compact_rows_kernel<uint8_t><<<grid_for(outer * move_bytes, 256), 256, 0, x.stream()>>>(
        reinterpret_cast<uint8_t*>(x.data()), keep.data<int64_t>(), n, outer, rows, row_bytes, move_bytes);
  }
  check_launch("grpo_compact_rows");
}

}  // namespace grpo
