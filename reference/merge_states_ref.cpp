// float64 reference of merge_states (include/mlakit/merge.h) on host memory.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/math_constants.h"
#include "host/merge_validate.h"
#include "mlakit/merge.h"
#include "reference/host_numeric.h"

namespace mlakit::reference {
namespace {

using detail::MergeLayout;

double load_value(const void* base, int64_t index, DType dtype) {
  if (dtype == DType::kFP32) return host::load_as<float>(base, index);
  return host::load_half(base, index, dtype);
}

// Element offset of row (i0, i1, i2) under padded strides.
int64_t row_offset(const int64_t* stride, int64_t i0, int64_t i1, int64_t i2) {
  return i0 * stride[0] + i1 * stride[1] + i2 * stride[2];
}

}  // namespace

Status merge_states(const MergeStatesArgs& args) {
  constexpr const char* kOp = "reference::merge_states";
  MergeLayout l;
  MLAKIT_RETURN_IF_ERROR(detail::validate_merge_states(kOp, args, &l));
  if (l.rows == 0) return Status::ok();  // nothing to write
  const DType in_dtype = args.o[0].dtype, out_dtype = args.out.dtype;
  // The weights are exp((lse_i - max) * to_natural) in the inputs' base; the merged LSE is
  // formed in that base and then converted, as the GPU does (a lone state keeps its LSE).
  const double to_natural = args.lse_base == LseBase::kBase2 ? detail::kLn2 : 1.0;
  const double to_out_base = args.lse_base == args.out_lse_base   ? 1.0
                             : args.out_lse_base == LseBase::kBase2 ? detail::kLog2e
                                                                  : detail::kLn2;
  const int n = l.num_states;
  std::vector<double> weight(n);
  std::vector<char> used(n);  // a finite LSE: the state is read (an empty one's o never is)
  for (int64_t i0 = 0; i0 < l.row_shape[0]; ++i0) {
    for (int64_t i1 = 0; i1 < l.row_shape[1]; ++i1) {
      for (int64_t i2 = 0; i2 < l.row_shape[2]; ++i2) {
        double max_lse = -std::numeric_limits<double>::infinity();
        bool has_nan = false;
        for (int s = 0; s < n; ++s) {
          const double v = host::load_as<float>(l.lse[s], row_offset(l.lse_stride, i0, i1, i2));
          has_nan |= std::isnan(v);
          if (std::isfinite(v)) max_lse = std::fmax(max_lse, v);
        }
        const bool empty = !has_nan && std::isinf(max_lse);
        double sum = 0.0;
        for (int s = 0; s < n; ++s) {
          const double v = host::load_as<float>(l.lse[s], row_offset(l.lse_stride, i0, i1, i2));
          used[s] = std::isfinite(v);
          weight[s] = used[s] ? std::exp((v - max_lse) * to_natural) : 0.0;
          sum += weight[s];
        }
        const int64_t o_row = row_offset(l.o_stride, i0, i1, i2);
        const int64_t out_row = row_offset(l.out_stride, i0, i1, i2);
        // Each element is read from every state before it is written: out may be one of them.
        for (int64_t j = 0; j < l.d; ++j) {
          double acc = 0.0;
          if (has_nan) {
            acc = std::numeric_limits<double>::quiet_NaN();
          } else if (!empty) {
            for (int s = 0; s < n; ++s) {
              if (used[s]) acc += weight[s] * load_value(l.o[s], o_row + j, in_dtype);
            }
            acc /= sum;
          }
          host::store_result(l.out, out_row + j, out_dtype, static_cast<float>(acc));
        }
        if (l.out_lse != nullptr) {
          const double lse = has_nan ? std::numeric_limits<double>::quiet_NaN()
                             : empty ? std::numeric_limits<double>::infinity()
                                     : (max_lse + std::log(sum) / to_natural) * to_out_base;
          host::store_as<float>(l.out_lse, row_offset(l.out_lse_stride, i0, i1, i2), static_cast<float>(lse));
        }
      }
    }
  }
  return Status::ok();
}

}  // namespace mlakit::reference
