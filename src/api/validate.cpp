#include "api/validate.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "api/cuda_util.h"
#include "common/error.h"

namespace flashattn {

// options.num_threads took what was padding before `varlen`: the params structs kept the size
// and layout that callers built against the earlier header. lse_fp64 was appended after
// `varlen` and grew them (struct_size tells the two versions apart; see check_header).
#if UINTPTR_MAX == UINT64_MAX
static_assert(sizeof(flashattn_options) == 40, "flashattn_options layout");
static_assert(offsetof(flashattn_fwd_params, varlen) == 344 && offsetof(flashattn_fwd_params, lse_fp64) == 376 &&
                  offsetof(flashattn_fwd_params, dropout_seed) == 384 &&
                  offsetof(flashattn_fwd_params, kv_cache) == 424 && offsetof(flashattn_fwd_params, num_splits) == 648 &&
                  offsetof(flashattn_fwd_params, fp8) == 656 && offsetof(flashattn_fwd_params, fp8_v_layout) == 696 &&
                  sizeof(flashattn_fwd_params) == 704,
              "flashattn_fwd_params layout changed");
static_assert(sizeof(flashattn_fp8_scales) == 40 && offsetof(flashattn_fp8_scales, q_block_size) == 24 &&
                  offsetof(flashattn_fp8_scales, out_dtype) == 32,
              "flashattn_fp8_scales layout changed");
static_assert(offsetof(flashattn_bwd_params, varlen) == 632 && offsetof(flashattn_bwd_params, lse_fp64) == 664 &&
                  offsetof(flashattn_bwd_params, dropout_seed) == 672 && sizeof(flashattn_bwd_params) == 712,
              "flashattn_bwd_params layout changed");
#endif

size_t dtype_size(flashattn_dtype dtype) {
  switch (dtype) {
    case FLASHATTN_DTYPE_FP16:
    case FLASHATTN_DTYPE_BF16: return 2;
    case FLASHATTN_DTYPE_FP32: return 4;
    case FLASHATTN_DTYPE_FP64: return 8;
    case FLASHATTN_DTYPE_FP8_E4M3: return 1;
  }
  return 0;
}

const char* dtype_name(flashattn_dtype dtype) {
  switch (dtype) {
    case FLASHATTN_DTYPE_FP16: return "fp16";
    case FLASHATTN_DTYPE_BF16: return "bf16";
    case FLASHATTN_DTYPE_FP32: return "fp32";
    case FLASHATTN_DTYPE_FP64: return "fp64";
    case FLASHATTN_DTYPE_FP8_E4M3: return "fp8_e4m3";
  }
  return "unknown";
}

flashattn_status check_placement_options(const flashattn_options& o) {
  constexpr flashattn_status kInvalid = FLASHATTN_ERROR_INVALID_ARGUMENT;
  if (o.backend < FLASHATTN_BACKEND_AUTO || o.backend > FLASHATTN_BACKEND_SM90)
    return set_error(kInvalid, "options.backend: unknown value %d", int(o.backend));
  if (o.device < -1) return set_error(kInvalid, "options.device: %d (use -1 for host tensors)", o.device);
  const bool host_backend = o.backend == FLASHATTN_BACKEND_REFERENCE || o.backend == FLASHATTN_BACKEND_CPU;
  const bool device_backend = o.backend == FLASHATTN_BACKEND_SM80 || o.backend == FLASHATTN_BACKEND_SM90;
  if (host_backend && o.device != -1)
    return set_error(kInvalid, "options.device: %d, but backend %s runs on host tensors (device -1)", o.device,
                     flashattn_backend_name(o.backend));
  if (device_backend && o.device < 0)
    return set_error(kInvalid, "options.device: -1 (host), but backend %s needs CUDA tensors",
                     flashattn_backend_name(o.backend));
  if (o.num_threads < 0)
    return set_error(kInvalid, "options.num_threads: %d (must be >= 0; 0 = default)", o.num_threads);
  return FLASHATTN_SUCCESS;
}

flashattn_status check_pointer(const char* name, const void* ptr, size_t align, int device) {
  constexpr flashattn_status kInvalid = FLASHATTN_ERROR_INVALID_ARGUMENT;
  if (reinterpret_cast<uintptr_t>(ptr) % align != 0)
    return set_error(kInvalid, "%s: %p is not %zu-byte aligned", name, ptr, align);
#if defined(FLASHATTN_HAS_CUDA)
  int dev = -1;
  const int kind = cuda::pointer_kind(ptr, &dev);
  if (device >= 0 && kind != 2 && kind != 3)
    return set_error(kInvalid, "%s: %p is not CUDA device memory (options.device = %d)", name, ptr, device);
  if (device >= 0 && kind == 2 && dev != device)
    return set_error(kInvalid, "%s: memory of CUDA device %d, but options.device = %d", name, dev, device);
  if (device < 0 && kind == 2)
    return set_error(kInvalid, "%s: %p is CUDA device memory, but options.device = -1 (host)", name, ptr);
#else
  (void)device;
#endif
  return FLASHATTN_SUCCESS;
}

namespace {

constexpr flashattn_status kInvalid = FLASHATTN_ERROR_INVALID_ARGUMENT;
// Device kernels load 16-byte vectors along headdim and rows.
constexpr size_t kDeviceAlignBytes = 16;

bool on_device(const CallContext& c) { return c.device >= 0; }

flashattn_status check_dtype(flashattn_dtype dtype, int device) {
  if (dtype_size(dtype) == 0) return set_error(kInvalid, "dtype: unknown value %d", int(dtype));
  // FP8 on CUDA tensors passes: the device paths refuse it by name (no FP8 kernel yet), after the
  // scales have been checked like every other argument.
  if (device >= 0 && dtype != FLASHATTN_DTYPE_FP16 && dtype != FLASHATTN_DTYPE_BF16 &&
      dtype != FLASHATTN_DTYPE_FP8_E4M3)
    return set_error(FLASHATTN_ERROR_NOT_SUPPORTED,
                     "dtype: %s is supported only for host tensors (device paths: fp16, bf16)",
                     dtype_name(dtype));
  return FLASHATTN_SUCCESS;
}

flashattn_status check_options(const flashattn_options& o, CallContext* ctx) {
  if (o.backend < FLASHATTN_BACKEND_AUTO || o.backend > FLASHATTN_BACKEND_SM90)
    return set_error(kInvalid, "options.backend: unknown value %d", int(o.backend));
  if (o.device < -1) return set_error(kInvalid, "options.device: %d (use -1 for host tensors)", o.device);
  bool host_backend = o.backend == FLASHATTN_BACKEND_REFERENCE || o.backend == FLASHATTN_BACKEND_CPU;
  bool device_backend = o.backend == FLASHATTN_BACKEND_SM80 || o.backend == FLASHATTN_BACKEND_SM90;
  if (host_backend && o.device != -1)
    return set_error(kInvalid, "options.device: %d, but backend %s runs on host tensors (device -1)",
                     o.device, flashattn_backend_name(o.backend));
  if (device_backend && o.device < 0)
    return set_error(kInvalid, "options.device: -1 (host), but backend %s needs CUDA tensors",
                     flashattn_backend_name(o.backend));
  if (!(std::isfinite(o.softmax_scale) && o.softmax_scale >= 0.f))
    return set_error(kInvalid, "options.softmax_scale: %g (must be finite and > 0; 0 = 1/sqrt(headdim))",
                     double(o.softmax_scale));
  if (o.causal != 0 && o.causal != 1) return set_error(kInvalid, "options.causal: %d (0 or 1)", o.causal);
  if (o.window_left < -1) return set_error(kInvalid, "options.window_left: %d (>= -1)", o.window_left);
  if (o.window_right < -1) return set_error(kInvalid, "options.window_right: %d (>= -1)", o.window_right);
  if (o.causal && o.window_right > 0)
    return set_error(kInvalid, "options.window_right: %d conflicts with options.causal (needs 0 or -1)",
                     o.window_right);
  if (!(std::isfinite(o.softcap) && o.softcap >= 0.f))
    return set_error(kInvalid, "options.softcap: %g (must be finite and >= 0)", double(o.softcap));
  if (!(o.dropout_p >= 0.f && o.dropout_p < 1.f))
    return set_error(kInvalid, "options.dropout_p: %g (must be in [0, 1))", double(o.dropout_p));
  if (o.deterministic != 0 && o.deterministic != 1)
    return set_error(kInvalid, "options.deterministic: %d (0 or 1)", o.deterministic);
  if (o.num_threads < 0)
    return set_error(kInvalid, "options.num_threads: %d (must be >= 0; 0 = default)", o.num_threads);
  ctx->backend = o.backend;
  ctx->device = o.device;
  ctx->num_threads = o.num_threads;
  return FLASHATTN_SUCCESS;
}

MaskOptions mask_options(const flashattn_options& o, int headdim) {
  MaskOptions m;
  m.softmax_scale = o.softmax_scale > 0.f ? o.softmax_scale : 1.f / std::sqrt(float(headdim));
  m.softcap = o.softcap;
  m.window_left = o.window_left;
  m.window_right = o.causal ? 0 : o.window_right;
  return m;
}

// One tensor argument: shape as expected, last dim contiguous, strides sane, pointer usable.
// contiguous_dim 1: the sequence dimension is the contiguous one instead (FP8's transposed v).
flashattn_status check_tensor(const char* name, const flashattn_tensor& t, const int64_t (&expect)[4],
                              flashattn_dtype dtype, const CallContext& ctx, int contiguous_dim = 3) {
  for (int i = 0; i < 4; ++i) {
    if (t.shape[i] != expect[i])
      return set_error(kInvalid, "%s.shape[%d]: %lld, expected %lld (shape is [batch, seqlen, nheads, headdim])",
                       name, i, (long long)t.shape[i], (long long)expect[i]);
  }
  if (t.stride[contiguous_dim] != 1)
    return set_error(kInvalid, "%s.stride[%d]: %lld (the %s dimension must be contiguous, stride 1%s)", name,
                     contiguous_dim, (long long)t.stride[contiguous_dim], contiguous_dim == 3 ? "last" : "sequence",
                     contiguous_dim == 3 ? "" : ": fp8_v_layout keys_permuted16");
  for (int i = 0; i < 4; ++i) {
    if (i == contiguous_dim) continue;
    if (t.stride[i] < 0)
      return set_error(kInvalid, "%s.stride[%d]: %lld (negative strides are not supported)", name, i,
                       (long long)t.stride[i]);
  }
  int64_t numel = t.shape[0] * t.shape[1] * t.shape[2] * t.shape[3];
  if (numel == 0) return FLASHATTN_SUCCESS;
  if (t.data == nullptr) return set_error(kInvalid, "%s.data: NULL", name);
  size_t es = dtype_size(dtype);
  size_t align = on_device(ctx) ? kDeviceAlignBytes : es;
  if (reinterpret_cast<uintptr_t>(t.data) % align != 0)
    return set_error(kInvalid, "%s.data: %p is not %zu-byte aligned", name, t.data, align);
  if (on_device(ctx)) {
    int64_t vec = int64_t(kDeviceAlignBytes / es);
    for (int i = 0; i < 4; ++i) {
      if (i == contiguous_dim) continue;
      if (t.shape[i] > 1 && t.stride[i] % vec != 0)
        return set_error(kInvalid, "%s.stride[%d]: %lld is not a multiple of %lld elements (16 bytes)",
                         name, i, (long long)t.stride[i], (long long)vec);
    }
    if (t.shape[3] % vec != 0)
      return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "%s.shape[3] (headdim %lld): device paths need a multiple of %lld",
                       name, (long long)t.shape[3], (long long)vec);
  }
#if defined(FLASHATTN_HAS_CUDA)
  int dev = -1;
  int kind = cuda::pointer_kind(t.data, &dev);
  if (on_device(ctx) && kind != 2 && kind != 3)
    return set_error(kInvalid, "%s.data: %p is not CUDA device memory (options.device = %d)", name, t.data,
                     ctx.device);
  if (on_device(ctx) && kind == 2 && dev != ctx.device)
    return set_error(kInvalid, "%s.data: memory of CUDA device %d, but options.device = %d", name, dev,
                     ctx.device);
  if (!on_device(ctx) && kind == 2)
    return set_error(kInvalid, "%s.data: %p is CUDA device memory, but options.device = -1 (host)", name,
                     t.data);
#endif
  return FLASHATTN_SUCCESS;
}

flashattn_status check_lse(const char* name, const void* lse, bool required, int64_t numel,
                           const CallContext& ctx, size_t align = 4) {
  if (lse == nullptr) {
    if (required && numel > 0) return set_error(kInvalid, "%s: NULL (the backward needs the forward's LSE)", name);
    return FLASHATTN_SUCCESS;
  }
  if (reinterpret_cast<uintptr_t>(lse) % align != 0)
    return set_error(kInvalid, "%s: %p is not %zu-byte aligned", name, lse, align);
#if defined(FLASHATTN_HAS_CUDA)
  int dev = -1;
  int kind = cuda::pointer_kind(lse, &dev);
  if (on_device(ctx) && kind != 2 && kind != 3)
    return set_error(kInvalid, "%s: %p is not CUDA device memory", name, lse);
  if (!on_device(ctx) && kind == 2)
    return set_error(kInvalid, "%s: %p is CUDA device memory, but options.device = -1", name, lse);
#else
  (void)ctx;
#endif
  return FLASHATTN_SUCCESS;
}

flashattn_status check_device(const CallContext& ctx) {
  if (!on_device(ctx)) return FLASHATTN_SUCCESS;
#if defined(FLASHATTN_HAS_CUDA)
  int n = cuda::device_count();
  if (n == 0) return set_error(FLASHATTN_ERROR_NO_DEVICE, "options.device: %d, but no CUDA device is present", ctx.device);
  if (ctx.device >= n)
    return set_error(FLASHATTN_ERROR_NO_DEVICE, "options.device: %d, but only %d CUDA device(s) exist", ctx.device, n);
  return FLASHATTN_SUCCESS;
#else
  return set_error(FLASHATTN_ERROR_NO_DEVICE, "options.device: %d, but this build has no CUDA support",
                   ctx.device);
#endif
}

// cu_seqlens: monotone, within the packed tensors, each length <= max_seqlen.
flashattn_status check_varlen(const flashattn_varlen& vl, int64_t total_q, int64_t total_k, void* stream,
                              const CallContext& ctx) {
  if (vl.batch < 1) return set_error(kInvalid, "varlen.batch: %d (must be >= 1 with cu_seqlens)", vl.batch);
  if (vl.max_seqlen_q < 0) return set_error(kInvalid, "varlen.max_seqlen_q: %d (must be >= 0)", vl.max_seqlen_q);
  if (vl.max_seqlen_k < 0) return set_error(kInvalid, "varlen.max_seqlen_k: %d (must be >= 0)", vl.max_seqlen_k);
  size_t n = size_t(vl.batch) + 1;
  std::vector<int32_t> cq(n), ck(n);
  const int32_t* hq = vl.cu_seqlens_q;
  const int32_t* hk = vl.cu_seqlens_k;
  if (reinterpret_cast<uintptr_t>(hq) % 4 || reinterpret_cast<uintptr_t>(hk) % 4)
    return set_error(kInvalid, "varlen.cu_seqlens_%s: not 4-byte aligned",
                     reinterpret_cast<uintptr_t>(hq) % 4 ? "q" : "k");
  if (on_device(ctx)) {
#if defined(FLASHATTN_HAS_CUDA)
    for (const int32_t* p : {hq, hk}) {
      int dev = -1, kind = cuda::pointer_kind(p, &dev);
      if (kind != 2 && kind != 3)
        return set_error(kInvalid, "varlen.cu_seqlens_%s: %p is not CUDA device memory", p == hq ? "q" : "k", p);
    }
    // Reading device memory needs a stream sync, which would cost every varlen call its
    // host/device overlap and break graph capture. So the contents are checked only on request
    // (FLASHATTN_CHECK_CU_SEQLENS=1, never while capturing, never for size queries); the
    // kernels clamp lengths to max_seqlen and the packed tensors, so bad values can't write out
    // of bounds either way. Host cu_seqlens are always checked.
    const char* check = std::getenv("FLASHATTN_CHECK_CU_SEQLENS");
    if (stream == kSizeQuery || !(check && check[0] == '1') || cuda::stream_is_capturing(stream))
      return FLASHATTN_SUCCESS;
    flashattn_status s = cuda::copy_to_host(cq.data(), hq, n * 4, stream);
    if (s == FLASHATTN_SUCCESS) s = cuda::copy_to_host(ck.data(), hk, n * 4, stream);
    if (s != FLASHATTN_SUCCESS) return s;
    hq = cq.data();
    hk = ck.data();
#else
    (void)stream;
    return set_error(FLASHATTN_ERROR_NO_DEVICE, "no CUDA support in this build");
#endif
  } else {
#if defined(FLASHATTN_HAS_CUDA)
    for (const int32_t* p : {hq, hk}) {
      int dev = -1;
      if (cuda::pointer_kind(p, &dev) == 2)
        return set_error(kInvalid, "varlen.cu_seqlens_%s: %p is CUDA device memory, but options.device = -1",
                         p == hq ? "q" : "k", p);
    }
#endif
  }
  struct Side { const char* name; const int32_t* cu; int64_t total; int max; };
  for (Side s : {Side{"q", hq, total_q, vl.max_seqlen_q}, Side{"k", hk, total_k, vl.max_seqlen_k}}) {
    if (s.cu[0] < 0) return set_error(kInvalid, "varlen.cu_seqlens_%s[0]: %d (must be >= 0)", s.name, s.cu[0]);
    for (int b = 0; b < vl.batch; ++b) {
      int len = s.cu[b + 1] - s.cu[b];
      if (len < 0)
        return set_error(kInvalid, "varlen.cu_seqlens_%s: not monotone at index %d (%d then %d)", s.name, b + 1,
                         s.cu[b], s.cu[b + 1]);
      if (len > s.max)
        return set_error(kInvalid, "varlen.cu_seqlens_%s: sequence %d has length %d > varlen.max_seqlen_%s (%d)",
                         s.name, b, len, s.name, s.max);
    }
    if (s.cu[vl.batch] > s.total)
      return set_error(kInvalid, "varlen.cu_seqlens_%s[%d]: %d exceeds the packed tensor's %lld rows", s.name,
                       vl.batch, s.cu[vl.batch], (long long)s.total);
  }
  return FLASHATTN_SUCCESS;
}

RowStrides row_strides(const flashattn_tensor& t, bool varlen) {
  return RowStrides{varlen ? 0 : t.stride[0], t.stride[1], t.stride[2]};
}

// Shared by fwd and bwd: options, dtype, device, shapes of q/k/v, varlen. Fills shape/mask.
// A KV cache (kv_cache_k_batch) leaves k's first dimension to the cache's own layout (pages, or
// cache batches): check_kv_cache checks it, and the varlen check does not bound cu_seqlens_k by it.
flashattn_status normalize_common(const flashattn_options& opts, flashattn_dtype dtype, const flashattn_varlen& vl,
                                  const flashattn_tensor& q, const flashattn_tensor& k, const flashattn_tensor& v,
                                  void* stream, Shape* shape, MaskOptions* mask, CallContext* ctx,
                                  bool kv_cache_k_batch = false, bool paged = false, bool v_keys_contiguous = false) {
  flashattn_status s = check_options(opts, ctx);
  if (s != FLASHATTN_SUCCESS) return s;
  if ((s = check_dtype(dtype, ctx->device)) != FLASHATTN_SUCCESS) return s;
  if ((s = check_device(*ctx)) != FLASHATTN_SUCCESS) return s;

  bool varlen = vl.cu_seqlens_q != nullptr || vl.cu_seqlens_k != nullptr;
  if (varlen && (vl.cu_seqlens_q == nullptr || vl.cu_seqlens_k == nullptr))
    return set_error(kInvalid, "varlen.cu_seqlens_%s: NULL (set both cu_seqlens_q and cu_seqlens_k, or neither)",
                     vl.cu_seqlens_q == nullptr ? "q" : "k");
  for (int i = 0; i < 4; ++i) {
    if (q.shape[i] < 0) return set_error(kInvalid, "q.shape[%d]: %lld (negative)", i, (long long)q.shape[i]);
    if (k.shape[i] < 0) return set_error(kInvalid, "k.shape[%d]: %lld (negative)", i, (long long)k.shape[i]);
  }
  if (q.shape[1] > INT32_MAX || k.shape[1] > INT32_MAX)
    return set_error(kInvalid, "%s.shape[1]: sequence length exceeds 2^31-1", q.shape[1] > INT32_MAX ? "q" : "k");
  const int64_t d = q.shape[3];
  if (d < 1) return set_error(kInvalid, "q.shape[3]: headdim %lld (must be >= 1)", (long long)d);
  if (d > 256)
    return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "q.shape[3]: headdim %lld > 256 is not supported", (long long)d);
  if (q.shape[2] < 1) return set_error(kInvalid, "q.shape[2]: nheads %lld (must be >= 1)", (long long)q.shape[2]);
  if (k.shape[2] < 1) return set_error(kInvalid, "k.shape[2]: nheads_kv %lld (must be >= 1)", (long long)k.shape[2]);
  if (q.shape[2] % k.shape[2] != 0)
    return set_error(kInvalid, "k.shape[2]: nheads_q (%lld) must be a multiple of nheads_kv (%lld)",
                     (long long)q.shape[2], (long long)k.shape[2]);
  if (varlen) {
    if (q.shape[0] != 1) return set_error(kInvalid, "q.shape[0]: %lld (varlen tensors are packed: [1, total_q, nheads, headdim])", (long long)q.shape[0]);
    if (k.shape[0] != 1 && !kv_cache_k_batch) return set_error(kInvalid, "k.shape[0]: %lld (varlen tensors are packed: [1, total_k, nheads, headdim])", (long long)k.shape[0]);
  } else if (k.shape[0] != q.shape[0] && !kv_cache_k_batch) {
    return set_error(kInvalid, "k.shape[0]: batch %lld differs from q's %lld", (long long)k.shape[0],
                     (long long)q.shape[0]);
  }
  const int64_t kexpect[4] = {k.shape[0], k.shape[1], k.shape[2], d};
  const int64_t qexpect[4] = {q.shape[0], q.shape[1], q.shape[2], d};
  if ((s = check_tensor("q", q, qexpect, dtype, *ctx)) != FLASHATTN_SUCCESS) return s;
  if ((s = check_tensor("k", k, kexpect, dtype, *ctx)) != FLASHATTN_SUCCESS) return s;
  if ((s = check_tensor("v", v, kexpect, dtype, *ctx, v_keys_contiguous ? 1 : 3)) != FLASHATTN_SUCCESS) return s;
  if (varlen && (s = check_varlen(vl, q.shape[1], paged ? INT32_MAX : k.shape[1], stream, *ctx)) != FLASHATTN_SUCCESS)
    return s;

  shape->batch = varlen ? vl.batch : int(q.shape[0]);
  shape->seqlen_q = varlen ? vl.max_seqlen_q : int(q.shape[1]);
  shape->seqlen_k = varlen ? vl.max_seqlen_k : int(k.shape[1]);
  shape->nheads_q = int(q.shape[2]);
  shape->nheads_kv = int(k.shape[2]);
  shape->headdim = int(d);
  shape->total_q = varlen ? int(q.shape[1]) : int(q.shape[0] * q.shape[1]);
  shape->total_k = varlen ? int(k.shape[1]) : int(k.shape[0] * k.shape[1]);
  *mask = mask_options(opts, int(d));
  ctx->nothing_to_do = shape->batch == 0 || (varlen ? (shape->total_q == 0 && shape->total_k == 0)
                                                     : (shape->seqlen_q == 0 && shape->seqlen_k == 0));
  ctx->no_keys = !varlen && shape->seqlen_k == 0;
  ctx->no_queries = !varlen && shape->seqlen_q == 0;
  return FLASHATTN_SUCCESS;
}

// sizeof() of the params structs before lse_fp64 was appended: they ended after `varlen`,
// padded to the alignment of their widest member (flashattn_tensor's int64/pointer).
template <typename P>
constexpr size_t size_before_lse_fp64() {
  constexpr size_t end = offsetof(P, varlen) + sizeof(flashattn_varlen);
  constexpr size_t align = alignof(flashattn_tensor);
  return (end + align - 1) / align * align;
}
static_assert(size_before_lse_fp64<flashattn_fwd_params>() <= offsetof(flashattn_fwd_params, lse_fp64), "");
static_assert(size_before_lse_fp64<flashattn_bwd_params>() <= offsetof(flashattn_bwd_params, lse_fp64), "");

// ... and before the dropout/ALiBi fields were appended after lse_fp64.
template <typename P>
constexpr size_t size_before_dropout() {
  return offsetof(P, dropout_seed);
}

// Every struct_size a caller may pass: the current one and each earlier header's.
template <typename P>
struct EarlierSizes {
  static constexpr size_t sizes[] = {size_before_dropout<P>(), size_before_lse_fp64<P>()};
};
template <>
struct EarlierSizes<flashattn_fwd_params> {  // fwd_params also grew by the KV cache fields, fp8, fp8_v_layout
  static constexpr size_t sizes[] = {offsetof(flashattn_fwd_params, fp8_v_layout), offsetof(flashattn_fwd_params, fp8),
                                     offsetof(flashattn_fwd_params, kv_cache),
                                     size_before_dropout<flashattn_fwd_params>(),
                                     size_before_lse_fp64<flashattn_fwd_params>()};
};

// Copies the caller's struct into *full: the current size, or an earlier version's (struct_size
// says which), whose later fields are not read and stay zero (lse_fp64 = NULL, no ALiBi, dropout
// seed 0, no KV cache).
template <typename P>
flashattn_status check_header(const P* p, const char* what, P* full) {
  if (p == nullptr) return set_error(kInvalid, "params: NULL");
  const size_t n = p->struct_size;
  bool known = n == sizeof(P);
  std::string earlier;
  for (size_t e : EarlierSizes<P>::sizes) {
    known = known || n == e;
    earlier += (earlier.empty() ? "" : ", ") + std::to_string(e);
  }
  if (!known)
    return set_error(kInvalid,
                     "params.struct_size: %u, expected sizeof(%s) = %zu, or one of %s from an earlier header "
                     "(header/library mismatch?)",
                     p->struct_size, what, sizeof(P), earlier.c_str());
  std::memset(static_cast<void*>(full), 0, sizeof(P));
  std::memcpy(static_cast<void*>(full), p, n);
  return FLASHATTN_SUCCESS;
}

// lse_fp64: only for fp64 problems, and not together with the fp32 `lse`.
flashattn_status check_lse_fp64(flashattn_dtype dtype, const void* lse, const void* lse_fp64) {
  if (lse_fp64 == nullptr) return FLASHATTN_SUCCESS;
  if (dtype != FLASHATTN_DTYPE_FP64)
    return set_error(kInvalid, "lse_fp64: set, but dtype is %s (an fp64 LSE needs dtype fp64; use lse)",
                     dtype_name(dtype));
  if (lse != nullptr) return set_error(kInvalid, "lse_fp64: set together with lse (set at most one)");
  return FLASHATTN_SUCCESS;
}

// fwd_params.fp8: with dtype FP8_E4M3 the three scale arrays (sized by the shape and block sizes) and
// a 16-bit output dtype; with any other dtype every field left zero (a scale given to a bf16 call
// is a caller's mistake, not something to ignore). Fills out->fp8.
flashattn_status check_fp8(const flashattn_fwd_params& p, const Shape& sh, const CallContext& ctx, FwdParams* out) {
  const flashattn_fp8_scales& f = p.fp8;
  if (p.dtype != FLASHATTN_DTYPE_FP8_E4M3) {
    const char* set = f.q_scale ? "q_scale" : f.k_scale ? "k_scale" : f.v_scale ? "v_scale"
                    : f.q_block_size ? "q_block_size" : f.k_block_size ? "k_block_size"
                    : f.out_dtype ? "out_dtype" : nullptr;
    if (set != nullptr)
      return set_error(kInvalid, "fp8.%s: set, but dtype is %s (the fp8 fields are for dtype fp8_e4m3; leave them 0)",
                       set, dtype_name(p.dtype));
    if (p.fp8_v_layout != FLASHATTN_FP8_V_ROWS)
      return set_error(kInvalid, "fp8_v_layout: %d, but dtype is %s (a v layout for dtype fp8_e4m3; leave it 0)",
                       p.fp8_v_layout, dtype_name(p.dtype));
    return FLASHATTN_SUCCESS;
  }
  if (p.struct_size <= offsetof(flashattn_fwd_params, fp8))
    return set_error(kInvalid, "fp8: params.struct_size %u predates the fp8 fields, which dtype fp8_e4m3 needs (build "
                               "against this header)", p.struct_size);
  if (f.out_dtype != FLASHATTN_DTYPE_BF16 && f.out_dtype != FLASHATTN_DTYPE_FP16)
    return set_error(kInvalid, "fp8.out_dtype: %s (FP8 attention writes bf16 or fp16: FLASHATTN_DTYPE_BF16 or _FP16)",
                     f.out_dtype == 0 ? "0 (unset)" : dtype_name(f.out_dtype));
  if (f.q_block_size < 1)
    return set_error(kInvalid, "fp8.q_block_size: %d (rows per scale block, >= 1; >= seqlen_q for one scale per head)",
                     f.q_block_size);
  if (f.k_block_size < 1)
    return set_error(kInvalid, "fp8.k_block_size: %d (rows per scale block of k and v, >= 1; >= seqlen_k for one "
                               "scale per head)", f.k_block_size);
  Fp8Scales& o = out->fp8;
  o.q_block_size = f.q_block_size;
  o.k_block_size = f.k_block_size;
  o.q_blocks = int((int64_t(sh.seqlen_q) + f.q_block_size - 1) / f.q_block_size);
  o.k_blocks = int((int64_t(sh.seqlen_k) + f.k_block_size - 1) / f.k_block_size);
  o.out_dtype = f.out_dtype;
  const int64_t q_count = int64_t(sh.batch) * sh.nheads_q * o.q_blocks;
  const int64_t k_count = int64_t(sh.batch) * sh.nheads_kv * o.k_blocks;
  struct Scale { const char* name; const float* ptr; int64_t count; };
  for (Scale sc : {Scale{"fp8.q_scale", f.q_scale, q_count}, Scale{"fp8.k_scale", f.k_scale, k_count},
                   Scale{"fp8.v_scale", f.v_scale, k_count}}) {
    if (sc.ptr == nullptr) {
      if (sc.count == 0) continue;
      return set_error(kInvalid, "%s: NULL (dtype fp8_e4m3 needs %lld scales: [batch, nheads, blocks])", sc.name,
                       (long long)sc.count);
    }
    flashattn_status s = check_lse(sc.name, sc.ptr, false, 0, ctx);  // aligned, in the tensors' memory space
    if (s != FLASHATTN_SUCCESS) return s;
  }
  o.q = f.q_scale;
  o.k = f.k_scale;
  o.v = f.v_scale;
  if (p.fp8_v_layout == FLASHATTN_FP8_V_KEYS_PERMUTED16) {
    // normalize_common checked v.stride[1] == 1 and the other strides' signs and alignment.
    if (p.varlen.cu_seqlens_q != nullptr)
      return set_error(FLASHATTN_ERROR_NOT_SUPPORTED,
                       "fp8_v_layout: keys_permuted16 is for fixed-length batches (varlen.cu_seqlens_q is set)");
    const int64_t padded = (int64_t(sh.seqlen_k) + 15) / 16 * 16;
    if (sh.headdim > 1 && (p.v.stride[3] % 16 != 0 || p.v.stride[3] < padded))
      return set_error(kInvalid, "v.stride[3]: %lld (fp8_v_layout keys_permuted16: the row length of V^T, a multiple "
                       "of 16 and >= seqlen_k rounded up to 16 = %lld)", (long long)p.v.stride[3], (long long)padded);
    o.v_keys_permuted16 = true;
    o.v_col_stride = p.v.stride[3];
  }
  o.v_rows_auto = p.fp8_v_layout == FLASHATTN_FP8_V_ROWS_AUTO && p.varlen.cu_seqlens_q == nullptr;
  return FLASHATTN_SUCCESS;
}

// dropout_rng_state and alibi_slopes: aligned, in the tensors' memory space; the ALiBi batch
// stride 0 (one slope per head) or at least nheads_q. Fills the normalized policies.
template <typename P>
flashattn_status check_score_mods(const P& p, const Shape& sh, const CallContext& ctx, Dropout* dropout,
                                  Alibi* alibi) {
  flashattn_status s;
  if (p.dropout_rng_state != nullptr) {
    if (!(p.options.dropout_p > 0.f))
      return set_error(kInvalid, "dropout_rng_state: set, but options.dropout_p is 0 (no dropout)");
    if ((s = check_lse("dropout_rng_state", p.dropout_rng_state, false, 0, ctx, sizeof(uint64_t))) != FLASHATTN_SUCCESS)
      return s;
  }
  if (p.alibi_slopes == nullptr) {
    if (p.alibi_batch_stride != 0)
      return set_error(kInvalid, "alibi_batch_stride: %lld, but alibi_slopes is NULL", (long long)p.alibi_batch_stride);
  } else {
    if ((s = check_lse("alibi_slopes", p.alibi_slopes, false, 0, ctx)) != FLASHATTN_SUCCESS) return s;
    if (p.alibi_batch_stride != 0 && p.alibi_batch_stride < sh.nheads_q)
      return set_error(kInvalid, "alibi_batch_stride: %lld (0 for slopes [nheads_q], or >= nheads_q = %d for [batch, nheads_q])",
                       (long long)p.alibi_batch_stride, sh.nheads_q);
  }
  *dropout = Dropout::make(p.options.dropout_p, p.dropout_seed, p.dropout_offset, p.dropout_rng_state);
  alibi->slopes = p.alibi_slopes;
  alibi->batch_stride = p.alibi_batch_stride;
  return FLASHATTN_SUCCESS;
}

// An int32 index array of the KV cache ([n] entries of `name`): aligned, in the tensors' memory
// space. *host points at host-readable contents, or is NULL for device arrays that are not checked
// (as cu_seqlens: only with FLASHATTN_CHECK_CU_SEQLENS=1, outside capture and size queries).
flashattn_status read_index_array(const char* name, const int32_t* a, size_t n, void* stream, const CallContext& ctx,
                                  std::vector<int32_t>* copy, const int32_t** host) {
  *host = nullptr;
  if (a == nullptr) return FLASHATTN_SUCCESS;
  flashattn_status s = check_lse(name, a, false, 0, ctx, sizeof(int32_t));
  if (s != FLASHATTN_SUCCESS) return s;
  if (!on_device(ctx)) {
    *host = a;
    return FLASHATTN_SUCCESS;
  }
#if defined(FLASHATTN_HAS_CUDA)
  const char* check = std::getenv("FLASHATTN_CHECK_CU_SEQLENS");
  if (stream == kSizeQuery || !(check && check[0] == '1') || cuda::stream_is_capturing(stream) || n == 0)
    return FLASHATTN_SUCCESS;
  copy->resize(n);
  if ((s = cuda::copy_to_host(copy->data(), a, n * sizeof(int32_t), stream)) != FLASHATTN_SUCCESS) return s;
  *host = copy->data();
#else
  (void)stream;
  (void)copy;
#endif
  return FLASHATTN_SUCCESS;
}

// flashattn_kv_cache: layout of k/v (pages or cache batches), index arrays, rows to append and
// the rotary tables. Fills out->kv and the shape's key extents (fixed: seqlen_k = the capacity).
flashattn_status check_kv_cache(const flashattn_fwd_params& p, void* stream, const CallContext& ctx, FwdParams* out) {
  const flashattn_kv_cache& c = p.kv_cache;
  KvCache& kv = out->kv;
  Shape& sh = out->shape;
  const bool varlen = p.varlen.cu_seqlens_q != nullptr;
  const bool paged = c.block_table != nullptr;
  const bool appends = c.k_new.data != nullptr || c.v_new.data != nullptr;
  flashattn_status s;
  if (p.num_splits < 0) return set_error(kInvalid, "num_splits: %d (0 = heuristic, 1 = no split, n > 1)", p.num_splits);
  out->num_splits = p.num_splits;
  if (!appends && (c.rotary_cos != nullptr || c.rotary_sin != nullptr))
    return set_error(kInvalid, "kv_cache.rotary_cos: the rotary embedding is applied with rows to append "
                               "(kv_cache.k_new); without them, rotate q and k before the call");
  kv.num_cache_batches = int(p.k.shape[0]);
  if (paged) {
    if (c.batch_idx != nullptr)
      return set_error(kInvalid, "kv_cache.batch_idx: not supported with kv_cache.block_table (the block table "
                                 "already maps each sequence to its pages)");
    if (c.max_pages < 1) return set_error(kInvalid, "kv_cache.max_pages: %d (must be >= 1 with a block table)", c.max_pages);
    if (c.block_table_stride < c.max_pages && sh.batch > 1)
      return set_error(kInvalid, "kv_cache.block_table_stride: %lld (must be >= kv_cache.max_pages = %d)",
                       (long long)c.block_table_stride, c.max_pages);
    if (p.k.shape[1] < 1)
      return set_error(kInvalid, "k.shape[1]: page size %lld (paged k/v are [num_pages, page_size, nheads_kv, "
                                 "headdim], page_size >= 1)", (long long)p.k.shape[1]);
    if (int64_t(c.max_pages) * p.k.shape[1] > INT32_MAX)
      return set_error(kInvalid, "kv_cache.max_pages: %d pages of %lld rows exceed 2^31-1 rows", c.max_pages,
                       (long long)p.k.shape[1]);
    kv.block_table = c.block_table;
    kv.block_table_stride = c.block_table_stride;
    kv.max_pages = c.max_pages;
    kv.set_page_size(int(p.k.shape[1]));
    kv.num_pages = int(p.k.shape[0]);
    // Pages are addressed through the tensors' first stride, varlen or not.
    out->k_stride.batch = p.k.stride[0];
    out->v_stride.batch = p.v.stride[0];
    sh.total_k = int(std::min<int64_t>(int64_t(kv.num_pages) * kv.page_size, INT32_MAX));
    if (!varlen) sh.seqlen_k = kv.room(0);
  } else if (c.batch_idx != nullptr && varlen) {
    return set_error(kInvalid, "kv_cache.batch_idx: not supported with varlen (packed k/v have one batch)");
  }
  kv.seqlens = c.seqlens;
  kv.leftpad = c.leftpad;
  kv.batch_idx = c.batch_idx;

  if (appends) {
    if (c.k_new.data == nullptr || c.v_new.data == nullptr)
      return set_error(kInvalid, "kv_cache.%s.data: NULL (give both k_new and v_new, or neither)",
                       c.k_new.data == nullptr ? "k_new" : "v_new");
    if (varlen) return set_error(kInvalid, "kv_cache.k_new: appending is for fixed-length calls (not varlen)");
    if (p.q.shape[1] < 1)
      return set_error(kInvalid, "q.shape[1]: 0 queries with kv_cache.k_new (appending runs with the attention)");
    if (c.seqlens == nullptr)
      return set_error(kInvalid, "kv_cache.seqlens: NULL (appending needs each sequence's end row)");
    const int64_t expect[4] = {p.q.shape[0], c.k_new.shape[1], p.k.shape[2], p.q.shape[3]};
    if (c.k_new.shape[1] < 1)
      return set_error(kInvalid, "kv_cache.k_new.shape[1]: %lld new rows (must be >= 1)", (long long)c.k_new.shape[1]);
    if ((s = check_tensor("kv_cache.k_new", c.k_new, expect, p.dtype, ctx)) != FLASHATTN_SUCCESS) return s;
    if ((s = check_tensor("kv_cache.v_new", c.v_new, expect, p.dtype, ctx)) != FLASHATTN_SUCCESS) return s;
    if (c.k_new.shape[1] > kv.room(int(p.k.shape[1])))
      return set_error(kInvalid, "kv_cache.k_new.shape[1]: %lld new rows exceed the cache's %d rows",
                       (long long)c.k_new.shape[1], kv.room(int(p.k.shape[1])));
    kv.k_new = c.k_new.data;
    kv.v_new = c.v_new.data;
    kv.k_new_batch = c.k_new.stride[0];
    kv.k_new_row = c.k_new.stride[1];
    kv.k_new_head = c.k_new.stride[2];
    kv.v_new_batch = c.v_new.stride[0];
    kv.v_new_row = c.v_new.stride[1];
    kv.v_new_head = c.v_new.stride[2];
    kv.seqlen_new = int(c.k_new.shape[1]);
  }
  if (c.rotary_cos != nullptr || c.rotary_sin != nullptr) {
    if (c.rotary_cos == nullptr || c.rotary_sin == nullptr)
      return set_error(kInvalid, "kv_cache.%s: NULL (give both rotary_cos and rotary_sin)",
                       c.rotary_cos == nullptr ? "rotary_cos" : "rotary_sin");
    if (c.rotary_dim < 2 || c.rotary_dim % 2 != 0 || c.rotary_dim > p.q.shape[3])
      return set_error(kInvalid, "kv_cache.rotary_dim: %d (must be even, >= 2 and <= headdim %lld)", c.rotary_dim,
                       (long long)p.q.shape[3]);
    if (c.rotary_seqlen < 1 || c.rotary_seqlen > INT32_MAX)
      return set_error(kInvalid, "kv_cache.rotary_seqlen: %lld (must be in [1, 2^31-1])", (long long)c.rotary_seqlen);
    if (c.rotary_interleaved != 0 && c.rotary_interleaved != 1)
      return set_error(kInvalid, "kv_cache.rotary_interleaved: %d (0 or 1)", c.rotary_interleaved);
    const size_t es = dtype_size(p.dtype);
    if ((s = check_lse("kv_cache.rotary_cos", c.rotary_cos, false, 0, ctx, es)) != FLASHATTN_SUCCESS) return s;
    if ((s = check_lse("kv_cache.rotary_sin", c.rotary_sin, false, 0, ctx, es)) != FLASHATTN_SUCCESS) return s;
    kv.rotary_cos = c.rotary_cos;
    kv.rotary_sin = c.rotary_sin;
    kv.rotary_seqlen = int(c.rotary_seqlen);
    kv.rotary_dim = c.rotary_dim;
    kv.rotary_interleaved = c.rotary_interleaved != 0;
    kv.rotary_per_row = p.options.causal != 0 || p.options.window_left >= 0 || p.options.window_right >= 0;
  }

  // The index arrays' contents, where they can be read (host arrays; device ones on request).
  const size_t n = size_t(sh.batch);
  std::vector<int32_t> c_seqlens, c_leftpad, c_batch_idx, c_table, c_cu;
  const int32_t *seqlens, *leftpad, *batch_idx, *table = nullptr, *cu_k = nullptr;
  if ((s = read_index_array("kv_cache.seqlens", c.seqlens, n, stream, ctx, &c_seqlens, &seqlens)) != FLASHATTN_SUCCESS)
    return s;
  if ((s = read_index_array("kv_cache.leftpad", c.leftpad, n, stream, ctx, &c_leftpad, &leftpad)) != FLASHATTN_SUCCESS)
    return s;
  if ((s = read_index_array("kv_cache.batch_idx", c.batch_idx, n, stream, ctx, &c_batch_idx, &batch_idx)) !=
      FLASHATTN_SUCCESS)
    return s;
  if (paged) {
    const size_t entries = n == 0 ? 0 : size_t(c.block_table_stride) * (n - 1) + size_t(c.max_pages);
    if ((s = read_index_array("kv_cache.block_table", c.block_table, entries, stream, ctx, &c_table, &table)) !=
        FLASHATTN_SUCCESS)
      return s;
  }
  if (varlen && (s = read_index_array("varlen.cu_seqlens_k", p.varlen.cu_seqlens_k, n + 1, stream, ctx, &c_cu,
                                      &cu_k)) != FLASHATTN_SUCCESS)
    return s;
  const bool unread = (c.seqlens && !seqlens) || (c.leftpad && !leftpad) || (c.batch_idx && !batch_idx) ||
                      (paged && !table) || (varlen && !cu_k);
  if (unread) return FLASHATTN_SUCCESS;  // device arrays, unchecked: the paths clamp (KvCache)
  const int cache_rows = int(std::min<int64_t>(p.k.shape[1], INT32_MAX));
  for (int b = 0; b < sh.batch; ++b) {
    const int len = varlen ? cu_k[b + 1] - cu_k[b] : paged ? kv.room(0) : cache_rows;
    const int room = kv.room(len);
    if (varlen && paged && len > room)
      return set_error(kInvalid, "varlen.cu_seqlens_k: sequence %d has %d keys, more than its %d pages of %d rows "
                                 "(kv_cache.max_pages)", b, len, kv.max_pages, kv.page_size);
    int end = std::min(room, len);
    if (seqlens) {
      const int lim = appends ? room - kv.seqlen_new : end;
      if (seqlens[b] < 0 || seqlens[b] > lim)
        return set_error(kInvalid, appends ? "kv_cache.seqlens[%d]: %d, plus %d new rows, exceeds the cache's %d rows"
                                           : "kv_cache.seqlens[%d]: %d is outside [0, %d] (the sequence's rows)",
                         b, seqlens[b], appends ? kv.seqlen_new : lim, room);
      end = seqlens[b] + kv.seqlen_new;
    }
    if (leftpad && (leftpad[b] < 0 || leftpad[b] > end))
      return set_error(kInvalid, "kv_cache.leftpad[%d]: %d is outside [0, %d] (the sequence's end row)", b, leftpad[b],
                       end);
    if (batch_idx && (batch_idx[b] < 0 || batch_idx[b] >= kv.num_cache_batches))
      return set_error(kInvalid, "kv_cache.batch_idx[%d]: %d is outside [0, %d) (k.shape[0])", b, batch_idx[b],
                       kv.num_cache_batches);
    if (table) {
      const int first = leftpad ? leftpad[b] : 0;  // rows before it are never read
      for (int pg = first / kv.page_size; pg * int64_t(kv.page_size) < end; ++pg) {
        const int32_t v = table[size_t(b) * size_t(c.block_table_stride) + size_t(pg)];
        if (v < 0 || v >= kv.num_pages)
          return set_error(kInvalid, "kv_cache.block_table[%d][%d]: page %d is outside [0, %d) (k.shape[0])", b, pg, v,
                           kv.num_pages);
      }
    }
    if (kv.rotary()) {
      const int last = seqlens[b] + std::max(kv.seqlen_new, kv.rotary_per_row ? sh.seqlen_q : 1);
      if (last > kv.rotary_seqlen)
        return set_error(kInvalid, "kv_cache.rotary_seqlen: %d rows, but sequence %d needs positions up to %d",
                         kv.rotary_seqlen, b, last - 1);
    }
  }
  return FLASHATTN_SUCCESS;
}

}  // namespace

flashattn_status normalize_fwd(const flashattn_fwd_params* caller, void* stream, FwdParams* out, CallContext* ctx) {
  flashattn_fwd_params full;
  flashattn_status s = check_header(caller, "flashattn_fwd_params", &full);
  if (s != FLASHATTN_SUCCESS) return s;
  const flashattn_fwd_params* p = &full;
  *out = FwdParams{};
  out->dtype = p->dtype;
  const flashattn_kv_cache& kvc = p->kv_cache;
  // Before the tensors' shapes: without a block table, k's shape is checked as a contiguous cache.
  if (kvc.block_table == nullptr && (kvc.block_table_stride != 0 || kvc.max_pages != 0))
    return set_error(kInvalid, "kv_cache.%s: %lld, but kv_cache.block_table is NULL",
                     kvc.max_pages != 0 ? "max_pages" : "block_table_stride",
                     kvc.max_pages != 0 ? (long long)kvc.max_pages : (long long)kvc.block_table_stride);
  if (p->dtype == FLASHATTN_DTYPE_FP8_E4M3) {
    // Cache rows would need their own scale addressing (pages, cache batches, appended rows).
    const char* field = kvc.block_table ? "block_table" : kvc.seqlens ? "seqlens" : kvc.leftpad ? "leftpad"
                      : kvc.batch_idx ? "batch_idx" : (kvc.k_new.data || kvc.v_new.data) ? "k_new"
                      : (kvc.rotary_cos || kvc.rotary_sin) ? "rotary_cos" : nullptr;
    if (field != nullptr)
      return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "kv_cache.%s: the KV cache is not supported with dtype fp8_e4m3",
                       field);
  }
  const bool kv_cache = kvc.block_table || kvc.batch_idx;  // k's first dimension is the cache's own
  if (p->fp8_v_layout != FLASHATTN_FP8_V_ROWS && p->fp8_v_layout != FLASHATTN_FP8_V_KEYS_PERMUTED16 &&
      p->fp8_v_layout != FLASHATTN_FP8_V_ROWS_AUTO)
    return set_error(kInvalid, "fp8_v_layout: %d (FLASHATTN_FP8_V_ROWS = 0, FLASHATTN_FP8_V_KEYS_PERMUTED16 = 1 or "
                     "FLASHATTN_FP8_V_ROWS_AUTO = 2)", p->fp8_v_layout);
  const bool v_keys_contiguous =
      p->dtype == FLASHATTN_DTYPE_FP8_E4M3 && p->fp8_v_layout == FLASHATTN_FP8_V_KEYS_PERMUTED16;
  s = normalize_common(p->options, p->dtype, p->varlen, p->q, p->k, p->v, stream, &out->shape, &out->mask, ctx,
                       kv_cache, kvc.block_table != nullptr, v_keys_contiguous);
  if (s != FLASHATTN_SUCCESS) return s;
  if ((s = check_fp8(*p, out->shape, *ctx, out)) != FLASHATTN_SUCCESS) return s;
  const int64_t qexpect[4] = {p->q.shape[0], p->q.shape[1], p->q.shape[2], p->q.shape[3]};
  if ((s = check_tensor("out", p->out, qexpect, out->out_dtype(), *ctx)) != FLASHATTN_SUCCESS) return s;
  const Shape& sh = out->shape;
  if ((s = check_lse_fp64(p->dtype, p->lse, p->lse_fp64)) != FLASHATTN_SUCCESS) return s;
  if ((s = check_lse("lse", p->lse, false, int64_t(sh.total_q) * sh.nheads_q, *ctx)) != FLASHATTN_SUCCESS) return s;
  if ((s = check_lse("lse_fp64", p->lse_fp64, false, 0, *ctx, sizeof(double))) != FLASHATTN_SUCCESS) return s;
  bool varlen = p->varlen.cu_seqlens_q != nullptr;
  out->dtype = p->dtype;
  out->q = p->q.data;
  out->k = p->k.data;
  out->v = p->v.data;
  out->o = p->out.data;
  out->lse = p->lse;
  out->lse_fp64 = p->lse_fp64;
  if ((s = check_score_mods(*p, sh, *ctx, &out->dropout, &out->alibi)) != FLASHATTN_SUCCESS) return s;
  out->q_stride = row_strides(p->q, varlen);
  out->k_stride = row_strides(p->k, varlen);
  out->v_stride = row_strides(p->v, varlen);
  out->o_stride = row_strides(p->out, varlen);
  out->cu_seqlens_q = p->varlen.cu_seqlens_q;
  out->cu_seqlens_k = p->varlen.cu_seqlens_k;
  if ((s = check_kv_cache(*p, stream, *ctx, out)) != FLASHATTN_SUCCESS) return s;
  // Appended rows are keys even in an empty cache.
  if (out->kv.appends()) ctx->no_keys = false;
  return FLASHATTN_SUCCESS;
}

flashattn_status normalize_bwd(const flashattn_bwd_params* caller, void* stream, BwdParams* out, CallContext* ctx) {
  flashattn_bwd_params full;
  flashattn_status s = check_header(caller, "flashattn_bwd_params", &full);
  if (s != FLASHATTN_SUCCESS) return s;
  const flashattn_bwd_params* p = &full;
  *out = BwdParams{};
  if (p->dtype == FLASHATTN_DTYPE_FP8_E4M3)
    return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "dtype: fp8_e4m3 has no backward (FP8 attention is forward-only, "
                                                    "for inference; train in bf16/fp16)");
  s = normalize_common(p->options, p->dtype, p->varlen, p->q, p->k, p->v, stream, &out->shape, &out->mask, ctx);
  if (s != FLASHATTN_SUCCESS) return s;
  const int64_t qexpect[4] = {p->q.shape[0], p->q.shape[1], p->q.shape[2], p->q.shape[3]};
  const int64_t kexpect[4] = {p->k.shape[0], p->k.shape[1], p->k.shape[2], p->k.shape[3]};
  if ((s = check_tensor("out", p->out, qexpect, p->dtype, *ctx)) != FLASHATTN_SUCCESS) return s;
  if ((s = check_tensor("dout", p->dout, qexpect, p->dtype, *ctx)) != FLASHATTN_SUCCESS) return s;
  if ((s = check_tensor("dq", p->dq, qexpect, p->dtype, *ctx)) != FLASHATTN_SUCCESS) return s;
  if ((s = check_tensor("dk", p->dk, kexpect, p->dtype, *ctx)) != FLASHATTN_SUCCESS) return s;
  if ((s = check_tensor("dv", p->dv, kexpect, p->dtype, *ctx)) != FLASHATTN_SUCCESS) return s;
  const Shape& sh = out->shape;
  if ((s = check_lse_fp64(p->dtype, p->lse, p->lse_fp64)) != FLASHATTN_SUCCESS) return s;
  if (p->lse_fp64 != nullptr) {
    if ((s = check_lse("lse_fp64", p->lse_fp64, true, 0, *ctx, sizeof(double))) != FLASHATTN_SUCCESS) return s;
  } else if ((s = check_lse("lse", p->lse, true, int64_t(sh.total_q) * sh.nheads_q, *ctx)) != FLASHATTN_SUCCESS) {
    return s;
  }
  bool varlen = p->varlen.cu_seqlens_q != nullptr;
  out->dtype = p->dtype;
  out->q = p->q.data;
  out->k = p->k.data;
  out->v = p->v.data;
  out->o = p->out.data;
  out->dout = p->dout.data;
  out->lse = p->lse;
  out->lse_fp64 = p->lse_fp64;
  out->dq = p->dq.data;
  out->dk = p->dk.data;
  out->dv = p->dv.data;
  if ((s = check_score_mods(*p, sh, *ctx, &out->dropout, &out->alibi)) != FLASHATTN_SUCCESS) return s;
  out->q_stride = row_strides(p->q, varlen);
  out->k_stride = row_strides(p->k, varlen);
  out->v_stride = row_strides(p->v, varlen);
  out->o_stride = row_strides(p->out, varlen);
  out->dout_stride = row_strides(p->dout, varlen);
  out->dq_stride = row_strides(p->dq, varlen);
  out->dk_stride = row_strides(p->dk, varlen);
  out->dv_stride = row_strides(p->dv, varlen);
  out->cu_seqlens_q = p->varlen.cu_seqlens_q;
  out->cu_seqlens_k = p->varlen.cu_seqlens_k;
  out->deterministic = p->options.deterministic != 0;
  return FLASHATTN_SUCCESS;
}

}  // namespace flashattn
