// An owning device allocation for tests, the main job and the benchmark (never used by the
// library itself, which allocates nothing). Errors throw std::runtime_error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace mlakit::support {

class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(std::size_t bytes);
  template <typename T>
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size() * sizeof(T)) {
    upload(host.data(), host.size() * sizeof(T));
  }
  ~DeviceArray();
  DeviceArray(DeviceArray&& other) noexcept;
  DeviceArray& operator=(DeviceArray&& other) noexcept;
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  void* get() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }

  void upload(const void* src, std::size_t bytes);
  void download_to(void* dst, std::size_t bytes) const;
  template <typename T>
  std::vector<T> download() const {
    std::vector<T> out(bytes_ / sizeof(T));
    download_to(out.data(), out.size() * sizeof(T));
    return out;
  }
  void fill_bytes(uint8_t value);
  void fill16(uint16_t pattern);
  void fill32(uint32_t pattern);

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace mlakit::support
