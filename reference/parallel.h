// Runs f(i) for i in [0, n) on up to num_threads threads (0: hardware concurrency), for the
// CPU references. The calling thread works too, and indices are handed out one at a time,
// so any number of threads covers [0, n) exactly once: when a thread cannot be created
// (thread limit, address space for its stack) the work runs on the threads that exist, down
// to the calling thread alone, instead of failing. Each f(i) writes its own outputs, so the
// results do not depend on which thread ran which index.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>
#include <vector>

namespace mlakit::reference {

// Returns the number of threads that took part (the calling thread included). An exception
// thrown by f stops the remaining work and is rethrown in the calling thread once every
// thread has joined (the first one if several threw).
template <typename F>
int parallel_for(int64_t n, int num_threads, F f) {
  const int wanted = num_threads > 0 ? num_threads : static_cast<int>(std::thread::hardware_concurrency());
  const int threads = static_cast<int>(std::clamp<int64_t>(wanted, 1, std::max<int64_t>(n, 1)));

  std::atomic<int64_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  auto work = [&] {
    try {
      for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) f(i);
    } catch (...) {
      next.store(n);  // the others stop after their current index
      const std::lock_guard<std::mutex> lock(failure_mutex);
      if (!failure) failure = std::current_exception();
    }
  };

  std::vector<std::thread> helpers;
  try {
    helpers.reserve(static_cast<std::size_t>(threads - 1));
    for (int w = 1; w < threads; ++w) helpers.emplace_back(work);
  } catch (const std::system_error&) {  // no more threads: the ones created share the work
  } catch (const std::bad_alloc&) {
  }
  work();
  for (std::thread& t : helpers) t.join();
  if (failure) std::rethrow_exception(failure);
  return static_cast<int>(helpers.size()) + 1;
}

}  // namespace mlakit::reference
