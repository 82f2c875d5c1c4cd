#include "arrays.h"

#include <stdexcept>
#include <string>

namespace mlakit::python {
namespace {

// DLPack's code for float8_e4m3fn (named Float8_E4M3FN only in newer nanobind releases).
constexpr uint8_t kDlpackFloat8E4M3FN = 10;

DType to_dtype(const nb::dlpack::dtype& t, const char* name) {
  using Code = nb::dlpack::dtype_code;
  const auto code = static_cast<Code>(t.code);
  if (t.lanes == 1) {
    if (code == Code::Bfloat && t.bits == 16) return DType::kBF16;
    if (code == Code::Float && t.bits == 16) return DType::kFP16;
    if (code == Code::Float && t.bits == 32) return DType::kFP32;
    if (code == Code::Int && t.bits == 32) return DType::kInt32;
    if (code == Code::Int && t.bits == 8) return DType::kInt8;
    if (code == Code::UInt && t.bits == 8) return DType::kUInt8;
    if (code == Code::UInt && t.bits == 16) return DType::kBF16;
    if (t.code == kDlpackFloat8E4M3FN && t.bits == 8) return DType::kFP8E4M3;
  }
  throw nb::type_error((std::string(name) + ": unsupported dtype (DLPack code " + std::to_string(t.code) + ", " +
                        std::to_string(t.bits) + " bits)")
                           .c_str());
}

template <typename A>
TensorRef make_ref(const A& a, const char* name) {
  if (a.ndim() > static_cast<size_t>(kMaxRank)) {
    throw nb::value_error((std::string(name) + ": expected rank <= 6, got " + std::to_string(a.ndim())).c_str());
  }
  TensorRef t;
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  t.dtype = to_dtype(a.dtype(), name);
  t.rank = static_cast<int>(a.ndim());
  for (int i = 0; i < t.rank; ++i) {
    t.shape[i] = static_cast<int64_t>(a.shape(i));
    t.stride[i] = static_cast<int64_t>(a.stride(i));
  }
  return t;
}

}  // namespace

void raise_if_error(const Status& s) {
  if (s.is_ok()) return;
  if (s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kUnsupported) {
    throw nb::value_error(s.message().c_str());
  }
  throw std::runtime_error(s.to_string());
}

TensorRef to_ref(const Array& a, const char* name) { return make_ref(a, name); }
TensorRef to_ref(const MutArray& a, const char* name) { return make_ref(a, name); }
TensorRef to_ref(const std::optional<Array>& a, const char* name) { return a ? make_ref(*a, name) : TensorRef{}; }

LseBase lse_base_from(const char* op, const char* argument, const std::string& name) {
  if (name == "e") return LseBase::kNatural;
  if (name == "2") return LseBase::kBase2;
  throw nb::value_error((std::string(op) + ": " + argument + ": expected 'e' or '2', got '" + name + "'").c_str());
}

}  // namespace mlakit::python
