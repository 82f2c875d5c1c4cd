// stmatrix (sm_90): a warp stores 8 x 8 tiles of 16-bit values held in the mma accumulator
// fragment layout to shared memory. PTX ISA 9.7.14.5.16 "stmatrix".
#pragma once

#include <cstdint>

namespace mlakit::device::sm90 {

// stmatrix.sync.aligned.m8n8.x4.shared.b16: four 8 x 8 tiles. Register i of lane t holds row
// t / 4, columns 2 (t % 4) and 2 (t % 4) + 1 of tile i (low half first); lane t gives the
// shared address of row t % 8 of tile t / 8 (16 bytes, 16-byte aligned), so each row may sit
// anywhere (e.g. a swizzled chunk).
__device__ __forceinline__ void stmatrix_x4(uint32_t smem_row_addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                            uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_row_addr), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// stmatrix.sync.aligned.m8n8.x4.trans.shared.b16: the same four tiles, each stored
// transposed: the 16 bytes at lane t's address (row t % 8 of tile t / 8) receive column t % 8
// of that tile (the tile's rows 0..7 in order).
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t smem_row_addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                                  uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_row_addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

}  // namespace mlakit::device::sm90
