// GPU unit test of the shared rotary code (src/common/rotary.h): the device's rotary_exp,
// rotary_sincos, rope_cos_sin and rope_rotate give the host's bits on random and edge inputs
// (positions up to 2^31, every rotary dim shape, thetas from 1.5 to 1e7, negative positions).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/rotary.h"
#include "gpu_test_util.h"

namespace mlakit::testing {
namespace {

struct RopeInput {
  int64_t pos;
  int c, rotary_dim;
  double log_theta;
  float x, partner;
  double t, angle;  // rotary_exp(t), rotary_sincos(angle)
};

struct RopeOutput {
  float cos, sin, first, second;
  double exp, sin64, cos64;
};

__global__ void evaluate(const RopeInput* in, RopeOutput* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const RopeInput a = in[i];
  RopeOutput r;
  detail::rope_cos_sin(a.pos, a.c, a.rotary_dim, a.log_theta, &r.cos, &r.sin);
  r.first = detail::rope_rotate(a.x, a.partner, r.cos, r.sin, true);
  r.second = detail::rope_rotate(a.x, a.partner, r.cos, r.sin, false);
  r.exp = detail::rotary_exp(a.t);
  detail::rotary_sincos(a.angle, &r.sin64, &r.cos64);
  out[i] = r;
}

RopeOutput on_host(const RopeInput& a) {
  RopeOutput r;
  detail::rope_cos_sin(a.pos, a.c, a.rotary_dim, a.log_theta, &r.cos, &r.sin);
  r.first = detail::rope_rotate(a.x, a.partner, r.cos, r.sin, true);
  r.second = detail::rope_rotate(a.x, a.partner, r.cos, r.sin, false);
  r.exp = detail::rotary_exp(a.t);
  detail::rotary_sincos(a.angle, &r.sin64, &r.cos64);
  return r;
}

template <typename T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

TEST(RotaryGpu, DeviceGivesTheHostsBits) {
  MLAKIT_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const double thetas[] = {1.5, 500.0, 10000.0, 1e6, 5e5 + 0.25, 1e7};
  std::vector<RopeInput> in;
  for (int i = 0; i < 200000; ++i) {
    RopeInput a;
    a.rotary_dim = 2 * (1 + static_cast<int>(rng() % 128));
    a.c = static_cast<int>(rng() % (a.rotary_dim / 2));
    a.pos = i % 4 == 0   ? static_cast<int64_t>(rng() % 4096)
            : i % 4 == 1 ? static_cast<int64_t>(rng() % (int64_t{1} << 31))
            : i % 4 == 2 ? -static_cast<int64_t>(rng() % (int64_t{1} << 20))
                         : (int64_t{1} << 20) - static_cast<int64_t>(rng() % 64);
    a.log_theta = detail::rope_log_theta(thetas[rng() % 6]);
    a.x = static_cast<float>(unit(rng) * 8 - 4);
    a.partner = static_cast<float>(unit(rng) * 8 - 4);
    a.t = unit(rng) * 1400 - 700;
    a.angle = std::ldexp(unit(rng), static_cast<int>(rng() % 60) - 8) * (i % 2 ? 1 : -1);
    in.push_back(a);
  }
  in.push_back({0, 0, 128, 0.0, 1.f, 2.f, 0.0, 0.0});
  in.push_back({1, 63, 128, std::log(10000.0), -0.f, 0.f, 708.5, 0x1p50});
  in.push_back({-1, 1, 2, std::log(2.0), 1e-30f, -1e30f, -708.5, -0x1p50});

  const int n = static_cast<int>(in.size());
  DeviceBuffer d_in(in), d_out(in.size() * sizeof(RopeOutput));
  evaluate<<<(n + 255) / 256, 256>>>(static_cast<const RopeInput*>(d_in.get()), static_cast<RopeOutput*>(d_out.get()),
                                     n);
  MLAKIT_ASSERT_CUDA(cudaGetLastError());
  MLAKIT_ASSERT_CUDA(cudaDeviceSynchronize());
  const std::vector<RopeOutput> got = d_out.download<RopeOutput>();
  for (int i = 0; i < n; ++i) {
    const RopeOutput want = on_host(in[i]);
    const RopeInput& a = in[i];
    ASSERT_TRUE(same_bits(got[i].cos, want.cos) && same_bits(got[i].sin, want.sin))
        << "rope_cos_sin: pos " << a.pos << " c " << a.c << " r " << a.rotary_dim << " log_theta " << a.log_theta;
    ASSERT_TRUE(same_bits(got[i].first, want.first) && same_bits(got[i].second, want.second))
        << "rope_rotate: x " << a.x << " partner " << a.partner << " cos " << want.cos << " sin " << want.sin;
    ASSERT_TRUE(same_bits(got[i].exp, want.exp)) << "rotary_exp(" << a.t << ")";
    ASSERT_TRUE(same_bits(got[i].sin64, want.sin64) && same_bits(got[i].cos64, want.cos64))
        << "rotary_sincos(" << a.angle << ")";
  }
}

}  // namespace
}  // namespace mlakit::testing
