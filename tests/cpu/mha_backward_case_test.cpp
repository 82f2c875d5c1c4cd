// The MHA prefill backward's test cases and their check (support/mha_backward_case.h), on the
// CPU: what the GPU tests rely on. A case's inputs hold NaN exactly outside the sequences, its
// out and lse are the reference forward's, its reference gradients are finite exactly inside
// the sequences; the check passes a correct call (the reference rounded into poisoned buffers)
// and names each kind of wrong one: a write outside the rows, an unwritten element, a wrong
// value, a small systematic error (cosine), a non-zero where the gradient is exactly 0.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlakit/mha_prefill.h"
#include "reference/host_numeric.h"
#include "support/mha_backward_case.h"

namespace mlakit {
namespace {

using support::HostMhaBackwardCase;
using support::MhaBackwardReference;
using support::mha_backward_spec;
using support::MhaBackwardSpec;
using View = support::HostMhaPrefillCase::View;

constexpr uint16_t kPoison = 0x7fc0;

// What a correct GPU call leaves: the reference rounded to the dtype in the rows that must be
// written, the poison everywhere else.
struct Call {
  std::vector<uint16_t> dq, dk, dv;
};

Call correct_call(const HostMhaBackwardCase& c, const MhaBackwardReference& ref) {
  const support::MhaPrefillSpec& s = c.fwd.spec;
  Call call{std::vector<uint16_t>(c.dq_stored, kPoison), std::vector<uint16_t>(c.dk_stored, kPoison),
            std::vector<uint16_t>(c.dv_stored, kPoison)};
  auto put = [&](std::vector<uint16_t>& buf, const View& v, int heads, int d, int64_t rows,
                 const std::vector<float>& r) {
    for (int64_t t = 0; t < rows; ++t) {
      for (int h = 0; h < heads; ++h) {
        for (int x = 0; x < d; ++x) buf[v.at(t, h, x)] = support::to_half_bits(r[(t * heads + h) * d + x], s.dtype);
      }
    }
  };
  put(call.dq, c.dq_view, s.h_q, s.d_qk, c.fwd.cu_q.back(), ref.dq);
  put(call.dk, c.dk_view, s.h_kv, s.d_qk, c.fwd.cu_k.back(), ref.dk);
  put(call.dv, c.dv_view, s.h_kv, s.d_v, c.fwd.cu_k.back(), ref.dv);
  return call;
}

std::string check(const HostMhaBackwardCase& c, const MhaBackwardReference& ref, const Call& call) {
  return support::check_mha_backward_outputs(c, ref, call.dq, call.dk, call.dv, kPoison);
}

bool all_nan(const std::vector<float>& v, int64_t from) {
  for (size_t i = static_cast<size_t>(from); i < v.size(); ++i) {
    if (!std::isnan(v[i])) return false;
  }
  return true;
}

bool all_finite(const std::vector<float>& v, int64_t to) {
  for (int64_t i = 0; i < to; ++i) {
    if (!std::isfinite(v[static_cast<size_t>(i)])) return false;
  }
  return true;
}

// Sequences: 3 x 5, queries without keys, keys without queries, causal Lq 6 > Lk 2 (rows 0..3
// see nothing), 1 x 1; rows of no sequence on both sides.
MhaBackwardSpec mixed_spec(bool padded, DType dtype) {
  MhaBackwardSpec s = mha_backward_spec({{3, 4, 0, 6, 1}, {5, 0, 3, 2, 1}}, 4, 2, 64, 64, true, 11);
  s.problem.tail_q = 3;
  s.problem.tail_k = 2;
  s.problem.dtype = dtype;
  if (padded) support::pad_all_views(&s);
  return s;
}

TEST(MhaBackwardCase, InputsAreNanExactlyOutsideTheSequencesAndOutIsTheRoundedForward) {
  const HostMhaBackwardCase c = support::make_mha_backward_case(mixed_spec(true, DType::kFP16));
  const support::MhaPrefillSpec& s = c.fwd.spec;
  const int64_t rows = c.fwd.cu_q.back();
  ASSERT_EQ(rows, 14);
  ASSERT_EQ(c.fwd.total_q, 17);
  EXPECT_EQ(static_cast<int64_t>(c.dout.size()),
            c.dout_view.offset + (17 + support::kMhaGuardRows) * c.dout_view.token_stride);
  // dout: finite on the rows of a sequence (their d_v columns), NaN in every other element.
  std::vector<bool> inside(c.dout.size(), false);
  for (int64_t t = 0; t < rows; ++t) {
    for (int h = 0; h < s.h_q; ++h) {
      for (int d = 0; d < s.d_v; ++d) inside[c.dout_view.at(t, h, d)] = true;
    }
  }
  for (size_t i = 0; i < c.dout.size(); ++i) {
    ASSERT_EQ(std::isfinite(support::from_half_bits(c.dout[i], s.dtype)), inside[i]) << "dout element " << i;
  }
  // out and lse: the reference forward's, rounded (out) and as float32 (lse).
  const support::MhaPrefillReference fwd = support::run_mha_prefill_reference(c.fwd);
  for (int64_t t = 0; t < c.fwd.total_q; ++t) {
    for (int h = 0; h < s.h_q; ++h) {
      for (int d = 0; d < s.d_v; ++d) {
        const uint16_t want = t < rows ? support::to_half_bits(fwd.out[(t * s.h_q + h) * s.d_v + d], s.dtype) : 0x7e00;
        ASSERT_EQ(c.out[c.fwd.out_at(t, h, d)], want) << "out row " << t;
      }
      const float lse = host::bits_to_float(c.lse[c.fwd.lse_at(h, t)]);
      if (t < rows) {
        ASSERT_EQ(lse, fwd.lse[h * c.fwd.total_q + t]) << "lse row " << t;
      } else {
        ASSERT_TRUE(std::isnan(lse)) << "lse row " << t;
      }
    }
  }
  // Queries 3..6 have no keys, queries 7..10 see none (causal 6 x 2): lse +inf, out 0.
  for (int64_t t : {3, 4, 5, 6, 7, 8, 9, 10}) EXPECT_TRUE(std::isinf(host::bits_to_float(c.lse[c.fwd.lse_at(0, t)])));
  EXPECT_TRUE(std::isfinite(host::bits_to_float(c.lse[c.fwd.lse_at(0, 11)])));
  // The same seed gives the forward case's q and k, and its v times v_scale (exactly).
  const support::HostMhaPrefillCase same = support::make_mha_prefill_case(c.spec.problem);
  EXPECT_EQ(same.q, c.fwd.q);
  EXPECT_EQ(same.k, c.fwd.k);
  ASSERT_EQ(same.v.size(), c.fwd.v.size());
  const float scale = c.spec.v_scale;
  ASSERT_EQ(scale, 8.f);
  for (size_t i = 0; i < same.v.size(); ++i) {
    const float x = support::from_half_bits(same.v[i], s.dtype), y = support::from_half_bits(c.fwd.v[i], s.dtype);
    ASSERT_TRUE(std::isnan(x) ? std::isnan(y) : y == scale * x) << "v element " << i;
  }
  MhaBackwardSpec odd = c.spec;
  odd.v_scale = 3.f;
  EXPECT_THROW(support::make_mha_backward_case(odd), std::invalid_argument);
}

TEST(MhaBackwardCase, ReferenceIsFiniteExactlyInsideTheSequences) {
  const HostMhaBackwardCase c = support::make_mha_backward_case(mixed_spec(false, DType::kBF16));
  const MhaBackwardReference ref = support::run_mha_backward_reference(c);
  const support::MhaPrefillSpec& s = c.fwd.spec;
  const int64_t rows_q = c.fwd.cu_q.back(), rows_k = c.fwd.cu_k.back();
  EXPECT_TRUE(all_finite(ref.dq, rows_q * s.h_q * s.d_qk));
  EXPECT_TRUE(all_nan(ref.dq, rows_q * s.h_q * s.d_qk));
  EXPECT_TRUE(all_finite(ref.dk, rows_k * s.h_kv * s.d_qk));
  EXPECT_TRUE(all_nan(ref.dk, rows_k * s.h_kv * s.d_qk));
  EXPECT_TRUE(all_finite(ref.dv, rows_k * s.h_kv * s.d_v));
  EXPECT_TRUE(all_nan(ref.dv, rows_k * s.h_kv * s.d_v));
  // Keys 5..7 belong to the sequence without queries: dk = dv = 0.
  for (int64_t j = 5; j < 8; ++j) {
    for (int i = 0; i < s.h_kv * s.d_v; ++i) EXPECT_EQ(ref.dv[j * s.h_kv * s.d_v + i], 0.f) << "key row " << j;
  }
}

TEST(MhaBackwardCase, CheckPassesTheRoundedReferenceInEveryLayout) {
  for (bool padded : {false, true}) {
    for (DType dtype : {DType::kBF16, DType::kFP16}) {
      SCOPED_TRACE(std::string(padded ? "padded" : "contiguous") + (dtype == DType::kBF16 ? " bf16" : " fp16"));
      const HostMhaBackwardCase c = support::make_mha_backward_case(mixed_spec(padded, dtype));
      const MhaBackwardReference ref = support::run_mha_backward_reference(c);
      EXPECT_EQ(check(c, ref, correct_call(c, ref)), "");
    }
  }
  // q, k, v slices of one packed buffer, GQA 4, a head-dim pair with d_qk != d_v elsewhere.
  MhaBackwardSpec packed = mha_backward_spec({{70, 0, 33}, {70, 0, 33}}, 8, 2, 128, 128, true, 12);
  packed.problem.packed_qkv = true;
  packed.problem.tail_q = packed.problem.tail_k = 4;
  MhaBackwardSpec wide = mha_backward_spec({{40, 9}, {20, 70}}, 4, 1, 192, 128, false, 13);
  wide.problem.softmax_scale = 0.3f;
  wide.problem.key_ramp = 3;
  for (const MhaBackwardSpec& spec : {packed, wide}) {
    SCOPED_TRACE(support::describe(spec));
    const HostMhaBackwardCase c = support::make_mha_backward_case(spec);
    const MhaBackwardReference ref = support::run_mha_backward_reference(c);
    EXPECT_EQ(check(c, ref, correct_call(c, ref)), "");
  }
}

TEST(MhaBackwardCase, CheckNamesEveryKindOfWrongCall) {
  const HostMhaBackwardCase c = support::make_mha_backward_case(mixed_spec(true, DType::kBF16));
  const MhaBackwardReference ref = support::run_mha_backward_reference(c);
  const support::MhaPrefillSpec& s = c.fwd.spec;
  const Call good = correct_call(c, ref);
  ASSERT_EQ(check(c, ref, good), "");
  struct Wrong {
    const char* what;
    void (*mutate)(const HostMhaBackwardCase&, Call*);
    const char* expected;  // a part of the message
  };
  const Wrong wrongs[] = {
      {"a dq row of no sequence written",
       [](const HostMhaBackwardCase& k, Call* x) { x->dq[k.dq_view.at(15, 1, 3)] = 0; }, "in no sequence"},
      {"dk padding written",
       [](const HostMhaBackwardCase& k, Call* x) { x->dk[k.dk_view.at(2, 0, 64)] = 0; }, "padding of row 2"},
      {"a dv guard row written",
       [](const HostMhaBackwardCase& k, Call* x) { x->dv[k.dv_view.at(k.fwd.total_k + 3, 0, 0)] = 0; },
       "guard row 3 past the tensor"},
      {"a dq element unwritten",
       [](const HostMhaBackwardCase& k, Call* x) { x->dq[k.dq_view.at(1, 2, 7)] = kPoison; }, "dq["},
      {"a dk element wrong",
       [](const HostMhaBackwardCase& k, Call* x) {
         uint16_t& e = x->dk[k.dk_view.at(0, 1, 5)];
         e = support::to_half_bits(support::from_half_bits(e, DType::kBF16) * 1.5f + 0.01f, DType::kBF16);
       },
       "dk["},
      {"dv off by 1.2% everywhere",
       [](const HostMhaBackwardCase& k, Call* x) {
         for (int64_t t = 0; t < k.fwd.cu_k.back(); ++t) {
           for (int h = 0; h < k.fwd.spec.h_kv; ++h) {
             for (int d = 0; d < k.fwd.spec.d_v; ++d) {
               uint16_t& e = x->dv[k.dv_view.at(t, h, d)];
               e = support::to_half_bits(support::from_half_bits(e, DType::kBF16) * 1.012f, DType::kBF16);
             }
           }
         }
       },
       "cosine difference"},
      {"dq of a query that sees no key not 0",
       [](const HostMhaBackwardCase& k, Call* x) { x->dq[k.dq_view.at(8, 0, 0)] = 0x3a00; }, "must be exactly 0"},
      {"dk of a key no query sees not 0",
       [](const HostMhaBackwardCase& k, Call* x) { x->dk[k.dk_view.at(6, 1, 1)] = 0x0001; }, "must be exactly 0"},
      {"dv NaN", [](const HostMhaBackwardCase& k, Call* x) { x->dv[k.dv_view.at(9, 0, 9)] = 0x7fc1; }, "dv["},
  };
  for (const Wrong& w : wrongs) {
    SCOPED_TRACE(w.what);
    Call call = good;
    w.mutate(c, &call);
    const std::string bad = check(c, ref, call);
    EXPECT_NE(bad.find(w.expected), std::string::npos) << bad;
  }
  // -0 is a zero.
  Call signed_zero = good;
  for (int d = 0; d < s.d_qk; ++d) signed_zero.dq[c.dq_view.at(8, 0, d)] = 0x8000;
  EXPECT_EQ(check(c, ref, signed_zero), "");
}

TEST(MhaBackwardCase, RecutKeepsTheBuffersAndPoisonsTheFreedRows) {
  MhaBackwardSpec spec = mha_backward_spec({{30, 20, 10}, {40, 20, 5}}, 4, 2, 64, 64, true, 14);
  spec.problem.tail_q = spec.problem.tail_k = 3;
  const HostMhaBackwardCase c = support::make_mha_backward_case(spec);
  const HostMhaBackwardCase r = support::recut_mha_backward_case(c, {10, 25, 5}, {20, 30, 0});
  EXPECT_EQ(r.fwd.total_q, c.fwd.total_q);
  EXPECT_EQ(r.fwd.total_k, c.fwd.total_k);
  EXPECT_EQ(r.fwd.max_seqlen_q, c.fwd.max_seqlen_q);
  EXPECT_EQ(r.fwd.cu_q, (std::vector<int32_t>{0, 10, 35, 40}));
  EXPECT_EQ(r.fwd.cu_k, (std::vector<int32_t>{0, 20, 50, 50}));
  EXPECT_EQ(r.dout.size(), c.dout.size());
  EXPECT_EQ(r.out.size(), c.out.size());
  EXPECT_TRUE(std::isnan(host::bf16_to_float(r.fwd.q[r.fwd.q_view.at(45, 1, 0)])));
  EXPECT_TRUE(std::isnan(host::bf16_to_float(r.fwd.k[r.fwd.k_view.at(55, 0, 0)])));
  EXPECT_TRUE(std::isnan(host::bf16_to_float(r.dout[r.dout_view.at(40, 0, 0)])));
  EXPECT_EQ(r.dout[r.dout_view.at(39, 3, 63)], c.dout[c.dout_view.at(39, 3, 63)]);
  const MhaBackwardReference ref = support::run_mha_backward_reference(r);
  EXPECT_EQ(check(r, ref, correct_call(r, ref)), "");
  // The old call's gradients do not pass the new lengths.
  const MhaBackwardReference old_ref = support::run_mha_backward_reference(c);
  EXPECT_NE(check(r, ref, correct_call(c, old_ref)), "");
  EXPECT_THROW(support::recut_mha_backward_case(c, {60, 0, 5}, {1, 1, 1}), std::invalid_argument);
  EXPECT_THROW(support::recut_mha_backward_case(c, {10, 10}, {1, 1}), std::invalid_argument);
}

TEST(MhaBackwardCase, EmptyProblems) {
  // total_q = 0: dk and dv of the keys inside sequences are 0; h_q = 0: likewise.
  MhaBackwardSpec no_rows = mha_backward_spec({{0, 0}, {5, 3}}, 4, 2, 128, 128, false, 15);
  no_rows.problem.tail_k = 2;
  MhaBackwardSpec no_heads = mha_backward_spec({{3, 4}, {3, 4}}, 0, 1, 64, 64, true, 16);
  no_heads.problem.q_pad.token_pad = no_heads.problem.out_pad.token_pad = 8;
  no_heads.dout_pad.token_pad = no_heads.dq_pad.token_pad = 8;
  MhaBackwardSpec no_batch = mha_backward_spec({{}, {}}, 4, 2, 64, 64, true, 17);
  no_batch.problem.tail_q = 5;
  no_batch.problem.tail_k = 4;
  for (const MhaBackwardSpec& spec : {no_rows, no_heads, no_batch}) {
    SCOPED_TRACE(support::describe(spec));
    const HostMhaBackwardCase c = support::make_mha_backward_case(spec);
    const MhaBackwardReference ref = support::run_mha_backward_reference(c);
    const Call good = correct_call(c, ref);
    EXPECT_EQ(check(c, ref, good), "");
    if (c.fwd.cu_k.back() > 0) {
      Call unwritten = good;
      unwritten.dk[c.dk_view.at(0, 0, 0)] = kPoison;
      EXPECT_NE(check(c, ref, unwritten), "");
    } else {
      EXPECT_EQ(check(c, ref, Call{std::vector<uint16_t>(c.dq_stored, kPoison),
                                   std::vector<uint16_t>(c.dk_stored, kPoison),
                                   std::vector<uint16_t>(c.dv_stored, kPoison)}),
                "");
    }
  }
}

}  // namespace
}  // namespace mlakit
