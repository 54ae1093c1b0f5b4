// Every kernel of grpo_kernels.cuh once or more at small shapes, every path of the sampler included, for
// compute-sanitizer (tests/kernels/test_cuda_kernels.py runs it under memcheck and racecheck):
//     nvcc -O3 -arch=sm_90 -lineinfo -Icsrc csrc/gpu_harness/sanitize.cu -o sanitize && compute-sanitizer ./sanitize
// Exits 1 on a CUDA error; the sanitizer's own exit code reports what it found.
#include <cstdio>
#include <vector>

#include "grpo_kernels.cuh"

using namespace grpo;
using bf16 = __nv_bfloat16;

#define CHECK(call)                                                                        \
  do {                                                                                     \
    const cudaError_t err = (call);                                                        \
    if (err != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(err));    \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

template <typename T>
T* device(const std::vector<T>& host) {
  T* p = nullptr;
  CHECK(cudaMalloc(&p, std::max<size_t>(host.size(), 1) * sizeof(T)));
  if (!host.empty()) CHECK(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

template <typename T>
std::vector<T> filled(size_t n, uint64_t salt, float scale) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) {
    const float u = static_cast<float>(splitmix64(salt * 0x9E3779B97F4A7C15ULL + i) >> 40) * (1.0f / 16777216.0f);
    v[i] = T((u - 0.5f) * scale);
  }
  return v;
}

template <typename T>
void layers(int D, int H, int KVH) {
  const int64_t B = 3, Tn = 5, S = 40, rows = B * Tn, hd = 96, inter = 80, P = 64;
  // add + RMSNorm, with and without the residual
  T *x = device(filled<T>(rows * hd, 1, 2)), *r = device(filled<T>(rows * hd, 2, 2)),
    *w = device(filled<T>(hd, 3, 2));
  T *out = device(std::vector<T>(rows * hd)), *res = device(std::vector<T>(rows * hd));
  kernels::add_rms_norm<T>(x, r, w, 1e-6f, rows, hd, out, res, 0);
  kernels::add_rms_norm<T>(x, nullptr, w, 1e-6f, rows, hd, out, res, 0);
  // rotary + cache write at start 7, then attention: prefill (T = 5) and decode (T = 1, several splits)
  const int width = (H + 2 * KVH) * D;
  T* qkv = device(filled<T>(rows * width, 4, 2));
  std::vector<int64_t> pos(rows);
  for (int64_t i = 0; i < rows; ++i) pos[i] = 7 + i % Tn;
  int64_t* positions = device(pos);
  float *cs = device(filled<float>(P * D, 5, 2)), *sn = device(filled<float>(P * D, 6, 2));
  T *kc = device(filled<T>(B * S * KVH * D, 7, 2)), *vc = device(filled<T>(B * S * KVH * D, 8, 2));
  T* q = device(std::vector<T>(rows * H * D));
  kernels::rope_kv_write<T>(qkv, positions, cs, sn, kc, vc, q, B, Tn, S, 7, H, KVH, D, 0);
  int64_t* first = device(std::vector<int64_t>{0, 3, 9});  // row 2: padding queries at positions 7 and 8
  T* att = device(std::vector<T>(rows * H * D));
  for (const int64_t t : {Tn, int64_t{1}}) {
    float* ws = device(std::vector<float>(std::max<int64_t>(
        kernels::attention_workspace_floats(B, t, H, KVH, D, S, S - t), 1)));
    kernels::cache_attention<T>(q, kc, vc, first, att, ws, B, t, H, KVH, D, S, static_cast<int>(S - t), 0);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaFree(ws));
  }
  T* gate = device(filled<T>(rows * 2 * inter, 9, 8));
  kernels::silu_mul<T>(gate, out, rows, inter, 0);
  CHECK(cudaDeviceSynchronize());
  for (void* p : std::vector<void*>{x, r, w, out, res, qkv, positions, cs, sn, kc, vc, q, first, att, gate})
    CHECK(cudaFree(p));
}

void sampling() {
  const int64_t B = 6, V = 8192;
  std::vector<float> logits = filled<float>(B * V, 10, 12);
  for (int64_t v = 0; v < V; ++v) logits[5 * V + v] = static_cast<float>(v % 4) * 0.001f;  // flat row
  for (int64_t v = 0; v < V; ++v) logits[4 * V + v] = -INFINITY;                           // blocked row
  std::vector<uint8_t> pres(B * V);
  for (size_t i = 0; i < pres.size(); i += 29) pres[i] = 1;
  float* d_logits = device(logits);
  uint8_t* d_pres = device(pres);
  int64_t* eos = device(std::vector<int64_t>{2, 5});
  int64_t* keys = device(std::vector<int64_t>{0, 1, 2, 3, 4, 5});
  float *work = device(std::vector<float>(B * V)), *lp = device(std::vector<float>(B));
  int64_t* tokens = device(std::vector<int64_t>(B));
  // seed, step, min_new, temperature, top_k, top_p, min_p, rp, greedy
  const SampleSettings settings[] = {
      {1, 0, 0, 1.0f, 0, 1.0f, 0.0f, 1.3f, true},      // greedy
      {2, 0, 2, 0.8f, 0, 1.0f, 0.1f, 1.0f, false},     // no window, min_p, eos blocked
      {3, 1, 0, 0.7f, 0, 0.9f, 0.0f, 1.2f, false},     // top-p in the window (the flat row: the full row)
      {4, 1, 0, 1.0f, 40, 0.8f, 0.05f, 1.0f, false},   // top-k window, top-p, min_p
      {5, 1, 0, 1.0f, 5000, 0.95f, 0.0f, 1.0f, false}, // top-k beyond the window: the full row
  };
  for (const SampleSettings& s : settings) {
    kernels::sample({d_logits, d_pres, eos, 2, V, keys, work, s, tokens, lp}, B, 0);
    CHECK(cudaDeviceSynchronize());
  }
  // stop bookkeeping with one token out of range, then row compaction
  int64_t* bad = device(std::vector<int64_t>{3, V, 2, 0, 1, 7});
  bool* done = nullptr;
  CHECK(cudaMalloc(&done, B));
  unsigned long long* bad_row = nullptr;
  CHECK(cudaMalloc(&bad_row, sizeof(unsigned long long)));
  kernels::stop_update(bad, d_pres, eos, B, 2, V, done, bad_row, 0);
  int64_t* keep = device(std::vector<int64_t>{0, 2, 5});
  kernels::compact_rows(work, keep, 3, 2, B / 2, V / 2 * 4, V / 2 * 4 - 4, 0);
  kernels::compact_rows(d_pres, keep, 3, 1, B, V, V - 3, 0);
  CHECK(cudaDeviceSynchronize());
  for (void* p : std::vector<void*>{d_logits, d_pres, eos, keys, work, lp, tokens, bad, done, bad_row, keep})
    CHECK(cudaFree(p));
}

int main() {
  layers<float>(64, 9, 3);
  layers<float>(128, 28, 4);
  layers<bf16>(64, 14, 2);
  layers<bf16>(128, 32, 8);
  sampling();
  CHECK(cudaGetLastError());
  std::printf("sanitize: every kernel ran\n");
  return 0;
}
