// reference::merge_states (docs/contract.md): empty states, order independence,
// associativity, agreement with a softmax over the union of two key sets, huge LSEs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "mlakit/reference.h"

namespace mlakit::reference {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct State {
  std::vector<double> o;
  double lse;
};

State merge(const State& a, const State& b) {
  State r{std::vector<double>(a.o.size(), -7.0), -7.0};  // poisoned
  const Status s = merge_states(a.o.data(), a.lse, b.o.data(), b.lse, static_cast<int64_t>(a.o.size()),
                                r.o.data(), &r.lse);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return r;
}

// Attention of one query over keys with the given logits and value rows, from the
// definition: weights exp(z - max) / sum, lse = log(sum exp z).
State softmax_state(const std::vector<double>& logits, const std::vector<std::vector<double>>& v) {
  const size_t d = v.empty() ? 0 : v[0].size();
  double m = -kInf;
  for (double z : logits) m = std::max(m, z);
  double sum = 0;
  std::vector<double> o(d, 0.0);
  for (size_t j = 0; j < logits.size(); ++j) {
    const double w = std::exp(logits[j] - m);
    sum += w;
    for (size_t k = 0; k < d; ++k) o[k] += w * v[j][k];
  }
  for (double& x : o) x /= sum;
  return State{o, m + std::log(sum)};
}

State random_state(std::mt19937_64& rng, size_t d, double lse_spread = 5.0) {
  std::normal_distribution<double> normal(0.0, 1.0);
  State s{std::vector<double>(d), lse_spread * normal(rng)};
  for (double& x : s.o) x = normal(rng);
  return s;
}

void expect_near_state(const State& got, const State& want, double tol) {
  ASSERT_EQ(got.o.size(), want.o.size());
  if (std::isinf(want.lse)) {
    EXPECT_EQ(got.lse, want.lse);
  } else {
    EXPECT_NEAR(got.lse, want.lse, tol * std::max(1.0, std::fabs(want.lse)));
  }
  for (size_t k = 0; k < want.o.size(); ++k) {
    EXPECT_NEAR(got.o[k], want.o[k], tol * std::max(1.0, std::fabs(want.o[k]))) << "o[" << k << "]";
  }
}

TEST(MergeStates, EmptyStateIsAnIdentity) {
  std::mt19937_64 rng(11);
  for (double empty_lse : {-kInf, kInf}) {
    const State a = random_state(rng, 33);
    const State empty{std::vector<double>(33, 123.0), empty_lse};  // its o must be ignored
    const State ab = merge(a, empty);
    const State ba = merge(empty, a);
    EXPECT_EQ(ab.lse, a.lse);
    EXPECT_EQ(ba.lse, a.lse);
    EXPECT_EQ(ab.o, a.o);
    EXPECT_EQ(ba.o, a.o);
  }
}

TEST(MergeStates, TwoEmptyStatesGiveAnEmptyState) {
  for (double la : {-kInf, kInf}) {
    for (double lb : {-kInf, kInf}) {
      const State a{std::vector<double>(8, std::nan("")), la};  // garbage o of empty states
      const State b{std::vector<double>(8, 5.0), lb};
      const State r = merge(a, b);
      EXPECT_EQ(r.lse, kInf) << la << " " << lb;
      for (double x : r.o) EXPECT_EQ(x, 0.0);
    }
  }
}

TEST(MergeStates, OrderIndependent) {
  std::mt19937_64 rng(12);
  for (int trial = 0; trial < 200; ++trial) {
    const State a = random_state(rng, 17, 20.0), b = random_state(rng, 17, 20.0);
    expect_near_state(merge(a, b), merge(b, a), 1e-14);
  }
}

TEST(MergeStates, Associative) {
  std::mt19937_64 rng(13);
  for (int trial = 0; trial < 200; ++trial) {
    const State a = random_state(rng, 17, 20.0), b = random_state(rng, 17, 20.0),
                c = random_state(rng, 17, 20.0);
    expect_near_state(merge(merge(a, b), c), merge(a, merge(b, c)), 1e-12);
  }
}

TEST(MergeStates, HalvesOfASplitSoftmaxMergeIntoTheWhole) {
  std::mt19937_64 rng(14);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (int trial = 0; trial < 100; ++trial) {
    const int n = std::uniform_int_distribution<int>(2, 300)(rng);
    const int d = std::uniform_int_distribution<int>(1, 64)(rng);
    const double logit_scale = std::vector<double>{0.1, 1.0, 10.0, 100.0}[trial % 4];
    std::vector<double> logits(n);
    std::vector<std::vector<double>> v(n, std::vector<double>(d));
    for (int j = 0; j < n; ++j) {
      logits[j] = logit_scale * normal(rng);
      for (double& x : v[j]) x = normal(rng);
    }
    const int cut = std::uniform_int_distribution<int>(1, n - 1)(rng);
    const std::vector<double> z1(logits.begin(), logits.begin() + cut), z2(logits.begin() + cut, logits.end());
    const std::vector<std::vector<double>> v1(v.begin(), v.begin() + cut), v2(v.begin() + cut, v.end());
    const State whole = softmax_state(logits, v);
    expect_near_state(merge(softmax_state(z1, v1), softmax_state(z2, v2)), whole, 1e-12);
    // Several pieces merged left to right, as a split-KV combine does.
    State acc{std::vector<double>(d, 0.0), -kInf};
    for (int begin = 0; begin < n; begin += 7) {
      const int end = std::min(n, begin + 7);
      acc = merge(acc, softmax_state({logits.begin() + begin, logits.begin() + end},
                                     {v.begin() + begin, v.begin() + end}));
    }
    expect_near_state(acc, whole, 1e-12);
  }
}

TEST(MergeStates, HugeLsesDoNotOverflow) {
  const State a{{1.0, -2.0}, 1e4}, b{{3.0, 4.0}, 1e4 + 1};
  const State r = merge(a, b);
  const double wa = 1.0 / (1.0 + std::exp(1.0)), wb = 1.0 - wa;
  EXPECT_NEAR(r.lse, 1e4 + 1 + std::log1p(std::exp(-1.0)), 1e-9);
  EXPECT_NEAR(r.o[0], wa * 1.0 + wb * 3.0, 1e-14);
  EXPECT_NEAR(r.o[1], wa * -2.0 + wb * 4.0, 1e-14);
  // Very negative LSEs (tiny probabilities) do not underflow to 0/0.
  const State c{{1.0, 1.0}, -1e4}, d{{3.0, 3.0}, -1e4 - 2};
  const State s = merge(c, d);
  EXPECT_TRUE(std::isfinite(s.lse));
  EXPECT_NEAR(s.o[0], (1.0 + 3.0 * std::exp(-2.0)) / (1.0 + std::exp(-2.0)), 1e-14);
  // A negligible partner leaves the dominant state unchanged.
  const State e{{5.0}, 800.0}, f{{-5.0}, -800.0};
  const State t = merge(e, f);
  EXPECT_EQ(t.lse, 800.0);
  EXPECT_EQ(t.o[0], 5.0);
}

TEST(MergeStates, NeverNanOnFiniteInputs) {
  std::mt19937_64 rng(15);
  std::uniform_real_distribution<double> lse_dist(-1e300, 1e300);
  const double lses[] = {0.0, -0.0, 1e-300, -1e308, 1e308, std::numeric_limits<double>::max(),
                         -std::numeric_limits<double>::max()};
  for (double la : lses) {
    for (double lb : lses) {
      const State r = merge(State{{1.0, -1.0}, la}, State{{2.0, 0.5}, lb});
      EXPECT_FALSE(std::isnan(r.lse)) << la << " " << lb;
      for (double x : r.o) EXPECT_FALSE(std::isnan(x)) << la << " " << lb;
    }
  }
  for (int trial = 0; trial < 1000; ++trial) {
    const State r = merge(State{{1.0, 2.0}, lse_dist(rng)}, State{{-3.0, 4.0}, lse_dist(rng)});
    ASSERT_FALSE(std::isnan(r.lse));
    ASSERT_FALSE(std::isnan(r.o[0]));
    ASSERT_FALSE(std::isnan(r.o[1]));
  }
}

TEST(MergeStates, OutputMayAliasAnInput) {
  std::mt19937_64 rng(16);
  const State a = random_state(rng, 9), b = random_state(rng, 9);
  const State want = merge(a, b);
  State x = a;
  ASSERT_TRUE(merge_states(x.o.data(), x.lse, b.o.data(), b.lse, 9, x.o.data(), &x.lse));
  EXPECT_EQ(x.o, want.o);
  EXPECT_EQ(x.lse, want.lse);
  State y = b;
  ASSERT_TRUE(merge_states(a.o.data(), a.lse, y.o.data(), y.lse, 9, y.o.data(), &y.lse));
  EXPECT_EQ(y.o, want.o);
}

}  // namespace
}  // namespace mlakit::reference
