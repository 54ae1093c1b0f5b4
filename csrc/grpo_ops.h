// Shared declarations of the fused rollout operators: the CPU entry points in grpo_ops.cc validate
// shapes and dtypes once, then run the CPU kernels or, for tensors on a GPU, the CUDA launchers in
// grpo_ops.cu (compiled only into a CUDA build, which defines GRPO_WITH_CUDA).
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "grpo_sampling.h"
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

// grpo_cache_attention's checked inputs and output (grpo_ops.cc), which its prefill path (grpo_attention.cc) reads too.
struct CacheQueries {
  const float* q;        // (B, T, H, D)
  const int64_t* first;  // (B,) each row's first real slot
  float* out;            // (B, T, H D)
  int64_t B, T, H, KVH, D, S, start;
  bool round_bf16;
  // A decode step over groups that share their prompt: slots below prompt_slots come from the prompt cache (L, 2, U,
  // prompt_slots, KVH, D), row b's from its prompt prompt_of_row[b]; nullptr: every slot from the row's own cache.
  const int64_t* prompt_of_row = nullptr;
  int64_t prompt_rows = 0, prompt_slots = 0;
};

#ifdef GRPO_WITH_DNNL
// Whether the queries are a prefill that runs faster in blocks, each block's products through a GEMM, than one query at
// a time; and that path (grpo_attention.cc). kc: the layer's keys (Bcap, S, KVH, D), its values at kc + Bcap S KVH D.
bool prefill_in_blocks(const CacheQueries& r, bool bf16_cache);
void prefill_attention(const CacheQueries& r, const float* kc, int64_t Bcap);
void prefill_attention(const CacheQueries& r, const uint16_t* kc, int64_t Bcap);
#endif

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
                 const paddle::Tensor& row_keys, const SampleSettings& settings, paddle::Tensor& tokens,
                 paddle::Tensor& logprobs);
void stop_update_cuda(const paddle::Tensor& tokens, paddle::Tensor& presence, const paddle::Tensor& eos_ids,
                      paddle::Tensor& done);
void compact_rows_cuda(paddle::Tensor& x, const paddle::Tensor& keep, int64_t outer, int64_t rows, int64_t row_bytes,
                       int64_t move_bytes);
#endif

}  // namespace grpo
