// The GPU DeepSeek V4 FP8 cache tools against the CPU versions, bit for bit, on every page size
// with FlashMLA's padded blocks: quantize (padded token pitch, sentinel-filled cache: padding
// and unused bytes must match too), dequantize of the quantized cache and of random bytes (every
// code and scale byte, NaN ones included), and the paged append into a sentinel-filled cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "mlakit/fp8_cache.h"
#include "support/fp8_v4_cache_case.h"

namespace mlakit::testing {
namespace {

using support::kV4TestDqk;
using support::kV4TestTokenBytes;
using support::v4_padded_block_stride;

constexpr uint8_t kSentinel = 0xA5;
constexpr int64_t kPageSizes[] = {1, 2, 61, 64, 69, 576};

int64_t blocks_for(int64_t page) { return page == 576 ? 3 : 40; }

TensorRef cache_ref(void* data, int64_t blocks, int64_t page) {
  return make_tensor(data, DType::kUInt8, {blocks, page, 1, kV4TestTokenBytes},
                     {v4_padded_block_stride(page), kV4TestTokenBytes, kV4TestTokenBytes, 1});
}

TensorRef rows_ref(void* data, int64_t blocks, int64_t page, int64_t pitch) {
  return make_tensor(data, DType::kBF16, {blocks, page, 1, kV4TestDqk}, {page * pitch, pitch, pitch, 1});
}

TEST(Fp8V4CacheGpu, QuantizeMatchesTheCpuBitForBit) {
  MLAKIT_SKIP_WITHOUT_GPU();
  for (int64_t page : kPageSizes) {
    const int64_t blocks = blocks_for(page), pitch = 512 + 8 * (page % 3);
    const std::vector<uint16_t> x = support::v4_random_tokens(blocks * page, pitch, 30 + page);
    std::vector<uint8_t> cpu(blocks * v4_padded_block_stride(page), kSentinel);
    ASSERT_TRUE(reference::quantize_mla_cache_fp8_v4(rows_ref(const_cast<uint16_t*>(x.data()), blocks, page, pitch),
                                                     cache_ref(cpu.data(), blocks, page)));
    DeviceBuffer d_x(x), d_cache(cpu.size());
    d_cache.fill_bytes(kSentinel);
    const Status s = quantize_mla_cache_fp8_v4(rows_ref(d_x.get(), blocks, page, pitch),
                                               cache_ref(d_cache.get(), blocks, page), nullptr);
    ASSERT_TRUE(s) << s.to_string();
    MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(d_cache.download<uint8_t>(), cpu) << "page " << page;
  }
}

TEST(Fp8V4CacheGpu, DequantizeMatchesTheCpuBitForBit) {
  MLAKIT_SKIP_WITHOUT_GPU();
  for (int64_t page : kPageSizes) {
    const int64_t blocks = blocks_for(page), n = blocks * page;
    // A quantized cache (its codes as quantize writes them) and random bytes (every code and scale).
    const std::vector<uint16_t> x = support::v4_random_tokens(n, 512, 40 + page);
    std::vector<uint8_t> quantized(blocks * v4_padded_block_stride(page), kSentinel);
    ASSERT_TRUE(reference::quantize_mla_cache_fp8_v4(rows_ref(const_cast<uint16_t*>(x.data()), blocks, page, 512),
                                                     cache_ref(quantized.data(), blocks, page)));
    std::vector<uint8_t> random_bytes(quantized.size());
    std::mt19937_64 rng(50 + page);
    std::generate(random_bytes.begin(), random_bytes.end(), [&] { return static_cast<uint8_t>(rng()); });
    for (const std::vector<uint8_t>* cache : {&quantized, &random_bytes}) {
      const std::string what =
          std::string(cache == &quantized ? "quantized" : "random bytes") + ", page " + std::to_string(page);
      std::vector<uint16_t> cpu(n * 512, 0xFFFF);
      ASSERT_TRUE(reference::dequantize_mla_cache_fp8_v4(cache_ref(const_cast<uint8_t*>(cache->data()), blocks, page),
                                                         rows_ref(cpu.data(), blocks, page, 512)));
      DeviceBuffer d_cache(*cache), d_out(n * 512 * 2);
      d_out.fill16(0xFFFF);
      const Status s =
          dequantize_mla_cache_fp8_v4(cache_ref(d_cache.get(), blocks, page),
                                      make_tensor(d_out.get(), DType::kBF16, {blocks, page, kV4TestDqk}), nullptr);
      ASSERT_TRUE(s) << s.to_string();
      MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
      EXPECT_EQ(d_out.download<uint16_t>(), cpu) << what;
    }
  }
}

TEST(Fp8V4CacheGpu, AppendMatchesTheCpuAndLeavesOtherSlots) {
  MLAKIT_SKIP_WITHOUT_GPU();
  for (int64_t page : kPageSizes) {
    const int64_t blocks = blocks_for(page), slots_in_cache = blocks * page, n = std::min<int64_t>(300, slots_in_cache);
    const std::vector<uint16_t> tokens = support::v4_random_tokens(n, 512, 60 + page);
    std::vector<int32_t> order(slots_in_cache);
    for (int64_t i = 0; i < slots_in_cache; ++i) order[i] = static_cast<int32_t>(i);
    std::mt19937_64 rng(70 + page);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<int32_t> slots(n);
    for (int64_t i = 0; i < n; ++i) {
      slots[i] = i % 10 == 0 ? -1 : i % 13 == 0 ? static_cast<int32_t>(slots_in_cache + i) : order[i];
    }
    std::vector<uint8_t> cpu(blocks * v4_padded_block_stride(page), kSentinel);
    DeviceBuffer d_tokens(tokens), d_slots(slots), d_cache(cpu);
    ASSERT_TRUE(reference::append_mla_cache_fp8_v4(
        make_tensor(const_cast<uint16_t*>(tokens.data()), DType::kBF16, {n, kV4TestDqk}),
        make_tensor(slots.data(), DType::kInt32, {n}), cache_ref(cpu.data(), blocks, page)));
    const Status s = append_mla_cache_fp8_v4(make_tensor(d_tokens.get(), DType::kBF16, {n, kV4TestDqk}),
                                             make_tensor(d_slots.get(), DType::kInt32, {n}),
                                             cache_ref(d_cache.get(), blocks, page), nullptr);
    ASSERT_TRUE(s) << s.to_string();
    MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(d_cache.download<uint8_t>(), cpu) << "page " << page;
    EXPECT_NE(cpu, std::vector<uint8_t>(cpu.size(), kSentinel)) << "page " << page << ": nothing appended";
  }
}

TEST(Fp8V4CacheGpu, HostPointersAreRejected) {
  MLAKIT_SKIP_WITHOUT_GPU();
  std::vector<uint16_t> src(512);
  DeviceBuffer d_cache(v4_padded_block_stride(1));
  const Status s = quantize_mla_cache_fp8_v4(make_tensor(src.data(), DType::kBF16, {1, 1, kV4TestDqk}),
                                             cache_ref(d_cache.get(), 1, 1), nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("quantize_mla_cache_fp8_v4: src: expected device memory"), std::string::npos)
      << s.message();
}

}  // namespace
}  // namespace mlakit::testing
