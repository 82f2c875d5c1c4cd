// Answers that used to be silent or misleading (issue 23, item 4), each now an error naming
// the argument: a NaN or infinite logit scale, outputs that are broadcast views or share
// memory with another output, an input or the workspace, and 64-bit sizes the sparse
// operations would have narrowed to int. Then what the validation fuzz test found: NoDevice
// messages without the op's name, size products beyond int64, unbounded paged caches, and
// references looping over the other sizes of an empty problem. Empty inputs:
// empty_inputs_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "cpu_test_util.h"
#include "host/check.h"
#include "host/decode_layout.h"
#include "host/device.h"
#include "host/mla_decode_validate.h"
#include "host/mla_sparse_decode_validate.h"
#include "host/mla_sparse_prefill_validate.h"
#include "host/output_check.h"
#include "mlakit/fp8_cache.h"
#include "mlakit/mla_decode.h"
#include "mlakit/mla_sparse_decode.h"
#include "mlakit/mla_sparse_prefill.h"
#include "mlakit/reference.h"
#include "support/decode_case.h"
#include "support/sparse_decode_case.h"
#include "support/sparse_prefill_case.h"

namespace mlakit {
namespace {

using testing::IsInvalid;

constexpr int64_t kBig32 = int64_t{1} << 32;

// ---- valid small problems on host memory, one per operation ------------------------------

struct Dense {
  Dense()
      : c(support::make_decode_case({.seqlens = {20, 5}, .s_q = 2, .h_q = 4, .h_kv = 1, .page_size = 16, .seed = 3})),
        out(c.out_elems(), 0x7fc0),
        lse(c.lse_elems(), NAN),
        args(c.args(c.q.data(), c.kv.data(), c.block_table.data(), c.seqlens.data(), out.data(), lse.data())) {}
  Dense(const Dense&) = delete;  // args point into this object's buffers
  support::HostDecodeCase c;
  std::vector<uint16_t> out;
  std::vector<float> lse;
  MlaDecodeArgs args;
};

struct Sparse {
  Sparse()
      : c(support::make_sparse_case({.b = 2, .s_q = 2, .h_q = 16, .topk = 64, .num_blocks = 2, .page_size = 16,
                                     .with_topk_length = true, .with_sink = true})),
        out(c.out_elems(), 0x7fc0),
        lse(c.lse_elems(), NAN),
        args(c.args(c.q.data(), c.main.bytes.data(), c.main.indices.data(), c.main.lengths.data(), c.sink.data(), out.data(),
                    DType::kBF16, lse.data())) {}
  Sparse(const Sparse&) = delete;
  support::HostSparseCase c;
  std::vector<uint16_t> out;
  std::vector<float> lse;
  MlaSparseDecodeArgs args;
};

struct Prefill {
  explicit Prefill(int d_qk = 576)
      : c(support::make_sparse_prefill_case({.s_q = 3, .s_kv = 40, .h_q = 16, .d_qk = d_qk, .topk = 64})),
        out(c.out_stored(), 0x7fc0),
        max_logits(c.stat_stored(), NAN),
        lse(c.stat_stored(), NAN),
        args(c.args(c.q.data(), c.kv.data(), c.indices.data(), nullptr, nullptr, out.data(), max_logits.data(),
                    lse.data())) {}
  Prefill(const Prefill&) = delete;
  support::HostSparsePrefillCase c;
  std::vector<uint16_t> out;
  std::vector<float> max_logits, lse;
  MlaSparsePrefillArgs args;
};

// ---- softmax_scale: unset is the default, NaN and infinities are errors ------------------

TEST(SoftmaxScale, NanOrInfinityIsRejectedNamingTheArgument) {
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    const std::string got = "got " + std::to_string(bad);
    Dense d;
    d.args.softmax_scale = bad;
    EXPECT_TRUE(IsInvalid(reference::mla_decode(d.args), {"reference::mla_decode: softmax_scale: expected a finite", got}));
    EXPECT_TRUE(IsInvalid(mla_decode(d.args, MlaDecodePlan{}, nullptr), {"mla_decode: softmax_scale", got}));
    for (uint16_t x : d.out) ASSERT_EQ(x, 0x7fc0) << "out written on error";
    Sparse s;
    s.args.softmax_scale = bad;
    EXPECT_TRUE(IsInvalid(reference::mla_sparse_decode_fp8(s.args), {"softmax_scale: expected a finite", got}));
    EXPECT_TRUE(IsInvalid(mla_sparse_decode_fp8(s.args, MlaDecodePlan{}, nullptr), {"softmax_scale", got}));
    Prefill p;
    p.args.sm_scale = bad;
    EXPECT_TRUE(IsInvalid(reference::mla_sparse_prefill(p.args), {"sm_scale: expected a finite", got}));
    EXPECT_TRUE(IsInvalid(mla_sparse_prefill(p.args, nullptr), {"mla_sparse_prefill: sm_scale", got}));
  }
}

TEST(SoftmaxScale, UnsetIsOneOverSqrtDqkAndExplicitlySoBitForBit) {
  Dense unset, given;
  given.args.softmax_scale = 1.0f / std::sqrt(576.0f);
  ASSERT_FALSE(unset.args.softmax_scale.has_value());
  ASSERT_TRUE(reference::mla_decode(unset.args, 1));
  ASSERT_TRUE(reference::mla_decode(given.args, 1));
  EXPECT_EQ(unset.out, given.out);
  for (size_t i = 0; i < unset.lse.size(); ++i) EXPECT_EQ(unset.lse[i], given.lse[i]) << i;

  Prefill p_unset(512), p_given(512);
  p_given.args.sm_scale = 1.0f / std::sqrt(512.0f);
  ASSERT_TRUE(reference::mla_sparse_prefill(p_unset.args, 1));
  ASSERT_TRUE(reference::mla_sparse_prefill(p_given.args, 1));
  EXPECT_EQ(p_unset.out, p_given.out);
}

TEST(SoftmaxScale, AnyFiniteValueIsUsedAsGiven) {
  // FlashMLA takes any float; zero makes every listed key equally likely: lse = ln(count).
  Dense d;
  d.args.softmax_scale = 0.0f;
  ASSERT_TRUE(reference::mla_decode(d.args, 1));
  // Sequence 1 has 5 keys; with s_q 2 (not causal) every row of it sees all 5.
  EXPECT_FLOAT_EQ(d.lse[1 * 4 * 2], std::log(5.0f));
  d.args.softmax_scale = -0.25f;
  EXPECT_TRUE(reference::mla_decode(d.args, 1));
}

// ---- outputs: own elements, disjoint from other outputs, inputs and the workspace ---------

TEST(OutputLayout, BroadcastOutputsAreRejected) {
  Dense d;
  d.args.out.stride[2] = 0;  // every head of a token writes one row
  EXPECT_TRUE(IsInvalid(reference::mla_decode(d.args, 1),
                        {"reference::mla_decode: out.stride[2]: expected a nonzero stride", "size 4", "got 0"}));
  for (uint16_t x : d.out) ASSERT_EQ(x, 0x7fc0) << "out written on error";
  Dense e;
  e.args.lse.stride[0] = 0;
  EXPECT_TRUE(IsInvalid(reference::mla_decode(e.args, 1), {"lse.stride[0]: expected a nonzero stride", "got 0"}));
  Sparse s;
  s.args.lse.stride[1] = 0;
  EXPECT_TRUE(IsInvalid(reference::mla_sparse_decode_fp8(s.args), {"lse.stride[1]: expected a nonzero stride"}));
  Prefill p;
  p.args.max_logits.stride[0] = 0;
  EXPECT_TRUE(IsInvalid(reference::mla_sparse_prefill(p.args), {"max_logits.stride[0]: expected a nonzero stride"}));
  // A size-1 dimension is never stepped: any stride, 0 included, is fine there.
  Dense f;
  f.args.lse.stride[2] = 1;
  TensorRef one_token = f.args.out;
  one_token.shape[1] = 1;
  one_token.stride[1] = 0;
  EXPECT_TRUE(detail::check_output_layout("op", "out", one_token));
}

TEST(OutputLayout, StridesThatFoldElementsTogetherAreRejected) {
  Dense d;
  d.args.out.stride[2] = 256;  // head h + 1 starts in the middle of head h's row
  EXPECT_TRUE(IsInvalid(reference::mla_decode(d.args, 1),
                        {"out.stride[2]: expected > 511", "share an address", "got 256"}));
  // Two dimensions stepping the same distance.
  TensorRef t = make_tensor(d.out.data(), DType::kBF16, {4, 4, 512}, {512, 512, 1});
  EXPECT_TRUE(IsInvalid(detail::check_output_layout("op", "out", t), {"op: out.stride[", "expected > 2047"}));
  // Views that slicing, transposing or padding make pass.
  EXPECT_TRUE(detail::check_output_layout("op", "out", make_tensor(d.out.data(), DType::kBF16, {2, 4, 512}, {4096, 1024, 1})));
  EXPECT_TRUE(detail::check_output_layout("op", "lse", make_tensor(d.lse.data(), DType::kFP32, {2, 4, 2}, {8, 1, 4})));
  // FP8 rows closer than a row: quantize would write them over each other.
  std::vector<uint16_t> src(2 * 576);
  std::vector<uint8_t> dst(2 * 656);
  EXPECT_TRUE(IsInvalid(reference::quantize_mla_cache_fp8(make_tensor(src.data(), DType::kBF16, {2, 576}),
                                                          make_tensor(dst.data(), DType::kUInt8, {2, 656}, {16, 1})),
                        {"reference::quantize_mla_cache_fp8: dst.stride[0]: expected > 655", "got 16"}));
}

TEST(OutputOverlap, OutputsSharingMemoryWithEachOtherOrAnInputAreRejected) {
  Dense d;
  d.args.lse.data = d.out.data() + 8;  // lse inside out's memory
  EXPECT_TRUE(IsInvalid(reference::mla_decode(d.args, 1),
                        {"reference::mla_decode: lse: expected memory disjoint from out", "another output"}));
  Dense e;
  e.args.out.data = e.c.q.data();  // written over its own input
  EXPECT_TRUE(IsInvalid(reference::mla_decode(e.args, 1), {"out: expected memory disjoint from q", "an input"}));
  Dense f;
  f.args.lse.data = f.c.seqlens.data();
  EXPECT_TRUE(IsInvalid(mla_decode(f.args, MlaDecodePlan{}, nullptr), {"mla_decode: lse", "disjoint from cache_seqlens"}));

  Sparse s;
  s.args.lse.data = s.c.sink.data();
  EXPECT_TRUE(IsInvalid(reference::mla_sparse_decode_fp8(s.args), {"lse: expected memory disjoint from attn_sink"}));
  Prefill p;
  p.args.lse.data = p.args.max_logits.data;
  EXPECT_TRUE(IsInvalid(reference::mla_sparse_prefill(p.args), {"lse: expected memory disjoint from max_logits"}));
  Prefill q;
  q.args.out.data = q.c.kv.data();
  EXPECT_TRUE(IsInvalid(mla_sparse_prefill(q.args, nullptr), {"mla_sparse_prefill: out", "disjoint from kv"}));

  // The FP8 tools: in place, or the cache over the tokens it receives.
  std::vector<uint8_t> bytes(4 * 1312);
  const TensorRef src = make_tensor(bytes.data(), DType::kBF16, {2, 576});
  const TensorRef dst = make_tensor(bytes.data() + 1024, DType::kUInt8, {2, 656});
  EXPECT_TRUE(IsInvalid(reference::quantize_mla_cache_fp8(src, dst), {"dst: expected memory disjoint from src"}));
  EXPECT_TRUE(IsInvalid(dequantize_mla_cache_fp8(dst, src, nullptr), {"dequantize_mla_cache_fp8: dst", "from src"}));
  std::vector<int32_t> slots = {0, 1};
  const TensorRef cache = make_tensor(bytes.data(), DType::kUInt8, {1, 2, 1, 656});
  EXPECT_TRUE(IsInvalid(reference::append_mla_cache_fp8(src, make_tensor(slots.data(), DType::kInt32, {2}), cache),
                        {"cache: expected memory disjoint from tokens"}));
}

TEST(OutputOverlap, NeighboursInOneBufferPassAndOneSharedByteDoesNot) {
  std::vector<float> buffer(16);
  const TensorRef a = make_tensor(buffer.data(), DType::kFP32, {2, 4});
  const TensorRef b = make_tensor(buffer.data() + 8, DType::kFP32, {2, 4});
  EXPECT_TRUE(detail::check_outputs("op", {{"a", a}, {"b", b}}, {}));
  const detail::MemoryRange last_byte = detail::buffer_range("x", reinterpret_cast<char*>(buffer.data() + 8) - 1, 1);
  EXPECT_TRUE(IsInvalid(detail::check_disjoint("op", {detail::tensor_range("a", a)}, {last_byte}),
                        {"op: a: expected memory disjoint from x"}));
  // Inputs may share memory (both only read); absent or empty tensors occupy none.
  EXPECT_TRUE(detail::check_disjoint("op", {}, {detail::tensor_range("a", a), detail::tensor_range("a2", a)}));
  EXPECT_TRUE(detail::check_disjoint("op", {detail::tensor_range("none", TensorRef{})}, {detail::tensor_range("a", a)}));
}

TEST(OutputOverlap, TheDecodeWorkspaceMayHoldNoArgument) {
  Dense d;
  MlaDecodeProblem problem;
  ASSERT_TRUE(detail::validate_mla_decode_args("mla_decode", d.args, &problem));
  MlaDecodePlan plan;
  ASSERT_TRUE(detail::make_decode_layout(problem, detail::DeviceInfo{.ordinal = 0, .sm_count = 132, .cc_major = 9},
                                         &plan));
  std::vector<unsigned char> workspace(plan.workspace_bytes);
  plan.workspace = workspace.data();
  const Status separate = detail::validate_mla_decode_device_args("mla_decode", d.args, problem, plan, 0);
  EXPECT_TRUE(separate.is_ok() || separate.message().find("expected device memory") != std::string::npos)
      << separate.to_string();
  plan.workspace = d.out.data();  // the partial results would overwrite out
  EXPECT_TRUE(IsInvalid(detail::validate_mla_decode_device_args("mla_decode", d.args, problem, plan, 0),
                        {"mla_decode: plan.workspace: expected memory disjoint from out"}));
}

// ---- 64-bit sizes the sparse operations index with int ----------------------------------

TEST(SizeNarrowing, IntDimRejectsWhatAnIntCannotHold) {
  std::vector<uint16_t> q(576);
  TensorRef t = make_tensor(q.data(), DType::kBF16, {1, 1, 576});
  int value = -1;
  ASSERT_TRUE(detail::int_dim("op", "q", t, 2, "d_qk", &value));
  EXPECT_EQ(value, 576);
  t.shape[1] = INT32_MAX;
  ASSERT_TRUE(detail::int_dim("op", "q", t, 1, "h_q", &value));
  EXPECT_EQ(value, INT32_MAX);
  t.shape[1] = int64_t{INT32_MAX} + 1;
  EXPECT_TRUE(IsInvalid(detail::int_dim("op", "q", t, 1, "h_q", &value),
                        {"op: q.shape[1] (h_q): dimension too large: expected <= 2^31 - 1, got 2147483648"}));
  EXPECT_EQ(value, INT32_MAX) << "written on error";
}

TEST(SizeNarrowing, SparseDecodeRejectsSizesBeyondInt) {
  const std::function<void(MlaSparseDecodeArgs&)> mutations[] = {
      [](MlaSparseDecodeArgs& a) { a.q.shape[1] = kBig32 + 1; },    // was read as s_q 1
      [](MlaSparseDecodeArgs& a) { a.q.shape[2] = kBig32 + 16; },   // was read as h_q 16
      [](MlaSparseDecodeArgs& a) { a.kv_cache.shape[1] = kBig32 + 16; },
      [](MlaSparseDecodeArgs& a) { a.kv_cache.shape[0] = kBig32 + 2; },
  };
  const std::vector<std::string> messages[] = {
      {"q.shape[1] (s_q): dimension too large", "got 4294967297"},
      {"q.shape[2] (h_q): dimension too large", "got 4294967312"},
      {"kv_cache.shape[1] (page_block_size): expected 1 <= page_block_size <= 2^30", "got 4294967312"},
      {"kv_cache.shape[0] (num_blocks): expected <= 2^31 - 1", "got 4294967298"},
  };
  for (size_t i = 0; i < std::size(mutations); ++i) {
    Sparse s;
    mutations[i](s.args);
    EXPECT_TRUE(IsInvalid(reference::mla_sparse_decode_fp8(s.args), messages[i])) << "case " << i;
    EXPECT_TRUE(IsInvalid(mla_sparse_decode_fp8(s.args, MlaDecodePlan{}, nullptr), messages[i])) << "case " << i;
  }
}

TEST(SizeNarrowing, SparsePrefillRejectsSizesBeyondInt) {
  Prefill p;
  p.args.q.shape[2] = kBig32 + 576;  // was read as d_qk 576
  EXPECT_TRUE(IsInvalid(reference::mla_sparse_prefill(p.args),
                        {"reference::mla_sparse_prefill: q.shape[2] (d_qk): dimension too large", "got 4294967872"}));
  EXPECT_TRUE(IsInvalid(mla_sparse_prefill(p.args, nullptr), {"q.shape[2] (d_qk): dimension too large"}));
  Prefill h;
  h.args.q.shape[1] = kBig32 + 16;  // was read as h_q 16
  EXPECT_TRUE(IsInvalid(reference::mla_sparse_prefill(h.args), {"q.shape[1] (h_q): dimension too large", "got 4294967312"}));
}

// ---- findings of the validation fuzz test (validation_fuzz_test.cpp) ----------------------

TEST(NoDevice, TheDeviceQueryOfAnOpNamesIt) {
  detail::DeviceInfo info;
  const Status plain = detail::current_device_info(&info);
  const Status named = detail::current_device_info("op_x", &info);
  EXPECT_EQ(plain.code(), named.code());
  if (!plain.is_ok()) EXPECT_EQ(named.message(), "op_x: " + plain.message());
}

// Without a usable device (a CUDA-off build, or no GPU) every GPU entry point answers NoDevice
// once its arguments pass, and names itself like in every other error.
TEST(NoDevice, EveryGpuEntryPointNamesItselfInTheMessage) {
  detail::DeviceInfo info;
  const bool no_device = !detail::current_device_info(&info).is_ok();
  Dense d;
  Sparse s;
  Prefill p;
  std::vector<uint16_t> bf16(2 * 576);
  std::vector<uint8_t> fp8(2 * 656);
  std::vector<int32_t> ints = {0, 1};
  const TensorRef tokens = make_tensor(bf16.data(), DType::kBF16, {2, 576});
  const TensorRef rows = make_tensor(fp8.data(), DType::kUInt8, {2, 656});
  const TensorRef cache = make_tensor(fp8.data(), DType::kUInt8, {1, 2, 1, 656});
  const TensorRef vector = make_tensor(ints.data(), DType::kInt32, {2});
  const MlaDecodeProblem dense{.b = 2, .s_q = 1, .h_q = 16, .h_kv = 1};
  const MlaSparseDecodeProblem sparse{.b = 2, .s_q = 1, .h_q = 16, .topk = 64};
  std::size_t bytes = 0;
  MlaDecodePlan plan;
  const std::pair<const char*, Status> calls[] = {
      {"mla_decode_workspace_size", mla_decode_workspace_size(dense, &bytes)},
      {"mla_decode_plan", mla_decode_plan(dense, vector, nullptr, 0, nullptr, &plan)},
      {"mla_decode", mla_decode(d.args, MlaDecodePlan{}, nullptr)},
      {"mla_sparse_decode_workspace_size", mla_sparse_decode_workspace_size(sparse, &bytes)},
      {"mla_sparse_decode_plan", mla_sparse_decode_plan(sparse, TensorRef{}, nullptr, 0, nullptr, &plan)},
      {"mla_sparse_decode_fp8", mla_sparse_decode_fp8(s.args, MlaDecodePlan{}, nullptr)},
      {"mla_sparse_prefill", mla_sparse_prefill(p.args, nullptr)},
      {"quantize_mla_cache_fp8", quantize_mla_cache_fp8(tokens, rows, nullptr)},
      {"dequantize_mla_cache_fp8", dequantize_mla_cache_fp8(rows, tokens, nullptr)},
      {"append_mla_cache_fp8", append_mla_cache_fp8(tokens, vector, cache, nullptr)},
  };
  for (const auto& [op, st] : calls) {
    if (no_device) EXPECT_EQ(st.code(), StatusCode::kNoDevice) << op << ": " << st.to_string();
    if (st.code() == StatusCode::kNoDevice) EXPECT_EQ(st.message().rfind(std::string(op) + ": ", 0), 0u) << st.message();
  }
}

TEST(Fp8Rows, RowCountsBeyondInt64AreRejected) {
  // Broadcast inputs (stride 0) claim 2^64 rows of a one-row buffer.
  std::vector<uint16_t> bf16(576);
  std::vector<uint8_t> fp8(656);
  const TensorRef tokens = make_tensor(bf16.data(), DType::kBF16, {kBig32, kBig32, 576}, {0, 0, 1});
  const TensorRef rows = make_tensor(fp8.data(), DType::kUInt8, {kBig32, kBig32, 656}, {0, 0, 1});
  const std::string bf16_rows = "src: shape [4294967296, 4294967296, 576]: expected at most 2^63 - 1 rows";
  const std::string fp8_rows = "src: shape [4294967296, 4294967296, 656]: expected at most 2^63 - 1 rows";
  EXPECT_TRUE(IsInvalid(quantize_mla_cache_fp8(tokens, rows, nullptr), {"quantize_mla_cache_fp8: " + bf16_rows}));
  EXPECT_TRUE(IsInvalid(reference::quantize_mla_cache_fp8(tokens, rows), {"reference::quantize_mla_cache_fp8: " + bf16_rows}));
  EXPECT_TRUE(IsInvalid(dequantize_mla_cache_fp8(rows, tokens, nullptr), {"dequantize_mla_cache_fp8: " + fp8_rows}));
  EXPECT_TRUE(IsInvalid(reference::dequantize_mla_cache_fp8(rows, tokens), {"reference::dequantize_mla_cache_fp8: " + fp8_rows}));
  // A size 0 anywhere: no rows, whatever the other sizes (an empty conversion, valid).
  const TensorRef no_tokens = make_tensor(bf16.data(), DType::kBF16, {int64_t{1} << 62, 4, 0, 576}, {0, 0, 0, 1});
  const TensorRef no_rows = make_tensor(fp8.data(), DType::kUInt8, {int64_t{1} << 62, 4, 0, 656}, {0, 0, 0, 1});
  EXPECT_TRUE(reference::quantize_mla_cache_fp8(no_tokens, no_rows));
  EXPECT_TRUE(reference::dequantize_mla_cache_fp8(no_rows, no_tokens));
}

TEST(PagedCache, NumBlocksAndPageSizeAreBoundedBeforeAnySlotIsFormed) {
  // INT64_MAX blocks (stride 0: one real block): num_blocks * page_size would overflow.
  Sparse s;
  s.args.kv_cache = make_tensor(s.c.main.bytes.data(), DType::kUInt8, {INT64_MAX, 2, 1, 656}, {0, 0, 656, 1});
  EXPECT_TRUE(IsInvalid(reference::mla_sparse_decode_fp8(s.args),
                        {"reference::mla_sparse_decode_fp8: kv_cache.shape[0] (num_blocks): expected <= 2^31 - 1",
                         "got 9223372036854775807"}));
  std::vector<uint16_t> bf16(2 * 576);
  std::vector<uint8_t> fp8(2 * 656);
  std::vector<int32_t> slots = {0, 1};
  const TensorRef tokens = make_tensor(bf16.data(), DType::kBF16, {2, 576});
  const TensorRef slot_ref = make_tensor(slots.data(), DType::kInt32, {2});
  const TensorRef huge = make_tensor(fp8.data(), DType::kUInt8, {INT64_MAX, 2, 1, 656}, {0, 0, 656, 1});
  const std::string blocks = "cache.shape[0] (num_blocks): expected <= 2^31 - 1 (int32 block ids), got 9223372036854775807";
  EXPECT_TRUE(IsInvalid(reference::append_mla_cache_fp8(tokens, slot_ref, huge), {"reference::append_mla_cache_fp8: " + blocks}));
  EXPECT_TRUE(IsInvalid(append_mla_cache_fp8(tokens, slot_ref, huge, nullptr), {"append_mla_cache_fp8: " + blocks}));
  for (int64_t page : {int64_t{0}, (int64_t{1} << 30) + 1}) {
    const TensorRef cache = make_tensor(fp8.data(), DType::kUInt8, {1, page, 1, 656}, {656, 656, 656, 1});
    EXPECT_TRUE(IsInvalid(reference::append_mla_cache_fp8(tokens, slot_ref, cache),
                          {"cache.shape[1] (page_block_size): expected 1 <= page_block_size <= 2^30", "got " + std::to_string(page)}));
  }
  for (uint8_t x : fp8) ASSERT_EQ(x, 0) << "cache written on error";
}

// s_q or h_q of 0 leaves the other sizes free (their tensors have no elements, or broadcast
// inputs): the references return the empty result at once instead of looping over 2^40 tokens.
TEST(EmptyProblem, ReferencesDoNotLoopOverTheOtherSizes) {
  constexpr int64_t kHuge = int64_t{1} << 40;
  Prefill p;
  for (TensorRef* t : {&p.args.q, &p.args.out, &p.args.max_logits, &p.args.lse}) {
    t->shape[0] = kHuge;
    t->shape[1] = 0;  // h_q
  }
  p.args.indices.shape[0] = kHuge;
  p.args.indices.stride[0] = 0;
  EXPECT_TRUE(reference::mla_sparse_prefill(p.args, 1));

  Sparse s;
  for (TensorRef* t : {&s.args.q, &s.args.out}) {
    t->shape[0] = kHuge;
    t->shape[2] = 0;  // h_q
  }
  s.args.lse.shape[0] = kHuge;
  s.args.lse.shape[1] = 0;
  s.args.indices.shape[0] = kHuge;
  s.args.indices.stride[0] = 0;
  s.args.topk_length = TensorRef{};
  s.args.attn_sink.shape[0] = 0;
  EXPECT_TRUE(reference::mla_sparse_decode_fp8(s.args, 1));
}

}  // namespace
}  // namespace mlakit
