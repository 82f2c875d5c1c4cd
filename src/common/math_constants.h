// log2(e) and ln(2), spelled once for the host (the dispatch's base-2 softmax scale, the
// float64 reference) and the device (device/numeric.cuh takes its float copies from here).
// double: the reference computes in float64; float users round once, static_cast<float>,
// which gives the nearest float of each (the value the former float literals had).
#pragma once

namespace mlakit::detail {

inline constexpr double kLog2e = 1.4426950408889634;  // log2(e) = 1 / ln(2)
inline constexpr double kLn2 = 0.6931471805599453;    // ln(2)

}  // namespace mlakit::detail
