#include "support/device_array.h"

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace mlakit::support {
namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

}  // namespace

DeviceArray::DeviceArray(std::size_t bytes) : bytes_(bytes) {
  check(cudaMalloc(&ptr_, bytes ? bytes : 1), "cudaMalloc");
}
DeviceArray::~DeviceArray() {
  if (ptr_) cudaFree(ptr_);
}
DeviceArray::DeviceArray(DeviceArray&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
  o.ptr_ = nullptr;
  o.bytes_ = 0;
}
DeviceArray& DeviceArray::operator=(DeviceArray&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}
void DeviceArray::upload(const void* src, std::size_t bytes) {
  check(cudaMemcpy(ptr_, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}
void DeviceArray::download_to(void* dst, std::size_t bytes) const {
  check(cudaMemcpy(dst, ptr_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}
void DeviceArray::fill_bytes(uint8_t value) {
  if (bytes_ > 0) check(cudaMemset(ptr_, value, bytes_), "cudaMemset");  // an empty array has no pointer
}
void DeviceArray::fill16(uint16_t pattern) {
  std::vector<uint16_t> host(bytes_ / 2, pattern);
  upload(host.data(), host.size() * 2);
}
void DeviceArray::fill32(uint32_t pattern) {
  std::vector<uint32_t> host(bytes_ / 4, pattern);
  upload(host.data(), host.size() * 4);
}

}  // namespace mlakit::support
