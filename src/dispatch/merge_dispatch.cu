#include "dispatch/merge_dispatch.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "dispatch/cuda_status.h"
#include "kernels/merge/merge_states_launch.h"

namespace mlakit::detail {
namespace {

// Every row of `data` (under `stride`, padded row dimensions) starts a multiple of `vec`
// elements past an address aligned to `align` bytes (a chunk's bytes, up to 16).
bool rows_aligned(const void* data, const int64_t* stride, int64_t vec, int64_t align) {
  if (reinterpret_cast<std::uintptr_t>(data) % static_cast<std::uintptr_t>(align) != 0) return false;
  for (int i = 0; i < kMergeRowDims; ++i) {
    if (stride[i] % vec != 0) return false;
  }
  return true;
}

template <typename In, typename Out>
Status launch(const char* op, const MergeLayout& l, int sm_count, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(In);
  constexpr int64_t kOutAlign = kVec * sizeof(Out) < 16 ? kVec * sizeof(Out) : 16;
  bool vector = l.d % kVec == 0 && rows_aligned(l.out, l.out_stride, kVec, kOutAlign);
  for (int s = 0; vector && s < l.num_states; ++s) vector = rows_aligned(l.o[s], l.o_stride, kVec, 16);
  return cuda_status(op, vector ? launch_merge_states<In, Out, kVec>(l, sm_count, stream)
                                : launch_merge_states<In, Out, 1>(l, sm_count, stream));
}

template <typename In>
Status launch_to(const char* op, const MergeLayout& l, DType out, int sm_count, cudaStream_t stream) {
  switch (out) {
    case DType::kBF16: return launch<In, __nv_bfloat16>(op, l, sm_count, stream);
    case DType::kFP16: return launch<In, __half>(op, l, sm_count, stream);
    default: return launch<In, float>(op, l, sm_count, stream);  // validated: float32
  }
}

}  // namespace

Status dispatch_merge_states(const char* op, const MergeLayout& l, DType in, DType out, int sm_count,
                             cudaStream_t stream) {
  switch (in) {
    case DType::kBF16: return launch_to<__nv_bfloat16>(op, l, out, sm_count, stream);
    case DType::kFP16: return launch_to<__half>(op, l, out, sm_count, stream);
    default: return launch_to<float>(op, l, out, sm_count, stream);  // validated: float32
  }
}

}  // namespace mlakit::detail
