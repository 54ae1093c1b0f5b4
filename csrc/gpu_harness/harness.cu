// The CUDA kernels of grpo_kernels.cuh and the CPU sampling kernel of grpo_sampling.h behind a C interface on raw
// pointers, for tests/kernels/test_cuda_kernels.py (ctypes over torch tensors) and bench/bench_cuda.py, on a GPU machine without paddle:
//     nvcc -O3 -arch=sm_90 -shared -Xcompiler -fPIC -Icsrc csrc/gpu_harness/harness.cu -o libgrpo_harness.so
// (tests/helpers/cuda_harness.py builds it). dtype 0 = float32, 1 = bfloat16. Each call returns the CUDA error code of the
// launch (0 = none).
#include "grpo_kernels.cuh"

using namespace grpo;
using bf16 = __nv_bfloat16;

#define DISPATCH(dtype, call_f32, call_bf16) \
  do {                                       \
    if ((dtype) == 0) call_f32;              \
    else call_bf16;                          \
  } while (0)

static int last_error() { return static_cast<int>(cudaGetLastError()); }

extern "C" {

int grpo_add_rms_norm(int dtype, const void* x, const void* residual, const void* weight, float eps, int64_t rows,
                      int64_t hd, void* out, void* residual_out, void* stream) {
  DISPATCH(dtype,
           kernels::add_rms_norm<float>((const float*)x, (const float*)residual, (const float*)weight, eps, rows, hd,
                                        (float*)out, (float*)residual_out, (cudaStream_t)stream),
           kernels::add_rms_norm<bf16>((const bf16*)x, (const bf16*)residual, (const bf16*)weight, eps, rows, hd,
                                       (bf16*)out, (bf16*)residual_out, (cudaStream_t)stream));
  return last_error();
}

int grpo_rope_kv_write(int dtype, const void* qkv, const int64_t* positions, const float* cos, const float* sin,
                       void* k_cache, void* v_cache, void* q, int64_t B, int64_t T, int64_t S, int start, int H,
                       int KVH, int D, void* stream) {
  DISPATCH(dtype,
           kernels::rope_kv_write<float>((const float*)qkv, positions, cos, sin, (float*)k_cache, (float*)v_cache,
                                         (float*)q, B, T, S, start, H, KVH, D, (cudaStream_t)stream),
           kernels::rope_kv_write<bf16>((const bf16*)qkv, positions, cos, sin, (bf16*)k_cache, (bf16*)v_cache,
                                        (bf16*)q, B, T, S, start, H, KVH, D, (cudaStream_t)stream));
  return last_error();
}

int64_t grpo_attention_workspace_floats(int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D, int64_t S,
                                        int start) {
  return kernels::attention_workspace_floats(B, T, H, KVH, D, S, start);
}

int grpo_attention_splits(int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D, int64_t S, int start) {
  return kernels::attention_shape(B, T, H, KVH, D, S, start, 1.0f).splits;
}

int grpo_cache_attention(int dtype, const void* q, const void* k_cache, const void* v_cache, const int64_t* first,
                         void* out, float* workspace, int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                         int64_t S, int start, void* stream) {
  if (!kernels::attention_supports(D)) return -1;
  DISPATCH(dtype,
           kernels::cache_attention<float>((const float*)q, (const float*)k_cache, (const float*)v_cache, first,
                                           (float*)out, workspace, B, T, H, KVH, D, S, start, (cudaStream_t)stream),
           kernels::cache_attention<bf16>((const bf16*)q, (const bf16*)k_cache, (const bf16*)v_cache, first,
                                          (bf16*)out, workspace, B, T, H, KVH, D, S, start, (cudaStream_t)stream));
  return last_error();
}

int grpo_silu_mul(int dtype, const void* x, void* out, int64_t rows, int64_t inter, void* stream) {
  DISPATCH(dtype, kernels::silu_mul<float>((const float*)x, (float*)out, rows, inter, (cudaStream_t)stream),
           kernels::silu_mul<bf16>((const bf16*)x, (bf16*)out, rows, inter, (cudaStream_t)stream));
  return last_error();
}

static SampleSettings settings(int64_t seed, int step, int min_new_tokens, float temperature, int top_k, float top_p,
                               float min_p, float repetition_penalty, int greedy) {
  return {seed, step, min_new_tokens, temperature, top_k, top_p, min_p, repetition_penalty, greedy != 0};
}

// work: (B, V) floats of scratch on the GPU.
int grpo_sample(const float* logits, const uint8_t* presence, const int64_t* eos, int64_t E, int64_t B, int64_t V,
                const int64_t* row_keys, float* work, int64_t seed, int step, int min_new_tokens, float temperature,
                int top_k, float top_p, float min_p, float repetition_penalty, int greedy, int64_t* tokens,
                float* logprobs, void* stream) {
  const kernels::SampleArgs args{logits, presence, eos, E, V, row_keys, work,
                                 settings(seed, step, min_new_tokens, temperature, top_k, top_p, min_p,
                                          repetition_penalty, greedy),
                                 tokens, logprobs};
  kernels::sample(args, B, (cudaStream_t)stream);
  return last_error();
}

// The CPU kernel grpo_sample runs on CPU tensors, on host pointers.
void grpo_sample_cpu(const float* logits, const uint8_t* presence, const int64_t* eos, int64_t E, int64_t B,
                     int64_t V, const int64_t* row_keys, int64_t seed, int step, int min_new_tokens,
                     float temperature, int top_k, float top_p, float min_p, float repetition_penalty, int greedy,
                     int64_t* tokens, float* logprobs) {
  sample_rows(logits, presence, eos, E, B, V, row_keys,
              settings(seed, step, min_new_tokens, temperature, top_k, top_p, min_p, repetition_penalty, greedy),
              tokens, logprobs);
}

// bad_row: one unsigned 64-bit on the GPU; after the call it holds the lowest row whose token is outside [0, V),
// or 2^64 - 1.
int grpo_stop_update(const int64_t* tokens, uint8_t* presence, const int64_t* eos, int64_t B, int64_t E, int64_t V,
                     bool* done, unsigned long long* bad_row, void* stream) {
  kernels::stop_update(tokens, presence, eos, B, E, V, done, bad_row, (cudaStream_t)stream);
  return last_error();
}

int grpo_compact_rows(void* x, const int64_t* keep, int64_t n, int64_t outer, int64_t rows, int64_t row_bytes,
                      int64_t move_bytes, void* stream) {
  kernels::compact_rows(x, keep, n, outer, rows, row_bytes, move_bytes, (cudaStream_t)stream);
  return last_error();
}

}  // extern "C"
