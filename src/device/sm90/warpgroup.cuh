// Thread counts of a warp and of a Hopper warpgroup (the 4 consecutive warps, 128 threads,
// that issue one wgmma together: PTX ISA 9.7.15.1), for index arithmetic that says which unit
// it divides by.
#pragma once

namespace mlakit::device::sm90 {

inline constexpr int kWarpSize = 32;
inline constexpr int kWarpsPerWarpgroup = 4;
inline constexpr int kWarpgroupThreads = kWarpsPerWarpgroup * kWarpSize;

}  // namespace mlakit::device::sm90
