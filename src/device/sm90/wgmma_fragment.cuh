// Where the elements of a wgmma f32 accumulator live (PTX ISA 9.7.15.5.1.1, "Matrix fragments
// for wgmma ... D"): for an m64nNk16 accumulator (N / 2 registers per thread), register i of
// thread t of the warpgroup (warp w = t / 32, lane l = t % 32) holds
//   row    16 w + 8 ((i >> 1) & 1) + l / 4
//   column 8 (i >> 2) + 2 (l % 4) + (i & 1)
// so each thread owns two rows (i's bit 1 picks the lower one) and, per 8-column group i / 4,
// two adjacent columns (bit 0).
#pragma once

#include "device/sm90/warpgroup.cuh"

namespace mlakit::device::sm90 {

// Which of a thread's two rows register i is in (0: the upper, 1: the lower, 8 rows below).
__host__ __device__ __forceinline__ constexpr int acc_row_half(int i) { return (i >> 1) & 1; }

// Row of register i of the accumulator for thread t of the warpgroup (0 .. 127).
__host__ __device__ __forceinline__ constexpr int acc_row(int t, int i) {
  return 16 * (t / kWarpSize) + 8 * acc_row_half(i) + (t % kWarpSize) / 4;
}

// Column of register i for thread t of the warpgroup (only the lane's t % 4 matters, so a lane
// index works too).
__host__ __device__ __forceinline__ constexpr int acc_col(int t, int i) { return 8 * (i >> 2) + 2 * (t % 4) + (i & 1); }

}  // namespace mlakit::device::sm90
