// Hopper thread-block-cluster primitives (PTX ISA 9.7.9.12 mapa, 9.7.9.16 st.async, 9.7.13.15
// mbarrier, 9.7.13.3 barrier.cluster): the rank of a CTA in its cluster, the shared::cluster
// address of a variable in another CTA, 16-byte stores into a peer's shared memory that
// complete on its mbarrier, remote arrivals, cluster-scope waits, and the cluster barrier.
// Addresses are 32-bit shared::cluster ones.
#pragma once

#include <cstdint>

#include "device/sm90/sync.cuh"

namespace mlakit::device::sm90 {

// %cluster_ctarank: this CTA's rank in its cluster.
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}

// mapa.shared::cluster.u32: the address of the same shared-memory offset in CTA `rank`.
__device__ __forceinline__ uint32_t peer_smem_address(const void* local, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_u32(local)), "r"(rank));
  return remote;
}

// st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32: 16 bytes into a peer CTA's
// shared memory (async proxy); when they have landed, 16 transaction bytes complete on the
// peer's barrier `remote_bar`, whose waiters then see them (no proxy fence).
__device__ __forceinline__ void st_async_16(uint32_t remote_dst, uint4 v, uint32_t remote_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(
                   remote_dst),
               "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(remote_bar)
               : "memory");
}

// mbarrier.arrive.release.cluster.shared::cluster.b64: one arrival on a peer CTA's barrier,
// ordering this thread's earlier memory operations before it at cluster scope.
__device__ __forceinline__ void mbarrier_arrive_remote(uint32_t remote_bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote_bar) : "memory");
}

// mbarrier.arrive.expect_tx.shared::cta.b64: one arrival that also makes the current phase
// wait for `bytes` more transaction bytes (a peer's st.async).
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}

// mbarrier.try_wait.parity.acquire.cluster: waits for a phase that arrivals of other CTAs
// complete (release.cluster), so their earlier reads and writes are ordered before ours.
__device__ __forceinline__ void mbarrier_wait_cluster(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  }
}

// barrier.cluster.arrive.release + wait.acquire: every thread of every CTA of the cluster.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

}  // namespace mlakit::device::sm90
