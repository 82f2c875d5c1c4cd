// Shared by the dense decode's validation tests (validation_test.cpp,
// validation_entry_test.cpp): a valid small problem on host memory and its checks.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "host/device.h"
#include "host/mla_decode_validate.h"
#include "mlakit/mla_decode.h"
#include "support/decode_case.h"

namespace mlakit::testing {

inline bool has_device() {
  detail::DeviceInfo info;
  return detail::current_device_info(&info).is_ok();
}

// A valid, small problem on host memory: b 2, s_q 2, h_q 4, h_kv 2, page 16.
struct ValidArgs {
  ValidArgs()
      : c(support::make_decode_case({.seqlens = {20, 5}, .s_q = 2, .h_q = 4, .h_kv = 2,
                                     .page_size = 16, .seed = 3})),
        out(c.out_elems(), 0x7fc0),
        lse(c.lse_elems(), NAN),
        args(c.args(c.q.data(), c.kv.data(), c.block_table.data(), c.seqlens.data(), out.data(),
                    lse.data())) {}
  ValidArgs(const ValidArgs&) = delete;  // args point into this object's buffers
  ValidArgs& operator=(const ValidArgs&) = delete;
  support::HostDecodeCase c;
  std::vector<uint16_t> out;
  std::vector<float> lse;
  MlaDecodeArgs args;
};

inline Status validate(const MlaDecodeArgs& a) {
  MlaDecodeProblem p;
  return detail::validate_mla_decode_args("mla_decode", a, &p);
}

// A valid problem of the range every kernel supports.
inline MlaDecodeProblem good_problem() {
  return MlaDecodeProblem{.b = 4, .s_q = 1, .h_q = 128, .h_kv = 1, .d_qk = 576, .d_v = 512};
}

}  // namespace mlakit::testing
