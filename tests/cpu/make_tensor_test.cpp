// make_tensor: row-major strides computed only without explicit strides, never by an
// overflowing multiplication; sizes too large for 64-bit offsets reach validation, which
// names the tensor.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "cpu_test_util.h"
#include "mlakit/reference.h"

namespace mlakit {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

TEST(MakeTensor, RowMajorStrides) {
  const TensorRef t = make_tensor(nullptr, DType::kBF16, {2, 3, 4});
  EXPECT_EQ(t.rank, 3);
  EXPECT_EQ(t.stride[0], 12);
  EXPECT_EQ(t.stride[1], 4);
  EXPECT_EQ(t.stride[2], 1);
  const TensorRef z = make_tensor(nullptr, DType::kBF16, {3, 0, 4});
  EXPECT_EQ(z.stride[0], 0);
  EXPECT_EQ(z.stride[1], 4);
  EXPECT_EQ(z.numel(), 0);
}

TEST(MakeTensor, ExplicitStridesOfHugeSizesAreTakenAsGiven) {
  const TensorRef t = make_tensor(nullptr, DType::kBF16, {int64_t{1} << 62, int64_t{1} << 62, 4}, {0, 0, 1});
  EXPECT_EQ(t.stride[0], 0);
  EXPECT_EQ(t.stride[1], 0);
  EXPECT_EQ(t.stride[2], 1);
  const TensorRef bad = make_tensor(nullptr, DType::kBF16, {2, 3}, {1});
  EXPECT_EQ(bad.rank, -1);
}

TEST(MakeTensor, OverflowingRowMajorStridesSaturate) {
  const TensorRef t = make_tensor(nullptr, DType::kBF16, {int64_t{1} << 40, int64_t{1} << 40, int64_t{1} << 40});
  EXPECT_EQ(t.stride[2], 1);
  EXPECT_EQ(t.stride[1], int64_t{1} << 40);
  EXPECT_EQ(t.stride[0], kMax);
  EXPECT_EQ(t.numel(), kMax);
  // A size-1 outer dimension never uses its stride: the tensor stays valid.
  const TensorRef one = make_tensor(nullptr, DType::kBF16, {1, int64_t{1} << 61, 4});
  EXPECT_EQ(one.stride[1], 4);
  EXPECT_EQ(one.stride[0], kMax);
}

TEST(MakeTensor, ValidationNamesATensorTooLargeForItsStrides) {
  std::vector<uint16_t> small(576);
  std::vector<int32_t> table(1), lens(1);
  std::vector<float> out(512), lse(1);
  MlaDecodeArgs a;
  a.q = make_tensor(small.data(), DType::kBF16, {int64_t{1} << 21, int64_t{1} << 21, int64_t{1} << 21, 576});
  a.kv_cache = make_tensor(small.data(), DType::kBF16, {1, 1, 1, 576});
  a.block_table = make_tensor(table.data(), DType::kInt32, {1, 1});
  a.cache_seqlens = make_tensor(lens.data(), DType::kInt32, {1});
  a.out = make_tensor(out.data(), DType::kFP32, {1, 1, 1, 512});
  a.lse = make_tensor(lse.data(), DType::kFP32, {1, 1, 1});
  EXPECT_TRUE(testing::IsInvalid(reference::mla_decode(a), {"reference::mla_decode: q: shape", "spans more than"}));
}

}  // namespace
}  // namespace mlakit
