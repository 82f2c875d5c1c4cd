// The dense MHA prefill backward (include/mlakit/mha_prefill.h, mha_prefill_backward) on the GPU
// against the float64 CPU reference: every (d_qk, d_v) pair, causal (bottom-right) and not, GQA
// ratios 1 / 4 / 8 (and 2), varlen batches with empty query and key sequences, Lq > Lk and
// Lq < Lk, lengths around the 32 / 64 row tiles (1, 31, 33, 63, 64, 65, 127, 129, 300) and long
// ones (1000 x 1000, 2048 x 2048 causal), more tiles than SMs, explicit softmax scales (peaked
// and flat), keys whose logits grow across tiles, bf16 and fp16, padded views, views aligned to
// 4 bytes only, q / k / v as slices of one packed qkv buffer, many short sequences.
//
// Inputs (support/mha_backward_case.h): q, k, v, dout hold NaN in every row of no sequence, in
// the padding and in guard rows past the tensors; out and lse are the reference forward's (out
// rounded to the dtype); dout and v are scaled so that the rule's abs 1e-3 sits above what the
// 16-bit rounding of P and dS in tensor-core products costs (MhaBackwardSpec: a float32
// emulation of such a kernel passes every case here within 0.4 of the bound). Each case runs in both modes (deterministic false / true) with kernel
// kAuto and kPortable, three calls each; before every call dq, dk, dv are NaN-poisoned and the
// workspace is filled with 0xFF bytes (the library must not rely on what a previous call left
// there). Rows of no sequence, padding and guard rows must keep the poison; the other rows
// must pass the backward's accuracy rule (SPEC section 8: abs 1e-3 or rel 8/128, cosine
// difference <= 7e-6), with exact zeros where a query sees no key or no query sees a key.
// Deterministic mode: calls 2 and 3 bit for bit equal to call 1 (which passes the check);
// default mode: every call passes the check. Then: a CUDA graph on a stream replayed with new
// lengths in the same buffers, the device path's validation (host pointers, workspace, options,
// row alignment) and the empty problems.
//
// Reference cost: h_q * (5 d_qk + 4 d_v) * visible (query, key) pairs float64 multiply-adds per
// case (forward and backward references), computed once per case for its four runs;
// MhaPrefillBackwardGpuCases.ReferenceCostIsBounded prints the total (2.2e10: 6.5 s on the
// 2-core development machine).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "common/mha_backward_tiling.h"
#include "gpu_test_util.h"
#include "mlakit/mha_prefill.h"
#include "support/mha_backward_case.h"

namespace mlakit::testing {
namespace {

using Spec = support::MhaBackwardSpec;
using BackwardCase = NamedCase<Spec>;
using support::backward_mode_name;
using support::HostMhaBackwardCase;
using support::mha_backward_spec;
using support::MhaBackwardReference;
using support::MhaSequenceLengths;
using support::MhaViewPad;

constexpr uint16_t kPoison16 = kNan16;
constexpr int kCalls = 3;  // calls per case and mode
constexpr double kReferenceBudget = 2.5e10;

// Every kind of sequence in one batch, around the 32- and 64-row tiles: 1 x 1, 31 x 33 and
// 33 x 31, an empty query sequence with keys (dk = dv = 0), queries without keys (dq = 0),
// 63 x 65, 65 x 63, 64 x 64, 127 x 129, 129 x 127, 300 x 40 (causal: the first 260 rows see no
// key) and 40 x 300.
MhaSequenceLengths batch_a() {
  return {{1, 31, 33, 0, 5, 63, 65, 64, 127, 129, 300, 40}, {1, 33, 31, 7, 0, 65, 63, 64, 129, 127, 40, 300}};
}
MhaSequenceLengths batch_b() { return {{100, 0, 257, 33, 2}, {150, 40, 257, 0, 90}}; }
MhaSequenceLengths batch_c() { return {{65, 1, 200}, {129, 300, 64}}; }

std::string dims_name(int d_qk, int d_v) { return "d" + std::to_string(d_qk) + "x" + std::to_string(d_v); }
std::string causal_name(bool causal) { return causal ? "_causal" : "_noncausal"; }

std::vector<BackwardCase> sweep_cases() {
  std::vector<BackwardCase> cases;
  uint64_t seed = 300;
  auto add = [&](const std::string& name, Spec s) {
    s.problem.seed = seed++;
    cases.push_back({name, s});
  };
  // Every head-dim pair x causal x GQA ratio on batch A, with rows of no sequence on both sides.
  const int dims[4][2] = {{64, 64}, {128, 128}, {192, 128}, {256, 256}};
  const int ratio_heads[3][2] = {{1, 4}, {4, 4}, {8, 8}};  // (ratio, h_q)
  for (const auto& dd : dims) {
    for (bool causal : {false, true}) {
      for (const auto& rh : ratio_heads) {
        Spec s = mha_backward_spec(batch_a(), rh[1], rh[1] / rh[0], dd[0], dd[1], causal);
        s.problem.tail_q = 19;
        s.problem.tail_k = 23;
        add("varlen_" + dims_name(dd[0], dd[1]) + causal_name(causal) + "_gqa" + std::to_string(rh[0]), s);
      }
    }
  }
  // Long sequences: many key and query tiles, causal diagonal tiles deep in the sequence.
  add("long_1000x1000_d128x128_noncausal_gqa2", mha_backward_spec({{1000}, {1000}}, 2, 1, 128, 128, false));
  add("long_2048x2048_d64x64_causal_gqa2", mha_backward_spec({{2048}, {2048}}, 2, 1, 64, 64, true));
  add("long_300x1500_d256x256_causal_gqa1", mha_backward_spec({{300}, {1500}}, 1, 1, 256, 256, true));
  add("long_1000x1100_d192x128_causal_gqa2", mha_backward_spec({{1000}, {1100}}, 2, 1, 192, 128, true));
  // More work tiles than an H100 has SMs (132): tiles of different lengths, empty ones and
  // partial last tiles run in several waves.
  for (const auto& dd : dims) {
    const bool causal = dd[0] != 128;
    Spec s = mha_backward_spec(batch_c(), 24, 6, dd[0], dd[1], causal);
    s.problem.tail_q = 3;
    s.problem.tail_k = 7;
    add("many_tiles_" + dims_name(dd[0], dd[1]) + causal_name(causal) + "_gqa4", s);
  }
  // Padded views of every tensor (16-byte rows kept).
  {
    Spec s = mha_backward_spec(batch_b(), 8, 2, 128, 128, true);
    support::pad_all_views(&s);
    s.problem.tail_q = 37;
    s.problem.tail_k = 50;
    add("padded_d128x128_causal_gqa4", s);
    s = mha_backward_spec(batch_c(), 4, 4, 256, 256, false);
    support::pad_all_views(&s);
    s.problem.tail_q = 5;
    add("padded_d256x256_noncausal_gqa1", s);
    s = mha_backward_spec(batch_c(), 8, 1, 192, 128, true);
    support::pad_all_views(&s);
    s.problem.tail_k = 9;
    add("padded_d192x128_causal_gqa8", s);
  }
  // Rows aligned to 4 bytes only, every tensor.
  {
    Spec s = mha_backward_spec(batch_b(), 4, 1, 64, 64, true);
    support::align4_all_views(&s);
    s.problem.tail_q = s.problem.tail_k = 3;
    add("align4_d64x64_causal_gqa4", s);
    s = mha_backward_spec(batch_c(), 4, 2, 192, 128, false);
    support::align4_all_views(&s);
    s.problem.dtype = DType::kFP16;
    add("align4_fp16_d192x128_noncausal_gqa2", s);
  }
  // q, k, v as slices of one packed [total, h_q + 2 h_kv, d] qkv buffer.
  {
    Spec s = mha_backward_spec({{100, 0, 257, 1, 64}, {100, 0, 257, 1, 64}}, 8, 2, 64, 64, true);
    s.problem.packed_qkv = true;
    s.problem.tail_q = s.problem.tail_k = 11;
    add("packed_qkv_d64x64_causal_gqa4", s);
    s = mha_backward_spec({{129, 300}, {129, 300}}, 4, 4, 128, 128, false);
    s.problem.packed_qkv = true;
    s.problem.tail_q = s.problem.tail_k = 5;
    add("packed_qkv_d128x128_noncausal_gqa1", s);
    s = mha_backward_spec({{200, 77}, {200, 77}}, 2, 1, 256, 256, true);
    s.problem.packed_qkv = true;
    s.problem.tail_q = s.problem.tail_k = 3;
    add("packed_qkv_d256x256_causal_gqa2", s);
  }
  // Explicit scales: peaked (with logits growing along the keys) and nearly flat. Peaked rows
  // put large dS on few keys: a smaller v keeps the 16-bit rounding of dS that tensor-core
  // kernels do within abs 1e-3 (MhaBackwardSpec).
  {
    Spec s = mha_backward_spec(batch_b(), 8, 2, 192, 128, true);
    s.problem.softmax_scale = 0.5f;
    s.problem.key_ramp = 3;
    s.problem.tail_q = 4;
    s.v_scale = support::kPeakedRowsVScale;
    add("scale_peaked_ramp_d192x128_causal_gqa4", s);
    s = mha_backward_spec(batch_c(), 4, 4, 64, 64, false);
    s.problem.softmax_scale = 0.001f;
    add("scale_flat_d64x64_noncausal_gqa1", s);
    s = mha_backward_spec(batch_a(), 8, 1, 128, 128, false);
    s.problem.key_ramp = 4;
    s.v_scale = support::kPeakedRowsVScale;
    add("ramp_d128x128_noncausal_gqa8", s);
  }
  // fp16.
  {
    Spec s = mha_backward_spec(batch_b(), 8, 2, 128, 128, true);
    s.problem.dtype = DType::kFP16;
    support::pad_all_views(&s);
    s.problem.tail_q = 6;
    s.problem.tail_k = 6;
    add("fp16_padded_d128x128_causal_gqa4", s);
    s = mha_backward_spec(batch_a(), 4, 4, 64, 64, false);
    s.problem.dtype = DType::kFP16;
    add("fp16_d64x64_noncausal_gqa1", s);
    s = mha_backward_spec(batch_c(), 8, 1, 256, 256, true);
    s.problem.dtype = DType::kFP16;
    s.problem.tail_k = 2;
    add("fp16_d256x256_causal_gqa8", s);
    s = mha_backward_spec(batch_c(), 4, 4, 192, 128, false);
    s.problem.dtype = DType::kFP16;
    s.problem.softmax_scale = 0.3f;
    add("fp16_scale_d192x128_noncausal_gqa1", s);
  }
  // Edges of the batch.
  {
    Spec s = mha_backward_spec({{0, 0, 0}, {10, 0, 64}}, 4, 2, 128, 128, true);
    s.problem.tail_q = 40;
    s.problem.tail_k = 7;
    add("only_empty_query_sequences_d128x128_causal", s);  // dq: nothing; dk, dv: all 0
    s = mha_backward_spec({{70, 129}, {0, 0}}, 4, 1, 128, 128, true);
    s.problem.tail_k = 13;  // every k / v row is NaN
    add("no_keys_d128x128_causal_gqa4", s);  // dq all 0
    s = mha_backward_spec({{70, 5}, {0, 0}}, 8, 2, 256, 256, true);
    add("no_key_rows_at_all_d256x256_causal_gqa4", s);  // total_k = 0: dk and dv have no rows
    s = mha_backward_spec(batch_c(), 8, 2, 128, 128, true);
    s.problem.max_seqlen_slack = 200;  // the grid sized for longer sequences than there are
    add("max_seqlen_slack_d128x128_causal_gqa4", s);
    s = mha_backward_spec(batch_c(), 8, 2, 192, 128, false);
    s.problem.max_seqlen_slack = 130;  // the grid and the deterministic counters sized past the sequences
    add("max_seqlen_slack_d192x128_noncausal_gqa4", s);
    s = mha_backward_spec({{1, 1, 1, 1}, {3, 2000, 129, 0}}, 16, 2, 128, 128, true);
    add("single_queries_d128x128_causal_gqa8", s);
    s = mha_backward_spec({{2000, 300}, {2, 299}}, 8, 1, 64, 64, true);
    add("lq_above_lk_d64x64_causal_gqa8", s);  // 1998 + 1 rows that see no key
    s = mha_backward_spec(batch_c(), 1, 1, 256, 256, true);
    s.problem.tail_q = 1;
    add("one_head_d256x256_causal", s);
    s = mha_backward_spec({{17, 130}, {200, 130}}, 64, 8, 64, 64, true);
    add("many_heads_d64x64_causal_gqa8", s);
    s = mha_backward_spec({{1}, {3}}, 2, 2, 192, 128, false);
    add("one_row_d192x128", s);
  }
  // Many short sequences (b = 40, lengths 0 to 90).
  {
    Spec s = mha_backward_spec(support::random_short_sequences(40, 7), 4, 2, 128, 128, true);
    s.problem.tail_q = 1;
    s.problem.tail_k = 1;
    add("many_sequences_d128x128_causal_gqa2", s);
    s.problem.causal = false;
    s.problem.d_qk = 192;
    add("many_sequences_d192x128_noncausal_gqa2", s);
  }
  return cases;
}

// A case's inputs and reference, built once for its four runs.
const auto& prepared(const BackwardCase& bc) {
  return prepared_once(
      bc.name, [&] { return support::make_mha_backward_case(bc.spec); },
      [](const HostMhaBackwardCase& c) { return support::run_mha_backward_reference(c); });
}

// A case's device copy: inputs, poisoned gradients, a workspace of the size the query returns.
struct DeviceBackwardCase : DeviceMhaBackwardCase {
  DeviceBackwardCase(const HostMhaBackwardCase& c, bool deterministic, MlaKernel kernel)
      : DeviceMhaBackwardCase(c, deterministic, kernel) {
    if (const Status s = allocate_workspace(); !s) throw std::runtime_error(s.to_string());
    poison();
  }
  // NaN in every gradient element, 0xFF in every workspace byte; synchronised, so that a launch
  // on any stream sees it.
  void poison() {
    dq.fill16(kPoison16);
    dk.fill16(kPoison16);
    dv.fill16(kPoison16);
    workspace.fill_bytes(0xFF);
    if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("poison: cudaDeviceSynchronize failed");
  }
  struct Grads {
    std::vector<uint16_t> dq, dk, dv;
    bool operator==(const Grads&) const = default;
  };
  Grads download() const { return {dq.download<uint16_t>(), dk.download<uint16_t>(), dv.download<uint16_t>()}; }
};

using Grads = DeviceBackwardCase::Grads;

std::string check_grads(const HostMhaBackwardCase& c, const MhaBackwardReference& ref, const Grads& g) {
  return support::check_mha_backward_outputs(c, ref, g.dq, g.dk, g.dv, kPoison16);
}

// Where `got` differs from call 0's `first`, each differing gradient followed by "; ".
std::string differences(const Grads& got, const Grads& first) {
  std::string text;
  auto add = [&](const std::vector<uint16_t>& g, const std::vector<uint16_t>& f, const char* name) {
    if (const std::string d = difference_from_call0(g, f, name); !d.empty()) text += d + "; ";
  };
  add(got.dq, first.dq, "dq");
  add(got.dk, first.dk, "dk");
  add(got.dv, first.dv, "dv");
  return text;
}

bool all_poisoned(const DeviceBackwardCase& d) {
  return holds_only(d.dq, kPoison16) && holds_only(d.dk, kPoison16) && holds_only(d.dv, kPoison16);
}

// ---------------------------------------------------------------------------------------------
// The sweep: every case in both modes with kAuto, kPortable and kSm90 (d (64, 64), (128, 128)
// and (192, 128); refused otherwise), three calls each.

using SweepParam = std::tuple<BackwardCase, bool, MlaKernel>;

class MhaPrefillBackwardSweep : public ::testing::TestWithParam<SweepParam> {};

TEST_P(MhaPrefillBackwardSweep, MatchesReferenceAndDeterministicModeRepeatsBitwise) {
  MLAKIT_SKIP_WITHOUT_GPU();
  const auto& [bc, deterministic, kernel] = GetParam();
  const auto& p = prepared(bc);
  const std::string what =
      support::describe(bc.spec) + ", " + backward_mode_name(deterministic) + " mode, kernel " + kernel_name(kernel);

  if (kernel == MlaKernel::kSm90 && !is_hopper()) GTEST_SKIP() << "the sm90 kernel needs a compute capability 9.0 GPU";
  DeviceBackwardCase d(p.c, deterministic, kernel);
  const auto& spec = bc.spec.problem;
  const bool served_dims = mlakit::detail::mha_backward_hopper_dims(spec.d_qk, spec.d_v);
  if (kernel == MlaKernel::kSm90 && (!served_dims || !support::tma_copied_rows_aligned(bc.spec))) {
    // The Hopper kernel serves d (64, 64), (128, 128) and (192, 128) over 16-byte rows: other head dims
    // are refused naming `kernel`, other rows naming the tensor and the alignment (the
    // validation tests name each), before anything is written.
    d.poison();
    const Status st = d.launch();
    EXPECT_EQ(st.code(), served_dims ? StatusCode::kInvalidArgument : StatusCode::kUnsupported)
        << what << ": " << st.to_string();
    EXPECT_NE(st.message().find(served_dims ? "align" : "kernel"), std::string::npos) << st.message();
    MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
    EXPECT_TRUE(all_poisoned(d)) << what << ": a refused call wrote a gradient";
    return;
  }
  Grads first;
  for (int call = 0; call < kCalls; ++call) {
    d.poison();
    const Status st = d.launch();
    ASSERT_TRUE(st) << what << ": call " << call << ": " << st.to_string();
    MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
    Grads got = d.download();
    if (call == 0 || !deterministic) {
      const std::string bad = check_grads(p.c, p.ref, got);
      ASSERT_TRUE(bad.empty()) << what << ": call " << call << ": " << bad;
      if (call == 0) first = std::move(got);
      continue;
    }
    const std::string diff = differences(got, first);
    EXPECT_TRUE(diff.empty()) << what << ": call " << call << " (deterministic mode): " << diff;
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, MhaPrefillBackwardSweep,
                         ::testing::Combine(::testing::ValuesIn(sweep_cases()), ::testing::Bool(),
                                            ::testing::Values(MlaKernel::kAuto, MlaKernel::kPortable, MlaKernel::kSm90)),
                         [](const ::testing::TestParamInfo<SweepParam>& info) {
                           return std::get<0>(info.param).name + "_" + backward_mode_name(std::get<1>(info.param)) +
                                  "_" + kernel_name(std::get<2>(info.param));
                         });

// The float64 work of the sweep stays bounded (the references run once per case).
TEST(MhaPrefillBackwardGpuCases, ReferenceCostIsBounded) {
  const double total = sweep_reference_macs("mha prefill backward", sweep_cases(), support::backward_reference_macs);
  EXPECT_LE(total, kReferenceBudget);
}

// Sweep cases without causal whose key tiles the Hopper kernel runs in a tail split on this
// GPU (common/mha_backward_tiling.h): a long sequence (16 pieces of 2 heads' query tiles) and
// varlen batches with empty sequences (pieces of 1 to 4 steps), at each head-dim pair it
// serves; else the pieces and their combine would go untested.
TEST(MhaPrefillBackwardGpuCases, TailSplitCasesSplitOnThisGpu) {
  MLAKIT_SKIP_WITHOUT_GPU();
  if (!is_hopper()) GTEST_SKIP() << "the tail split is the sm90 kernel's";
  int sm_count = 0;
  MLAKIT_ASSERT_CUDA(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
  const char* names[] = {"long_1000x1000_d128x128_noncausal_gqa2", "varlen_d64x64_noncausal_gqa4",
                         "varlen_d128x128_noncausal_gqa1", "varlen_d192x128_noncausal_gqa8"};
  int found = 0;
  for (const BackwardCase& bc : sweep_cases()) {
    bool listed = false;
    for (const char* n : names) listed |= bc.name == n;
    if (!listed) continue;
    ++found;
    const support::MhaPrefillSpec& s = bc.spec.problem;
    const DeviceBackwardCase d(prepared(bc).c, /*deterministic=*/false, MlaKernel::kSm90);
    const int64_t key_tiles = detail::mha_tiles_of(d.args.max_seqlen_k, detail::kMhaBackwardSm90KeyRows);
    const detail::MhaPrefillTailSplit split = detail::mha_prefill_tail_split(
        key_tiles * s.h_kv * static_cast<int64_t>(s.lq.size()),
        detail::mha_backward_tail_steps(s.h_q / s.h_kv, d.args.max_seqlen_q), s.causal, sm_count);
    // The long case (8 key tiles) splits on any GPU of 16 SMs or more; the varlen ones were
    // chosen for the 132 SMs of an H100 / H200 SXM.
    if (bc.name.rfind("long_", 0) != 0 && sm_count != 132) continue;
    EXPECT_GT(split.tail_tiles, 0) << bc.name << " on " << sm_count << " SMs";
    EXPECT_GE(split.pieces, 2) << bc.name;
  }
  EXPECT_EQ(found, 4);
}

// ---------------------------------------------------------------------------------------------
// A stream, a CUDA graph, and new lengths in the same buffers.

TEST(MhaPrefillBackwardGpu, GraphReplayFollowsNewLengthsInTheSameBuffers) {
  MLAKIT_SKIP_WITHOUT_GPU();
  Spec spec = mha_backward_spec({{100, 50, 30}, {120, 60, 30}}, 8, 2, 128, 128, true);
  spec.problem.tail_q = spec.problem.tail_k = 10;
  spec.problem.seed = 31;
  const HostMhaBackwardCase c = support::make_mha_backward_case(spec);
  const MhaBackwardReference ref = support::run_mha_backward_reference(c);
  // Other lengths within the same rows and max_seqlen: the graph reads them on the device.
  // Rows 160..189 of dq and 200..219 of dk / dv are now in no sequence and must keep the poison.
  const HostMhaBackwardCase next = support::recut_mha_backward_case(c, {40, 100, 20}, {30, 120, 50});
  const MhaBackwardReference next_ref = support::run_mha_backward_reference(next);
  cudaStream_t stream;
  MLAKIT_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  for (bool deterministic : {false, true}) {
    SCOPED_TRACE(backward_mode_name(deterministic));
    DeviceBackwardCase d(c, deterministic, MlaKernel::kAuto);
    const Status st = d.launch(stream);
    ASSERT_TRUE(st) << st.to_string();
    MLAKIT_ASSERT_CUDA(cudaStreamSynchronize(stream));
    const Grads eager = d.download();
    {
      const std::string bad = check_grads(c, ref, eager);
      ASSERT_TRUE(bad.empty()) << "eager: " << bad;
    }

    const CapturedGraph graph(stream, [&] { return d.launch(stream); });
    MLAKIT_ASSERT_CUDA(graph.error());
    ASSERT_TRUE(graph.call_status()) << "captured: " << graph.call_status().to_string();
    for (int replay = 0; replay < 2; ++replay) {
      d.poison();
      MLAKIT_ASSERT_CUDA(cudaGraphLaunch(graph.exec(), stream));
      MLAKIT_ASSERT_CUDA(cudaStreamSynchronize(stream));
      const Grads got = d.download();
      if (deterministic) {
        EXPECT_TRUE(got == eager) << "replay " << replay << ": " << differences(got, eager);
      } else {
        const std::string bad = check_grads(c, ref, got);
        EXPECT_TRUE(bad.empty()) << "replay " << replay << ": " << bad;
      }
    }

    d.upload_inputs(next);
    Grads first_next;
    for (int replay = 0; replay < 2; ++replay) {
      d.poison();
      MLAKIT_ASSERT_CUDA(cudaGraphLaunch(graph.exec(), stream));
      MLAKIT_ASSERT_CUDA(cudaStreamSynchronize(stream));
      Grads got = d.download();
      if (replay == 1 && deterministic) {
        EXPECT_TRUE(got == first_next) << "after new lengths, replay 1: " << differences(got, first_next);
        continue;
      }
      const std::string bad = check_grads(next, next_ref, got);
      EXPECT_TRUE(bad.empty()) << "after new lengths, replay " << replay << ": " << bad;
      if (replay == 0) first_next = std::move(got);
    }
  }
  cudaStreamDestroy(stream);
}

// ---------------------------------------------------------------------------------------------
// Validation of the device path.

Spec small_spec(uint64_t seed) {
  Spec s = mha_backward_spec({{5, 9, 70}, {7, 9, 64}}, 4, 2, 64, 64, true);
  s.problem.tail_q = 3;
  s.problem.tail_k = 2;
  s.problem.seed = seed;
  return s;
}

TEST(MhaPrefillBackwardValidation, HostPointersAreNamed) {
  MLAKIT_SKIP_WITHOUT_GPU();
  const HostMhaBackwardCase c = support::make_mha_backward_case(small_spec(41));
  DeviceBackwardCase d(c, /*deterministic=*/false, MlaKernel::kAuto);
  std::vector<uint16_t> host_dq(c.dq_stored), host_dk(c.dk_stored), host_dv(c.dv_stored);
  // The same layouts over host memory (as aligned as the device buffers' rows need).
  HostMhaBackwardCase::Buffers host = c.host_inputs();
  host.dq = host_dq.data();
  host.dk = host_dk.data();
  host.dv = host_dv.data();
  const MhaPrefillBackwardArgs h = c.args(host);
  const std::pair<const char*, TensorRef MhaPrefillBackwardArgs::*> tensors[] = {
      {"dout", &MhaPrefillBackwardArgs::dout},
      {"q", &MhaPrefillBackwardArgs::q},
      {"k", &MhaPrefillBackwardArgs::k},
      {"v", &MhaPrefillBackwardArgs::v},
      {"out", &MhaPrefillBackwardArgs::out},
      {"lse", &MhaPrefillBackwardArgs::lse},
      {"cu_seqlens_q", &MhaPrefillBackwardArgs::cu_seqlens_q},
      {"cu_seqlens_k", &MhaPrefillBackwardArgs::cu_seqlens_k},
      {"dq", &MhaPrefillBackwardArgs::dq},
      {"dk", &MhaPrefillBackwardArgs::dk},
      {"dv", &MhaPrefillBackwardArgs::dv},
  };
  for (const auto& [name, member] : tensors) {
    MhaPrefillBackwardArgs a = d.args;
    a.*member = h.*member;
    const Status s = mha_prefill_backward(a, d.workspace.get(), d.workspace.bytes(), nullptr);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << name << ": " << s.to_string();
    EXPECT_NE(s.message().find(std::string(name) + ": expected device memory"), std::string::npos) << s.message();
  }
  // A host workspace (256-byte aligned, large enough).
  std::unique_ptr<void, decltype(&std::free)> host_workspace{
      std::aligned_alloc(256, (d.workspace.bytes() + 255) / 256 * 256 + 256), &std::free};
  const Status s = mha_prefill_backward(d.args, host_workspace.get(), d.workspace.bytes(), nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("workspace: expected device memory"), std::string::npos) << s.message();
  MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_TRUE(all_poisoned(d)) << "a rejected call wrote a gradient";
}

TEST(MhaPrefillBackwardValidation, WorkspaceAndOptions) {
  MLAKIT_SKIP_WITHOUT_GPU();
  const HostMhaBackwardCase c = support::make_mha_backward_case(small_spec(42));
  const MhaBackwardReference ref = support::run_mha_backward_reference(c);
  for (bool deterministic : {false, true}) {
    SCOPED_TRACE(backward_mode_name(deterministic));
    DeviceBackwardCase d(c, deterministic, MlaKernel::kAuto);

    Status s = mha_prefill_backward_workspace_size(d.args, nullptr);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_TRUE(message_names_argument(s.message(), "bytes")) << s.message();
    std::size_t bytes = 12345;
    ASSERT_TRUE(mha_prefill_backward_workspace_size(d.args, &bytes));
    EXPECT_EQ(bytes, d.workspace.bytes());
    ASSERT_GT(bytes, 0u) << "the workspace holds dq's float32 accumulator";
    {
      // The size follows the shapes and the options (mha_prefill.h), not the scale. Causal
      // needs no room for the tail split's pieces; the default mode no ordering counters.
      MhaPrefillBackwardArgs other = d.args;
      other.softmax_scale = 0.25f;
      std::size_t again = 0;
      ASSERT_TRUE(mha_prefill_backward_workspace_size(other, &again));
      EXPECT_EQ(again, bytes);
      std::size_t causal_bytes = 0, full_bytes = 0;
      other.causal = true;
      ASSERT_TRUE(mha_prefill_backward_workspace_size(other, &causal_bytes));
      other.causal = false;
      ASSERT_TRUE(mha_prefill_backward_workspace_size(other, &full_bytes));
      EXPECT_LE(causal_bytes, full_bytes) << "causal needs more workspace than the full mask";
      EXPECT_EQ(bytes, d.args.causal ? causal_bytes : full_bytes);
      if (deterministic) {
        other.causal = d.args.causal;
        other.deterministic = false;
        ASSERT_TRUE(mha_prefill_backward_workspace_size(other, &again));
        EXPECT_LE(again, bytes) << "the default mode needs more workspace than the deterministic one";
      }
    }

    s = mha_prefill_backward(d.args, d.workspace.get(), bytes - 1, nullptr);
    EXPECT_EQ(s.code(), StatusCode::kWorkspaceTooSmall) << s.to_string();
    EXPECT_TRUE(message_names_argument(s.message(), "workspace_bytes")) << s.message();
    s = mha_prefill_backward(d.args, d.workspace.get(), 0, nullptr);
    EXPECT_EQ(s.code(), StatusCode::kWorkspaceTooSmall) << s.to_string();
    s = mha_prefill_backward(d.args, nullptr, bytes, nullptr);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_TRUE(message_names_argument(s.message(), "workspace")) << s.message();
    {
      DeviceBuffer larger(bytes + 256);
      s = mha_prefill_backward(d.args, static_cast<char*>(larger.get()) + 16, bytes, nullptr);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << "misaligned workspace: " << s.to_string();
      EXPECT_TRUE(message_names_argument(s.message(), "workspace")) << s.message();
    }

    // Rejected options: nothing runs.
    MhaPrefillBackwardArgs a = d.args;
    for (float scale : {NAN, INFINITY}) {
      a = d.args;
      a.softmax_scale = scale;
      s = mha_prefill_backward(a, d.workspace.get(), bytes, nullptr);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
      EXPECT_TRUE(message_names_argument(s.message(), "softmax_scale")) << s.message();
    }
    a = d.args;
    a.kernel = static_cast<MlaKernel>(7);
    s = mha_prefill_backward(a, d.workspace.get(), bytes, nullptr);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_TRUE(message_names_argument(s.message(), "kernel")) << s.message();
    std::size_t unused = 0;
    s = mha_prefill_backward_workspace_size(a, &unused);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << "size query, kernel 7: " << s.to_string();
    {
      // d 256: the Hopper backward serves d 64, 128 and 192 / 128 only (and Hopper only).
      Spec wide_spec = mha_backward_spec({{5, 9}, {7, 9}}, 2, 1, 256, 256, true);
      wide_spec.problem.seed = 43;
      const HostMhaBackwardCase wide_case = support::make_mha_backward_case(wide_spec);
      DeviceBackwardCase wide(wide_case, deterministic, MlaKernel::kSm90);
      s = mha_prefill_backward(wide.args, wide.workspace.get(), wide.workspace.bytes(), nullptr);
      EXPECT_EQ(s.code(), is_hopper() ? StatusCode::kUnsupported : StatusCode::kUnsupportedArchitecture)
          << s.to_string();
      EXPECT_TRUE(message_names_argument(s.message(), "kernel")) << s.message();
      MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
      EXPECT_TRUE(all_poisoned(wide)) << "the refused d 256 call wrote a gradient";
    }
    a.kernel = MlaKernel::kAuto;
    a.lse = TensorRef{};
    s = mha_prefill_backward(a, d.workspace.get(), d.workspace.bytes(), nullptr);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << "no lse: " << s.to_string();
    EXPECT_TRUE(message_names_argument(s.message(), "lse")) << s.message();
    MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
    EXPECT_TRUE(all_poisoned(d)) << "a rejected call wrote a gradient";

    // The buffers are intact: a valid call still gives the reference.
    ASSERT_TRUE(d.launch()) << "the valid call";
    MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
    const std::string bad = check_grads(c, ref, d.download());
    EXPECT_TRUE(bad.empty()) << bad;
  }
}

// Every tensor the kernels move in 16-bit pairs, one at a time: rows not 4-byte aligned (base 1
// element past, or an odd head / token stride) are an error naming the tensor and the
// alignment, and nothing is written; rows aligned to 4 bytes but not 16 run on kAuto and
// kPortable (and kSm90, for the tensors it does not copy by TMA) and are correct, at each head-dim
// pair of the Hopper kernel.
TEST(MhaPrefillBackwardValidation, RowAlignmentIsCheckedPerTensor) {
  MLAKIT_SKIP_WITHOUT_GPU();
  struct Target {
    const char* tensor;
    MhaViewPad* (*pad)(Spec*);
  };
  const Target targets[] = {
      {"dout", [](Spec* s) { return &s->dout_pad; }}, {"q", [](Spec* s) { return &s->problem.q_pad; }},
      {"k", [](Spec* s) { return &s->problem.k_pad; }}, {"v", [](Spec* s) { return &s->problem.v_pad; }},
      {"out", [](Spec* s) { return &s->problem.out_pad; }}, {"dq", [](Spec* s) { return &s->dq_pad; }},
      {"dk", [](Spec* s) { return &s->dk_pad; }},         {"dv", [](Spec* s) { return &s->dv_pad; }},
  };
  const std::pair<const char*, MhaViewPad> unaligned[] = {
      {"base 1 element past", {.offset = 1, .head_pad = 0, .token_pad = 0}},
      {"head stride d + 1", {.offset = 0, .head_pad = 1, .token_pad = 0}},
      {"token stride heads * d + 3", {.offset = 0, .head_pad = 0, .token_pad = 3}},
  };
  uint64_t seed = 50;
  for (const Target& target : targets) {
    for (const auto& [what, pad] : unaligned) {
      SCOPED_TRACE(std::string(target.tensor) + " " + what);
      Spec spec = small_spec(seed++);
      *target.pad(&spec) = pad;
      const HostMhaBackwardCase c = support::make_mha_backward_case(spec);
      for (MlaKernel kernel : {MlaKernel::kAuto, MlaKernel::kPortable}) {
        DeviceBackwardCase d(c, /*deterministic=*/false, kernel);
        const Status s = d.launch();
        MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
        EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << kernel_name(kernel) << ": " << s.to_string();
        EXPECT_TRUE(message_names_argument(s.message(), target.tensor)) << "the tensor is not named: " << s.message();
        EXPECT_NE(s.message().find("align"), std::string::npos) << "the reason is not named: " << s.message();
        EXPECT_TRUE(all_poisoned(d)) << "a rejected call wrote a gradient";
      }
    }
    // Each head-dim pair of the Hopper kernel (its dq conversion's 4-byte path per width).
    for (const auto& [d_qk, d_v] : {std::pair{64, 64}, std::pair{128, 128}, std::pair{192, 128}}) {
      SCOPED_TRACE(std::string(target.tensor) + " aligned to 4 bytes only, d " + std::to_string(d_qk) + "/" +
                   std::to_string(d_v));
      Spec spec = small_spec(seed++);
      spec.problem.d_qk = d_qk;
      spec.problem.d_v = d_v;
      *target.pad(&spec) = {.offset = 2, .head_pad = 2, .token_pad = 2};
      const HostMhaBackwardCase c = support::make_mha_backward_case(spec);
      const MhaBackwardReference ref = support::run_mha_backward_reference(c);
      // The Hopper kernel copies q, k, v and dout by TMA (16-byte rows): it refuses those, naming
      // the tensor, and runs with the others (out, dq, dk, dv: plain loads and 4-byte stores).
      const std::string tensor = target.tensor;
      const bool tma_copied = tensor == "q" || tensor == "k" || tensor == "v" || tensor == "dout";
      if (is_hopper() && tma_copied) {
        DeviceBackwardCase d(c, /*deterministic=*/false, MlaKernel::kSm90);
        d.poison();
        const Status s = d.launch();
        MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
        EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << "kSm90: " << s.to_string();
        EXPECT_TRUE(message_names_argument(s.message(), target.tensor)) << "the tensor is not named: " << s.message();
        EXPECT_NE(s.message().find("align"), std::string::npos) << "the reason is not named: " << s.message();
        EXPECT_TRUE(all_poisoned(d)) << "a rejected call wrote a gradient";
      }
      std::vector<MlaKernel> kernels = {MlaKernel::kAuto, MlaKernel::kPortable};
      if (is_hopper() && !tma_copied) kernels.push_back(MlaKernel::kSm90);
      for (bool deterministic : {false, true}) {
        for (MlaKernel kernel : kernels) {
          DeviceBackwardCase d(c, deterministic, kernel);
          const Status s = d.launch();
          ASSERT_TRUE(s) << kernel_name(kernel) << ": " << s.to_string();
          MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
          const std::string bad = check_grads(c, ref, d.download());
          EXPECT_TRUE(bad.empty()) << backward_mode_name(deterministic) << ", " << kernel_name(kernel) << ": " << bad;
        }
      }
    }
  }
}

// b = 0 writes nothing; total_q = 0 and h_q = 0 (no query) zero exactly the dk / dv rows of the
// keys inside sequences and nothing else, on every kernel that serves the case.
TEST(MhaPrefillBackwardValidation, EmptyProblems) {
  MLAKIT_SKIP_WITHOUT_GPU();
  Spec no_batch = mha_backward_spec({{}, {}}, 4, 2, 128, 128, true);
  no_batch.problem.tail_q = 6;
  no_batch.problem.tail_k = 4;
  Spec no_rows = mha_backward_spec({{0, 0, 0}, {5, 0, 3}}, 4, 2, 128, 128, false);
  no_rows.problem.tail_k = 6;
  Spec no_heads = mha_backward_spec({{3, 4}, {3, 70}}, 0, 1, 64, 64, true);
  no_heads.problem.tail_q = no_heads.problem.tail_k = 2;
  // Non-zero token strides for the tensors without heads.
  no_heads.problem.q_pad.token_pad = no_heads.problem.out_pad.token_pad = 8;
  no_heads.dout_pad.token_pad = no_heads.dq_pad.token_pad = 8;
  Spec no_heads_128 = no_heads;  // the same at d 128
  no_heads_128.problem.d_qk = no_heads_128.problem.d_v = 128;
  const std::pair<const char*, Spec> cases[] = {
      {"b = 0", no_batch}, {"total_q = 0", no_rows}, {"h_q = 0", no_heads}, {"h_q = 0, d 128", no_heads_128}};
  uint64_t seed = 61;
  for (auto [what, spec] : cases) {
    SCOPED_TRACE(what);
    spec.problem.seed = seed++;
    const HostMhaBackwardCase c = support::make_mha_backward_case(spec);
    const MhaBackwardReference ref = support::run_mha_backward_reference(c);
    for (bool deterministic : {false, true}) {
      for (MlaKernel kernel : {MlaKernel::kAuto, MlaKernel::kPortable, MlaKernel::kSm90}) {
        const bool sm90_serves =
            is_hopper() && mlakit::detail::mha_backward_hopper_dims(spec.problem.d_qk, spec.problem.d_v);
        if (kernel == MlaKernel::kSm90 && !sm90_serves) continue;  // refusals: the sweep's and WorkspaceAndOptions'
        DeviceBackwardCase d(c, deterministic, kernel);
        for (int call = 0; call < 2; ++call) {
          d.poison();
          const Status s = d.launch();
          ASSERT_TRUE(s) << backward_mode_name(deterministic) << ", " << kernel_name(kernel) << ": " << s.to_string();
          MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
          const std::string bad = check_grads(c, ref, d.download());
          EXPECT_TRUE(bad.empty()) << backward_mode_name(deterministic) << ", " << kernel_name(kernel) << ", call "
                                   << call << ": " << bad;
          if (c.b() == 0) {
            EXPECT_TRUE(all_poisoned(d)) << "b = 0 wrote a gradient";
          }
        }
      }
    }
  }
}

// Many short sequences: each would take a whole 64-row dQ slot of the Hopper kernel (here 4160
// slots of 16 heads, 2.1 GB, against 32 MiB of rows), so the workspace holds rows only: kSm90
// refuses, naming the argument and writing nothing; kAuto runs the portable kernels, correctly.
TEST(MhaPrefillBackwardValidation, ManyShortSequencesRunWithoutTheHopperSlots) {
  MLAKIT_SKIP_WITHOUT_GPU();
  const std::vector<int> ones(4096, 1);
  Spec spec = mha_backward_spec({ones, ones}, 16, 16, 128, 128, true);
  spec.problem.seed = 71;
  const HostMhaBackwardCase c = support::make_mha_backward_case(spec);
  const MhaBackwardReference ref = support::run_mha_backward_reference(c);
  if (is_hopper()) {
    DeviceBackwardCase d(c, /*deterministic=*/false, MlaKernel::kSm90);
    d.poison();
    const Status s = d.launch();
    MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.to_string();
    EXPECT_TRUE(message_names_argument(s.message(), "kernel")) << s.message();
    EXPECT_TRUE(all_poisoned(d)) << "a refused call wrote a gradient";
  }
  for (bool deterministic : {false, true}) {
    DeviceBackwardCase d(c, deterministic, MlaKernel::kAuto);
    d.poison();
    const Status s = d.launch();
    ASSERT_TRUE(s) << backward_mode_name(deterministic) << ": " << s.to_string();
    MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
    const std::string bad = check_grads(c, ref, d.download());
    EXPECT_TRUE(bad.empty()) << backward_mode_name(deterministic) << ": " << bad;
  }
}

}  // namespace
}  // namespace mlakit::testing
