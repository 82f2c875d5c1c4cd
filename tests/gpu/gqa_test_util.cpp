#include "gqa_test_util.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <stdexcept>

#include "support/accuracy.h"

namespace mlakit::testing {
namespace {

constexpr uint16_t kPoison16 = 0xffff;  // the 0xFF fill: NaN in bf16 and fp16
constexpr uint32_t kPoison32 = 0xffffffffu;

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

GqaSpec to_spec(const GqaShape& sh) {
  GqaSpec s;
  s.b = static_cast<int64_t>(sh.lengths.size());
  s.s_q = sh.s_q;
  s.h_q = sh.h_q;
  s.h_kv = sh.h_kv;
  s.d = sh.d;
  s.page = sh.page;
  const int max_len = sh.lengths.empty() ? 0 : *std::max_element(sh.lengths.begin(), sh.lengths.end());
  s.max_blocks = (max_len + sh.page - 1) / sh.page + 1;  // one garbage entry past the longest
  s.cache = sh.format == GqaFormat::kHalf ? sh.q_dtype : sh.format == GqaFormat::kInt8 ? DType::kInt8 : DType::kFP8E4M3;
  s.scales = sh.format == GqaFormat::kHalf        ? GqaScaleLayout::kNone
             : sh.format == GqaFormat::kFp8Tensor ? GqaScaleLayout::kPerTensor
                                                  : GqaScaleLayout::kPerToken;
  s.append = sh.append;
  s.seed = sh.seed;
  s.q_dtype = sh.q_dtype;
  s.lengths = sh.lengths;
  s.amplitude = 0.1f;  // FlashMLA's scale, the one the accuracy rule's absolute tolerance is for
  s.poison = true;
  return s;
}

TensorRef view_tensor(void* data, DType dtype, const GqaView& v) {
  TensorRef t;
  t.data = data;
  t.dtype = dtype;
  t.rank = v.rank;
  for (int k = 0; k < v.rank; ++k) t.shape[k] = v.shape[k], t.stride[k] = v.stride[k];
  return t;
}

// A contiguous host tensor of `elem`-byte elements into a device buffer laid out as `v`, padding 0xFF.
DeviceBuffer upload_view(const void* src, std::size_t elem, const GqaView& v) {
  std::vector<uint8_t> bytes(v.extent * elem, 0xff);
  for (int64_t flat = 0; flat < v.numel(); ++flat) {
    std::memcpy(&bytes[v.at(flat) * elem], static_cast<const uint8_t*>(src) + flat * elem, elem);
  }
  return DeviceBuffer(bytes);
}

std::string hex(uint32_t bits, int digits) {
  char text[16];
  std::snprintf(text, sizeof(text), "0x%0*x", digits, bits);
  return text;
}

// Collects failures, keeping the first few messages.
struct Failures {
  std::vector<std::string> messages;
  void add(const std::string& m) {
    if (messages.size() < 4) messages.push_back(m);
  }
  std::string joined() const {
    std::string s;
    for (const std::string& m : messages) s += (s.empty() ? "" : "; ") + m;
    return s;
  }
};

}  // namespace

const char* gqa_format_name(GqaFormat format) {
  switch (format) {
    case GqaFormat::kHalf: return "half";
    case GqaFormat::kInt8: return "int8";
    case GqaFormat::kFp8Token: return "fp8token";
    case GqaFormat::kFp8Tensor: return "fp8tensor";
  }
  return "?";
}

std::string gqa_case_name(const GqaShape& sh, const GqaOptions& o) {
  std::ostringstream s;
  const int max_len = sh.lengths.empty() ? 0 : *std::max_element(sh.lengths.begin(), sh.lengths.end());
  s << "d" << sh.d << "_hq" << sh.h_q << "_hkv" << sh.h_kv << "_sq" << sh.s_q << "_page" << sh.page << "_b"
    << sh.lengths.size() << "_max" << max_len << "_" << gqa_format_name(sh.format) << "_"
    << (sh.q_dtype == DType::kFP16 ? "fp16" : "bf16") << (sh.append ? "_append" : "");
  if (o.rope.style != RopeStyle::kNone) {
    s << (o.rope.style == RopeStyle::kNeox ? "_neox" : "_gptj") << (o.rope.rotary_dim ? o.rope.rotary_dim : sh.d);
  }
  if (o.causal) s << "_causal";
  if (o.window > 0) s << "_window" << o.window;
  if (o.softcap > 0) s << "_softcap";
  if (o.alibi) s << "_alibi";
  if (o.finished) s << "_finished";
  if (!o.lse) s << "_nolse";
  if (o.strided) s << "_strided";
  if (o.softmax_scale) s << "_scale";
  return s.str();
}

std::vector<int32_t> gqa_lengths(int64_t b, int s_q, bool append, int page, int max_len, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int lo = append ? s_q : 0;
  max_len = std::max(max_len, lo);
  auto uniform = [&](int a, int z) { return a + static_cast<int>(rng() % static_cast<uint64_t>(z - a + 1)); };
  std::vector<int32_t> lengths(b);
  for (auto& L : lengths) {
    switch (rng() % 6) {
      case 0: L = lo; break;
      case 1: L = 1; break;
      case 2:
      case 3: L = page * uniform(1, std::max(1, max_len / page)) + uniform(-1, 1); break;
      case 4: L = max_len; break;
      default: L = uniform(lo, max_len);
    }
    L = std::clamp(L, lo, max_len);
  }
  return lengths;
}

int64_t GqaView::numel() const {
  int64_t n = 1;
  for (int k = 0; k < rank; ++k) n *= shape[k];
  return n;
}

int64_t GqaView::at(int64_t flat) const {
  int64_t offset = 0;
  for (int k = rank - 1; k >= 0; --k) {
    offset += (flat % shape[k]) * stride[k];
    flat /= shape[k];
  }
  return offset;
}

GqaView gqa_view(std::initializer_list<int64_t> shape, bool padded) {
  // Padding in elements added to the strides of dims 0 .. rank - 2: multiples of 16 for the
  // 16-bit rank-4 tensors (rows stay 32-byte aligned), odd ones for the float32 lse.
  static constexpr int64_t kPad4[3] = {32, 16, 16}, kPad3[2] = {5, 3};
  GqaView v;
  v.rank = static_cast<int>(shape.size());
  std::copy(shape.begin(), shape.end(), v.shape);
  v.stride[v.rank - 1] = 1;
  for (int k = v.rank - 2; k >= 0; --k) {
    const int64_t pad = !padded ? 0 : v.rank == 4 ? kPad4[k] : kPad3[k];
    v.stride[k] = v.shape[k + 1] * v.stride[k + 1] + pad;
  }
  v.extent = v.numel() == 0 ? 0 : v.shape[0] * v.stride[0];
  return v;
}

GqaGpuCase::GqaGpuCase(const GqaShape& sh, const GqaOptions& o) : shape(sh), opt(o), host(to_spec(sh)) {
  const GqaSpec& s = host.s;
  for (int64_t i = 0; i < s.b; ++i) host.finished[i] = o.finished && (s.b == 1 ? i == 0 : i % 3 == 1);
  for (int h = 0; h < s.h_q; ++h) host.alibi[h] = std::exp2(-8.0f * (h + 1) / s.h_q);
  GqaDecodeArgs& a = host.args;
  a.rope = o.rope;
  a.causal = o.causal;
  a.window = o.window;
  a.softcap = o.softcap;
  a.softmax_scale = o.softmax_scale;
  if (o.alibi) a.alibi_slopes = make_tensor(host.alibi.data(), DType::kFP32, {s.h_q});
  if (o.finished) a.finished = make_tensor(host.finished.data(), DType::kUInt8, {s.b});
  kc0_ = host.kc, vc0_ = host.vc, ks0_ = host.ks, vs0_ = host.vs;

  q_view_ = gqa_view({s.b, s.s_q, s.h_q, s.d}, o.strided);
  new_view_ = gqa_view({s.b, s.s_q, s.h_kv, s.d}, o.strided);
  out_view_ = q_view_;
  lse_view_ = gqa_view({s.b, s.h_q, s.s_q}, o.strided);
  q = upload_view(host.q.data(), 2, q_view_);
  kc = DeviceBuffer(host.kc);
  vc = DeviceBuffer(host.vc);
  ks = DeviceBuffer(host.ks);
  vs = DeviceBuffer(host.vs);
  table = DeviceBuffer(host.table);
  seqlens = DeviceBuffer(host.seqlens);
  if (s.append) {
    k_new = upload_view(host.k_new.data(), 2, new_view_);
    v_new = upload_view(host.v_new.data(), 2, new_view_);
  }
  alibi = DeviceBuffer(host.alibi);
  finished = DeviceBuffer(host.finished);
  out = DeviceBuffer(out_view_.extent * 2);
  if (o.lse) lse = DeviceBuffer(lse_view_.extent * 4);

  args = a;
  args.q = view_tensor(q.get(), s.q_dtype, q_view_);
  args.k_cache.values.data = kc.get();
  args.v_cache.values.data = vc.get();
  if (s.scales != GqaScaleLayout::kNone) {
    args.k_cache.scale.data = ks.get();
    args.v_cache.scale.data = vs.get();
  }
  args.block_table.data = table.get();
  args.cache_seqlens.data = seqlens.get();
  if (s.append) {
    args.k_new = view_tensor(k_new.get(), s.q_dtype, new_view_);
    args.v_new = view_tensor(v_new.get(), s.q_dtype, new_view_);
  }
  if (o.alibi) args.alibi_slopes.data = alibi.get();
  if (o.finished) args.finished.data = finished.get();
  args.out = view_tensor(out.get(), s.q_dtype, out_view_);
  args.lse = o.lse ? view_tensor(lse.get(), DType::kFP32, lse_view_) : TensorRef{};
  poison_outputs();
}

GqaDecodeProblem GqaGpuCase::problem() const {
  const GqaSpec& s = host.s;
  return GqaDecodeProblem{s.b, s.s_q, s.h_q, s.h_kv, s.d, opt.causal, opt.window};
}

Status GqaGpuCase::run_reference(int num_threads) { return reference::gqa_decode(host.args, num_threads); }

std::string GqaGpuCase::reference_sanity() const {
  const GqaSpec& s = host.s;
  for (int64_t i = 0; i < s.b; ++i) {
    if (is_finished(i)) continue;
    for (int64_t e = i * s.s_q * s.h_q * s.d; e < (i + 1) * s.s_q * s.h_q * s.d; ++e) {
      if (std::isnan(host.out[e])) return "the reference's out has NaN in entry " + std::to_string(i);
    }
    for (int64_t e = i * s.h_q * s.s_q; e < (i + 1) * s.h_q * s.s_q; ++e) {
      if (std::isnan(host.lse[e])) return "the reference's lse has NaN in entry " + std::to_string(i);
    }
  }
  return "";
}

void GqaGpuCase::set_lengths(const std::vector<int32_t>& lengths) {
  std::copy(lengths.begin(), lengths.end(), host.seqlens.begin());
  std::copy(kc0_.begin(), kc0_.end(), host.kc.begin());
  std::copy(vc0_.begin(), vc0_.end(), host.vc.begin());
  std::copy(ks0_.begin(), ks0_.end(), host.ks.begin());
  std::copy(vs0_.begin(), vs0_.end(), host.vs.begin());
  std::fill(host.out.begin(), host.out.end(), NAN);
  std::fill(host.lse.begin(), host.lse.end(), NAN);
  seqlens.upload(host.seqlens.data(), host.seqlens.size() * 4);
  restore_caches();
}

void GqaGpuCase::restore_caches() {
  kc.upload(kc0_.data(), kc0_.size());
  vc.upload(vc0_.data(), vc0_.size());
  ks.upload(ks0_.data(), ks0_.size() * 4);
  vs.upload(vs0_.data(), vs0_.size() * 4);
}

void GqaGpuCase::poison_outputs() {
  out.fill_bytes(0xff);
  if (opt.lse) lse.fill_bytes(0xff);
}

void GqaGpuCase::reset() {
  restore_caches();
  poison_outputs();
  check_cuda(cudaDeviceSynchronize(), "reset");  // the fills may run after the host returns
}

std::vector<const char*> GqaGpuCase::written_names() const {
  std::vector<const char*> names = {"out"};
  if (opt.lse) names.push_back("lse");
  names.insert(names.end(), {"k_cache", "v_cache"});
  if (host.s.scales != GqaScaleLayout::kNone) names.insert(names.end(), {"k_scale", "v_scale"});
  return names;
}

std::vector<GqaGpuCase::Written> GqaGpuCase::written() {
  std::vector<Written> w = {{"out", &out}};
  if (opt.lse) w.push_back({"lse", &lse});
  w.push_back({"k_cache", &kc});
  w.push_back({"v_cache", &vc});
  if (host.s.scales != GqaScaleLayout::kNone) {
    w.push_back({"k_scale", &ks});
    w.push_back({"v_scale", &vs});
  }
  return w;
}

std::vector<std::vector<uint8_t>> GqaGpuCase::download() {
  std::vector<std::vector<uint8_t>> bytes;
  for (const Written& w : written()) bytes.push_back(w.buffer->download<uint8_t>());
  return bytes;
}

namespace {

// One output (out or lse) of a call: in-view elements of finished entries and the padding must
// keep the poison; the rest within the accuracy rule, exact zeros in empty rows (out).
template <typename Bits>
void check_output(const GqaGpuCase& c, const char* name, const std::vector<uint8_t>& bytes, const GqaView& v,
                  bool is_out, Failures* f) {
  const GqaSpec& s = c.host.s;
  const Bits poison = sizeof(Bits) == 2 ? kPoison16 : kPoison32;
  if (bytes.size() != static_cast<std::size_t>(v.extent) * sizeof(Bits)) {
    return f->add(std::string(name) + ": " + std::to_string(bytes.size()) + " bytes downloaded");
  }
  std::vector<Bits> got(v.numel());
  std::vector<char> in_view(v.extent, 0);
  const int64_t per_entry = v.numel() / std::max<int64_t>(1, s.b);
  int64_t stray = 0, nonzero = 0;
  for (int64_t flat = 0; flat < v.numel(); ++flat) {
    const int64_t off = v.at(flat), i = flat / per_entry;
    in_view[off] = 1;
    std::memcpy(&got[flat], &bytes[off * sizeof(Bits)], sizeof(Bits));
    if (c.is_finished(i) && got[flat] != poison && stray++ == 0) {
      f->add(std::string(name) + "[" + std::to_string(flat) + "] of finished entry " + std::to_string(i) +
             ": bits " + hex(got[flat], 2 * sizeof(Bits)) + ", expected the poison left untouched");
    }
    if (is_out && !c.is_finished(i)) {
      const int64_t t = flat / (s.h_q * s.d) % s.s_q, h = flat / s.d % s.h_q;
      const bool empty_row = c.host.lse[(i * s.h_q + h) * s.s_q + t] == INFINITY;
      if (empty_row && (got[flat] & 0x7fff) != 0 && nonzero++ == 0) {
        f->add(std::string(name) + "[" + std::to_string(flat) + "] (entry " + std::to_string(i) + " token " +
               std::to_string(t) + " head " + std::to_string(h) + ", no visible key): bits " +
               hex(got[flat], 4) + ", expected exactly 0");
      }
    }
  }
  int64_t padding = 0;
  for (int64_t off = 0; off < v.extent; ++off) {
    Bits bits;
    std::memcpy(&bits, &bytes[off * sizeof(Bits)], sizeof(Bits));
    if (!in_view[off] && bits != poison && padding++ == 0) {
      f->add(std::string(name) + ": padding element " + std::to_string(off) + " of the strided view written");
    }
  }
  support::AccuracyReport r;
  if constexpr (sizeof(Bits) == 2) {
    r = support::check_half_outputs(got, c.host.out, s.q_dtype, name);
  } else {
    std::vector<float> as_float(got.size());
    std::memcpy(as_float.data(), got.data(), got.size() * 4);
    r = support::check_float_stats(as_float, c.host.lse, name);
  }
  if (!r.ok) f->add(r.message + " (cosine diff " + std::to_string(r.cosine_diff) + ")");
}

// Is (block, row) one of the slots the step appends to?
bool appended_slot(const GqaGpuCase& c, int64_t block, int64_t row) {
  const GqaSpec& s = c.host.s;
  if (!s.append) return false;
  for (int64_t i = 0; i < s.b; ++i) {
    for (int t = 0; t < s.s_q; ++t) {
      const int64_t pos = c.host.seqlens[i] - s.s_q + t;
      if (pos >= 0 && c.host.block_of(i, pos) == block && pos % s.page == row) return true;
    }
  }
  return false;
}

// A cache or scale buffer against the reference's, byte for byte; `slot_bytes` per (block, row, kv head).
void check_bytes(const GqaGpuCase& c, const char* name, const std::vector<uint8_t>& got, const void* want,
                 std::size_t want_bytes, int64_t slot_bytes, Failures* f) {
  if (got.size() != want_bytes) return f->add(std::string(name) + ": size differs");
  int64_t first = -1, differing = 0;
  const auto* w = static_cast<const uint8_t*>(want);
  for (std::size_t e = 0; e < want_bytes; e += slot_bytes) {
    if (std::memcmp(&got[e], &w[e], slot_bytes) == 0) continue;
    if (first < 0) first = static_cast<int64_t>(e / slot_bytes);
    ++differing;
  }
  if (differing == 0) return;
  const GqaSpec& s = c.host.s;
  if (want_bytes == 4 && s.scales == GqaScaleLayout::kPerTensor) {
    return f->add(std::string(name) + ": the per-tensor scale (an input) changed");
  }
  const int64_t block = first / s.h_kv / s.page, row = first / s.h_kv % s.page, hk = first % s.h_kv;
  f->add(std::string(name) + ": " + std::to_string(differing) + " (token, kv head) rows differ from the reference's, " +
         "first at block " + std::to_string(block) + " row " + std::to_string(row) + " kv head " + std::to_string(hk) +
         (appended_slot(c, block, row) ? " (an appended slot)" : " (a slot this step must not write)"));
}

}  // namespace

std::string GqaGpuCase::check(const std::vector<std::vector<uint8_t>>& got) const {
  if (got.size() != written_names().size()) return "wrong number of downloads";
  Failures f;
  std::size_t k = 0;
  check_output<uint16_t>(*this, "out", got[k++], out_view_, true, &f);
  if (opt.lse) check_output<uint32_t>(*this, "lse", got[k++], lse_view_, false, &f);
  const int64_t row_bytes = host.s.d * static_cast<int64_t>(dtype_size(host.s.cache));
  check_bytes(*this, "k_cache", got[k++], host.kc.data(), host.kc.size(), row_bytes, &f);
  check_bytes(*this, "v_cache", got[k++], host.vc.data(), host.vc.size(), row_bytes, &f);
  if (host.s.scales != GqaScaleLayout::kNone) {
    check_bytes(*this, "k_scale", got[k++], host.ks.data(), host.ks.size() * 4, 4, &f);
    check_bytes(*this, "v_scale", got[k++], host.vs.data(), host.vs.size() * 4, 4, &f);
  }
  return f.joined();
}

DeviceBuffer gqa_workspace(const GqaDecodeProblem& problem) {
  std::size_t bytes = 0;
  const Status s = gqa_decode_workspace_size(problem, &bytes);
  if (!s) throw std::runtime_error(s.to_string());
  return DeviceBuffer(bytes);
}

void poison_gqa_partials(const GqaDecodePlan& plan) {
  // Offset 0 would be the schedule itself: a plan that does not use the regions keeps it.
  if (plan.workspace == nullptr || plan.partial_out_offset == 0 || plan.workspace_bytes <= plan.partial_out_offset) {
    return;
  }
  check_cuda(cudaMemset(static_cast<char*>(plan.workspace) + plan.partial_out_offset, 0xff,
                        plan.workspace_bytes - plan.partial_out_offset),
             "poison partials");
}

bool gqa_plan_splits(const GqaDecodePlan& plan) {
  if (plan.problem.b == 0 || plan.problem.s_q == 0 || plan.workspace == nullptr) return false;
  std::vector<int32_t> prefix(plan.problem.b + 1);
  check_cuda(cudaMemcpy(prefix.data(), static_cast<const char*>(plan.workspace) + plan.split_prefix_offset,
                        prefix.size() * sizeof(int32_t), cudaMemcpyDeviceToHost),
             "split prefix");
  for (int64_t i = 0; i < plan.problem.b; ++i) {
    if (prefix[i + 1] - prefix[i] >= 2) return true;
  }
  return false;
}

GqaCalls call_gqa(GqaGpuCase& c, int calls) {
  GqaCalls r;
  DeviceBuffer ws = gqa_workspace(c.problem());
  r.status = gqa_decode_plan(c.problem(), c.args.cache_seqlens, ws.get(), ws.bytes(), nullptr, &r.plan);
  if (!r.status) return r;
  r.split = gqa_plan_splits(r.plan);
  for (int call = 0; call < calls; ++call) {
    c.reset();
    poison_gqa_partials(r.plan);
    r.status = gqa_decode(c.args, r.plan, nullptr);
    if (!r.status) return r;
    if (const cudaError_t err = cudaDeviceSynchronize(); err != cudaSuccess) {
      r.status = Status(StatusCode::kCudaError, "call " + std::to_string(call) + ": " + cudaGetErrorString(err));
      return r;
    }
    r.results.push_back(c.download());
  }
  r.plan.workspace = nullptr;  // freed with `ws`
  return r;
}

std::string check_calls(const GqaGpuCase& c, const GqaCalls& calls) {
  if (!calls.status) return calls.status.to_string();
  if (calls.results.empty()) return "no call ran";
  if (std::string bad = c.check(calls.results[0]); !bad.empty()) return "call 0: " + bad;
  const std::vector<const char*> names = c.written_names();
  for (std::size_t call = 1; call < calls.results.size(); ++call) {
    std::string diff;
    for (std::size_t k = 0; k < names.size(); ++k) {
      const std::vector<uint8_t>& a = calls.results[call][k];
      const std::vector<uint8_t>& b = calls.results[0][k];
      if (a == b) continue;
      int64_t n = 0, at = -1;
      for (std::size_t e = 0; e < a.size() && e < b.size(); ++e) {
        if (a[e] == b[e]) continue;
        if (at < 0) at = static_cast<int64_t>(e);
        ++n;
      }
      diff += std::string(diff.empty() ? "" : "; ") + names[k] + " differs in " + std::to_string(n) +
              " bytes, first at byte " + std::to_string(at);
    }
    if (diff.empty()) continue;
    const std::string bad = c.check(calls.results[call]);
    return "call " + std::to_string(call) + " repeats call 0's inputs but " + diff +
           (bad.empty() ? " (within the reference's tolerances)" : " (against the reference: " + bad + ")");
  }
  return "";
}

bool names_argument(const std::string& message, const std::string& name) {
  auto word = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; };
  for (std::size_t at = message.find(name); at != std::string::npos; at = message.find(name, at + 1)) {
    const bool starts = at == 0 || !word(message[at - 1]);
    const bool ends = at + name.size() == message.size() || !word(message[at + name.size()]);
    if (starts && ends) return true;
  }
  return false;
}

}  // namespace mlakit::testing
