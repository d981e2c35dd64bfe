// kSm80Backend: the portable CUDA path (mma.sync + cp.async), any GPU from sm80 on.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>
#include <type_traits>

#include "api/backend.h"
#include "common/error.h"
#include "common/headdim.h"
#include "flashattn/flashattn_experimental.h"
#include <cutlass/numeric_types.h>

#include "sm80/launch.h"

namespace flashattn {
namespace sm80 {

namespace {
std::atomic<int> g_smem_limit{0};
}  // namespace
int smem_limit() { return g_smem_limit.load(std::memory_order_relaxed); }

namespace {

#ifndef FLASHATTN_SM80_HEADDIMS_STR
#define FLASHATTN_SM80_HEADDIMS_STR ""
#endif

// The head dim of the kernel a problem runs on: its own, or the next larger one instantiated by
// CMake (FLASHATTN_SM80_HDIM_<d>), which zero-fills the columns past the tensors' head dim
// and never stores them. 0 when none fits or the head dim is not a multiple of 8 (16-byte
// cp.async chunks; validate.cpp refuses those for device paths, the Python layer pads them).
int kernel_headdim(int d) {
  static constexpr int kCompiled[] = {
#if defined(FLASHATTN_SM80_HDIM_32)
      32,
#endif
#if defined(FLASHATTN_SM80_HDIM_64)
      64,
#endif
#if defined(FLASHATTN_SM80_HDIM_96)
      96,
#endif
#if defined(FLASHATTN_SM80_HDIM_128)
      128,
#endif
#if defined(FLASHATTN_SM80_HDIM_192)
      192,
#endif
#if defined(FLASHATTN_SM80_HDIM_256)
      256,
#endif
      0};
  return kernel_headdim_for(d, kCompiled);
}

const char* unsupported(flashattn_dtype dtype, int headdim) {
  thread_local char msg[256];
  if (dtype == FLASHATTN_DTYPE_FP8_E4M3)
    return "dtype: fp8_e4m3 has no sm80 kernel (FP8 attention is for Hopper, sm90; host tensors run it on the "
           "reference backend)";
  if (dtype != FLASHATTN_DTYPE_FP16 && dtype != FLASHATTN_DTYPE_BF16) {
    std::snprintf(msg, sizeof(msg), "dtype: the sm80 path supports fp16 and bf16 only (got dtype %d)", int(dtype));
    return msg;
  }
  if (kernel_headdim(headdim) == 0) {
    if (headdim % 8 != 0)
      std::snprintf(msg, sizeof(msg), "headdim %d: sm80 needs a multiple of 8 (16-byte loads; pad the head dim)",
                    headdim);
    else
      std::snprintf(msg, sizeof(msg), "headdim %d is larger than every head dim compiled for sm80 (compiled: %s)",
                    headdim, FLASHATTN_SM80_HEADDIMS_STR);
    return msg;
  }
  return nullptr;
}

// The dispatcher already checks min_cc; this guards direct use on an older current device.
flashattn_status check_device() {
  int dev = 0, major = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (e != cudaSuccess) return cuda_failure(e, "sm80 device query");
  if (major < 8)
    return set_error(FLASHATTN_ERROR_NO_DEVICE, "options.device: %d has compute capability %d.x; sm80 needs 8.0+",
                     dev, major);
  return FLASHATTN_SUCCESS;
}

// Calls fn(std::integral_constant<int, D>) for the compiled kernel head dim D of `headdim`.
template <typename Fn>
flashattn_status with_kernel_headdim(flashattn_dtype dtype, int headdim, Fn&& fn) {
  switch (kernel_headdim(headdim)) {
#if defined(FLASHATTN_SM80_HDIM_32)
    case 32: return fn(std::integral_constant<int, 32>{});
#endif
#if defined(FLASHATTN_SM80_HDIM_64)
    case 64: return fn(std::integral_constant<int, 64>{});
#endif
#if defined(FLASHATTN_SM80_HDIM_96)
    case 96: return fn(std::integral_constant<int, 96>{});
#endif
#if defined(FLASHATTN_SM80_HDIM_128)
    case 128: return fn(std::integral_constant<int, 128>{});
#endif
#if defined(FLASHATTN_SM80_HDIM_192)
    case 192: return fn(std::integral_constant<int, 192>{});
#endif
#if defined(FLASHATTN_SM80_HDIM_256)
    case 256: return fn(std::integral_constant<int, 256>{});
#endif
    default: break;
  }
  return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "%s", unsupported(dtype, headdim));
}

// ... and for the element type too: fn(Element{}, integral_constant<int, D>{}).
template <typename Fn>
flashattn_status with_kernel(flashattn_dtype dtype, int headdim, Fn&& fn) {
  return with_kernel_headdim(dtype, headdim, [&](auto d) {
    return dtype == FLASHATTN_DTYPE_FP16 ? fn(cutlass::half_t{}, d) : fn(cutlass::bfloat16_t{}, d);
  });
}

const char* fwd_unsupported(const FwdParams& p) {
  return unsupported(p.dtype, p.shape.headdim);
}
const char* bwd_unsupported(const BwdParams& p) { return unsupported(p.dtype, p.shape.headdim); }
size_t fwd_workspace(const FwdParams& p) {
  if (!p.kv.enabled() || unsupported(p.dtype, p.shape.headdim) != nullptr) return 0;
  size_t bytes = 0;
  with_kernel(p.dtype, p.shape.headdim, [&](auto e, auto d) {
    bytes = kv_workspace<decltype(e), decltype(d)::value>(p);
    return FLASHATTN_SUCCESS;
  });
  clear_error();  // a failed size query reports 0; the call itself reports the failure
  return bytes;
}
size_t bwd_workspace(const BwdParams& p) {
  const int kd = kernel_headdim(p.shape.headdim);
  return kd > 0 ? bwd_workspace_layout(p, kd).total : 0;
}

flashattn_status fwd(const FwdParams& p, void* workspace, void* stream) {
  if (const char* why = fwd_unsupported(p)) return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "%s", why);
  flashattn_status s = check_device();
  if (s != FLASHATTN_SUCCESS) return s;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  return with_kernel(p.dtype, p.shape.headdim, [&](auto e, auto d) {
    using Element = decltype(e);
    constexpr int D = decltype(d)::value;
    return p.kv.enabled() ? run_fwd_kv<Element, D>(p, workspace, st) : run_fwd<Element, D>(p, st);
  });
}

flashattn_status bwd(const BwdParams& p, void* workspace, void* stream) {
  if (const char* why = bwd_unsupported(p)) return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "%s", why);
  flashattn_status s = check_device();
  if (s != FLASHATTN_SUCCESS) return s;
  if (workspace == nullptr) return set_error(FLASHATTN_ERROR_WORKSPACE, "workspace: the sm80 backward needs one");
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  return with_kernel(p.dtype, p.shape.headdim, [&](auto e, auto d) {
    return run_bwd<decltype(e), decltype(d)::value>(p, workspace, st);
  });
}

}  // namespace
}  // namespace sm80

const Backend kSm80Backend = {
    FLASHATTN_BACKEND_SM80, /*on_device=*/true, /*min_cc=*/80, /*max_cc=*/0,
    &sm80::fwd_unsupported, &sm80::fwd_workspace, &sm80::fwd,
    &sm80::bwd_unsupported, &sm80::bwd_workspace, &sm80::bwd,
};

}  // namespace flashattn

extern "C" FLASHATTN_API flashattn_status flashattn_sm80_set_smem_limit(int bytes) {
  if (bytes < 0)
    return flashattn::set_error(FLASHATTN_ERROR_INVALID_ARGUMENT,
                                "flashattn_sm80_set_smem_limit: bytes %d (>= 0; 0 = the device's own limit)", bytes);
  flashattn::sm80::g_smem_limit.store(bytes);
  flashattn::clear_error();
  return FLASHATTN_SUCCESS;
}
