// wgmma (Hopper warpgroup MMA, sm_90a) as used by the MLA decode: SS and RS forms with f32
// accumulators, shared-memory matrix descriptors, fence / commit / wait.
// PTX ISA 9.7.15 "Asynchronous Warpgroup Level Matrix Multiply-Accumulate Instructions".
// Generated operand lists: see the comment of each wrapper for its instruction.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace mlakit::device::sm90 {

// 64-bit shared-memory matrix descriptor for the 128-byte swizzle (PTX ISA 9.7.15.5.1.2.2):
// start address, leading- and stride-dimension byte offsets (all >> 4), swizzle mode 1 at
// bits 62-63, base offset 0 (tiles are 1024-byte aligned).
__device__ __forceinline__ uint64_t make_sw128_desc(uint32_t smem_addr, uint32_t lbo_bytes,
                                                    uint32_t sbo_bytes) {
  uint64_t desc = 0;
  desc |= static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4);
  desc |= static_cast<uint64_t>((lbo_bytes & 0x3FFFF) >> 4) << 16;
  desc |= static_cast<uint64_t>((sbo_bytes & 0x3FFFF) >> 4) << 32;
  desc |= uint64_t{1} << 62;
  return desc;
}

// The same descriptor with its start address moved by `bytes` (a multiple of 16). Shared
// addresses stay below 2^18, so the 14-bit field never carries into its neighbours and the
// move is one 64-bit add: the descriptor of every k-step derives from one base.
__device__ __forceinline__ uint64_t advance_desc(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

// Makes a descriptor opaque to the compiler where it is formed, so the k-step descriptors
// derived from it by advance_desc are computed next to their wgmma instead of being hoisted
// out of the main loop (loop-invariant tiles would otherwise pin ~2 registers per k-step).
__device__ __forceinline__ uint64_t opaque_desc(uint64_t desc) {
  asm volatile("" : "+l"(desc));
  return desc;
}

// wgmma.fence.sync.aligned: orders register accesses before the next wgmma (9.7.15.7.1).
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
// wgmma.commit_group.sync.aligned (9.7.15.7.2).
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// wgmma.wait_group.sync.aligned N: at most N groups still pending (9.7.15.7.3).
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving accumulator reads above a wgmma_wait (it sees no register
// dependence on the wait).
template <int kN>
__device__ __forceinline__ void fence_registers(float (&r)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
// The same for RS A-fragments: keeps them live (unchanged) until the wait that covers their
// wgmma, so the compiler does not hand their registers to other values meanwhile.
template <int kSteps>
__device__ __forceinline__ void fence_registers(uint32_t (&r)[kSteps][4]) {
#pragma unroll
  for (int i = 0; i < kSteps; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
  }
}

// D (64 x 64, f32) (+)= A (64 x 16, shared memory) * B (16 x 64, shared memory):
// wgmma.mma_async.sync.aligned.m64n64k16.f32.<T>.<T> (PTX ISA 9.7.15.5.2), T = bf16 | f16.
// kTransB: 0 = B is K-major, 1 = B is N-major (e.g. V stored [keys][d]).
#define MLAKIT_DEFINE_WGMMA_SS_M64N64K16(NAME, PTX_TYPE)                                              \
  template <int kTransB>                                                                          \
  __device__ __forceinline__ void NAME(float (&d)[32], uint64_t desc_a, uint64_t desc_b, bool accumulate) { \
    asm volatile(                                                                                 \
        "{\n"                                                                                      \
        ".reg .pred p;\n"                                                                          \
        "setp.ne.b32 p, %34, 0;\n"                                                                \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTX_TYPE "." PTX_TYPE " "                     \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, %35;\n" \
        "}\n"                                                                                      \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
        : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)), "n"(kTransB));            \
  }
MLAKIT_DEFINE_WGMMA_SS_M64N64K16(wgmma_ss_m64n64k16_bf16, "bf16")
MLAKIT_DEFINE_WGMMA_SS_M64N64K16(wgmma_ss_m64n64k16_f16, "f16")
#undef MLAKIT_DEFINE_WGMMA_SS_M64N64K16

// D (64 x 64, f32) (+)= A (64 x 16, registers: 4 x 32-bit, docs/hopper.md, wgmma fragments) *
// B (16 x 64, shared memory): the RS form of wgmma.mma_async.m64n64k16 (PTX ISA 9.7.15.5.2).
// kTransB as above (A in registers has no transpose flag).
#define MLAKIT_DEFINE_WGMMA_RS_M64N64K16(NAME, PTX_TYPE)                                              \
  template <int kTransB>                                                                          \
  __device__ __forceinline__ void NAME(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) { \
    asm volatile(                                                                                 \
        "{\n"                                                                                      \
        ".reg .pred p;\n"                                                                          \
        "setp.ne.b32 p, %37, 0;\n"                                                                \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTX_TYPE "." PTX_TYPE " "                     \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n" \
        "}\n"                                                                                      \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)), "n"(kTransB)); \
  }
MLAKIT_DEFINE_WGMMA_RS_M64N64K16(wgmma_rs_m64n64k16_bf16, "bf16")
MLAKIT_DEFINE_WGMMA_RS_M64N64K16(wgmma_rs_m64n64k16_f16, "f16")
#undef MLAKIT_DEFINE_WGMMA_RS_M64N64K16

// D (64 x 256, f32) (+)= A (64 x 16, shared memory) * B (16 x 256, shared memory):
// wgmma.mma_async.sync.aligned.m64n256k16.f32.<T>.<T> (PTX ISA 9.7.15.5.2), T = bf16 | f16.
// kTransB: 0 = B is K-major, 1 = B is N-major (e.g. V stored [keys][d]).
#define MLAKIT_DEFINE_WGMMA_SS_M64N256K16(NAME, PTX_TYPE)                                              \
  template <int kTransB>                                                                          \
  __device__ __forceinline__ void NAME(float (&d)[128], uint64_t desc_a, uint64_t desc_b, bool accumulate) { \
    asm volatile(                                                                                 \
        "{\n"                                                                                      \
        ".reg .pred p;\n"                                                                          \
        "setp.ne.b32 p, %130, 0;\n"                                                                \
        "wgmma.mma_async.sync.aligned.m64n256k16.f32." PTX_TYPE "." PTX_TYPE " "                     \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, %131;\n" \
        "}\n"                                                                                      \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127]) \
        : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)), "n"(kTransB));            \
  }
MLAKIT_DEFINE_WGMMA_SS_M64N256K16(wgmma_ss_m64n256k16_bf16, "bf16")
MLAKIT_DEFINE_WGMMA_SS_M64N256K16(wgmma_ss_m64n256k16_f16, "f16")
#undef MLAKIT_DEFINE_WGMMA_SS_M64N256K16

// D (64 x 256, f32) (+)= A (64 x 16, registers: 4 x 32-bit, docs/hopper.md, wgmma fragments) *
// B (16 x 256, shared memory): the RS form of wgmma.mma_async.m64n256k16 (PTX ISA 9.7.15.5.2).
// kTransB as above (A in registers has no transpose flag).
#define MLAKIT_DEFINE_WGMMA_RS_M64N256K16(NAME, PTX_TYPE)                                              \
  template <int kTransB>                                                                          \
  __device__ __forceinline__ void NAME(float (&d)[128], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) { \
    asm volatile(                                                                                 \
        "{\n"                                                                                      \
        ".reg .pred p;\n"                                                                          \
        "setp.ne.b32 p, %133, 0;\n"                                                                \
        "wgmma.mma_async.sync.aligned.m64n256k16.f32." PTX_TYPE "." PTX_TYPE " "                     \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, %134;\n" \
        "}\n"                                                                                      \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127]) \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)), "n"(kTransB)); \
  }
MLAKIT_DEFINE_WGMMA_RS_M64N256K16(wgmma_rs_m64n256k16_bf16, "bf16")
MLAKIT_DEFINE_WGMMA_RS_M64N256K16(wgmma_rs_m64n256k16_f16, "f16")
#undef MLAKIT_DEFINE_WGMMA_RS_M64N256K16

// Dtype dispatch for the kernels' templates: Wgmma<N, Elem>::ss<kTransB>(d, desc_a, desc_b,
// accumulate) and ::rs<kTransB>(d, a_regs, desc_b, accumulate).
template <int kN, typename Elem>
struct Wgmma;
#define MLAKIT_WGMMA_DISPATCH(N, ELEM, SUFFIX)                                                              \
  template <>                                                                                               \
  struct Wgmma<N, ELEM> {                                                                                   \
    template <int kTransB>                                                                                  \
    static __device__ __forceinline__ void ss(float (&d)[N / 2], uint64_t a, uint64_t b, bool acc) {        \
      wgmma_ss_m64n##N##k16_##SUFFIX<kTransB>(d, a, b, acc);                                                \
    }                                                                                                       \
    template <int kTransB>                                                                                  \
    static __device__ __forceinline__ void rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b, bool acc) { \
      wgmma_rs_m64n##N##k16_##SUFFIX<kTransB>(d, a, b, acc);                                                \
    }                                                                                                       \
  };
MLAKIT_WGMMA_DISPATCH(64, __nv_bfloat16, bf16)
MLAKIT_WGMMA_DISPATCH(64, __half, f16)
MLAKIT_WGMMA_DISPATCH(256, __nv_bfloat16, bf16)
MLAKIT_WGMMA_DISPATCH(256, __half, f16)
#undef MLAKIT_WGMMA_DISPATCH

}  // namespace mlakit::device::sm90
