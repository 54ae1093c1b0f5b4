// CUDA kernels of the fused rollout operators and their launchers on raw pointers, without paddle: grpo_ops.cu
// calls them for paddle's GPU tensors and csrc/gpu_harness/harness.cu for torch's (make test-gpu). Semantics are
// those of the CPU kernels in grpo_ops.cc; sampling is grpo_sampling.h's definition, bit for bit.
// Element type T is float or __nv_bfloat16 (activations, weights, cache); arithmetic is float.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "grpo_sampling.h"

namespace grpo {
namespace kernels {

constexpr int kWarp = 32;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

inline int grid_for(int64_t n, int threads) {
  return static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 65535 * 8));
}

// ------------------------------------------------------------------------------------------- 1. add + RMSNorm

// One block per row: res_out = x (+ residual), out = weight * res_out / rms(res_out).
template <typename T>
__global__ void add_rms_norm_kernel(const T* x, const T* r, const T* w, float eps, int64_t hd, T* out, T* res_out) {
  using Reduce = cub::BlockReduce<float, 256>;
  __shared__ typename Reduce::TempStorage scratch;
  __shared__ float s_inv;
  const int64_t row = blockIdx.x;
  float sumsq = 0.0f;
  for (int64_t j = threadIdx.x; j < hd; j += blockDim.x) {
    const float h = to_float(x[row * hd + j]) + (r ? to_float(r[row * hd + j]) : 0.0f);
    const T stored = from_float<T>(h);
    res_out[row * hd + j] = stored;
    sumsq += to_float(stored) * to_float(stored);
  }
  sumsq = Reduce(scratch).Sum(sumsq);
  if (threadIdx.x == 0) s_inv = 1.0f / sqrtf(sumsq / static_cast<float>(hd) + eps);
  __syncthreads();
  for (int64_t j = threadIdx.x; j < hd; j += blockDim.x)
    out[row * hd + j] = from_float<T>(to_float(w[j]) * (to_float(res_out[row * hd + j]) * s_inv));
}

template <typename T>
void add_rms_norm(const T* x, const T* residual, const T* weight, float eps, int64_t rows, int64_t hd, T* out,
                  T* residual_out, cudaStream_t stream) {
  if (rows == 0) return;
  add_rms_norm_kernel<T><<<rows, 256, 0, stream>>>(x, residual, weight, eps, hd, out, residual_out);
}

// ------------------------------------------------------------------------------------------- 2. rotary + KV write

// One block per token (b, t): rotate its H query heads and KVH key heads, copy its KVH value heads into the
// cache slot start + t of row b. qkv [B, T, (H + 2 KVH) D]; cos/sin [P, D] float; caches [Bcap, S, KVH, D].
template <typename T>
__global__ void rope_kv_write_kernel(const T* qkv, const int64_t* pos, const float* cosp, const float* sinp, T* kc,
                                     T* vc, T* q, int64_t T_, int64_t S, int start, int H, int KVH, int D) {
  const int64_t bt = blockIdx.x, b = bt / T_, t = bt % T_;
  const int half = D / 2;
  const T* row = qkv + bt * (H + 2 * KVH) * D;
  const float* c = cosp + pos[bt] * D;
  const float* s = sinp + pos[bt] * D;
  const int64_t slot = (b * S + start + t) * KVH * D;
  for (int idx = threadIdx.x; idx < (H + KVH) * half; idx += blockDim.x) {
    const int head = idx / half, i = idx % half;
    const T* x = row + head * D;
    T* y = head < H ? q + (bt * H + head) * D : kc + slot + (head - H) * D;
    const float lo = to_float(x[i]), hi = to_float(x[i + half]);
    y[i] = from_float<T>(lo * c[i] - hi * s[i]);
    y[i + half] = from_float<T>(hi * c[i + half] + lo * s[i + half]);
  }
  for (int idx = threadIdx.x; idx < KVH * D; idx += blockDim.x) vc[slot + idx] = row[(H + KVH) * D + idx];
}

template <typename T>
void rope_kv_write(const T* qkv, const int64_t* positions, const float* cos, const float* sin, T* k_cache,
                   T* v_cache, T* q, int64_t B, int64_t T_, int64_t S, int start, int H, int KVH, int D,
                   cudaStream_t stream) {
  if (B * T_ == 0) return;
  rope_kv_write_kernel<T><<<B * T_, 128, 0, stream>>>(qkv, positions, cos, sin, k_cache, v_cache, q, T_, S, start,
                                                      H, KVH, D);
}

// ------------------------------------------------------------------------------------------- 3. cache attention

// Flash-decoding. Query (b, t, h) attends slots first[b] .. start + t of row b's cache. A block serves up to
// kAttnTile queries that share one KV head (the group's heads of a few positions t) over one split of the slots, so
// each key and value row is read once per tile; a group of more heads takes several blocks, which run side by side
// and so read the group's keys and values from HBM about once. Lanes work in groups of kLanes, one slot per group.
// Partial results (max, sum, unnormalised output) go to a workspace that the combine kernel reduces over the splits;
// with one split the block writes the output itself.
constexpr int kAttnThreads = 128;
constexpr int kAttnTile = 4;  // queries per block: their q and output take 32 registers a lane

struct AttnShape {
  int64_t B, T, H, KVH, D, S;
  int start, splits, chunk;  // slots per split
  float scale;
};

// Four elements per lane per load (16 bytes of float, 8 of bfloat16): a slot's row is read by kLanes lanes.
template <typename T>
struct Four;
template <>
struct Four<float> {
  using Raw = uint4;
};
template <>
struct Four<__nv_bfloat16> {
  using Raw = uint2;
};

template <typename T, int kD>
struct AttnLayout {
  using Raw = typename Four<T>::Raw;
  static constexpr int kLanes = kD / 4 < kWarp ? kD / 4 : kWarp;  // lanes per slot
  static constexpr int kLoads = kD / (4 * kLanes);                // loads per lane per row
  static constexpr int kPerLane = 4 * kLoads;                     // dims per lane
  static constexpr int kGroups = kAttnThreads / kLanes;           // slots per block per step
  static constexpr int kUnroll = 8 / sizeof(T);                   // steps loaded together: 32 bytes per lane
};

template <typename T, int kD>
__device__ __forceinline__ void load_raw(const T* src, int lane_in_group,
                                         typename AttnLayout<T, kD>::Raw (&dst)[AttnLayout<T, kD>::kLoads]) {
  using L = AttnLayout<T, kD>;
#pragma unroll
  for (int k = 0; k < L::kLoads; ++k)
    dst[k] = *reinterpret_cast<const typename L::Raw*>(src + (k * L::kLanes + lane_in_group) * 4);
}

template <typename T, int kD>
__device__ __forceinline__ void widen(const typename AttnLayout<T, kD>::Raw (&raw)[AttnLayout<T, kD>::kLoads],
                                      float (&dst)[AttnLayout<T, kD>::kPerLane]) {
  using L = AttnLayout<T, kD>;
#pragma unroll
  for (int k = 0; k < L::kLoads; ++k) {
    const T* e = reinterpret_cast<const T*>(&raw[k]);
#pragma unroll
    for (int i = 0; i < 4; ++i) dst[k * 4 + i] = to_float(e[i]);
  }
}

template <typename T, int kD>
__global__ void __launch_bounds__(kAttnThreads) cache_attention_kernel(const T* q, const T* kc, const T* vc,
                                                                        const int64_t* first, T* out, float* ws,
                                                                        AttnShape sh) {
  using L = AttnLayout<T, kD>;
  using Raw = typename L::Raw;
  const int64_t G = sh.H / sh.KVH, group_queries = sh.T * G;
  const int64_t tiles = (group_queries + kAttnTile - 1) / kAttnTile;
  const int64_t tile = blockIdx.x % tiles, g = (blockIdx.x / tiles) % sh.KVH, b = blockIdx.x / (tiles * sh.KVH);
  const int split = blockIdx.y;
  const int lane_in_group = threadIdx.x % L::kLanes, slot_group = threadIdx.x / L::kLanes;
  const int64_t j0 = tile * kAttnTile;
  const int nq = static_cast<int>((group_queries - j0 < kAttnTile ? group_queries - j0 : kAttnTile));
  // Query j of the tile is position t = (j0 + j) / G, head g * G + (j0 + j) % G; it sees slots lo .. start + t.
  const int64_t lo = first[b];
  const int64_t t_last = (j0 + nq - 1) / G;
  const int64_t s_begin = lo + static_cast<int64_t>(split) * sh.chunk;
  const int64_t s_end = ::min(s_begin + static_cast<int64_t>(sh.chunk), sh.start + t_last + 1);  // exclusive

  float qr[kAttnTile][L::kPerLane], acc[kAttnTile][L::kPerLane], m[kAttnTile], l[kAttnTile];
  int64_t limit[kAttnTile];
#pragma unroll
  for (int j = 0; j < kAttnTile; ++j) {
    m[j] = -INFINITY, l[j] = 0.0f, limit[j] = -1;
#pragma unroll
    for (int i = 0; i < L::kPerLane; ++i) qr[j][i] = 0.0f, acc[j][i] = 0.0f;
    if (j < nq) {
      const int64_t jj = j0 + j, t = jj / G, h = g * G + jj % G;
      limit[j] = sh.start + t;
      Raw raw[L::kLoads];
      load_raw<T, kD>(q + ((b * sh.T + t) * sh.H + h) * kD, lane_in_group, raw);
      widen<T, kD>(raw, qr[j]);
#pragma unroll
      for (int i = 0; i < L::kPerLane; ++i) qr[j][i] *= sh.scale;
    }
  }
  const T* kb = kc + b * sh.S * sh.KVH * kD + g * kD;
  const T* vb = vc + b * sh.S * sh.KVH * kD + g * kD;
  // A step covers kGroups x kUnroll slots. The next step's keys and values are loaded before this step's are used
  // (two steps in flight), and the softmax state moves once per step. Every warp runs the same number of steps (the
  // shuffles need all its lanes); a group past the end idles.
  constexpr int kStep = L::kGroups * L::kUnroll;
  Raw kcur[L::kUnroll][L::kLoads], vcur[L::kUnroll][L::kLoads];
  auto load_step = [&](int64_t s0, Raw (&kdst)[L::kUnroll][L::kLoads], Raw (&vdst)[L::kUnroll][L::kLoads]) {
#pragma unroll
    for (int u = 0; u < L::kUnroll; ++u) {
      const int64_t s = s0 + u * L::kGroups + slot_group;
      if (s < s_end) {
        load_raw<T, kD>(kb + s * sh.KVH * kD, lane_in_group, kdst[u]);
        load_raw<T, kD>(vb + s * sh.KVH * kD, lane_in_group, vdst[u]);
      }
    }
  };
  if (s_begin < s_end) load_step(s_begin, kcur, vcur);
  for (int64_t s0 = s_begin; s0 < s_end; s0 += kStep) {
    Raw knext[L::kUnroll][L::kLoads], vnext[L::kUnroll][L::kLoads];
    if (s0 + kStep < s_end) load_step(s0 + kStep, knext, vnext);
    float dot[L::kUnroll][kAttnTile], vr[L::kUnroll][L::kPerLane];
#pragma unroll
    for (int u = 0; u < L::kUnroll; ++u) {
      const int64_t s = s0 + u * L::kGroups + slot_group;
      const bool live = s < s_end;
      float kr[L::kPerLane];
      widen<T, kD>(kcur[u], kr);
      widen<T, kD>(vcur[u], vr[u]);
      if (!live)  // registers never loaded: their weight is 0, but 0 * NaN is not
#pragma unroll
        for (int i = 0; i < L::kPerLane; ++i) vr[u][i] = 0.0f;
#pragma unroll
      for (int j = 0; j < kAttnTile; ++j) {
        float d = 0.0f;
#pragma unroll
        for (int i = 0; i < L::kPerLane; ++i) d += qr[j][i] * kr[i];
#pragma unroll
        for (int o = L::kLanes / 2; o > 0; o /= 2) d += __shfl_xor_sync(0xffffffffu, d, o);
        dot[u][j] = (live && s <= limit[j]) ? d : -INFINITY;  // causal within a prefill tile
      }
    }
#pragma unroll
    for (int j = 0; j < kAttnTile; ++j) {
      float m_new = m[j];
#pragma unroll
      for (int u = 0; u < L::kUnroll; ++u) m_new = fmaxf(m_new, dot[u][j]);
      if (m_new == -INFINITY) continue;  // nothing seen yet
      const float corr = __expf(m[j] - m_new);  // 0 while m was -inf
      float p[L::kUnroll], psum = 0.0f;
#pragma unroll
      for (int u = 0; u < L::kUnroll; ++u) p[u] = __expf(dot[u][j] - m_new), psum += p[u];
      l[j] = l[j] * corr + psum;
#pragma unroll
      for (int i = 0; i < L::kPerLane; ++i) {
        float a = acc[j][i] * corr;
#pragma unroll
        for (int u = 0; u < L::kUnroll; ++u) a += p[u] * vr[u][i];
        acc[j][i] = a;
      }
      m[j] = m_new;
    }
#pragma unroll
    for (int u = 0; u < L::kUnroll; ++u)
#pragma unroll
      for (int k = 0; k < L::kLoads; ++k) kcur[u][k] = knext[u][k], vcur[u][k] = vnext[u][k];
  }
  // Combine the kGroups slot groups of the block through shared memory, then write the split's partial result.
  __shared__ float s_m[L::kGroups][kAttnTile], s_l[L::kGroups][kAttnTile];
  __shared__ float s_acc[L::kGroups][kAttnTile][kD];
#pragma unroll
  for (int j = 0; j < kAttnTile; ++j) {
    if (lane_in_group == 0) s_m[slot_group][j] = m[j], s_l[slot_group][j] = l[j];
#pragma unroll
    for (int k = 0; k < L::kLoads; ++k)
#pragma unroll
      for (int i = 0; i < 4; ++i) s_acc[slot_group][j][(k * L::kLanes + lane_in_group) * 4 + i] = acc[j][k * 4 + i];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < nq * kD; idx += blockDim.x) {
    const int j = idx / kD, d = idx % kD;
    float mm = -INFINITY;
    for (int gi = 0; gi < L::kGroups; ++gi) mm = fmaxf(mm, s_m[gi][j]);
    float ll = 0.0f, a = 0.0f;
    if (mm != -INFINITY)
      for (int gi = 0; gi < L::kGroups; ++gi) {
        const float f = __expf(s_m[gi][j] - mm);
        ll += s_l[gi][j] * f;
        a += s_acc[gi][j][d] * f;
      }
    const int64_t jj = j0 + j, t = jj / G, h = g * G + jj % G, query = (b * sh.T + t) * sh.H + h;
    if (sh.splits == 1) {
      out[query * kD + d] = from_float<T>(ll > 0.0f ? a / ll : 0.0f);  // an empty range (padding) gives zeros
    } else {
      float* part = ws + (static_cast<int64_t>(split) * sh.B * sh.T * sh.H + query) * (kD + 2);
      part[d] = a;
      if (d == 0) part[kD] = mm, part[kD + 1] = ll;
    }
  }
}

// One block per query: out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M) over the splits.
template <typename T>
__global__ void attention_combine_kernel(const float* ws, T* out, int64_t queries, int D, int splits) {
  const int64_t query = blockIdx.x;
  float mm = -INFINITY;
  for (int s = 0; s < splits; ++s) mm = fmaxf(mm, ws[(s * queries + query) * (D + 2) + D]);
  float ll = 0.0f;
  if (mm != -INFINITY)
    for (int s = 0; s < splits; ++s) {
      const float* part = ws + (s * queries + query) * (D + 2);
      ll += part[D + 1] * __expf(part[D] - mm);
    }
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float a = 0.0f;
    if (ll > 0.0f)
      for (int s = 0; s < splits; ++s) {
        const float* part = ws + (s * queries + query) * (D + 2);
        a += part[d] * __expf(part[D] - mm);
      }
    out[query * D + d] = from_float<T>(ll > 0.0f ? a / ll : 0.0f);
  }
}

// Splits: enough blocks to keep the memory system busy (about 8 per multiprocessor of an H100 or H200) when rows x KV
// heads x query tiles alone do not, each split at least 64 slots; a prefill's many query tiles need none.

inline AttnShape attention_shape(int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D, int64_t S, int start,
                                 float scale) {
  const int64_t tiles = (T * (H / KVH) + kAttnTile - 1) / kAttnTile;
  const int64_t base_blocks = B * KVH * tiles, span = start + T;
  int64_t splits = 1;
  constexpr int64_t kBusy = 1056;
  if (base_blocks < kBusy) splits = std::min<int64_t>((kBusy + base_blocks - 1) / base_blocks, (span + 63) / 64);
  splits = std::max<int64_t>(splits, 1);
  const int64_t chunk = (span + splits - 1) / splits;
  return {B, T, H, KVH, D, S, start, static_cast<int>(splits), static_cast<int>(chunk), scale};
}

// Floats of workspace the launch needs (0 with one split).
inline int64_t attention_workspace_floats(int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D, int64_t S,
                                          int start) {
  const AttnShape sh = attention_shape(B, T, H, KVH, D, S, start, 1.0f);
  return sh.splits == 1 ? 0 : static_cast<int64_t>(sh.splits) * B * T * H * (D + 2);
}

inline bool attention_supports(int64_t D) { return D == 64 || D == 128 || D == 256; }

template <typename T>
void launch_cache_attention(const T* q, const T* k_cache, const T* v_cache, const int64_t* first, T* out,
                            float* workspace, const AttnShape& sh, cudaStream_t stream) {
  const int64_t tiles = (sh.T * (sh.H / sh.KVH) + kAttnTile - 1) / kAttnTile;
  const dim3 grid(static_cast<unsigned>(sh.B * sh.KVH * tiles), static_cast<unsigned>(sh.splits));
  if (sh.D == 64)
    cache_attention_kernel<T, 64><<<grid, kAttnThreads, 0, stream>>>(q, k_cache, v_cache, first, out, workspace, sh);
  else if (sh.D == 128)
    cache_attention_kernel<T, 128><<<grid, kAttnThreads, 0, stream>>>(q, k_cache, v_cache, first, out, workspace, sh);
  else
    cache_attention_kernel<T, 256><<<grid, kAttnThreads, 0, stream>>>(q, k_cache, v_cache, first, out, workspace, sh);
}

// D must pass attention_supports; workspace holds attention_workspace_floats(...) floats.
template <typename T>
void cache_attention(const T* q, const T* k_cache, const T* v_cache, const int64_t* first, T* out, float* workspace,
                     int64_t B, int64_t T_, int64_t H, int64_t KVH, int64_t D, int64_t S, int start,
                     cudaStream_t stream) {
  if (B * T_ * H == 0) return;
  const AttnShape sh = attention_shape(B, T_, H, KVH, D, S, start, 1.0f / sqrtf(static_cast<float>(D)));
  launch_cache_attention<T>(q, k_cache, v_cache, first, out, workspace, sh, stream);
  if (sh.splits > 1)
    attention_combine_kernel<T><<<B * T_ * H, 64, 0, stream>>>(workspace, out, B * T_ * H, static_cast<int>(D),
                                                                sh.splits);
}

// ------------------------------------------------------------------------------------------- 4. SwiGLU

template <typename T>
__global__ void silu_mul_kernel(const T* x, T* out, int64_t rows, int64_t inter) {
  const int64_t n = rows * inter;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = k / inter, i = k % inter;
    const float a = to_float(x[r * 2 * inter + i]), u = to_float(x[r * 2 * inter + inter + i]);
    out[k] = from_float<T>(a / (1.0f + expf(-a)) * u);
  }
}

template <typename T>
void silu_mul(const T* x, T* out, int64_t rows, int64_t inter, cudaStream_t stream) {
  if (rows * inter == 0) return;
  silu_mul_kernel<T><<<grid_for(rows * inter, 256), 256, 0, stream>>>(x, out, rows, inter);
}

// ------------------------------------------------------------------------------------------- 5. sampling

// One block of kSampleThreads per row, over w, the row's shaped logits in the workspace. Every decision is made on
// 64-bit integer masses or on keys, so the result does not depend on the order of any addition (grpo_sampling.h).
// Top-k and top-p first narrow the row to the kCandidates largest (a radix select on counts); the candidates are
// sorted in shared memory and cut there. A row whose ties or flat tail do not fit takes the full-row path: a radix
// select on masses, with the ties at the cut kept in index order.
constexpr int kSampleThreads = 1024;
constexpr int kSampleItems = 4;
constexpr int kCandidates = kSampleThreads * kSampleItems;
constexpr int kNucleusWindow = 2048;  // top-p without top-k tries the top 2048 tokens first
constexpr int kMassHists = 8;

struct SampleArgs {
  const float* logits;
  const uint8_t* presence;
  const int64_t* eos;
  int64_t E, V;
  const int64_t* row_keys;
  float* work;
  SampleSettings s;
  int64_t* tokens;
  float* logprobs;
};

struct LseState {
  float m;
  double s;
};
struct LseMerge {
  __device__ LseState operator()(const LseState& a, const LseState& b) const {
    const float m = fmaxf(a.m, b.m);
    if (m == -INFINITY) return {m, 0.0};
    return {m, a.s * exp(static_cast<double>(a.m) - m) + b.s * exp(static_cast<double>(b.m) - m)};
  }
};
struct ArgMax {
  float v;
  int64_t i;
};
struct ArgMaxMerge {
  __device__ ArgMax operator()(const ArgMax& a, const ArgMax& b) const {
    return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a;
  }
};

struct SampleShared {
  using SortWide = cub::BlockRadixSort<uint64_t, kSampleThreads, kSampleItems>;
  using SortIndex = cub::BlockRadixSort<uint32_t, kSampleThreads, kSampleItems>;
  using ScanMass = cub::BlockScan<uint64_t, kSampleThreads>;
  using SumMass = cub::BlockReduce<uint64_t, kSampleThreads>;
  using MinRank = cub::BlockReduce<int, kSampleThreads>;
  using Lse = cub::BlockReduce<LseState, kSampleThreads>;
  using Arg = cub::BlockReduce<ArgMax, kSampleThreads>;
  union {
    typename SortWide::TempStorage sort_wide;
    typename SortIndex::TempStorage sort_index;
    typename ScanMass::TempStorage scan;
    typename SumMass::TempStorage sum;
    typename MinRank::TempStorage min_rank;
    typename Lse::TempStorage lse;
    typename Arg::TempStorage arg;
    uint32_t list[kCandidates];
    uint64_t hist[kMassHists][256];
  } u;
  uint32_t count_hist[256];
  int list_size;
  uint32_t key;
  uint64_t base, window_mass;
  int64_t token;
  float f;
  uint64_t total;
  double log_z;
};

// Calls f(v, x, valid) for every entry of the row, four consecutive entries per lane and two 16-byte loads in flight
// per step when the row allows, in steps that are uniform across each warp (f may use warp intrinsics; it is also
// called, with valid false, for the lanes past the end).
template <typename F>
__device__ __forceinline__ void scan_row(const float* w, int64_t V, F f) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warp_base = threadIdx.x - lane;
  if ((V & 3) == 0 && (reinterpret_cast<uintptr_t>(w) & 15) == 0) {
    const float4* w4 = reinterpret_cast<const float4*>(w);
    const int64_t n4 = V / 4, stride = blockDim.x;
    for (int64_t base = warp_base; base < n4; base += 2 * stride) {
      const int64_t i = base + lane, i2 = i + stride;
      const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      const float4 x = i < n4 ? w4[i] : zero, y = i2 < n4 ? w4[i2] : zero;
      f(4 * i, x.x, i < n4), f(4 * i + 1, x.y, i < n4), f(4 * i + 2, x.z, i < n4), f(4 * i + 3, x.w, i < n4);
      if (base + stride < n4)  // warp-uniform
        f(4 * i2, y.x, i2 < n4), f(4 * i2 + 1, y.y, i2 < n4), f(4 * i2 + 2, y.z, i2 < n4), f(4 * i2 + 3, y.w, i2 < n4);
    }
  } else {
    for (int64_t base = warp_base; base < V; base += blockDim.x) {
      const int64_t v = base + lane;
      f(v, v < V ? w[v] : 0.0f, v < V);
    }
  }
}

// Radix selection by count over all V entries of w (-inf included), `digits` bytes of the key from the top: with 4,
// the key of the k-th largest entry (k >= 1); with fewer, the lowest key of the bin that holds it. Either way,
// count_ge = how many entries are >= the returned key.
__device__ uint32_t select_by_count(const float* w, int64_t V, uint32_t k, int digits, SampleShared& sh,
                                    int64_t* count_ge) {
  uint32_t prefix = 0, mask = 0, remaining = k, count_gt = 0;
  for (int shift = 24; shift >= 32 - 8 * digits; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) sh.count_hist[i] = 0;
    __syncthreads();
    scan_row(w, V, [&](int64_t, float x, bool valid) {
      int bin = 256;  // no bin: out of range or another prefix
      const uint32_t key = sort_key(x);
      if (valid && (key & mask) == prefix) bin = (key >> shift) & 255u;
      const unsigned peers = __match_any_sync(0xffffffffu, bin);  // one atomic per bin and warp
      if (bin < 256 && (threadIdx.x % kWarp) == __ffs(peers) - 1) atomicAdd(&sh.count_hist[bin], __popc(peers));
    });
    __syncthreads();
    if (threadIdx.x == 0) {
      int chosen = 0;
      for (int bin = 255; bin >= 0; --bin) {
        const uint32_t c = sh.count_hist[bin];
        if (c >= remaining) {
          chosen = bin;
          break;
        }
        remaining -= c, count_gt += c;
      }
      sh.key = prefix | (static_cast<uint32_t>(chosen) << shift);
      sh.list_size = static_cast<int>(sh.count_hist[chosen]);
    }
    __syncthreads();
    prefix = sh.key;
    mask |= 255u << shift;
  }
  // count_gt as thread 0 counted it, plus the ties (the last pass's bin)
  if (threadIdx.x == 0) sh.total = count_gt;
  __syncthreads();
  *count_ge = static_cast<int64_t>(sh.total) + sh.list_size;
  __syncthreads();
  return prefix;
}

// The key K at which the mass, accumulated from the largest key down, becomes past the nucleus: every key above K
// is kept, every key below dropped. Also M(> K) and the mass of one token of key K.
__device__ uint32_t select_by_mass(const float* w, int64_t V, float mx, uint64_t total, float top_p,
                                  SampleShared& sh) {
  uint32_t prefix = 0, mask = 0;
  uint64_t base = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < kMassHists * 256; i += blockDim.x) sh.u.hist[i / 256][i % 256] = 0;
    __syncthreads();
    // Integer atomics (the sum is the same in any order), spread over kMassHists copies against contention.
    uint64_t* hist = sh.u.hist[(threadIdx.x / kWarp) % kMassHists];
    scan_row(w, V, [&](int64_t, float x, bool valid) {
      const uint32_t key = sort_key(x);
      if (!valid || (key & mask) != prefix) return;
      const uint64_t mass = sampling_mass(sub_exact(x, mx));
      if (mass) atomicAdd(reinterpret_cast<unsigned long long*>(&hist[(key >> shift) & 255u]), mass);
    });
    __syncthreads();
    for (int bin = threadIdx.x; bin < 256; bin += blockDim.x)
      for (int k = 1; k < kMassHists; ++k) sh.u.hist[0][bin] += sh.u.hist[k][bin];
    __syncthreads();
    if (threadIdx.x == 0) {
      const uint64_t* merged = sh.u.hist[0];
      int chosen = -1, lowest = -1;
      for (int bin = 255; bin >= 0; --bin) {
        if (merged[bin] == 0) continue;
        lowest = bin;
        if (past_nucleus(base + merged[bin], total, top_p)) {
          chosen = bin;
          break;
        }
        base += merged[bin];
      }
      if (chosen < 0) chosen = lowest;  // cannot happen: the whole mass is past the nucleus
      sh.key = prefix | (static_cast<uint32_t>(chosen < 0 ? 0 : chosen) << shift);
      sh.base = base;
    }
    __syncthreads();
    prefix = sh.key;
    base = sh.base;
    mask |= 255u << shift;
  }
  return prefix;
}

__device__ __forceinline__ float key_value(uint32_t key) {
  const uint32_t u = (key & 0x80000000u) ? (key & 0x7fffffffu) : ~key;
  return __uint_as_float(u);
}

// Drops (sets -inf) every entry of w for which drop(v, key) holds.
template <typename Drop>
__device__ void drop_where(float* w, int64_t V, Drop drop) {
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
    if (drop(v, sort_key(w[v]))) w[v] = -INFINITY;
  __syncthreads();
}

// Full-row top-p: keys above the cut kept, below dropped, and at the cut the first n in index order.
__device__ void nucleus_full_row(float* w, int64_t V, float mx, float top_p, SampleShared& sh) {
  using Sum = SampleShared::SumMass;
  uint64_t local = 0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) local += sampling_mass(sub_exact(w[v], mx));
  const uint64_t total_sum = Sum(sh.u.sum).Sum(local);
  if (threadIdx.x == 0) sh.total = total_sum;
  __syncthreads();
  const uint64_t total = sh.total;
  const uint32_t cut = select_by_mass(w, V, mx, total, top_p, sh);
  const uint64_t base = sh.base, m = sampling_mass(sub_exact(key_value(cut), mx));
  // Ties at the cut, in index order: chunk per thread, an exclusive scan of the chunk counts.
  const int64_t chunk = (V + blockDim.x - 1) / blockDim.x, begin = threadIdx.x * chunk;
  const int64_t end = min(V, begin + chunk);
  uint64_t ties = 0;
#pragma unroll 4
  for (int64_t v = begin; v < end; ++v) ties += sort_key(w[v]) == cut;
  uint64_t before = 0, all_ties = 0;
  __syncthreads();
  SampleShared::ScanMass(sh.u.scan).ExclusiveSum(ties, before, all_ties);
  if (threadIdx.x == 0) {  // n = how many ties stay: the largest n with the (n-1)-th not past (binary search)
    uint64_t lo = 1, hi = all_ties;  // the first tie is kept: M(> cut) is not past
    while (lo < hi) {
      const uint64_t mid = (lo + hi + 1) / 2;
      if (past_nucleus(base + m * (mid - 1), total, top_p)) hi = mid - 1;
      else lo = mid;
    }
    sh.total = lo;
  }
  __syncthreads();
  const uint64_t keep_ties = sh.total;
  uint64_t seen = before;
  for (int64_t v = begin; v < end; ++v) {
    const uint32_t key = sort_key(w[v]);
    if (key < cut || (key == cut && seen++ >= keep_ties)) w[v] = -INFINITY;
  }
  __syncthreads();
}

// Full-row draw in index order (min_p applied on the way): chunk per thread, exclusive scan of the chunk masses.
__device__ int64_t draw_full_row(const float* w, int64_t V, float mx, float min_p, double u, SampleShared& sh) {
  const int64_t chunk = (V + blockDim.x - 1) / blockDim.x, begin = threadIdx.x * chunk;
  const int64_t end = min(V, begin + chunk);
  auto mass_of = [&](int64_t v) -> uint64_t {
    const float d = sub_exact(w[v], mx);
    if (min_p > 0.0f && sampling_exp(d) < min_p) return 0;
    return sampling_mass(d);
  };
  uint64_t local = 0;
#pragma unroll 4
  for (int64_t v = begin; v < end; ++v) local += mass_of(v);
  uint64_t before = 0, total = 0;
  __syncthreads();
  SampleShared::ScanMass(sh.u.scan).ExclusiveSum(local, before, total);
  const uint64_t target = draw_target(u, total);
  if (local > 0 && before <= target && target < before + local) {
    uint64_t cum = before;
    for (int64_t v = begin; v < end; ++v) {
      cum += mass_of(v);
      if (cum > target) {
        sh.token = v;
        break;
      }
    }
  }
  __syncthreads();
  return sh.token;
}

// The candidates gathered in sh.u.list (sh.list_size of them, every key >= the window's floor) sorted in shared
// memory: top-k's exact k-th key, top-p's cut, min_p, then the draw among what is left, in index order. total_all is
// the mass of the whole row (top-p's total without top-k).
__device__ int64_t sample_candidates(const float* w, float mx, uint64_t total_all, bool use_top_k,
                                     const SampleSettings& s, double u, SampleShared& sh) {
  const int n = sh.list_size;
  // Rank order: key descending, index ascending = ascending (~key, index).
  uint64_t items[kSampleItems];
#pragma unroll
  for (int i = 0; i < kSampleItems; ++i) {
    const int r = threadIdx.x * kSampleItems + i;
    items[i] = ~0ull;
    if (r < n) {
      const uint32_t v = sh.u.list[r];
      items[i] = (static_cast<uint64_t>(~sort_key(w[v])) << 32) | v;
    }
  }
  if (threadIdx.x == 0) sh.key = 0;  // below every finite key: fewer than k finite tokens keep them all
  __syncthreads();
  SampleShared::SortWide(sh.u.sort_wide).Sort(items);  // blocked: thread t holds ranks 4t .. 4t + 3
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kSampleItems; ++i)
    if (use_top_k && threadIdx.x * kSampleItems + i == s.top_k - 1 && s.top_k <= n)
      sh.key = ~static_cast<uint32_t>(items[i] >> 32);
  __syncthreads();
  const uint32_t kth = sh.key;
  uint64_t mass[kSampleItems];
  float d[kSampleItems];
  int first_out = n;  // the first rank top-k removes (keys descend, so the kept ranks are a prefix)
#pragma unroll
  for (int i = 0; i < kSampleItems; ++i) {
    const int r = threadIdx.x * kSampleItems + i;
    const bool kept = r < n && (!use_top_k || ~static_cast<uint32_t>(items[i] >> 32) >= kth);
    if (r < n && !kept) first_out = min(first_out, r);
    d[i] = kept ? sub_exact(w[static_cast<uint32_t>(items[i])], mx) : -INFINITY;
    mass[i] = kept ? sampling_mass(d[i]) : 0;
  }
  first_out = SampleShared::MinRank(sh.u.min_rank).Reduce(first_out, ::cuda::minimum<>());
  if (threadIdx.x == 0) sh.list_size = first_out;
  __syncthreads();
  const int n_kept = sh.list_size;
  int cut = n_kept;
  if (s.top_p < 1.0f) {
    uint64_t above[kSampleItems], kept_mass = 0;
    SampleShared::ScanMass(sh.u.scan).ExclusiveSum(mass, above, kept_mass);
    const uint64_t total = use_top_k ? kept_mass : total_all;  // top-p's total is what top-k left
    __syncthreads();
    int first_past = n_kept;
#pragma unroll
    for (int i = 0; i < kSampleItems; ++i) {
      const int r = threadIdx.x * kSampleItems + i;
      if (r >= 1 && r < n_kept && past_nucleus(above[i], total, s.top_p)) first_past = min(first_past, r);
    }
    first_past = SampleShared::MinRank(sh.u.min_rank).Reduce(first_past, ::cuda::minimum<>());
    if (threadIdx.x == 0) sh.list_size = first_past;
    __syncthreads();
    cut = sh.list_size;
  }
  uint32_t index_keys[kSampleItems];
#pragma unroll
  for (int i = 0; i < kSampleItems; ++i) {
    const int r = threadIdx.x * kSampleItems + i;
    const bool kept = r < cut && !(s.min_p > 0.0f && sampling_exp(d[i]) < s.min_p);
    index_keys[i] = kept ? static_cast<uint32_t>(items[i]) : 0xffffffffu;
  }
  __syncthreads();
  SampleShared::SortIndex(sh.u.sort_index).Sort(index_keys);  // kept tokens first, in index order
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kSampleItems; ++i)
    mass[i] = index_keys[i] == 0xffffffffu ? 0 : sampling_mass(sub_exact(w[index_keys[i]], mx));
  uint64_t before[kSampleItems], kept_total = 0;
  SampleShared::ScanMass(sh.u.scan).ExclusiveSum(mass, before, kept_total);
  const uint64_t target = draw_target(u, kept_total);
#pragma unroll
  for (int i = 0; i < kSampleItems; ++i)
    if (mass[i] > 0 && before[i] <= target && target < before[i] + mass[i]) sh.token = index_keys[i];
  __syncthreads();
  return sh.token;
}

__global__ void __launch_bounds__(kSampleThreads) sample_kernel(SampleArgs a) {
  __shared__ SampleShared sh;
  const SampleSettings& s = a.s;
  const int64_t b = blockIdx.x, V = a.V;
  const float* raw = a.logits + b * V;
  const uint8_t* pres = a.presence + b * V;
  float* w = a.work + b * V;
  const float inv_t = s.greedy ? 1.0f : div_exact(1.0f, s.temperature);
  const bool eos_blocked = s.step < s.min_new_tokens && a.E > 0;
  // Pass 1: shaped logits, their argmax (greedy) and max, and the log-sum-exp of raw / t for the log-prob.
  ArgMax best{-INFINITY, V};
  float lse_m = -INFINITY, lse_s = 0.0f;  // this thread's part, in float; merged in double
  auto visit = [&](int64_t v, float r, bool present) {
    float x = shaped_logit(r, present, s.repetition_penalty, inv_t);
    if (eos_blocked)
      for (int64_t e = 0; e < a.E; ++e)
        if (a.eos[e] == v) x = -INFINITY;
    w[v] = x;
    if (x > best.v || best.i == V) best = {x, v};
    const float y = mul_exact(r, inv_t);
    if (y == -INFINITY) return;
    if (y > lse_m) lse_s = lse_s * expf(lse_m - y) + 1.0f, lse_m = y;
    else lse_s += expf(y - lse_m);
  };
  if ((V & 3) == 0 && (reinterpret_cast<uintptr_t>(raw) & 15) == 0 && (reinterpret_cast<uintptr_t>(pres) & 3) == 0) {
    const float4* raw4 = reinterpret_cast<const float4*>(raw);
    const uchar4* pres4 = reinterpret_cast<const uchar4*>(pres);
#pragma unroll 2
    for (int64_t i = threadIdx.x; i < V / 4; i += blockDim.x) {
      const float4 r = raw4[i];
      const uchar4 p = pres4[i];
      visit(4 * i, r.x, p.x != 0), visit(4 * i + 1, r.y, p.y != 0), visit(4 * i + 2, r.z, p.z != 0),
          visit(4 * i + 3, r.w, p.w != 0);
    }
  } else {
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) visit(v, raw[v], pres[v] != 0);
  }
  best = SampleShared::Arg(sh.u.arg).Reduce(best, ArgMaxMerge());
  if (threadIdx.x == 0) sh.token = best.v == -INFINITY ? 0 : best.i, sh.f = best.v;
  __syncthreads();
  const LseState lse = SampleShared::Lse(sh.u.lse).Reduce(LseState{lse_m, static_cast<double>(lse_s)}, LseMerge());
  if (threadIdx.x == 0) sh.log_z = static_cast<double>(lse.m) + log(lse.s);
  __syncthreads();
  const float mx = sh.f;
  int64_t token = sh.token;  // greedy's answer, and sampling's when every token is blocked
  if (!s.greedy && mx != -INFINITY) {
    const double u = uniform_draw(s.seed, s.step, a.row_keys[b]);
    const bool use_top_k = s.top_k > 0 && s.top_k < V, use_top_p = s.top_p < 1.0f;
    if (!use_top_k && !use_top_p) {
      token = draw_full_row(w, V, mx, s.min_p, u, sh);
    } else {
      // The window: a 16-bit key prefix that holds at least top_k (or 2,048) of the largest entries.
      int64_t count_ge = 0;
      const uint32_t window = use_top_k ? s.top_k : static_cast<uint32_t>(V < kNucleusWindow ? V : kNucleusWindow);
      const uint32_t floor = select_by_count(w, V, window, 2, sh, &count_ge);
      const bool gather = count_ge <= kCandidates;
      // One pass: the mass of the row and of the window (warp sums, then integer atomics), and the window gathered.
      if (threadIdx.x == 0) sh.list_size = 0, sh.total = 0, sh.window_mass = 0;
      __syncthreads();
      uint64_t all = 0, in_window = 0;
      scan_row(w, V, [&](int64_t v, float x, bool valid) {
        const bool inside = valid && sort_key(x) >= floor && x != -INFINITY;
        const uint64_t m = valid ? sampling_mass(sub_exact(x, mx)) : 0;
        all += m;
        in_window += inside ? m : 0;
        if (!gather) return;  // block-uniform
        const unsigned ballot = __ballot_sync(0xffffffffu, inside);
        int slot = 0;
        if ((threadIdx.x % kWarp) == 0 && ballot) slot = atomicAdd(&sh.list_size, __popc(ballot));
        slot = __shfl_sync(0xffffffffu, slot, 0);
        if (inside) sh.u.list[slot + __popc(ballot & ((1u << (threadIdx.x % kWarp)) - 1))] = static_cast<uint32_t>(v);
      });
      for (int o = kWarp / 2; o > 0; o /= 2) {
        all += __shfl_xor_sync(0xffffffffu, all, o);
        in_window += __shfl_xor_sync(0xffffffffu, in_window, o);
      }
      if (threadIdx.x % kWarp == 0) {
        atomicAdd(reinterpret_cast<unsigned long long*>(&sh.total), all);
        atomicAdd(reinterpret_cast<unsigned long long*>(&sh.window_mass), in_window);
      }
      __syncthreads();
      all = sh.total, in_window = sh.window_mass;
      if (gather && (use_top_k || past_nucleus(in_window, all, s.top_p))) {
        token = sample_candidates(w, mx, all, use_top_k, s, u, sh);
      } else {  // the full row: ties or a flat tail that the window cannot hold
        if (use_top_k) {
          const uint32_t kth = select_by_count(w, V, s.top_k, 4, sh, &count_ge);
          drop_where(w, V, [kth](int64_t, uint32_t key) { return key < kth; });
        }
        if (use_top_p) nucleus_full_row(w, V, mx, s.top_p, sh);
        token = draw_full_row(w, V, mx, s.min_p, u, sh);
      }
    }
  }
  if (threadIdx.x == 0) {
    a.tokens[b] = token;
    a.logprobs[b] = static_cast<float>(static_cast<double>(mul_exact(raw[token], inv_t)) - sh.log_z);
  }
}

inline void sample(const SampleArgs& args, int64_t B, cudaStream_t stream) {
  if (B == 0) return;
  sample_kernel<<<B, kSampleThreads, 0, stream>>>(args);
}

// ------------------------------------------------------------------------------------------- 6. stop bookkeeping

// done[b] = tokens[b] is an eos id; presence[b, token] = 1. A token outside [0, V) is refused as on the CPU: the
// lowest such row goes to bad_row (set to INT64_MAX by the launcher) and nothing of that row is written.
__global__ void stop_update_kernel(const int64_t* tokens, uint8_t* presence, const int64_t* eos, int64_t B, int64_t E,
                                   int64_t V, bool* done, unsigned long long* bad_row) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= B) return;
  const int64_t tok = tokens[b];
  if (tok < 0 || tok >= V) {
    atomicMin(bad_row, static_cast<unsigned long long>(b));
    return;
  }
  bool hit = false;
  for (int64_t e = 0; e < E; ++e) hit |= tok == eos[e];
  done[b] = hit;
  presence[b * V + tok] = 1;
}

inline void stop_update(const int64_t* tokens, uint8_t* presence, const int64_t* eos, int64_t B, int64_t E,
                        int64_t V, bool* done, unsigned long long* bad_row, cudaStream_t stream) {
  cudaMemsetAsync(bad_row, 0xff, sizeof(unsigned long long), stream);
  if (B == 0) return;
  stop_update_kernel<<<grid_for(B, 128), 128, 0, stream>>>(tokens, presence, eos, B, E, V, done, bad_row);
}

// ------------------------------------------------------------------------------------------- 7. row compaction

// Thread (o, j) moves word j of rows keep[0..n) to rows 0..n-1 under outer index o, in order: each column is owned
// by one thread, so the in-order rule of the CPU kernel holds without synchronisation.
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

inline void compact_rows(void* x, const int64_t* keep, int64_t n, int64_t outer, int64_t rows, int64_t row_bytes,
                         int64_t move_bytes, cudaStream_t stream) {
  if (outer * move_bytes == 0) return;
  if (row_bytes % 4 == 0 && move_bytes % 4 == 0)
    compact_rows_kernel<uint32_t><<<grid_for(outer * move_bytes / 4, 256), 256, 0, stream>>>(
        static_cast<uint32_t*>(x), keep, n, outer, rows, row_bytes / 4, move_bytes / 4);
  else
    compact_rows_kernel<uint8_t><<<grid_for(outer * move_bytes, 256), 256, 0, stream>>>(
        static_cast<uint8_t*>(x), keep, n, outer, rows, row_bytes, move_bytes);
}

}  // namespace kernels
}  // namespace grpo
