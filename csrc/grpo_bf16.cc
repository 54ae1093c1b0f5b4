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
//   grpo_bf16_linear(X, [W_1, ...], Wb) -> Out, XSaved
//                                                     X (..., K) @ [W_1 | W_2 | ...] (K, N) from Wb = bf16 of that;
//                                                     backward: dX = dY Wb^T, and to each master W_i (K, N_i) its
//                                                     fp32 dW_i = XSaved^T dY[:, its columns]: no concatenated copy
//   grpo_bf16_mlp(X, [Wg, Wu], Wd, Wgub, Wdb) -> Out, XSaved, GateUp, HSaved
//                                                     down(silu(gate(X)) * up(X)), SwiGLU's output and gradient in bf16
//
// Conversion rounds to nearest even and flushes float32 subnormals to zero, as the AVX512-BF16 instruction
// (used where the compiler targets it) does, so every element converts alike; NaN stays NaN, so the
// trainer's non-finite checks still see it.

#ifdef GRPO_WITH_DNNL

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <string>
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

// C (m, n) = op(A) op(B) (+ C when accumulate), op(A) (m, k), op(B) (k, n), row-major; a, b and c are dense
// unless ldb or ldc says otherwise (b's and c's row strides, in elements: a column block of a wider matrix).
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const uint16_t* a, const uint16_t* b, float* c,
          bool accumulate, const char* op, int64_t ldb = 0, int64_t ldc = 0) {
  if (m == 0 || n == 0) return;
  if (ldc == 0) ldc = n;
  if (k == 0) {
    for (int64_t row = 0; row < m && !accumulate; ++row) std::memset(c + row * ldc, 0, sizeof(float) * n);
    return;
  }
  if (ldb == 0) ldb = tb ? k : n;
  const int status = dnnl_gemm_bf16bf16f32(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, a, ta ? m : k, b, ldb,
                                           accumulate ? 1.0f : 0.0f, c, ldc);
  PD_CHECK(status == 0, op, ": dnnl_gemm_bf16bf16f32 failed with oneDNN status ", status, " for (m, n, k) = (", m,
           ", ", n, ", ", k, ")");
}

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const paddle::Tensor& a, const paddle::Tensor& b,
          float* c, bool accumulate, const char* op) {
  gemm(ta, tb, m, n, k, bf16_data(a), bf16_data(b), c, accumulate, op);
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

// -> N, the weights' widths summed, after checking every weight is (K, N_i) float32 and wb (K, N) bfloat16.
int64_t check_linear(const paddle::Tensor& x, const std::vector<paddle::Tensor>& ws, const paddle::Tensor& wb,
                     const char* op) {
  check_bf16_input(x, op, "x", false);
  PD_CHECK(!ws.empty(), op, ": weights must hold at least one tensor");
  PD_CHECK(wb.is_cpu() && wb.dtype() == kBF16 && wb.shape().size() == 2, op,
           ": weight_bf16 must be a 2-D bfloat16 CPU tensor, got ", phi::DataTypeToString(wb.dtype()), " ",
           shape_str(wb.shape()));
  PD_CHECK(!x.shape().empty() && x.shape().back() == wb.shape()[0], op, ": x must be [..., K] with weight_bf16 [K, N], got x ",
           shape_str(x.shape()), " and weight_bf16 ", shape_str(wb.shape()));
  int64_t n = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    check_bf16_input(ws[i], op, ("weights[" + std::to_string(i) + "]").c_str(), false);
    PD_CHECK(ws[i].shape().size() == 2 && ws[i].shape()[0] == wb.shape()[0], op, ": weights[", i,
             "] must be [K, N_i] with K = ", wb.shape()[0], ", got ", shape_str(ws[i].shape()));
    n += ws[i].shape()[1];
  }
  PD_CHECK(n == wb.shape()[1], op, ": weight_bf16 must be the weights side by side, [K, ", n, "], got ",
           shape_str(wb.shape()));
  return n;
}

// The weights (fp32) are inputs only so that their gradients reach each one; the product reads wb.
std::vector<paddle::Tensor> Bf16Linear(const paddle::Tensor& x, const std::vector<paddle::Tensor>& ws,
                                       const paddle::Tensor& wb, bool weight_grad) {
  const char* op = "grpo_bf16_linear";
  const int64_t n = check_linear(x, ws, wb, op), k = wb.shape()[0];
  const int64_t m = k ? x.numel() / k : 0;
  auto xb = as_bf16(x);  // (..., K), kept for the weights' gradients instead of the fp32 input
  auto shape = x.shape();
  shape.back() = n;
  auto out = paddle::empty(shape, kF32, x.place());
  gemm(false, false, m, n, k, xb, dense(wb), out.data<float>(), false, op);
  return {out, xb};
}

std::vector<int64_t> widths(const std::vector<paddle::Tensor>& weights) {
  std::vector<int64_t> out;
  for (const auto& w : weights) out.push_back(w.shape()[1]);
  return out;
}

// The gradients of weights W_i (K, N_i) side by side, from the products' bf16 input xb (M, K) and output gradient
// dout (M, N): dW_i = xb^T (K, M) dout[:, columns of W_i] (M, N_i), one product each. A frozen weight (LoRA's base)
// still gets a tensor of its shape, which paddle discards; no product then.
std::vector<paddle::Tensor> column_weight_grads(const paddle::Tensor& xb, const paddle::Tensor& dout,
                                                const std::vector<int64_t>& widths, bool weight_grad, const char* op) {
  const int64_t k = xb.shape().back(), n = dout.shape().back();
  const int64_t m = k ? xb.numel() / k : 0;
  std::vector<paddle::Tensor> grads;
  int64_t first_column = 0;
  for (const int64_t width : widths) {
    auto dw = weight_grad ? paddle::empty({k, width}, kF32, xb.place()) : paddle::zeros({k, width}, kF32, xb.place());
    if (weight_grad)
      gemm(true, false, k, width, m, bf16_data(xb), bf16_data(dout) + first_column, dw.data<float>(), false, op, n);
    grads.push_back(dw);
    first_column += width;
  }
  return grads;
}

// -> dX, then dW_i for each weight (column_weight_grads).
std::vector<paddle::Tensor> Bf16LinearGrad(const paddle::Tensor& xb, const paddle::Tensor& wb_in,
                                           const paddle::Tensor& dout_in, const std::vector<paddle::Tensor>& ws,
                                           bool weight_grad) {
  const char* op = "grpo_bf16_linear (backward)";
  const auto wb = dense(wb_in);
  const int64_t k = wb.shape()[0], n = wb.shape()[1];
  const int64_t m = k ? xb.numel() / k : 0;
  const auto dout = as_bf16(dout_in);  // (..., N)
  auto dx = paddle::empty(xb.shape(), kF32, xb.place());
  gemm(false, true, m, k, n, dout, wb, dx.data<float>(), false, op);  // dY (M, N) Wb^T -> (M, K)
  std::vector<paddle::Tensor> grads{dx};
  for (auto& dw : column_weight_grads(xb, dout, widths(ws), weight_grad, op)) grads.push_back(dw);
  return grads;
}

// grpo_bf16_mlp: down(silu(gate(x)) * up(x)) as three grpo_bf16_linear and a grpo_silu_mul compute it, the same
// products on the same bf16 operands, but SwiGLU writes its output as the bf16 values the down projection reads, and
// its backward the bf16 gradient the gate and up projections' read: neither goes through float32 and a conversion.
// x (M, K) with [W_gate | W_up] (K, 2I) and W_down (I, N); saved for backward: x's bf16 copy, gate|up (M, 2I)
// float32 (SwiGLU's input) and SwiGLU's bf16 output.
std::vector<paddle::Tensor> Bf16Mlp(const paddle::Tensor& x, const std::vector<paddle::Tensor>& gate_up,
                                    const paddle::Tensor& down, const paddle::Tensor& gate_up_bf16,
                                    const paddle::Tensor& down_bf16, bool weight_grad) {
  const char* op = "grpo_bf16_mlp";
  const int64_t inter = check_linear(x, gate_up, gate_up_bf16, op) / 2;
  PD_CHECK(gate_up.size() == 2 && gate_up[0].shape() == gate_up[1].shape(), op,
           ": gate_up must be the gate's and the up projection's weights, of one shape");
  check_bf16_input(down, op, "down", false);
  PD_CHECK(down.shape().size() == 2 && down.shape()[0] == inter && down_bf16.shape() == down.shape() &&
               down_bf16.dtype() == kBF16,
           op, ": down and down_bf16 (bfloat16) must be [I, N] with I = ", inter, ", got ", shape_str(down.shape()),
           " and ", shape_str(down_bf16.shape()));
  const int64_t k = x.shape().back(), n = down.shape()[1];
  const int64_t m = k ? x.numel() / k : 0;
  auto xb = as_bf16(x);
  auto shape = x.shape();
  shape.back() = 2 * inter;
  auto gu = paddle::empty(shape, kF32, x.place());
  gemm(false, false, m, 2 * inter, k, xb, dense(gate_up_bf16), gu.data<float>(), false, op);
  shape.back() = inter;
  auto hb = paddle::empty(shape, kBF16, x.place());
  const float* a = gu.data<float>();
  uint16_t* h = bf16_data(hb);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < m; ++r) {
    uint16_t* row = h + r * inter;
    grpo::silu_mul_row(a + r * 2 * inter, a + r * 2 * inter + inter, inter,
                       [row](int64_t i, float value) { row[i] = grpo::bf16_bits(value); });
  }
  shape.back() = n;
  auto out = paddle::empty(shape, kF32, x.place());
  gemm(false, false, m, n, inter, hb, dense(down_bf16), out.data<float>(), false, op);
  return {out, xb, gu, hb};
}

// -> dX, dW_down, dW_gate, dW_up.
std::vector<paddle::Tensor> Bf16MlpGrad(const paddle::Tensor& xb, const paddle::Tensor& gu, const paddle::Tensor& hb,
                                        const paddle::Tensor& gate_up_bf16, const paddle::Tensor& down_bf16,
                                        const paddle::Tensor& dout_in, const std::vector<paddle::Tensor>& gate_up,
                                        bool weight_grad) {
  const char* op = "grpo_bf16_mlp (backward)";
  const int64_t k = xb.shape().back(), inter = hb.shape().back(), n = dout_in.shape().back();
  const int64_t m = k ? xb.numel() / k : 0;
  const auto dout = as_bf16(dout_in);  // (M, N)
  auto dh = paddle::empty(hb.shape(), kF32, xb.place());
  gemm(false, true, m, inter, n, dout, dense(down_bf16), dh.data<float>(), false, op);  // dY W_down^T -> (M, I)
  auto grads = column_weight_grads(hb, dout, {n}, weight_grad, op);  // W_down's
  auto dgu = paddle::empty(gu.shape(), kBF16, xb.place());  // SwiGLU's gradient, bf16 as the products read it
  const float* a = gu.data<float>();
  const float* dy = dh.data<float>();
  uint16_t* g = bf16_data(dgu);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < m; ++r) {
    uint16_t* da = g + r * 2 * inter;
    uint16_t* du = da + inter;
    grpo::silu_mul_grad_row(a + r * 2 * inter, a + r * 2 * inter + inter, dy + r * inter, inter,
                            [da, du](int64_t i, float gate, float up) {
                              da[i] = grpo::bf16_bits(gate);
                              du[i] = grpo::bf16_bits(up);
                            });
  }
  auto dx = paddle::empty(xb.shape(), kF32, xb.place());
  gemm(false, true, m, k, 2 * inter, dgu, dense(gate_up_bf16), dx.data<float>(), false, op);  // (M, 2I) -> (M, K)
  grads.insert(grads.begin(), dx);
  for (auto& dw : column_weight_grads(xb, dgu, widths(gate_up), weight_grad, op)) grads.push_back(dw);
  return grads;
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

std::vector<std::vector<int64_t>> Bf16LinearShape(const std::vector<int64_t>& x,
                                                  const std::vector<std::vector<int64_t>>&,
                                                  const std::vector<int64_t>& wb) {
  auto out = x;
  out.back() = wb[1];
  return {out, x};
}
std::vector<std::vector<int64_t>> Bf16MlpShape(const std::vector<int64_t>& x, const std::vector<std::vector<int64_t>>&,
                                               const std::vector<int64_t>& down, const std::vector<int64_t>&,
                                               const std::vector<int64_t>&) {
  auto out = x, gate_up = x, h = x;
  out.back() = down[1];
  gate_up.back() = 2 * down[0];
  h.back() = down[0];
  return {out, x, gate_up, h};
}
std::vector<paddle::DataType> Bf16MlpDtype(const paddle::DataType&, const std::vector<paddle::DataType>&,
                                           const paddle::DataType&, const paddle::DataType&, const paddle::DataType&) {
  return {kF32, kBF16, kF32, kBF16};
}

std::vector<paddle::DataType> Bf16LinearDtype(const paddle::DataType&, const std::vector<paddle::DataType>&,
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
    .Inputs({"X", paddle::Vec("Weights"), "WeightBf16"})
    .Outputs({"Out", "XSaved"})
    .Attrs({"weight_grad: bool"})
    .SetKernelFn(PD_KERNEL(Bf16Linear))
    .SetInferShapeFn(PD_INFER_SHAPE(Bf16LinearShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(Bf16LinearDtype));

PD_BUILD_GRAD_OP(grpo_bf16_linear)
    .Inputs({"XSaved", "WeightBf16", paddle::Grad("Out"), paddle::Vec("Weights")})
    .Outputs({paddle::Grad("X"), paddle::Grad(paddle::Vec("Weights"))})
    .Attrs({"weight_grad: bool"})
    .SetKernelFn(PD_KERNEL(Bf16LinearGrad));

PD_BUILD_OP(grpo_bf16_mlp)
    .Inputs({"X", paddle::Vec("GateUp"), "Down", "GateUpBf16", "DownBf16"})
    .Outputs({"Out", "XSaved", "GateUpOut", "HSaved"})
    .Attrs({"weight_grad: bool"})
    .SetKernelFn(PD_KERNEL(Bf16Mlp))
    .SetInferShapeFn(PD_INFER_SHAPE(Bf16MlpShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(Bf16MlpDtype));

PD_BUILD_GRAD_OP(grpo_bf16_mlp)
    .Inputs({"XSaved", "GateUpOut", "HSaved", "GateUpBf16", "DownBf16", paddle::Grad("Out"), paddle::Vec("GateUp")})
    .Outputs({paddle::Grad("X"), paddle::Grad("Down"), paddle::Grad(paddle::Vec("GateUp"))})
    .Attrs({"weight_grad: bool"})
    .SetKernelFn(PD_KERNEL(Bf16MlpGrad));

#endif  // GRPO_WITH_DNNL
