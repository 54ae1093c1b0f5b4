// grpo_attention: the training attention softmax(scale * q k^T + mask) v, forward and backward, without the
// (B, KVH, G T, S) score and weight tensors in memory: the update kept one fp32 copy of each per layer for backward
// (85 MB a layer at 64 rows of 192 tokens) and spent more time writing and reading them than multiplying.
//
//   grpo_attention(Q (B, KVH, G T, D), K (B, KVH, S, D), V (B, KVH, S, D), Mask (B, 1, T, S), scale, bf16)
//       -> Out (B, KVH, G T, D), RowMax (B, KVH, G T), RowInvSum (B, KVH, G T)
//
// The G query heads sharing a KV head are stacked (row g T + t is head g's query t), as TrainingAttention lays them
// out; the mask is paddleformers' additive one. Per (sequence, KV head) and block of kBlock queries, the products
// run on the block's scores kept in cache, and only each row's max and 1 / sum are stored. The products are
// oneDNN's sgemm, or with bf16 (and a build for AVX512-BF16) csrc/grpo_attention_bf16.h's on operands rounded to
// bf16 (oneDNN's bf16 gemm is slower than its sgemm at an inner dimension of 64, bench/RESULTS.md); the softmax
// stays fp32 either way. Backward
// recomputes the weights from them: dP = dO V^T, dS = scale P (dP - rowsum(P dP)), dQ = dS K, dK = dS^T Q, dV = P^T dO.
//
// Keys that the mask hides from every query of a block (a value below kHidden: paddleformers writes float32's
// lowest) are skipped: causal attention over a block sees only the keys up to its last query, and left padding
// hides the first ones. Their weights would be exactly 0 (exp of less than -87 is 0 in exp_nonpos), so skipping
// changes no value. A query that sees no key at all (a padding position) keeps paddle's softmax's answer, the
// uniform average over all S keys: its block then spans every key.

#ifdef GRPO_WITH_DNNL

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "grpo_attention_bf16.h"
#include "grpo_math.h"
#include "grpo_ops.h"

extern "C" int dnnl_sgemm(char transa, char transb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

namespace {

using grpo::dense;
using grpo::exp_nonpos;
using grpo::shape_str;
constexpr auto kF32 = paddle::DataType::FLOAT32;
constexpr int64_t kBlock = 64;     // queries of one head per block
constexpr float kHidden = -1e30f;  // a mask value below this hides the key

struct Dims {
  int64_t B, KVH, G, T, S, D;
};

// C (m, n) = op(A) op(B) + beta C, row-major; one thread (called inside the parallel loops).
void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
           float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  const int status = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
  PD_CHECK(status == 0, "grpo_attention: dnnl_sgemm failed with oneDNN status ", status);
}

// The keys [first, last) that some query t0 <= t < t1 of sequence b sees; all S where one of them sees none. One
// branch-free pass over each mask row, which vectorises: scanning in from both ends to the first visible key did not,
// and took 7.6% of the attention's time at 576 keys.
std::pair<int64_t, int64_t> visible_keys(const float* mask, const Dims& d, int64_t b, int64_t t0, int64_t t1) {
  int64_t first = d.S, last = 0;
  const int keys = static_cast<int>(d.S);
  for (int64_t t = t0; t < t1; ++t) {
    const float* row = mask + (b * d.T + t) * d.S;
    int lo = keys, hi = 0;  // the row's first visible key and one past its last
#pragma omp simd reduction(min : lo) reduction(max : hi)
    for (int j = 0; j < keys; ++j) {
      const bool seen = !(row[j] < kHidden);
      lo = seen && j < lo ? j : lo;
      hi = seen && j >= hi ? j + 1 : hi;
    }
    if (hi == 0) return {0, d.S};
    first = std::min<int64_t>(first, lo);
    last = std::max<int64_t>(last, hi);
  }
  return {first, last};
}

// scores (rows, n) -> scale * scores + mask in place, over the keys [first, first + n) (mask_rows points at the first
// row's key `first`).
void scale_and_mask(float* scores, int64_t rows, int64_t n, const float* mask_rows, int64_t mask_stride, float scale) {
  for (int64_t r = 0; r < rows; ++r) {
    float* x = scores + r * n;
    const float* m = mask_rows + r * mask_stride;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) x[j] = x[j] * scale + m[j];
  }
}

// Each row's max of scores (rows, n).
void row_maxima(const float* scores, int64_t rows, int64_t n, float* row_max) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = scores + r * n;
    float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < n; ++j) mx = grpo::larger(mx, x[j]);
    row_max[r] = mx;
  }
}

// Scores (rows, n) over the keys [first, first + n) -> the attention weights softmax(scale x + mask) in place, each
// row's max and 1 / sum stored.
void softmax_rows(float* x, int64_t rows, int64_t n, const float* mask_rows, int64_t mask_stride, float scale,
                  float* row_max, float* row_inv_sum) {
  scale_and_mask(x, rows, n, mask_rows, mask_stride, scale);
  row_maxima(x, rows, n, row_max);
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * n;
    const float inv = 1.0f / grpo::exp_shifted_sum(xr, n, row_max[r]);
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) xr[j] *= inv;
    row_inv_sum[r] = inv;
  }
}

// The same in backward from the forward's stored max and 1 / sum: the weights are the forward's to the bit.
void recomputed_softmax_rows(float* x, int64_t rows, int64_t n, const float* mask_rows, int64_t mask_stride, float scale,
                             const float* row_max, const float* row_inv_sum) {
  scale_and_mask(x, rows, n, mask_rows, mask_stride, scale);
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * n;
    const float mx = row_max[r], inv = row_inv_sum[r];
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) xr[j] = exp_nonpos(xr[j] - mx) * inv;
  }
}

// The weights p and dP = dO V^T (rows, n) -> dS = scale P (dP - rowsum(P dP)) in dp, as grpo_masked_softmax's grad.
void softmax_grad_rows(const float* p, float* dp, int64_t rows, int64_t n, float scale) {
  for (int64_t r = 0; r < rows; ++r) grpo::softmax_grad_row(p + r * n, dp + r * n, dp + r * n, n, scale);
}

Dims check_inputs(const paddle::Tensor& q, const paddle::Tensor& k, const paddle::Tensor& v, const paddle::Tensor& mask) {
  const char* op = "grpo_attention";
  for (const auto* t : {&q, &k, &v, &mask}) {
    PD_CHECK(t->is_cpu() && t->dtype() == kF32, op, ": inputs must be float32 CPU tensors, got ",
             phi::DataTypeToString(t->dtype()), " on ", t->place().DebugString());
  }
  const auto qs = q.shape(), ks = k.shape(), ms = mask.shape();
  PD_CHECK(qs.size() == 4 && ks.size() == 4 && v.shape() == ks && ms.size() == 4, op,
           ": expected q [B, KVH, G T, D], k and v [B, KVH, S, D], mask [B, 1, T, S], got q ", shape_str(qs), ", k ",
           shape_str(ks), ", v ", shape_str(v.shape()), ", mask ", shape_str(ms));
  const int64_t T = ms[2];
  PD_CHECK(ks[0] == qs[0] && ks[1] == qs[1] && ks[3] == qs[3] && ms[0] == qs[0] && ms[1] == 1 && ms[3] == ks[2] &&
               T > 0 && qs[2] % T == 0,
           op, ": shapes disagree: q ", shape_str(qs), ", k ", shape_str(ks), ", mask ", shape_str(ms));
  return {qs[0], qs[1], qs[2] / T, T, ks[2], qs[3]};
}

// The bf16 attribute asks for the products in bf16; they run so where the operators were built for AVX512-BF16
// (-march=native on a CPU with it), in fp32 elsewhere.
#if defined(__AVX512BF16__)
constexpr bool kBf16Built = true;
#else
constexpr bool kBf16Built = false;
#endif

#if defined(__AVX512BF16__)
namespace bf = grpo::attention_bf16;

// The bf16 path: one task per (sequence, KV head), whose keys and values are packed once for all its blocks and
// query heads. Its blocks start at an even key (pairs of keys are packed together): the key before a block's first
// visible one is hidden from all of its queries, so its weight is exactly 0 and it changes no value.
struct PackedKeys {
  std::vector<uint32_t> keys_t, values;  // K^T and V as B operands: (D pairs) x lanes(S), (S pairs) x D
  std::vector<uint32_t> keys, values_t;  // backward's: K as (S pairs) x D, V^T as (D pairs) x lanes(S)
  PackedKeys(const Dims& d, const float* k, const float* v, bool backward) {
    const int64_t ldk = bf::lanes(d.S);
    keys_t.resize(bf::pairs(d.D) * ldk + bf::kSlack);
    bf::pack_pairs_of_columns(k, d.S, d.D, d.D, keys_t.data(), ldk);
    if (!backward) {
      values.resize(bf::pairs(d.S) * d.D + bf::kSlack);
      bf::pack_pairs_of_rows(v, d.S, d.D, d.D, values.data(), d.D);
      return;
    }
    keys.resize(bf::pairs(d.S) * d.D + bf::kSlack);
    bf::pack_pairs_of_rows(k, d.S, d.D, d.D, keys.data(), d.D);
    values_t.resize(bf::pairs(d.D) * ldk + bf::kSlack);
    bf::pack_pairs_of_columns(v, d.S, d.D, d.D, values_t.data(), ldk);
  }
};

// scores (rows, n) = q_pairs (rows x D pairs) K[first .. first + n)^T, fp32.
void bf16_scores(const Dims& d, const uint32_t* q_pairs, int64_t rows, const PackedKeys& packed, int64_t first, int64_t n,
                 float* scores) {
  bf::gemm(rows, n, bf::pairs(d.D), q_pairs, bf::pairs(d.D), 1, packed.keys_t.data() + first, bf::lanes(d.S), scores, n,
           false);
}

void attention_bf16_task(const Dims& d, int64_t bh, const float* q, const float* k, const float* v, const float* mask,
                         float scale, float* o, float* mx, float* inv) {
  const int64_t b = bh / d.KVH;
  const PackedKeys packed(d, k + bh * d.S * d.D, v + bh * d.S * d.D, false);
  std::vector<float> scores(kBlock * d.S);
  std::vector<uint32_t> q_pairs(kBlock * bf::pairs(d.D)), p_pairs(kBlock * bf::pairs(d.S + 1));
  for (int64_t t0 = 0; t0 < d.T; t0 += kBlock) {
    const int64_t rows = std::min(kBlock, d.T - t0);
    auto [first, last] = visible_keys(mask, d, b, t0, t0 + rows);
    first &= ~int64_t{1};
    const int64_t n = last - first;
    for (int64_t g = 0; g < d.G; ++g) {
      const int64_t row0 = bh * d.G * d.T + g * d.T + t0;
      bf::pack_rows(q + row0 * d.D, rows, d.D, d.D, q_pairs.data());
      bf16_scores(d, q_pairs.data(), rows, packed, first, n, scores.data());
      softmax_rows(scores.data(), rows, n, mask + (b * d.T + t0) * d.S + first, d.S, scale, mx + row0, inv + row0);
      bf::pack_rows(scores.data(), rows, n, n, p_pairs.data());
      bf::gemm(rows, d.D, bf::pairs(n), p_pairs.data(), bf::pairs(n), 1, packed.values.data() + first / 2 * d.D, d.D,
               o + row0 * d.D, d.D, false);
    }
  }
}

// One query block of one head in backward: p and dp (rows, n) are scratch; dq's rows written, dk's and dv's n rows
// from `first` added to.
struct BlockGrad {
  std::vector<float> p, dp;
  std::vector<uint32_t> q_pairs, dout_pairs, ds_pairs, q_by_rows, dout_by_rows, ds_by_rows, p_by_rows;
  explicit BlockGrad(const Dims& d)
      : p(kBlock * d.S), dp(kBlock * d.S), q_pairs(kBlock * bf::pairs(d.D)), dout_pairs(q_pairs.size()),
        ds_pairs(kBlock * bf::pairs(d.S + 1)), q_by_rows(bf::pairs(kBlock) * d.D + bf::kSlack),
        dout_by_rows(q_by_rows.size()), ds_by_rows(bf::pairs(kBlock) * bf::lanes(d.S) + bf::kSlack),
        p_by_rows(ds_by_rows.size()) {}
};

void attention_grad_bf16_block(const Dims& d, const PackedKeys& packed, BlockGrad& s, const float* q, const float* dout,
                               const float* mask_rows, int64_t rows, int64_t first, int64_t n, float scale,
                               const float* mx, const float* inv, float* dq, float* dk, float* dv) {
  const int64_t dp_ = bf::pairs(d.D), np_ = bf::pairs(n), rp = bf::pairs(rows), ln = bf::lanes(n);
  bf::pack_rows(q, rows, d.D, d.D, s.q_pairs.data());
  bf16_scores(d, s.q_pairs.data(), rows, packed, first, n, s.p.data());
  recomputed_softmax_rows(s.p.data(), rows, n, mask_rows, d.S, scale, mx, inv);
  bf::pack_rows(dout, rows, d.D, d.D, s.dout_pairs.data());
  bf::gemm(rows, n, dp_, s.dout_pairs.data(), dp_, 1, packed.values_t.data() + first, bf::lanes(d.S), s.dp.data(), n,
           false);  // dP = dO V^T
  softmax_grad_rows(s.p.data(), s.dp.data(), rows, n, scale);
  bf::pack_rows(s.dp.data(), rows, n, n, s.ds_pairs.data());
  bf::gemm(rows, d.D, np_, s.ds_pairs.data(), np_, 1, packed.keys.data() + first / 2 * d.D, d.D, dq, d.D, false);  // dQ = dS K
  // dK += dS^T Q and dV += P^T dO: the pairs run over the block's queries
  bf::pack_pairs_of_rows(s.dp.data(), rows, n, n, s.ds_by_rows.data(), ln);
  bf::pack_pairs_of_rows(s.p.data(), rows, n, n, s.p_by_rows.data(), ln);
  bf::pack_pairs_of_rows(q, rows, d.D, d.D, s.q_by_rows.data(), d.D);
  bf::pack_pairs_of_rows(dout, rows, d.D, d.D, s.dout_by_rows.data(), d.D);
  bf::gemm(n, d.D, rp, s.ds_by_rows.data(), 1, ln, s.q_by_rows.data(), d.D, dk, d.D, true);
  bf::gemm(n, d.D, rp, s.p_by_rows.data(), 1, ln, s.dout_by_rows.data(), d.D, dv, d.D, true);
}

void attention_grad_bf16_task(const Dims& d, int64_t bh, const float* q, const float* k, const float* v,
                              const float* mask, const float* dout, const float* mx, const float* inv, float scale,
                              float* dq, float* dk, float* dv) {
  const int64_t b = bh / d.KVH;
  const PackedKeys packed(d, k + bh * d.S * d.D, v + bh * d.S * d.D, true);
  BlockGrad scratch(d);
  for (int64_t t0 = 0; t0 < d.T; t0 += kBlock) {
    const int64_t rows = std::min(kBlock, d.T - t0);
    auto [first, last] = visible_keys(mask, d, b, t0, t0 + rows);
    first &= ~int64_t{1};
    for (int64_t g = 0; g < d.G; ++g) {
      const int64_t row0 = bh * d.G * d.T + g * d.T + t0;
      attention_grad_bf16_block(d, packed, scratch, q + row0 * d.D, dout + row0 * d.D, mask + (b * d.T + t0) * d.S + first,
                                rows, first, last - first, scale, mx + row0, inv + row0, dq + row0 * d.D,
                                dk + (bh * d.S + first) * d.D, dv + (bh * d.S + first) * d.D);
    }
  }
}
#endif  // __AVX512BF16__

std::vector<paddle::Tensor> Attention(const paddle::Tensor& q_in, const paddle::Tensor& k_in, const paddle::Tensor& v_in,
                                      const paddle::Tensor& mask_in, float scale, bool bf16) {
  const Dims d = check_inputs(q_in, k_in, v_in, mask_in);
  const auto q_t = dense(q_in), k_t = dense(k_in), v_t = dense(v_in), m_t = dense(mask_in);
  auto out = paddle::empty(q_t.shape(), kF32, q_t.place());
  auto row_max = paddle::empty({d.B, d.KVH, d.G * d.T}, kF32, q_t.place());
  auto row_inv_sum = paddle::empty({d.B, d.KVH, d.G * d.T}, kF32, q_t.place());
  const float *q = q_t.data<float>(), *k = k_t.data<float>(), *v = v_t.data<float>(), *mask = m_t.data<float>();
  float *o = out.data<float>(), *mx = row_max.data<float>(), *inv = row_inv_sum.data<float>();
  if (bf16 && kBf16Built) {
#if defined(__AVX512BF16__)
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < d.B * d.KVH; ++bh) attention_bf16_task(d, bh, q, k, v, mask, scale, o, mx, inv);
#endif
    return {out, row_max, row_inv_sum};
  }
  const int64_t blocks = (d.T + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)  // each task's scratch its own
  for (int64_t task = 0; task < d.B * d.KVH * blocks; ++task) {
    std::vector<float> scores(kBlock * d.S);
    const int64_t bh = task / blocks, b = bh / d.KVH, t0 = task % blocks * kBlock;
    const int64_t rows = std::min(kBlock, d.T - t0);
    const auto [first, last] = visible_keys(mask, d, b, t0, t0 + rows);
    const float* kb = k + (bh * d.S + first) * d.D;
    const float* vb = v + (bh * d.S + first) * d.D;
    for (int64_t g = 0; g < d.G; ++g) {
      const int64_t row0 = bh * d.G * d.T + g * d.T + t0;  // the block's first row in q, out and the row stats
      sgemm(false, true, rows, last - first, d.D, q + row0 * d.D, d.D, kb, d.D, 0.0f, scores.data(), last - first);
      softmax_rows(scores.data(), rows, last - first, mask + (b * d.T + t0) * d.S + first, d.S, scale, mx + row0, inv + row0);
      sgemm(false, false, rows, d.D, last - first, scores.data(), last - first, vb, d.D, 0.0f, o + row0 * d.D, d.D);
    }
  }
  return {out, row_max, row_inv_sum};
}

std::vector<paddle::Tensor> AttentionGrad(const paddle::Tensor& q_in, const paddle::Tensor& k_in,
                                          const paddle::Tensor& v_in, const paddle::Tensor& mask_in,
                                          const paddle::Tensor& row_max, const paddle::Tensor& row_inv_sum,
                                          const paddle::Tensor& dout_in, float scale, bool bf16) {
  const Dims d = check_inputs(q_in, k_in, v_in, mask_in);
  const auto q_t = dense(q_in), k_t = dense(k_in), v_t = dense(v_in), m_t = dense(mask_in), do_t = dense(dout_in);
  auto dq = paddle::empty(q_t.shape(), kF32, q_t.place());
  auto dk = paddle::zeros(k_t.shape(), kF32, k_t.place());
  auto dv = paddle::zeros(v_t.shape(), kF32, v_t.place());
  const float *q = q_t.data<float>(), *k = k_t.data<float>(), *v = v_t.data<float>(), *mask = m_t.data<float>();
  const float *dout = do_t.data<float>(), *mx = row_max.data<float>(), *inv = row_inv_sum.data<float>();
  float *dqp = dq.data<float>(), *dkp = dk.data<float>(), *dvp = dv.data<float>();
  if (bf16 && kBf16Built) {
#if defined(__AVX512BF16__)
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < d.B * d.KVH; ++bh) {
      attention_grad_bf16_task(d, bh, q, k, v, mask, dout, mx, inv, scale, dqp, dkp, dvp);
    }
#endif
    return {dq, dk, dv};
  }
  const int64_t blocks = (d.T + kBlock - 1) / kBlock;
  // one task per (sequence, KV head): its blocks all add into the same dK and dV rows
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < d.B * d.KVH; ++bh) {
    std::vector<float> weights(kBlock * d.S), dweights(kBlock * d.S);
    const int64_t b = bh / d.KVH;
    for (int64_t t0 = 0; t0 < d.T; t0 += kBlock) {
      const int64_t rows = std::min(kBlock, d.T - t0);
      const auto [first, last] = visible_keys(mask, d, b, t0, t0 + rows);
      const int64_t n = last - first;
      const float* kb = k + (bh * d.S + first) * d.D;
      const float* vb = v + (bh * d.S + first) * d.D;
      for (int64_t g = 0; g < d.G; ++g) {
        const int64_t row0 = bh * d.G * d.T + g * d.T + t0;
        float *p = weights.data(), *dp = dweights.data();
        sgemm(false, true, rows, n, d.D, q + row0 * d.D, d.D, kb, d.D, 0.0f, p, n);
        recomputed_softmax_rows(p, rows, n, mask + (b * d.T + t0) * d.S + first, d.S, scale, mx + row0, inv + row0);
        sgemm(false, true, rows, n, d.D, dout + row0 * d.D, d.D, vb, d.D, 0.0f, dp, n);  // dP = dO V^T
        softmax_grad_rows(p, dp, rows, n, scale);
        sgemm(false, false, rows, d.D, n, dp, n, kb, d.D, 0.0f, dqp + row0 * d.D, d.D);  // dQ = dS K
        float* dkb = dkp + (bh * d.S + first) * d.D;
        float* dvb = dvp + (bh * d.S + first) * d.D;
        sgemm(true, false, n, d.D, rows, dp, n, q + row0 * d.D, d.D, 1.0f, dkb, d.D);        // dK += dS^T Q
        sgemm(true, false, n, d.D, rows, p, n, dout + row0 * d.D, d.D, 1.0f, dvb, d.D);      // dV += P^T dO
      }
    }
  }
  return {dq, dk, dv};
}

std::vector<std::vector<int64_t>> AttentionShape(const std::vector<int64_t>& q, const std::vector<int64_t>&,
                                                 const std::vector<int64_t>&, const std::vector<int64_t>&) {
  return {q, {q[0], q[1], q[2]}, {q[0], q[1], q[2]}};
}
std::vector<paddle::DataType> AttentionDtype(const paddle::DataType&, const paddle::DataType&, const paddle::DataType&,
                                             const paddle::DataType&) {
  return {kF32, kF32, kF32};
}


// ---------------------------------------------------------------------------------------------
// grpo_cache_attention's prefill (grpo_ops.cc sends the queries here where grpo::prefill_in_blocks, below, says so):
// per (row, KV head) and block of kBlock queries, the block's keys and values come into cache once for the G query
// heads and each head's products run as two GEMMs, as the training attention's above; one query at a time, a
// 2,048-token prompt's attention ran at 90 GFLOP/s (bench/RESULTS.md). Query t of row b, in slot start + t, sees the
// slots first[b] .. start + t; one that sees none gets zeros. The operands are those of one query at a time: with
// round_bf16 the query and the normalised weights rounded to bf16, the keys and values as the cache holds them. With
// round_bf16 and a bfloat16 cache (the bf16 engine's) they are all bf16, so the products run on bf16 pairs
// (grpo_attention_bf16.h) where the operators were built for AVX512-BF16; otherwise through sgemm on float32 (a
// bfloat16 cache's block widened).

// A block's scores (rows, n) over the slots [key0, key0 + n) -> the weights in place: row r (query start + t0 + r) keeps
// the columns lo .. last + r (lo = first - key0, last = start + t0 - key0), scaled, softmax-normalised and with
// `round` rounded to bf16, and zeros elsewhere.
void causal_softmax_rows(float* x, int64_t rows, int64_t n, int64_t lo, int64_t last, float scale, bool round) {
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * n;
    const int64_t hi = last + r;  // inclusive, < n
    if (hi < lo) {
      std::fill(xr, xr + n, 0.0f);
      continue;
    }
    float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
    for (int64_t j = lo; j <= hi; ++j) {
      xr[j] *= scale;
      mx = grpo::larger(mx, xr[j]);
    }
    const float inv = 1.0f / grpo::exp_shifted_sum(xr + lo, hi - lo + 1, mx);
#pragma omp simd
    for (int64_t j = lo; j <= hi; ++j) xr[j] = round ? grpo::bf16_round(xr[j] * inv) : xr[j] * inv;
    std::fill(xr, xr + lo, 0.0f);
    std::fill(xr + hi + 1, xr + n, 0.0f);
  }
}

// One block's keys and values [key0, key0 + n) of a (row, KV head) as float32 rows of stride ld: the cache's own where
// it is float32, widened into `widened` where it is bfloat16.
struct FloatBlock {
  const float *k, *v;
  int64_t ld;
};
FloatBlock float_block(const float* k, const float* v, int64_t stride, int64_t, int64_t, std::vector<float>&) {
  return {k, v, stride};
}
FloatBlock float_block(const uint16_t* k, const uint16_t* v, int64_t stride, int64_t n, int64_t D,
                       std::vector<float>& widened) {
  widened.resize(2 * n * D);
  float *wk = widened.data(), *wv = wk + n * D;
  for (int64_t j = 0; j < n; ++j) {
#pragma omp simd
    for (int64_t i = 0; i < D; ++i) {
      wk[j * D + i] = grpo::bf16_float(k[j * stride + i]);
      wv[j * D + i] = grpo::bf16_float(v[j * stride + i]);
    }
  }
  return {wk, wv, D};
}

struct PrefillScratch {
  std::vector<float> scores, rounded_q, widened;
  std::vector<uint32_t> q_pairs, p_pairs, keys_t, values;
};

// Where a block of queries is: row b, KV head g, queries t0 .. t0 + rows, the slots [key0, key0 + n) they see between them.
struct PrefillBlock {
  int64_t b, g, t0, rows, key0, n;
};

template <typename Elem>
void prefill_block_fp32(const grpo::CacheQueries& r, const Elem* kb, const Elem* vb, const PrefillBlock& k,
                        PrefillScratch& s) {
  const int64_t D = r.D, G = r.H / r.KVH, key_stride = r.KVH * r.D, ldq = r.H * r.D;
  const FloatBlock keys = float_block(kb + k.key0 * key_stride, vb + k.key0 * key_stride, key_stride, k.n, D, s.widened);
  s.scores.resize(k.rows * k.n);
  for (int64_t h = k.g * G; h < (k.g + 1) * G; ++h) {
    const int64_t row0 = (k.b * r.T + k.t0) * r.H + h;  // the block's first query of head h in q and out, of D each
    const float* q = r.q + row0 * r.D;
    int64_t ld = ldq;
    if (r.round_bf16) {
      s.rounded_q.resize(k.rows * D);
      for (int64_t i = 0; i < k.rows; ++i)
        for (int64_t c = 0; c < D; ++c) s.rounded_q[i * D + c] = grpo::bf16_round(q[i * ldq + c]);
      q = s.rounded_q.data(), ld = D;
    }
    sgemm(false, true, k.rows, k.n, D, q, ld, keys.k, keys.ld, 0.0f, s.scores.data(), k.n);
    causal_softmax_rows(s.scores.data(), k.rows, k.n, r.first[k.b] - k.key0, r.start + k.t0 - k.key0,
                        1.0f / std::sqrt(static_cast<float>(D)), r.round_bf16);
    sgemm(false, false, k.rows, D, k.n, s.scores.data(), k.n, keys.v, keys.ld, 0.0f, r.out + row0 * D, ldq);
  }
}

#if defined(__AVX512BF16__)
// The same on bf16 pairs: the cache's keys and values are bf16 already, so packing them only reorders them.
void prefill_block_bf16(const grpo::CacheQueries& r, const uint16_t* kb, const uint16_t* vb, const PrefillBlock& k,
                        PrefillScratch& s) {
  const int64_t D = r.D, G = r.H / r.KVH, key_stride = r.KVH * r.D, ldq = r.H * r.D;
  const int64_t dp = bf::pairs(D), np = bf::pairs(k.n), ldk = bf::lanes(k.n);
  s.keys_t.assign(dp * ldk + bf::kSlack, 0u);  // K^T: pair p of key j's dimensions at [p ldk + j]
  for (int64_t j = 0; j < k.n; ++j) {
    const auto* key = reinterpret_cast<const uint32_t*>(kb + (k.key0 + j) * key_stride);
    for (int64_t p = 0; p < dp; ++p) s.keys_t[p * ldk + j] = key[p];
  }
  s.values.assign(np * D + bf::kSlack, 0u);  // V: keys 2p and 2p + 1's value c at [p D + c]
  for (int64_t j = 0; j < k.n; ++j) {
    const uint16_t* value = vb + (k.key0 + j) * key_stride;
    for (int64_t c = 0; c < D; ++c) s.values[j / 2 * D + c] |= static_cast<uint32_t>(value[c]) << (16 * (j % 2));
  }
  s.scores.resize(k.rows * k.n);
  s.q_pairs.resize(k.rows * dp);
  s.p_pairs.resize(k.rows * np);
  for (int64_t h = k.g * G; h < (k.g + 1) * G; ++h) {
    const int64_t row0 = (k.b * r.T + k.t0) * r.H + h;
    bf::pack_rows(r.q + row0 * D, k.rows, D, ldq, s.q_pairs.data());  // rounds the query
    bf::gemm(k.rows, k.n, dp, s.q_pairs.data(), dp, 1, s.keys_t.data(), ldk, s.scores.data(), k.n, false);
    causal_softmax_rows(s.scores.data(), k.rows, k.n, r.first[k.b] - k.key0, r.start + k.t0 - k.key0,
                        1.0f / std::sqrt(static_cast<float>(D)), false);
    bf::pack_rows(s.scores.data(), k.rows, k.n, k.n, s.p_pairs.data());  // rounds the weights
    bf::gemm(k.rows, D, np, s.p_pairs.data(), np, 1, s.values.data(), D, r.out + row0 * D, ldq, false);
  }
}
#endif

// Whether the products run on bf16 pairs: the operands all bf16, and the operators built for AVX512-BF16.
bool on_pairs(const grpo::CacheQueries& r, bool bf16_cache) { return kBf16Built && bf16_cache && r.round_bf16 && r.D % 2 == 0; }

template <typename Elem>
void prefill_blocks(const grpo::CacheQueries& r, const Elem* kc, int64_t Bcap) {
  const int64_t row_stride = r.S * r.KVH * r.D, blocks = (r.T + kBlock - 1) / kBlock;
  const Elem* vc = kc + Bcap * row_stride;
  const bool pairs = on_pairs(r, std::is_same_v<Elem, uint16_t>);
#pragma omp parallel
  {
    PrefillScratch scratch;
#pragma omp for schedule(static, 1)  // later blocks see more keys: interleaved, the threads' shares even out
    for (int64_t task = 0; task < r.B * r.KVH * blocks; ++task) {
      const int64_t b = task / (r.KVH * blocks), g = task / blocks % r.KVH, t0 = task % blocks * kBlock;
      const int64_t rows = std::min(kBlock, r.T - t0), key0 = std::min(r.first[b], r.start + t0 + rows);
      const PrefillBlock block{b, g, t0, rows, key0, r.start + t0 + rows - key0};
      const Elem* kb = kc + b * row_stride + g * r.D;  // key of slot s at kb + s KVH D
      const Elem* vb = vc + b * row_stride + g * r.D;
      if (block.n == 0) {  // the row's first slot is past the block's queries: all of them padding
        for (int64_t i = 0; i < rows; ++i) {
          float* out = r.out + ((b * r.T + t0 + i) * r.H + g * (r.H / r.KVH)) * r.D;
          std::fill(out, out + r.H / r.KVH * r.D, 0.0f);
        }
      } else if (pairs) {
#if defined(__AVX512BF16__)
        if constexpr (std::is_same_v<Elem, uint16_t>) prefill_block_bf16(r, kb, vb, block, scratch);
#endif
      } else {
        prefill_block_fp32(r, kb, vb, block, scratch);
      }
    }
  }
}

}  // namespace

// From a whole block of queries a row on; through sgemm only where the last one sees kSgemmPrefillKeys keys or more:
// below, its calls' overhead and the block's hidden half-square cost more than they save (bench/RESULTS.md,
// bench_cache_attention.py --prefill: at 64 queries 1.1x on bf16 pairs and 0.6x through sgemm, at 1,024 2.0x and 1.4x).
constexpr int64_t kSgemmPrefillKeys = 512;
bool grpo::prefill_in_blocks(const grpo::CacheQueries& r, bool bf16_cache) {
  return r.T >= kBlock && (on_pairs(r, bf16_cache) || r.start + r.T >= kSgemmPrefillKeys);
}
void grpo::prefill_attention(const grpo::CacheQueries& r, const float* kc, int64_t Bcap) { prefill_blocks(r, kc, Bcap); }
void grpo::prefill_attention(const grpo::CacheQueries& r, const uint16_t* kc, int64_t Bcap) { prefill_blocks(r, kc, Bcap); }

PD_BUILD_OP(grpo_attention)
    .Inputs({"Q", "K", "V", "Mask"})
    .Outputs({"Out", "RowMax", "RowInvSum"})
    .Attrs({"scale: float", "bf16: bool"})
    .SetKernelFn(PD_KERNEL(Attention))
    .SetInferShapeFn(PD_INFER_SHAPE(AttentionShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(AttentionDtype));

PD_BUILD_GRAD_OP(grpo_attention)
    .Inputs({"Q", "K", "V", "Mask", "RowMax", "RowInvSum", paddle::Grad("Out")})
    .Outputs({paddle::Grad("Q"), paddle::Grad("K"), paddle::Grad("V")})
    .Attrs({"scale: float", "bf16: bool"})
    .SetKernelFn(PD_KERNEL(AttentionGrad));

#endif  // GRPO_WITH_DNNL
