#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <utility>

#include "reference/host_numeric.h"
#include "validation_fuzz.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

namespace mlakit::fuzz {
namespace {

constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();
constexpr int64_t k2p31 = int64_t{1} << 31;
constexpr int64_t k2p32 = int64_t{1} << 32;

int64_t sat_mul(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? kI64Max : r;
}
int64_t sat_add(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_add_overflow(a, b, &r) ? kI64Max : r;
}

// Element size for buffer sizing; an invalid dtype gets the largest, so a validator that
// accepts it is caught by the contract check, not by a too small buffer.
int64_t element_bytes(DType dtype) {
  const std::size_t size = dtype_size(dtype);
  return size == 0 ? 8 : static_cast<int64_t>(size);
}

// Strides for `shape`: row-major (outer dimensions possibly permuted), rows padded, or one
// outer input dimension broadcast.
std::vector<int64_t> random_layout(Rng& rng, const std::vector<int64_t>& shape, bool output) {
  const int rank = static_cast<int>(shape.size());
  std::vector<int64_t> stride(rank, 1);
  std::vector<int> order(rank);
  for (int i = 0; i < rank; ++i) order[i] = i;
  const int64_t mode = rng.uniform(0, 9);
  if (mode == 8 && rank > 2) std::swap(order[0], order[rank - 2]);
  const int64_t pad = mode >= 6 ? rng.pick({int64_t{0}, int64_t{8}, int64_t{16}, int64_t{3}}) : 0;
  int64_t step = 1;
  for (int k = rank - 1; k >= 0; --k) {
    stride[order[k]] = step;
    step = sat_add(sat_mul(step, std::max<int64_t>(shape[order[k]], 1)), pad);
  }
  if (mode == 9 && !output && rank > 1) stride[rng.uniform(0, rank - 2)] = 0;
  return stride;
}

void fill_buffer(Rng& rng, const Arg& arg, std::byte* p, int64_t bytes) {
  switch (arg.spec.fill) {
    case Fill::kPoison:
      std::memset(p, 0xff, bytes);
      return;
    case Fill::kFp8Tokens:
      for (int64_t i = 0; i < bytes; ++i) p[i] = static_cast<std::byte>(rng.next());
      return;
    case Fill::kHalf:
      for (int64_t i = 0; i + 2 <= bytes; i += 2) {
        const float v = rng.chance(0.01) ? rng.edge_float() : (rng.uniform(0, 2000) - 1000) / 1000.0f;
        const uint16_t h = arg.ref.dtype == DType::kFP16 ? host::float_to_fp16(v) : host::float_to_bf16(v);
        std::memcpy(p + i, &h, 2);
      }
      return;
    case Fill::kFloat:
      for (int64_t i = 0; i + 4 <= bytes; i += 4) {
        const float v = rng.chance(0.2) ? rng.edge_float() : (rng.uniform(0, 2000) - 1000) / 200.0f;
        std::memcpy(p + i, &v, 4);
      }
      return;
    case Fill::kIndex:
      for (int64_t i = 0; i + 4 <= bytes; i += 4) {
        const int64_t below = std::clamp<int64_t>(arg.spec.index_below, 0, INT32_MAX);
        int64_t v = below > 0 ? rng.uniform(0, below - 1) : 0;
        if (rng.chance(0.1)) v = below + rng.uniform(-1, 1) - (rng.chance(0.5) ? below : 0);
        if (rng.chance(0.03)) v = rng.edge_int();
        const auto v32 = static_cast<int32_t>(std::clamp<int64_t>(v, INT32_MIN, INT32_MAX));
        std::memcpy(p + i, &v32, 4);
      }
      return;
  }
}

// Bytes from the pointer to the end of the last element the tensor claims (negative strides
// add nothing: the buffer starts at the pointer, so a validator accepting them shows as a read
// before the buffer); -1 beyond the cap. Malformed tensors get a small buffer.
int64_t claimed_bytes(const TensorRef& t) {
  if (t.rank < 1 || t.rank > kMaxRank) return 64;
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] < 0) return 64;
    if (t.shape[i] == 0) return 0;
  }
  __int128 last = 0;  // each term < 2^126: adding it to a value within the cap cannot overflow
  for (int i = 0; i < t.rank && last <= Memory::kMaxBytes; ++i) {
    if (t.stride[i] > 0) last += static_cast<__int128>(t.shape[i] - 1) * t.stride[i];
  }
  if (last > Memory::kMaxBytes) return -1;
  const __int128 bytes = (last + 1) * element_bytes(t.dtype);
  return bytes > Memory::kMaxBytes ? -1 : static_cast<int64_t>(bytes);
}

}  // namespace

std::byte* stand_in_arena() {
  alignas(256) static std::byte bytes[kStandInArenaBytes];
#if defined(__SANITIZE_ADDRESS__)
  static const bool poisoned = [] {
    ASAN_POISON_MEMORY_REGION(bytes, sizeof(bytes));
    return true;
  }();
  (void)poisoned;
#endif
  return bytes;
}

namespace {

const Arg* find_arg(const std::vector<Arg>& args, const std::string& name) {
  for (const Arg& a : args) {
    if (a.spec.name == name) return &a;
  }
  return nullptr;
}

// Provable self-overlap: a size > 1 dimension of stride 0, or index k along dimension i
// landing on index 1 along dimension j (stride_j = k * stride_i with k < size_i).
bool self_overlapping(const TensorRef& t) {
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] <= 1) continue;
    if (t.stride[i] == 0) return true;
    for (int j = 0; j < t.rank; ++j) {
      if (j == i || t.shape[j] <= 1 || t.stride[i] <= 0 || t.stride[j] < t.stride[i]) continue;
      if (t.stride[j] % t.stride[i] == 0 && t.stride[j] / t.stride[i] < t.shape[i]) return true;
    }
  }
  return false;
}

void check_arg(const Arg& arg, const std::vector<Arg>& args, Symbols* symbols, std::vector<Violation>* out) {
  const TensorRef& t = arg.ref;
  const TensorSpec& spec = arg.spec;
  auto add = [&](const char* kind, const std::string& what) { out->push_back({kind, spec.name + what}); };
  std::vector<Dim> dims = spec.dims;
  if (spec.any_leading_rank && t.rank >= 1 && t.rank <= kMaxRank) {
    dims.clear();
    for (int i = 0; i + 1 < t.rank; ++i) dims.push_back(sym(("L" + std::to_string(i)).c_str()));
    dims.push_back(spec.dims.back());
  }
  if (t.rank != static_cast<int>(dims.size())) {
    add("rank", ": rank " + std::to_string(t.rank) + " accepted, documented " + std::to_string(dims.size()));
    return;
  }
  const bool float_ok = spec.or_float32 && t.dtype == DType::kFP32;
  if (!float_ok && std::find(spec.dtypes.begin(), spec.dtypes.end(), t.dtype) == spec.dtypes.end()) {
    add("dtype", ".dtype " + std::string(dtype_name(t.dtype)) + " accepted");
  }
  if (const Arg* other = spec.same_dtype_as.empty() ? nullptr : find_arg(args, spec.same_dtype_as);
      other != nullptr && !float_ok && other->ref.dtype != t.dtype) {
    add("dtype", ".dtype differs from " + spec.same_dtype_as + "'s");
  }
  bool nonnegative = true, empty = false;
  for (int i = 0; i < t.rank; ++i) {
    const std::string at = "[" + std::to_string(i) + "]";
    if (t.shape[i] < 0) add("size", ".shape" + at + " = " + std::to_string(t.shape[i]) + " accepted");
    if (t.stride[i] < 0) add("stride", ".stride" + at + " = " + std::to_string(t.stride[i]) + " accepted");
    nonnegative &= t.shape[i] >= 0 && t.stride[i] >= 0;
    empty |= t.shape[i] == 0;
  }
  if (!empty && t.stride[t.rank - 1] != 1 && t.shape[t.rank - 1] > 1) add("last-dim", ": last dimension not contiguous");
  if (t.data == nullptr && !empty) add("null", ": null pointer with elements accepted");
  if (nonnegative && !empty) {
    constexpr __int128 kMax = std::numeric_limits<int64_t>::max();
    __int128 last = 0;  // stops past kMax: each term < 2^126 cannot overflow the sum before that
    for (int i = 0; i < t.rank && last <= kMax; ++i) last += static_cast<__int128>(t.shape[i] - 1) * t.stride[i];
    if (last > kMax || last * element_bytes(t.dtype) > kMax) {
      add("extent", ": byte extent beyond int64 accepted");
    }
  }
  if (spec.output && !empty && self_overlapping(t)) add("overlap", ": self-overlapping output (stride 0 or aliasing strides) accepted");
  for (int i = 0; i < t.rank; ++i) {
    const Dim& d = dims[i];
    const std::string at = ".shape[" + std::to_string(i) + "]";
    if (d.symbol.empty()) {
      if (t.shape[i] != d.value) {
        add("dims", at + " = " + std::to_string(t.shape[i]) + " accepted, documented " + std::to_string(d.value));
      }
      continue;
    }
    auto [it, first] = symbols->emplace(d.symbol, t.shape[i]);
    if (!first && it->second != t.shape[i]) {
      const bool narrowed = static_cast<int32_t>(it->second) == static_cast<int32_t>(t.shape[i]);
      add(narrowed ? "dims-narrowed" : "dims", at + " (" + d.symbol + ") = " + std::to_string(t.shape[i]) +
                                                   " accepted, another argument has " + std::to_string(it->second));
    }
  }
}

}  // namespace

uint64_t Rng::next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

int64_t Rng::uniform(int64_t lo, int64_t hi) {
  const uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo) + 1;
  return static_cast<int64_t>(static_cast<uint64_t>(lo) + (span == 0 ? next() : next() % span));
}

bool Rng::chance(double p) { return static_cast<double>(next() >> 11) * 0x1.0p-53 < p; }

int64_t Rng::edge_size() {
  static constexpr int64_t kValues[] = {
      0, 1, -1, 2, 3, 15, 16, 17, 63, 64, 65, 511, 512, 513, 575, 576, 577, 655, 656, 1024, 1025, 65535, 65536,
      65537, 1 << 20, (1 << 20) + 1, 1 << 30, (1 << 30) + 1, k2p31 - 1, k2p31, k2p31 + 1, k2p32, k2p32 + 1,
      k2p32 + 2, k2p32 + 4, k2p32 + 64, k2p32 + 576, k2p32 + 656, int64_t{1} << 33, int64_t{1} << 59,
      int64_t{1} << 62, kI64Max, kI64Max - 1, kI64Min, kI64Min + 1, -k2p31, -k2p32 + 1, -576};
  return chance(0.1) ? static_cast<int64_t>(next()) : pick(kValues);
}

int64_t Rng::edge_stride() {
  static constexpr int64_t kValues[] = {0, 0, 1, -1, 2, 3, 8, 16, 576, 656, -8, -576, k2p31, k2p32, k2p32 + 1,
                                        int64_t{1} << 59, int64_t{1} << 62, kI64Max, kI64Min, kI64Max / 2};
  return chance(0.1) ? static_cast<int64_t>(next()) : pick(kValues);
}

int Rng::edge_int() {
  static constexpr int kValues[] = {0, 1, -1, 2, 3, 16, 32, 64, 128, 512, 576, 1024, 1025, 65535, 65536,
                                    1 << 20, (1 << 20) + 1, 1 << 30, INT32_MAX, INT32_MIN, INT32_MIN + 1};
  return pick(kValues);
}

float Rng::edge_float() {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  static const float kValues[] = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                                  kInf, -kInf, 0.0f, -0.0f, -1.0f, 1.0f, 0.5f, FLT_MAX, -FLT_MAX, FLT_MIN,
                                  std::numeric_limits<float>::denorm_min(), 1e-30f, 1e30f, -1e30f};
  return pick(kValues);
}

DType Rng::dtype() {
  static constexpr int kInvalid[] = {7, 8, -1, 255, INT32_MAX, INT32_MIN};
  return static_cast<DType>(chance(0.85) ? static_cast<int>(uniform(0, 6)) : pick(kInvalid));
}

int64_t Rng::size(int64_t lo, int64_t hi) { return chance(0.04) ? edge_size() : uniform(lo, hi); }

std::vector<Arg> make_args(Rng& rng, const std::vector<TensorSpec>& specs, const Symbols& symbols) {
  std::vector<Arg> args;
  for (const TensorSpec& spec : specs) {
    Arg arg{.spec = spec};
    if (spec.optional && rng.chance(0.5)) {
      args.push_back(arg);
      continue;
    }
    std::vector<int64_t> shape;
    for (const Dim& d : spec.dims) shape.push_back(d.symbol.empty() ? d.value : symbols.at(d.symbol));
    const std::vector<int64_t> stride = random_layout(rng, shape, spec.output);
    arg.ref.rank = static_cast<int>(shape.size());
    for (std::size_t i = 0; i < shape.size(); ++i) {
      arg.ref.shape[i] = shape[i];
      arg.ref.stride[i] = stride[i];
    }
    arg.ref.dtype = spec.dtypes[rng.uniform(0, static_cast<int64_t>(spec.dtypes.size()) - 1)];
    if (const Arg* other = spec.same_dtype_as.empty() ? nullptr : find_arg(args, spec.same_dtype_as)) {
      arg.ref.dtype = other->ref.dtype;
    }
    if (spec.or_float32 && rng.chance(0.3)) arg.ref.dtype = DType::kFP32;
    args.push_back(arg);
  }
  return args;
}

void mutate_args(Rng& rng, std::vector<Arg>& args) {
  static constexpr int kCounts[] = {0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 3, 4};
  for (int m = rng.pick(kCounts); m > 0; --m) {
    Arg& a = args[rng.uniform(0, static_cast<int64_t>(args.size()) - 1)];
    TensorRef& t = a.ref;
    const int rank = std::clamp(t.rank, 1, kMaxRank);
    const int axis = static_cast<int>(rng.uniform(0, rank - 1));
    switch (rng.uniform(0, 10)) {
      case 0: t.rank = rng.chance(0.8) ? static_cast<int>(rng.uniform(0, 7)) : rng.edge_int(); break;
      case 1:
      case 2: t.shape[axis] = rng.edge_size(); break;
      case 3:
        // +-1, or + 2^32: equal to the original modulo 2^32, what a narrowing to int cannot see.
        t.shape[axis] = sat_add(t.shape[axis], rng.chance(0.5) ? k2p32 : rng.chance(0.5) ? 1 : -1);
        break;
      case 4:
      case 5: t.stride[axis] = rng.edge_stride(); break;
      case 6: t.stride[rank - 1] = rng.pick({int64_t{0}, int64_t{2}, int64_t{-1}}); break;
      case 7: t.dtype = rng.dtype(); break;
      case 8:
        if (rng.chance(0.5)) {
          a.force_null = true;
        } else {
          a.misalign_bytes = static_cast<int>(rng.pick({1, 2, 4, 8}));
        }
        break;
      case 9: t = TensorRef{}; break;
      default: std::swap(t, args[rng.uniform(0, static_cast<int64_t>(args.size()) - 1)].ref); break;
    }
  }
}

void Memory::attach_host(Rng& rng, std::vector<Arg>& args) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    Arg& a = args[i];
    if (a.ref.empty()) continue;  // left out: stays the empty TensorRef
    const int64_t bytes = claimed_bytes(a.ref);
    a.beyond_cap = bytes < 0;
    if (a.force_null || a.beyond_cap) {
      a.ref.data = nullptr;
      continue;
    }
    Buffer b{.arg = i, .storage = std::make_unique<std::byte[]>(bytes + a.misalign_bytes)};
    b.data = b.storage.get() + a.misalign_bytes;
    fill_buffer(rng, a, b.data, bytes);
    b.before.assign(b.data, b.data + bytes);
    a.ref.data = b.data;
    buffers_.push_back(std::move(b));
  }
}

std::vector<Violation> Memory::writes_outside_outputs(const std::vector<Arg>& args) const {
  std::vector<Violation> out;
  for (const Buffer& b : buffers_) {
    const Arg& a = args[b.arg];
    const auto bytes = static_cast<int64_t>(b.before.size());
    if (!a.spec.output) {
      if (bytes > 0 && std::memcmp(b.data, b.before.data(), bytes) != 0) out.push_back({"input-written", a.spec.name + ": input changed"});
      continue;
    }
    const TensorRef& t = a.ref;
    if (claimed_bytes(t) != bytes || t.rank < 1 || t.rank > kMaxRank) continue;  // malformed: the contract check reports it
    bool nonnegative = true;
    int64_t elements = 1;
    for (int i = 0; i < t.rank; ++i) {
      nonnegative &= t.shape[i] >= 0 && t.stride[i] >= 0;
      if (__builtin_mul_overflow(elements, std::max<int64_t>(t.shape[i], 0), &elements)) elements = kMaxBytes + 1;
    }
    if (!nonnegative || elements > kMaxBytes) continue;
    // Mark the bytes of every element (an odometer over the indices), then compare the rest.
    const int64_t esize = element_bytes(t.dtype);
    std::vector<bool> element_byte(bytes, false);
    int64_t index[kMaxRank] = {};
    for (int64_t e = 0; e < elements; ++e) {
      int64_t offset = 0;
      for (int i = 0; i < t.rank; ++i) offset += index[i] * t.stride[i];
      for (int64_t k = 0; k < esize; ++k) element_byte[offset * esize + k] = true;
      for (int i = t.rank - 1; i >= 0 && ++index[i] == t.shape[i]; --i) index[i] = 0;
    }
    for (int64_t k = 0; k < bytes; ++k) {
      if (!element_byte[k] && b.data[k] != b.before[k]) {
        out.push_back({"write-outside", a.spec.name + ": byte " + std::to_string(k) + " outside its elements written"});
        break;
      }
    }
  }
  return out;
}

void Memory::attach_device_stand_in(std::vector<Arg>& args) {
  for (Arg& a : args) {
    if (!a.ref.empty()) a.ref.data = a.force_null ? nullptr : device_stand_in(a.misalign_bytes);
  }
}

void* device_stand_in(int64_t offset_bytes) { return stand_in_arena() + 256 + offset_bytes; }

std::vector<Violation> contract_violations(const std::vector<Arg>& args, Symbols* symbols) {
  std::vector<Violation> out;
  for (const Arg& arg : args) {
    if (arg.spec.optional && arg.ref.empty()) continue;  // an optional argument not given
    check_arg(arg, args, symbols, &out);
  }
  return out;
}

void problem_violation(const std::string& name, int64_t value, std::vector<Violation>* out) {
  const bool beyond_int = value < INT32_MIN || value > INT32_MAX;
  out->push_back({beyond_int ? "dims-narrowed" : "problem", name + " = " + std::to_string(value) + " accepted"});
}

void check_scale(const char* name, std::optional<float> scale, std::vector<Violation>* out) {
  if (scale && !std::isfinite(*scale)) out->push_back({"scale", std::string(name) + ": " + std::to_string(*scale) + " accepted"});
}

std::string describe(const TensorRef& t) {
  std::ostringstream s;
  const auto address = reinterpret_cast<std::uintptr_t>(t.data);
  s << "{data=" << (t.data == nullptr ? "null" : "addr%16==" + std::to_string(address % 16))
    << ", dtype=DType(" << static_cast<int>(t.dtype) << ") " << dtype_name(t.dtype) << ", rank=" << t.rank;
  const int shown = std::clamp(t.rank, 0, kMaxRank);
  for (const auto* field : {t.shape, t.stride}) {
    s << (field == t.shape ? ", shape=[" : ", stride=[");
    for (int i = 0; i < shown; ++i) s << (i ? ", " : "") << field[i];
    s << "]";
  }
  s << "}";
  return s.str();
}

std::string describe(const std::vector<Arg>& args) {
  std::string s;
  for (const Arg& a : args) {
    s += "  " + a.spec.name + " = " + (a.ref.empty() ? std::string("{} (not given)") : describe(a.ref));
    if (a.beyond_cap) s += " (layout beyond the host cap: null)";
    s += "\n";
  }
  return s;
}

namespace {

// Calls f with an initializer list holding v's values (up to 8).
template <std::size_t N = 0, typename F>
TensorRef with_list(const std::vector<int64_t>& v, F&& f) {
  if constexpr (N > 8) {
    return f({});  // callers keep lists at 8 entries or fewer
  } else {
    if (v.size() == N) {
      return [&]<std::size_t... I>(std::index_sequence<I...>) { return f({v[I]...}); }(std::make_index_sequence<N>{});
    }
    return with_list<N + 1>(v, f);
  }
}

}  // namespace

TensorRef make_tensor_from(void* data, DType dtype, const std::vector<int64_t>& shape) {
  return with_list(shape, [&](std::initializer_list<int64_t> s) { return make_tensor(data, dtype, s); });
}

TensorRef make_tensor_from(void* data, DType dtype, const std::vector<int64_t>& shape,
                           const std::vector<int64_t>& stride) {
  return with_list(shape, [&](std::initializer_list<int64_t> s) {
    return with_list(stride, [&](std::initializer_list<int64_t> st) { return make_tensor(data, dtype, s, st); });
  });
}

}  // namespace mlakit::fuzz
