#include "api/validate.h"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
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
                  offsetof(flashattn_fwd_params, dropout_seed) == 384 && sizeof(flashattn_fwd_params) == 424,
              "flashattn_fwd_params layout changed");
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

namespace {

constexpr flashattn_status kInvalid = FLASHATTN_ERROR_INVALID_ARGUMENT;
// Device kernels load 16-byte vectors along headdim and rows.
constexpr size_t kDeviceAlignBytes = 16;

bool on_device(const CallContext& c) { return c.device >= 0; }

flashattn_status check_dtype(flashattn_dtype dtype, int device) {
  if (dtype_size(dtype) == 0) return set_error(kInvalid, "dtype: unknown value %d", int(dtype));
  if (dtype == FLASHATTN_DTYPE_FP8_E4M3)
    return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "dtype: fp8_e4m3 is reserved, not implemented");
  if (device >= 0 && dtype != FLASHATTN_DTYPE_FP16 && dtype != FLASHATTN_DTYPE_BF16)
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
flashattn_status check_tensor(const char* name, const flashattn_tensor& t, const int64_t (&expect)[4],
                              flashattn_dtype dtype, const CallContext& ctx) {
  for (int i = 0; i < 4; ++i) {
    if (t.shape[i] != expect[i])
      return set_error(kInvalid, "%s.shape[%d]: %lld, expected %lld (shape is [batch, seqlen, nheads, headdim])",
                       name, i, (long long)t.shape[i], (long long)expect[i]);
  }
  if (t.stride[3] != 1)
    return set_error(kInvalid, "%s.stride[3]: %lld (the last dimension must be contiguous, stride 1)", name,
                     (long long)t.stride[3]);
  for (int i = 0; i < 3; ++i) {
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
    for (int i = 0; i < 3; ++i) {
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
flashattn_status normalize_common(const flashattn_options& opts, flashattn_dtype dtype, const flashattn_varlen& vl,
                                  const flashattn_tensor& q, const flashattn_tensor& k, const flashattn_tensor& v,
                                  void* stream, Shape* shape, MaskOptions* mask, CallContext* ctx) {
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
    if (k.shape[0] != 1) return set_error(kInvalid, "k.shape[0]: %lld (varlen tensors are packed: [1, total_k, nheads, headdim])", (long long)k.shape[0]);
  } else if (k.shape[0] != q.shape[0]) {
    return set_error(kInvalid, "k.shape[0]: batch %lld differs from q's %lld", (long long)k.shape[0],
                     (long long)q.shape[0]);
  }
  const int64_t kexpect[4] = {k.shape[0], k.shape[1], k.shape[2], d};
  const int64_t qexpect[4] = {q.shape[0], q.shape[1], q.shape[2], d};
  if ((s = check_tensor("q", q, qexpect, dtype, *ctx)) != FLASHATTN_SUCCESS) return s;
  if ((s = check_tensor("k", k, kexpect, dtype, *ctx)) != FLASHATTN_SUCCESS) return s;
  if ((s = check_tensor("v", v, kexpect, dtype, *ctx)) != FLASHATTN_SUCCESS) return s;
  if (varlen && (s = check_varlen(vl, q.shape[1], k.shape[1], stream, *ctx)) != FLASHATTN_SUCCESS) return s;

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

// Copies the caller's struct into *full: the current size, or an earlier version's (struct_size
// says which), whose later fields are not read and stay zero (lse_fp64 = NULL, no ALiBi, dropout
// seed 0).
template <typename P>
flashattn_status check_header(const P* p, const char* what, P* full) {
  if (p == nullptr) return set_error(kInvalid, "params: NULL");
  const size_t n = p->struct_size;
  if (n != sizeof(P) && n != size_before_dropout<P>() && n != size_before_lse_fp64<P>())
    return set_error(kInvalid,
                     "params.struct_size: %u, expected sizeof(%s) = %zu, or %zu / %zu from a header before the "
                     "dropout fields / before lse_fp64 (header/library mismatch?)",
                     p->struct_size, what, sizeof(P), size_before_dropout<P>(), size_before_lse_fp64<P>());
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

}  // namespace

flashattn_status normalize_fwd(const flashattn_fwd_params* caller, void* stream, FwdParams* out, CallContext* ctx) {
  flashattn_fwd_params full;
  flashattn_status s = check_header(caller, "flashattn_fwd_params", &full);
  if (s != FLASHATTN_SUCCESS) return s;
  const flashattn_fwd_params* p = &full;
  *out = FwdParams{};
  s = normalize_common(p->options, p->dtype, p->varlen, p->q, p->k, p->v, stream, &out->shape, &out->mask, ctx);
  if (s != FLASHATTN_SUCCESS) return s;
  const int64_t qexpect[4] = {p->q.shape[0], p->q.shape[1], p->q.shape[2], p->q.shape[3]};
  if ((s = check_tensor("out", p->out, qexpect, p->dtype, *ctx)) != FLASHATTN_SUCCESS) return s;
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
  return FLASHATTN_SUCCESS;
}

flashattn_status normalize_bwd(const flashattn_bwd_params* caller, void* stream, BwdParams* out, CallContext* ctx) {
  flashattn_bwd_params full;
  flashattn_status s = check_header(caller, "flashattn_bwd_params", &full);
  if (s != FLASHATTN_SUCCESS) return s;
  const flashattn_bwd_params* p = &full;
  *out = BwdParams{};
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
