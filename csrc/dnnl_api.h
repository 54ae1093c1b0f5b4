// The part of oneDNN's C API that grpo_dnnl_matmul.cc calls, declared by hand: paddle ships libdnnl.so.3 but only
// wrapper headers (its dnnl.h includes oneapi/dnnl/dnnl.h, which the wheel lacks).
//
// Signatures and values are copied from include/oneapi/dnnl/dnnl.h, dnnl_types.h and dnnl_common_types.h of oneDNN
// v3.6.2 at commit 28d696724426b943e2f4a0e607f90cdc19aedaf6, the build paddle 3.3's libdnnl.so.3 reports. The C API
// keeps them within a major version; grpo_dnnl_matmul.cc refuses a library whose dnnl_version() is not 3.x. The
// enums name only the values used here, over int (the C enums' size), so any status the library returns is valid.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

struct dnnl_engine;
struct dnnl_stream;
struct dnnl_memory_desc;
struct dnnl_memory;
struct dnnl_primitive_desc;
struct dnnl_primitive_attr;
struct dnnl_primitive;
typedef struct dnnl_engine* dnnl_engine_t;
typedef struct dnnl_stream* dnnl_stream_t;
typedef struct dnnl_memory_desc* dnnl_memory_desc_t;
typedef const struct dnnl_memory_desc* const_dnnl_memory_desc_t;
typedef struct dnnl_memory* dnnl_memory_t;
typedef struct dnnl_primitive_desc* dnnl_primitive_desc_t;
typedef const struct dnnl_primitive_desc* const_dnnl_primitive_desc_t;
typedef const struct dnnl_primitive_attr* const_dnnl_primitive_attr_t;
typedef struct dnnl_primitive* dnnl_primitive_t;
typedef const struct dnnl_primitive* const_dnnl_primitive_t;

typedef int64_t dnnl_dim_t;
typedef dnnl_dim_t dnnl_dims_t[12];  // DNNL_MAX_NDIMS

enum dnnl_status_t : int { dnnl_success = 0 };
enum dnnl_data_type_t : int { dnnl_bf16 = 2, dnnl_f32 = 3 };
enum dnnl_format_tag_t : int { dnnl_format_tag_any = 1 };
enum dnnl_engine_kind_t : int { dnnl_cpu = 1 };
enum dnnl_stream_flags_t : unsigned { dnnl_stream_default_flags = 0x1U };  // dnnl_stream_in_order
enum dnnl_query_t : int { dnnl_query_weights_md = 131 };

// Execution argument indices (DNNL_ARG_*); a reorder's source and destination are DNNL_ARG_FROM = SRC, TO = DST.
constexpr int DNNL_ARG_SRC = 1;
constexpr int DNNL_ARG_DST = 17;
constexpr int DNNL_ARG_WEIGHTS = 33;

typedef struct {
  int arg;
  dnnl_memory_t memory;
} dnnl_exec_arg_t;

typedef struct {
  int major;
  int minor;
  int patch;
  const char* hash;
  unsigned cpu_runtime;
  unsigned gpu_runtime;
} dnnl_version_t;

const dnnl_version_t* dnnl_version(void);

dnnl_status_t dnnl_engine_create(dnnl_engine_t* engine, dnnl_engine_kind_t kind, size_t index);
dnnl_status_t dnnl_stream_create(dnnl_stream_t* stream, dnnl_engine_t engine, unsigned flags);
dnnl_status_t dnnl_stream_wait(dnnl_stream_t stream);

dnnl_status_t dnnl_memory_desc_create_with_strides(dnnl_memory_desc_t* memory_desc, int ndims, const dnnl_dims_t dims,
                                                   dnnl_data_type_t data_type, const dnnl_dims_t strides);
dnnl_status_t dnnl_memory_desc_create_with_tag(dnnl_memory_desc_t* memory_desc, int ndims, const dnnl_dims_t dims,
                                               dnnl_data_type_t data_type, dnnl_format_tag_t tag);
dnnl_status_t dnnl_memory_desc_clone(dnnl_memory_desc_t* memory_desc, const_dnnl_memory_desc_t existing_memory_desc);
dnnl_status_t dnnl_memory_desc_destroy(dnnl_memory_desc_t memory_desc);
size_t dnnl_memory_desc_get_size(const_dnnl_memory_desc_t memory_desc);
int dnnl_memory_desc_equal(const_dnnl_memory_desc_t lhs, const_dnnl_memory_desc_t rhs);

dnnl_status_t dnnl_matmul_primitive_desc_create(dnnl_primitive_desc_t* primitive_desc, dnnl_engine_t engine,
                                                const_dnnl_memory_desc_t src_desc,
                                                const_dnnl_memory_desc_t weights_desc,
                                                const_dnnl_memory_desc_t bias_desc, const_dnnl_memory_desc_t dst_desc,
                                                const_dnnl_primitive_attr_t attr);
dnnl_status_t dnnl_reorder_primitive_desc_create(dnnl_primitive_desc_t* reorder_primitive_desc,
                                                 const_dnnl_memory_desc_t src_desc, dnnl_engine_t src_engine,
                                                 const_dnnl_memory_desc_t dst_desc, dnnl_engine_t dst_engine,
                                                 const_dnnl_primitive_attr_t attr);
const_dnnl_memory_desc_t dnnl_primitive_desc_query_md(const_dnnl_primitive_desc_t primitive_desc, dnnl_query_t what,
                                                      int index);
dnnl_status_t dnnl_primitive_desc_destroy(dnnl_primitive_desc_t primitive_desc);

dnnl_status_t dnnl_primitive_create(dnnl_primitive_t* primitive, const_dnnl_primitive_desc_t primitive_desc);
dnnl_status_t dnnl_primitive_destroy(dnnl_primitive_t primitive);
dnnl_status_t dnnl_primitive_execute(const_dnnl_primitive_t primitive, dnnl_stream_t stream, int nargs,
                                     const dnnl_exec_arg_t* args);

dnnl_status_t dnnl_memory_create(dnnl_memory_t* memory, const_dnnl_memory_desc_t memory_desc, dnnl_engine_t engine,
                                 void* handle);
dnnl_status_t dnnl_memory_destroy(dnnl_memory_t memory);

}  // extern "C"
