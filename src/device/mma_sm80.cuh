// Warp-level tensor-core MMA of sm80+ (the portable kernels' matrix unit) and the fragment
// maps it implies. PTX ISA section 9.7.14.5.8, "Matrix Fragments for mma.m16n8k16 with
// floating point type".
//
// With g = lane / 4 and c = lane % 4:
//   A (16x16, row-major) regs a0..a3: (g, 2c..2c+1), (g+8, 2c..), (g, 2c+8..), (g+8, 2c+8..)
//   B (16x8, k-major per column) regs b0, b1: rows k = 2c..2c+1 and 2c+8..2c+9 of column g
//   C/D (16x8 f32) d0..d3: (g, 2c), (g, 2c+1), (g+8, 2c), (g+8, 2c+1)
// Each 32-bit A/B register holds two 16-bit values, the lower k index in the low half.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace mlakit::device {

struct MmaFragC {
  float d[4];
};

// D += A * B, bf16 inputs, f32 accumulate. mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
__device__ __forceinline__ void mma_m16n8k16(const uint32_t (&a)[4], const uint32_t (&b)[2],
                                             MmaFragC& c, __nv_bfloat16) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c.d[0]), "+f"(c.d[1]), "+f"(c.d[2]), "+f"(c.d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// D += A * B, fp16 inputs, f32 accumulate. mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32
__device__ __forceinline__ void mma_m16n8k16(const uint32_t (&a)[4], const uint32_t (&b)[2],
                                             MmaFragC& c, __half) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c.d[0]), "+f"(c.d[1]), "+f"(c.d[2]), "+f"(c.d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

}  // namespace mlakit::device
