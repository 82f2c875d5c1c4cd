// The generic argument checks of host/check.h and TensorRef construction: every error path,
// its status code, and a message naming the argument with the expected and actual value.
#include "host/check.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "cpu_test_util.h"
#include "mlakit/tensor.h"

namespace mlakit::detail {
namespace {

using mlakit::testing::IsInvalid;

constexpr const char* kOp = "op_x";

// Validators never dereference data; a fake, well-aligned address is enough.
void* fake_ptr(std::uintptr_t address = 0x100000) { return reinterpret_cast<void*>(address); }

TEST(TensorRef, MakeTensorGivesRowMajorStrides) {
  const TensorRef t = make_tensor(fake_ptr(), DType::kBF16, {2, 3, 4, 5});
  EXPECT_EQ(t.rank, 4);
  EXPECT_EQ(t.stride[0], 60);
  EXPECT_EQ(t.stride[1], 20);
  EXPECT_EQ(t.stride[2], 5);
  EXPECT_EQ(t.stride[3], 1);
  EXPECT_EQ(t.numel(), 120);
  EXPECT_FALSE(t.empty());
  EXPECT_TRUE(TensorRef{}.empty());
  const TensorRef v = make_tensor(fake_ptr(), DType::kFP32, {2, 3}, {10, 1});
  EXPECT_EQ(v.rank, 2);
  EXPECT_EQ(v.stride[0], 10);
  EXPECT_EQ(v.shape[1], 3);
  EXPECT_TRUE(check_tensor_wellformed(kOp, "v", v).is_ok());
}

TEST(TensorRef, MismatchedShapeAndStrideListsGiveAMalformedTensor) {
  const TensorRef t = make_tensor(fake_ptr(), DType::kBF16, {2, 3}, {3});
  EXPECT_LT(t.rank, 0);
  EXPECT_TRUE(IsInvalid(check_tensor_wellformed(kOp, "q", t),
                        {"op_x: q: expected a tensor of rank 1..6", "differ in length"}));
  const TensorRef u = make_tensor(fake_ptr(), DType::kBF16, {2}, {3, 1, 1});
  EXPECT_LT(u.rank, 0);
  EXPECT_FALSE(check_tensor_wellformed(kOp, "q", u).is_ok());
}

TEST(TensorRef, TooManyDimensionsGiveAMalformedTensor) {
  const TensorRef t = make_tensor(fake_ptr(), DType::kBF16, {1, 1, 1, 1, 1, 1, 1});
  EXPECT_TRUE(IsInvalid(check_tensor_wellformed(kOp, "q", t), {"op_x: q: expected a tensor of rank 1..6"}));
  const TensorRef u = make_tensor(fake_ptr(), DType::kBF16, {1, 1, 1, 1, 1, 1, 1},
                                  {1, 1, 1, 1, 1, 1, 1});
  const Status s = check_tensor_wellformed(kOp, "q", u);
  EXPECT_TRUE(IsInvalid(s, {"op_x: q: expected a tensor of rank 1..6"}));
  // The lists have equal lengths (7): the message must not blame a length mismatch.
  EXPECT_EQ(s.message().find("differ in length"), std::string::npos) << s.message();
}

// shape_string runs on tensors not yet checked (the "got ..." of a message): a rank outside
// the stored extents must print as such, not read past them.
TEST(ShapeString, RankOutsideTheStoredExtents) {
  TensorRef t = make_tensor(fake_ptr(), DType::kFP32, {2, 3});
  EXPECT_EQ(shape_string(t), "[2, 3]");
  t.rank = 1 << 20;
  EXPECT_EQ(shape_string(t), "[rank 1048576]");
  t.rank = -1;
  EXPECT_EQ(shape_string(t), "[rank -1]");
}

TEST(CheckTensorWellformed, RankOutOfRange) {
  TensorRef t;  // rank 0
  t.data = fake_ptr();
  EXPECT_TRUE(IsInvalid(check_tensor_wellformed(kOp, "x", t),
                        {"op_x: x: expected a tensor of rank 1..6, got rank 0"}));
  t.rank = 7;
  EXPECT_TRUE(IsInvalid(check_tensor_wellformed(kOp, "x", t), {"x:", "rank 1..6", "got rank 7"}));
}

TEST(CheckTensorWellformed, NegativeSizeOrStride) {
  TensorRef t = make_tensor(fake_ptr(), DType::kBF16, {2, 3, 4});
  t.shape[1] = -3;
  EXPECT_TRUE(IsInvalid(check_tensor_wellformed(kOp, "x", t),
                        {"op_x: x.shape[1]: expected >= 0, got -3"}));
  t = make_tensor(fake_ptr(), DType::kBF16, {2, 3, 4});
  t.stride[0] = -1;
  EXPECT_TRUE(IsInvalid(check_tensor_wellformed(kOp, "x", t),
                        {"op_x: x.stride[0]: expected >= 0", "got -1"}));
}

TEST(CheckTensorWellformed, NullPointerOnlyForEmptyTensors) {
  TensorRef t = make_tensor(nullptr, DType::kBF16, {2, 3});
  EXPECT_TRUE(IsInvalid(check_tensor_wellformed(kOp, "x", t),
                        {"op_x: x: expected a non-null pointer, got null"}));
  t = make_tensor(nullptr, DType::kBF16, {2, 0});
  EXPECT_TRUE(check_tensor_wellformed(kOp, "x", t).is_ok());
}

TEST(CheckTensorWellformed, NullPointerWithAnElementCountBeyondInt64) {
  // 2^62 * 4 = 2^64 elements: a product that wraps to 0 in int64 must not make a null
  // pointer look like an empty tensor (zero strides keep the extent check quiet).
  const TensorRef t = make_tensor(nullptr, DType::kBF16, {int64_t{1} << 62, 4}, {0, 1});
  EXPECT_TRUE(IsInvalid(check_tensor_wellformed(kOp, "x", t),
                        {"op_x: x: expected a non-null pointer, got null"}));
}

TEST(CheckTensorWellformed, ExtentOverflowIsReported) {
  // Largest offset (shape - 1) * stride beyond 2^59 elements.
  TensorRef t = make_tensor(fake_ptr(), DType::kBF16, {2, 3}, {int64_t{1} << 60, 1});
  EXPECT_TRUE(IsInvalid(check_tensor_wellformed(kOp, "x", t), {"op_x: x:", "[2, 3]", "2^59"}));
}

TEST(CheckedMul, ProductsBeyondInt64AreReported) {
  int64_t p = -1;
  EXPECT_TRUE(checked_mul(int64_t{1} << 31, int64_t{1} << 31, &p));
  EXPECT_EQ(p, int64_t{1} << 62);
  EXPECT_TRUE(checked_mul(INT64_MAX, 1, &p));
  EXPECT_EQ(p, INT64_MAX);
  EXPECT_TRUE(checked_mul(INT64_MAX, 0, &p));
  EXPECT_EQ(p, 0);
  EXPECT_FALSE(checked_mul(int64_t{1} << 32, int64_t{1} << 32, &p));
  EXPECT_FALSE(checked_mul(INT64_MAX, 2, &p));
  EXPECT_FALSE(checked_mul(INT64_MIN, -1, &p));
}

TEST(CheckExtentFits, Boundaries) {
  const int64_t limit = std::numeric_limits<int64_t>::max() / 16;
  EXPECT_TRUE(check_extent_fits(kOp, "x", make_tensor(fake_ptr(), DType::kBF16, {2}, {limit})).is_ok());
  EXPECT_TRUE(IsInvalid(check_extent_fits(kOp, "x", make_tensor(fake_ptr(), DType::kBF16, {2}, {limit + 1})),
                        {"op_x: x: shape [2]", "2^59"}));
  // The sum over dimensions counts, not each dimension alone.
  const int64_t half = limit / 2 + 1;
  EXPECT_TRUE(IsInvalid(check_extent_fits(kOp, "x", make_tensor(fake_ptr(), DType::kBF16, {2, 2}, {half, half})),
                        {"x:", "[2, 2]"}));
  // Products that overflow int64 itself.
  EXPECT_FALSE(check_extent_fits(kOp, "x", make_tensor(fake_ptr(), DType::kBF16, {int64_t{1} << 40, 1},
                                                       {int64_t{1} << 40, 1})).is_ok());
  // A zero-size tensor has no elements, whatever its strides.
  EXPECT_TRUE(check_extent_fits(kOp, "x", make_tensor(fake_ptr(), DType::kBF16, {0, 5}, {int64_t{1} << 62, 1})).is_ok());
  // Size-1 dimensions never move.
  EXPECT_TRUE(check_extent_fits(kOp, "x", make_tensor(fake_ptr(), DType::kBF16, {1, 5}, {int64_t{1} << 62, 1})).is_ok());
}

TEST(CheckDtype, ListsTheAllowedDtypes) {
  const TensorRef t = make_tensor(fake_ptr(), DType::kFP32, {4});
  EXPECT_TRUE(IsInvalid(check_dtype(kOp, "q", t, {DType::kBF16, DType::kFP16}),
                        {"op_x: q.dtype: expected bf16 or fp16, got float32"}));
  EXPECT_TRUE(IsInvalid(check_dtype(kOp, "t", t, {DType::kInt32}),
                        {"op_x: t.dtype: expected int32, got float32"}));
  EXPECT_TRUE(check_dtype(kOp, "q", t, {DType::kBF16, DType::kFP32}).is_ok());
}

TEST(CheckSameDtype, NamesTheOtherTensor) {
  const TensorRef t = make_tensor(fake_ptr(), DType::kFP16, {4});
  EXPECT_TRUE(IsInvalid(check_same_dtype(kOp, "kv_cache", t, "q", DType::kBF16),
                        {"op_x: kv_cache.dtype: expected bf16 (the dtype of q), got fp16"}));
  EXPECT_TRUE(check_same_dtype(kOp, "kv_cache", t, "q", DType::kFP16).is_ok());
}

TEST(CheckRank, ShowsTheShape) {
  const TensorRef t = make_tensor(fake_ptr(), DType::kBF16, {2, 3, 4});
  EXPECT_TRUE(IsInvalid(check_rank(kOp, "q", t, 4),
                        {"op_x: q: expected rank 4, got rank 3 (shape [2, 3, 4])"}));
  EXPECT_TRUE(check_rank(kOp, "q", t, 3).is_ok());
}

TEST(CheckDim, NamesAxisAndDimension) {
  const TensorRef t = make_tensor(fake_ptr(), DType::kBF16, {2, 1, 16, 512});
  EXPECT_TRUE(IsInvalid(check_dim(kOp, "q", t, 3, "d_qk", 576),
                        {"op_x: q.shape[3] (d_qk): expected 576, got 512"}));
  EXPECT_TRUE(check_dim(kOp, "q", t, 2, "h_q", 16).is_ok());
}

TEST(CheckLastDimContiguous, StrideOfTheLastDimension) {
  const TensorRef t = make_tensor(fake_ptr(), DType::kBF16, {2, 3, 4}, {24, 8, 2});
  EXPECT_TRUE(IsInvalid(check_last_dim_contiguous(kOp, "out", t),
                        {"op_x: out.stride[2]: expected 1 (last dimension contiguous), got 2"}));
  // A last dimension of size 1 may have any stride.
  EXPECT_TRUE(check_last_dim_contiguous(kOp, "lse", make_tensor(fake_ptr(), DType::kFP32, {2, 3, 1}, {3, 1, 7})).is_ok());
  // Other dimensions are free.
  EXPECT_TRUE(check_last_dim_contiguous(kOp, "q", make_tensor(fake_ptr(), DType::kBF16, {2, 3, 4}, {7, 100, 1})).is_ok());
}

TEST(CheckRowAlignment, PointerAlignment) {
  const auto base = reinterpret_cast<char*>(fake_ptr());
  EXPECT_TRUE(IsInvalid(check_row_alignment(kOp, "q", make_tensor(base + 2, DType::kBF16, {4, 8}), 16),
                        {"op_x: q: expected a 16-byte aligned pointer", "got an address = 2 mod 16"}));
  EXPECT_TRUE(IsInvalid(check_row_alignment(kOp, "lse", make_tensor(base + 6, DType::kFP32, {4}), 4),
                        {"lse: expected a 4-byte aligned pointer", "= 2 mod 4"}));
  EXPECT_TRUE(check_row_alignment(kOp, "q", make_tensor(base + 32, DType::kBF16, {4, 8}), 16).is_ok());
}

TEST(CheckRowAlignment, StridesInElementsOfTheDtype) {
  void* p = fake_ptr();
  // bf16, 16 bytes = 8 elements.
  EXPECT_TRUE(IsInvalid(check_row_alignment(kOp, "q", make_tensor(p, DType::kBF16, {2, 3, 576}, {1760, 580, 1}), 16),
                        {"op_x: q.stride[1]: expected a multiple of 8 elements (16 bytes), got 580"}));
  EXPECT_TRUE(IsInvalid(check_row_alignment(kOp, "q", make_tensor(p, DType::kBF16, {2, 3, 576}, {1732, 576, 1}), 16),
                        {"q.stride[0]:", "multiple of 8 elements", "got 1732"}));
  // float32, 16 bytes = 4 elements.
  EXPECT_TRUE(check_row_alignment(kOp, "x", make_tensor(p, DType::kFP32, {2, 4}, {12, 1}), 16).is_ok());
  EXPECT_TRUE(IsInvalid(check_row_alignment(kOp, "x", make_tensor(p, DType::kFP32, {2, 4}, {6, 1}), 16),
                        {"x.stride[0]: expected a multiple of 4 elements (16 bytes), got 6"}));
  // bf16, 4 bytes = 2 elements.
  EXPECT_TRUE(IsInvalid(check_row_alignment(kOp, "out", make_tensor(p, DType::kBF16, {2, 512}, {513, 1}), 4),
                        {"out.stride[0]: expected a multiple of 2 elements (4 bytes), got 513"}));
  // Dimensions of size 1 never step, the last dimension is element-contiguous.
  EXPECT_TRUE(check_row_alignment(kOp, "q", make_tensor(p, DType::kBF16, {1, 3, 576}, {5, 584, 1}), 16).is_ok());
}

}  // namespace
}  // namespace mlakit::detail
