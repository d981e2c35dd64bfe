// flashattn_combine: validation of flashattn_combine_params (every rejected call names the field)
// and the host path (src/cpu/combine.cpp). CUDA tensors are refused with NOT_SUPPORTED until the
// GPU combine kernel lands with split-KV.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "api/cuda_util.h"
#include "api/validate.h"
#include "common/error.h"
#include "common/parallel.h"
#include "cpu/combine.h"
#include "flashattn/flashattn.h"

using namespace flashattn;

#if UINTPTR_MAX == UINT64_MAX
static_assert(offsetof(flashattn_combine_params, out_partial) == 16 &&
                  offsetof(flashattn_combine_params, lse_partial) == 104 &&
                  offsetof(flashattn_combine_params, out) == 152 && offsetof(flashattn_combine_params, options) == 240 &&
                  sizeof(flashattn_combine_params) == 280,
              "flashattn_combine_params layout changed (python/flashattn/_lib.py mirrors it)");
#endif

namespace {

constexpr flashattn_status kInvalid = FLASHATTN_ERROR_INVALID_ARGUMENT;

flashattn_status check_strides(const char* name, const int64_t* stride, int n, bool last_contiguous) {
  for (int i = 0; i < n; ++i) {
    if (stride[i] < 0)
      return set_error(kInvalid, "%s[%d]: %lld (negative strides are not supported)", name, i, (long long)stride[i]);
  }
  if (last_contiguous && stride[n - 1] != 1)
    return set_error(kInvalid, "%s[%d]: %lld (the last dimension, headdim, must be contiguous: stride 1)", name,
                     n - 1, (long long)stride[n - 1]);
  return FLASHATTN_SUCCESS;
}

flashattn_status normalize_combine(const flashattn_combine_params* caller, cpu::CombineParams* out, int* device_out,
                                   int* num_threads, bool* nothing_to_do) {
  flashattn_status st = check_params_header(caller, "flashattn_combine_params");
  if (st != FLASHATTN_SUCCESS) return st;
  const flashattn_combine_params& p = *caller;
  const flashattn_options& o = p.options;

  if (dtype_size(p.dtype) == 0) return set_error(kInvalid, "dtype: unknown value %d", int(p.dtype));
  if (p.dtype == FLASHATTN_DTYPE_FP8_E4M3)
    return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "dtype: fp8_e4m3 is an attention input only (partial outputs are fp16, bf16, fp32 or fp64)");
  if (p.num_splits < 1) return set_error(kInvalid, "num_splits: %d (must be >= 1)", p.num_splits);

  const int64_t* shp = p.out_partial_shape;
  for (int i = 0; i < 5; ++i) {
    if (shp[i] < 0)
      return set_error(kInvalid, "out_partial_shape[%d]: %lld (negative)", i, (long long)shp[i]);
  }
  if (shp[0] != p.num_splits)
    return set_error(kInvalid, "out_partial_shape[0]: %lld, but num_splits = %d (shape is [num_splits, batch, "
                     "seqlen_q, nheads, headdim])", (long long)shp[0], p.num_splits);
  if (shp[2] > INT32_MAX) return set_error(kInvalid, "out_partial_shape[2]: seqlen_q exceeds 2^31-1");
  const int64_t b = shp[1], s = shp[2], h = shp[3], d = shp[4];
  for (int i = 0; i < 4; ++i) {
    if (p.out.shape[i] != shp[i + 1])
      return set_error(kInvalid, "out.shape[%d]: %lld, expected %lld (out is [batch, seqlen_q, nheads, headdim], "
                       "the shape of one split of out_partial)", i, (long long)p.out.shape[i], (long long)shp[i + 1]);
  }
  if ((st = check_strides("out_partial_stride", p.out_partial_stride, 5, true)) != FLASHATTN_SUCCESS) return st;
  if ((st = check_strides("out.stride", p.out.stride, 4, true)) != FLASHATTN_SUCCESS) return st;
  if ((st = check_strides("lse_partial_stride", p.lse_partial_stride, 4, false)) != FLASHATTN_SUCCESS) return st;

  if (p.lse_partial_fp64 != nullptr && p.dtype != FLASHATTN_DTYPE_FP64)
    return set_error(kInvalid, "lse_partial_fp64: set, but dtype is %s (fp64 LSEs need dtype fp64; use lse_partial)",
                     dtype_name(p.dtype));
  if (p.lse_partial_fp64 != nullptr && p.lse_partial != nullptr)
    return set_error(kInvalid, "lse_partial_fp64: set together with lse_partial (set exactly one)");
  if (p.lse_fp64 != nullptr && p.dtype != FLASHATTN_DTYPE_FP64)
    return set_error(kInvalid, "lse_fp64: set, but dtype is %s (an fp64 LSE needs dtype fp64; use lse)",
                     dtype_name(p.dtype));
  if (p.lse_fp64 != nullptr && p.lse != nullptr)
    return set_error(kInvalid, "lse_fp64: set together with lse (set at most one)");

  const int device = o.device;
  if (device >= 0 && (p.dtype == FLASHATTN_DTYPE_FP64 || p.lse_partial_fp64 != nullptr))
    return set_error(FLASHATTN_ERROR_NOT_SUPPORTED,
                     "dtype: fp64 combines run on host tensors only (options.device = -1); CUDA tensors take "
                     "fp16, bf16 or fp32 with fp32 LSEs");
  const size_t es = dtype_size(p.dtype);
  const bool rows = b * s * h > 0;
  const bool elems = rows && d > 0;
  if (elems && p.out_partial == nullptr) return set_error(kInvalid, "out_partial: NULL");
  if (elems && p.out.data == nullptr) return set_error(kInvalid, "out.data: NULL");
  if (rows && p.lse_partial == nullptr && p.lse_partial_fp64 == nullptr)
    return set_error(kInvalid, "lse_partial: NULL (set lse_partial, or lse_partial_fp64 for dtype fp64)");
  if (elems && (st = check_pointer("out_partial", p.out_partial, es, device)) != FLASHATTN_SUCCESS) return st;
  if (elems && (st = check_pointer("out.data", p.out.data, es, device)) != FLASHATTN_SUCCESS) return st;
  if (rows && p.lse_partial && (st = check_pointer("lse_partial", p.lse_partial, 4, device)) != FLASHATTN_SUCCESS)
    return st;
  if (rows && p.lse_partial_fp64 &&
      (st = check_pointer("lse_partial_fp64", p.lse_partial_fp64, 8, device)) != FLASHATTN_SUCCESS)
    return st;
  if (rows && p.lse && (st = check_pointer("lse", p.lse, 4, device)) != FLASHATTN_SUCCESS) return st;
  if (rows && p.lse_fp64 && (st = check_pointer("lse_fp64", p.lse_fp64, 8, device)) != FLASHATTN_SUCCESS) return st;


  cpu::CombineParams& c = *out;
  c = cpu::CombineParams{};
  c.dtype = p.dtype;
  c.partial_dtype = p.dtype;
  c.num_splits = p.num_splits;
  c.batch = b;
  c.seqlen_q = s;
  c.nheads = h;
  c.headdim = d;
  c.o_partial = p.out_partial;
  std::memcpy(c.o_partial_stride, p.out_partial_stride, sizeof(c.o_partial_stride));
  c.lse_partial = p.lse_partial;
  c.lse_partial_fp64 = p.lse_partial_fp64;
  std::memcpy(c.lse_partial_stride, p.lse_partial_stride, sizeof(c.lse_partial_stride));
  c.out = p.out.data;
  std::memcpy(c.out_stride, p.out.stride, sizeof(c.out_stride));
  c.lse = p.lse;
  c.lse_fp64 = p.lse_fp64;
  c.lse_stride[0] = h * s;
  c.lse_stride[1] = s;
  c.lse_stride[2] = 1;
  *device_out = device;
  *num_threads = o.num_threads;
  *nothing_to_do = !rows;
  return FLASHATTN_SUCCESS;
}

}  // namespace

extern "C" {

flashattn_combine_params flashattn_combine_params_init(void) {
  flashattn_combine_params p;
  std::memset(&p, 0, sizeof(p));
  p.struct_size = sizeof(p);
  p.dtype = FLASHATTN_DTYPE_BF16;
  p.num_splits = 1;
  p.out_partial_stride[4] = 1;
  p.out.stride[3] = 1;
  p.options = flashattn_default_options();
  return p;
}

flashattn_status flashattn_combine(const flashattn_combine_params* params, void* stream) {
  clear_error();
  cpu::CombineParams c;
  int device = -1, num_threads = 0;
  bool nothing_to_do = false;
  flashattn_status s = normalize_combine(params, &c, &device, &num_threads, &nothing_to_do);
  if (s != FLASHATTN_SUCCESS || nothing_to_do) return s;
  if (device >= 0) {
#if defined(FLASHATTN_HAS_CUDA)
    int previous = -1;
    if ((s = cuda::get_device(&previous)) != FLASHATTN_SUCCESS) return s;
    if (previous != device && (s = cuda::set_device(device)) != FLASHATTN_SUCCESS) return s;
    s = cuda::combine(c, stream);
    if (previous != device) cuda::set_device(previous);
    return s;
#else
    return set_error(FLASHATTN_ERROR_NO_DEVICE, "options.device: %d, but this build has no CUDA support", device);
#endif
  }
  ScopedHostThreads threads(num_threads);
  return cpu::combine(c);
}

}  // extern "C"
