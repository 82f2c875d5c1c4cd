// GPU tests of the GQA decode (include/mlakit/gqa_decode.h): one case on host and device.
// The host side is tests/cpu/gqa_case.h's GqaCase (random q, caches, shuffled block table, NaN in
// every cache slot the step does not read, garbage table entries past each length); the device
// side holds copies of its inputs, optionally as padded (non-contiguous) views, and outputs
// poisoned with 0xFF bytes (NaN in bf16, fp16 and float32).
//
// The check of one call (GqaGpuCase::check), against reference::gqa_decode run on host copies of
// the caches as they were before the append (the reference appends itself):
//   - out and lse within docs/contract.md's accuracy rule (support/accuracy.h); rows with no
//     visible key exactly 0 with lse +inf;
//   - rows of finished entries and the padding of strided views still hold the poison bits;
//   - the caches and their scales equal the reference's byte for byte (the GPU append and the
//     reference share the quantization code, src/common/gqa_cache_quant.h), including every
//     byte the step must not touch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "../cpu/gqa_case.h"
#include "gpu_test_util.h"
#include "mlakit/gqa_decode.h"

namespace mlakit::testing {

// The cache formats of the contract: q's dtype, int8 / fp8 with one scale per (token, kv head),
// fp8 with one scale per tensor.
enum class GqaFormat { kHalf, kInt8, kFp8Token, kFp8Tensor };
const char* gqa_format_name(GqaFormat format);

struct GqaShape {
  std::vector<int32_t> lengths;  // cache_seqlens (after the append); b = lengths.size()
  int s_q = 1;
  int h_q = 8;
  int h_kv = 1;
  int d = 128;
  int page = 16;
  GqaFormat format = GqaFormat::kHalf;
  DType q_dtype = DType::kBF16;
  bool append = false;  // k_new / v_new given (lengths must be >= s_q)
  uint32_t seed = 1;
};

struct GqaOptions {
  RotaryEmbedding rope{};
  bool causal = false;
  int window = 0;
  float softcap = 0.f;
  bool alibi = false;     // ALiBi slopes 2^(-8 (h + 1) / h_q)
  bool finished = false;  // entries 1, 4, 7, ... finished (entry 0 when b == 1)
  bool lse = true;
  bool strided = false;   // q, k_new, v_new, out, lse as padded views (padding NaN / poisoned)
  std::optional<float> softmax_scale;
};

// "d128_hq32_hkv4_sq2_page16_b3_max140_int8_bf16_append_neox64_causal_..." (alphanumerics and _).
std::string gqa_case_name(const GqaShape& shape, const GqaOptions& options);

// Lengths for b entries: 0 (or s_q with append), 1, page boundaries +-1, max_len and random
// ones in between, all in [append ? s_q : 0, max_len].
std::vector<int32_t> gqa_lengths(int64_t b, int s_q, bool append, int page, int max_len, uint64_t seed);

// A tensor's layout in its buffer: contiguous, or padded between rows and heads.
struct GqaView {
  int rank = 0;
  int64_t shape[4] = {};
  int64_t stride[4] = {};
  int64_t extent = 0;  // elements the buffer holds
  int64_t numel() const;
  int64_t at(int64_t flat) const;  // element offset of row-major index `flat`
};
GqaView gqa_view(std::initializer_list<int64_t> shape, bool padded);

class GqaGpuCase {
 public:
  GqaGpuCase(const GqaShape& shape, const GqaOptions& options);
  GqaGpuCase(const GqaGpuCase&) = delete;
  GqaGpuCase& operator=(const GqaGpuCase&) = delete;

  GqaDecodeProblem problem() const;
  // reference::gqa_decode on the host copy: host.out (float32) / host.lse / host caches become
  // the expected results.
  Status run_reference(int num_threads = 0);
  // Every non-finished reference row is finite: the setup let the reference read no poison.
  std::string reference_sanity() const;
  // New lengths (same table, same device buffer): the caches go back to their state before the
  // append, on host and device; run_reference again for the expected results.
  void set_lengths(const std::vector<int32_t>& lengths);

  void restore_caches();  // device caches and scales as before the append
  void poison_outputs();  // out and lse (with their padding) to 0xFF bytes
  void reset();           // both, then a device synchronisation

  // Everything a call may write, in check()'s order: out, lse (if given), k_cache, v_cache,
  // k_scale and v_scale (if the format has scales).
  struct Written {
    const char* name;
    DeviceBuffer* buffer;
  };
  std::vector<Written> written();
  std::vector<const char*> written_names() const;
  std::vector<std::vector<uint8_t>> download();
  // "" when one call's downloads pass (see the top of this file), else what failed.
  std::string check(const std::vector<std::vector<uint8_t>>& got) const;

  bool is_finished(int64_t i) const { return host.finished[i] != 0; }

  GqaShape shape;
  GqaOptions opt;
  GqaCase host;
  DeviceBuffer q, kc, vc, ks, vs, table, seqlens, k_new, v_new, alibi, finished, out, lse;
  GqaDecodeArgs args;  // the device views

 private:
  GqaView q_view_, new_view_, out_view_, lse_view_;
  std::vector<uint8_t> kc0_, vc0_;  // host caches before the append
  std::vector<float> ks0_, vs0_;
};

// Device workspace for `problem` (throws if the size query fails).
DeviceBuffer gqa_workspace(const GqaDecodeProblem& problem);

// Fills a plan's partial-result regions (partial_out_offset to the end of the workspace: the
// MLA decode plan's layout) with 0xFF bytes, so a combine reading a partial before it is written
// cannot find the previous call's identical values.
void poison_gqa_partials(const GqaDecodePlan& plan);

// Reads the plan's per-sequence split counts back: some sequence cut into >= 2 pieces.
bool gqa_plan_splits(const GqaDecodePlan& plan);

// Plans once, then calls `calls` times on the same inputs (reset() and poisoned partials before
// each call), downloading every written buffer after each call.
struct GqaCalls {
  Status status;  // the first failing call (plan, decode or CUDA)
  GqaDecodePlan plan;  // its workspace is freed on return
  bool split = false;  // gqa_plan_splits
  std::vector<std::vector<std::vector<uint8_t>>> results;  // per call, written()'s order
};
GqaCalls call_gqa(GqaGpuCase& c, int calls);

// Checks call 0 and requires every later call to repeat its bytes; "" or what failed.
std::string check_calls(const GqaGpuCase& c, const GqaCalls& calls);

// A message names `name` as a whole word (not inside a longer identifier).
bool names_argument(const std::string& message, const std::string& name);

}  // namespace mlakit::testing
