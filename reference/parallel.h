// Runs f(i) for i in [0, n) on up to num_threads threads (0: hardware concurrency), each
// thread taking every num_threads-th index. For the CPU references.
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace mlakit::reference {

template <typename F>
void parallel_for(int64_t n, int num_threads, F f) {
  int threads = num_threads > 0 ? num_threads : static_cast<int>(std::thread::hardware_concurrency());
  threads = static_cast<int>(std::clamp<int64_t>(threads, 1, std::max<int64_t>(n, 1)));
  std::vector<std::thread> pool;
  for (int w = 0; w < threads; ++w) {
    pool.emplace_back([&, w] {
      for (int64_t i = w; i < n; i += threads) f(i);
    });
  }
  for (auto& th : pool) th.join();
}

}  // namespace mlakit::reference
