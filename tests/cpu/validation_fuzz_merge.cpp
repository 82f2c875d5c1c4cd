// Fuzz drivers of merge_states over N states (include/mlakit/merge.h; docs/contract.md, Merging
// states): the GPU entry (device stand-ins) and reference::merge_states (host buffers). Its
// tensors come in two arrays of num_states (o [rows..., d], lse [rows...]) beside out and the
// optional out_lse, so these drivers lay the arguments out themselves instead of through
// make_args / call_and_check:
//   - num_states 0..130 (0, 129 and 130 just outside 1..128) and edge ints, null arrays, bad
//     LseBase values;
//   - 1-3 row dimensions, sizes 0 (no rows, d 0) and edge sizes, random layouts: the states
//     allocated separately, as slices of one stacked tensor, interleaved ([tokens, n, heads, d]:
//     the states' extents overlap, which inputs may) or one tensor passed n times; the LSEs in
//     any strides (transposed, interleaved, broadcast);
//   - a state that differs from state 0 (dtype, a size, a stride, rank, null, misaligned) and
//     the shared mutations (validation_fuzz.h) of any tensor;
//   - outputs separate, exactly one input (the allowed in place: out == o[k], out_lse ==
//     lse[k]), or overlapping an input or each other without being it (shifted by an element,
//     another dtype, other strides, another argument's memory).
// Every accepted call must meet the contract, restated here (`judge`, independent of
// src/host/merge_validate.cpp), every rejection must name an argument, and every call the
// contract plainly allows must be accepted (real buffers, output strides nested as the
// documented output-layout test wants; overlaps are intervals, as documented). The GPU entry
// gets poisoned host blocks (never to be read; without CUDA it must return NoDevice, or Ok for
// a problem with nothing to write: no element of out, and no out_lse or none of its elements;
// d 0 with an out_lse still merges the LSEs) and must also require pointers aligned to
// their element size (the kernel loads elements). The reference gets blocks of exactly the
// bytes its tensors claim; a rejected call must write nothing, and an accepted one must leave
// every byte outside out's and out_lse's elements as it was and give per row: a NaN LSE: NaN
// out and out_lse; every state empty (LSE +-inf): out 0, out_lse +inf; otherwise out_lse in
// [max, max + log(states used)] of the finite LSEs (bit for bit the lone state's LSE when the
// bases agree) and each out value between the smallest and largest value of the states used,
// never NaN (where those values are finite), the empty states' values (mostly NaN) unread.
// A valid call with nothing to write (which may have edge-sized row dimensions) is made too:
// it must return at once.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mlakit/merge.h"
#include "reference/host_numeric.h"
#include "validation_fuzz_runner.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

namespace mlakit::fuzz {
namespace {

using enum DType;

constexpr int kMostStates = kMaxMergeStates + 2;  // arrays hold up to 130 tensors: 129 and 130 must be refused
constexpr int64_t kCap = Memory::kMaxBytes;       // a reference tensor claiming more gets null
constexpr double kLn2 = 0.69314718055994530942;
constexpr double kLog2e = 1.44269504088896340736;
constexpr __int128 kI64Max = std::numeric_limits<int64_t>::max();

int64_t elem_bytes(DType dt) {
  const std::size_t s = dtype_size(dt);
  return s == 0 ? 8 : static_cast<int64_t>(s);  // an invalid dtype: the largest (as Memory does)
}
bool value_dtype(DType dt) { return dt == kBF16 || dt == kFP16 || dt == kFP32; }
bool valid_base(LseBase b) { return b == LseBase::kNatural || b == LseBase::kBase2; }
int clamped_rank(const TensorRef& t) { return std::clamp(t.rank, 0, kMaxRank); }
bool no_elements(const TensorRef& t) {
  return std::any_of(t.shape, t.shape + clamped_rank(t), [](int64_t n) { return n == 0; });
}
int64_t saturating_add(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_add_overflow(a, b, &r) ? (b > 0 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min()) : r;
}
std::string indexed(const char* name, int i) { return std::string(name) + "[" + std::to_string(i) + "]"; }

// ---------------------------------------------------------------------------------------------
// Memory: blocks a tensor, a stacked group of tensors or an alias points into.

enum class Role { kO, kLse, kOut };

class Blocks {
 public:
  // Stand-ins: addresses never to be read (stand_in_arena, or poisoned heap blocks past it).
  explicit Blocks(bool stand_in) : stand_in_(stand_in) {}
  Blocks(const Blocks&) = delete;
  Blocks& operator=(const Blocks&) = delete;
  ~Blocks() {
#if defined(__SANITIZE_ADDRESS__)
    for (const Block& b : blocks_) {
      if (stand_in_ && b.storage) ASAN_UNPOISON_MEMORY_REGION(b.data, b.size);
    }
#endif
  }

  int add(int64_t bytes, Role role, DType dtype) {
    Block b{.size = bytes, .role = role, .dtype = dtype};
    if (stand_in_ && arena_used_ + bytes <= kStandInArenaBytes) {
      b.data = stand_in_arena() + arena_used_;
      arena_used_ += (bytes + 63) / 64 * 64 + 64;  // 64-byte aligned, a gap between blocks
    } else {
      // Exactly `bytes` (0 too: any access is then an ASan report), uninitialised (fill writes it).
      b.storage.reset(new std::byte[static_cast<std::size_t>(bytes)]);
      b.data = b.storage.get();
#if defined(__SANITIZE_ADDRESS__)
      if (stand_in_) ASAN_POISON_MEMORY_REGION(b.data, bytes);
#endif
    }
    blocks_.push_back(std::move(b));
    return static_cast<int>(blocks_.size()) - 1;
  }
  std::byte* data(int b) { return blocks_[b].data; }
  const std::byte* data(int b) const { return blocks_[b].data; }
  const std::byte* before(int b) const { return blocks_[b].before.data(); }
  int64_t size(int b) const { return blocks_[b].size; }
  Role role(int b) const { return blocks_[b].role; }
  DType dtype(int b) const { return blocks_[b].dtype; }
  int count() const { return static_cast<int>(blocks_.size()); }
  bool changed(int b) const {
    return blocks_[b].size > 0 && std::memcmp(data(b), before(b), static_cast<std::size_t>(blocks_[b].size)) != 0;
  }
  void snapshot() {
    for (Block& b : blocks_) b.before.assign(b.data, b.data + b.size);
  }
  bool stand_in() const { return stand_in_; }

 private:
  struct Block {
    std::unique_ptr<std::byte[]> storage{};  // null in the arena
    std::byte* data = nullptr;
    int64_t size = 0;
    Role role = Role::kO;
    DType dtype = kFP32;
    std::vector<std::byte> before{};
  };
  bool stand_in_;
  int64_t arena_used_ = 0;
  std::vector<Block> blocks_;
};

// Where a tensor's data points: its own block, a stacked group's block at `offset` bytes, or
// `offset` bytes past the data of tensor `alias_of`; resolved to (block, at).
struct Place {
  int group = -1;     // 0: the stacked o, 1: the stacked lse
  int alias_of = -1;  // a tensor placed before this one
  int64_t offset = 0;
  int block = -1;     // -1: null or not given
  int64_t at = 0;     // byte offset of data in the block
};

// Bytes from the pointer to the end of the last element a tensor claims (negative strides add
// nothing, so a validator accepting them shows as a read before the block); 64 for a malformed
// tensor, -1 beyond the cap. As Memory::attach_host sizes buffers (validation_fuzz_support.cpp).
int64_t claimed_bytes(const TensorRef& t) {
  if (t.rank < 1 || t.rank > kMaxRank) return 64;
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] < 0) return 64;
  }
  if (no_elements(t)) return 0;
  __int128 last = 0;
  for (int i = 0; i < t.rank && last <= kCap; ++i) {
    if (t.stride[i] > 0) last += static_cast<__int128>(t.shape[i] - 1) * t.stride[i];
  }
  if (last > kCap) return -1;
  const __int128 bytes = (last + 1) * elem_bytes(t.dtype);
  return bytes > kCap ? -1 : static_cast<int64_t>(bytes);
}

// ---------------------------------------------------------------------------------------------
// A case: the arguments and where they live.

struct LseFill {
  double nan = 0, neg_inf = 0, pos_inf = 0, big = 0;
};

struct MergeCase {
  FuzzCase fuzz;              // args: o[0..count), lse[0..count), out, out_lse
  std::vector<Place> places;  // per argument
  int n = 0;                  // num_states passed
  int count = 0;              // tensors per array
  DType in = kBF16;           // o's dtype as generated (the o blocks' fill)
  bool o_null = false, lse_null = false;
  LseBase lse_base = LseBase::kNatural, out_lse_base = LseBase::kNatural;
  LseFill lse_fill;

  int o_at(int s) const { return s; }
  int lse_at(int s) const { return count + s; }
  int out_at() const { return 2 * count; }
  int out_lse_at() const { return 2 * count + 1; }
  Arg& arg(int i) { return fuzz.args[static_cast<std::size_t>(i)]; }
  const Arg& arg(int i) const { return fuzz.args[static_cast<std::size_t>(i)]; }
};

// Strides for `shape`: row-major over a random order of the dimensions (with `fix_last`, the
// last stays innermost), each step padded by 0, 3, 8 or 16 elements now and then, and (inputs,
// `broadcast`) sometimes one dimension of stride 0.
std::vector<int64_t> layout(Rng& rng, const std::vector<int64_t>& shape, bool fix_last, bool broadcast) {
  const int rank = static_cast<int>(shape.size());
  std::vector<int> order(rank);
  for (int i = 0; i < rank; ++i) order[i] = i;
  const int permutable = fix_last ? rank - 1 : rank;
  if (permutable > 1 && rng.chance(0.3)) {
    for (int i = permutable - 1; i > 0; --i) std::swap(order[i], order[rng.uniform(0, i)]);
  }
  const int64_t pad = rng.chance(0.3) ? rng.pick({int64_t{3}, int64_t{8}, int64_t{16}}) : 0;
  std::vector<int64_t> stride(rank, 1);
  int64_t step = 1;
  for (int k = rank - 1; k >= 0; --k) {
    stride[order[k]] = step;
    int64_t next;
    if (__builtin_mul_overflow(step, std::max<int64_t>(shape[order[k]], 1), &next) ||
        __builtin_add_overflow(next, k == rank - 1 ? 0 : pad, &next)) {
      next = std::numeric_limits<int64_t>::max();
    }
    step = next;
  }
  const int outer = fix_last ? rank - 1 : rank;
  if (broadcast && outer > 0 && rng.chance(0.12)) stride[rng.uniform(0, outer - 1)] = 0;
  return stride;
}

TensorRef tensor(DType dtype, const std::vector<int64_t>& shape, const std::vector<int64_t>& stride) {
  TensorRef t;
  t.dtype = dtype;
  t.rank = static_cast<int>(shape.size());
  for (int i = 0; i < t.rank; ++i) {
    t.shape[i] = shape[i];
    t.stride[i] = stride[i];
  }
  return t;
}

// The states of one array laid out together: separately allocated, slices of a stacked tensor
// with the state axis at `axis` (0: [n, rows...]; before the last row dimension or d:
// interleaved), or one tensor passed n times. Fills the array's tensors and places.
std::string lay_out_states(Rng& rng, MergeCase& c, bool o, DType dtype, const std::vector<int64_t>& shape) {
  const int rank = static_cast<int>(shape.size());
  const int first = o ? c.o_at(0) : c.lse_at(0);
  const char* name = o ? "o" : "lse";
  const int64_t mode = rng.uniform(0, 9);
  std::string text;
  std::vector<int64_t> stride;
  int64_t state_stride = 0;  // elements between consecutive states in the stacked block
  if (mode < 4 || c.count < 2) {
    stride = layout(rng, shape, o, true);
    text = "separate";
  } else if (mode < 9) {
    // The stacked parent: `shape` with the state axis inserted (o: never after d).
    const int axis = mode < 7 ? 0 : static_cast<int>(rng.uniform(1, o ? rank - 1 : rank));
    std::vector<int64_t> parent = shape;
    parent.insert(parent.begin() + axis, c.count);
    std::vector<int64_t> parent_stride = layout(rng, parent, o, false);
    state_stride = parent_stride[axis];
    parent_stride.erase(parent_stride.begin() + axis);
    stride = parent_stride;
    text = axis == 0 ? "stacked [n, ...]" : "interleaved (state axis " + std::to_string(axis) + ")";
  } else {
    stride = layout(rng, shape, o, true);
    text = "one tensor passed n times";
  }
  // One block for all states while the stacked tensor stays within the cap (edge sizes make
  // it far larger: then the states get blocks of their own, with these strides).
  const __int128 last_offset = static_cast<__int128>(c.count - 1) * state_stride * elem_bytes(dtype);
  const bool stacked = mode >= 4 && c.count >= 2 && last_offset <= kCap;
  if (mode >= 4 && c.count >= 2 && !stacked) text += " (beyond the cap: separate blocks)";
  for (int s = 0; s < c.count; ++s) {
    Arg& a = c.arg(first + s);
    a.spec.name = indexed(name, s);
    a.ref = tensor(dtype, shape, stride);
    if (stacked) {
      c.places[first + s].group = o ? 0 : 1;
      c.places[first + s].offset = mode < 9 ? s * state_stride * elem_bytes(dtype) : 0;
    }
  }
  return text;
}

// A random value of `dtype` at p (16-bit or float32): mostly in [-1, 1], some up to +-6553,
// 1 in 128 an edge value (NaN, inf, huge, denormal). One draw per value: a case fills thousands.
void store_random_value(Rng& rng, std::byte* p, DType dtype) {
  const uint64_t r = rng.next();
  const auto bits = static_cast<float>(static_cast<int64_t>(r & 0xffff) - 32768);
  float v = (r >> 16 & 7) == 0 ? bits / 5.0f : bits / 32768.0f;
  if ((r >> 19 & 127) == 0) v = rng.edge_float();
  if (dtype == kFP32) {
    std::memcpy(p, &v, 4);
  } else if (dtype == kBF16 || dtype == kFP16) {
    const uint16_t h = dtype == kFP16 ? host::float_to_fp16(v) : host::float_to_bf16(v);
    std::memcpy(p, &h, 2);
  }
}

// An LSE: NaN, -inf, +inf (empty states), a large or extreme value, or in [-20, 20].
float random_lse(Rng& rng, const LseFill& f) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  static const float kBig[] = {1e4f, -1e4f, 88.7f, -88.7f, 1e30f, -1e30f, FLT_MAX, -FLT_MAX, 0.0f, -0.0f,
                               std::numeric_limits<float>::denorm_min(), 745.2f, -745.2f, 1e-3f, -1e-3f, 1e5f};
  const uint64_t bits = rng.next();
  const double r = static_cast<double>(bits >> 11) * 0x1.0p-53;
  if (r < f.nan) return std::numeric_limits<float>::quiet_NaN();
  if (r < f.nan + f.neg_inf) return -kInf;
  if (r < f.nan + f.neg_inf + f.pos_inf) return kInf;
  if (r < f.nan + f.neg_inf + f.pos_inf + f.big) return kBig[bits & 15];
  return static_cast<float>(static_cast<int64_t>(bits & 0xffff) - 32768) / 1638.4f;
}

// Bytes of element `e` (an element offset) of a tensor placed at `p`, or null outside its block.
const std::byte* element_bytes(const Blocks& mem, bool before, const Place& p, DType dtype, int64_t e) {
  if (p.block < 0) return nullptr;
  const int64_t size = elem_bytes(dtype);
  const __int128 byte = p.at + static_cast<__int128>(e) * size;
  if (byte < 0 || byte + size > mem.size(p.block)) return nullptr;
  return (before ? mem.before(p.block) : mem.data(p.block)) + static_cast<int64_t>(byte);
}

double load_value(const std::byte* p, DType dtype) {
  if (dtype == kFP32) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return dtype == kBF16 ? host::bf16_to_float(h) : host::fp16_to_float(h);
}

// Element offset of row `idx` (the first `dims` indices) and column j (when `column`).
int64_t offset_of(const TensorRef& t, const int64_t* idx, int dims, int64_t j, bool column) {
  __int128 e = 0;
  for (int i = 0; i < dims; ++i) e += static_cast<__int128>(idx[i]) * t.stride[i];
  if (column) e += static_cast<__int128>(j) * t.stride[dims];
  return e > kI64Max || e < -kI64Max ? std::numeric_limits<int64_t>::min() : static_cast<int64_t>(e);
}

// Calls f(idx) for each index tuple of the first `dims` sizes of `shape` (all >= 0), in order.
template <typename F>
void for_each_row(const int64_t* shape, int dims, F f) {
  int64_t idx[kMaxRank] = {};
  for (int i = 0; i < dims; ++i) {
    if (shape[i] == 0) return;
  }
  while (true) {
    if (!f(idx)) return;
    int i = dims - 1;
    for (; i >= 0 && ++idx[i] == shape[i]; --i) idx[i] = 0;
    if (i < 0) return;
  }
}

// Resolves the places to memory: the stacked groups (one block holding every member's claimed
// bytes), then each tensor in order (an alias follows its target, which comes earlier). A
// tensor claiming more than the cap gets null (reference) or a block of its own (stand-ins,
// never read); mutations' null and misaligned pointers are applied here.
void attach(MergeCase& c, Blocks& mem) {
  const int total = static_cast<int>(c.fuzz.args.size());
  for (int g = 0; g < 2; ++g) {
    int64_t size = -1;
    for (int i = 0; i < total; ++i) {
      const Arg& a = c.arg(i);
      if (c.places[i].group != g || a.ref.empty() || a.force_null) continue;
      const int64_t bytes = claimed_bytes(a.ref);
      if (bytes >= 0) size = std::max(size, c.places[i].offset + a.misalign_bytes + bytes);
    }
    // Members each within the cap at offsets within it: at most twice the cap (plus misalignment).
    if (size < 0) continue;
    const int block = mem.add(size, g == 0 ? Role::kO : Role::kLse, g == 0 ? c.in : kFP32);
    for (int i = 0; i < total; ++i) {
      Arg& a = c.arg(i);
      if (c.places[i].group != g || a.ref.empty() || a.force_null || claimed_bytes(a.ref) < 0) continue;
      c.places[i].block = block;
      c.places[i].at = c.places[i].offset + a.misalign_bytes;
      a.ref.data = mem.data(block) + c.places[i].at;
    }
  }
  for (int i = 0; i < total; ++i) {
    Arg& a = c.arg(i);
    Place& p = c.places[i];
    if (p.block >= 0 || a.ref.empty()) continue;
    a.ref.data = nullptr;
    if (a.force_null) continue;
    int64_t bytes = claimed_bytes(a.ref);
    // An alias stays in its target's block where it fits there, or where it starts inside the
    // target's elements (an overlap the call must refuse: if it does not, what lies past the
    // block is an ASan report). Otherwise (the target has no elements, or the alias starts past
    // them) nothing refuses it, and it gets a block of its own.
    if (const Place& t = p.alias_of >= 0 ? c.places[p.alias_of] : p; p.alias_of >= 0 && t.block >= 0) {
      const int64_t at = t.at + p.offset + a.misalign_bytes;
      const int64_t target_bytes = claimed_bytes(c.arg(p.alias_of).ref);
      const bool fits = bytes >= 0 && at + bytes <= mem.size(t.block);
      const bool overlaps = bytes != 0 && target_bytes > 0 && at < t.at + target_bytes;
      if (fits || overlaps) {
        p.block = t.block;
        p.at = at;
        a.ref.data = mem.data(p.block) + p.at;
        continue;
      }
    }
    if (bytes < 0) {
      a.beyond_cap = true;
      if (!mem.stand_in()) continue;
      bytes = 64;
    }
    const Role role = i < c.lse_at(0) ? Role::kO : i < c.out_at() ? Role::kLse : Role::kOut;
    p.block = mem.add(bytes + a.misalign_bytes, role, value_dtype(a.ref.dtype) ? a.ref.dtype : c.in);
    p.at = a.misalign_bytes;
    a.ref.data = mem.data(p.block) + p.at;
  }
}

// Reference inputs: values in the o blocks, LSEs (finite, +-inf, NaN, huge) in the lse blocks,
// all bits set in the outputs; then the o rows of most empty states (LSE +-inf) NaN, which
// must never be read.
void fill(Rng& rng, MergeCase& c, Blocks& mem) {
  for (int b = 0; b < mem.count(); ++b) {
    std::byte* p = mem.data(b);
    const int64_t whole = mem.size(b);
    // Random values in the first 16 KiB; a larger block (a mutated stride) repeats them.
    constexpr int64_t kPeriod = 16384;
    const int64_t size = std::min(whole, kPeriod);
    switch (mem.role(b)) {
      case Role::kOut:
        std::memset(p, 0xff, static_cast<std::size_t>(whole));
        continue;
      case Role::kLse:
        for (int64_t k = 0; k + 4 <= size; k += 4) {
          const float v = random_lse(rng, c.lse_fill);
          std::memcpy(p + k, &v, 4);
        }
        for (int64_t k = size / 4 * 4; k < size; ++k) p[k] = static_cast<std::byte>(rng.next());
        break;
      case Role::kO: {
        const DType dt = mem.dtype(b);
        const int64_t step = value_dtype(dt) ? elem_bytes(dt) : 1;
        int64_t k = 0;
        for (; k + step <= size; k += step) {
          if (value_dtype(dt)) {
            store_random_value(rng, p + k, dt);
          } else {
            p[k] = static_cast<std::byte>(rng.next());
          }
        }
        for (; k < size; ++k) p[k] = static_cast<std::byte>(rng.next());
        break;
      }
    }
    for (int64_t k = size; k < whole; k += size) std::memcpy(p + k, p, static_cast<std::size_t>(std::min(size, whole - k)));
  }
  const int n = std::min(c.n, c.count);
  for (int s = 0; s < n; ++s) {
    const Arg& o = c.arg(c.o_at(s));
    const Arg& lse = c.arg(c.lse_at(s));
    const TensorRef& ot = o.ref;
    const TensorRef& lt = lse.ref;
    if (ot.rank < 2 || ot.rank > 4 || lt.rank != ot.rank - 1 || !value_dtype(ot.dtype) || lt.dtype != kFP32) continue;
    const int dims = lt.rank;
    bool sane = true;
    int64_t rows = 1;
    for (int i = 0; i < ot.rank; ++i) sane &= ot.shape[i] >= 0 && ot.stride[i] >= 0 && ot.shape[i] <= 4096;
    for (int i = 0; i < dims; ++i) {
      sane &= lt.shape[i] == ot.shape[i] && lt.stride[i] >= 0;
      rows *= std::max<int64_t>(std::min<int64_t>(ot.shape[i], 4096), 1);
    }
    if (!sane || rows > 4096) continue;
    const Place& op = c.places[c.o_at(s)];
    const Place& lp = c.places[c.lse_at(s)];
    for_each_row(ot.shape, dims, [&](const int64_t* idx) {
      const std::byte* l = element_bytes(mem, false, lp, kFP32, offset_of(lt, idx, dims, 0, false));
      if (l == nullptr) return true;
      float v;
      std::memcpy(&v, l, 4);
      if (!std::isinf(v) || !rng.chance(0.7)) return true;
      for (int64_t j = 0; j < ot.shape[dims]; ++j) {
        const std::byte* e = element_bytes(mem, false, op, ot.dtype, offset_of(ot, idx, dims, j, true));
        if (e == nullptr) break;
        const float nan = std::numeric_limits<float>::quiet_NaN();
        auto* w = const_cast<std::byte*>(e);
        if (ot.dtype == kFP32) {
          std::memcpy(w, &nan, 4);
        } else {
          const uint16_t h = ot.dtype == kFP16 ? host::float_to_fp16(nan) : host::float_to_bf16(nan);
          std::memcpy(w, &h, 2);
        }
      }
      return true;
    });
  }
}

// ---------------------------------------------------------------------------------------------
// Generation

MergeCase generate(Rng& rng, bool reference) {
  MergeCase c;
  c.fuzz.op = reference ? "reference::merge_states" : "merge_states";
  c.fuzz.host_memory = reference;
  const int64_t pick_n = rng.uniform(0, 99);
  if (pick_n < 60) {
    c.n = static_cast<int>(rng.uniform(1, 4));
  } else if (pick_n < 78) {
    c.n = static_cast<int>(rng.uniform(5, 16));
  } else if (pick_n < 87) {
    c.n = static_cast<int>(rng.uniform(17, 64));
  } else if (pick_n < 93) {
    c.n = static_cast<int>(rng.pick({65, 100, 127, 128, 128}));
  } else if (pick_n < 96) {
    c.n = static_cast<int>(rng.pick({129, 130}));
  } else if (pick_n < 98) {
    c.n = 0;
  } else {
    c.n = rng.edge_int();
  }
  c.count = std::clamp(c.n, 0, kMostStates);
  c.fuzz.args.resize(static_cast<std::size_t>(2 * c.count + 2));
  c.places.resize(c.fuzz.args.size());

  // Shape: 1-3 row dimensions, small (a case merges at most a few thousand values), 0 now
  // and then, an edge size rarely; d mostly small.
  const int row_dims = static_cast<int>(rng.uniform(1, 3));
  const bool many = c.count > 16;
  const int64_t hi = row_dims == 1 ? (many ? 6 : 12) : row_dims == 2 ? (many ? 3 : 5) : (many ? 2 : 3);
  std::vector<int64_t> rows(row_dims);
  for (int64_t& r : rows) r = rng.chance(0.05) ? 0 : rng.uniform(1, hi);
  int edge_axis = -1;
  if (rng.chance(0.04)) {
    edge_axis = static_cast<int>(rng.uniform(0, row_dims - 1));
    rows[edge_axis] = rng.edge_size();
  }
  int64_t d;
  const int64_t pick_d = rng.uniform(0, 99);
  if (pick_d < 8) {
    d = 0;
  } else if (pick_d < 58) {
    d = rng.uniform(1, 16);
  } else if (pick_d < 90) {
    d = rng.pick({int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{8}, int64_t{16}, int64_t{32}, int64_t{64}, int64_t{128}});
  } else if (pick_d < 97) {
    d = rng.pick({int64_t{256}, int64_t{512}, int64_t{576}});
  } else {
    d = rng.edge_size();
  }
  int64_t row_count = 1;
  for (int64_t r : rows) row_count *= std::clamp<int64_t>(r, 1, 64);
  const int64_t budget = 4096 / std::max<int64_t>(row_count * std::max(c.count, 1), 1);
  if (d > 0 && d <= 576 && d > budget) d = std::max<int64_t>(budget, 1);
  std::vector<int64_t> o_shape = rows;
  o_shape.push_back(d);

  const DType in = rng.pick({kBF16, kFP16, kFP32});
  c.in = in;
  const DType out_dtype = rng.pick({kBF16, kFP16, kFP32});
  auto base = [&] { return static_cast<LseBase>(rng.chance(0.96) ? static_cast<int>(rng.uniform(0, 1)) : rng.edge_int()); };
  c.lse_base = base();
  c.out_lse_base = base();
  c.o_null = rng.chance(0.03);
  c.lse_null = rng.chance(0.03);
  const int64_t fill_mode = rng.uniform(0, 19);
  c.lse_fill = fill_mode < 12   ? LseFill{.nan = 0, .neg_inf = 0.05, .pos_inf = 0.05, .big = 0.03}
               : fill_mode < 17 ? LseFill{.nan = 0, .neg_inf = 0.35, .pos_inf = 0.35, .big = 0.02}
                                : LseFill{.nan = 0.05, .neg_inf = 0.1, .pos_inf = 0.1, .big = 0.05};

  std::string o_text = "-", lse_text = "-";
  if (c.count > 0) {
    o_text = lay_out_states(rng, c, true, in, o_shape);
    lse_text = lay_out_states(rng, c, false, kFP32, rows);
    // An edge-sized row dimension: the LSEs sometimes broadcast along it (with d 0 and no
    // out_lse, a valid call with nothing to write).
    if (edge_axis >= 0 && rng.chance(0.4)) {
      for (int s = 0; s < c.count; ++s) c.arg(c.lse_at(s)).ref.stride[edge_axis] = 0;
    }
  }

  // out: separate, exactly o[k] (in place), or overlapping o[k] or lse[k] without being it.
  Arg& out = c.arg(c.out_at());
  out.spec = TensorSpec{.name = "out", .output = true};
  out.ref = tensor(out_dtype, o_shape, layout(rng, o_shape, true, false));
  std::string out_text = "separate";
  const int k = c.count > 0 ? static_cast<int>(rng.uniform(0, c.count - 1)) : -1;
  if (const int64_t r = rng.uniform(0, 99); k >= 0 && r >= 55) {
    const TensorRef& ok = c.arg(c.o_at(k)).ref;
    Place& p = c.places[c.out_at()];
    p.alias_of = c.o_at(k);
    const std::string at = "o[" + std::to_string(k) + "]";
    if (r < 75) {
      out.ref = ok;
      out_text = "= " + at + " exactly (in place)";
    } else if (r < 80) {
      out.ref = ok;
      out.ref.dtype = ok.dtype == kFP32 ? kBF16 : ok.dtype == kBF16 ? kFP16 : kFP32;
      out_text = "= " + at + " in another dtype";
    } else if (r < 85) {
      out.ref = ok;
      p.offset = elem_bytes(ok.dtype);
      out_text = "= " + at + " + 1 element";
    } else if (r < 90) {
      out.ref.dtype = ok.dtype;
      out_text = "at " + at + "'s pointer, own strides";
    } else if (r < 95) {
      p.alias_of = c.lse_at(k);
      out_text = "at lse[" + std::to_string(k) + "]'s pointer";
    } else {
      p.alias_of = -1;
    }
  }

  // out_lse: absent, separate, exactly lse[k], or overlapping lse[k], out or o[k].
  Arg& out_lse = c.arg(c.out_lse_at());
  out_lse.spec = TensorSpec{.name = "out_lse", .optional = true, .output = true};
  std::string out_lse_text = "not given";
  if (const int64_t r = rng.uniform(0, 99); r >= 25) {
    out_lse.ref = tensor(kFP32, rows, layout(rng, rows, false, false));
    out_lse_text = "separate";
    const int j = c.count > 0 ? static_cast<int>(rng.uniform(0, c.count - 1)) : -1;
    Place& p = c.places[c.out_lse_at()];
    const std::string at = "lse[" + std::to_string(j) + "]";
    if (j >= 0 && r >= 65 && r < 80) {
      out_lse.ref = c.arg(c.lse_at(j)).ref;
      p.alias_of = c.lse_at(j);
      out_lse_text = "= " + at + " exactly (in place)";
    } else if (j >= 0 && r >= 80 && r < 84) {
      out_lse.ref = c.arg(c.lse_at(j)).ref;
      p.alias_of = c.lse_at(j);
      p.offset = 4;
      out_lse_text = "= " + at + " + 1 element";
    } else if (j >= 0 && r >= 84 && r < 88) {
      p.alias_of = c.lse_at(j);
      out_lse_text = "at " + at + "'s pointer, own strides";
    } else if (r >= 88 && r < 92) {
      p.alias_of = c.out_at();
      out_lse_text = "at out's pointer";
    } else if (j >= 0 && r >= 92 && r < 96) {
      p.alias_of = c.o_at(j);
      out_lse_text = "at o[" + std::to_string(j) + "]'s pointer";
    }
  }

  // A state unlike state 0 (or state 0 unlike the others).
  std::string edit_text = "none";
  if (const int passed = std::min(c.n, c.count); passed >= 2 && rng.chance(0.25)) {
    const int s = rng.chance(0.2) ? 0 : static_cast<int>(rng.uniform(1, passed - 1));
    const bool o_side = rng.chance(0.55);
    Arg& a = c.arg(o_side ? c.o_at(s) : c.lse_at(s));
    TensorRef& t = a.ref;
    const int axis = static_cast<int>(rng.uniform(0, std::max(t.rank, 1) - 1));
    const std::string at = a.spec.name;
    switch (rng.uniform(0, 8)) {
      case 0:
        t.dtype = rng.pick({kBF16, kFP16, kFP32, kInt8});
        edit_text = at + ".dtype = " + dtype_name(t.dtype);
        break;
      case 1:
        t.shape[axis] = saturating_add(t.shape[axis], rng.chance(0.5) ? 1 : -1);
        edit_text = at + ".shape[" + std::to_string(axis) + "] +- 1";
        break;
      case 2:
        t.shape[axis] = 0;
        edit_text = at + ".shape[" + std::to_string(axis) + "] = 0";
        break;
      case 3:
        t.stride[axis] = rng.chance(0.5) ? 0 : saturating_add(t.stride[axis], rng.pick({int64_t{1}, int64_t{16}}));
        edit_text = at + ".stride[" + std::to_string(axis) + "] changed";
        break;
      case 4: {  // a stride of a dimension of size 1: never stepped, so still the same layout
        int one = -1;
        for (int i = 0; i < t.rank; ++i) one = t.shape[i] == 1 ? i : one;
        if (one >= 0) t.stride[one] = rng.pick({int64_t{0}, int64_t{7}, int64_t{1} << 40});
        edit_text = one >= 0 ? at + ".stride[" + std::to_string(one) + "] (size 1) changed" : "none";
        break;
      }
      case 5:
        t.rank += rng.chance(0.5) ? 1 : -1;
        if (t.rank > 0 && t.rank <= kMaxRank) {
          t.shape[t.rank - 1] = std::max<int64_t>(t.shape[t.rank - 1], 1);
          t.stride[t.rank - 1] = std::max<int64_t>(t.stride[t.rank - 1], 1);
        }
        edit_text = at + ".rank = " + std::to_string(t.rank);
        break;
      case 6:
        a.force_null = true;
        edit_text = at + " null";
        break;
      case 7:
        a.misalign_bytes = static_cast<int>(rng.pick({1, 2, 4}));
        edit_text = at + " misaligned by " + std::to_string(a.misalign_bytes) + " bytes";
        break;
      default:
        t = TensorRef{};
        edit_text = at + " not given";
        break;
    }
  }

  // The shared mutations, now and then, of one tensor or between two.
  static constexpr int kCounts[] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 3, 4};
  const int total = static_cast<int>(c.fuzz.args.size());
  for (int m = rng.pick(kCounts); m > 0; --m) {
    const int64_t r = rng.uniform(0, 99);
    const auto state = [&] { return rng.chance(0.4) || c.count < 2 ? 0 : static_cast<int>(rng.uniform(1, c.count - 1)); };
    int i = c.out_at();
    if (c.count > 0 && r < 35) i = c.o_at(state());
    if (c.count > 0 && r >= 35 && r < 60) i = c.lse_at(state());
    if (r >= 80 && r < 92) i = c.out_lse_at();
    if (r >= 92) {  // two tensors swapped (or one mutated), e.g. o[k] and lse[k], out and out_lse
      i = static_cast<int>(rng.uniform(0, total - 1));
      const int j = static_cast<int>(rng.uniform(0, total - 1));
      std::vector<Arg> two = {c.arg(i), c.arg(j)};
      mutate_args(rng, two);
      c.arg(i) = two[0];
      if (j != i) c.arg(j) = two[1];
      continue;
    }
    std::vector<Arg> one = {c.arg(i)};
    mutate_args(rng, one);
    c.arg(i) = one[0];
  }

  c.fuzz.scalars = {{"num_states", std::to_string(c.n)},
                    {"o array", c.o_null ? "null" : std::to_string(c.count) + " tensors"},
                    {"lse array", c.lse_null ? "null" : std::to_string(c.count) + " tensors"},
                    {"lse_base", std::to_string(static_cast<int>(c.lse_base))},
                    {"out_lse_base", std::to_string(static_cast<int>(c.out_lse_base))},
                    {"o layout", o_text},
                    {"lse layout", lse_text},
                    {"out", out_text},
                    {"out_lse", out_lse_text},
                    {"state edit", edit_text}};
  return c;
}

// ---------------------------------------------------------------------------------------------
// The contract (docs/contract.md, Merging states; include/mlakit/merge.h), restated.

struct Verdict {
  std::vector<Violation> v{};
  bool plain = false;             // valid, and nothing the library may refuse on documented grounds of its own
  bool nothing_to_write = false;  // neither out nor out_lse has an element
};

// Ordered by stride, each dimension of size > 1 steps past everything the smaller strides
// reach: every element has an address of its own (the documented output-layout test,
// src/host/output_check.h, which may refuse hand-made interleavings that are one-to-one).
bool nested(const TensorRef& t) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] > 1) dims.emplace_back(t.stride[i], t.shape[i]);
  }
  std::sort(dims.begin(), dims.end());
  __int128 reach = 0;
  for (const auto& [stride, size] : dims) {
    if (stride <= reach) return false;
    reach += static_cast<__int128>(size - 1) * stride;
  }
  return true;
}

// Two elements of a tensor at one address: exact over up to 2^16 elements, else the provable
// cases (stride 0, or index k along one dimension landing on index 1 along another).
bool self_overlapping(const TensorRef& t) {
  if (no_elements(t) || nested(t)) return false;
  __int128 elements = 1;
  for (int i = 0; i < t.rank; ++i) elements = std::min<__int128>(elements * t.shape[i], __int128{1} << 40);
  if (elements <= (1 << 16)) {
    std::vector<int64_t> offsets;
    offsets.reserve(static_cast<std::size_t>(elements));
    int64_t idx[kMaxRank] = {};
    for (int64_t e = 0; e < elements; ++e) {
      int64_t off = 0;
      for (int i = 0; i < t.rank; ++i) off += idx[i] * t.stride[i];
      offsets.push_back(off);
      for (int i = t.rank - 1; i >= 0 && ++idx[i] == t.shape[i]; --i) idx[i] = 0;
    }
    std::sort(offsets.begin(), offsets.end());
    return std::adjacent_find(offsets.begin(), offsets.end()) != offsets.end();
  }
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] <= 1) continue;
    if (t.stride[i] == 0) return true;
    for (int j = 0; j < t.rank; ++j) {
      if (j == i || t.shape[j] <= 1 || t.stride[j] < t.stride[i]) continue;
      if (t.stride[j] % t.stride[i] == 0 && t.stride[j] / t.stride[i] < t.shape[i]) return true;
    }
  }
  return false;
}

// The rules of every tensor: sizes and strides >= 0, a pointer unless it has no element, a
// byte extent within int64, and (o, out) the last dimension contiguous. Rank is checked first.
// An argument's name, made only for a violation (a call checks up to 260 tensors).
struct Name {
  const char* base;
  int index = -1;  // o[index], lse[index]
  std::string str() const { return index < 0 ? std::string(base) : indexed(base, index); }
};

void tensor_rules(const TensorRef& t, const Name& name, bool last_contiguous, std::vector<Violation>* v) {
  bool nonnegative = true;
  for (int i = 0; i < t.rank; ++i) {
    const auto at = [&] { return "[" + std::to_string(i) + "]"; };
    if (t.shape[i] < 0) v->push_back({"size", name.str() + ".shape" + at() + " = " + std::to_string(t.shape[i]) + " accepted"});
    if (t.stride[i] < 0) v->push_back({"stride", name.str() + ".stride" + at() + " = " + std::to_string(t.stride[i]) + " accepted"});
    nonnegative &= t.shape[i] >= 0 && t.stride[i] >= 0;
  }
  if (no_elements(t)) return;  // nothing is read or written through it
  if (t.data == nullptr) v->push_back({"null", name.str() + ": null pointer with elements accepted"});
  if (nonnegative) {
    __int128 last = 0;
    for (int i = 0; i < t.rank && last <= kI64Max; ++i) last += static_cast<__int128>(t.shape[i] - 1) * t.stride[i];
    if (last > kI64Max || (last + 1) * elem_bytes(t.dtype) > kI64Max) v->push_back({"extent", name.str() + ": byte extent beyond int64 accepted"});
  }
  const int l = t.rank - 1;
  if (last_contiguous && t.shape[l] > 1 && t.stride[l] != 1) v->push_back({"last-dim", name.str() + ": last dimension not contiguous, accepted"});
}

struct Span {
  bool empty = true;
  __int128 first = 0, last = 0;
};
Span span_of(const TensorRef& t) {
  if (t.empty() || no_elements(t)) return {};
  __int128 last = 0;
  for (int i = 0; i < t.rank; ++i) last += static_cast<__int128>(t.shape[i] - 1) * t.stride[i];
  const auto first = static_cast<__int128>(reinterpret_cast<std::uintptr_t>(t.data));
  return {false, first, first + (last + 1) * elem_bytes(t.dtype) - 1};
}
bool overlap(const Span& a, const Span& b) { return !a.empty && !b.empty && a.first <= b.last && b.first <= a.last; }

// The same elements at the same addresses: pointer, dtype, rank, sizes, and the strides of
// every dimension that is stepped (size > 1).
bool same_view(const TensorRef& a, const TensorRef& b) {
  if (a.data != b.data || a.dtype != b.dtype || a.rank != b.rank) return false;
  for (int i = 0; i < a.rank; ++i) {
    if (a.shape[i] != b.shape[i] || (a.shape[i] > 1 && a.stride[i] != b.stride[i])) return false;
  }
  return true;
}

// A detail about state k starts with "o[i]" / "lse[i]" (then the state's name): the failure
// summary groups failures by the detail's first word, and one defect would otherwise make a
// signature per state.
std::string keyed(const std::string& detail) {
  for (const char* array : {"o[", "lse["}) {
    const std::size_t n = std::strlen(array);
    if (detail.compare(0, n, array) != 0) continue;
    const std::size_t close = detail.find(']', n);
    if (close == std::string::npos || close == n || detail.find_first_not_of("0123456789", n) != close) continue;
    return std::string(array) + "i]" + detail.substr(close + 1, detail.find_first_of(":= ", close) - close - 1) + ": " + detail;
  }
  return detail;
}

Verdict judge_tensors(const MergeStatesArgs& a, bool gpu, bool any_beyond_cap) {
  Verdict r;
  auto add = [&](const char* kind, const std::string& what) { r.v.push_back({kind, what}); };
  if (a.num_states < 1 || a.num_states > kMaxMergeStates) add("problem", "num_states = " + std::to_string(a.num_states) + " accepted");
  if (a.o == nullptr) add("null", "o: null array accepted");
  if (a.lse == nullptr) add("null", "lse: null array accepted");
  if (!valid_base(a.lse_base)) add("problem", "lse_base = " + std::to_string(static_cast<int>(a.lse_base)) + " accepted");
  if (!valid_base(a.out_lse_base)) add("problem", "out_lse_base = " + std::to_string(static_cast<int>(a.out_lse_base)) + " accepted");
  if (!r.v.empty()) return r;  // the tensors cannot be looked at
  const int n = a.num_states;
  const TensorRef& o0 = a.o[0];
  if (o0.rank < 2 || o0.rank > 4) {
    add("rank", "o[0]: rank " + std::to_string(o0.rank) + " accepted, documented 2..4 ([rows..., d], 1-3 row dimensions)");
    return r;
  }
  const int rank = o0.rank, dims = rank - 1;
  const TensorRef& lse0 = a.lse[0];
  for (int s = 0; s < n; ++s) {
    const TensorRef& o = a.o[s];
    const Name name{"o", s};
    if (o.rank != rank) {
      add("rank", name.str() + ": rank " + std::to_string(o.rank) + " accepted, o[0] has " + std::to_string(rank));
      continue;
    }
    if (!value_dtype(o.dtype)) add("dtype", name.str() + ".dtype " + dtype_name(o.dtype) + " accepted");
    if (o.dtype != o0.dtype) add("dtype", name.str() + ".dtype differs from o[0]'s, accepted");
    bool same_shape = true;
    for (int i = 0; i < rank; ++i) {
      if (o.shape[i] != o0.shape[i]) {
        add("dims", name.str() + ".shape[" + std::to_string(i) + "] = " + std::to_string(o.shape[i]) + " accepted, o[0] has " +
                        std::to_string(o0.shape[i]));
        same_shape = false;
      }
    }
    tensor_rules(o, name, true, &r.v);
    for (int i = 0; same_shape && !no_elements(o) && i < rank; ++i) {
      if (o.shape[i] > 1 && o.stride[i] != o0.stride[i]) add("stride", name.str() + ".stride[" + std::to_string(i) + "] differs from o[0]'s, accepted");
    }
  }
  for (int s = 0; s < n; ++s) {
    const TensorRef& l = a.lse[s];
    const Name name{"lse", s};
    if (l.rank != dims) {
      add("rank", name.str() + ": rank " + std::to_string(l.rank) + " accepted, documented " + std::to_string(dims) + " (o[0]'s rows)");
      continue;
    }
    if (l.dtype != kFP32) add("dtype", name.str() + ".dtype " + dtype_name(l.dtype) + " accepted");
    bool same_shape = true;
    for (int i = 0; i < dims; ++i) {
      if (l.shape[i] != o0.shape[i]) {
        add("dims", name.str() + ".shape[" + std::to_string(i) + "] = " + std::to_string(l.shape[i]) + " accepted, o[0] has " +
                        std::to_string(o0.shape[i]));
        same_shape = false;
      }
    }
    tensor_rules(l, name, false, &r.v);
    for (int i = 0; same_shape && !no_elements(l) && lse0.rank == dims && i < dims; ++i) {
      if (l.shape[i] > 1 && l.stride[i] != lse0.stride[i]) add("stride", name.str() + ".stride[" + std::to_string(i) + "] differs from lse[0]'s, accepted");
    }
  }
  auto output = [&](const TensorRef& t, const char* name, int want_rank, bool values) {
    if (t.rank != want_rank) {
      add("rank", std::string(name) + ": rank " + std::to_string(t.rank) + " accepted, documented " + std::to_string(want_rank));
      return;
    }
    if (values ? !value_dtype(t.dtype) : t.dtype != kFP32) add("dtype", std::string(name) + ".dtype " + dtype_name(t.dtype) + " accepted");
    for (int i = 0; i < want_rank; ++i) {
      if (t.shape[i] != o0.shape[i]) {
        add("dims", std::string(name) + ".shape[" + std::to_string(i) + "] = " + std::to_string(t.shape[i]) +
                        " accepted, o[0] has " + std::to_string(o0.shape[i]));
      }
    }
    tensor_rules(t, Name{name}, values, &r.v);
    if (r.v.empty() && self_overlapping(t)) add("overlap", std::string(name) + ": self-overlapping output accepted");
  };
  if (a.out.empty()) {
    add("null", "out: not given, accepted");
  } else {
    output(a.out, "out", rank, true);
  }
  if (!a.out_lse.empty()) output(a.out_lse, "out_lse", dims, false);
  if (!r.v.empty()) return r;  // the overlaps need well-formed tensors

  // Outputs: disjoint from every input and from each other, but for exactly one input of their
  // kind (in place). Intervals, as documented (src/host/output_check.h: conservative).
  const Span out = span_of(a.out), out_lse = span_of(a.out_lse);
  for (int s = 0; s < n; ++s) {
    const Span o = span_of(a.o[s]), l = span_of(a.lse[s]);
    if (!same_view(a.out, a.o[s]) && overlap(out, o)) add("overlap", "out overlaps o[" + std::to_string(s) + "] (not exactly it), accepted");
    if (overlap(out, l)) add("overlap", "out overlaps lse[" + std::to_string(s) + "], accepted");
    if (overlap(out_lse, o)) add("overlap", "out_lse overlaps o[" + std::to_string(s) + "], accepted");
    if (!same_view(a.out_lse, a.lse[s]) && overlap(out_lse, l)) {
      add("overlap", "out_lse overlaps lse[" + std::to_string(s) + "] (not exactly it), accepted");
    }
  }
  if (overlap(out, out_lse)) add("overlap", "out_lse overlaps out, accepted");
  // The GPU loads and stores elements (16-byte chunks, or one value): a pointer not aligned to
  // its element size is a misaligned access on the device.
  if (gpu) {
    auto aligned = [&](const TensorRef& t, const Name& name) {
      if (t.empty() || no_elements(t)) return;
      if (reinterpret_cast<std::uintptr_t>(t.data) % static_cast<std::uintptr_t>(elem_bytes(t.dtype)) != 0) {
        add("alignment", name.str() + ": pointer not aligned to its " + std::to_string(elem_bytes(t.dtype)) +
                             "-byte elements, accepted (the kernel loads elements)");
      }
    };
    for (int s = 0; s < n; ++s) {
      aligned(a.o[s], Name{"o", s});
      aligned(a.lse[s], Name{"lse", s});
    }
    aligned(a.out, Name{"out"});
    aligned(a.out_lse, Name{"out_lse"});
  }
  r.nothing_to_write = no_elements(a.out) && (a.out_lse.empty() || no_elements(a.out_lse));
  r.plain = r.v.empty() && !any_beyond_cap && (no_elements(a.out) || nested(a.out)) &&
            (a.out_lse.empty() || no_elements(a.out_lse) || nested(a.out_lse));
  return r;
}

Verdict judge(const MergeStatesArgs& a, bool gpu, bool any_beyond_cap) {
  Verdict r = judge_tensors(a, gpu, any_beyond_cap);
  for (Violation& v : r.v) v.detail = keyed(v.detail);
  return r;
}

// An InvalidArgument names its argument right after "<op>: ": num_states, o, lse, o[i] or
// lse[i] (i < num_states), out, out_lse, lse_base or out_lse_base, then ':' or '.'.
void check_names_argument(Recorder& rec, const Status& st, const std::string& op, int n) {
  if (st.code() != StatusCode::kInvalidArgument || st.message().rfind(op + ": ", 0) != 0) return;
  const std::string rest = st.message().substr(op.size() + 2);
  std::size_t i = 0;
  while (i < rest.size() && (std::islower(static_cast<unsigned char>(rest[i])) || rest[i] == '_')) ++i;
  const std::string name = rest.substr(0, i);
  static const char* const kNames[] = {"num_states", "o", "lse", "out", "out_lse", "lse_base", "out_lse_base"};
  bool ok = std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
  if (ok && i < rest.size() && rest[i] == '[') {
    std::size_t j = i + 1;
    int64_t index = 0;
    while (j < rest.size() && std::isdigit(static_cast<unsigned char>(rest[j])) && index < (int64_t{1} << 40)) index = index * 10 + (rest[j++] - '0');
    ok = (name == "o" || name == "lse") && j > i + 1 && j < rest.size() && rest[j] == ']' && index < n;
    i = j + 1;
  }
  ok = ok && i < rest.size() && (rest[i] == ':' || rest[i] == '.');
  if (!ok) rec.fail("message", "InvalidArgument without an argument's name after \"" + op + ": \": \"" + st.message() + "\"");
}

MergeStatesArgs call_args(const MergeCase& c, std::vector<TensorRef>& o, std::vector<TensorRef>& lse) {
  o.clear();
  lse.clear();
  for (int s = 0; s < c.count; ++s) {
    o.push_back(c.arg(c.o_at(s)).ref);
    lse.push_back(c.arg(c.lse_at(s)).ref);
  }
  MergeStatesArgs a;
  a.o = c.o_null ? nullptr : o.data();
  a.lse = c.lse_null ? nullptr : lse.data();
  a.num_states = c.n;
  a.lse_base = c.lse_base;
  a.out = c.arg(c.out_at()).ref;
  a.out_lse = c.arg(c.out_lse_at()).ref;
  a.out_lse_base = c.out_lse_base;
  return a;
}

bool any_beyond_cap(const MergeCase& c) {
  return std::any_of(c.fuzz.args.begin(), c.fuzz.args.end(), [](const Arg& a) { return a.beyond_cap; });
}

// ---------------------------------------------------------------------------------------------
// The GPU entry

void run_gpu(Rng& rng, Recorder& rec, int64_t index) {
  MergeCase c = generate(rng, false);
  Blocks mem(true);
  attach(c, mem);
  std::vector<TensorRef> o, lse;
  const MergeStatesArgs a = call_args(c, o, lse);
  if (!rec.begin(index, c.fuzz)) return;
  const Status st = merge_states(a, nullptr);
  const bool accepted = reached_device(st);
  const Verdict verdict = judge(a, true, any_beyond_cap(c));
  std::vector<StatusCode> codes = gpu_codes();
  codes.push_back(StatusCode::kOk);  // a problem with nothing to write needs no device
  rec.check_status(st, codes, accepted, accepted ? verdict.v : std::vector<Violation>{});
  check_names_argument(rec, st, c.fuzz.op, c.n);
  if (!MLAKIT_WITH_CUDA) {  // with CUDA, the host blocks are refused as host memory
    if (st.is_ok() && verdict.v.empty() && !verdict.nothing_to_write) {
      rec.fail("status code", "Ok: without a device, for a problem with something to write");
    }
    if (verdict.plain && verdict.nothing_to_write && !st.is_ok()) {
      rec.fail("rejected", "nothing-to-write: a valid problem with nothing to write (nothing to launch) not Ok: " +
                               st.to_string());
    } else if (verdict.plain && !accepted) {
      rec.fail("rejected", "valid call rejected: " + st.to_string());
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The reference

// After an accepted call: bytes outside out's and out_lse's elements as they were.
void check_writes(Recorder& rec, const MergeCase& c, const MergeStatesArgs& a, const Blocks& mem) {
  for (int b = 0; b < mem.count(); ++b) {
    if (!mem.changed(b)) continue;
    std::vector<char> written(static_cast<std::size_t>(mem.size(b)), 0);
    auto mark = [&](const TensorRef& t, const Place& p, bool column) {
      if (p.block != b || t.empty() || no_elements(t)) return;
      const int dims = column ? t.rank - 1 : t.rank;
      const int64_t size = elem_bytes(t.dtype);
      for_each_row(t.shape, dims, [&](const int64_t* idx) {
        for (int64_t j = 0; j < (column ? t.shape[dims] : 1); ++j) {
          const __int128 byte = p.at + static_cast<__int128>(offset_of(t, idx, dims, j, column)) * size;
          for (int64_t k = 0; k < size; ++k) {
            if (byte + k >= 0 && byte + k < mem.size(b)) written[static_cast<std::size_t>(byte + k)] = 1;
          }
        }
        return true;
      });
    };
    mark(a.out, c.places[c.out_at()], true);
    mark(a.out_lse, c.places[c.out_lse_at()], false);
    for (int64_t k = 0; k < mem.size(b); ++k) {
      if (!written[k] && mem.data(b)[k] != mem.before(b)[k]) {
        const bool input = mem.role(b) != Role::kOut;
        rec.fail(input ? "accepted: input-written" : "accepted: write-outside",
                 std::string(input ? "input" : "output") + " block " + std::to_string(b) + ": byte " + std::to_string(k) +
                     " outside out's and out_lse's elements written");
        return;
      }
    }
  }
}

std::string num(double v) { return str(static_cast<float>(v)); }

// The merged rows against the inputs (read from the blocks as they were before the call).
void check_results(Recorder& rec, const MergeCase& c, const MergeStatesArgs& a, const Blocks& mem) {
  const int n = a.num_states;
  const TensorRef& o0 = a.o[0];
  const int dims = o0.rank - 1;
  const int64_t d = o0.shape[dims];
  const DType in = o0.dtype, out_dtype = a.out.dtype;
  const bool with_lse = !a.out_lse.empty();
  const double to_natural = a.lse_base == LseBase::kBase2 ? kLn2 : 1.0;
  const double to_out = a.lse_base == a.out_lse_base ? 1.0 : a.out_lse_base == LseBase::kBase2 ? kLog2e : kLn2;
  const Place& out_place = c.places[c.out_at()];
  const Place& out_lse_place = c.places[c.out_lse_at()];
  const double rel = out_dtype == kBF16 ? 0x1p-7 : out_dtype == kFP16 ? 0x1p-10 : 0x1p-22;
  const double tiny = out_dtype == kFP16 ? 0x1p-24 : 1e-37;  // subnormal outputs
  const double out_max = out_dtype == kBF16 ? 3.38e38 : out_dtype == kFP16 ? 65504.0 : FLT_MAX;
  auto round_out = [&](double v) {
    const auto f = static_cast<float>(v);
    return out_dtype == kFP32 ? static_cast<double>(f) : static_cast<double>(host::round_to_half(f, out_dtype));
  };
  std::vector<double> lse(static_cast<std::size_t>(n));
  bool failed = false;
  int64_t row = -1;
  auto fail = [&](const char* kind, const std::string& what) {
    rec.fail(kind, keyed(what) + " (row " + std::to_string(row) + ")");
    failed = true;
  };
  for_each_row(o0.shape, dims, [&](const int64_t* idx) {
    ++row;
    bool has_nan = false;
    int used = 0;
    double top = -std::numeric_limits<double>::infinity();
    for (int s = 0; s < n; ++s) {
      const std::byte* p = element_bytes(mem, true, c.places[c.lse_at(s)], kFP32, offset_of(a.lse[s], idx, dims, 0, false));
      if (p == nullptr) {
        fail("result", "lse[" + std::to_string(s) + "]: element outside its block");
        return false;
      }
      lse[s] = load_value(p, kFP32);
      has_nan |= std::isnan(lse[s]);
      if (std::isfinite(lse[s])) {
        ++used;
        top = std::max(top, lse[s]);
      }
    }
    if (with_lse) {
      const std::byte* p = element_bytes(mem, false, out_lse_place, kFP32, offset_of(a.out_lse, idx, dims, 0, false));
      if (p == nullptr) {
        fail("result", "out_lse: element outside its block");
        return false;
      }
      const double got = load_value(p, kFP32);
      if (has_nan) {
        if (!std::isnan(got)) fail("result: NaN LSE", "out_lse = " + num(got) + ", expected NaN");
      } else if (used == 0) {
        if (got != std::numeric_limits<double>::infinity()) fail("result: every state empty", "out_lse = " + num(got) + ", expected +inf");
      } else {
        const double lo = top * to_out, hi = (top + std::log(static_cast<double>(used)) / to_natural) * to_out;
        const double slack = 0x1p-22 * std::max(std::fabs(lo), std::fabs(hi)) + 1e-44;
        const bool overflow = std::fabs(lo) > FLT_MAX || std::fabs(hi) > FLT_MAX;  // beyond float: +-inf
        if (used == 1 && a.lse_base == a.out_lse_base) {
          if (got != top) fail("result: lone state", "out_lse = " + num(got) + ", expected the state's LSE " + num(top) + " bit for bit");
        } else if (std::isnan(got) || (!overflow && !(got >= lo - slack && got <= hi + slack))) {
          fail("result: LSE bound", "out_lse = " + num(got) + " outside [" + num(lo) + ", " + num(hi) + "]");
        }
      }
    }
    for (int64_t j = 0; j < d && !failed; ++j) {
      const std::byte* p = element_bytes(mem, false, out_place, out_dtype, offset_of(a.out, idx, dims, j, true));
      if (p == nullptr) {
        fail("result", "out: element outside its block");
        return false;
      }
      const double got = load_value(p, out_dtype);
      const std::string at = "out[" + std::to_string(j) + "]";
      if (has_nan) {
        if (!std::isnan(got)) fail("result: NaN LSE", at + " = " + num(got) + ", expected NaN");
        continue;
      }
      if (used == 0) {
        if (got != 0.0) fail("result: every state empty", at + " = " + num(got) + ", expected 0");
        continue;
      }
      double lo = std::numeric_limits<double>::infinity(), hi = -lo;
      bool finite = true;
      for (int s = 0; s < n && finite; ++s) {
        if (!std::isfinite(lse[s])) continue;
        const std::byte* v = element_bytes(mem, true, c.places[c.o_at(s)], in, offset_of(a.o[s], idx, dims, j, true));
        if (v == nullptr) {
          fail("result", "o[" + std::to_string(s) + "]: element outside its block");
          return false;
        }
        const double x = load_value(v, in);
        finite = std::isfinite(x);
        lo = std::min(lo, x);
        hi = std::max(hi, x);
      }
      if (!finite || std::max(std::fabs(lo), std::fabs(hi)) > out_max) continue;  // no bound (inf / NaN values, overflow)
      const double rlo = round_out(lo), rhi = round_out(hi);
      const double slack = rel * std::max(std::fabs(rlo), std::fabs(rhi)) + tiny;
      if (!(got >= rlo - slack && got <= rhi + slack)) {
        fail(std::isnan(got) ? "result: NaN" : "result: out bound",
             at + " = " + num(got) + " outside [" + num(rlo) + ", " + num(rhi) + "] (the states' values)");
      }
    }
    return !failed;
  });
}

void run_reference(Rng& rng, Recorder& rec, int64_t index) {
  MergeCase c = generate(rng, true);
  Blocks mem(false);
  attach(c, mem);
  fill(rng, c, mem);
  mem.snapshot();
  std::vector<TensorRef> o, lse;
  const MergeStatesArgs a = call_args(c, o, lse);
  const Verdict verdict = judge(a, false, any_beyond_cap(c));  // of the arguments: the call changes no TensorRef
  if (!rec.begin(index, c.fuzz)) return;
  const Status st = reference::merge_states(a);
  rec.check_status(st, reference_codes(), st.is_ok(), verdict.v);
  check_names_argument(rec, st, c.fuzz.op, c.n);
  if (!st.is_ok()) {
    for (int b = 0; b < mem.count(); ++b) {
      if (mem.changed(b)) {
        rec.fail("rejected", "block " + std::to_string(b) + " written although the call was rejected: " + st.to_string());
        break;
      }
    }
    if (verdict.plain) rec.fail("rejected", "valid call rejected: " + st.to_string());
    return;
  }
  if (!verdict.v.empty()) return;  // reported; the blocks may not hold what the tensors claim
  check_writes(rec, c, a, mem);
  // With nothing to write, check_writes has shown that nothing was written; the row shape may
  // then be edge-sized (a 0 after a 2^62), which a walk over the rows would never finish.
  if (!verdict.nothing_to_write) check_results(rec, c, a, mem);
}

}  // namespace

std::vector<OpDriver> merge_drivers() {
  return {
      {"merge_states", run_gpu},
      {"reference::merge_states (N states)", run_reference},
  };
}

}  // namespace mlakit::fuzz
