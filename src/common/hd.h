// Host/device qualifiers so src/common/ compiles in plain C++ (cpu path, CI) and in CUDA.
#pragma once

#if defined(__CUDACC__)
#define FA_HD __host__ __device__ __forceinline__
#else
#define FA_HD inline
#endif
