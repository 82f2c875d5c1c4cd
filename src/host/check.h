// Argument checks shared by every entry point. Each returns Ok or an InvalidArgument whose
// message reads "<op>: <argument>: expected <x>, got <y>".
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "mlakit/status.h"
#include "mlakit/tensor.h"

namespace mlakit::detail {

Status invalid(const char* op, const std::string& what);
Status unsupported(const char* op, const std::string& what);

// data != nullptr and 1 <= rank <= kMaxRank, sizes >= 0, strides >= 0.
Status check_tensor_wellformed(const char* op, const char* name, const TensorRef& t);
Status check_dtype(const char* op, const char* name, const TensorRef& t,
                   std::initializer_list<DType> allowed);
Status check_same_dtype(const char* op, const char* name, const TensorRef& t,
                        const char* other_name, DType other);
Status check_rank(const char* op, const char* name, const TensorRef& t, int rank);
// t.shape[axis] == expected; `dim_name` names the dimension in the message ("b", "d_qk").
Status check_dim(const char* op, const char* name, const TensorRef& t, int axis,
                 const char* dim_name, int64_t expected);
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

// The topk of an indices tensor [.., .., topk] (last dimension): 1 <= topk <= 2^20.
Status check_topk(const char* op, const TensorRef& indices, int* topk);

// A logit scale: finite, or NaN for "the default" (kDefaultSoftmaxScale).
Status check_logit_scale(const char* op, const char* name, float scale);
// An output in `dtype`, or also float32 (the CPU references' unrounded results).
Status check_output_dtype(const char* op, const char* name, const TensorRef& t, DType dtype, bool allow_float);

std::string shape_string(const TensorRef& t);

}  // namespace mlakit::detail
