// cudaStream_t without requiring the CUDA toolkit: the public headers stay plain C++ so a
// CPU-only build (MLAKIT_ENABLE_CUDA=OFF) compiles with g++ alone.
#pragma once

#if defined(__has_include)
#if __has_include(<cuda_runtime_api.h>)
#include <cuda_runtime_api.h>
#define MLAKIT_HAVE_CUDA_RUNTIME_HEADER 1
#endif
#endif

#ifndef MLAKIT_HAVE_CUDA_RUNTIME_HEADER
// The same opaque type the CUDA runtime declares, so both spellings interoperate.
typedef struct CUstream_st* cudaStream_t;
#endif
