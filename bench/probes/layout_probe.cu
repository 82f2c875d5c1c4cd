// Memory-system probe (not built with the library): nvcc -O3 -gencode=arch=compute_90a,code=sm_90a bench/probes/layout_probe.cu
// Paged K+V streams of [pages][64][8 heads][Row bytes]: CTAs that read H heads of T tokens per tile (docs/history.md, GQA third round).
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>
constexpr int kHeads = 8, kStages = 3, kThreads = 128;
__device__ __forceinline__ uint32_t sa(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
template <int Row, int H, int T>
__global__ void __launch_bounds__(kThreads) kv(const uint8_t* kb, const uint8_t* vb, long half, int parts, float* sink) {
  constexpr int kTile = 2 * T * H * Row, kChunks = T * H * Row / 16;
  extern __shared__ __align__(128) uint8_t smem[];
  const int part = blockIdx.x, head0 = blockIdx.y * H, tid = threadIdx.x;
  const long per = (half + parts - 1) / parts, t0 = part * per, t1 = min(half, t0 + per);
  const int tiles = (int)((t1 - t0) / T);
  const long pages = half / 64;
  auto issue = [&](int t, int st) {
#pragma unroll
    for (int m = 0; m < kChunks / kThreads; ++m) {
      const int i = tid + m * kThreads, row = i / (H * Row / 16), rest = i % (H * Row / 16);
      const long tok = t0 + (long)t * T + row, page = tok / 64, pr = tok % 64;
      const long ppage = (page * 7919) % pages;
      const long off = ((ppage * 64 + pr) * kHeads + head0) * Row + rest * 16;
      const uint32_t d = sa(smem + st * kTile + i * 16);
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, 16;" ::"r"(d), "l"(kb + off));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, 16;" ::"r"(d + kTile / 2), "l"(vb + off));
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
    acc += reinterpret_cast<const float*>(smem + (it % kStages) * kTile)[tid * 61 % (kTile / 4)];
  }
  asm volatile("cp.async.wait_group 0;");
  if (acc == 12345.f) sink[0] = acc;
}
template <int Row, int H, int T>
void run(const char* name, const uint8_t* k, const uint8_t* v, float* sink, int per_sm) {
  constexpr int smem = kStages * 2 * T * H * Row;
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int parts = sms * per_sm / (kHeads / H);
  const long half = 64L * 4096 * 256 / Row;  // the same bytes whatever the row: 512 MiB per cache
  cudaFuncSetAttribute(kv<Row, H, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  dim3 grid(parts, kHeads / H);
  for (int w = 0; w < 3; ++w) kv<Row, H, T><<<grid, kThreads, smem>>>(k, v, half, parts, sink);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  cudaEventRecord(a);
  for (int r = 0; r < 20; ++r) kv<Row, H, T><<<grid, kThreads, smem>>>(k, v, half, parts, sink);
  cudaEventRecord(b); cudaEventSynchronize(b);
  float ms; cudaEventElapsedTime(&ms, a, b);
  const double bytes = 2.0 * half * kHeads * Row;
  printf("%-28s %d/SM %8.1f us %6.0f GB/s (%s)\n", name, per_sm, ms * 1000 / 20, bytes / (ms / 20 * 1e-3) / 1e9, cudaGetErrorString(cudaGetLastError()));
}
int main() {
  const size_t bytes = 64L * 4096 * 8 * 256;
  uint8_t *k, *v; float* sink;
  cudaMalloc(&k, bytes); cudaMalloc(&v, bytes); cudaMalloc(&sink, 4);
  cudaMemset(k, 1, bytes); cudaMemset(v, 1, bytes);
  for (int per_sm : {2, 3}) {
    run<256, 1, 64>("row256 h1 t64 (bf16 now)", k, v, sink, per_sm);
    run<128, 1, 64>("row128 h1 t64 (int8 now)", k, v, sink, per_sm);
    run<128, 1, 128>("row128 h1 t128", k, v, sink, per_sm);
    run<128, 2, 64>("row128 h2 t64", k, v, sink, per_sm);
    run<128, 8, 16>("row128 h8 t16", k, v, sink, per_sm);
    run<256, 2, 32>("row256 h2 t32", k, v, sink, per_sm);
    run<256, 8, 8>("row256 h8 t8", k, v, sink, per_sm);
  }
  return 0;
}
