// Picks a backend per call from the one table of compiled paths, and runs it with a workspace.
#include "api/dispatch.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "api/cuda_util.h"
#include "common/error.h"
#include "api/validate.h"
#include "common/parallel.h"

namespace flashattn {
namespace {

// Fastest first: AUTO takes the first device path that runs on the GPU and supports the problem.
const Backend* const kBackends[] = {
#if defined(FLASHATTN_HAS_SM90)
    &kSm90Backend,
#endif
#if defined(FLASHATTN_HAS_SM80)
    &kSm80Backend,
#endif
    &kCpuBackend,
    &kReferenceBackend,
};

const Backend* find_backend(flashattn_backend id) {
  for (const Backend* b : kBackends)
    if (b->id == id) return b;
  return nullptr;
}

int device_cc(int device) {
  int cc = 0;
#if defined(FLASHATTN_HAS_CUDA)
  cuda::device_props(device, &cc, nullptr, nullptr, 0);
#else
  (void)device;
#endif
  return cc;
}

bool runs_on(const Backend& b, int cc) { return cc >= b.min_cc && (b.max_cc == 0 || cc <= b.max_cc); }

// An fp64 LSE (lse_fp64) is written and read only by the reference backend: the others keep
// their LSE in fp32 (cpu accumulates in fp32; the GPU paths take fp16/bf16 only).
const char* lse_fp64_unsupported(const Backend& b) {
  if (b.id == FLASHATTN_BACKEND_REFERENCE) return nullptr;
  switch (b.id) {
    case FLASHATTN_BACKEND_CPU:
      return "lse_fp64: the cpu backend keeps its LSE in fp32 (use lse, or backend reference or auto for fp64)";
    default:
      return "lse_fp64: only the reference backend writes or reads an fp64 LSE (use lse)";
  }
}

const char* unsupported_by(const Backend& b, const FwdParams& p) {
  if (p.lse_fp64 != nullptr)
    if (const char* why = lse_fp64_unsupported(b)) return why;
  return b.fwd_unsupported(p);
}
const char* unsupported_by(const Backend& b, const BwdParams& p) {
  if (p.lse_fp64 != nullptr)
    if (const char* why = lse_fp64_unsupported(b)) return why;
  return b.bwd_unsupported(p);
}

template <typename P>
flashattn_status select(const P& params, const CallContext& ctx, const Backend** out) {
  auto unsupported = [&](const Backend* b) { return unsupported_by(*b, params); };
  const bool device = ctx.device >= 0;
  const int cc = device ? device_cc(ctx.device) : 0;
  if (ctx.backend != FLASHATTN_BACKEND_AUTO) {
    const Backend* b = find_backend(ctx.backend);
    if (b == nullptr)
      return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "options.backend: %s is not compiled into this build",
                       flashattn_backend_name(ctx.backend));
    if (device && !runs_on(*b, cc))
      return set_error(FLASHATTN_ERROR_NO_DEVICE,
                       "options.backend: %s needs compute capability %d.%d%s, device %d has %d.%d",
                       flashattn_backend_name(b->id), b->min_cc / 10, b->min_cc % 10,
                       b->max_cc == b->min_cc ? " exactly" : "+", ctx.device, cc / 10, cc % 10);
    if (const char* why = unsupported(b)) return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "%s", why);
    *out = b;
    return FLASHATTN_SUCCESS;
  }
  const char* last_why = nullptr;
  for (const Backend* b : kBackends) {
    if (b->on_device != device) continue;
    if (device && !runs_on(*b, cc)) continue;
    // AUTO on the host: the tiled path (fp32 accumulation) for fp16/bf16/fp32. fp64 is there for
    // gradient checks, so it goes to the reference backend, which computes in fp64 throughout; so
    // does FP8, which only the reference implements on the host (the exact attention of the
    // dequantized inputs, the yardstick of the GPU kernel to come).
    if (!device) {
      const bool to_reference = params.dtype == FLASHATTN_DTYPE_FP64 || params.dtype == FLASHATTN_DTYPE_FP8_E4M3;
      if (b->id == FLASHATTN_BACKEND_REFERENCE && !to_reference) continue;
      if (b->id == FLASHATTN_BACKEND_CPU && to_reference) continue;
    }
    const char* why = unsupported(b);
    if (why == nullptr) {
      *out = b;
      return FLASHATTN_SUCCESS;
    }
    if (last_why == nullptr) last_why = why;
  }
  if (last_why) return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "%s", last_why);
  return set_error(FLASHATTN_ERROR_NO_DEVICE,
                   "options.device: %d (compute capability %d.%d) has no compiled path in this build", ctx.device,
                   cc / 10, cc % 10);
}

// Keeps the caller's current CUDA device, switching to the tensors' device for the call.
class DeviceGuard {
 public:
  flashattn_status enter(int device) {
#if defined(FLASHATTN_HAS_CUDA)
    if (device < 0) return FLASHATTN_SUCCESS;
    flashattn_status s = cuda::get_device(&previous_);
    if (s != FLASHATTN_SUCCESS) return s;
    if (previous_ != device && (s = cuda::set_device(device)) != FLASHATTN_SUCCESS) return s;
    active_ = previous_ != device;
#else
    (void)device;
#endif
    return FLASHATTN_SUCCESS;
  }
  ~DeviceGuard() {
#if defined(FLASHATTN_HAS_CUDA)
    if (active_) cuda::set_device(previous_);
#endif
  }

 private:
  int previous_ = -1;
  bool active_ = false;
};

// The workspace: the caller's, or allocated for this call (stream-ordered on device).
template <typename Run>
flashattn_status with_workspace(size_t needed, void* workspace, size_t workspace_bytes, int device, void* stream,
                                Run run) {
  if (needed == 0) return run(workspace);
  if (workspace != nullptr) {
    if (workspace_bytes < needed)
      return set_error(FLASHATTN_ERROR_WORKSPACE, "workspace_bytes: %zu, but this call needs %zu", workspace_bytes,
                       needed);
    // TMA reads what the paths put there (the sm90 FP8 V^T copy) and atomics its counters: 16-byte alignment.
    if (reinterpret_cast<uintptr_t>(workspace) % 16 != 0)
      return set_error(FLASHATTN_ERROR_INVALID_ARGUMENT, "workspace: %p is not 16-byte aligned (cudaMalloc, malloc and "
                       "torch give 256 or 16)", workspace);
    return run(workspace);
  }
  if (device < 0) {
    std::vector<unsigned char> buf(needed);
    return run(buf.data());
  }
#if defined(FLASHATTN_HAS_CUDA)
  void* ws = nullptr;
  flashattn_status s = cuda::malloc_async(&ws, needed, stream);
  if (s != FLASHATTN_SUCCESS) return s;
  flashattn_status r = run(ws);
  flashattn_status f = cuda::free_async(ws, stream);
  return r != FLASHATTN_SUCCESS ? r : f;
#else
  (void)stream;
  return set_error(FLASHATTN_ERROR_NO_DEVICE, "no CUDA support in this build");
#endif
}

// Outputs of degenerate fixed-length problems (no keys, or no queries), written here so the
// backends only ever see seqlen_q, seqlen_k >= 1 for fixed-length calls.
flashattn_status fill(const CallContext& ctx, void* data, flashattn_dtype dtype, int b, int s, int h, int d,
                      const RowStrides& st, void* stream) {
  (void)stream;
  if (data == nullptr || int64_t(b) * s * h * d == 0) return FLASHATTN_SUCCESS;
  if (ctx.device >= 0) {
#if defined(FLASHATTN_HAS_CUDA)
    return cuda::fill_zero(data, dtype_size(dtype), b, s, h, d, st.batch, st.row, st.head, stream);
#endif
  }
  size_t es = dtype_size(dtype);
  for (int bi = 0; bi < b; ++bi)
    for (int si = 0; si < s; ++si)
      for (int hi = 0; hi < h; ++hi)
        std::memset(static_cast<char*>(data) + (bi * st.batch + si * st.row + hi * st.head) * int64_t(es), 0,
                    size_t(d) * es);
  return FLASHATTN_SUCCESS;
}

flashattn_status fill_lse(const CallContext& ctx, float* lse, int64_t n, void* stream) {
  (void)stream;
  if (lse == nullptr || n == 0) return FLASHATTN_SUCCESS;
  if (ctx.device >= 0) {
#if defined(FLASHATTN_HAS_CUDA)
    return cuda::fill_neg_inf(lse, n, stream);
#endif
  }
  for (int64_t i = 0; i < n; ++i) lse[i] = -INFINITY;
  return FLASHATTN_SUCCESS;
}

flashattn_status fill_lse(const CallContext&, double* lse, int64_t n, void*) {  // host only (fp64)
  if (lse == nullptr) return FLASHATTN_SUCCESS;
  for (int64_t i = 0; i < n; ++i) lse[i] = -INFINITY;
  return FLASHATTN_SUCCESS;
}

}  // namespace

flashattn_status select_fwd(const FwdParams& p, const CallContext& ctx, const Backend** out) {
  return select(p, ctx, out);
}
flashattn_status select_bwd(const BwdParams& p, const CallContext& ctx, const Backend** out) {
  return select(p, ctx, out);
}

size_t fwd_workspace(const Backend& b, const FwdParams& p, const CallContext& ctx) {
  return ctx.nothing_to_do || ctx.no_keys || ctx.no_queries ? 0 : b.fwd_workspace(p);
}
size_t bwd_workspace(const Backend& b, const BwdParams& p, const CallContext& ctx) {
  return ctx.nothing_to_do || ctx.no_keys || ctx.no_queries ? 0 : b.bwd_workspace(p);
}

flashattn_status run_fwd(const Backend& b, const FwdParams& p, const CallContext& ctx, void* workspace,
                         size_t workspace_bytes, void* stream) {
  if (ctx.nothing_to_do || ctx.no_queries) return FLASHATTN_SUCCESS;
  DeviceGuard guard;
  flashattn_status s = guard.enter(ctx.device);
  if (s != FLASHATTN_SUCCESS) return s;
  const Shape& sh = p.shape;
  if (ctx.no_keys) {
    s = fill(ctx, p.o, p.out_dtype(), sh.batch, sh.seqlen_q, sh.nheads_q, sh.headdim, p.o_stride, stream);
    const int64_t n = int64_t(sh.batch) * sh.nheads_q * sh.seqlen_q;
    if (s == FLASHATTN_SUCCESS) s = fill_lse(ctx, p.lse, n, stream);
    return s != FLASHATTN_SUCCESS ? s : fill_lse(ctx, p.lse_fp64, n, stream);
  }
  ScopedHostThreads threads(ctx.num_threads);  // host paths read it in parallel_for
  return with_workspace(b.fwd_workspace(p), workspace, workspace_bytes, ctx.device, stream,
                        [&](void* ws) { return b.fwd(p, ws, stream); });
}

flashattn_status run_bwd(const Backend& b, const BwdParams& p, const CallContext& ctx, void* workspace,
                         size_t workspace_bytes, void* stream) {
  if (ctx.nothing_to_do) return FLASHATTN_SUCCESS;
  DeviceGuard guard;
  flashattn_status s = guard.enter(ctx.device);
  if (s != FLASHATTN_SUCCESS) return s;
  const Shape& sh = p.shape;
  if (ctx.no_keys) return fill(ctx, p.dq, p.dtype, sh.batch, sh.seqlen_q, sh.nheads_q, sh.headdim, p.dq_stride, stream);
  if (ctx.no_queries) {
    s = fill(ctx, p.dk, p.dtype, sh.batch, sh.seqlen_k, sh.nheads_kv, sh.headdim, p.dk_stride, stream);
    return s != FLASHATTN_SUCCESS ? s
                                  : fill(ctx, p.dv, p.dtype, sh.batch, sh.seqlen_k, sh.nheads_kv, sh.headdim,
                                         p.dv_stride, stream);
  }
  ScopedHostThreads threads(ctx.num_threads);
  return with_workspace(b.bwd_workspace(p), workspace, workspace_bytes, ctx.device, stream,
                        [&](void* ws) { return b.bwd(p, ws, stream); });
}

uint32_t compiled_backends() {
  uint32_t mask = 0;
  for (const Backend* b : kBackends) mask |= 1u << b->id;
  return mask;
}

flashattn_backend auto_backend(int device, bool forward) {
  FwdParams fp{};
  BwdParams bp{};
  for (Shape* sh : {&fp.shape, &bp.shape}) *sh = Shape{1, 128, 128, 1, 1, 128, 128, 128};
  fp.dtype = bp.dtype = FLASHATTN_DTYPE_BF16;
  CallContext ctx{FLASHATTN_BACKEND_AUTO, device, false, false, false};
  const Backend* b = nullptr;
  flashattn_status s = forward ? select_fwd(fp, ctx, &b) : select_bwd(bp, ctx, &b);
  clear_error();
  return s == FLASHATTN_SUCCESS ? b->id : FLASHATTN_BACKEND_AUTO;
}

}  // namespace flashattn
