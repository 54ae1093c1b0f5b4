// Shared declarations of the fused rollout operators: the CPU entry points in grpo_ops.cc validate
// shapes and dtypes once, then run the CPU kernels or, for tensors on a GPU, the CUDA launchers in
// grpo_ops.cu (compiled only into a CUDA build, which defines GRPO_WITH_CUDA).
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "paddle/extension.h"

namespace grpo {

// Inputs may be strided views when paddle's stride kernels are on; kernels index densely.
inline paddle::Tensor dense(const paddle::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

inline std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

// splitmix64: the counter-based generator behind sampling. The same (seed, step, row key) gives the
// same draw on every machine, thread count and device; the row key is the row's index in the global
// batch (grpo_sample's row_keys), so a row draws the same tokens whichever process, batch or compacted
// position it is in.
#if defined(__CUDACC__)
__host__ __device__
#endif
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Uniform double in [0, 1) for row `row` of decode step `step` under `seed`.
#if defined(__CUDACC__)
__host__ __device__
#endif
inline double uniform_draw(int64_t seed, int64_t step, int64_t row) {
  uint64_t key = splitmix64(static_cast<uint64_t>(seed));
  key = splitmix64(key ^ (static_cast<uint64_t>(step) * 0xD1B54A32D192ED03ULL));
  const uint64_t x = splitmix64(key ^ (static_cast<uint64_t>(row) * 0x8CB92BA72F3D8DD7ULL));
  return static_cast<double>(x >> 11) * (1.0 / 9007199254740992.0);  // 53 random bits
}

#ifdef GRPO_WITH_CUDA
// CUDA launchers (grpo_ops.cu). Arguments are already validated; sizes are passed in.
void add_rms_norm_cuda(const paddle::Tensor& x, const paddle::optional<paddle::Tensor>& residual,
                       const paddle::Tensor& weight, float eps, int64_t rows, int64_t hd,
                       paddle::Tensor& out, paddle::Tensor& residual_out);
void rope_kv_write_cuda(const paddle::Tensor& qkv, const paddle::Tensor& positions, const paddle::Tensor& cos,
                        const paddle::Tensor& sin, paddle::Tensor& cache, int layer, int start, int num_heads,
                        int num_kv_heads, paddle::Tensor& q);
void cache_attention_cuda(const paddle::Tensor& q, const paddle::Tensor& cache, const paddle::Tensor& first_slot,
                          int layer, int start, int num_kv_heads, paddle::Tensor& out);
void silu_mul_cuda(const paddle::Tensor& x, int64_t rows, int64_t inter, paddle::Tensor& out);
void sample_cuda(const paddle::Tensor& logits, const paddle::Tensor& presence, const paddle::Tensor& eos_ids,
                 const paddle::Tensor& row_keys, int64_t seed, int step, int min_new_tokens, float temperature, int top_k, float top_p, float min_p,
                 float repetition_penalty, bool greedy, paddle::Tensor& tokens, paddle::Tensor& logprobs);
void stop_update_cuda(const paddle::Tensor& tokens, paddle::Tensor& presence, const paddle::Tensor& eos_ids,
                      paddle::Tensor& done);
void compact_rows_cuda(paddle::Tensor& x, const paddle::Tensor& keep, int64_t outer, int64_t rows, int64_t row_bytes,
                       int64_t move_bytes);
#endif

}  // namespace grpo
