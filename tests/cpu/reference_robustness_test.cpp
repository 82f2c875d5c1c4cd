// The CPU references on inputs that used to crash them: lengths far past the block table,
// host memory that cannot be allocated, threads that cannot be created, host arrays at
// unaligned addresses, and merge_states' pointers and d. Each ends in the documented result
// or a Status naming the argument, never an abort.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <new>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <vector>

#include "cpu_test_util.h"
#include "mlakit/fp8_cache.h"
#include "mlakit/mla_sparse_decode.h"
#include "mlakit/reference.h"
#include "reference/guarded.h"
#include "reference/parallel.h"
#include "support/decode_case.h"
#include "support/sparse_decode_case.h"

namespace mlakit {
namespace {

using testing::IsInvalid;
using testing::StatusIs;

constexpr int kDqk = 576;
constexpr int kDv = 512;
constexpr uint16_t kOne = 0x3f80;  // 1.0 in bf16

// A dense decode of b sequences over a 2-block, page-16 cache whose table rows list both
// blocks: lengths past 32 reach beyond the table's width.
struct TinyDecode {
  int64_t b;
  int s_q;
  int h_q = 2;
  std::vector<uint16_t> q, kv;
  std::vector<int32_t> table, seqlens;
  std::vector<float> out, lse;

  TinyDecode(std::vector<int32_t> lengths, int s_q_) : b(static_cast<int64_t>(lengths.size())), s_q(s_q_) {
    seqlens = std::move(lengths);
    q.assign(b * s_q * h_q * kDqk, kOne);
    kv.assign(2 * 16 * kDqk, kOne);
    for (int64_t i = 0; i < b; ++i) table.insert(table.end(), {0, 1});
    out.assign(b * s_q * h_q * kDv, -7.f);  // poisoned
    lse.assign(b * h_q * s_q, -7.f);
  }
  MlaDecodeArgs args(bool causal) {
    MlaDecodeArgs a;
    a.q = make_tensor(q.data(), DType::kBF16, {b, s_q, h_q, kDqk});
    a.kv_cache = make_tensor(kv.data(), DType::kBF16, {2, 16, 1, kDqk});
    a.block_table = make_tensor(table.data(), DType::kInt32, {b, 2});
    a.cache_seqlens = make_tensor(seqlens.data(), DType::kInt32, {b});
    a.out = make_tensor(out.data(), DType::kFP32, {b, s_q, h_q, kDv});
    a.lse = make_tensor(lse.data(), DType::kFP32, {b, h_q, s_q});
    a.causal = causal;
    return a;
  }
  // Every output and LSE element of sequence i is NaN (or, with `finite`, finite).
  bool sequence_is(int64_t i, bool finite) const {
    const int64_t rows = s_q * h_q;
    for (int64_t e = i * rows * kDv; e < (i + 1) * rows * kDv; ++e) {
      if (std::isfinite(out[e]) != finite || (!finite && !std::isnan(out[e]))) return false;
    }
    for (int64_t e = i * rows; e < (i + 1) * rows; ++e) {
      if (std::isfinite(lse[e]) != finite || (!finite && !std::isnan(lse[e]))) return false;
    }
    return true;
  }
};

TEST(ReferenceRobustness, DenseDecodeLengthFarPastTheTableIsNanRowsAtOnce) {
  for (const int32_t huge : {std::numeric_limits<int32_t>::max(), int32_t{1} << 28}) {
    for (const bool causal : {false, true}) {
      TinyDecode c({huge, 20, huge}, causal ? 2 : 1);
      const auto t0 = std::chrono::steady_clock::now();
      const Status s = reference::mla_decode(c.args(causal));
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      ASSERT_TRUE(s.is_ok()) << s.to_string();
      EXPECT_LT(seconds, 0.5) << "length " << huge;
      EXPECT_TRUE(c.sequence_is(0, /*finite=*/false)) << "length " << huge;
      EXPECT_TRUE(c.sequence_is(1, /*finite=*/true));
      EXPECT_TRUE(c.sequence_is(2, /*finite=*/false));
    }
  }
}

// Every row of a sequence whose table has an invalid entry inside its length is NaN; a
// causal row that stops before the entry is not.
TEST(ReferenceRobustness, DenseDecodeRowsStopAtTheFirstInvalidEntry) {
  TinyDecode c({20}, 2);
  c.table = {0, -1};
  ASSERT_TRUE(reference::mla_decode(c.args(/*causal=*/true)));
  // Row t = 0 sees 19 keys (block 1 needed: NaN), row t = 1 sees 20 (NaN).
  EXPECT_TRUE(c.sequence_is(0, /*finite=*/false));

  TinyDecode d({17}, 2);
  d.table = {0, 5};  // 5 >= num_blocks
  ASSERT_TRUE(reference::mla_decode(d.args(/*causal=*/true)));
  for (int h = 0; h < d.h_q; ++h) {
    EXPECT_TRUE(std::isfinite(d.lse[h * 2 + 0])) << "t = 0 sees 16 keys, all in block 0";
    EXPECT_TRUE(std::isnan(d.lse[h * 2 + 1])) << "t = 1 sees 17 keys, the last behind entry 5";
  }
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif

// Address space of this process now, in bytes (first field of /proc/self/statm, in pages).
uint64_t address_space_bytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t pages = 0;
  statm >> pages;
  return pages * static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE));
}

// In a child process (a death test): runs `a` with 256 MiB of address space left and exits 0
// when the reference answers ResourceExhausted.
[[noreturn]] void decode_with_little_address_space(const MlaDecodeArgs& a) {
  const rlimit limit{address_space_bytes() + (uint64_t{256} << 20), RLIM_INFINITY};
  if (setrlimit(RLIMIT_AS, &limit) != 0) std::_Exit(3);
  const Status s = reference::mla_decode(a, /*num_threads=*/1);
  const bool expected = StatusIs(s, StatusCode::kResourceExhausted, {"reference::mla_decode", "host memory"});
  if (!expected) std::fprintf(stderr, "got %s\n", s.to_string().c_str());
  std::_Exit(expected ? 0 : 1);
}

// A valid dense decode whose one row attends to 2^27 keys (1 GiB of float64 logits): 128 table
// entries of one 2^20-row page, all the same cache row (stride 0).
TEST(ReferenceRobustness, DenseDecodeHostMemoryExhaustedIsAStatus) {
  if (kAddressSanitizer) GTEST_SKIP() << "an address-space limit conflicts with ASan's shadow memory";
  std::vector<uint16_t> q(kDqk, kOne), kv(kDqk, kOne);
  std::vector<int32_t> table(128, 0), seqlens = {int32_t{1} << 27};
  std::vector<float> out(kDv), lse(1);
  MlaDecodeArgs a;
  a.q = make_tensor(q.data(), DType::kBF16, {1, 1, 1, kDqk});
  a.kv_cache = make_tensor(kv.data(), DType::kBF16, {1, int64_t{1} << 20, 1, kDqk}, {0, 0, 0, 1});
  a.block_table = make_tensor(table.data(), DType::kInt32, {1, 128});
  a.cache_seqlens = make_tensor(seqlens.data(), DType::kInt32, {1});
  a.out = make_tensor(out.data(), DType::kFP32, {1, 1, 1, kDv});
  a.lse = make_tensor(lse.data(), DType::kFP32, {1, 1, 1});
  EXPECT_EXIT(decode_with_little_address_space(a), ::testing::ExitedWithCode(0), "");
}

TEST(ReferenceRobustness, RunGuardedTurnsResourceExceptionsIntoStatus) {
  EXPECT_TRUE(reference::run_guarded("op", [] {}).is_ok());
  EXPECT_TRUE(StatusIs(reference::run_guarded("op", [] { throw std::bad_alloc(); }), StatusCode::kResourceExhausted,
                       {"op: host memory"}));
  EXPECT_TRUE(StatusIs(reference::run_guarded("op", [] { std::vector<double>(std::vector<double>().max_size() + 1); }),
                       StatusCode::kResourceExhausted, {"op: host memory"}));
  EXPECT_TRUE(StatusIs(reference::run_guarded("op",
                                              [] {
                                                throw std::system_error(
                                                    std::make_error_code(std::errc::resource_unavailable_try_again));
                                              }),
                       StatusCode::kResourceExhausted, {"op: host resources"}));
}

TEST(ReferenceRobustness, ParallelForCoversEveryIndexOnceAndRethrowsInTheCaller) {
  std::vector<std::atomic<int>> hits(1000);
  EXPECT_EQ(reference::parallel_for(1000, 4, [&](int64_t i) { ++hits[i]; }), 4);
  for (const auto& h : hits) ASSERT_EQ(h.load(), 1);
  EXPECT_EQ(reference::parallel_for(0, 4, [](int64_t) {}), 1);
  EXPECT_THROW(reference::parallel_for(100, 4, [](int64_t i) {
                 if (i == 57) throw std::bad_alloc();
               }),
               std::bad_alloc);
}

// Makes every new thread ask for a stack larger than any address space, so that thread
// creation fails, while it lives.
class ThreadCreationFails {
 public:
  ThreadCreationFails() {
    pthread_getattr_default_np(&saved_);
    pthread_attr_t huge;
    pthread_attr_init(&huge);
    pthread_attr_setstacksize(&huge, std::size_t{1} << 50);
    pthread_setattr_default_np(&huge);
    pthread_attr_destroy(&huge);
  }
  ~ThreadCreationFails() {
    pthread_setattr_default_np(&saved_);
    pthread_attr_destroy(&saved_);
  }
  static bool effective() {
    try {
      std::thread([] {}).join();
      return false;
    } catch (const std::system_error&) {
      return true;
    }
  }

 private:
  pthread_attr_t saved_;
};

TEST(ReferenceRobustness, ParallelForRunsOnTheCallingThreadWhenNoThreadCanBeCreated) {
  support::DecodeCaseSpec spec{.seqlens = {5, 70, 0, 33}, .s_q = 2, .h_q = 4, .page_size = 16, .causal = true};
  const support::HostDecodeCase c = support::make_decode_case(spec);
  const support::ReferenceResult want = support::run_reference(c, /*num_threads=*/4);

  std::vector<std::atomic<int>> hits(100);
  int used = 0;
  support::ReferenceResult got;
  {
    ThreadCreationFails no_threads;
    if (!ThreadCreationFails::effective()) GTEST_SKIP() << "this host created a thread with a 2^50-byte stack";
    used = reference::parallel_for(100, 8, [&](int64_t i) { ++hits[i]; });
    got = support::run_reference(c, /*num_threads=*/8);
  }
  EXPECT_EQ(used, 1);
  for (const auto& h : hits) ASSERT_EQ(h.load(), 1);
  EXPECT_EQ(0, std::memcmp(got.out.data(), want.out.data(), want.out.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(got.lse.data(), want.lse.data(), want.lse.size() * sizeof(float)));
}

// Copies of host arrays one byte past an aligned address (a caller's view may start anywhere).
class OddAddressArrays {
 public:
  template <typename T>
  T* copy(const std::vector<T>& v) {
    auto& bytes = storage_.emplace_back(v.size() * sizeof(T) + 1);
    std::memcpy(bytes.data() + 1, v.data(), v.size() * sizeof(T));
    return reinterpret_cast<T*>(bytes.data() + 1);
  }
  template <typename T>
  static std::vector<T> read(const T* p, std::size_t n) {
    std::vector<T> v(n);
    std::memcpy(v.data(), p, n * sizeof(T));
    return v;
  }

 private:
  std::vector<std::vector<unsigned char>> storage_;
};

TEST(ReferenceRobustness, DenseDecodeReadsAndWritesHostArraysAtOddAddresses) {
  for (const DType dtype : {DType::kFP16, DType::kBF16}) {
    support::DecodeCaseSpec spec{.seqlens = {5, 70, 33}, .s_q = 2, .h_q = 4, .page_size = 16, .dtype = dtype};
    const support::HostDecodeCase c = support::make_decode_case(spec);
    const support::ReferenceResult want = support::run_reference(c);

    OddAddressArrays odd;
    const std::vector<float> out0(c.out_elems()), lse0(c.lse_elems());
    float* out = odd.copy(out0);
    float* lse = odd.copy(lse0);
    MlaDecodeArgs a = c.args(odd.copy(c.q), odd.copy(c.kv), odd.copy(c.block_table), odd.copy(c.seqlens), out, lse);
    a.out.dtype = DType::kFP32;
    ASSERT_TRUE(reference::mla_decode(a));
    EXPECT_EQ(OddAddressArrays::read(out, out0.size()), want.out) << dtype_name(dtype);
    EXPECT_EQ(OddAddressArrays::read(lse, lse0.size()), want.lse) << dtype_name(dtype);
  }
}

TEST(ReferenceRobustness, SparseDecodeReadsAndWritesHostArraysAtOddAddresses) {
  support::HostSparseCase c = support::make_sparse_case({.b = 2, .s_q = 2, .h_q = 4, .topk = 64, .num_blocks = 3,
                                                         .page_size = 16, .with_topk_length = true, .with_sink = true,
                                                         .seed = 3});
  const support::SparseReferenceResult want = support::run_sparse_reference(c);

  OddAddressArrays odd;
  float* out = odd.copy(std::vector<float>(c.out_elems()));
  float* lse = odd.copy(std::vector<float>(c.lse_elems()));
  const MlaSparseDecodeArgs a = c.args(odd.copy(c.q), odd.copy(c.main.bytes), odd.copy(c.main.indices), odd.copy(c.main.lengths),
                                       odd.copy(c.sink), out, DType::kFP32, lse);
  ASSERT_TRUE(reference::mla_sparse_decode_fp8(a));
  EXPECT_EQ(OddAddressArrays::read(out, want.out.size()), want.out);
  EXPECT_EQ(OddAddressArrays::read(lse, want.lse.size()), want.lse);
}

// The cache tools share the kernels' 16-byte row alignment rule for rows (an error naming
// the tensor); the slots of an append may lie anywhere.
TEST(ReferenceRobustness, Fp8CacheToolsNameUnalignedRowsAndReadSlotsAtOddAddresses) {
  constexpr int64_t kRows = 2;
  std::vector<uint16_t> rows(kRows * kDqk);
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<uint16_t>(0x3c00 + (i * 37) % 512);
  std::vector<uint8_t> want(kRows * 656);
  ASSERT_TRUE(reference::quantize_mla_cache_fp8(make_tensor(rows.data(), DType::kBF16, {kRows, kDqk}),
                                                make_tensor(want.data(), DType::kUInt8, {kRows, 656})));

  OddAddressArrays odd;
  std::vector<uint8_t> got(want.size());
  EXPECT_TRUE(IsInvalid(reference::quantize_mla_cache_fp8(make_tensor(odd.copy(rows), DType::kBF16, {kRows, kDqk}),
                                                          make_tensor(got.data(), DType::kUInt8, {kRows, 656})),
                        {"src: expected a 16-byte aligned pointer"}));
  EXPECT_TRUE(IsInvalid(reference::dequantize_mla_cache_fp8(make_tensor(want.data(), DType::kUInt8, {kRows, 656}),
                                                            make_tensor(odd.copy(rows), DType::kBF16, {kRows, kDqk})),
                        {"dst: expected a 16-byte aligned pointer"}));

  // Slots at an odd address: slot 2 of a [1, 4] cache, and slot 7 past it (skipped).
  std::vector<uint8_t> cache(4 * 656, 0);
  ASSERT_TRUE(reference::append_mla_cache_fp8(make_tensor(rows.data(), DType::kBF16, {kRows, kDqk}),
                                              make_tensor(odd.copy(std::vector<int32_t>{2, 7}), DType::kInt32, {2}),
                                              make_tensor(cache.data(), DType::kUInt8, {1, 4, 1, 656})));
  EXPECT_EQ(0, std::memcmp(cache.data() + 2 * 656, want.data(), 656));
  EXPECT_EQ(std::vector<uint8_t>(cache.begin(), cache.begin() + 2 * 656), std::vector<uint8_t>(2 * 656, 0));
}

TEST(ReferenceRobustness, MergeStatesNamesABadPointerOrD) {
  std::vector<double> a(4, 1.0), b(4, 2.0), o(4, -7.0);
  double lse = -7.0;
  // The call of the issue: every pointer null.
  EXPECT_TRUE(IsInvalid(reference::merge_states(nullptr, 0, nullptr, 0, 512, nullptr, nullptr),
                        {"reference::merge_states", "o_a", "expected a non-null pointer, got null"}));
  EXPECT_TRUE(IsInvalid(reference::merge_states(a.data(), 0, nullptr, 0, 4, o.data(), &lse), {"o_b", "null"}));
  EXPECT_TRUE(IsInvalid(reference::merge_states(a.data(), 0, b.data(), 0, 4, nullptr, &lse), {"o:", "null"}));
  EXPECT_TRUE(IsInvalid(reference::merge_states(a.data(), 0, b.data(), 0, 4, o.data(), nullptr), {"lse", "null"}));
  for (const int64_t d : {int64_t{0}, int64_t{-1}, std::numeric_limits<int64_t>::min()}) {
    EXPECT_TRUE(IsInvalid(reference::merge_states(a.data(), 0, b.data(), 0, d, o.data(), &lse),
                          {"d: expected >= 1, got " + std::to_string(d)}));
  }
  EXPECT_EQ(o, std::vector<double>(4, -7.0)) << "nothing written on an error";
  EXPECT_EQ(lse, -7.0);
  EXPECT_TRUE(reference::merge_states(a.data(), 0, b.data(), 0, 4, o.data(), &lse));
  EXPECT_DOUBLE_EQ(o[0], 1.5);
}

}  // namespace
}  // namespace mlakit
