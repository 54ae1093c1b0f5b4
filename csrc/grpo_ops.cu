// Launchers of the fused rollout operators for paddle's GPU tensors (float32): grpo_ops.cc validates every input
// and calls these; the kernels are grpo_kernels.cuh's, which the paddle-free harness (csrc/gpu_harness, make
// test-gpu) checks against torch. Compiled only into a CUDA build of paddle (csrc/build.py), which defines
// GRPO_WITH_CUDA.

#include "grpo_kernels.cuh"
#include "grpo_ops.h"

namespace grpo {
namespace {

void check_launch(const char* op) {
  const cudaError_t err = cudaGetLastError();
  PD_CHECK(err == cudaSuccess, op, ": CUDA kernel launch failed: ", cudaGetErrorString(err));
}

}  // namespace

void add_rms_norm_cuda(const paddle::Tensor& x, const paddle::optional<paddle::Tensor>& residual,
                       const paddle::Tensor& weight, float eps, int64_t rows, int64_t hd, paddle::Tensor& out,
                       paddle::Tensor& residual_out) {
  kernels::add_rms_norm<float>(x.data<float>(), residual ? residual->data<float>() : nullptr, weight.data<float>(),
                               eps, rows, hd, out.data<float>(), residual_out.data<float>(), x.stream());
  check_launch("grpo_add_rms_norm");
}

void rope_kv_write_cuda(const paddle::Tensor& qkv, const paddle::Tensor& positions, const paddle::Tensor& cos,
                        const paddle::Tensor& sin, paddle::Tensor& cache, int layer, int start, int num_heads,
                        int num_kv_heads, paddle::Tensor& q) {
  const auto qs = qkv.shape(), cs = cache.shape();  // cache [L, 2, Bcap, S, KVH, D]
  const int64_t B = qs[0], T = qs[1], Bcap = cs[2], S = cs[3], D = cs[5];
  float* kc = cache.data<float>() + static_cast<int64_t>(layer) * 2 * Bcap * S * num_kv_heads * D;
  float* vc = kc + Bcap * S * num_kv_heads * D;
  // Positions index the rotary tables; out-of-range values are rejected here on the host.
  const auto pos_host = positions.copy_to(phi::CPUPlace(), true);
  const int64_t P = cos.shape()[0];
  const int64_t* p = pos_host.data<int64_t>();
  for (int64_t i = 0; i < B * T; ++i)
    PD_CHECK(p[i] >= 0 && p[i] < P, "grpo_rope_kv_write: positions[", i / T, ", ", i % T, "] = ", p[i],
             " is outside the rotary table of ", P, " rows");
  kernels::rope_kv_write<float>(qkv.data<float>(), positions.data<int64_t>(), cos.data<float>(), sin.data<float>(),
                                kc, vc, q.data<float>(), B, T, S, start, num_heads, num_kv_heads,
                                static_cast<int>(D), qkv.stream());
  check_launch("grpo_rope_kv_write");
}

void cache_attention_cuda(const paddle::Tensor& q, const paddle::Tensor& cache, const paddle::Tensor& first_slot,
                          int layer, int start, int num_kv_heads, paddle::Tensor& out) {
  const auto qs = q.shape(), cs = cache.shape();
  const int64_t B = qs[0], T = qs[1], H = qs[2], D = qs[3], Bcap = cs[2], S = cs[3];
  PD_CHECK(kernels::attention_supports(D), "grpo_cache_attention: the CUDA kernel takes head dims 64, 128 and 256, got ",
           D);
  const float* kc = cache.data<float>() + static_cast<int64_t>(layer) * 2 * Bcap * S * num_kv_heads * D;
  const float* vc = kc + Bcap * S * num_kv_heads * D;
  const int64_t ws_floats = kernels::attention_workspace_floats(B, T, H, num_kv_heads, D, S, start);
  auto workspace = paddle::empty({std::max<int64_t>(ws_floats, 1)}, paddle::DataType::FLOAT32, q.place());
  kernels::cache_attention<float>(q.data<float>(), kc, vc, first_slot.data<int64_t>(), out.data<float>(),
                                  workspace.data<float>(), B, T, H, num_kv_heads, D, S, start, q.stream());
  check_launch("grpo_cache_attention");
}

void silu_mul_cuda(const paddle::Tensor& x, int64_t rows, int64_t inter, paddle::Tensor& out) {
  kernels::silu_mul<float>(x.data<float>(), out.data<float>(), rows, inter, x.stream());
  check_launch("grpo_silu_mul");
}

void sample_cuda(const paddle::Tensor& logits, const paddle::Tensor& presence, const paddle::Tensor& eos_ids,
                 const paddle::Tensor& row_keys, const SampleSettings& settings, paddle::Tensor& tokens,
                 paddle::Tensor& logprobs) {
  const int64_t B = logits.shape()[0], V = logits.shape()[1], E = eos_ids.shape()[0];
  auto work = paddle::empty({std::max<int64_t>(B * V, 1)}, paddle::DataType::FLOAT32, logits.place());
  const kernels::SampleArgs args{logits.data<float>(), presence.data<uint8_t>(), eos_ids.data<int64_t>(), E, V,
                                 row_keys.data<int64_t>(), work.data<float>(), settings, tokens.data<int64_t>(),
                                 logprobs.data<float>()};
  kernels::sample(args, B, logits.stream());
  check_launch("grpo_sample");
}

void stop_update_cuda(const paddle::Tensor& tokens, paddle::Tensor& presence, const paddle::Tensor& eos_ids,
                      paddle::Tensor& done) {
  const int64_t B = tokens.shape()[0], E = eos_ids.shape()[0], V = presence.shape()[1];
  auto bad_row = paddle::empty({1}, paddle::DataType::INT64, tokens.place());
  kernels::stop_update(tokens.data<int64_t>(), presence.data<uint8_t>(), eos_ids.data<int64_t>(), B, E, V,
                       done.data<bool>(), reinterpret_cast<unsigned long long*>(bad_row.data<int64_t>()),
                       tokens.stream());
  check_launch("grpo_stop_update");
  // The same refusal as the CPU kernel's: the first row whose token is outside the vocabulary.
  const auto bad = bad_row.copy_to(phi::CPUPlace(), true);
  const int64_t b = bad.data<int64_t>()[0];
  if (b != -1) {
    const auto tok = tokens.copy_to(phi::CPUPlace(), true);
    PD_THROW("grpo_stop_update: tokens[", b, "] = ", tok.data<int64_t>()[b], " is outside the vocabulary of ", V);
  }
}

void compact_rows_cuda(paddle::Tensor& x, const paddle::Tensor& keep, int64_t outer, int64_t rows, int64_t row_bytes,
                       int64_t move_bytes) {
  kernels::compact_rows(x.data(), keep.data<int64_t>(), keep.shape()[0], outer, rows, row_bytes, move_bytes,
                        x.stream());
  check_launch("grpo_compact_rows");
}

}  // namespace grpo
