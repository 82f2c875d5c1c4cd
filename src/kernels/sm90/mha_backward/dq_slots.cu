// The Hopper MHA backward's dq_accum in query-tile slots (common/mha_backward_tiling.h),
// converted into dq after the main kernel (the portable row kernel zeroes them before it).
//   convert: dq[t, h, :] = dq_accum[slot of t's tile][h] (fragment order, two parts of d_qk / 2
//            columns: mha_backward_dq_part_column) * softmax_scale, in q's dtype, for the rows
//            inside a sequence.
// Memory-bound and small beside the main kernel (each slot is read once).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/mha_backward_tiling.h"
#include "device/numeric.cuh"
#include "device/sm90/wgmma_fragment.cuh"
#include "kernels/sm90/launch.h"

namespace mlakit::detail {
namespace {

namespace dev = mlakit::device::sm90;

constexpr int kRows = kMhaBackwardSm90QueryRows;      // query rows per slot
constexpr int kThreads = 2 * dev::kWarpgroupThreads;  // one warpgroup's fragments per part
constexpr int64_t kMaxBlocksX = 65535;                // blocks per sequence; the rest is walked by them

// Grid (tiles of max_seqlen_q x h_q, walked; b). Block: thread t of part g = t / 128 reads its
// fragments' float2 pairs as the main kernel's consumer g staged them (coalesced), scales and
// converts them into the tile's [64][d_qk] rows in shared memory, and the block then writes
// whole rows: 16-byte stores where dq's rows allow them, 4-byte ones otherwise (a warp's
// 4-byte stores straight from the fragments wrote 16 bytes of each of 8 rows: 434 us at b4
// h32 s4096 d 128, against cuDNN's 143 for its conversion). Rows are padded by 16 bytes: the
// 8 rows of a warp's fragment stores then fall in distinct banks.
template <typename Elem, int kDqk>
__global__ void __launch_bounds__(kThreads) mha_backward_sm90_dq_convert_kernel(const __grid_constant__ MhaBackwardParams p) {
  using Ops = device::ElemOps<Elem>;
  constexpr int kPartCols = kDqk / 2;
  constexpr int kRowElems = kDqk + 16 / static_cast<int>(sizeof(Elem));
  constexpr int kRowChunks = kDqk * static_cast<int>(sizeof(Elem)) / 16;  // 16-byte pieces of a row
  constexpr int kRowWords = kDqk / 2;                                      // 4-byte pieces
  __shared__ alignas(16) Elem tile[kRows * kRowElems];
  const int sequence = static_cast<int>(blockIdx.y);
  const int64_t first = p.cu_seqlens_q[sequence];
  // Rows clipped to the tensor, as the main kernel's walk does (a prefix sum past it breaks
  // the data rules and must not send a read or write outside the buffers).
  const int64_t length = p.cu_seqlens_q[sequence + 1] - first;
  const int64_t rows = length < p.total_q - first ? length : p.total_q - first;
  if (first < 0 || rows <= 0) return;
  const int part = static_cast<int>(threadIdx.x) / dev::kWarpgroupThreads;
  const int t = static_cast<int>(threadIdx.x) % dev::kWarpgroupThreads;
  const bool rows16 = reinterpret_cast<uintptr_t>(p.dq) % 16 == 0 && p.dq_stride_t % (16 / sizeof(Elem)) == 0 &&
                      p.dq_stride_h % (16 / sizeof(Elem)) == 0;
  const int64_t tiles = (rows + kRows - 1) / kRows;
  for (int64_t work = blockIdx.x; work < tiles * p.h_q; work += gridDim.x) {
    const int64_t tile_index = work / p.h_q;
    const int head = static_cast<int>(work % p.h_q);
    const int64_t slot = mha_backward_dq_slot(first, sequence, tile_index);
    if (slot >= p.dq_slots) return;  // only with prefix sums past the data rules
    const auto* acc = reinterpret_cast<const float2*>(p.dq_accum + mha_backward_dq_block(slot, head, p.h_q, p.d_qk) +
                                                      part * kRows * kPartCols);
#pragma unroll
    for (int i = 0; i < kPartCols / 2; i += 2) {
      const float2 x = acc[(i / 2) * dev::kWarpgroupThreads + t];
      const int col = mha_backward_dq_part_column(kDqk, part, dev::acc_col(t, i));
      *reinterpret_cast<uint32_t*>(&tile[dev::acc_row(t, i) * kRowElems + col]) =
          Ops::pack(x.x * p.softmax_scale, x.y * p.softmax_scale);
    }
    __syncthreads();
    const int64_t row0 = tile_index * kRows;
    const int valid = static_cast<int>(rows - row0 < kRows ? rows - row0 : kRows);
    Elem* dq = static_cast<Elem*>(p.dq) + (first + row0) * p.dq_stride_t + head * p.dq_stride_h;
    if (rows16) {
      for (int c = static_cast<int>(threadIdx.x); c < valid * kRowChunks; c += kThreads) {
        const int r = c / kRowChunks, k = c % kRowChunks;
        *reinterpret_cast<uint4*>(dq + r * p.dq_stride_t + k * (16 / sizeof(Elem))) =
            *reinterpret_cast<const uint4*>(&tile[r * kRowElems + k * (16 / sizeof(Elem))]);
      }
    } else {
      for (int c = static_cast<int>(threadIdx.x); c < valid * kRowWords; c += kThreads) {
        const int r = c / kRowWords, k = c % kRowWords;
        *reinterpret_cast<uint32_t*>(dq + r * p.dq_stride_t + 2 * k) =
            *reinterpret_cast<const uint32_t*>(&tile[r * kRowElems + 2 * k]);
      }
    }
    __syncthreads();  // the tile read before the next work's fragments overwrite it
  }
}

}  // namespace

template <typename Elem>
cudaError_t launch_mha_backward_sm90_dq_convert(const MhaBackwardParams& p, cudaStream_t stream) {
  if (p.dq_slots == 0 || p.h_q == 0 || p.b == 0) return cudaSuccess;  // no dq row
  const int64_t work = (int64_t{p.max_seqlen_q} + kRows - 1) / kRows * p.h_q;
  const dim3 grid(static_cast<unsigned>(std::clamp<int64_t>(work, 1, kMaxBlocksX)), static_cast<unsigned>(p.b));
  if (p.d_qk == 64) {
    mha_backward_sm90_dq_convert_kernel<Elem, 64><<<grid, kThreads, 0, stream>>>(p);
  } else if (p.d_qk == 128) {
    mha_backward_sm90_dq_convert_kernel<Elem, 128><<<grid, kThreads, 0, stream>>>(p);
  } else if (p.d_qk == 192) {
    mha_backward_sm90_dq_convert_kernel<Elem, 192><<<grid, kThreads, 0, stream>>>(p);
  } else {
    return cudaErrorInvalidValue;  // mha_backward_hopper_dims rules the rest out
  }
  return cudaGetLastError();
}

template cudaError_t launch_mha_backward_sm90_dq_convert<__nv_bfloat16>(const MhaBackwardParams&, cudaStream_t);
template cudaError_t launch_mha_backward_sm90_dq_convert<__half>(const MhaBackwardParams&, cudaStream_t);

}  // namespace mlakit::detail
