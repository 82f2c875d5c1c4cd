// Hopper thread-block-cluster primitives: CTA rank, cluster barrier, the peer's shared memory
// (DSMEM) and shared -> peer-shared bulk copies. One small function per PTX instruction.
// Only bench/cluster_fill_rates.cu uses them (no library kernel runs in clusters), so they
// live here rather than in src/device/sm90/; the namespace is the device layer's, ready for
// the day a kernel needs them.
#pragma once

#include <cstdint>

#include "device/sm90/sync.cuh"

namespace mlakit::device::sm90 {

// %cluster_ctarank: this CTA's rank within its cluster.
__device__ __forceinline__ uint32_t cluster_cta_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}

// barrier.cluster.arrive.release + barrier.cluster.wait.acquire: every thread of every CTA of
// the cluster (all threads must call it). Needed before a CTA touches its peer's shared memory
// or barriers (the peer has started and initialised them) and before it exits (the peer no
// longer sends into it).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// mapa.shared::cluster.u32: the shared::cluster address of the same location (a shared::cta
// address of this CTA) in CTA `rank` of the cluster.
__device__ __forceinline__ uint32_t map_to_cta(uint32_t smem_addr, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_addr), "r"(rank));
  return remote;
}

// mbarrier.arrive.release.cluster.shared::cluster.b64: one arrival on a barrier of another CTA
// of the cluster (`remote_bar` from map_to_cta).
__device__ __forceinline__ void mbarrier_arrive_cluster(uint32_t remote_bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote_bar) : "memory");
}

// mbarrier.arrive.expect_tx.shared::cta.b64: one arrival that also makes the current phase
// wait for `bytes` more transaction bytes (complete_tx from bulk copies, possibly a peer's).
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}

// cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes: `bytes` (multiple of
// 16, 16-byte aligned) of this CTA's shared memory into another CTA's (`remote_dst`, and its
// barrier `remote_bar`, both from map_to_cta); completion is counted on that barrier in bytes.
// The source is read through the async proxy: generic writes to it need fence_proxy_async_smem
// first.
__device__ __forceinline__ void bulk_copy_to_cta(uint32_t remote_dst, uint32_t local_src, uint32_t bytes,
                                                 uint32_t remote_bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          remote_dst),
      "r"(local_src), "r"(bytes), "r"(remote_bar)
      : "memory");
}

// st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32: 16 bytes from registers into
// another CTA's shared memory (`remote_dst`, 16-byte aligned); completion is counted on its
// barrier `remote_bar` in bytes (both from map_to_cta).
__device__ __forceinline__ void st_async_16(uint32_t remote_dst, uint4 v, uint32_t remote_bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(
          remote_dst),
      "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(remote_bar)
      : "memory");
}

}  // namespace mlakit::device::sm90
