// MLAKIT_HD marks functions compiled for both the host (g++ or nvcc) and the device, so
// that a CPU twin and its device version run literally the same code.
#pragma once

#if defined(__CUDACC__)
#define MLAKIT_HD __host__ __device__ __forceinline__
#else
#define MLAKIT_HD inline
#endif
