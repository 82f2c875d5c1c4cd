#include <cudaTypedefs.h>

#include <cstdint>
#include <string>

#include "kernels/sm90/launch.h"

namespace mlakit::detail {
namespace {

constexpr int kTileKeys = 64;
constexpr int kBoxCols = 64;  // 128 bytes of 16-bit values: the 128-byte swizzle span
constexpr int64_t kElemBytes = 2;  // bf16 or fp16 (TmaTensor)

// cuTensorMapEncodeTiled through the runtime's driver entry point (no libcuda link).
PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult result;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &result) !=
            cudaSuccess ||
        result != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      ptr = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

}  // namespace

int sm90_box_rows(int64_t page_size) {
  if (page_size % kTileKeys == 0) return kTileKeys;
  if (page_size == 16 || page_size == 32) return static_cast<int>(page_size);
  return 0;
}

bool encode_tma_4d_map(const TmaTensor& t, const cuuint32_t (&box)[4], const char* what, CUtensorMap* map,
                   std::string* why) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = encode_tiled();
  if (encode == nullptr) {
    *why = "cuTensorMapEncodeTiled is not available from the driver";
    return false;
  }
  const int64_t elem = kElemBytes;
  cuuint64_t dims[4] = {static_cast<cuuint64_t>(t.shape[3]), static_cast<cuuint64_t>(t.shape[2]),
                        static_cast<cuuint64_t>(t.shape[1]), static_cast<cuuint64_t>(t.shape[0])};
  int64_t dense = t.shape[3] * elem;
  cuuint64_t strides[3];
  for (int i = 0; i < 3; ++i) {
    const int axis = 2 - i;
    const int64_t bytes = t.shape[axis] == 1 ? dense : t.stride[axis] * elem;
    strides[i] = static_cast<cuuint64_t>(bytes);
    dense = bytes * t.shape[axis];
  }
  // TMA's own rules, checked here so that the refusal names the tensor and the reason (the
  // encoder answers both with one error code).
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) {
    *why = std::string(what) + ": the Hopper kernel's TMA copies need a 16-byte aligned base address";
    return false;
  }
  for (const cuuint64_t stride : strides) {
    if (stride % 16 != 0) {
      *why = std::string(what) + ": the Hopper kernel's TMA copies need strides aligned to 16 bytes (got " +
             std::to_string(stride) + " bytes)";
      return false;
    }
  }
  cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type =
      t.bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const CUresult r = encode(map, type, 4, t.data, dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    *why = std::string("cuTensorMapEncodeTiled (") + what + ") failed with CUresult " +
           std::to_string(static_cast<int>(r));
    return false;
  }
  return true;
}

bool make_kv_tensor_map(const TmaTensor& kv, int box_rows, CUtensorMap* map, std::string* why) {
  // dims innermost first: d_qk, h_kv, page, num_blocks.
  const cuuint32_t box[4] = {kBoxCols, 1, static_cast<cuuint32_t>(box_rows), 1};
  return encode_tma_4d_map(kv, box, "kv_cache", map, why);
}

bool make_q_tensor_map(const TmaTensor& q, int heads_per_kv, CUtensorMap* map, std::string* why) {
  if (heads_per_kv % kBoxCols != 0 && kBoxCols % heads_per_kv != 0) {
    *why = "heads per kv head " + std::to_string(heads_per_kv) + " neither divides nor is a multiple of 64";
    return false;
  }
  // dims innermost first: d_qk, h_q, s_q, b; a box is one 64-row tile of packed rows.
  const int box_heads = heads_per_kv >= kBoxCols ? kBoxCols : heads_per_kv;
  const cuuint32_t box[4] = {kBoxCols, static_cast<cuuint32_t>(box_heads),
                             static_cast<cuuint32_t>(kTileKeys / box_heads), 1};
  return encode_tma_4d_map(q, box, "q", map, why);
}

bool make_sparse_prefill_q_tensor_map(const TmaTensor& q, CUtensorMap* map, std::string* why) {
  TmaTensor view = q;  // [s_q, h_q, d_qk] -> [s_q, 1, h_q, d_qk]
  view.shape[0] = q.shape[0];
  view.shape[1] = 1;
  view.shape[2] = q.shape[1];
  view.shape[3] = q.shape[2];
  view.stride[0] = q.stride[0];
  view.stride[1] = q.stride[0];  // size 1: never stepped
  view.stride[2] = q.stride[1];
  view.stride[3] = q.stride[2];
  return make_q_tensor_map(view, static_cast<int>(q.shape[1]), map, why);
}

}  // namespace mlakit::detail
