#include "host/merge_validate.h"

#include <string>
#include <vector>

#include "common/math_constants.h"
#include "host/check.h"
#include "host/output_check.h"

namespace mlakit::detail {
namespace {

static_assert(kMaxMergeStates == kMergeStateCapacity, "the public limit is the kernel parameters' capacity");

std::string indexed(const char* name, int i) { return std::string(name) + "[" + std::to_string(i) + "]"; }

// `t` has the shape and strides of `first` (states are views of one stacked tensor or equally
// allocated buffers: the kernel keeps one set of strides for all of them).
Status check_like_first(const char* op, const std::string& name, const TensorRef& t, const std::string& first_name,
                        const TensorRef& first) {
  if (t.rank != first.rank) {
    return invalid(op, name + ": expected rank " + std::to_string(first.rank) + " (the rank of " + first_name +
                           "), got rank " + std::to_string(t.rank));
  }
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] != first.shape[i]) {
      return invalid(op, name + ".shape[" + std::to_string(i) + "]: expected " + std::to_string(first.shape[i]) +
                             " (the shape of " + first_name + "), got " + std::to_string(t.shape[i]));
    }
  }
  if (has_no_elements(t)) return Status::ok();
  for (int i = 0; i < t.rank; ++i) {
    if (t.stride[i] != first.stride[i] && t.shape[i] > 1) {
      return invalid(op, name + ".stride[" + std::to_string(i) + "]: expected " + std::to_string(first.stride[i]) +
                             " (every state has the strides of " + first_name + "), got " +
                             std::to_string(t.stride[i]));
    }
  }
  return Status::ok();
}

// `t` has the first `dims` sizes of o[0] and rank `dims`: the row shape (an LSE) or o[0]'s
// whole shape (out). `what` names what is expected, for the message.
Status check_shape_of_o(const char* op, const std::string& name, const TensorRef& t, const TensorRef& o0, int dims,
                        const char* what) {
  if (t.rank != dims) {
    return invalid(op, name + ": expected rank " + std::to_string(dims) + " (" + what + " of o[0] " +
                           shape_string(o0) + "), got rank " + std::to_string(t.rank));
  }
  for (int i = 0; i < dims; ++i) {
    if (t.shape[i] != o0.shape[i]) {
      return invalid(op, name + ".shape[" + std::to_string(i) + "]: expected " + std::to_string(o0.shape[i]) +
                             " (o[0].shape[" + std::to_string(i) + "]), got " + std::to_string(t.shape[i]));
    }
  }
  return Status::ok();
}

// Row strides padded to kMergeRowDims (leading dimensions of size 1). A dimension of size 1
// gets stride 0: its index is always 0, and frameworks give such dimensions any stride,
// which would otherwise fail the kernel's alignment test.
void pad_strides(const TensorRef& t, int row_dims, int64_t* out) {
  const int pad = kMergeRowDims - row_dims;
  for (int i = 0; i < kMergeRowDims; ++i) out[i] = i < pad || t.shape[i - pad] == 1 ? 0 : t.stride[i - pad];
}

bool same_view(const TensorRef& a, const TensorRef& b) {
  if (a.data != b.data || a.dtype != b.dtype || a.rank != b.rank) return false;
  for (int i = 0; i < a.rank; ++i) {
    if (a.shape[i] != b.shape[i] || (a.shape[i] > 1 && a.stride[i] != b.stride[i])) return false;
  }
  return true;
}

float base_factor_to_log2(LseBase base) { return base == LseBase::kBase2 ? 1.f : static_cast<float>(kLog2e); }

Status check_base(const char* op, const char* name, LseBase base) {
  if (base == LseBase::kNatural || base == LseBase::kBase2) return Status::ok();
  return invalid(op, std::string(name) + ": expected LseBase::kNatural or LseBase::kBase2, got the value " +
                         std::to_string(static_cast<int>(base)));
}

// Each output is disjoint from every input and the other output, except the one input it is
// exactly (in place: each element is read and then written by the same thread).
Status check_overlaps(const char* op, const MergeStatesArgs& a) {
  std::vector<std::string> names;
  names.reserve(2 * a.num_states);
  std::vector<MemoryRange> o_ranges, lse_ranges;
  for (int i = 0; i < a.num_states; ++i) {
    names.push_back(indexed("o", i));
    o_ranges.push_back(tensor_range(names.back().c_str(), a.o[i]));
    names.push_back(indexed("lse", i));
    lse_ranges.push_back(tensor_range(names.back().c_str(), a.lse[i]));
  }
  const MemoryRange out = tensor_range("out", a.out);
  const MemoryRange out_lse = tensor_range("out_lse", a.out_lse);
  std::vector<MemoryRange> inputs;
  for (int i = 0; i < a.num_states; ++i) {
    if (!same_view(a.out, a.o[i])) inputs.push_back(o_ranges[i]);
  }
  for (const MemoryRange& r : lse_ranges) inputs.push_back(r);
  MLAKIT_RETURN_IF_ERROR(check_disjoint(op, std::span(&out, 1), inputs));
  if (a.out_lse.empty()) return Status::ok();
  inputs.assign(o_ranges.begin(), o_ranges.end());
  inputs.push_back(out);
  for (int i = 0; i < a.num_states; ++i) {
    if (!same_view(a.out_lse, a.lse[i])) inputs.push_back(lse_ranges[i]);
  }
  return check_disjoint(op, std::span(&out_lse, 1), inputs);
}

}  // namespace

Status validate_merge_states(const char* op, const MergeStatesArgs& a, MergeLayout* layout) {
  if (a.num_states < 1 || a.num_states > kMaxMergeStates) {
    return invalid(op, "num_states: expected 1.." + std::to_string(kMaxMergeStates) + " (merge longer lists in " +
                           "groups), got " + std::to_string(a.num_states));
  }
  if (a.o == nullptr) return invalid(op, "o: expected an array of num_states tensors, got null");
  if (a.lse == nullptr) return invalid(op, "lse: expected an array of num_states tensors, got null");
  MLAKIT_RETURN_IF_ERROR(check_base(op, "lse_base", a.lse_base));
  MLAKIT_RETURN_IF_ERROR(check_base(op, "out_lse_base", a.out_lse_base));

  const TensorRef& o0 = a.o[0];
  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "o[0]", o0));
  if (o0.rank < 2 || o0.rank > kMergeRowDims + 1) {
    return invalid(op, "o[0]: expected [rows..., d] with 1 to " + std::to_string(kMergeRowDims) +
                           " row dimensions (rank 2.." + std::to_string(kMergeRowDims + 1) + "), got shape " +
                           shape_string(o0));
  }
  MLAKIT_RETURN_IF_ERROR(check_dtype(op, "o[0]", o0, {DType::kBF16, DType::kFP16, DType::kFP32}));
  MLAKIT_RETURN_IF_ERROR(check_last_dim_contiguous(op, "o[0]", o0));
  const int row_dims = o0.rank - 1;
  const TensorRef& lse0 = a.lse[0];
  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "lse[0]", lse0));
  MLAKIT_RETURN_IF_ERROR(check_dtype(op, "lse[0]", lse0, {DType::kFP32}));
  MLAKIT_RETURN_IF_ERROR(check_shape_of_o(op, "lse[0]", lse0, o0, row_dims, "the row dimensions"));
  for (int i = 1; i < a.num_states; ++i) {
    const std::string o_name = indexed("o", i), lse_name = indexed("lse", i);
    MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, o_name.c_str(), a.o[i]));
    MLAKIT_RETURN_IF_ERROR(check_same_dtype(op, o_name.c_str(), a.o[i], "o[0]", o0.dtype));
    MLAKIT_RETURN_IF_ERROR(check_like_first(op, o_name, a.o[i], "o[0]", o0));
    MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, lse_name.c_str(), a.lse[i]));
    MLAKIT_RETURN_IF_ERROR(check_dtype(op, lse_name.c_str(), a.lse[i], {DType::kFP32}));
    MLAKIT_RETURN_IF_ERROR(check_like_first(op, lse_name, a.lse[i], "lse[0]", lse0));
  }

  if (a.out.empty()) return invalid(op, "out: expected a tensor [rows..., d], got none");
  MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "out", a.out));
  MLAKIT_RETURN_IF_ERROR(check_dtype(op, "out", a.out, {DType::kBF16, DType::kFP16, DType::kFP32}));
  MLAKIT_RETURN_IF_ERROR(check_shape_of_o(op, "out", a.out, o0, o0.rank, "the shape"));
  MLAKIT_RETURN_IF_ERROR(check_last_dim_contiguous(op, "out", a.out));
  MLAKIT_RETURN_IF_ERROR(check_output_layout(op, "out", a.out));
  if (!a.out_lse.empty()) {
    MLAKIT_RETURN_IF_ERROR(check_tensor_wellformed(op, "out_lse", a.out_lse));
    MLAKIT_RETURN_IF_ERROR(check_dtype(op, "out_lse", a.out_lse, {DType::kFP32}));
    MLAKIT_RETURN_IF_ERROR(check_shape_of_o(op, "out_lse", a.out_lse, o0, row_dims, "the row dimensions"));
    MLAKIT_RETURN_IF_ERROR(check_output_layout(op, "out_lse", a.out_lse));
  }
  MLAKIT_RETURN_IF_ERROR(check_overlaps(op, a));

  MergeLayout& l = *layout;
  l = MergeLayout{};
  l.num_states = a.num_states;
  l.d = o0.shape[row_dims];
  const int pad = kMergeRowDims - row_dims;
  for (int i = 0; i < kMergeRowDims; ++i) l.row_shape[i] = i < pad ? 1 : o0.shape[i - pad];
  // Nothing to write (no element of out, no out_lse or none of its elements): rows 0, the
  // call's valid empty result. Otherwise out or out_lse has an address per row (checked
  // above: no broadcast, extent within 2^59 elements), so the product of the row sizes fits.
  const bool nothing_to_write = has_no_elements(a.out) && (a.out_lse.empty() || has_no_elements(a.out_lse));
  l.rows = nothing_to_write ? 0 : l.row_shape[0] * l.row_shape[1] * l.row_shape[2];
  pad_strides(o0, row_dims, l.o_stride);
  pad_strides(lse0, row_dims, l.lse_stride);
  pad_strides(a.out, row_dims, l.out_stride);
  if (!a.out_lse.empty()) pad_strides(a.out_lse, row_dims, l.out_lse_stride);
  l.lse_to_log2 = base_factor_to_log2(a.lse_base);
  l.lse_to_out_base = a.lse_base == a.out_lse_base ? 1.f
                      : a.out_lse_base == LseBase::kBase2 ? static_cast<float>(kLog2e)
                                                        : static_cast<float>(kLn2);
  l.out = a.out.data;
  l.out_lse = static_cast<float*>(a.out_lse.data);
  for (int i = 0; i < a.num_states; ++i) {
    l.o[i] = a.o[i].data;
    l.lse[i] = static_cast<const float*>(a.lse[i].data);
  }
  return Status::ok();
}

}  // namespace mlakit::detail
