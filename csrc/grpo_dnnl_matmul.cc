// bf16 products with fp32 results through oneDNN's matmul primitive, on weights reordered once ("prepacked") into
// the layout the primitive picks, instead of dnnl_gemm_bf16bf16f32 (grpo_bf16.cc), which copies its B operand into
// its blocked layout on every call. The fused rollout engine holds its bf16 weights packed (alignment/rollout/fused.py);
// bench/bench_bf16_gemm.py measures both.
//
//   grpo_prepack_bf16(W, transpose_w, rows_hint) -> Packed uint8     W (K, N), or (N, K) with transpose_w (the fused
//                                                                    engine's copies); float32 or bfloat16
//   grpo_prepacked_matmul(X, Packed, k, n, rows_hint) -> fp32 (..., N)   X (..., K) float32 or bfloat16
//
// The layout is the one oneDNN picks (weights format_tag any) for src (rows_hint, K) bf16 x weights (K, N) bf16 ->
// dst (rows_hint, N) fp32, so the primitive for rows_hint rows reads Packed as it is. X's M rows are multiplied
// rows_hint at a time, the last piece by the primitive for its M % rows_hint rows, so a weight shape never needs more
// than rows_hint primitives (a rollout's prefill has a new row count every step). A primitive for fewer rows is created
// on the same layout: with format_tag any when oneDNN picks the same one, else with Packed's layout given explicitly
// (oneDNN's brgemm matmul then keeps its N block). On the AVX512-BF16 EPYC (no AMX) oneDNN 3.6.2 picked BA16a64b2a
// (panels of 64 columns, blocks of 32 K rows in interleaved pairs) for every M from 1 to 12,288 and every SmolLM2
// weight; its brgemm matmul may narrow the N block for some M on other ISAs (AMX), which the explicit layout covers.
// oneDNN's runtime M (DNNL_RUNTIME_DIM_VAL) is not used: v3.6's brgemm matmul takes it only on AMX, elsewhere a slower
// implementation would run.
//
// Packed = a 64-byte header (k, n, rows_hint and the layout's size) + the reordered weights, so a packed tensor is
// never read as another shape's. Engine, stream and the primitives live in one process-wide cache under a mutex: a
// reorder per (K, N, rows_hint, transpose_w) and the matmul for rows_hint rows per (K, N, rows_hint) are kept for the
// process (one per weight shape), the matmuls for fewer rows up to kOtherRowsKept, the least recently used dropped
// first (each holds about 240 KB: 300 of them measured 73 MB of RSS).

#ifdef GRPO_WITH_DNNL

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "dnnl_api.h"
#include "grpo_bf16.h"
#include "grpo_ops.h"

namespace {

using grpo::shape_str;
constexpr auto kF32 = paddle::DataType::FLOAT32;
constexpr auto kU8 = paddle::DataType::UINT8;

struct Header {  // the first kHeaderBytes of Packed
  char magic[8];
  int64_t k, n, rows_hint, layout_bytes;
};
constexpr int64_t kHeaderBytes = 64;  // keeps the weights at the allocation's 64-byte alignment
constexpr char kMagic[8] = "grpoDNL";
static_assert(sizeof(Header) <= kHeaderBytes, "Header outgrew its bytes");

void check(dnnl_status_t status, const char* op, const char* what) {
  PD_CHECK(status == dnnl_success, op, ": oneDNN's ", what, " failed with status ", static_cast<int>(status));
}

struct Matmul {
  dnnl_primitive_t primitive = nullptr;
  dnnl_memory_desc_t src = nullptr, weights = nullptr, dst = nullptr;  // (M, K) bf16, (K, N) bf16 packed, (M, N) fp32
  Matmul() = default;
  Matmul(const Matmul&) = delete;
  Matmul& operator=(const Matmul&) = delete;
  ~Matmul() {
    if (primitive) dnnl_primitive_destroy(primitive);
    for (auto md : {src, weights, dst}) {
      if (md) dnnl_memory_desc_destroy(md);
    }
  }
};
using MatmulPtr = std::shared_ptr<const Matmul>;  // a caller executing one keeps it alive past its eviction

struct Reorder {
  dnnl_primitive_t primitive = nullptr;
  dnnl_memory_desc_t from = nullptr, to = nullptr;  // plain (K, N) bf16 (row- or column-major), the packed layout
};

constexpr size_t kOtherRowsKept = 256;  // matmuls for row counts other than their rows_hint

struct Cache {
  std::mutex mutex;
  dnnl_engine_t engine = nullptr;
  dnnl_stream_t stream = nullptr;
  std::map<std::tuple<int64_t, int64_t, int64_t>, MatmulPtr> layouts;  // (K, N, rows_hint) -> rows_hint's matmul
  // (M, K, N, rows_hint) -> (the matmul for M rows, the value of `uses` at its last use)
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, std::pair<MatmulPtr, uint64_t>> others;
  uint64_t uses = 0;
  std::map<std::tuple<int64_t, int64_t, int64_t, bool>, Reorder> reorders;  // (K, N, rows_hint, transpose_w)
};

// The cache, its engine and stream created on first use by a caller holding its mutex; refuses a oneDNN other than 3.x.
Cache& cache() {
  static Cache instance;
  return instance;
}

void ensure_engine(Cache& c, const char* op) {
  if (c.engine) return;
  const dnnl_version_t* version = dnnl_version();
  PD_CHECK(version && version->major == 3, op, ": csrc/dnnl_api.h declares oneDNN 3.x's C API, but paddle's ",
           "libdnnl.so.3 reports version ", version ? version->major : -1, ".", version ? version->minor : -1,
           ": rebuild without GRPO_WITH_DNNL or update dnnl_api.h");
  check(dnnl_engine_create(&c.engine, dnnl_cpu, 0), op, "engine creation");
  check(dnnl_stream_create(&c.stream, c.engine, dnnl_stream_default_flags), op, "stream creation");
}

dnnl_memory_desc_t plain_md(int64_t rows, int64_t cols, dnnl_data_type_t type, bool column_major, const char* op) {
  dnnl_dims_t dims = {rows, cols};
  dnnl_dims_t strides = {column_major ? 1 : cols, column_major ? rows : 1};
  dnnl_memory_desc_t md = nullptr;
  check(dnnl_memory_desc_create_with_strides(&md, 2, dims, type, strides), op, "memory descriptor creation");
  return md;
}

// A matmul primitive desc for (m, k) x weights (k, n) -> (m, n), or nullptr where oneDNN has none for weights.
dnnl_primitive_desc_t matmul_pd(Cache& c, const Matmul& mm, const_dnnl_memory_desc_t weights) {
  dnnl_primitive_desc_t pd = nullptr;
  if (dnnl_matmul_primitive_desc_create(&pd, c.engine, mm.src, weights, nullptr, mm.dst, nullptr) != dnnl_success) {
    return nullptr;
  }
  return pd;
}

// Keeps pd's weights layout in mm and creates its primitive; pd is released.
void finish(Matmul& mm, dnnl_primitive_desc_t pd, const char* op) {
  check(dnnl_memory_desc_clone(&mm.weights, dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0)), op,
        "memory descriptor copy");
  const dnnl_status_t status = dnnl_primitive_create(&mm.primitive, pd);
  dnnl_primitive_desc_destroy(pd);
  check(status, op, "matmul primitive creation");
}

// A new primitive for m rows: on the layout oneDNN picks, or, where it would pick another, on packed_for's.
MatmulPtr create_matmul(Cache& c, int64_t m, int64_t k, int64_t n, const Matmul* packed_for, int64_t rows_hint,
                        const char* op) {
  auto mm = std::make_shared<Matmul>();
  mm->src = plain_md(m, k, dnnl_bf16, false, op);
  mm->dst = plain_md(m, n, dnnl_f32, false, op);
  dnnl_memory_desc_t any = nullptr;
  dnnl_dims_t dims = {k, n};
  check(dnnl_memory_desc_create_with_tag(&any, 2, dims, dnnl_bf16, dnnl_format_tag_any), op,
        "memory descriptor creation");
  dnnl_primitive_desc_t pd = matmul_pd(c, *mm, any);
  dnnl_memory_desc_destroy(any);
  PD_CHECK(pd, op, ": oneDNN has no bf16 matmul for (", m, ", ", k, ") x (", k, ", ", n, ") -> fp32");
  if (packed_for &&
      !dnnl_memory_desc_equal(dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0), packed_for->weights)) {
    // oneDNN would pick another layout for m rows: ask for the one the weights were packed in
    dnnl_primitive_desc_destroy(pd);
    pd = matmul_pd(c, *mm, packed_for->weights);
    PD_CHECK(pd, op, ": oneDNN has no bf16 matmul for ", m, " rows on weights packed for rows_hint = ", rows_hint,
             " (K = ", k, ", N = ", n, "): pack them with rows_hint = ", m);
  }
  finish(*mm, pd, op);
  return mm;
}

// The primitive for m rows on the layout oneDNN picks for rows_hint rows (k, n, rows_hint > 0, m > 0); c.mutex held.
MatmulPtr matmul_locked(Cache& c, int64_t m, int64_t k, int64_t n, int64_t rows_hint, const char* op) {
  ensure_engine(c, op);
  auto& layout = c.layouts[std::make_tuple(k, n, rows_hint)];
  if (!layout) layout = create_matmul(c, rows_hint, k, n, nullptr, rows_hint, op);
  if (m == rows_hint) return layout;
  const auto key = std::make_tuple(m, k, n, rows_hint);
  auto found = c.others.find(key);
  if (found != c.others.end()) {
    found->second.second = ++c.uses;
    return found->second.first;
  }
  MatmulPtr mm = create_matmul(c, m, k, n, layout.get(), rows_hint, op);
  if (c.others.size() >= kOtherRowsKept) {
    auto oldest = c.others.begin();
    for (auto it = c.others.begin(); it != c.others.end(); ++it) {
      if (it->second.second < oldest->second.second) oldest = it;
    }
    c.others.erase(oldest);
  }
  c.others.emplace(key, std::make_pair(mm, ++c.uses));
  return mm;
}

MatmulPtr matmul_for(int64_t m, int64_t k, int64_t n, int64_t rows_hint, const char* op) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return matmul_locked(c, m, k, n, rows_hint, op);
}

const Reorder& reorder_for(int64_t k, int64_t n, int64_t rows_hint, bool transpose_w, const char* op) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  const auto key = std::make_tuple(k, n, rows_hint, transpose_w);
  auto found = c.reorders.find(key);
  if (found != c.reorders.end()) return found->second;
  const MatmulPtr mm = matmul_locked(c, rows_hint, k, n, rows_hint, op);
  Reorder r;
  r.from = plain_md(k, n, dnnl_bf16, transpose_w, op);  // (N, K) row-major is (K, N) column-major
  r.to = mm->weights;  // the layout's matmul is kept for the process
  dnnl_primitive_desc_t pd = nullptr;
  check(dnnl_reorder_primitive_desc_create(&pd, r.from, c.engine, r.to, c.engine, nullptr), op,
        "reorder primitive desc creation");
  const dnnl_status_t status = dnnl_primitive_create(&r.primitive, pd);
  dnnl_primitive_desc_destroy(pd);
  check(status, op, "reorder primitive creation");
  return c.reorders.emplace(key, r).first->second;
}

using Arg = std::tuple<int, const_dnnl_memory_desc_t, const void*>;  // (DNNL_ARG_*, layout, data)

// Runs primitive on memory objects wrapping the given buffers.
void execute(dnnl_primitive_t primitive, std::initializer_list<Arg> args, const char* op) {
  Cache& c = cache();
  std::vector<dnnl_exec_arg_t> exec;
  dnnl_status_t status = dnnl_success;
  for (const auto& [index, md, data] : args) {
    dnnl_memory_t memory = nullptr;
    status = dnnl_memory_create(&memory, md, c.engine, const_cast<void*>(data));
    if (status != dnnl_success) break;
    exec.push_back({index, memory});
  }
  if (status == dnnl_success) {
    status = dnnl_primitive_execute(primitive, c.stream, static_cast<int>(exec.size()), exec.data());
  }
  if (status == dnnl_success) status = dnnl_stream_wait(c.stream);
  for (auto& arg : exec) dnnl_memory_destroy(arg.memory);
  check(status, op, "primitive execution");
}

int64_t layout_bytes(int64_t k, int64_t n, int64_t rows_hint, const char* op) {
  return static_cast<int64_t>(dnnl_memory_desc_get_size(matmul_for(rows_hint, k, n, rows_hint, op)->weights));
}

// (K, N) of w as transpose_w reads it, checked.
std::pair<int64_t, int64_t> weight_dims(const std::vector<int64_t>& shape, bool transpose_w, int64_t rows_hint,
                                        const char* op) {
  PD_CHECK(shape.size() == 2, op, ": weight must be 2-D, got ", shape_str(shape));
  const int64_t k = transpose_w ? shape[1] : shape[0], n = transpose_w ? shape[0] : shape[1];
  PD_CHECK(k > 0 && n > 0 && rows_hint > 0, op, ": weight ", shape_str(shape), " and rows_hint ", rows_hint,
           " must be positive");
  return {k, n};
}

std::vector<paddle::Tensor> PrepackBf16(const paddle::Tensor& w_in, bool transpose_w, int64_t rows_hint) {
  const char* op = "grpo_prepack_bf16";
  grpo::check_bf16_input(w_in, op, "weight", true);
  const auto [k, n] = weight_dims(w_in.shape(), transpose_w, rows_hint, op);
  const auto wb = grpo::as_bf16(w_in);  // (K, N) or (N, K), dense
  const Reorder& reorder = reorder_for(k, n, rows_hint, transpose_w, op);
  const int64_t bytes = static_cast<int64_t>(dnnl_memory_desc_get_size(reorder.to));
  auto packed = paddle::empty({kHeaderBytes + bytes}, kU8, w_in.place());
  auto* data = packed.data<uint8_t>();
  Header header{};
  std::memcpy(header.magic, kMagic, sizeof kMagic);
  header.k = k, header.n = n, header.rows_hint = rows_hint, header.layout_bytes = bytes;
  std::memset(data, 0, kHeaderBytes);
  std::memcpy(data, &header, sizeof header);
  execute(reorder.primitive, {{DNNL_ARG_SRC, reorder.from, wb.data()}, {DNNL_ARG_DST, reorder.to, data + kHeaderBytes}},
          op);
  return {packed};
}

std::vector<paddle::Tensor> PrepackedMatmul(const paddle::Tensor& x_in, const paddle::Tensor& packed_in, int64_t k,
                                            int64_t n, int64_t rows_hint) {
  const char* op = "grpo_prepacked_matmul";
  grpo::check_bf16_input(x_in, op, "x", true);
  PD_CHECK(k > 0 && n > 0 && rows_hint > 0, op, ": k, n and rows_hint must be positive, got ", k, ", ", n, ", ",
           rows_hint);
  PD_CHECK(!x_in.shape().empty() && x_in.shape().back() == k, op, ": x must be [..., ", k, "], got ",
           shape_str(x_in.shape()));
  PD_CHECK(packed_in.is_cpu() && packed_in.dtype() == kU8 && packed_in.shape().size() == 1 &&
               packed_in.numel() >= kHeaderBytes,
           op, ": packed must be a 1-D uint8 CPU tensor from grpo_prepack_bf16, got ",
           phi::DataTypeToString(packed_in.dtype()), " ", shape_str(packed_in.shape()));
  const auto packed = grpo::dense(packed_in);
  Header header;
  std::memcpy(&header, packed.data<uint8_t>(), sizeof header);
  PD_CHECK(std::memcmp(header.magic, kMagic, sizeof kMagic) == 0, op,
           ": packed does not start with grpo_prepack_bf16's header: not a packed weight");
  PD_CHECK(header.k == k && header.n == n && header.rows_hint == rows_hint, op, ": packed holds weights packed for ",
           "(k, n) = (", header.k, ", ", header.n, ") with rows_hint ", header.rows_hint, ", not for (", k, ", ", n,
           ") with rows_hint ", rows_hint);
  const int64_t bytes = layout_bytes(k, n, rows_hint, op);
  PD_CHECK(header.layout_bytes == bytes && packed.numel() == kHeaderBytes + bytes, op, ": packed holds ",
           packed.numel() - kHeaderBytes, " bytes of weights (its header says ", header.layout_bytes,
           "), but this machine's layout for (", k, ", ", n, ") with rows_hint ", rows_hint, " has ", bytes,
           ": pack the weights here");
  auto shape = x_in.shape();
  shape.back() = n;
  auto out = paddle::empty(shape, kF32, x_in.place());
  const int64_t m = x_in.numel() / k;
  if (m == 0) return {out};
  const auto xb = grpo::as_bf16(x_in);  // (M, K), dense
  const auto* x_rows = static_cast<const uint16_t*>(xb.data());  // bf16 bits
  for (int64_t row = 0; row < m; row += rows_hint) {  // rows_hint rows at a time: at most rows_hint primitives a shape
    const MatmulPtr mm = matmul_for(std::min(rows_hint, m - row), k, n, rows_hint, op);
    execute(mm->primitive,
            {{DNNL_ARG_SRC, mm->src, x_rows + row * k},
             {DNNL_ARG_WEIGHTS, mm->weights, packed.data<uint8_t>() + kHeaderBytes},
             {DNNL_ARG_DST, mm->dst, out.data<float>() + row * n}},
            op);
  }
  return {out};
}

std::vector<std::vector<int64_t>> PrepackShape(const std::vector<int64_t>& w, bool transpose_w, int64_t rows_hint) {
  const auto [k, n] = weight_dims(w, transpose_w, rows_hint, "grpo_prepack_bf16");
  return {{kHeaderBytes + layout_bytes(k, n, rows_hint, "grpo_prepack_bf16")}};
}
std::vector<paddle::DataType> Uint8(const paddle::DataType&) { return {kU8}; }

std::vector<std::vector<int64_t>> PrepackedMatmulShape(const std::vector<int64_t>& x, const std::vector<int64_t>&,
                                                       int64_t, int64_t n, int64_t) {
  auto shape = x;
  shape.back() = n;
  return {shape};
}
std::vector<paddle::DataType> Float32Of2(const paddle::DataType&, const paddle::DataType&) { return {kF32}; }

}  // namespace

PD_BUILD_OP(grpo_prepack_bf16)
    .Inputs({"W"})
    .Outputs({"Packed"})
    .Attrs({"transpose_w: bool", "rows_hint: int64_t"})
    .SetKernelFn(PD_KERNEL(PrepackBf16))
    .SetInferShapeFn(PD_INFER_SHAPE(PrepackShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(Uint8));

PD_BUILD_OP(grpo_prepacked_matmul)
    .Inputs({"X", "Packed"})
    .Outputs({"Out"})
    .Attrs({"k: int64_t", "n: int64_t", "rows_hint: int64_t"})
    .SetKernelFn(PD_KERNEL(PrepackedMatmul))
    .SetInferShapeFn(PD_INFER_SHAPE(PrepackedMatmulShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(Float32Of2));

#endif  // GRPO_WITH_DNNL
