// Warp-wide loads of 8x8 matrices of 16-bit values from shared memory into the mma.sync
// fragment layout (PTX ISA 9.7.14.5.15, "ldmatrix"). Lane i supplies the address of row i % 8
// of matrix i / 8; each matrix row is 16 contiguous bytes, 16-byte aligned. Register j holds
// matrix j, each lane its (row lane / 4, columns 2 (lane % 4), +1) pair (.trans: the
// transposed matrix's), the lower column in the low half: the A / B fragment maps of
// device/mma_sm80.cuh.
#pragma once

#include <cstdint>

namespace mlakit::device {

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_row_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_row_address));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem_row_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_row_address));
}

}  // namespace mlakit::device
