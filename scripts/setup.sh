#!/usr/bin/env bash
# Installs what the build needs when it is missing (Debian/Ubuntu package names), then
# prints the CMake options for this machine: CUDA on when nvcc is found.
set -euo pipefail

need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v ninja >/dev/null 2>&1 || need+=(ninja-build)
command -v g++ >/dev/null 2>&1 || need+=(g++)
if [ ! -f /usr/include/gtest/gtest.h ] && [ ! -f /usr/local/include/gtest/gtest.h ]; then
  need+=(libgtest-dev)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}" >&2
  sudo_cmd=""
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd="sudo"; fi
  $sudo_cmd apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need[@]}" >&2
fi

if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
if command -v nvcc >/dev/null 2>&1; then
  echo "-DMLAKIT_ENABLE_CUDA=ON -DCMAKE_CUDA_COMPILER=$(command -v nvcc)"
else
  echo "setup: nvcc not found: building the CPU-only configuration (host layer, reference, CPU tests)" >&2
  echo "-DMLAKIT_ENABLE_CUDA=OFF"
fi
