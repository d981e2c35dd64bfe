// What a GPU test needs before it runs; each returns false with the reason to skip.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "flashattn/flashattn.h"

namespace flashattn::test {

// A CUDA device and a CUDA path (sm80 or sm90) compiled into the library.
inline bool cuda_path_available(std::string* why) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    *why = "no CUDA device";
    return false;
  }
  if (!(flashattn_compiled_backends() & ((1u << FLASHATTN_BACKEND_SM80) | (1u << FLASHATTN_BACKEND_SM90)))) {
    *why = "this build has no CUDA path";
    return false;
  }
  return true;
}

// Device 0 is an sm90 (compute capability 9.0) and the sm90 path is compiled.
inline bool sm90_available(std::string* why) {
  if (!cuda_path_available(why)) return false;
  if (!(flashattn_compiled_backends() & (1u << FLASHATTN_BACKEND_SM90))) {
    *why = "this build has no sm90 path";
    return false;
  }
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  if (major != 9 || minor != 0) {
    *why = "device 0 is not sm90";
    return false;
  }
  return true;
}

}  // namespace flashattn::test
