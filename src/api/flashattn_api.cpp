// The exported C ABI: validate, select a backend, run.
#include <cmath>
#include <cstring>

#include "api/cuda_util.h"
#include "api/dispatch.h"
#include "common/error.h"
#include "api/validate.h"
#include "flashattn/flashattn.h"

using namespace flashattn;

extern "C" {

flashattn_options flashattn_default_options(void) {
  flashattn_options o;
  std::memset(&o, 0, sizeof(o));
  o.softmax_scale = 0.f;  // 1/sqrt(headdim)
  o.causal = 0;
  o.window_left = -1;
  o.window_right = -1;
  o.softcap = 0.f;
  o.dropout_p = 0.f;
  o.deterministic = 0;
  o.backend = FLASHATTN_BACKEND_AUTO;
  o.device = -1;
  return o;
}

flashattn_fwd_params flashattn_fwd_params_init(void) {
  flashattn_fwd_params p;
  std::memset(&p, 0, sizeof(p));
  p.struct_size = sizeof(p);
  p.dtype = FLASHATTN_DTYPE_BF16;
  p.options = flashattn_default_options();
  return p;
}

flashattn_bwd_params flashattn_bwd_params_init(void) {
  flashattn_bwd_params p;
  std::memset(&p, 0, sizeof(p));
  p.struct_size = sizeof(p);
  p.dtype = FLASHATTN_DTYPE_BF16;
  p.options = flashattn_default_options();
  return p;
}

flashattn_status flashattn_fwd_workspace_size(const flashattn_fwd_params* params, size_t* bytes) {
  clear_error();
  if (bytes == nullptr) return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT, "bytes: NULL");
  *bytes = 0;
  FwdParams p;
  CallContext ctx;
  const Backend* b = nullptr;
  flashattn_status s = normalize_fwd(params, kSizeQuery, &p, &ctx);
  if (s == FLASHATTN_SUCCESS) s = select_fwd(p, ctx, &b);
  if (s == FLASHATTN_SUCCESS) *bytes = fwd_workspace(*b, p, ctx);
  return s;
}

flashattn_status flashattn_bwd_workspace_size(const flashattn_bwd_params* params, size_t* bytes) {
  clear_error();
  if (bytes == nullptr) return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT, "bytes: NULL");
  *bytes = 0;
  BwdParams p;
  CallContext ctx;
  const Backend* b = nullptr;
  flashattn_status s = normalize_bwd(params, kSizeQuery, &p, &ctx);
  if (s == FLASHATTN_SUCCESS) s = select_bwd(p, ctx, &b);
  if (s == FLASHATTN_SUCCESS) *bytes = bwd_workspace(*b, p, ctx);
  return s;
}

flashattn_status flashattn_fwd(const flashattn_fwd_params* params, void* workspace, size_t workspace_bytes,
                               void* stream) {
  clear_error();
  FwdParams p;
  CallContext ctx;
  const Backend* b = nullptr;
  flashattn_status s = normalize_fwd(params, stream, &p, &ctx);
  if (s == FLASHATTN_SUCCESS) s = select_fwd(p, ctx, &b);
  if (s == FLASHATTN_SUCCESS) s = run_fwd(*b, p, ctx, workspace, workspace_bytes, stream);
  return s;
}

flashattn_status flashattn_bwd(const flashattn_bwd_params* params, void* workspace, size_t workspace_bytes,
                               void* stream) {
  clear_error();
  BwdParams p;
  CallContext ctx;
  const Backend* b = nullptr;
  flashattn_status s = normalize_bwd(params, stream, &p, &ctx);
  if (s == FLASHATTN_SUCCESS) s = select_bwd(p, ctx, &b);
  if (s == FLASHATTN_SUCCESS) s = run_bwd(*b, p, ctx, workspace, workspace_bytes, stream);
  return s;
}

const char* flashattn_last_error(void) { return last_error(); }

const char* flashattn_status_string(flashattn_status status) {
  switch (status) {
    case FLASHATTN_SUCCESS: return "success";
    case FLASHATTN_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case FLASHATTN_ERROR_NOT_SUPPORTED: return "not supported";
    case FLASHATTN_ERROR_NO_DEVICE: return "no suitable device";
    case FLASHATTN_ERROR_CUDA: return "CUDA error";
    case FLASHATTN_ERROR_WORKSPACE: return "workspace error";
    case FLASHATTN_ERROR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

const char* flashattn_backend_name(flashattn_backend backend) {
  switch (backend) {
    case FLASHATTN_BACKEND_AUTO: return "auto";
    case FLASHATTN_BACKEND_REFERENCE: return "reference";
    case FLASHATTN_BACKEND_CPU: return "cpu";
    case FLASHATTN_BACKEND_SM80: return "sm80";
    case FLASHATTN_BACKEND_SM90: return "sm90";
  }
  return "unknown";
}

#define FA_STR2(x) #x
#define FA_STR(x) FA_STR2(x)
const char* flashattn_version(void) {
  return FA_STR(FLASHATTN_VERSION_MAJOR) "." FA_STR(FLASHATTN_VERSION_MINOR) "." FA_STR(FLASHATTN_VERSION_PATCH);
}

uint32_t flashattn_compiled_backends(void) { return compiled_backends(); }

flashattn_status flashattn_device_capability(int32_t device, flashattn_device_info* info) {
  clear_error();
  if (info == nullptr) return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT, "info: NULL");
  std::memset(info, 0, sizeof(*info));
  info->device = device;
#if defined(FLASHATTN_HAS_CUDA)
  int n = cuda::device_count();
  if (n == 0) return set_error(FLASHATTN_ERROR_NO_DEVICE, "device: no CUDA device is present");
  if (device < 0 || device >= n)
    return set_error(FLASHATTN_ERROR_NO_DEVICE, "device: %d (there are %d CUDA devices)", device, n);
  int cc = 0;
  if (!cuda::device_props(device, &cc, &info->multiprocessors, info->name, sizeof(info->name)))
    return set_error(FLASHATTN_ERROR_CUDA, "device: reading properties of device %d failed", device);
  info->cc_major = cc / 10;
  info->cc_minor = cc % 10;
  info->fwd_backend = auto_backend(device, true);
  info->bwd_backend = auto_backend(device, false);
  return FLASHATTN_SUCCESS;
#else
  return set_error(FLASHATTN_ERROR_NO_DEVICE, "device: this build has no CUDA support");
#endif
}

}  // extern "C"

#if !defined(FLASHATTN_HAS_SM90)
// The experimental sm90 switches exist in every build, so tools link against any of them.
#include "flashattn/flashattn_experimental.h"
extern "C" flashattn_status flashattn_sm90_set_ablation(int, int) {
  return flashattn::set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "flashattn_sm90_set_ablation: this build has no sm90 path");
}
#endif

#if !defined(FLASHATTN_HAS_SM80)
#include "flashattn/flashattn_experimental.h"
extern "C" flashattn_status flashattn_sm80_set_smem_limit(int) {
  return flashattn::set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "flashattn_sm80_set_smem_limit: this build has no sm80 path");
}
#endif
