// Packed-weight matmul for the rollout engine's lm_head, through the packed GEMM API of the MKL that
// paddle ships (libmklml_intel.so: cblas_sgemm_pack / cblas_sgemm_compute).
//
// Each decode step multiplies a few rows (one per active sequence) by lm_head's (V, Hd) weight, 545 MB at
// Qwen2.5's vocabulary. Plain sgemm copies the weight into its blocked layout on every call; the packed API
// keeps the blocked copy, made once per weight refresh (FusedEngine.sync). Measured on the build machine
// (Xeon, 2 threads) for (151936, 896): 61 -> 38 ms at 8 rows, 75 -> 60 ms at 32. The layers' matrices
// (a few MB each, 3x larger packed) measured no faster, so the engine packs only lm_head.
//
// build.py defines GRPO_WITH_MKL and links libmklml_intel.so only where paddle ships it; elsewhere this
// file registers nothing and the engine keeps paddle.matmul.

#ifdef GRPO_WITH_MKL

#include <cstdint>
#include <vector>

#include "grpo_ops.h"

extern "C" {
size_t cblas_sgemm_pack_get_size(int identifier, int m, int n, int k);
void cblas_sgemm_pack(int layout, int identifier, int trans, int m, int n, int k, float alpha, const float* src,
                      int ld, float* dest);
void cblas_sgemm_compute(int layout, int transa, int transb, int m, int n, int k, const float* a, int lda,
                         const float* b, int ldb, float beta, float* c, int ldc);
}

namespace {

using grpo::shape_str;
// mkl_cblas.h's enumerators
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112, kPacked = 151, kBMatrix = 162;

// Bytes of a packed (K, N) B matrix; the same for every number of rows it is later multiplied with.
int64_t packed_floats(int64_t n, int64_t k) {
  return static_cast<int64_t>((cblas_sgemm_pack_get_size(kBMatrix, 1, n, k) + sizeof(float) - 1) / sizeof(float));
}

void check_cpu_float32(const paddle::Tensor& t, const char* op, const char* name) {
  PD_CHECK(t.is_cpu(), op, ": ", name, " must be on the CPU, it is on ", t.place().DebugString());
  PD_CHECK(t.dtype() == paddle::DataType::FLOAT32, op, ": ", name, " must be float32, got ",
           phi::DataTypeToString(t.dtype()));
}

// w (K, N) -> packed B = w, or with transpose w (N, K) -> packed B = w^T (lm_head's (V, H) weight).
std::vector<paddle::Tensor> PackWeight(const paddle::Tensor& w_in, bool transpose) {
  const char* op = "grpo_pack_weight";
  check_cpu_float32(w_in, op, "weight");
  PD_CHECK(w_in.shape().size() == 2, op, ": weight must be 2-D, got ", shape_str(w_in.shape()));
  const auto w = grpo::dense(w_in);
  const int64_t rows = w.shape()[0], cols = w.shape()[1];
  const int64_t k = transpose ? cols : rows, n = transpose ? rows : cols;
  auto packed = paddle::empty({packed_floats(n, k)}, paddle::DataType::FLOAT32, w.place());
  cblas_sgemm_pack(kRowMajor, kBMatrix, transpose ? kTrans : kNoTrans, 1, n, k, 1.0f, w.data<float>(), cols,
                   packed.data<float>());
  return {packed};
}

// x (..., K) @ packed (K, N) -> (..., N)
std::vector<paddle::Tensor> PackedMatmul(const paddle::Tensor& x_in, const paddle::Tensor& packed, int64_t n) {
  const char* op = "grpo_packed_matmul";
  check_cpu_float32(x_in, op, "x");
  check_cpu_float32(packed, op, "packed");
  PD_CHECK(!x_in.shape().empty() && n > 0, op, ": x must be [..., K] and n positive, got ", shape_str(x_in.shape()),
           " and n = ", n);
  const auto x = grpo::dense(x_in);
  const int64_t k = x.shape().back();
  PD_CHECK(packed.numel() == packed_floats(n, k), op, ": packed holds ", packed.numel(),
           " floats, not a packed (", k, ", ", n, ") matrix (", packed_floats(n, k), ")");
  auto shape = x.shape();
  shape.back() = n;
  auto out = paddle::empty(shape, paddle::DataType::FLOAT32, x.place());
  const int64_t m = k ? x.numel() / k : 0;
  if (m > 0) {
    cblas_sgemm_compute(kRowMajor, kNoTrans, kPacked, m, n, k, x.data<float>(), k, packed.data<float>(), n, 0.0f,
                        out.data<float>(), n);
  }
  return {out};
}

std::vector<std::vector<int64_t>> PackWeightShape(const std::vector<int64_t>& w, bool transpose) {
  return {{packed_floats(transpose ? w[0] : w[1], transpose ? w[1] : w[0])}};
}

std::vector<std::vector<int64_t>> PackedMatmulShape(const std::vector<int64_t>& x, const std::vector<int64_t>&,
                                                    int64_t n) {
  auto shape = x;
  shape.back() = n;
  return {shape};
}

std::vector<paddle::DataType> Float32(const paddle::DataType&) { return {paddle::DataType::FLOAT32}; }
std::vector<paddle::DataType> Float32Of2(const paddle::DataType&, const paddle::DataType&) {
  return {paddle::DataType::FLOAT32};
}

}  // namespace

PD_BUILD_OP(grpo_pack_weight)
    .Inputs({"Weight"})
    .Outputs({"Packed"})
    .Attrs({"transpose: bool"})
    .SetKernelFn(PD_KERNEL(PackWeight))
    .SetInferShapeFn(PD_INFER_SHAPE(PackWeightShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(Float32));

PD_BUILD_OP(grpo_packed_matmul)
    .Inputs({"X", "Packed"})
    .Outputs({"Out"})
    .Attrs({"n: int64_t"})
    .SetKernelFn(PD_KERNEL(PackedMatmul))
    .SetInferShapeFn(PD_INFER_SHAPE(PackedMatmulShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(Float32Of2));

#endif  // GRPO_WITH_MKL
