#include "host/check.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>

#include "host/device.h"

namespace mlakit::detail {

Status invalid(const char* op, const std::string& what) {
  return Status(StatusCode::kInvalidArgument, std::string(op) + ": " + what);
}

Status unsupported(const char* op, const std::string& what) {
  return Status(StatusCode::kUnsupported, std::string(op) + ": " + what);
}

std::string shape_string(const TensorRef& t) {
  // Called on tensors not yet checked: a rank outside the stored extents prints as such.
  if (t.rank < 0 || t.rank > kMaxRank) return "[rank " + std::to_string(t.rank) + "]";
  std::ostringstream s;
  s << "[";
  for (int i = 0; i < t.rank; ++i) s << (i ? ", " : "") << t.shape[i];
  s << "]";
  return s.str();
}

bool checked_mul(int64_t a, int64_t b, int64_t* product) { return !__builtin_mul_overflow(a, b, product); }

Status check_tensor_wellformed(const char* op, const char* name, const TensorRef& t) {
  if (t.rank < 1 || t.rank > kMaxRank) {
    return invalid(op, std::string(name) + ": expected a tensor of rank 1.." +
                           std::to_string(kMaxRank) + ", got rank " + std::to_string(t.rank) +
                           (t.rank < 0 ? " (shape and stride lists differ in length)" : ""));
  }
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] < 0) {
      return invalid(op, std::string(name) + ".shape[" + std::to_string(i) +
                             "]: expected >= 0, got " + std::to_string(t.shape[i]));
    }
    if (t.stride[i] < 0) {
      return invalid(op, std::string(name) + ".stride[" + std::to_string(i) +
                             "]: expected >= 0 (negative strides are not supported), got " +
                             std::to_string(t.stride[i]));
    }
  }
  bool has_zero_dim = false;
  for (int i = 0; i < t.rank; ++i) has_zero_dim |= t.shape[i] == 0;
  if (t.data == nullptr && !has_zero_dim) {
    return invalid(op, std::string(name) + ": expected a non-null pointer, got null");
  }
  return check_extent_fits(op, name, t);
}

bool has_no_elements(const TensorRef& t) {
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] == 0) return true;
  }
  return false;
}

Status check_dtype(const char* op, const char* name, const TensorRef& t,
                   std::initializer_list<DType> allowed) {
  for (DType d : allowed) {
    if (t.dtype == d) return Status::ok();
  }
  std::string expected;
  for (DType d : allowed) expected += (expected.empty() ? "" : " or ") + std::string(dtype_name(d));
  return invalid(op, std::string(name) + ".dtype: expected " + expected + ", got " +
                         dtype_name(t.dtype));
}

Status check_same_dtype(const char* op, const char* name, const TensorRef& t,
                        const char* other_name, DType other) {
  if (t.dtype == other) return Status::ok();
  return invalid(op, std::string(name) + ".dtype: expected " + dtype_name(other) + " (the dtype of " +
                         other_name + "), got " + dtype_name(t.dtype));
}

Status check_rank(const char* op, const char* name, const TensorRef& t, int rank) {
  if (t.rank == rank) return Status::ok();
  return invalid(op, std::string(name) + ": expected rank " + std::to_string(rank) + ", got rank " +
                         std::to_string(t.rank) + " (shape " + shape_string(t) + ")");
}

Status check_dim(const char* op, const char* name, const TensorRef& t, int axis,
                 const char* dim_name, int64_t expected) {
  if (t.shape[axis] == expected) return Status::ok();
  return invalid(op, std::string(name) + ".shape[" + std::to_string(axis) + "] (" + dim_name +
                         "): expected " + std::to_string(expected) + ", got " +
                         std::to_string(t.shape[axis]));
}

Status int_dim(const char* op, const char* name, const TensorRef& t, int axis, const char* dim_name, int* value) {
  const int64_t n = t.shape[axis];
  if (n > INT32_MAX) {
    return invalid(op, std::string(name) + ".shape[" + std::to_string(axis) + "] (" + dim_name +
                           "): dimension too large: expected <= 2^31 - 1, got " + std::to_string(n));
  }
  *value = static_cast<int>(n);
  return Status::ok();
}

Status check_paged_cache_dims(const char* op, const char* name, const TensorRef& cache) {
  const int64_t page_size = cache.shape[1];
  if (page_size < 1 || page_size > (int64_t{1} << 30)) {
    return invalid(op, std::string(name) + ".shape[1] (page_block_size): expected 1 <= page_block_size <= 2^30, got " +
                           std::to_string(page_size));
  }
  if (cache.shape[0] > INT32_MAX) {
    return invalid(op, std::string(name) + ".shape[0] (num_blocks): expected <= 2^31 - 1 (int32 block ids), got " +
                           std::to_string(cache.shape[0]));
  }
  return Status::ok();
}

Status check_last_dim_contiguous(const char* op, const char* name, const TensorRef& t) {
  int last = t.rank - 1;
  if (t.stride[last] == 1 || t.shape[last] <= 1 || has_no_elements(t)) return Status::ok();
  return invalid(op, std::string(name) + ".stride[" + std::to_string(last) +
                         "]: expected 1 (last dimension contiguous), got " +
                         std::to_string(t.stride[last]));
}

Status check_row_alignment(const char* op, const char* name, const TensorRef& t, int bytes) {
  // An absent optional tensor or one without elements: no row is copied. (An absent
  // TensorRef's dtype is not validated: a caller may leave any value there.)
  if (t.empty() || has_no_elements(t)) return Status::ok();
  auto address = reinterpret_cast<std::uintptr_t>(t.data);
  if (address % bytes != 0) {
    return invalid(op, std::string(name) + ": expected a " + std::to_string(bytes) +
                           "-byte aligned pointer, got an address = " +
                           std::to_string(address % bytes) + " mod " + std::to_string(bytes));
  }
  // Elements per `bytes`; at least 1 (a dtype wider than `bytes`, or one no check has named,
  // whose size is 0: never a division by zero).
  const auto size = static_cast<int64_t>(dtype_size(t.dtype));
  const int64_t elems = size > 0 && size <= bytes ? bytes / size : 1;
  for (int i = 0; i + 1 < t.rank; ++i) {
    if (t.shape[i] > 1 && t.stride[i] % elems != 0) {
      return invalid(op, std::string(name) + ".stride[" + std::to_string(i) +
                             "]: expected a multiple of " + std::to_string(elems) + " elements (" +
                             std::to_string(bytes) + " bytes), got " +
                             std::to_string(t.stride[i]));
    }
  }
  return Status::ok();
}

Status check_vector(const char* op, const char* name, const TensorRef& t, DType dtype, const char* dim_name,
                    int64_t size) {
  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, name, t));
  MLAKIT_RETURN_IF_ERROR(check_dtype(op, name, t, {dtype}));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, name, t, 1));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, name, t, 0, dim_name, size));
  return check_last_dim_contiguous(op, name, t);
}

Status check_block_table(const char* op, const TensorRef& block_table, int64_t b) {
  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "block_table", block_table));
  MLAKIT_RETURN_IF_ERROR(check_dtype(op, "block_table", block_table, {DType::kInt32}));
  MLAKIT_RETURN_IF_ERROR(check_rank(op, "block_table", block_table, 2));
  MLAKIT_RETURN_IF_ERROR(check_dim(op, "block_table", block_table, 0, "b", b));
  return check_last_dim_contiguous(op, "block_table", block_table);
}

Status check_topk(const char* op, const TensorRef& indices, int* topk) {
  return check_topk(op, "indices", "topk", indices, topk);
}

Status check_topk(const char* op, const char* name, const char* dim_name, const TensorRef& indices, int* topk) {
  const int64_t k = indices.shape[indices.rank - 1];
  if (k < 1 || k > (1 << 20)) {
    return invalid(op, std::string(name) + ".shape[" + std::to_string(indices.rank - 1) + "] (" + dim_name +
                           "): expected 1 <= " + dim_name + " <= 2^20, got " + std::to_string(k));
  }
  *topk = static_cast<int>(k);
  return Status::ok();
}

Status check_optional_vector(const char* op, const char* name, const TensorRef& t, DType dtype,
                             const char* dim_name, int64_t size) {
  return t.empty() ? Status::ok() : check_vector(op, name, t, dtype, dim_name, size);
}

Status check_logit_scale(const char* op, const char* name, std::optional<float> scale) {
  if (!scale || std::isfinite(*scale)) return Status::ok();
  return invalid(op, std::string(name) + ": expected a finite value (or unset for 1 / sqrt(d_qk)), got " +
                         std::to_string(*scale));
}

Status check_output_dtype(const char* op, const char* name, const TensorRef& t, DType dtype, bool allow_float) {
  return allow_float ? check_dtype(op, name, t, {dtype, DType::kFP32}) : check_dtype(op, name, t, {dtype});
}

Status check_extent_fits(const char* op, const char* name, const TensorRef& t) {
  // Largest element offset = sum (shape-1)*stride; compute with overflow checks. A tensor
  // without elements spans nothing, whatever its other sizes (and wherever its 0 stands).
  if (has_no_elements(t)) return Status::ok();
  const int64_t limit = std::numeric_limits<int64_t>::max() / 16;
  int64_t extent = 0;
  for (int i = 0; i < t.rank; ++i) {
    int64_t n = t.shape[i] - 1;
    if (n > 0 && t.stride[i] > (limit - extent) / n) {
      return invalid(op, std::string(name) + ": shape " + shape_string(t) +
                             " with its strides spans more than 2^59 elements");
    }
    extent += n * t.stride[i];
  }
  return Status::ok();
}

Status current_device_info(const char* op, DeviceInfo* info) {
  Status s = current_device_info(info);
  if (s.is_ok()) return s;
  return Status(s.code(), std::string(op) + ": " + s.message());
}

Status current_supported_device(const char* op, DeviceInfo* info) {
  MLAKIT_RETURN_IF_ERROR(current_device_info(op, info));
  if (info->cc_major >= 8) return Status::ok();
  return Status(StatusCode::kUnsupportedArchitecture,
                std::string(op) + ": device " + std::to_string(info->ordinal) +
                    ": expected compute capability >= 8.0 (sm80), got " + std::to_string(info->cc_major) + "." +
                    std::to_string(info->cc_minor));
}

}  // namespace mlakit::detail
