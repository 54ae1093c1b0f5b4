// bfloat16 matrix products with float32 accumulation on the CPU, for CPUs that compute bf16 faster than
// fp32 (AVX512-BF16, AMX): alignment/cpu_bf16.py chooses them (the cpu_bf16_matmul key).
//
// paddle 3.3 has no CPU bf16 matmul kernel, but the oneDNN it ships (paddle/libs/libdnnl.so.3) exports
// dnnl_gemm_bf16bf16f32: C = alpha op(A) op(B) + beta C, row-major, bf16 A and B, fp32 C; oneDNN picks the
// AMX, AVX512-BF16 or emulated kernel for the CPU it runs on. Measured with bench/bench_bf16_gemm.py.
// grpo_dnnl_matmul.cc: the same products through oneDNN's matmul primitive on weights packed once (the fused engine's).
//
//   grpo_to_bf16(X fp32) -> bf16                      weight copies, made once per optimizer step
//   grpo_bf16_matmul(X, Y, tx, ty) -> fp32            op(X) op(Y), X and Y fp32 or bf16; no gradient
//   grpo_bf16_linear(X, W, Wb) -> Out, XSaved         X (..., K) @ W (K, N) from Wb = bf16(W); backward:
//                                                     dX = dY Wb^T, dW = XSaved^T dY (fp32, to the master W)
//
// Conversion rounds to nearest even and flushes float32 subnormals to zero, as the AVX512-BF16 instruction
// (used where the compiler targets it) does, so every element converts alike; NaN stays NaN, so the
// trainer's non-finite checks still see it.

#ifdef GRPO_WITH_DNNL

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "grpo_bf16.h"
#include "grpo_math.h"
#include "grpo_ops.h"

extern "C" int dnnl_gemm_bf16bf16f32(char transa, char transb, int64_t m, int64_t n, int64_t k, float alpha,
                                     const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta,
                                     float* c, int64_t ldc);

namespace {

using grpo::dense;
using grpo::shape_str;
constexpr auto kF32 = paddle::DataType::FLOAT32;
constexpr auto kBF16 = paddle::DataType::BFLOAT16;

void convert(const float* src, uint16_t* dst, int64_t n) {
  constexpr int64_t kBlock = 1 << 14;
#pragma omp parallel for schedule(static)
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t end = start + kBlock < n ? start + kBlock : n;
    int64_t i = start;
#ifdef __AVX512BF16__
    for (; i + 16 <= end; i += 16) {
      const __m256bh packed = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + i));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), reinterpret_cast<const __m256i&>(packed));
    }
#endif
    for (; i < end; ++i) dst[i] = grpo::bf16_bits(src[i]);
  }
}

uint16_t* bf16_data(paddle::Tensor& t) { return static_cast<uint16_t*>(t.data()); }
const uint16_t* bf16_data(const paddle::Tensor& t) { return static_cast<const uint16_t*>(t.data()); }

}  // namespace

void grpo::check_bf16_input(const paddle::Tensor& t, const char* op, const char* name, bool bf16_allowed) {
  PD_CHECK(t.is_cpu(), op, ": ", name, " must be on the CPU, it is on ", t.place().DebugString());
  PD_CHECK(t.dtype() == kF32 || (bf16_allowed && t.dtype() == kBF16), op, ": ", name, " must be float32",
           bf16_allowed ? " or bfloat16" : "", ", got ", phi::DataTypeToString(t.dtype()));
}

paddle::Tensor grpo::as_bf16(const paddle::Tensor& t) {
  const auto d = dense(t);
  if (d.dtype() == kBF16) return d;
  auto out = paddle::empty(d.shape(), kBF16, d.place());
  convert(d.data<float>(), bf16_data(out), d.numel());
  return out;
}

namespace {

using grpo::as_bf16;
using grpo::check_bf16_input;

// C (m, n) = op(A) op(B) (+ C when accumulate), op(A) (m, k), op(B) (k, n), row-major with the given leading dims.
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const paddle::Tensor& a, const paddle::Tensor& b,
          float* c, bool accumulate, const char* op) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!accumulate) std::memset(c, 0, sizeof(float) * m * n);
    return;
  }
  const int status = dnnl_gemm_bf16bf16f32(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, bf16_data(a), ta ? m : k,
                                           bf16_data(b), tb ? k : n, accumulate ? 1.0f : 0.0f, c, n);
  PD_CHECK(status == 0, op, ": dnnl_gemm_bf16bf16f32 failed with oneDNN status ", status, " for (m, n, k) = (", m,
           ", ", n, ", ", k, ")");
}

std::vector<paddle::Tensor> ToBf16(const paddle::Tensor& x) {
  check_bf16_input(x, "grpo_to_bf16", "x", false);
  return {as_bf16(x)};
}

// x (..., K) unless transpose_x, where x is (K, M); y (K, N), or (N, K) with transpose_y.
std::vector<paddle::Tensor> Bf16Matmul(const paddle::Tensor& x_in, const paddle::Tensor& y_in, bool transpose_x,
                                       bool transpose_y) {
  const char* op = "grpo_bf16_matmul";
  check_bf16_input(x_in, op, "x", true);
  check_bf16_input(y_in, op, "y", true);
  PD_CHECK(y_in.shape().size() == 2 && (transpose_x ? x_in.shape().size() == 2 : !x_in.shape().empty()), op,
           ": y must be 2-D and x 2-D (or [..., K] without transpose_x), got x ", shape_str(x_in.shape()), " and y ",
           shape_str(y_in.shape()));
  const auto& xs = x_in.shape();
  const int64_t k = transpose_x ? xs[0] : xs.back();
  const int64_t m = transpose_x ? xs[1] : (k ? x_in.numel() / k : 0);
  const int64_t yk = transpose_y ? y_in.shape()[1] : y_in.shape()[0];
  const int64_t n = transpose_y ? y_in.shape()[0] : y_in.shape()[1];
  PD_CHECK(yk == k, op, ": inner dimensions differ: x ", shape_str(xs), " (transpose_x ", transpose_x, ") and y ",
           shape_str(y_in.shape()), " (transpose_y ", transpose_y, ")");
  std::vector<int64_t> shape = transpose_x ? std::vector<int64_t>{m, n} : xs;
  shape.back() = n;
  auto out = paddle::empty(shape, kF32, x_in.place());
  gemm(transpose_x, transpose_y, m, n, k, as_bf16(x_in), as_bf16(y_in), out.data<float>(), false, op);
  return {out};
}

void check_linear(const paddle::Tensor& x, const paddle::Tensor& w, const paddle::Tensor& wb, const char* op) {
  check_bf16_input(x, op, "x", false);
  check_bf16_input(w, op, "weight", false);
  PD_CHECK(wb.is_cpu() && wb.dtype() == kBF16, op, ": weight_bf16 must be a bfloat16 CPU tensor, got ",
           phi::DataTypeToString(wb.dtype()));
  PD_CHECK(!x.shape().empty() && w.shape().size() == 2 && wb.shape() == w.shape() && x.shape().back() == w.shape()[0],
           op, ": x must be [..., K], weight and weight_bf16 [K, N], got x ", shape_str(x.shape()), ", weight ",
           shape_str(w.shape()), ", weight_bf16 ", shape_str(wb.shape()));
}

std::vector<paddle::Tensor> Bf16Linear(const paddle::Tensor& x, const paddle::Tensor& w, const paddle::Tensor& wb,
                                       bool weight_grad) {
  const char* op = "grpo_bf16_linear";
  check_linear(x, w, wb, op);
  const int64_t k = w.shape()[0], n = w.shape()[1];
  const int64_t m = k ? x.numel() / k : 0;
  auto xb = as_bf16(x);  // (..., K), kept for the weight's gradient instead of the fp32 input
  auto shape = x.shape();
  shape.back() = n;
  auto out = paddle::empty(shape, kF32, x.place());
  gemm(false, false, m, n, k, xb, dense(wb), out.data<float>(), false, op);
  return {out, xb};
}

std::vector<paddle::Tensor> Bf16LinearGrad(const paddle::Tensor& xb, const paddle::Tensor& wb,
                                           const paddle::Tensor& dout_in, bool weight_grad) {
  const char* op = "grpo_bf16_linear (backward)";
  const int64_t k = wb.shape()[0], n = wb.shape()[1];
  const int64_t m = k ? xb.numel() / k : 0;
  const auto dout = as_bf16(dout_in);  // (..., N)
  auto dx = paddle::empty(xb.shape(), kF32, xb.place());
  gemm(false, true, m, k, n, dout, dense(wb), dx.data<float>(), false, op);  // dY (M, N) Wb^T -> (M, K)
  // A frozen weight (LoRA's base) still gets a tensor of its shape, which paddle discards; no product then.
  auto dw = weight_grad ? paddle::empty({k, n}, kF32, xb.place()) : paddle::zeros({k, n}, kF32, xb.place());
  if (weight_grad) gemm(true, false, k, n, m, xb, dout, dw.data<float>(), false, op);  // X^T (K, M) dY -> (K, N)
  return {dx, dw};
}

std::vector<std::vector<int64_t>> SameShape(const std::vector<int64_t>& x) { return {x}; }
std::vector<paddle::DataType> Bf16Dtype(const paddle::DataType&) { return {kBF16}; }

std::vector<std::vector<int64_t>> Bf16MatmulShape(const std::vector<int64_t>& x, const std::vector<int64_t>& y,
                                                  bool transpose_x, bool transpose_y) {
  std::vector<int64_t> shape = transpose_x ? std::vector<int64_t>{x[1], 0} : x;
  shape.back() = transpose_y ? y[0] : y[1];
  return {shape};
}
std::vector<paddle::DataType> Fp32Of2(const paddle::DataType&, const paddle::DataType&) { return {kF32}; }

std::vector<std::vector<int64_t>> Bf16LinearShape(const std::vector<int64_t>& x, const std::vector<int64_t>& w,
                                                  const std::vector<int64_t>&) {
  auto out = x;
  out.back() = w[1];
  return {out, x};
}
std::vector<paddle::DataType> Bf16LinearDtype(const paddle::DataType&, const paddle::DataType&,
                                              const paddle::DataType&) {
  return {kF32, kBF16};
}

}  // namespace

PD_BUILD_OP(grpo_to_bf16)
    .Inputs({"X"})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(ToBf16))
    .SetInferShapeFn(PD_INFER_SHAPE(SameShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(Bf16Dtype));

PD_BUILD_OP(grpo_bf16_matmul)
    .Inputs({"X", "Y"})
    .Outputs({"Out"})
    .Attrs({"transpose_x: bool", "transpose_y: bool"})
    .SetKernelFn(PD_KERNEL(Bf16Matmul))
    .SetInferShapeFn(PD_INFER_SHAPE(Bf16MatmulShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(Fp32Of2));

PD_BUILD_OP(grpo_bf16_linear)
    .Inputs({"X", "Weight", "WeightBf16"})
    .Outputs({"Out", "XSaved"})
    .Attrs({"weight_grad: bool"})
    .SetKernelFn(PD_KERNEL(Bf16Linear))
    .SetInferShapeFn(PD_INFER_SHAPE(Bf16LinearShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(Bf16LinearDtype));

PD_BUILD_GRAD_OP(grpo_bf16_linear)
    .Inputs({"XSaved", "WeightBf16", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X"), paddle::Grad("Weight")})
    .Attrs({"weight_grad: bool"})
    .SetKernelFn(PD_KERNEL(Bf16LinearGrad));

#endif  // GRPO_WITH_DNNL
