// GPU unit tests of the loads and prefetches of src/device/global_load.cuh and st_shared_16
// that the Hopper sparse decode's producer uses: the read-only load returns the data, the
// predicated index load happens only when asked (a null address with the predicate off is
// never read) and gives the fallback otherwise.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "device/global_load.cuh"
#include "device/sm90/sync.cuh"
#include "gpu_test_util.h"

namespace mlakit::testing {
namespace {

// Thread i: the 16-byte load of element i (through shared memory with st_shared_16 and back)
// after prefetching it into L2; the index load of element i when i is even, of null (never
// read) when odd.
__global__ void predicated_loads(const uint4* words, const int32_t* ints, uint4* out_words, int32_t* out_ints) {
  __shared__ uint4 staged[32];
  const int i = threadIdx.x;
  const bool even = i % 2 == 0;
  device::prefetch_l2(words + i);
  const uint4 w = device::load_nc_16(words + i);
  device::sm90::st_shared_16(device::sm90::smem_u32(&staged[i]), w);
  __syncthreads();
  out_words[i] = staged[i];
  out_ints[i] = device::load_s32_or(even ? ints + i : nullptr, even, -7);
}

TEST(GlobalLoad, LoadsReturnDataAndPredicatedIndexLoadReadsOnlyWhenAsked) {
  MLAKIT_SKIP_WITHOUT_GPU();
  std::vector<uint32_t> words(32 * 4);
  std::vector<int32_t> ints(32);
  for (int i = 0; i < 32; ++i) {
    for (int j = 0; j < 4; ++j) words[4 * i + j] = 0x01010101u * static_cast<uint32_t>(i + 1) + j;
    ints[i] = 1000 + i;
  }
  DeviceBuffer d_words(words), d_ints(ints);
  DeviceBuffer out_words(32 * 16), out_ints(32 * 4);
  predicated_loads<<<1, 32>>>(static_cast<const uint4*>(d_words.get()), static_cast<const int32_t*>(d_ints.get()),
                              static_cast<uint4*>(out_words.get()), static_cast<int32_t*>(out_ints.get()));
  MLAKIT_ASSERT_CUDA(cudaGetLastError());
  MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
  const auto got_words = out_words.download<uint32_t>();
  const auto got_ints = out_ints.download<int32_t>();
  for (int i = 0; i < 32; ++i) {
    const bool even = i % 2 == 0;
    for (int j = 0; j < 4; ++j) EXPECT_EQ(got_words[4 * i + j], words[4 * i + j]) << i << "," << j;
    EXPECT_EQ(got_ints[i], even ? ints[i] : -7) << i;
  }
}

}  // namespace
}  // namespace mlakit::testing
