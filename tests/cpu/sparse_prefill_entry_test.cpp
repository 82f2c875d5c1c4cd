// The GPU entry point of the sparse MLA prefill, on the CPU: the kernel-layout checks
// (alignment, grid size) with their messages, argument errors returned before any device
// query, and valid arguments reaching the device query (NoDevice on a machine without GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu_test_util.h"
#include "host/device.h"
#include "host/mla_sparse_prefill_validate.h"
#include "mlakit/mla_sparse_prefill.h"
#include "support/sparse_prefill_case.h"

namespace mlakit {
namespace {

using testing::IsInvalid;
using testing::StatusIs;

constexpr int kRowsPerCta = 32;

// A valid problem on host memory with padded views (the layouts the kernel accepts).
struct HostProblem {
  explicit HostProblem(const support::SparsePrefillSpec& spec)
      : c(support::make_sparse_prefill_case(spec)),
        out(c.out_stored(), 0x7fc0),
        max_logits(c.stat_stored(), NAN),
        lse(c.stat_stored(), NAN),
        args(c.args(c.q.data(), c.kv.data(), c.indices.data(), c.topk_length.data(), c.sink.data(), out.data(),
                    max_logits.data(), lse.data())) {}
  HostProblem(const HostProblem&) = delete;  // args point into this object's buffers
  HostProblem& operator=(const HostProblem&) = delete;
  support::HostSparsePrefillCase c;
  std::vector<uint16_t> out;
  std::vector<float> max_logits, lse;
  MlaSparsePrefillArgs args;
};

support::SparsePrefillSpec small_spec() {
  return {.s_q = 3, .s_kv = 40, .h_q = 16, .d_qk = 512, .topk = 64, .strided = true, .with_topk_length = true,
          .with_sink = true, .seed = 5};
}

Status kernel_checks(const MlaSparsePrefillArgs& a) {
  detail::SparsePrefillShape shape;
  const Status s = detail::validate_mla_sparse_prefill_args("mla_sparse_prefill", a, false, &shape);
  if (!s) return s;
  return detail::validate_mla_sparse_prefill_kernel_args("mla_sparse_prefill", a, shape, kRowsPerCta);
}

bool has_device() {
  detail::DeviceInfo info;
  return detail::current_device_info(&info).is_ok();
}

TEST(SparsePrefillKernelArgs, AcceptsPaddedViews) {
  HostProblem p(small_spec());
  EXPECT_TRUE(kernel_checks(p.args)) << kernel_checks(p.args).to_string();
}

TEST(SparsePrefillKernelArgs, RowsMustBeAlignedForTheVectorCopies) {
  HostProblem p(small_spec());
  MlaSparsePrefillArgs a = p.args;
  a.q.stride[1] = 516;  // 16-byte cp.async of q rows: multiples of 8 elements
  EXPECT_TRUE(IsInvalid(kernel_checks(a), {"mla_sparse_prefill: q.stride[1]", "multiple of 8 elements", "got 516"}));
  a = p.args;
  a.kv.stride[0] = 580;
  EXPECT_TRUE(IsInvalid(kernel_checks(a), {"kv.stride[0]", "multiple of 8 elements", "got 580"}));
  a = p.args;
  a.kv.data = static_cast<uint16_t*>(a.kv.data) + 4;
  EXPECT_TRUE(IsInvalid(kernel_checks(a), {"kv: expected a 16-byte aligned pointer"}));
  a = p.args;
  a.out.stride[1] = 513;  // bf16 pairs: even strides
  EXPECT_TRUE(IsInvalid(kernel_checks(a), {"out.stride[1]", "multiple of 2 elements", "got 513"}));
  a = p.args;
  a.lse.data = static_cast<char*>(a.lse.data) + 2;
  EXPECT_TRUE(IsInvalid(kernel_checks(a), {"lse: expected a 4-byte aligned pointer"}));
}

TEST(SparsePrefillKernelArgs, GridLimitOnTokensTimesRowTiles) {
  HostProblem p(small_spec());
  detail::SparsePrefillShape shape;
  ASSERT_TRUE(detail::validate_mla_sparse_prefill_args("op", p.args, false, &shape));
  // 2^31 - 1 CTAs at most: h_q 128 is 4 row tiles, so s_q may reach (2^31 - 1) / 4.
  shape.h_q = 128;
  shape.s_q = ((int64_t{1} << 31) - 1) / 4;
  EXPECT_TRUE(detail::validate_mla_sparse_prefill_kernel_args("op", p.args, shape, kRowsPerCta));
  shape.s_q += 1;
  EXPECT_TRUE(StatusIs(detail::validate_mla_sparse_prefill_kernel_args("op", p.args, shape, kRowsPerCta),
                       StatusCode::kUnsupported, {"op: q.shape[0] (s_q)", "<= 2^31 - 1", "s_q = 536870912", "h_q = 128"}));
  // The contract's range (docs/contract.md: s_q up to 1M, h_q up to 128) is far inside the limit.
  shape.s_q = int64_t{1} << 20;
  EXPECT_TRUE(detail::validate_mla_sparse_prefill_kernel_args("op", p.args, shape, kRowsPerCta));
}

TEST(SparsePrefillEntry, ArgumentErrorsComeBeforeTheDevice) {
  HostProblem p(small_spec());
  MlaSparsePrefillArgs a = p.args;
  a.kv.shape[2] = 576;  // q says 512
  EXPECT_TRUE(IsInvalid(mla_sparse_prefill(a, nullptr), {"mla_sparse_prefill: kv.shape[2] (d_qk)", "expected 512"}));
  a = p.args;
  a.out.dtype = DType::kFP32;  // the reference accepts float32 out, the kernel does not
  EXPECT_TRUE(IsInvalid(mla_sparse_prefill(a, nullptr), {"out.dtype: expected bf16, got float32"}));
  a = p.args;
  a.q.stride[0] += 1;
  EXPECT_TRUE(IsInvalid(mla_sparse_prefill(a, nullptr), {"q.stride[0]", "multiple of 8 elements"}));
  for (uint16_t x : p.out) ASSERT_EQ(x, 0x7fc0) << "out written by a failed call";
}

TEST(SparsePrefillEntry, ValidArgsReachTheDeviceQuery) {
  HostProblem p(small_spec());
  const Status s = mla_sparse_prefill(p.args, nullptr);
  if (!has_device()) {
    EXPECT_EQ(s.code(), StatusCode::kNoDevice) << s.to_string();
  } else {
    EXPECT_TRUE(IsInvalid(s, {"expected device memory"}));  // host buffers
  }
  for (uint16_t x : p.out) ASSERT_EQ(x, 0x7fc0) << "out written by a failed call";
}

// The support case generator keeps its promises (the GPU tests rely on them).
TEST(SparsePrefillCase, IndicesAndPaddingAsDescribed) {
  support::SparsePrefillSpec spec = small_spec();
  spec.s_q = 50;
  spec.empty_token = 7;
  const support::HostSparsePrefillCase c = support::make_sparse_prefill_case(spec);
  int64_t invalid = 0, valid = 0;
  for (int64_t t = 0; t < spec.s_q; ++t) {
    for (int64_t k = 0; k < c.indices_pitch; ++k) {
      const int32_t i = c.indices[t * c.indices_pitch + k];
      const bool ok = i >= 0 && i < spec.s_kv;
      if (t == spec.empty_token) {
        ASSERT_FALSE(ok) << "token " << t << " entry " << k;
      } else if (k >= spec.topk) {
        ASSERT_TRUE(ok) << "padding must hold valid rows, token " << t << " entry " << k;
      } else {
        (ok ? valid : invalid) += 1;
      }
    }
  }
  EXPECT_GT(valid, 0);
  EXPECT_GT(invalid, 0);
  // kv rows past s_kv and q / kv columns past d_qk are NaN.
  for (int64_t r = spec.s_kv; r < c.kv_rows_stored; ++r) EXPECT_EQ(c.kv[r * c.kv_pitch], 0x7fc0);
  EXPECT_EQ(c.kv[spec.d_qk], 0x7fc0);
  EXPECT_EQ(c.q[spec.d_qk], 0x7fc0);
  EXPECT_NE(c.kv[0], 0x7fc0);
}

}  // namespace
}  // namespace mlakit
