// kSm80Backend: the portable CUDA path (mma.sync + cp.async), any GPU from sm80 on.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>

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

template <typename Element>
flashattn_status fwd_typed(const FwdParams& p, cudaStream_t stream) {
  switch (kernel_headdim(p.shape.headdim)) {
#if defined(FLASHATTN_SM80_HDIM_32)
    case 32: return run_fwd<Element, 32>(p, stream);
#endif
#if defined(FLASHATTN_SM80_HDIM_64)
    case 64: return run_fwd<Element, 64>(p, stream);
#endif
#if defined(FLASHATTN_SM80_HDIM_96)
    case 96: return run_fwd<Element, 96>(p, stream);
#endif
#if defined(FLASHATTN_SM80_HDIM_128)
    case 128: return run_fwd<Element, 128>(p, stream);
#endif
#if defined(FLASHATTN_SM80_HDIM_192)
    case 192: return run_fwd<Element, 192>(p, stream);
#endif
#if defined(FLASHATTN_SM80_HDIM_256)
    case 256: return run_fwd<Element, 256>(p, stream);
#endif
    default: break;
  }
  return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "%s", unsupported(p.dtype, p.shape.headdim));
}

template <typename Element>
flashattn_status bwd_typed(const BwdParams& p, void* ws, cudaStream_t stream) {
  switch (kernel_headdim(p.shape.headdim)) {
#if defined(FLASHATTN_SM80_HDIM_32)
    case 32: return run_bwd<Element, 32>(p, ws, stream);
#endif
#if defined(FLASHATTN_SM80_HDIM_64)
    case 64: return run_bwd<Element, 64>(p, ws, stream);
#endif
#if defined(FLASHATTN_SM80_HDIM_96)
    case 96: return run_bwd<Element, 96>(p, ws, stream);
#endif
#if defined(FLASHATTN_SM80_HDIM_128)
    case 128: return run_bwd<Element, 128>(p, ws, stream);
#endif
#if defined(FLASHATTN_SM80_HDIM_192)
    case 192: return run_bwd<Element, 192>(p, ws, stream);
#endif
#if defined(FLASHATTN_SM80_HDIM_256)
    case 256: return run_bwd<Element, 256>(p, ws, stream);
#endif
    default: break;
  }
  return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "%s", unsupported(p.dtype, p.shape.headdim));
}

const char* fwd_unsupported(const FwdParams& p) {
  if (p.kv.enabled()) {
    static thread_local char msg[128];
    std::snprintf(msg, sizeof(msg), "%s: the KV cache is not implemented on sm80 yet (host paths: cpu, reference)",
                  p.kv.field_in_use());
    return msg;
  }
  return unsupported(p.dtype, p.shape.headdim);
}
const char* bwd_unsupported(const BwdParams& p) { return unsupported(p.dtype, p.shape.headdim); }
size_t fwd_workspace(const FwdParams&) { return 0; }
size_t bwd_workspace(const BwdParams& p) {
  const int kd = kernel_headdim(p.shape.headdim);
  return kd > 0 ? bwd_workspace_layout(p, kd).total : 0;
}

flashattn_status fwd(const FwdParams& p, void* /*workspace*/, void* stream) {
  if (const char* why = fwd_unsupported(p)) return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "%s", why);
  flashattn_status s = check_device();
  if (s != FLASHATTN_SUCCESS) return s;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  return p.dtype == FLASHATTN_DTYPE_FP16 ? fwd_typed<cutlass::half_t>(p, st) : fwd_typed<cutlass::bfloat16_t>(p, st);
}

flashattn_status bwd(const BwdParams& p, void* workspace, void* stream) {
  if (const char* why = bwd_unsupported(p)) return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "%s", why);
  flashattn_status s = check_device();
  if (s != FLASHATTN_SUCCESS) return s;
  if (workspace == nullptr) return set_error(FLASHATTN_ERROR_WORKSPACE, "workspace: the sm80 backward needs one");
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  return p.dtype == FLASHATTN_DTYPE_FP16 ? bwd_typed<cutlass::half_t>(p, workspace, st)
                                         : bwd_typed<cutlass::bfloat16_t>(p, workspace, st);
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
