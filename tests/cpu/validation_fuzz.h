// Building blocks of the validation fuzz test (validation_fuzz_test.cpp): a deterministic
// generator of edge values, tensor arguments described by their documented contract, random
// mutations of them, host memory sized exactly for what a tensor claims, and the contract
// check applied to every input an entry point accepts.
//
// Why the contract is written here again instead of calling the library's validators: the
// test must catch a validator that accepts what the README / docs/contract.md forbid, so it needs an
// independent statement of what is allowed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mlakit/status.h"
#include "mlakit/tensor.h"

namespace mlakit::fuzz {

// splitmix64: tiny, fast, and the same sequence on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next();
  int64_t uniform(int64_t lo, int64_t hi);  // inclusive
  bool chance(double p);
  template <typename T, std::size_t N>
  const T& pick(const T (&values)[N]) { return values[uniform(0, N - 1)]; }

  int64_t edge_size();    // sizes and counts: 0, -1, 2^31, 2^32 + k, INT64_MAX, ...
  int64_t edge_stride();  // 0, negative, huge, odd
  int edge_int();         // int fields of problem structs: 0, -1, INT_MIN, 1025, 2^20 + 1, ...
  float edge_float();     // NaN, +-inf, 0, -0, denormals, FLT_MAX, negatives
  DType dtype();          // a valid dtype or an out-of-range enum value
  // Usually uniform in [lo, hi]; now and then an edge size.
  int64_t size(int64_t lo, int64_t hi);

 private:
  uint64_t state_;
};

// How a host buffer is filled for the CPU references.
enum class Fill {
  kHalf,       // bf16 / fp16 values in [-1, 1], a few NaN / inf
  kFp8Tokens,  // random bytes (FP8 values and float32 scales of any kind)
  kFloat,      // float32 values, edge values included
  kIndex,      // int32: mostly in [0, index_below), some just outside, some extreme
  kPoison,     // outputs: all bits set
};

// A dimension of a documented shape: a named size shared between tensors, or a constant.
struct Dim {
  std::string symbol{};  // empty: the constant `value`
  int64_t value = 0;
};
inline Dim sym(const char* name) { return Dim{name, 0}; }
inline Dim fixed(int64_t value) { return Dim{"", value}; }

struct TensorSpec {
  std::string name{};
  std::vector<Dim> dims{};
  std::vector<DType> dtypes{};  // allowed
  std::string same_dtype_as{};  // another argument whose dtype this one must have,
  bool or_float32 = false;      // or float32 (the references' unrounded outputs)
  bool optional = false;
  bool output = false;
  bool any_leading_rank = false;  // [..., last]: leading dimensions L0, L1, ... of any number
  Fill fill = Fill::kHalf;
  int64_t index_below = 0;  // Fill::kIndex
};

using Symbols = std::map<std::string, int64_t>;

// One tensor argument of a call: its contract and the TensorRef passed.
struct Arg {
  TensorSpec spec{};
  TensorRef ref{};
  bool force_null = false;     // mutation: pass a null pointer
  int misalign_bytes = 0;      // mutation: pointer this many bytes past an aligned address
  bool beyond_cap = false;     // the claimed layout needs more host memory than a case may use
};

// The arguments of `specs` for the symbol values, in a random layout: contiguous, padded rows,
// a broadcast (stride 0) input dimension, or permuted outer dimensions.
std::vector<Arg> make_args(Rng& rng, const std::vector<TensorSpec>& specs, const Symbols& symbols);

// Applies 0-4 random mutations (rank, a size, a stride, dtype, pointer, argument left out,
// two arguments swapped) to the arguments.
void mutate_args(Rng& rng, std::vector<Arg>& args);

// A way an accepted input breaks the documented contract. `kind` groups violations for the
// known-issue list: "rank", "dtype", "size", "stride", "last-dim", "null", "extent", "dims",
// "dims-narrowed" (sizes equal only modulo 2^32, or beyond int), "overlap", "problem",
// "scale", "input-written", "write-outside".
struct Violation {
  std::string kind{};
  std::string detail{};
};

// Host memory for the arguments' pointers; frees it on destruction.
class Memory {
 public:
  // CPU references: a buffer of exactly the bytes each layout claims (ASan then reports any
  // read or write past it), filled per the spec; null above kMaxBytes or for layouts with no
  // finite extent, so a reference can only reach memory that does not exist through a
  // validation bug.
  void attach_host(Rng& rng, std::vector<Arg>& args);
  // GPU entry points: addresses in a host arena (poisoned under ASan: never to be read on the
  // host), for the "host pointer where device memory is needed" paths.
  static void attach_device_stand_in(std::vector<Arg>& args);

  // After a reference call that returned Ok: every input buffer is unchanged ("input-written")
  // and every output byte outside the output's elements still holds its fill ("write-outside").
  std::vector<Violation> writes_outside_outputs(const std::vector<Arg>& args) const;

  static constexpr int64_t kMaxBytes = 1 << 20;

 private:
  struct Buffer {
    std::size_t arg;  // index into the arguments
    std::unique_ptr<std::byte[]> storage{};
    std::byte* data = nullptr;
    std::vector<std::byte> before{};  // the fill, for writes_outside_outputs
  };
  std::vector<Buffer> buffers_;
};

// Host memory that must never be dereferenced: one static arena, poisoned under ASan, so that
// stand-ins need no allocation and their addresses (so overlaps) depend on the case alone.
inline constexpr int64_t kStandInArenaBytes = int64_t{4} << 20;
std::byte* stand_in_arena();
// A non-null address in it (see attach_device_stand_in).
void* device_stand_in(int64_t offset_bytes = 0);

// The contract of every argument (rank, dtype, sizes, strides, contiguity, pointer, extent,
// outputs without self-overlap, shared sizes equal); fills `symbols` from the first argument
// that has each. A tensor without elements (a size 0) is exempt from what only matters for
// addressed elements: contiguity, null pointer, extent, self-overlap (nothing is read or
// written through it).
std::vector<Violation> contract_violations(const std::vector<Arg>& args, Symbols* symbols);

// A documented limit on a size or option broken by an accepted input: kind "problem", or
// "dims-narrowed" for a size beyond int (what a narrowing to int hides).
void problem_violation(const std::string& name, int64_t value, std::vector<Violation>* out);

// An accepted logit scale is unset (the default, 1 / sqrt(d_qk)) or finite: NaN and infinities
// must be rejected ("scale").
void check_scale(const char* name, std::optional<float> scale, std::vector<Violation>* out);

std::string describe(const std::vector<Arg>& args);
std::string describe(const TensorRef& t);

// A tensor through make_tensor, which takes initializer lists (ranks up to 8 here).
TensorRef make_tensor_from(void* data, DType dtype, const std::vector<int64_t>& shape);
TensorRef make_tensor_from(void* data, DType dtype, const std::vector<int64_t>& shape,
                           const std::vector<int64_t>& stride);

}  // namespace mlakit::fuzz
