// Memory-system probe (not part of the library or its build): nvcc -O3 -gencode=arch=compute_90a,code=sm_90a
// bench/probes/stream_probe.cu; run on the GPU machine; see docs/history.md (GQA decode).
// Streams a paged-cache-like buffer [tokens][8 heads][256 B] through shared memory, CTA (part, head),
// 128-token tiles, 3 stages, with several copy flavours; prints GB/s per flavour.
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>
constexpr int kHeads = 8, kRow = 256, kTile = 128, kStages = 3, kThreads = 128;
constexpr int kTileBytes = kTile * kRow;
__device__ __forceinline__ uint32_t sa(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
template <int Mode>
__device__ __forceinline__ void copy16(uint32_t dst, const void* src, uint64_t pol) {
  if constexpr (Mode == 0) asm volatile("cp.async.cg.shared.global [%0], [%1], 16, 16;" ::"r"(dst), "l"(src));
  if constexpr (Mode == 1) asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "l"(pol));
  if constexpr (Mode == 2) asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, 16;" ::"r"(dst), "l"(src));
  if constexpr (Mode == 3) asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, 16;" ::"r"(dst), "l"(src));
}
template <int Mode>
__global__ void __launch_bounds__(kThreads) stream(const uint8_t* buf, long tokens, int parts, float* sink) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int part = blockIdx.x, head = blockIdx.y, tid = threadIdx.x;
  const long per = (tokens + parts - 1) / parts, t0 = part * per, t1 = min(tokens, t0 + per);
  const int tiles = (int)((t1 - t0) / kTile);
  uint64_t pol = 0;
  if (Mode == 1) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  auto issue = [&](int t, int st) {
    for (int m = 0; m < kTileBytes / 16 / kThreads; ++m) {
      const int i = tid + m * kThreads, row = i / (kRow / 16), chunk = i % (kRow / 16);
      const uint8_t* src = buf + ((t0 + (long)t * kTile + row) * kHeads + head) * kRow + chunk * 16;
      copy16<Mode>(sa(smem + st * kTileBytes + row * kRow + chunk * 16), src, pol);
    }
  };
  float acc = 0.f;
  for (int s = 0; s < kStages - 1; ++s) { if (s < tiles) issue(s, s); asm volatile("cp.async.commit_group;"); }
  for (int it = 0; it < tiles; ++it) {
    asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 2));
    __syncthreads();
    const int nx = it + kStages - 1;
    if (nx < tiles) issue(nx, nx % kStages);
    asm volatile("cp.async.commit_group;");
    acc += reinterpret_cast<const float*>(smem + (it % kStages) * kTileBytes)[tid * 61 % (kTileBytes / 4)];
  }
  asm volatile("cp.async.wait_group 0;");
  if (acc == 12345.f) sink[0] = acc;
}
// Bulk flavour: one cp.async.bulk per row, lane-issued, mbarrier per stage.
__global__ void __launch_bounds__(kThreads) stream_bulk(const uint8_t* buf, long tokens, int parts, float* sink) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ __align__(8) uint64_t bar[kStages];
  const int part = blockIdx.x, head = blockIdx.y, tid = threadIdx.x;
  const long per = (tokens + parts - 1) / parts, t0 = part * per, t1 = min(tokens, t0 + per);
  const int tiles = (int)((t1 - t0) / kTile);
  if (tid == 0) for (int s = 0; s < kStages; ++s) asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(sa(&bar[s])), "r"(kThreads));
  __syncthreads();
  auto issue = [&](int t, int st) {  // thread tid copies row tid (128 rows per tile)
    const uint8_t* src = buf + ((t0 + (long)t * kTile + tid) * kHeads + head) * kRow;
    asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(sa(&bar[st])), "r"(kRow));
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(sa(smem + st * kTileBytes + tid * kRow)), "l"(src), "r"(kRow), "r"(sa(&bar[st])) : "memory");
  };
  float acc = 0.f;
  for (int s = 0; s < kStages - 1; ++s) if (s < tiles) issue(s, s);
  for (int it = 0; it < tiles; ++it) {
    const int st = it % kStages; const uint32_t parity = (it / kStages) & 1;
    asm volatile("{ .reg .pred p; W: mbarrier.try_wait.parity.shared.b64 p, [%0], %1; @!p bra W; }" ::"r"(sa(&bar[st])), "r"(parity) : "memory");
    __syncthreads();
    const int nx = it + kStages - 1;
    if (nx < tiles) issue(nx, nx % kStages);
    acc += reinterpret_cast<const float*>(smem + st * kTileBytes)[tid * 61 % (kTileBytes / 4)];
  }
  if (acc == 12345.f) sink[0] = acc;
}
static bool g_once = false;
// K and V buffers with 64-token pages in a permuted order, a tile = 64 keys of K and of V.
__global__ void __launch_bounds__(kThreads) stream_kv(const uint8_t* buf, long tokens, int parts, float* sink) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int part = blockIdx.x, head = blockIdx.y, tid = threadIdx.x;
  const long half = tokens / 2;  // K = first half, V = second half of buf
  const uint8_t* kb = buf; const uint8_t* vb = buf + half * kHeads * kRow;
  const long per = (half + parts - 1) / parts, t0 = part * per, t1 = min(half, t0 + per);
  const int tiles = (int)((t1 - t0) / 64);
  const long pages = half / 64;
  auto issue = [&](int t, int st) {
    for (int m = 0; m < 64 * kRow / 16 / kThreads; ++m) {
      const int i = tid + m * kThreads, row = i / (kRow / 16), chunk = i % (kRow / 16);
      const long tok = t0 + (long)t * 64 + row, page = tok / 64, pr = tok % 64;
      const long ppage = (page * 7919) % pages;  // a permutation (7919 prime, coprime with pages)
      const long off = ((ppage * 64 + pr) * kHeads + head) * kRow + chunk * 16;
      const uint32_t d = sa(smem + st * kTileBytes + row * kRow + chunk * 16);
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, 16;" ::"r"(d), "l"(kb + off));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, 16;" ::"r"(d + 64 * kRow), "l"(vb + off));
    }
  };
  float acc = 0.f;
  for (int s = 0; s < kStages - 1; ++s) { if (s < tiles) issue(s, s); asm volatile("cp.async.commit_group;"); }
  for (int it = 0; it < tiles; ++it) {
    asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 2));
    __syncthreads();
    const int nx = it + kStages - 1;
    if (nx < tiles) issue(nx, nx % kStages);
    asm volatile("cp.async.commit_group;");
    acc += reinterpret_cast<const float*>(smem + (it % kStages) * kTileBytes)[tid * 61 % (kTileBytes / 4)];
  }
  asm volatile("cp.async.wait_group 0;");
  if (acc == 12345.f) sink[0] = acc;
}

template <typename K>
void run(const char* name, K kernel, const uint8_t* buf, long tokens, int parts, float* sink) {
  const int smem = kStages * kTileBytes;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  dim3 grid(parts, kHeads);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  for (int w = 0; w < (g_once ? 1 : 3); ++w) kernel<<<grid, kThreads, smem>>>(buf, tokens, parts, sink);
  if (g_once) { cudaDeviceSynchronize(); return; }
  cudaEventRecord(a);
  for (int r = 0; r < 20; ++r) kernel<<<grid, kThreads, smem>>>(buf, tokens, parts, sink);
  cudaEventRecord(b); cudaEventSynchronize(b);
  float ms; cudaEventElapsedTime(&ms, a, b);
  const double bytes = (double)tokens * kHeads * kRow;
  printf("%-14s %8.1f us  %6.0f GB/s  (%s)\n", name, ms * 1000 / 20, bytes / (ms / 20 * 1e-3) / 1e9, cudaGetErrorString(cudaGetLastError()));
}
int main(int argc, char**) {
  g_once = argc > 1;
  const long tokens = 64L * 4096 * 2;  // K and V of the decode case: 1 GiB at 8 heads x 256 B
  uint8_t* buf; float* sink;
  cudaMalloc(&buf, tokens * kHeads * kRow); cudaMalloc(&sink, 4);
  cudaMemset(buf, 1, tokens * kHeads * kRow);
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  for (int per_sm : {2}) {
    const int parts = sms * per_sm / kHeads;
    printf("-- %d CTAs per SM (%d parts)\n", per_sm, parts);
    run("cg", stream<0>, buf, tokens, parts, sink);
    run("cg_evict_first", stream<1>, buf, tokens, parts, sink);
    run("cg_L2_256B", stream<2>, buf, tokens, parts, sink);
    run("cg_L2_128B", stream<3>, buf, tokens, parts, sink);
    run("bulk_rows", stream_bulk, buf, tokens, parts, sink);
    run("kv_paged", stream_kv, buf, tokens, parts, sink);
  }
  return 0;
}
