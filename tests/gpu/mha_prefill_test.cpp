// The dense MHA prefill (include/mlakit/mha_prefill.h) on the GPU against the float64 CPU
// reference, on both kernels (the Hopper one only on compute capability 9.0): every (d_qk, d_v)
// pair, causal (bottom-right) and not, GQA ratios 1 / 4 / 8 (and 2), varlen batches with
// empty query and key sequences, Lq > Lk and Lq < Lk, lengths 1, 63, 65, 127, 129, 300 and
// long ones (2048 x 2048), explicit softmax scales (peaked and flat), keys whose logits grow
// across tiles, lse absent and present, bf16 and fp16, padded views and q / k / v as slices of
// one packed qkv buffer. Inputs hold NaN in every row of no sequence, in the padding and in
// guard rows past the tensors (support/mha_prefill_case.h): none may leak into a result.
// Outputs are NaN-poisoned before each of three calls per case; rows of no sequence, padding
// and guard rows must keep the poison, and the calls must agree bit for bit. Then: a stream,
// a CUDA graph replayed with new lengths in the same prefix-sum buffer, and the device path's
// validation (host pointers, workspace, kernel choice and alignment, empty problems).
//
// Reference cost: h_q * (d_qk + d_v) * visible (query, key) pairs float64 multiply-adds per
// case, computed once per case for both kernels; MhaPrefillGpuCases.ReferenceCostIsBounded
// prints the total (9.25e9: about 4 s on two cores, about a second on the GPU machine's).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "common/mha_prefill_tiling.h"
#include "gpu_test_util.h"
#include "mlakit/mha_prefill.h"
#include "support/mha_prefill_case.h"

namespace mlakit::testing {
namespace {

using Spec = support::MhaPrefillSpec;
using support::mha_prefill_spec;
using support::MhaSequenceLengths;
using MhaCase = NamedCase<Spec>;

constexpr uint16_t kPoison16 = kNan16;
constexpr uint32_t kPoison32 = kNan32;
constexpr int kCalls = 3;  // calls per case; every one after the first must repeat its bits
constexpr double kReferenceBudget = 1e10;

// Every kind of sequence in one batch: 1 x 1, Lq < Lk and Lq > Lk around the 64 / 128 tile
// sizes, an empty query sequence with keys, queries with no key, and 300 x 64 (causal: the
// first 236 rows see no key) and 64 x 300.
MhaSequenceLengths batch_a() { return {{1, 63, 0, 65, 5, 127, 129, 300, 64}, {1, 65, 7, 63, 0, 129, 127, 64, 300}}; }
MhaSequenceLengths batch_b() { return {{100, 0, 257, 33, 2}, {150, 40, 257, 0, 90}}; }
MhaSequenceLengths batch_c() { return {{65, 1, 200}, {129, 300, 64}}; }

std::string dims_name(int d_qk, int d_v) {
  std::string s = "d";
  s += std::to_string(d_qk);
  s += 'x';
  s += std::to_string(d_v);
  return s;
}

std::vector<MhaCase> sweep_cases() {
  std::vector<MhaCase> cases;
  uint64_t seed = 100;
  // Every head-dim pair x causal x GQA ratio on batch A, with rows of no sequence on both sides.
  const int dims[4][2] = {{64, 64}, {128, 128}, {192, 128}, {256, 256}};
  for (const auto& dd : dims) {
    for (bool causal : {false, true}) {
      for (int ratio : {1, 4, 8}) {
        Spec s = mha_prefill_spec(batch_a(), 8, 8 / ratio, dd[0], dd[1], causal, seed++);
        s.tail_q = 19;
        s.tail_k = 23;
        cases.push_back({"varlen_" + dims_name(dd[0], dd[1]) + (causal ? "_causal" : "_noncausal") + "_gqa" +
                             std::to_string(ratio),
                         s});
      }
    }
  }
  auto add = [&](const std::string& name, Spec s) {
    s.seed = seed++;
    cases.push_back({name, s});
  };
  // Long sequences: many key tiles, causal diagonal tiles deep in the sequence.
  add("long_2048x2048_d128x128_causal_gqa4", mha_prefill_spec({{2048}, {2048}}, 4, 1, 128, 128, true, 0));
  add("long_600x3000_d64x64_noncausal_gqa2", mha_prefill_spec({{600}, {3000}}, 2, 1, 64, 64, false, 0));
  // More work tiles than an H100 has SMs (132, one CTA each): tiles of different key counts,
  // empty ones and partial last V tiles run in several waves.
  for (const auto& dd : dims) {
    for (bool causal : {false, true}) {
      Spec s = mha_prefill_spec(batch_c(), 48, 12, dd[0], dd[1], causal, 0);  // 288 tiles
      s.tail_q = 3;
      s.tail_k = 7;
      add("many_tiles_" + dims_name(dd[0], dd[1]) + (causal ? "_causal" : "_noncausal") + "_gqa4", s);
    }
  }
  // Padded views (16-byte rows kept: the Hopper kernel takes them).
  {
    Spec s = mha_prefill_spec(batch_b(), 8, 2, 128, 128, true, 0);
    support::pad_all_views(&s);
    s.tail_q = 37;
    s.tail_k = 50;
    add("padded_d128x128_causal_gqa4", s);
    s = mha_prefill_spec(batch_c(), 4, 4, 256, 256, false, 0);
    support::pad_all_views(&s);
    s.tail_q = 5;
    add("padded_d256x256_noncausal_gqa1", s);
    s = mha_prefill_spec(batch_c(), 8, 1, 192, 128, true, 0);
    support::pad_all_views(&s);
    s.tail_k = 9;
    add("padded_d192x128_causal_gqa8", s);
  }
  // q, k, v as slices of one packed [total, h_q + 2 h_kv, d] qkv buffer.
  {
    Spec s = mha_prefill_spec({{100, 0, 257, 1, 64}, {100, 0, 257, 1, 64}}, 8, 2, 64, 64, true, 0);
    s.packed_qkv = true;
    s.tail_q = s.tail_k = 11;
    add("packed_qkv_d64x64_causal_gqa4", s);
    s = mha_prefill_spec({{129, 300}, {129, 300}}, 4, 4, 128, 128, false, 0);
    s.packed_qkv = true;
    s.tail_q = s.tail_k = 5;
    add("packed_qkv_d128x128_noncausal_gqa1", s);
    s = mha_prefill_spec({{200, 77}, {200, 77}}, 2, 1, 256, 256, true, 0);
    s.packed_qkv = true;
    s.tail_q = s.tail_k = 3;
    s.with_lse = false;
    add("packed_qkv_d256x256_causal_gqa2_nolse", s);
  }
  // Explicit scales: peaked (with logits growing along the keys) and nearly flat.
  {
    Spec s = mha_prefill_spec(batch_b(), 8, 2, 192, 128, true, 0);
    s.softmax_scale = 0.5f;
    s.key_ramp = 3;
    s.tail_q = 4;
    add("scale_peaked_ramp_d192x128_causal_gqa4", s);
    s = mha_prefill_spec(batch_c(), 4, 4, 64, 64, false, 0);
    s.softmax_scale = 0.001f;
    add("scale_flat_d64x64_noncausal_gqa1", s);
    s = mha_prefill_spec(batch_a(), 8, 1, 128, 128, false, 0);
    s.key_ramp = 4;
    add("ramp_d128x128_noncausal_gqa8", s);
  }
  // lse absent.
  {
    Spec s = mha_prefill_spec(batch_b(), 8, 1, 256, 256, true, 0);
    s.with_lse = false;
    s.tail_q = 3;
    add("nolse_d256x256_causal_gqa8", s);
    s = mha_prefill_spec(batch_c(), 4, 1, 64, 64, false, 0);
    s.with_lse = false;
    add("nolse_d64x64_noncausal_gqa4", s);
  }
  // fp16.
  {
    Spec s = mha_prefill_spec(batch_b(), 8, 2, 128, 128, true, 0);
    s.dtype = DType::kFP16;
    support::pad_all_views(&s);
    s.tail_q = 6;
    s.tail_k = 6;
    add("fp16_padded_d128x128_causal_gqa4", s);
    s = mha_prefill_spec(batch_a(), 8, 8, 64, 64, false, 0);
    s.dtype = DType::kFP16;
    add("fp16_d64x64_noncausal_gqa1", s);
    s = mha_prefill_spec(batch_c(), 8, 1, 256, 256, true, 0);
    s.dtype = DType::kFP16;
    s.tail_k = 2;
    add("fp16_d256x256_causal_gqa8", s);
    s = mha_prefill_spec(batch_c(), 4, 4, 192, 128, false, 0);
    s.dtype = DType::kFP16;
    s.softmax_scale = 0.3f;
    add("fp16_scale_d192x128_noncausal_gqa1", s);
  }
  // Edges of the batch.
  {
    Spec s = mha_prefill_spec({{0, 0, 0}, {10, 0, 64}}, 4, 2, 128, 128, true, 0);
    s.tail_q = 40;
    s.tail_k = 7;
    add("only_empty_query_sequences_d128x128_causal", s);  // nothing to write at all
    s = mha_prefill_spec({{70, 129}, {0, 0}}, 4, 1, 128, 128, true, 0);
    s.tail_k = 13;  // every k / v row is NaN
    add("no_keys_d128x128_causal_gqa4", s);
    s = mha_prefill_spec({{70, 5}, {0, 0}}, 8, 2, 256, 256, true, 0);
    add("no_key_rows_at_all_d256x256_causal_gqa4", s);  // total_k = 0: k and v have no rows
    s = mha_prefill_spec({{1, 64}, {0, 0}}, 8, 8, 64, 64, false, 0);
    s.tail_q = 2;
    s.tail_k = 64;
    add("no_keys_d64x64_noncausal_gqa1", s);
    s = mha_prefill_spec(batch_c(), 8, 2, 128, 128, true, 0);
    s.max_seqlen_slack = 200;  // the grid sized for longer sequences than there are
    add("max_seqlen_slack_d128x128_causal_gqa4", s);
    s = mha_prefill_spec({{1, 1, 1, 1}, {1, 2000, 129, 0}}, 16, 2, 128, 128, true, 0);
    add("single_queries_d128x128_causal_gqa8", s);
    s = mha_prefill_spec({{2000, 300}, {1, 299}}, 8, 1, 64, 64, true, 0);
    add("lq_above_lk_d64x64_causal_gqa8", s);  // 1999 + 1 rows that see no key
    s = mha_prefill_spec(batch_c(), 1, 1, 256, 256, true, 0);
    s.tail_q = 1;
    add("one_head_d256x256_causal", s);
    s = mha_prefill_spec({{17, 130}, {200, 130}}, 64, 8, 64, 64, true, 0);
    add("many_heads_d64x64_causal_gqa8", s);
    s = mha_prefill_spec({{1}, {1}}, 2, 2, 192, 128, false, 0);
    add("one_row_d192x128", s);
  }
  // The tail split (common/mha_prefill_tiling.h; TailSplitCasesSplitOnThisGpu checks that
  // they split): few tiles over many keys, so the Hopper kernel runs each tile in pieces and
  // combines them; a sequence of one key tile (most of its pieces see no key) and one of no
  // key among them.
  {
    const MhaSequenceLengths lengths = {{130, 200, 100, 129}, {2000, 100, 0, 700}};
    add("tail_split_d128x128_noncausal_gqa2", mha_prefill_spec(lengths, 2, 1, 128, 128, false, 0));
    Spec s = mha_prefill_spec(lengths, 2, 1, 192, 128, false, 0);
    s.tail_q = 4;
    s.tail_k = 5;
    add("tail_split_d192x128_noncausal_gqa2", s);
    s = mha_prefill_spec({{400}, {1500}}, 2, 2, 64, 64, false, 0);
    s.dtype = DType::kFP16;
    s.with_lse = false;
    add("tail_split_fp16_d64x64_noncausal_nolse", s);
    // One tile over 67 key tiles: 33 pieces, more than the combine's 32 LSEs a round.
    add("tail_split_33_pieces_d128x128_noncausal", mha_prefill_spec({{16}, {9600}}, 1, 1, 128, 128, false, 0));
  }
  // Many short sequences (b = 40, lengths 0 to 90).
  {
    Spec s = mha_prefill_spec(support::random_short_sequences(40, 7), 4, 2, 128, 128, true, 0);
    s.tail_q = 1;
    s.tail_k = 1;
    add("many_sequences_d128x128_causal_gqa2", s);
    s.causal = false;
    s.d_qk = 192;
    add("many_sequences_d192x128_noncausal_gqa2", s);
  }
  return cases;
}

// A case's inputs and reference, built once for both kernels.
using Prepared = PreparedCase<support::HostMhaPrefillCase, support::MhaPrefillReference>;

bool reference_has_nan(const Prepared& p) {
  const Spec& s = p.c.spec;
  const int64_t rows = p.c.rows_in_sequences();
  for (int64_t i = 0; i < rows * s.h_q * s.d_v; ++i) {
    if (std::isnan(p.ref.out[i])) return true;
  }
  for (int h = 0; h < s.h_q; ++h) {
    for (int64_t t = 0; t < rows; ++t) {
      if (std::isnan(p.ref.lse[h * p.c.total_q + t])) return true;
    }
  }
  return false;
}

const Prepared& prepared(const MhaCase& mc) {
  return prepared_once(
      mc.name, [&] { return support::make_mha_prefill_case(mc.spec); },
      [](const support::HostMhaPrefillCase& c) { return support::run_mha_prefill_reference(c); });
}

// A case's device copy: inputs, poisoned outputs, a workspace of the size the query returns.
struct DeviceMhaCase : DeviceMhaPrefillCase {
  DeviceMhaCase(const support::HostMhaPrefillCase& c, MlaKernel kernel) : DeviceMhaPrefillCase(c, kernel) {
    if (const Status s = allocate_workspace(); !s) throw std::runtime_error(s.to_string());
    poison();
  }
  // NaN in out and lse, 0xFF in every workspace byte (the tail split's combine must read only
  // what this call's pieces wrote).
  void poison() {
    out.fill16(kPoison16);
    lse.fill32(kPoison32);
    workspace.fill_bytes(0xFF);
  }
};

// The downloaded outputs of `d` against the reference ("" when they pass).
std::string check_device(const support::HostMhaPrefillCase& c, const support::MhaPrefillReference& ref,
                         const DeviceMhaCase& d) {
  const auto out = d.out.download<uint16_t>();
  const auto lse = d.lse.download<uint32_t>();
  std::string bad = support::check_mha_prefill_outputs(c, ref, out, c.spec.with_lse ? &lse : nullptr, kPoison16,
                                                       kPoison32);
  if (bad.empty() && !c.spec.with_lse) {
    for (size_t i = 0; i < lse.size(); ++i) {
      if (lse[i] != kPoison32) return "lse buffer (not passed) written at " + std::to_string(i);
    }
  }
  return bad;
}

// ---------------------------------------------------------------------------------------------
// The sweep: every case on both kernels, three calls each.

class MhaPrefillSweep : public ::testing::TestWithParam<std::tuple<MhaCase, MlaKernel>> {};

TEST_P(MhaPrefillSweep, MatchesReferenceAndRepeatsBitwise) {
  MLAKIT_SKIP_WITHOUT_GPU();
  const MlaKernel kernel = std::get<1>(GetParam());
  if (kernel == MlaKernel::kSm90 && !is_hopper()) GTEST_SKIP() << "the sm90 kernel needs a compute capability 9.0 GPU";
  const MhaCase& mc = std::get<0>(GetParam());
  const Prepared& p = prepared(mc);
  ASSERT_FALSE(reference_has_nan(p)) << "the reference has NaN in a row of a sequence";
  const std::string what = support::describe(mc.spec) + ", kernel " + kernel_name(kernel);

  DeviceMhaCase d(p.c, kernel);
  std::vector<uint16_t> first_out;
  std::vector<uint32_t> first_lse;
  for (int call = 0; call < kCalls; ++call) {
    d.poison();
    const Status st = d.launch();
    ASSERT_TRUE(st) << what << ": call " << call << ": " << st.to_string();
    MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
    if (call == 0) {
      const std::string bad = check_device(p.c, p.ref, d);
      ASSERT_TRUE(bad.empty()) << what << ": " << bad;
      first_out = d.out.download<uint16_t>();
      first_lse = d.lse.download<uint32_t>();
      continue;
    }
    const std::string o = difference_from_call0(d.out.download<uint16_t>(), first_out, "out");
    const std::string l = difference_from_call0(d.lse.download<uint32_t>(), first_lse, "lse");
    EXPECT_TRUE(o.empty() && l.empty()) << what << ": call " << call << ": " << o << " " << l;
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, MhaPrefillSweep,
                         ::testing::Combine(::testing::ValuesIn(sweep_cases()),
                                            ::testing::Values(MlaKernel::kPortable, MlaKernel::kSm90)),
                         [](const ::testing::TestParamInfo<std::tuple<MhaCase, MlaKernel>>& info) {
                           return std::get<0>(info.param).name + "_" + kernel_name(std::get<1>(info.param));
                         });

// The float64 work of the sweep stays bounded (the reference runs once per case).
TEST(MhaPrefillGpuCases, ReferenceCostIsBounded) {
  const double total = sweep_reference_macs("mha prefill", sweep_cases(), support::reference_macs);
  EXPECT_LE(total, kReferenceBudget);
}

// The sweep's tail-split cases do split on this GPU (else the pieces and their combine would
// go untested).
TEST(MhaPrefillGpuCases, TailSplitCasesSplitOnThisGpu) {
  MLAKIT_SKIP_WITHOUT_GPU();
  if (!is_hopper()) GTEST_SKIP() << "the tail split is the sm90 kernel's";
  int sm_count = 0;
  MLAKIT_ASSERT_CUDA(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
  int cases = 0;
  for (const MhaCase& mc : sweep_cases()) {
    if (mc.name.rfind("tail_split", 0) != 0) continue;
    ++cases;
    const DeviceMhaCase d(prepared(mc).c, MlaKernel::kSm90);
    const MhaPrefillArgs& a = d.args;
    const Spec& s = mc.spec;
    const int block_n = detail::mha_sm90_block_n(s.d_qk, s.d_v, detail::mha_sm90_wide_keys(s.d_qk, false, a.max_seqlen_k));
    const detail::MhaPrefillTailSplit split = detail::mha_prefill_tail_split(
        detail::mha_prefill_sm90_tiles(a.max_seqlen_q, s.h_q, static_cast<int64_t>(s.lq.size()), s.d_qk),
        (a.max_seqlen_k + block_n - 1) / block_n, s.causal, sm_count);
    EXPECT_GT(split.tail_tiles, 0) << mc.name << " on " << sm_count << " SMs";
    EXPECT_GE(split.pieces, 2) << mc.name;
    if (mc.name == "tail_split_33_pieces_d128x128_noncausal" && sm_count >= 33) EXPECT_EQ(split.pieces, 33);
  }
  EXPECT_EQ(cases, 4);
}

// ---------------------------------------------------------------------------------------------
// A stream, a CUDA graph, and new lengths in the same prefix-sum buffers.

TEST(MhaPrefillGpu, GraphReplayFollowsNewLengthsInTheSameBuffers) {
  MLAKIT_SKIP_WITHOUT_GPU();
  Spec spec = mha_prefill_spec({{100, 50, 30}, {120, 60, 30}}, 8, 2, 128, 128, true, 31);
  spec.tail_q = spec.tail_k = 10;
  const support::HostMhaPrefillCase c = support::make_mha_prefill_case(spec);
  const support::MhaPrefillReference ref = support::run_mha_prefill_reference(c);
  DeviceMhaCase d(c, MlaKernel::kAuto);
  cudaStream_t stream;
  MLAKIT_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  const Status st = d.launch(stream);
  ASSERT_TRUE(st) << st.to_string();
  MLAKIT_ASSERT_CUDA(cudaStreamSynchronize(stream));
  {
    const std::string bad = check_device(c, ref, d);
    ASSERT_TRUE(bad.empty()) << bad;
  }
  const auto eager_out = d.out.download<uint16_t>();
  const auto eager_lse = d.lse.download<uint32_t>();

  const CapturedGraph graph(stream, [&] { return d.launch(stream); });
  MLAKIT_ASSERT_CUDA(graph.error());
  ASSERT_TRUE(graph.call_status()) << graph.call_status().to_string();
  for (int replay = 0; replay < 2; ++replay) {
    d.poison();
    MLAKIT_ASSERT_CUDA(cudaGraphLaunch(graph.exec(), stream));
    MLAKIT_ASSERT_CUDA(cudaStreamSynchronize(stream));
    EXPECT_EQ(d.out.download<uint16_t>(), eager_out) << "replay " << replay;
    EXPECT_EQ(d.lse.download<uint32_t>(), eager_lse) << "replay " << replay;
  }

  // Other lengths within the same rows and max_seqlen (rows of data only): the graph reads them
  // on the device. Rows 160..189 of out are now in no sequence and must keep the poison.
  support::HostMhaPrefillCase next = c;
  next.spec.lq = {40, 100, 20};
  next.spec.lk = {30, 120, 50};
  next.cu_q = {0, 40, 140, 160};
  next.cu_k = {0, 30, 150, 200};
  const support::MhaPrefillReference next_ref = support::run_mha_prefill_reference(next);
  d.cu_q.upload(next.cu_q.data(), next.cu_q.size() * 4);
  d.cu_k.upload(next.cu_k.data(), next.cu_k.size() * 4);
  d.poison();
  MLAKIT_ASSERT_CUDA(cudaGraphLaunch(graph.exec(), stream));
  MLAKIT_ASSERT_CUDA(cudaStreamSynchronize(stream));
  const std::string bad = check_device(next, next_ref, d);
  EXPECT_TRUE(bad.empty()) << "after new lengths: " << bad;
  cudaStreamDestroy(stream);
}

// ---------------------------------------------------------------------------------------------
// Validation of the device path.

Spec small_spec(uint64_t seed) {
  Spec s = mha_prefill_spec({{5, 9, 70}, {7, 9, 64}}, 4, 2, 64, 64, true, seed);
  s.tail_q = 3;
  s.tail_k = 2;
  return s;
}

bool all_poisoned(const DeviceMhaCase& d) { return holds_only(d.out, kPoison16) && holds_only(d.lse, kPoison32); }

TEST(MhaPrefillValidation, HostPointersAreNamed) {
  MLAKIT_SKIP_WITHOUT_GPU();
  const support::HostMhaPrefillCase c = support::make_mha_prefill_case(small_spec(41));
  DeviceMhaCase d(c, MlaKernel::kAuto);
  std::vector<uint16_t> host_out(c.out_stored);
  std::vector<float> host_lse(c.lse_stored);
  const char* names[] = {"q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "out", "lse"};
  for (const char* name : names) {
    MhaPrefillArgs a = d.args;
    const std::string n = name;
    // The same layout over host memory (16-byte aligned like the device buffers).
    const MhaPrefillArgs h = c.args(const_cast<uint16_t*>(c.q.data()), const_cast<uint16_t*>(c.k.data()),
                                    const_cast<uint16_t*>(c.v.data()), const_cast<int32_t*>(c.cu_q.data()),
                                    const_cast<int32_t*>(c.cu_k.data()), host_out.data(), host_lse.data());
    if (n == "q") a.q = h.q;
    if (n == "k") a.k = h.k;
    if (n == "v") a.v = h.v;
    if (n == "cu_seqlens_q") a.cu_seqlens_q = h.cu_seqlens_q;
    if (n == "cu_seqlens_k") a.cu_seqlens_k = h.cu_seqlens_k;
    if (n == "out") a.out = h.out;
    if (n == "lse") a.lse = h.lse;
    const Status s = mha_prefill(a, d.workspace.get(), d.workspace.bytes(), nullptr);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << name << ": " << s.to_string();
    EXPECT_NE(s.message().find(n + ": expected device memory"), std::string::npos) << s.message();
  }
  MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_TRUE(all_poisoned(d)) << "a rejected call wrote an output";
}

// Options that are rejected: nothing runs.
void check_rejected_options(const DeviceMhaCase& d) {
  Status s;
  MhaPrefillArgs a = d.args;
  a.softmax_scale = NAN;
  s = mha_prefill(a, d.workspace.get(), d.workspace.bytes(), nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_TRUE(message_names_argument(s.message(), "softmax_scale")) << s.message();
  a = d.args;
  a.kernel = static_cast<MlaKernel>(7);
  s = mha_prefill(a, d.workspace.get(), d.workspace.bytes(), nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_TRUE(message_names_argument(s.message(), "kernel")) << s.message();
  if (!is_hopper()) {
    a = d.args;
    a.kernel = MlaKernel::kSm90;
    s = mha_prefill(a, d.workspace.get(), d.workspace.bytes(), nullptr);
    EXPECT_EQ(s.code(), StatusCode::kUnsupportedArchitecture) << s.to_string();
  }
  MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_TRUE(all_poisoned(d)) << "a rejected call wrote an output";
}

// Causal (no workspace) and without causal over enough keys for a tail split (a workspace).
TEST(MhaPrefillValidation, WorkspaceAndOptions) {
  MLAKIT_SKIP_WITHOUT_GPU();
  Spec split_spec = mha_prefill_spec({{5, 70}, {600, 9}}, 4, 2, 128, 128, false, 43);
  split_spec.tail_q = 3;
  for (const Spec& spec : {small_spec(42), split_spec}) {
    SCOPED_TRACE(support::describe(spec));
    const support::HostMhaPrefillCase c = support::make_mha_prefill_case(spec);
    const support::MhaPrefillReference ref = support::run_mha_prefill_reference(c);
    DeviceMhaCase d(c, MlaKernel::kAuto);

    Status s = mha_prefill_workspace_size(d.args, nullptr);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    std::size_t bytes = 12345;
    ASSERT_TRUE(mha_prefill_workspace_size(d.args, &bytes));
    EXPECT_EQ(bytes, d.workspace.bytes());
    EXPECT_EQ(bytes > 0, !spec.causal) << "the tail split's workspace: without causal over 600 keys only";
    if (bytes > 0) {
      s = mha_prefill(d.args, d.workspace.get(), bytes - 1, nullptr);
      EXPECT_EQ(s.code(), StatusCode::kWorkspaceTooSmall) << s.to_string();
      EXPECT_TRUE(message_names_argument(s.message(), "workspace_bytes")) << s.message();
      s = mha_prefill(d.args, nullptr, bytes, nullptr);
      EXPECT_FALSE(s) << "a null workspace of " << bytes << " bytes was accepted";
      MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
      EXPECT_TRUE(all_poisoned(d)) << "a rejected call wrote an output";
    } else {
      // None needed: no workspace at all is a valid call.
      s = mha_prefill(d.args, nullptr, 0, nullptr);
      ASSERT_TRUE(s) << s.to_string();
      MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
      const std::string bad = check_device(c, ref, d);
      EXPECT_TRUE(bad.empty()) << bad;
      d.poison();
    }
    check_rejected_options(d);
  }
}

// Layouts the Hopper kernel cannot take (rows 4-byte but not 16-byte aligned, one tensor at a
// time; the portable kernel copies such rows in 4-byte pieces): kSm90 is an error naming the
// tensor and the alignment; kAuto and kPortable run the portable kernel and are correct.
// The header lists out among the Hopper kernel's 16-byte rows too, but that kernel stores out
// in 4-byte pairs: for out, kSm90 may also run and must then be correct.
TEST(MhaPrefillValidation, UnalignedLayoutsFallBackToThePortableKernel) {
  MLAKIT_SKIP_WITHOUT_GPU();
  struct Variant {
    const char* tensor;
    const char* what;
    void (*apply)(Spec*);
    bool sm90_may_run;
  };
  const Variant variants[] = {
      {"q", "q base 2 elements past 16 bytes", [](Spec* s) { s->q_pad.offset = 2; }, false},
      {"q", "q head stride d + 2", [](Spec* s) { s->q_pad.head_pad = 2; }, false},
      {"k", "k head stride d + 2", [](Spec* s) { s->k_pad.head_pad = 2; }, false},
      {"k", "k base 6 elements past 16 bytes", [](Spec* s) { s->k_pad.offset = 6; }, false},
      {"v", "v token stride h_kv * d + 2", [](Spec* s) { s->v_pad.token_pad = 2; }, false},
      {"out", "out head stride d_v + 2", [](Spec* s) { s->out_pad.head_pad = 2; }, true},
  };
  uint64_t seed = 50;
  for (const Variant& var : variants) {
    SCOPED_TRACE(var.what);
    Spec spec = small_spec(seed++);
    spec.d_qk = spec.d_v = 128;
    var.apply(&spec);
    const support::HostMhaPrefillCase c = support::make_mha_prefill_case(spec);
    const support::MhaPrefillReference ref = support::run_mha_prefill_reference(c);
    if (is_hopper()) {
      DeviceMhaCase d(c, MlaKernel::kSm90);
      const Status s = d.launch();
      MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
      if (s && var.sm90_may_run) {
        const std::string bad = check_device(c, ref, d);
        EXPECT_TRUE(bad.empty()) << "kSm90: " << bad;
      } else {
        EXPECT_FALSE(s) << "kSm90 accepted " << var.what;
        EXPECT_TRUE(message_names_argument(s.message(), var.tensor)) << "the tensor is not named: " << s.message();
        EXPECT_NE(s.message().find("align"), std::string::npos) << "the reason is not named: " << s.message();
        EXPECT_TRUE(all_poisoned(d)) << "a rejected call wrote an output";
      }
    }
    for (MlaKernel kernel : {MlaKernel::kAuto, MlaKernel::kPortable}) {
      DeviceMhaCase d(c, kernel);
      const Status s = d.launch();
      ASSERT_TRUE(s) << kernel_name(kernel) << ": " << s.to_string();
      MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
      const std::string bad = check_device(c, ref, d);
      EXPECT_TRUE(bad.empty()) << (kernel == MlaKernel::kAuto ? "kAuto" : "kPortable") << ": " << bad;
    }
  }
}

// b = 0, total_q = 0 and h_q = 0 are the empty problem: OK, nothing written.
TEST(MhaPrefillValidation, EmptyProblemsWriteNothing) {
  MLAKIT_SKIP_WITHOUT_GPU();
  Spec no_batch = mha_prefill_spec({{}, {}}, 4, 2, 128, 128, true, 61);
  no_batch.tail_q = 6;
  no_batch.tail_k = 4;
  Spec no_rows = mha_prefill_spec({{0, 0}, {5, 3}}, 4, 2, 128, 128, false, 62);
  Spec no_heads = mha_prefill_spec({{3, 4}, {3, 4}}, 0, 1, 64, 64, true, 63);
  no_heads.q_pad.token_pad = no_heads.out_pad.token_pad = 8;  // non-zero token strides
  const std::pair<const char*, Spec> cases[] = {{"b = 0", no_batch}, {"total_q = 0", no_rows}, {"h_q = 0", no_heads}};
  for (const auto& [what, spec] : cases) {
    SCOPED_TRACE(what);
    const support::HostMhaPrefillCase c = support::make_mha_prefill_case(spec);
    for (MlaKernel kernel : {MlaKernel::kAuto, MlaKernel::kPortable, MlaKernel::kSm90}) {
      if (kernel == MlaKernel::kSm90 && !is_hopper()) continue;
      DeviceMhaCase d(c, kernel);
      const Status s = d.launch();
      EXPECT_TRUE(s) << kernel_name(kernel) << ": " << s.to_string();
      MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
      EXPECT_TRUE(all_poisoned(d)) << "the empty problem wrote an output";
    }
  }
}

}  // namespace
}  // namespace mlakit::testing
