// Argument checks shared by every entry point. Each returns Ok or an InvalidArgument whose
// message reads "<op>: <argument>: expected <x>, got <y>".
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include "mlakit/status.h"
#include "mlakit/tensor.h"

namespace mlakit::detail {

Status invalid(const char* op, const std::string& what);
Status unsupported(const char* op, const std::string& what);

// data != nullptr and 1 <= rank <= kMaxRank, sizes >= 0, strides >= 0.
Status check_tensor_wellformed(const char* op, const char* name, const TensorRef& t);
// A dimension of size 0: nothing is read or written through t, so its pointer and strides
// mean nothing (NumPy gives zero-size arrays all-zero strides) and the stride checks pass it.
bool has_no_elements(const TensorRef& t);
Status check_dtype(const char* op, const char* name, const TensorRef& t,
                   std::initializer_list<DType> allowed);
Status check_same_dtype(const char* op, const char* name, const TensorRef& t,
                        const char* other_name, DType other);
Status check_rank(const char* op, const char* name, const TensorRef& t, int rank);
// t.shape[axis] == expected; `dim_name` names the dimension in the message ("b", "d_qk").
Status check_dim(const char* op, const char* name, const TensorRef& t, int axis,
                 const char* dim_name, int64_t expected);
// t.shape[axis] as an int, for the dimensions the kernels index with 32-bit integers; sizes
// are 64-bit in the API, so a larger one is "<name>.shape[<axis>] (<dim_name>): dimension too
// large: expected <= 2^31 - 1, got <n>", never silently truncated.
Status int_dim(const char* op, const char* name, const TensorRef& t, int axis, const char* dim_name, int* value);
// A paged cache [num_blocks, page_size, ...]: 1 <= page_size <= 2^30 and num_blocks <= 2^31 - 1
// (int32 block ids and slots), so block * page_size + offset never overflows.
Status check_paged_cache_dims(const char* op, const char* name, const TensorRef& cache);
Status check_last_dim_contiguous(const char* op, const char* name, const TensorRef& t);
// The data pointer is `bytes`-aligned and every stride but the last is a multiple of
// bytes / element size, so every row starts `bytes`-aligned (needed by 16-byte copies).
Status check_row_alignment(const char* op, const char* name, const TensorRef& t, int bytes);
// Every element t[i0, ..., i_{rank-1}] for in-range indices lies at an offset
// representable as a signed 64-bit element count (guards against overflowing strides).
Status check_extent_fits(const char* op, const char* name, const TensorRef& t);

// A contiguous rank-1 tensor of `dtype` with `size` elements (dimension named `dim_name`);
// the optional form accepts an empty TensorRef (argument not given).
Status check_vector(const char* op, const char* name, const TensorRef& t, DType dtype, const char* dim_name,
                    int64_t size);
Status check_optional_vector(const char* op, const char* name, const TensorRef& t, DType dtype,
                             const char* dim_name, int64_t size);

// A block table [b, max_blocks_per_seq] of int32, rows contiguous (the width is the
// caller's: each operation bounds it its own way).
Status check_block_table(const char* op, const TensorRef& block_table, int64_t b);

// The topk of an indices tensor [.., .., topk] (last dimension): 1 <= topk <= 2^20.
Status check_topk(const char* op, const TensorRef& indices, int* topk);
// The same for another list of indices: "<name>.shape[i] (<dim_name>): expected 1 <= ...".
Status check_topk(const char* op, const char* name, const char* dim_name, const TensorRef& indices, int* topk);

// A logit scale: unset (the default, 1 / sqrt(d_qk)) or finite. NaN and infinities are
// errors: NaN is no longer a "use the default" sentinel, it would silently poison every row.
Status check_logit_scale(const char* op, const char* name, std::optional<float> scale);
// An output in `dtype`, or also float32 (the CPU references' unrounded results).
Status check_output_dtype(const char* op, const char* name, const TensorRef& t, DType dtype, bool allow_float);

std::string shape_string(const TensorRef& t);

// *product = a * b when it fits in int64, else false (*product unspecified). Sizes from the API
// are unbounded 64-bit values, so a product of them is formed only through this.
bool checked_mul(int64_t a, int64_t b, int64_t* product);

}  // namespace mlakit::detail
