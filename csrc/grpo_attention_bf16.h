// The bf16 products of grpo_attention (csrc/grpo_attention.cc) on CPUs with AVX512-BF16: a small GEMM of our own on
// operands rounded to bf16 (round to nearest even), fp32 accumulation. oneDNN's bf16 gemm is slower than its sgemm at
// the attention's inner dimension of 64 (bench/RESULTS.md), and its matmul primitive wants one shape per primitive,
// where every block of queries sees another number of keys.
//
// vdpbf16ps multiplies pairs: lane j of the result gains a[0] b[j][0] + a[1] b[j][1]. So the operands are packed in
// pairs along the inner dimension, as oneDNN's "VNNI" layouts:
//   A (m x k): element (i, p) of the pair view is the 32-bit pair (A[i][2p], A[i][2p+1]), at a[i * row + p * pair]:
//     row-major pairs (row = k/2, pair = 1), or the transpose of a B-packed matrix (row = 1, pair = its ldb);
//   B (k x n): pair row p holds (B[2p][j], B[2p+1][j]) for every column j, at b[p * ldb + j], ldb >= n.
// An odd k is padded with a zero. The products load whole vectors of 16 columns and store only the n asked for, so a
// B buffer needs kSlack values past its last pair row.

#pragma once

#if defined(__AVX512BF16__)

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "grpo_math.h"

namespace grpo::attention_bf16 {

constexpr int64_t kSlack = 64;
inline int64_t pairs(int64_t k) { return (k + 1) / 2; }
inline int64_t lanes(int64_t n) { return (n + 15) / 16 * 16; }

// (m, k) fp32 rows (stride ld) -> bf16 pairs, row-major: dst[i * pairs(k) + p].
inline void pack_rows(const float* src, int64_t m, int64_t k, int64_t ld, uint32_t* dst) {
  const int64_t kp = pairs(k);
  for (int64_t i = 0; i < m; ++i) {
    const float* x = src + i * ld;
    auto* out = reinterpret_cast<uint16_t*>(dst + i * kp);
    int64_t c = 0;
    for (; c + 32 <= k; c += 32) {  // 32 floats -> 32 bf16 in order (the second operand fills the low half)
      const __m512bh both = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + c + 16), _mm512_loadu_ps(x + c));
      _mm512_storeu_si512(out + c, reinterpret_cast<__m512i>(both));
    }
    for (; c < k; ++c) out[c] = bf16_bits(x[c]);
    if (k % 2) out[k] = 0;
  }
}

// (k, n) fp32 rows (stride ld) -> B pairs: dst[p * ldb + j] = (src[2p][j], src[2p+1][j]); ldb >= lanes(n), the
// columns past n zero.
inline void pack_pairs_of_rows(const float* src, int64_t k, int64_t n, int64_t ld, uint32_t* dst, int64_t ldb) {
  for (int64_t p = 0; p < pairs(k); ++p) {
    const float* even = src + 2 * p * ld;
    const float* odd = 2 * p + 1 < k ? even + ld : nullptr;
    uint32_t* out = dst + p * ldb;
    int64_t j = 0;
    for (; odd && j + 16 <= n; j += 16) {  // two rows of 16 -> 16 interleaved pairs
      const __m256i lo = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(even + j)));
      const __m256i hi = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(odd + j)));
      const __m256i first = _mm256_unpacklo_epi16(lo, hi), second = _mm256_unpackhi_epi16(lo, hi);  // per 128-bit lane
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), _mm256_permute2x128_si256(first, second, 0x20));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j + 8), _mm256_permute2x128_si256(first, second, 0x31));
    }
    for (; j < n; ++j) out[j] = bf16_bits(even[j]) | static_cast<uint32_t>(odd ? bf16_bits(odd[j]) : 0) << 16;
    std::fill(out + n, out + ldb, 0u);
  }
}

// (n, k) fp32 rows (stride ld) -> B pairs of its transpose: dst[p * ldb + j] = (src[j][2p], src[j][2p+1]).
inline void pack_pairs_of_columns(const float* src, int64_t n, int64_t k, int64_t ld, uint32_t* dst, int64_t ldb) {
  const int64_t kp = pairs(k);
  std::vector<uint32_t> row(kp);
  for (int64_t j = 0; j < n; ++j) {
    pack_rows(src + j * ld, 1, k, ld, row.data());
    for (int64_t p = 0; p < kp; ++p) dst[p * ldb + j] = row[p];
  }
  for (int64_t p = 0; p < kp; ++p) std::fill(dst + p * ldb + n, dst + (p + 1) * ldb, 0u);
}

// C (MR x up to 16 NV, stride ldc) = or += the pairs' products over kp pairs; `valid` columns stored.
template <int MR, int NV>
inline void tile(int64_t kp, const uint32_t* a, int64_t a_row, int64_t a_pair, const uint32_t* b, int64_t ldb, float* c,
                 int64_t ldc, int64_t valid, bool accumulate) {
  __m512 sum[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) sum[i][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kp; ++p) {
    __m512bh bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + p * ldb + 16 * v));
    for (int i = 0; i < MR; ++i) {
      const __m512bh av = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(a[i * a_row + p * a_pair])));
      for (int v = 0; v < NV; ++v) sum[i][v] = _mm512_dpbf16_ps(sum[i][v], av, bv[v]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int v = 0; v < NV; ++v) {
      const int64_t left = valid - 16 * v;
      const __mmask16 keep = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
      float* out = c + i * ldc + 16 * v;
      const __m512 result = accumulate ? _mm512_add_ps(sum[i][v], _mm512_maskz_loadu_ps(keep, out)) : sum[i][v];
      _mm512_mask_storeu_ps(out, keep, result);
    }
  }
}

template <int MR>
inline void row_tile(int64_t n, int64_t kp, const uint32_t* a, int64_t a_row, int64_t a_pair, const uint32_t* b,
                     int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  for (int64_t j = 0; j < n; j += 64) {
    const int64_t valid = std::min<int64_t>(64, n - j);
    switch ((valid + 15) / 16) {
      case 1: tile<MR, 1>(kp, a, a_row, a_pair, b + j, ldb, c + j, ldc, valid, accumulate); break;
      case 2: tile<MR, 2>(kp, a, a_row, a_pair, b + j, ldb, c + j, ldc, valid, accumulate); break;
      case 3: tile<MR, 3>(kp, a, a_row, a_pair, b + j, ldb, c + j, ldc, valid, accumulate); break;
      default: tile<MR, 4>(kp, a, a_row, a_pair, b + j, ldb, c + j, ldc, valid, accumulate);
    }
  }
}

// C (m, n) = or += A (m, 2 kp) B (2 kp, n), both packed as above; one thread. Each element of C is one sequence of
// dot products in the same order whatever m, n and the tiling: the same inputs give the same bits. Rows go 6 at a time
// where they can (24 sums, 4 vectors of B and a broadcast: 29 of AVX-512's 32 registers; the training attention 0.74x
// against 4 at a time, bench/RESULTS.md), then 4, then 1.
inline void gemm(int64_t m, int64_t n, int64_t kp, const uint32_t* a, int64_t a_row, int64_t a_pair, const uint32_t* b,
                 int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  int64_t i = 0;
  for (; i + 6 <= m; i += 6) row_tile<6>(n, kp, a + i * a_row, a_row, a_pair, b, ldb, c + i * ldc, ldc, accumulate);
  for (; i + 4 <= m; i += 4) row_tile<4>(n, kp, a + i * a_row, a_row, a_pair, b, ldb, c + i * ldc, ldc, accumulate);
  for (; i < m; ++i) row_tile<1>(n, kp, a + i * a_row, a_row, a_pair, b, ldb, c + i * ldc, ldc, accumulate);
}

}  // namespace grpo::attention_bf16

#endif  // __AVX512BF16__
