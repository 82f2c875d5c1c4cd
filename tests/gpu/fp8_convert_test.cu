// GPU unit test of the device FP8 dequantization (src/device/fp8_convert.cuh) that the Hopper
// sparse decode's producer uses: every e4m3 byte (NaN encodings aside) times scales from the
// subnormal range to large ones must give the bits of the reference's fp8_dequantize.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "common/fp8_cache_row.h"
#include "device/fp8_convert.cuh"
#include "gpu_test_util.h"

namespace mlakit::testing {
namespace {

// out[s][i] = bf16 bits of byte i times scales[s], 8 bytes per thread.
__global__ void dequantize_all_bytes(const float* scales, uint16_t* out) {
  const int s = blockIdx.x, group = threadIdx.x;  // 32 groups of 8 bytes
  uint32_t words[2];
  for (int w = 0; w < 2; ++w) {
    words[w] = 0;
    for (int b = 0; b < 4; ++b) words[w] |= static_cast<uint32_t>(group * 8 + 4 * w + b) << (8 * b);
  }
  const uint4 v = device::dequantize_e4m3x8_bf16(make_uint2(words[0], words[1]), scales[s]);
  const uint32_t packed[4] = {v.x, v.y, v.z, v.w};
  for (int j = 0; j < 8; ++j) {
    out[s * 256 + group * 8 + j] = static_cast<uint16_t>(packed[j / 2] >> (16 * (j % 2)));
  }
}

TEST(Fp8Convert, DequantizeMatchesReferenceBits) {
  MLAKIT_SKIP_WITHOUT_GPU();
  const std::vector<float> scales = {1.0f, 0.0f, 1.0f / 448.0f, 3.7e-5f, 2.5e-8f, 0.013f, 7.25f, 1234.5f, 1e30f};
  DeviceBuffer d_scales(scales), d_out(scales.size() * 256 * 2);
  dequantize_all_bytes<<<static_cast<unsigned>(scales.size()), 32>>>(static_cast<const float*>(d_scales.get()),
                                                                      static_cast<uint16_t*>(d_out.get()));
  MLAKIT_ASSERT_CUDA(cudaGetLastError());
  MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = d_out.download<uint16_t>();
  int checked = 0;
  for (size_t s = 0; s < scales.size(); ++s) {
    for (int byte = 0; byte < 256; ++byte) {
      if ((byte & 0x7f) == 0x7f) continue;  // the NaN encodings: never stored by the quantizer
      const uint16_t want = detail::fp8_dequantize(static_cast<uint8_t>(byte), scales[s]);
      ASSERT_EQ(got[s * 256 + byte], want) << "byte 0x" << std::hex << byte << " scale " << scales[s];
      ++checked;
    }
  }
  EXPECT_EQ(checked, static_cast<int>(scales.size()) * 254);
}

}  // namespace
}  // namespace mlakit::testing
